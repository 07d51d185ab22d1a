"""Independent references for the paged-KV utilities (flashinfer.page), from the spec (§1.0, §3).

  seq_len_b        = max(n_pages_b - 1, 0) * page_size + last_page_len_b
  append entry i   : b = batch_indices[i], p = positions[i],
                     page = kv_indices[kv_indptr[b] + p // page_size], slot = p % page_size,
                     K[page, slot, :, :] = append_key[i] (NHD) / K[page, :, slot, :] (HND), V alike
  batch/positions  : entry append_indptr[b] + t -> (b, seq_lens[b] - L_b + t)
Written as plain loops and torch indexing; no flashinfer code.
"""

from __future__ import annotations

from typing import List, Tuple

import torch

__all__ = ["seq_lens", "batch_indices_positions", "append_scatter", "PageTable", "make_page_table"]


def seq_lens(kv_indptr: torch.Tensor, kv_last_page_len: torch.Tensor, page_size: int) -> List[int]:
    ip, last = kv_indptr.tolist(), kv_last_page_len.tolist()
    return [max(ip[b + 1] - ip[b] - 1, 0) * page_size + last[b] for b in range(len(last))]


def batch_indices_positions(append_indptr: List[int], seq_lens_: List[int], nnz: int) -> Tuple[List[int], List[int]]:
    """(batch_indices, positions) for nnz entries; entries held by no request get (-1, 0)."""
    bi, pos = [-1] * nnz, [0] * nnz
    for b in range(len(append_indptr) - 1):
        n = append_indptr[b + 1] - append_indptr[b]
        for t in range(n):
            e = append_indptr[b] + t
            if e < nnz:
                bi[e] = b
                pos[e] = seq_lens_[b] - n + t
    return bi, pos


def append_scatter(k_cache: torch.Tensor, v_cache: torch.Tensor, append_key: torch.Tensor,
                   append_value: torch.Tensor, batch_indices: torch.Tensor, positions: torch.Tensor,
                   kv_indices: torch.Tensor, kv_indptr: torch.Tensor, page_size: int,
                   layout: str) -> Tuple[torch.Tensor, torch.Tensor]:
    """Expected K and V caches after the append: copies of k_cache/v_cache (4-D, in `layout`,
    or 3-D for page_size 1) with the appended rows scattered in."""
    k, v = k_cache.clone(), v_cache.clone()
    b = batch_indices.to(torch.int64)
    p = positions.to(torch.int64)
    page = kv_indices.to(torch.int64)[kv_indptr.to(torch.int64)[b] + p // page_size]
    slot = p % page_size
    if k.dim() == 3:
        k[page] = append_key
        v[page] = append_value
    elif layout == "NHD":
        k[page, slot] = append_key
        v[page, slot] = append_value
    else:
        k[page, :, slot] = append_key
        v[page, :, slot] = append_value
    return k, v


class PageTable:
    """A CSR page table on `device`: indptr, indices (shuffled page ids), last_page_len."""

    def __init__(self, indptr: List[int], indices: List[int], last: List[int], num_pages: int, device) -> None:
        self.indptr = torch.tensor(indptr, dtype=torch.int32, device=device)
        self.indices = torch.tensor(indices, dtype=torch.int32, device=device)
        self.last_page_len = torch.tensor(last, dtype=torch.int32, device=device)
        self.num_pages = num_pages


def make_page_table(lens: List[int], page_size: int, device, spare_pages: int = 3,
                    generator: torch.Generator = None) -> PageTable:
    """Requests of `lens` tokens each own ceil(len / page_size) pages, drawn in random order from
    a pool with `spare_pages` pages nobody owns (they must stay untouched)."""
    n = [(length + page_size - 1) // page_size for length in lens]
    total = sum(n) + spare_pages
    ids = torch.randperm(total, generator=generator).tolist()
    indptr, indices, last, nxt = [0], [], [], 0
    for length, np_ in zip(lens, n):
        indices.extend(ids[nxt:nxt + np_])
        nxt += np_
        indptr.append(len(indices))
        last.append(0 if np_ == 0 else length - (np_ - 1) * page_size)
    return PageTable(indptr, indices, last, total, device)
