"""Independent float64 reference for MLA paged attention (spec §8.1), written from the spec, not
from the kernels: gather each request's pages, K = [ckv || kpe], V = ckv, one latent KV "head"
shared by every query head; s = sm_scale * q.K^T, bottom-right causal, softmax, base-2 LSE
(logsumexp / ln 2, exact in float64); rows with no key give o = 0, lse = -inf."""

from __future__ import annotations

import math
from typing import List, Optional, Tuple

import torch

__all__ = ["mla_one", "mla_ref", "request_kv"]


def mla_one(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool,
            sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """One request: q [qo_len, H, Dqk], k [kv_len, Dqk], v [kv_len, Dv] -> (o [qo_len, H, Dv],
    lse [qo_len, H]) float64, lse base 2."""
    qo_len, kv_len = q.shape[0], k.shape[0]
    logits = torch.einsum("thd,jd->thj", q.double(), k.double()) * sm_scale  # [qo_len, H, kv_len]
    if causal:  # row t sees keys j <= t + kv_len - qo_len
        rows = torch.arange(qo_len, device=q.device)[:, None, None]
        cols = torch.arange(kv_len, device=q.device)[None, None, :]
        logits = logits.masked_fill(cols > rows + (kv_len - qo_len), -math.inf)
    lse_e = torch.logsumexp(logits, dim=-1)  # -inf where a row sees no key (also kv_len == 0)
    seen = torch.isfinite(lse_e)
    weights = torch.where(seen[..., None], torch.exp(logits - lse_e[..., None]), torch.zeros_like(logits))
    return torch.einsum("thj,jd->thd", weights, v.double()), lse_e / math.log(2.0)


def request_kv(ckv_cache: torch.Tensor, kpe_cache: Optional[torch.Tensor], pages: List[int],
               kv_len: int) -> Tuple[torch.Tensor, torch.Tensor]:
    """Request keys K = [ckv || kpe] [kv_len, 512 + Dkpe] and values V = ckv [kv_len, 512], from
    its pages (token t at page pages[t // page_size], slot t % page_size)."""
    idx = torch.tensor(pages, dtype=torch.long, device=ckv_cache.device)
    ckv = ckv_cache[idx].reshape(-1, ckv_cache.shape[-1])[:kv_len]
    if kpe_cache is None:
        return ckv, ckv
    kpe = kpe_cache[idx].reshape(-1, kpe_cache.shape[-1])[:kv_len]
    return torch.cat([ckv, kpe], dim=-1), ckv


def mla_ref(q_nope: torch.Tensor, q_pe: Optional[torch.Tensor], ckv_cache: torch.Tensor,
            kpe_cache: Optional[torch.Tensor], qo_indptr: List[int], kv_indptr: List[int], kv_indices: List[int],
            kv_lens: List[int], causal: bool, sm_scale: float) -> Tuple[torch.Tensor, torch.Tensor]:
    """The batch: q_nope [N, H, 512], q_pe [N, H, Dkpe] (None: no rope part), caches [P, ps, D]
    -> (o [N, H, 512], lse [N, H]) float64 on q_nope's device."""
    q = q_nope if q_pe is None else torch.cat([q_nope, q_pe], dim=-1)
    n, h = q.shape[0], q.shape[1]
    o = torch.zeros(n, h, ckv_cache.shape[-1], dtype=torch.float64, device=q.device)
    lse = torch.full((n, h), -math.inf, dtype=torch.float64, device=q.device)
    for b in range(len(qo_indptr) - 1):
        q0, q1 = qo_indptr[b], qo_indptr[b + 1]
        if q1 == q0:
            continue
        k, v = request_kv(ckv_cache, kpe_cache, kv_indices[kv_indptr[b]:kv_indptr[b + 1]], kv_lens[b])
        o[q0:q1], lse[q0:q1] = mla_one(q[q0:q1], k, v, causal, sm_scale)
    return o, lse
