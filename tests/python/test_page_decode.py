"""Append then read back: tokens appended with append_paged_kv_cache (prefill chunk, then
decode steps, into partially filled last pages) and attended through
BatchDecodeWithPagedKVCacheWrapper give the same output as attention over the contiguous
keys and values (float64 reference)."""

from __future__ import annotations

import math

import pytest
import torch

import flashinfer
from reference_attention import assert_attention_close, assert_lse_close, decode_one

pytestmark = pytest.mark.gpu
CUDA = "cuda"


@pytest.mark.parametrize("page_size", [1, 5, 16])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("use_tc", [False, True])
def test_append_then_decode(page_size, layout, use_tc):
    hq, hkv, d, dtype = 32, 8, 128, torch.bfloat16
    prompt = [45, 8, 25, 22]  # FlashInfer's append lengths
    steps = 3  # decode steps appended one token each afterwards
    final = [p + steps for p in prompt]
    batch = len(prompt)
    pages = [(n + page_size - 1) // page_size for n in final]
    total_pages = sum(pages) + 4
    perm = torch.randperm(total_pages).tolist()  # pages in random order, some unused
    indptr = [0]
    for n in pages:
        indptr.append(indptr[-1] + n)
    indices = perm[:indptr[-1]]
    shape = (total_pages, page_size, hkv, d) if layout == "NHD" else (total_pages, hkv, page_size, d)
    k_cache = torch.randn(shape, dtype=dtype, device=CUDA)  # garbage where nothing is appended
    v_cache = torch.randn(shape, dtype=dtype, device=CUDA)
    keys = [torch.randn(n, hkv, d, dtype=dtype, device=CUDA) for n in final]
    vals = [torch.randn(n, hkv, d, dtype=dtype, device=CUDA) for n in final]
    kv_indptr = torch.tensor(indptr, dtype=torch.int32, device=CUDA)
    kv_indices = torch.tensor(indices, dtype=torch.int32, device=CUDA)

    def append(lens_before, lens_after):
        last = torch.tensor([n - (-(-n // page_size) - 1) * page_size for n in lens_after], dtype=torch.int32,
                            device=CUDA)
        app = [a - b for a, b in zip(lens_after, lens_before)]
        append_indptr = torch.tensor([0] + list(torch.tensor(app).cumsum(0)), dtype=torch.int32, device=CUDA)
        seq_lens = torch.tensor(lens_after, dtype=torch.int32, device=CUDA)
        nnz = int(append_indptr[-1])
        bi, pos = flashinfer.get_batch_indices_positions(append_indptr, seq_lens, nnz)
        k_new = torch.cat([keys[b][lens_before[b]:lens_after[b]] for b in range(batch)])
        v_new = torch.cat([vals[b][lens_before[b]:lens_after[b]] for b in range(batch)])
        flashinfer.append_paged_kv_cache(k_new, v_new, bi, pos, (k_cache, v_cache), kv_indices, kv_indptr, last,
                                         kv_layout=layout)
        return last

    # Prefill chunk first, then single-token decode steps into the (partial) last pages.
    lens = [0] * batch
    for target in (prompt,) + tuple([p + s + 1 for p in prompt] for s in range(steps)):
        last = append(lens, target)
        lens = list(target)
    q = torch.randn(batch, hq, d, dtype=dtype, device=CUDA)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, layout, use_tensor_cores=use_tc)
    w.plan(kv_indptr, kv_indices, last, hq, hkv, d, page_size, q_data_type=dtype)
    o, lse = w.run(q, (k_cache, v_cache), return_lse=True)
    for b in range(batch):
        ro, rl = decode_one(q[b], keys[b], vals[b], sm_scale=1 / math.sqrt(d))
        assert_attention_close(o[b], ro, f"o[{b}]")
        assert_lse_close(lse[b], rl, f"lse[{b}]")
