"""Decode attention on the GPU against the float64 reference (reference_attention.py):
single decode and BatchDecodeWithPagedKVCacheWrapper over page sizes, layouts, GQA groups,
head dims, dtypes, RoPE/ALiBi, soft cap, sliding window, LSE, split-KV, CUDA graphs, and the
page-table validation of plan()/run()."""

from __future__ import annotations

import math
import os
import random
import subprocess
import sys
from typing import List, Tuple

import pytest
import torch

import flashinfer
from checks import capture_graph
from reference_attention import assert_attention_close, assert_lse_close, decode_one, gather_pages

pytestmark = pytest.mark.gpu
CUDA = "cuda"


def make_cache(lens: List[int], page_size: int, hkv: int, d: int, dtype, layout: str, spare_pages: int = 3,
               form: str = "tuple"):
    """A random paged cache holding requests of `lens` keys, pages shuffled, plus unused pages."""
    n_pages = [(l + page_size - 1) // page_size for l in lens]
    total = sum(n_pages) + spare_pages
    perm = list(range(total))
    random.shuffle(perm)
    indptr, indices, last = [0], [], []
    it = iter(perm)
    for l, n in zip(lens, n_pages):
        indices += [next(it) for _ in range(n)]
        indptr.append(len(indices))
        last.append(0 if n == 0 else l - (n - 1) * page_size)
    shape = (total, page_size, hkv, d) if layout == "NHD" else (total, hkv, page_size, d)
    if form == "5d":
        both = torch.randn((total, 2) + shape[1:], dtype=dtype, device=CUDA)
        k, v = both[:, 0], both[:, 1]
        cache = both
    else:
        k = torch.randn(shape, dtype=dtype, device=CUDA)
        v = torch.randn(shape, dtype=dtype, device=CUDA)
        cache = (k, v)
    return cache, k, v, indptr, indices, last


def run_batch(lens, page_size, hq, hkv, d, dtype, layout, *, use_tc=False, pos="NONE", soft_cap=None,
              window_left=-1, form="tuple", return_lse=True, q=None):
    cache, k, v, indptr, indices, last = make_cache(lens, page_size, hkv, d, dtype, layout, form=form)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, layout, use_tensor_cores=use_tc)
    w.plan(torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32),
           torch.tensor(last, dtype=torch.int32), hq, hkv, d, page_size, pos_encoding_mode=pos,
           window_left=window_left, logits_soft_cap=soft_cap, q_data_type=dtype)
    if q is None:
        q = torch.randn(len(lens), hq, d, dtype=dtype, device=CUDA)
    if return_lse:
        o, lse = w.run(q, cache, return_lse=True)
    else:
        o, lse = w.run(q, cache), None
    return o, lse, q, (k, v, indptr, indices, last)


def check_batch(o, lse, q, kv, layout, *, pos="NONE", soft_cap=None, window_left=-1):
    k, v, indptr, indices, last = kv
    sm_scale = 1.0 / math.sqrt(q.shape[-1])
    for b in range(q.shape[0]):
        kb, vb = gather_pages(k, v, layout, indptr, indices, last, b)
        ro, rl = decode_one(q[b], kb, vb, sm_scale=sm_scale, soft_cap=soft_cap or 0.0, window_left=window_left,
                            pos_encoding_mode=pos)
        if kb.shape[0] == 0:
            assert torch.equal(o[b].float(), torch.zeros_like(o[b].float())), f"request {b}: empty must give o == 0"
        else:
            assert_attention_close(o[b], ro, f"o[{b}]")
        if lse is not None:
            assert_lse_close(lse[b], rl, f"lse[{b}]")


def ragged(batch: int, kv_len: int) -> List[int]:
    if batch == 1:
        return [kv_len]
    lens = [random.randint(1, kv_len) for _ in range(batch)]
    lens[0] = kv_len
    if batch > 2:
        lens[1] = 0  # an empty request in every ragged batch
    return lens


# Every value of every axis appears; the risky combinations are crossed explicitly.
# (batch, kv_len, page_size, hq, hkv, head_dim, dtype, layout, use_tc, pos, soft_cap, window)
B, H = torch.bfloat16, torch.float16
CASES = [
    (1, 1, 1, 32, 8, 128, B, "NHD", False, "NONE", None, -1),
    (1, 15, 5, 32, 8, 128, H, "HND", True, "NONE", None, -1),
    (7, 511, 16, 32, 8, 128, B, "NHD", False, "NONE", None, -1),
    (7, 2048, 16, 8, 8, 64, H, "NHD", True, "NONE", None, -1),
    (1, 16384, 16, 32, 8, 128, B, "NHD", False, "NONE", None, -1),  # long KV: split-KV
    (1, 16384, 1, 32, 4, 256, H, "HND", True, "NONE", None, -1),  # long KV, page 1, HND
    (64, 2048, 16, 32, 8, 128, B, "NHD", True, "NONE", None, -1),
    (64, 511, 5, 16, 16, 64, B, "HND", False, "NONE", None, -1),
    (7, 511, 1, 32, 4, 128, B, "HND", False, "NONE", None, -1),  # page_size 1 with HND
    (7, 2048, 5, 64, 8, 256, H, "NHD", True, "NONE", None, -1),  # GQA 8 with tensor cores
    (7, 2048, 16, 32, 8, 128, B, "NHD", False, "ROPE_LLAMA", None, 100),  # RoPE with window
    (7, 511, 16, 32, 4, 64, H, "HND", True, "ROPE_LLAMA", None, -1),
    (7, 2048, 16, 32, 8, 128, H, "NHD", False, "NONE", 30.0, -1),  # soft cap
    (7, 2048, 5, 32, 8, 128, B, "NHD", False, "NONE", 1.0, 33),  # soft cap + window
    (7, 511, 16, 32, 8, 128, H, "NHD", False, "ALIBI", None, -1),
    (1, 16384, 16, 32, 8, 128, H, "NHD", True, "ROPE_LLAMA", None, 1000),  # long + RoPE + window
    (64, 15, 1, 32, 32, 128, B, "NHD", False, "NONE", None, -1),  # MHA, short
    (7, 2048, 16, 32, 1, 128, B, "NHD", False, "NONE", None, -1),  # MQA (group 32: sub-groups)
    (7, 2048, 16, 12, 4, 128, H, "HND", False, "NONE", None, -1),  # group 3
    (7, 2048, 16, 48, 4, 64, B, "NHD", True, "NONE", None, -1),  # group 12: 2 sub-groups, partial
    # head_dim 512 (CUDA cores, 16 features per lane; q heads in sub-groups of 4; use_tc=True
    # takes the same kernel)
    (7, 2048, 16, 32, 8, 512, B, "NHD", False, "NONE", None, -1),
    (7, 511, 5, 32, 4, 512, H, "HND", True, "ROPE_LLAMA", None, 100),  # group 8: 2 sub-groups
    (1, 16384, 16, 8, 1, 512, B, "NHD", True, "NONE", 30.0, -1),  # split, 2 sub-groups, soft cap
    (64, 511, 1, 16, 16, 512, H, "NHD", False, "ALIBI", None, -1),  # MHA, page 1
    (7, 2048, 16, 12, 4, 512, B, "HND", False, "NONE", None, -1),  # group 3
]


@pytest.mark.parametrize("case", CASES, ids=lambda c: "b{}-kv{}-ps{}-h{}/{}-d{}-{}-{}-tc{}-{}-cap{}-w{}".format(
    c[0], c[1], c[2], c[3], c[4], c[5], str(c[6])[6:], c[7], int(c[8]), c[9], c[10], c[11]))
def test_batch_decode(case):
    batch, kv_len, ps, hq, hkv, d, dtype, layout, use_tc, pos, cap, window = case
    lens = ragged(batch, kv_len)
    o, lse, q, kv = run_batch(lens, ps, hq, hkv, d, dtype, layout, use_tc=use_tc, pos=pos, soft_cap=cap,
                              window_left=window)
    assert o.shape == q.shape and o.dtype == dtype
    check_batch(o, lse, q, kv, layout, pos=pos, soft_cap=cap, window_left=window)


@pytest.mark.smoke
def test_batch_decode_smoke():
    test_batch_decode(CASES[2])


@pytest.mark.parametrize("engine", ["cpasync", "bulk", "boxes"])
def test_copy_engines(engine):
    """Every copy engine of the tensor-core kernel (FLASHINFER_DECODE_COPY; sm_90 takes boxes by
    default where the cache suits them, rows otherwise (fp8 caches: cp.async), cp.async only
    through the knob) passes the tensor-core cases, the fp8 ones and the CUDA-graph replay. A fresh interpreter: the knob is read once."""
    env = dict(os.environ, FLASHINFER_DECODE_COPY=engine)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                        "(test_batch_decode and tc1) or test_cuda_graph_replan_and_replay or tensor_cores or fp8_kv or multi_token"],
                       env=env, capture_output=True, text=True, cwd=os.path.dirname(__file__))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout


@pytest.mark.parametrize("knob", ["FLASHINFER_DECODE_DEEP=0", "FLASHINFER_DECODE_DEEP=1000000000",
                                  "FLASHINFER_DECODE_WIDE=0", "FLASHINFER_DECODE_STAGES=2", "FLASHINFER_DECODE_STAGES=4",
                                  "FLASHINFER_DECODE_L2=first", "FLASHINFER_DECODE_L2=normal"])
def test_plan_depth_and_l2_policy(knob):
    """The tensor-core cases (and the CUDA-graph replay) with the plan-time deep pipeline off or
    taken by every plan, the wide launch shape off, every launch at two (or four) stages, and the box
    copies' L2 policy forced either way: the defaults pick per call, so each setting must be
    right on every shape. A fresh interpreter per knob."""
    name, value = knob.split("=")
    env = dict(os.environ, **{name: value})
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                        "(test_batch_decode and tc1) or test_cuda_graph_replan_and_replay or tensor_cores"],
                       env=env, capture_output=True, text=True, cwd=os.path.dirname(__file__))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout


def _planned_stages(lens, page_size=16, hq=32, hkv=8, d=128):
    """(stages, grid) that the tensor-core plan of these lengths launches with (bf16, no CUDA graph)."""
    from flashinfer import _decode
    import numpy as np

    pages = [-(-n // page_size) for n in lens]
    begins = np.cumsum([0] + pages[:-1]).astype(np.int64)
    out = _decode.plan(np.asarray(lens, np.int64), begins, hq, hkv, d, page_size, "bfloat16", False, 0, True, 0,
                       torch.cuda.current_device(), True, -1, 0)
    return out[6], out[5]


def test_plan_total_keys():
    """The plan reports the key count of all requests (the launch's L2 policy reads it)."""
    from flashinfer import _decode
    import numpy as np

    lens = [0, 1, 17, 4096, 333]
    pages = [-(-n // 16) for n in lens]
    begins = np.cumsum([0] + pages[:-1]).astype(np.int64)
    out = _decode.plan(np.asarray(lens, np.int64), begins, 32, 8, 128, 16, "bfloat16", False, 0, True, 0,
                       torch.cuda.current_device(), True, -1, 0)
    assert out[7] == sum(lens)


def test_merge_kernel_taken_above_16_chunks():
    """Requests split into more than 16 chunks are merged by the merge kernel, fewer in-kernel
    (scheduler.h decode_merges_in_kernel; batches of more than 16 requests in-kernel), unless
    FLASHINFER_DECODE_MERGE forces one; under CUDA graphs (allow_shape False) always in-kernel."""
    from flashinfer import _decode
    import numpy as np
    import os

    def flag(lens, allow_shape=True):
        pages = [-(-n // 16) for n in lens]
        begins = np.cumsum([0] + pages[:-1]).astype(np.int64)
        out = _decode.plan(np.asarray(lens, np.int64), begins, 32, 8, 128, 16, "bfloat16", False, 0, True, 0,
                           torch.cuda.current_device(), allow_shape, -1, 0)
        chunks = int(out[1][:, 1].max())
        return out[8], chunks

    forced = os.environ.get("FLASHINFER_DECODE_MERGE")
    for lens in ([32768], [4096], [2048] * 64, [20000, 5, 0, 9000], [5] * 16 + [32768]):
        taken, chunks = flag(lens)
        # (batches of more than 16 requests keep the in-kernel merge)
        expect = {"kernel": chunks > 1, "last": False}.get(forced, chunks > 16 and len(lens) <= 16)
        assert taken == expect, (lens, chunks, taken)
        assert not flag(lens, allow_shape=False)[0]


@pytest.mark.parametrize("d,hq,hkv", [(64, 32, 8), (128, 32, 8), (256, 16, 4), (512, 16, 2)])
@pytest.mark.parametrize("split_pages", [1, 2])
def test_merge_kernel_many_chunks(d, hq, hkv, split_pages):
    """fixed_split_size cuts requests into 64-key chunks (129 for the longest) or 128-key ones (65):
    the merge kernel's slot lanes each fold many slots (several round trips; 2 lanes at head_dim
    512, 16 at 64), ragged and empty requests mixed in; o and LSE against the float32 reference."""
    lens = [5000, 1, 0, 777, 2 * 4096 + 3]
    for use_tc in (True,):  # (fixed_split_size needs the tensor-core kernel)
        cache, k, v, indptr, indices, last = make_cache(lens, 16, hkv, d, torch.bfloat16, "NHD")
        ws = torch.empty(256 << 20, dtype=torch.uint8, device=CUDA)
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=use_tc)
        w.plan(torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32),
               torch.tensor(last, dtype=torch.int32), hq, hkv, d, 16, q_data_type=torch.bfloat16,
               fixed_split_size=split_pages * 4)
        q = torch.randn(len(lens), hq, d, dtype=torch.bfloat16, device=CUDA)
        o, lse = w.run(q, cache, return_lse=True)
        check_batch(o, lse, q, (k, v, indptr, indices, last), "NHD")


@pytest.mark.parametrize("lens", [[4096] * 24, [2048] * 40, [3000, 5000, 1200, 4096] * 5 + [0]])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_wide_launch_shape(lens, layout):
    """Batches whose plan takes the wide launch shape (two stages, more CTAs per SM) on a GPU where
    that shape holds more CTAs (the H200: 3 instead of 2), checked against the reference, with LSE."""
    stages, grid = _planned_stages(lens)
    sms = torch.cuda.get_device_properties(0).multi_processor_count
    if torch.cuda.get_device_capability() == (9, 0) and sms == 132:
        assert (stages, grid) == (2, 3 * sms), (stages, grid)
    o, lse, q, kv = run_batch(lens, 16, 32, 8, 128, torch.bfloat16, layout, use_tc=True)
    check_batch(o, lse, q, kv, layout)


def test_wide_launch_shape_not_taken_where_it_splits_more():
    """64 x 2048 fills two waves unsplit at the default shape; the wide shape would split it."""
    if torch.cuda.get_device_properties(0).multi_processor_count != 132:
        pytest.skip("the expected plans are the H200's (132 SMs)")
    assert _planned_stages([2048] * 64)[0] == 0
    assert _planned_stages([1024] * 256)[0] == 0


@pytest.mark.parametrize("page_size", [16, 32, 64, 128])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("head_dim", [64, 128])
def test_page_sizes_tensor_cores(page_size, layout, head_dim):
    """The page sizes the box engine takes (16, 32, 64 and multiples of 64: a 64-key tile is whole
    pages or part of one), lengths around tile and page edges, one request long enough to split
    (chunk starts are tile-aligned), empty requests; both layouts, with LSE."""
    lens = [1, 15, 16, 17, 63, 64, 65, 127, 129, 300, 0, 5000]
    o, lse, q, kv = run_batch(lens, page_size, 32, 8, head_dim, torch.bfloat16, layout, use_tc=True)
    check_batch(o, lse, q, kv, layout)


@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("page_size", [1, 3, 16])
def test_cuda_core_keys_per_stage(group, page_size):
    """The CUDA-core kernel's stage edges: lengths around multiples of its stage (32 or 64 keys for
    head_dim 128) and of the page size, per q-head bucket, with LSE."""
    lens = [1, 31, 32, 33, 63, 64, 65, 95, 97, 200, 0, 129]
    o, lse, q, kv = run_batch(lens, page_size, 8 * group, 8, 128, torch.bfloat16, "NHD")
    check_batch(o, lse, q, kv, "NHD")


@pytest.mark.parametrize("group", [1, 2, 4, 8])
@pytest.mark.parametrize("page_size", [1, 5, 16])
def test_head_dim_512_stage_edges(group, page_size):
    """head_dim 512: lengths around the CUDA-core kernel's 16-key stages (32 at one q head) and
    the page size, per q-head bucket (group 8 runs as two sub-groups of 4), with LSE; and
    use_tensor_cores=True, which takes the same kernel at this head_dim, gives the same bits."""
    lens = [1, 15, 16, 17, 31, 33, 64, 65, 200, 0, 129]
    o, lse, q, kv = run_batch(lens, page_size, 2 * group, 2, 512, torch.bfloat16, "NHD")
    check_batch(o, lse, q, kv, "NHD")
    k, v, indptr, indices, last = kv
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=True)
    w.plan(indptr, indices, last, 2 * group, 2, 512, page_size, q_data_type=torch.bfloat16)
    o_tc, lse_tc = w.run(q, (k, v), return_lse=True)
    assert torch.equal(o_tc, o) and torch.equal(lse_tc, lse)


@pytest.mark.parametrize("form", ["5d", "tuple"])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_cache_forms_agree(form, layout):
    lens = [300, 17, 0, 64]
    o, lse, q, kv = run_batch(lens, 16, 16, 4, 128, torch.float16, layout, form=form)
    check_batch(o, lse, q, kv, layout)


@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_page_size_one_forms(layout):
    """The 4-D single tensor [P, 2, H, D] and the 3-D tuple both mean page_size 1."""
    lens = [5, 40]
    hkv, d = 2, 64
    total = sum(lens) + 2
    both = torch.randn(total, 2, hkv, d, dtype=torch.float16, device=CUDA)
    perm = torch.randperm(total).tolist()
    indptr = [0, lens[0], lens[0] + lens[1]]
    indices = perm[:sum(lens)]
    last = [1, 1]
    ws = torch.empty(32 << 20, dtype=torch.uint8, device=CUDA)
    q = torch.randn(2, 8, d, dtype=torch.float16, device=CUDA)
    outs = []
    for cache in (both, (both[:, 0].contiguous(), both[:, 1].contiguous())):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, layout)
        w.plan(indptr, indices, last, 8, hkv, d, 1, q_data_type=torch.float16)
        outs.append(w.run(q, cache))
    assert torch.equal(outs[0], outs[1])
    k4 = both[:, 0].unsqueeze(1)  # [P, 1, H, D] = NHD with page_size 1
    for b in range(2):
        kb, vb = gather_pages(k4, both[:, 1].unsqueeze(1), "NHD", indptr, indices, last, b)
        ro, _ = decode_one(q[b], kb, vb, sm_scale=1 / math.sqrt(d))
        assert_attention_close(outs[0][b], ro)


@pytest.mark.parametrize("kv_len", [1, 15, 511, 2048, 16384, 32768])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
@pytest.mark.parametrize("hq,hkv,d", [(32, 8, 128), (8, 8, 64), (16, 2, 256), (16, 4, 512), (8, 1, 512)])
def test_single_decode(kv_len, layout, hq, hkv, d):
    check_single(kv_len, layout, hq, hkv, d, torch.bfloat16 if kv_len % 2 else torch.float16, False)


def check_single(kv_len, layout, hq, hkv, d, dtype, use_tc):
    """single_decode_with_kv_cache on a random contiguous cache against the float64 reference."""
    q = torch.randn(hq, d, dtype=dtype, device=CUDA)
    shape = (kv_len, hkv, d) if layout == "NHD" else (hkv, kv_len, d)
    k = torch.randn(shape, dtype=dtype, device=CUDA)
    v = torch.randn(shape, dtype=dtype, device=CUDA)
    o, lse = flashinfer.single_decode_with_kv_cache(q, k, v, layout, use_tensor_cores=use_tc, return_lse=True)
    kk, vv = (k, v) if layout == "NHD" else (k.transpose(0, 1), v.transpose(0, 1))
    ro, rl = decode_one(q, kk, vv, sm_scale=1 / math.sqrt(d))
    assert_attention_close(o, ro)
    assert_lse_close(lse, rl)


@pytest.mark.parametrize("pos,cap,window", [("ROPE_LLAMA", None, -1), ("ALIBI", None, -1), ("NONE", 50.0, -1),
                                            ("NONE", None, 3), ("ROPE_LLAMA", None, 533)])
def test_single_decode_variants(pos, cap, window):
    q = torch.randn(32, 128, dtype=torch.float16, device=CUDA)
    k = torch.randn(4000, 8, 128, dtype=torch.float16, device=CUDA)
    v = torch.randn(4000, 8, 128, dtype=torch.float16, device=CUDA)
    o, lse = flashinfer.single_decode_with_kv_cache(q, k, v, pos_encoding_mode=pos, logits_soft_cap=cap,
                                                    window_left=window, return_lse=True)
    ro, rl = decode_one(q, k, v, sm_scale=1 / math.sqrt(128), soft_cap=cap or 0.0, window_left=window,
                        pos_encoding_mode=pos)
    assert_attention_close(o, ro)
    assert_lse_close(lse, rl)


@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_single_decode_under_torch_compile(mode):
    """Spec 1.6: torch.compile(fullgraph=True) around single decode (a torch custom op) runs and
    matches the eager call; "reduce-overhead" replays it from a CUDA graph."""
    q = torch.randn(32, 128, dtype=torch.bfloat16, device=CUDA)
    k = torch.randn(3000, 8, 128, dtype=torch.bfloat16, device=CUDA)
    v = torch.randn_like(k)

    def fn(q, k, v):
        o, lse = flashinfer.single_decode_with_kv_cache(q, k, v, use_tensor_cores=True, return_lse=True)
        return o.float() * 2, lse

    compiled = torch.compile(fn, fullgraph=True, mode=mode)
    want = fn(q, k, v)
    for _ in range(3):  # (reduce-overhead records the graph on a later call)
        got = compiled(q, k, v)
        torch.cuda.synchronize()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_single_decode_strided_q_and_kv():
    """q, k, v as views of one fused QKV buffer (no copies)."""
    kv_len, hq, hkv, d = 777, 32, 8, 128
    qkv = torch.randn(kv_len, hq + 2 * hkv, d, dtype=torch.bfloat16, device=CUDA)
    q = qkv[-1, :hq]
    k = qkv[:, hq:hq + hkv]
    v = qkv[:, hq + hkv:]
    o = flashinfer.single_decode_with_kv_cache(q, k, v)
    ro, _ = decode_one(q, k, v, sm_scale=1 / math.sqrt(d))
    assert_attention_close(o, ro)


def test_extreme_scores():
    """Raw scores near -5e5 still give o = v exactly (one key) and the exact LSE."""
    d = 128
    q = torch.full((4, d), 50.0, dtype=torch.float16, device=CUDA)
    k = torch.full((1, 4, d), -80.0, dtype=torch.float16, device=CUDA)
    v = torch.randn(1, 4, d, dtype=torch.float16, device=CUDA)
    o, lse = flashinfer.single_decode_with_kv_cache(q, k, v, sm_scale=1.0, return_lse=True)
    assert torch.equal(o, v[0])
    expected = -50.0 * 80.0 * d / math.log(2.0)
    assert torch.allclose(lse.double(), torch.full_like(lse.double(), expected), rtol=1e-5, atol=1e-3)


@pytest.mark.parametrize("kv_len", [1, 63, 64, 65, 2048, 32768])
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_single_decode_tensor_cores(kv_len, layout):
    """single_decode_with_kv_cache(use_tensor_cores=True): contiguous KV through the tensor-core
    kernel, lengths around its 64-key stage."""
    check_single(kv_len, layout, 32, 8, 128, torch.bfloat16, True)


@pytest.mark.parametrize("use_tc", [False, True])
@pytest.mark.parametrize("page_size", [1, 5, 16, 64])
def test_nan_past_the_end_tensor_cores_and_cuda_cores(use_tc, page_size):
    """Cache slots past each request's last key (the rest of its last page, pages nobody
    references) hold NaN: the output must still equal the reference (the name holds
    "tensor_cores": test_copy_engines runs it under every copy engine)."""
    hq, hkv, d = 32, 8, 128
    lens = [1, 63, 64, 65, 300, 17]
    pages = [-(-n // page_size) for n in lens]
    total = sum(pages) + 3
    k = torch.full((total, page_size, hkv, d), float("nan"), dtype=torch.bfloat16, device=CUDA)
    v = torch.full_like(k, float("nan"))
    perm = torch.randperm(total).tolist()
    indptr, indices, last, kb, vb = [0], [], [], [], []
    for n, np_ in zip(lens, pages):
        ids = perm[len(indices):len(indices) + np_]
        indices += ids
        indptr.append(len(indices))
        last.append(n - (np_ - 1) * page_size)
        kr = torch.randn(n, hkv, d, dtype=torch.bfloat16, device=CUDA)
        vr = torch.randn(n, hkv, d, dtype=torch.bfloat16, device=CUDA)
        for j in range(n):
            k[ids[j // page_size], j % page_size] = kr[j]
            v[ids[j // page_size], j % page_size] = vr[j]
        kb.append(kr)
        vb.append(vr)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=use_tc)
    w.plan(torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32),
           torch.tensor(last, dtype=torch.int32), hq, hkv, d, page_size, q_data_type=torch.bfloat16)
    q = torch.randn(len(lens), hq, d, dtype=torch.bfloat16, device=CUDA)
    o, lse = w.run(q, (k, v), return_lse=True)
    for b in range(len(lens)):
        ro, rl = decode_one(q[b], kb[b], vb[b], sm_scale=1 / math.sqrt(d))
        assert_attention_close(o[b], ro, f"o[{b}]")
        assert_lse_close(lse[b], rl, f"lse[{b}]")


def test_empty_request_tc_equals_cuda_cores():
    hq, hkv, d, ps = 8, 2, 128, 16
    k = torch.randn(10, ps, hkv, d, dtype=torch.float16, device=CUDA)
    v = torch.randn_like(k)
    q = torch.randn(2, hq, d, dtype=torch.float16, device=CUDA)
    ws = torch.empty(32 << 20, dtype=torch.uint8, device=CUDA)
    res = []
    for tc in (False, True):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_tensor_cores=tc)
        w.plan(torch.tensor([0, 0, 9], dtype=torch.int32), torch.arange(9, dtype=torch.int32),
               torch.tensor([0, 1], dtype=torch.int32), hq, hkv, d, ps, q_data_type=torch.float16)
        res.append(w.run(q, (k, v), return_lse=True))
    (o0, l0), (o1, l1) = res
    assert torch.equal(o0[0], torch.zeros_like(o0[0])) and torch.isinf(l0[0]).all()
    assert (o0.float() - o1.float()).abs().max() <= 1e-3
    assert torch.equal(l0.isinf(), l1.isinf())


def test_out_and_lse_buffers():
    lens = [100, 3000]
    o, lse, q, kv = run_batch(lens, 16, 32, 8, 128, torch.bfloat16, "NHD")
    cache = (kv[0], kv[1])
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(kv[2], kv[3], kv[4], 32, 8, 128, 16, q_data_type=torch.bfloat16)
    out = torch.full_like(q, float("nan"))
    lse_buf = torch.full((2, 32), float("nan"), device=CUDA)
    r = w.run(q, cache, out=out, lse=lse_buf)
    assert r is out
    assert torch.equal(out, o) and torch.equal(lse_buf, lse)
    with pytest.raises(ValueError, match="Invalid shape of out"):
        w.run(q, cache, out=torch.empty(2, 32, 64, dtype=torch.bfloat16, device=CUDA))
    # an expand()ed out: its rows' writes would race
    with pytest.raises(ValueError, match="the rows of out must not overlap"):
        w.run(q, cache, out=torch.empty(1, 1, 128, dtype=torch.bfloat16, device=CUDA).expand(2, 32, 128))


# ---- fp8 KV caches (spec 8.3): dequantized by a plain cast; k_scale folds into sm_scale, v_scale
# scales the output. use_tensor_cores=True takes the tensor-core kernel at head_dim 128 (fp8 rows
# read as 2-byte elements, permuted MMA indices), the CUDA-core kernel at other head_dims.
FP8 = {"e4m3": torch.float8_e4m3fn, "e5m2": torch.float8_e5m2}
FP8_CASES = [  # (batch, kv_len, page_size, hq, hkv, head_dim, q dtype, layout, use_tc, pos, fp8)
    (7, 2048, 16, 32, 8, 128, B, "NHD", False, "NONE", "e4m3"),
    (7, 2048, 16, 32, 8, 128, H, "HND", True, "NONE", "e5m2"),
    (1, 16384, 16, 32, 8, 128, B, "NHD", True, "NONE", "e4m3"),  # split-KV
    (12, 511, 1, 4, 4, 128, H, "NHD", False, "ROPE_LLAMA", "e4m3"),  # page 1, MHA, RoPE
    (17, 97, 8, 32, 4, 256, H, "NHD", False, "NONE", "e5m2"),
    (7, 2048, 5, 32, 4, 64, B, "HND", True, "ROPE_LLAMA", "e5m2"),
    (7, 2048, 16, 32, 4, 512, B, "NHD", False, "NONE", "e4m3"),  # 16 features per lane, 2 sub-groups
    (64, 54, 16, 32, 32, 128, H, "NHD", False, "NONE", "e4m3"),
    (7, 511, 1, 32, 4, 128, H, "HND", True, "NONE", "e4m3"),  # tensor cores: page 1, HND, group 8
    (17, 2048, 5, 32, 8, 128, B, "NHD", True, "ALIBI", "e5m2"),
    (64, 97, 16, 4, 4, 128, B, "NHD", True, "NONE", "e4m3"),  # group 1
    (3, 16384, 16, 32, 8, 128, H, "HND", True, "NONE", "e5m2"),  # split, f16 q
]


def _fp8_cache(lens, ps, hkv, d, layout, fp8):
    """A random paged cache stored in fp8, and its exactly dequantized float32 copy."""
    cache, k, v, indptr, indices, last = make_cache(lens, ps, hkv, d, torch.float32, layout)
    k8, v8 = k.to(FP8[fp8]), v.to(FP8[fp8])
    return (k8, v8), (k8.float(), v8.float(), indptr, indices, last)


@pytest.mark.parametrize("case", FP8_CASES, ids=lambda c: "b{}-kv{}-ps{}-h{}/{}-d{}-{}-{}-tc{}-{}-{}".format(
    c[0], c[1], c[2], c[3], c[4], c[5], str(c[6])[6:], c[7], int(c[8]), c[9], c[10]))
def test_fp8_kv_batch_decode(case):
    batch, kv_len, ps, hq, hkv, d, dtype, layout, use_tc, pos, fp8 = case
    lens = ragged(batch, kv_len)
    cache, deq = _fp8_cache(lens, ps, hkv, d, layout, fp8)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=CUDA), layout,
                                                      use_tensor_cores=use_tc)
    indptr, indices, last = deq[2:]
    w.plan(indptr, indices, last, hq, hkv, d, ps, pos_encoding_mode=pos, q_data_type=dtype, kv_data_type=FP8[fp8])
    q = torch.randn(batch, hq, d, dtype=dtype, device=CUDA)
    k_scale, v_scale = 0.75, 1.5
    o, lse = w.run(q, cache, k_scale=k_scale, v_scale=v_scale, return_lse=True)
    assert o.dtype == dtype and o.shape == q.shape
    sm_scale = k_scale / math.sqrt(d)
    for b in range(batch):
        kb, vb = gather_pages(deq[0], deq[1], layout, indptr, indices, last, b)
        ro, rl = decode_one(q[b], kb, vb, sm_scale=sm_scale, pos_encoding_mode=pos)
        if kb.shape[0] == 0:
            assert torch.equal(o[b].float(), torch.zeros_like(o[b].float()))
        else:
            assert_attention_close(o[b], ro * v_scale, f"o[{b}]")
        assert_lse_close(lse[b], rl, f"lse[{b}]")


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
@pytest.mark.parametrize("kv_len,layout,use_tc", [(15, "NHD", False), (4096, "HND", True), (32768, "NHD", False)])
def test_fp8_kv_single_decode(fp8, kv_len, layout, use_tc):
    hq, hkv, d = 32, 8, 128
    q = torch.randn(hq, d, dtype=torch.bfloat16, device=CUDA)
    shape = (kv_len, hkv, d) if layout == "NHD" else (hkv, kv_len, d)
    k, v = torch.randn(shape, device=CUDA).to(FP8[fp8]), torch.randn(shape, device=CUDA).to(FP8[fp8])
    o, lse = flashinfer.single_decode_with_kv_cache(q, k, v, layout, use_tensor_cores=use_tc, k_scale=2.0,
                                                    return_lse=True)
    kk, vv = (k.float(), v.float()) if layout == "NHD" else (k.float().transpose(0, 1), v.float().transpose(0, 1))
    ro, rl = decode_one(q, kk, vv, sm_scale=2.0 / math.sqrt(d))
    assert_attention_close(o, ro)
    assert_lse_close(lse, rl)


def test_fp8_kv_equals_half_precision_on_the_dequantized_cache():
    """fp8 is a subset of fp16: decoding the fp8 cache and its exact fp16 copy must agree to
    rounding (the two runs differ only in how the kernel reads the cache)."""
    lens = [3000, 1, 0, 700]
    cache, deq = _fp8_cache(lens, 16, 8, 128, "NHD", "e4m3")
    indptr, indices, last = deq[2:]
    q = torch.randn(len(lens), 32, 128, dtype=torch.float16, device=CUDA)
    outs = []
    for kv in (cache, (deq[0].half(), deq[1].half())):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device=CUDA))
        w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=torch.float16, kv_data_type=kv[0].dtype,
               disable_split_kv=True)
        outs.append(w.run(q, kv))
    assert (outs[0].float() - outs[1].float()).abs().max().item() <= 2e-3


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_fp8_kv_tensor_cores_agree_with_cuda_cores(fp8, dtype):
    lens = [5000, 1, 0, 700, 64, 65]
    cache, deq = _fp8_cache(lens, 16, 8, 128, "NHD", fp8)
    indptr, indices, last = deq[2:]
    q = torch.randn(len(lens), 32, 128, dtype=dtype, device=CUDA)
    outs = []
    for use_tc in (False, True):
        w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device=CUDA),
                                                          use_tensor_cores=use_tc)
        w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=dtype, kv_data_type=FP8[fp8])
        outs.append(w.run(q, cache, return_lse=True))
    assert (outs[0][0].float() - outs[1][0].float()).abs().max().item() <= 2e-2
    assert (outs[0][1][[0, 1, 3, 4, 5]] - outs[1][1][[0, 1, 3, 4, 5]]).abs().max().item() <= 1e-3
    check_batch(outs[1][0], outs[1][1], q, deq, "NHD")


@pytest.mark.parametrize("fp8", ["e4m3", "e5m2"])
def test_fp8_kv_tensor_cores_bf16_q_beyond_fp16_range(fp8):
    """With fp8 caches the tensor cores multiply in fp16, bf16 q scaled per head by a power of two:
    heads far outside fp16's range (1e6: overflow, 1e-7: subnormal) next to ordinary ones must
    give the float32 reference's answer, each head with its own scale."""
    lens = [3000, 700, 64, 1]
    hq, hkv, d = 32, 4, 128
    cache, deq = _fp8_cache(lens, 16, hkv, d, "NHD", fp8)
    indptr, indices, last = deq[2:]
    mag = torch.tensor([1e6, 1e-7, 3.0, 0.3, 1e4, 1e-3, 30.0, 1.0] * (hq // 8), device=CUDA)
    q = (torch.randn(len(lens), hq, d, device=CUDA) * mag[None, :, None] / 12).bfloat16()
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device=CUDA),
                                                      use_tensor_cores=True)
    w.plan(indptr, indices, last, hq, hkv, d, 16, q_data_type=torch.bfloat16, kv_data_type=FP8[fp8])
    o, lse = w.run(q, cache, return_lse=True)
    assert torch.isfinite(o.float()).all() and torch.isfinite(lse).all()
    for b in range(len(lens)):  # head by head: the LSE tolerance scales with the row's largest
        kb, vb = gather_pages(deq[0], deq[1], "NHD", indptr, indices, last, b)
        ro, rl = decode_one(q[b], kb, vb, sm_scale=1.0 / math.sqrt(d))
        for h in range(hq):
            assert_attention_close(o[b, h], ro[h], f"o[{b}, {h}]")
            assert_lse_close(lse[b, h:h + 1], rl[h:h + 1], f"lse[{b}, {h}]")


def test_fp8_kv_rows_8_byte_aligned_take_cuda_cores():
    """The fp8 tensor-core path copies 16 bytes at a time: a cache whose rows are only 8-byte
    aligned (a head_dim 128 view of 136-wide rows, one KV head) runs on the CUDA-core kernel
    under use_tensor_cores=True, with the right answer."""
    lens = [700, 33, 2000]
    ps, hkv, d, hq = 16, 1, 128, 4
    n_pages = sum((l + ps - 1) // ps for l in lens) + 2
    store_k = torch.randn(n_pages, ps, hkv, 136, device=CUDA).to(torch.float8_e4m3fn)
    store_v = torch.randn(n_pages, ps, hkv, 136, device=CUDA).to(torch.float8_e4m3fn)
    k, v = store_k[..., :d], store_v[..., :d]
    perm = torch.randperm(n_pages).tolist()
    indptr, indices, last = [0], [], []
    for l in lens:
        n = (l + ps - 1) // ps
        indices += perm[len(indices):len(indices) + n]
        indptr.append(len(indices))
        last.append(l - (n - 1) * ps)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(32 << 20, dtype=torch.uint8, device=CUDA),
                                                      use_tensor_cores=True)
    w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn)
    q = torch.randn(len(lens), hq, d, dtype=torch.bfloat16, device=CUDA)
    o, lse = w.run(q, (k, v), return_lse=True)
    check_batch(o, lse, q, (k.float(), v.float(), indptr, indices, last), "NHD")


def test_fp8_kv_validation():
    lens = [100]
    cache, deq = _fp8_cache(lens, 16, 8, 128, "NHD", "e4m3")
    indptr, indices, last = deq[2:]
    q = torch.randn(1, 32, 128, dtype=torch.bfloat16, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16 << 20, dtype=torch.uint8, device=CUDA))
    w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="The dtype of k .* does not match the kv_data_type"):
        w.run(q, (cache[0].to(torch.float8_e5m2), cache[1].to(torch.float8_e5m2)))
    with pytest.raises(ValueError, match="The dtype of k .* does not match the kv_data_type"):
        w.run(q, (deq[0].bfloat16(), deq[1].bfloat16()))
    with pytest.raises(ValueError, match="q_data_type must be float16 or bfloat16"):
        w.plan(indptr, indices, last, 32, 8, 128, 16, q_data_type=torch.float8_e4m3fn)
    k = torch.randn(50, 8, 128, device=CUDA).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="k and v must have the same dtype"):
        flashinfer.single_decode_with_kv_cache(q[0], k, k.to(torch.float8_e5m2))


# ---- multi-token decode (q_len_per_req > 1, speculative verification): causal within each request,
# bottom-right aligned: query token i of a request of L keys sees its first L - q_len + 1 + i keys.
# The tokens of a request are columns next to its q heads (q_len * group per KV head), so its pages
# are read once per sub-group of columns, not once per token.
@pytest.mark.parametrize("q_len,layout,ps,hq,hkv,d,dtype,pos,window,cap", [
    (2, "NHD", 16, 32, 8, 128, torch.bfloat16, "NONE", -1, None),
    (4, "HND", 5, 32, 4, 128, torch.float16, "NONE", -1, None),
    (3, "NHD", 1, 8, 8, 128, torch.bfloat16, "ROPE_LLAMA", -1, None),  # RoPE: q at its own position (CUDA cores)
    (7, "NHD", 16, 32, 8, 128, torch.float16, "ALIBI", -1, None),       # 28 columns: 4 sub-groups
    (2, "NHD", 16, 32, 32, 64, torch.bfloat16, "NONE", -1, None),        # group 1
    (5, "HND", 16, 64, 8, 128, torch.float16, "NONE", 300, 30.0),       # 40 columns, window per token, soft cap
    (3, "NHD", 16, 16, 4, 256, torch.bfloat16, "ROPE_LLAMA", 50, None),  # head_dim 256 (CUDA cores), RoPE + window
])
def test_multi_token_decode(q_len, layout, ps, hq, hkv, d, dtype, pos, window, cap):
    lens = [100, 4096, q_len, 3000, 20000, 9 + q_len]  # one request of exactly q_len keys; one that splits
    cache, k, v, indptr, indices, last = make_cache(lens, ps, hkv, d, dtype, layout)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(128 << 20, dtype=torch.uint8, device=CUDA), layout,
                                                      use_tensor_cores=True)
    w.plan(indptr, indices, last, hq, hkv, d, ps, pos_encoding_mode=pos, q_data_type=dtype, q_len_per_req=q_len,
           is_causal=True, window_left=window, logits_soft_cap=cap)
    q = torch.randn(len(lens) * q_len, hq, d, dtype=dtype, device=CUDA)
    o, lse = w.run(q, cache, return_lse=True)
    assert o.shape == q.shape and lse.shape == (q.shape[0], hq)
    for b, L in enumerate(lens):
        kb, vb = gather_pages(k, v, layout, indptr, indices, last, b)
        for i in range(q_len):
            r = b * q_len + i
            n = L - q_len + 1 + i
            ro, rl = decode_one(q[r], kb[:n], vb[:n], sm_scale=1 / math.sqrt(d), pos_encoding_mode=pos,
                                window_left=window, soft_cap=cap or 0.0)
            assert_attention_close(o[r], ro, f"o[{b}, {i}]")
            assert_lse_close(lse[r], rl, f"lse[{b}, {i}]")


def test_fp8_kv_multi_token_cast_out_strided_q():
    """Multi-token decode with an fp8 cache (tensor cores: boxes), o_data_type other than q's into
    a given out and lse, and q a strided view (a slice of a wider buffer)."""
    q_len, hq, hkv, d, ps = 3, 32, 8, 128, 16
    lens = [700, 3, 5000]
    cache, deq = _fp8_cache(lens, ps, hkv, d, "NHD", "e4m3")
    indptr, indices, last = deq[2:]
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device=CUDA),
                                                      use_tensor_cores=True)
    w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=torch.bfloat16, kv_data_type=torch.float8_e4m3fn,
           o_data_type=torch.float16, q_len_per_req=q_len)
    wide = torch.randn(len(lens) * q_len, hq + 8, d, dtype=torch.bfloat16, device=CUDA)
    q = wide[:, 4:4 + hq]
    out = torch.full(q.shape, float("nan"), dtype=torch.float16, device=CUDA)
    lse = torch.full((q.shape[0], hq), float("nan"), device=CUDA)
    r = w.run(q, cache, out=out, lse=lse, v_scale=2.0)
    assert r is out
    for b, L in enumerate(lens):
        kb, vb = gather_pages(deq[0], deq[1], "NHD", indptr, indices, last, b)
        for i in range(q_len):
            n = L - q_len + 1 + i
            ro, rl = decode_one(q[b * q_len + i], kb[:n], vb[:n], sm_scale=1 / math.sqrt(d))
            assert_attention_close(out[b * q_len + i], 2.0 * ro, f"o[{b}, {i}]")
            assert_lse_close(lse[b * q_len + i], rl, f"lse[{b}, {i}]")
    with pytest.raises(ValueError, match="lse.dtype must be float32"):
        w.run(q, cache, lse=torch.empty(q.shape[0], hq, dtype=torch.float16, device=CUDA))
    with pytest.raises(ValueError, match="lse.* batch_size \\* q_len_per_req"):
        w.run(q, cache, lse=torch.empty(len(lens), hq, device=CUDA))
    with pytest.raises(ValueError, match="Invalid shape of out"):
        w.run(q, cache, out=torch.empty(q.shape, dtype=torch.bfloat16, device=CUDA))


def test_multi_token_decode_validation_and_cuda_graph():
    hq, hkv, d, ps, batch, q_len = 32, 8, 128, 16, 3, 2
    max_pages = 2048
    bufs = [torch.empty(batch + 1, dtype=torch.int32, device=CUDA), torch.empty(max_pages, dtype=torch.int32, device=CUDA),
            torch.empty(batch, dtype=torch.int32, device=CUDA)]
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device=CUDA), "NHD",
                                                      use_cuda_graph=True, use_tensor_cores=True,
                                                      paged_kv_indptr_buffer=bufs[0], paged_kv_indices_buffer=bufs[1],
                                                      paged_kv_last_page_len_buffer=bufs[2])
    k = torch.randn(max_pages, ps, hkv, d, dtype=torch.bfloat16, device=CUDA)
    v = torch.randn_like(k)

    def plan(lens, **kw):
        n = [(l + ps - 1) // ps for l in lens]
        indptr = [0]
        for x in n:
            indptr.append(indptr[-1] + x)
        indices = torch.randperm(max_pages)[:indptr[-1]].tolist()
        last = [l - (x - 1) * ps for l, x in zip(lens, n)]
        w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=torch.bfloat16, q_len_per_req=q_len, **kw)
        return indptr, indices, last

    with pytest.raises(ValueError, match="every kv_len must be >= q_len_per_req"):
        plan([50, 1, 60])
    meta = plan([50, 70, 60])
    q = torch.randn(batch * q_len, hq, d, dtype=torch.bfloat16, device=CUDA)
    out = torch.empty_like(q)
    with pytest.raises(ValueError, match="q must have batch_size \\* q_len_per_req"):
        w.run(q[:batch], (k, v))
    with pytest.warns(DeprecationWarning), pytest.raises(ValueError, match="q_len_per_req must be 2"):
        w.run(q, (k, v), q_len_per_req=3)
    g = capture_graph(lambda: w.run(q, (k, v), out=out))
    for lens in ([50, 70, 60], [20000, 2, 3000]):  # the second splits the long request
        meta = plan(lens)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        for b, L in enumerate(lens):
            kb, vb = gather_pages(k, v, "NHD", meta[0], meta[1], meta[2], b)
            for i in range(q_len):
                n = L - q_len + 1 + i
                ro, _ = decode_one(q[b * q_len + i], kb[:n], vb[:n], sm_scale=1 / math.sqrt(d))
                assert_attention_close(out[b * q_len + i], ro, f"o[{b}, {i}]")
    with pytest.raises(ValueError, match="q_len_per_req is fixed under CUDA graphs"):
        w.plan([0, 4, 9, 13], list(range(13)), [2, 6, 12], hq, hkv, d, ps, q_data_type=torch.bfloat16,
               q_len_per_req=3)
    with pytest.raises(ValueError, match="requires use_tensor_cores=True"):
        _wrapper().plan([0, 1], [0], [5], hq, hkv, d, ps, q_len_per_req=2)


def test_fast_decode_plan_resolves_dtypes_as_plan_does():
    """Engines bind the module-level fast_decode_plan as wrapper.plan: data_type fills the q and
    KV dtypes left None, as plan() does."""
    import types

    hq, hkv, d, ps = 32, 8, 128, 16
    lens = [700, 33]
    cache, k, v, indptr, indices, last = make_cache(lens, ps, hkv, d, torch.bfloat16, "NHD")
    q = torch.randn(len(lens), hq, d, dtype=torch.bfloat16, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(32 << 20, dtype=torch.uint8, device=CUDA), "NHD")
    w.plan = types.MethodType(flashinfer.decode.fast_decode_plan, w)
    w.plan(indptr, indices, last, hq, hkv, d, ps, data_type=torch.bfloat16)
    o, lse = w.run(q, cache, return_lse=True)
    check_batch(o, lse, q, (k, v, indptr, indices, last), "NHD")
    with pytest.raises(NotImplementedError, match="kv_data_type must equal q_data_type or be fp8"):
        w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=torch.float16, data_type=torch.bfloat16)


@pytest.mark.parametrize("q_dtype,o_dtype", [(torch.float16, torch.bfloat16), (torch.bfloat16, torch.float16)])
@pytest.mark.parametrize("use_tc", [False, True])
def test_o_data_type_other_than_q(q_dtype, o_dtype, use_tc):
    """o_data_type (spec 1.3): o comes back in that dtype, equal to the attention of the float32
    reference; a given out must have it."""
    hq, hkv, d, ps = 32, 8, 128, 16
    lens = [700, 33, 0, 9000]  # 9000: split-KV
    cache, k, v, indptr, indices, last = make_cache(lens, ps, hkv, d, q_dtype, "NHD")
    q = torch.randn(len(lens), hq, d, dtype=q_dtype, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device=CUDA), "NHD",
                                                      use_tensor_cores=use_tc)
    w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=q_dtype, o_data_type=o_dtype)
    o, lse = w.run(q, cache, return_lse=True)
    assert o.dtype == o_dtype and o.shape == q.shape
    check_batch(o, lse, q, (k, v, indptr, indices, last), "NHD")
    out = torch.full(q.shape, float("nan"), dtype=o_dtype, device=CUDA)
    r = w.run(q, cache, out=out, v_scale=0.5)
    assert r is out
    torch.testing.assert_close(out.float(), 0.5 * o.float(), rtol=1e-2, atol=1e-3)
    with pytest.raises(ValueError, match="Invalid shape of out"):
        w.run(q, cache, out=torch.empty(q.shape, dtype=q_dtype, device=CUDA))
    with pytest.raises(ValueError, match="Invalid shape of out"):
        w.run(q, cache, out=torch.empty((len(lens), hq, 64), dtype=o_dtype, device=CUDA))


def test_cupy_arrays_in_the_wrapper():
    """BatchDecodeWithPagedKVCacheWrapper.run takes CuPy q / caches (DLPack): CuPy outputs, run on
    CuPy's current stream, the same numbers as torch tensors give."""
    cupy = pytest.importorskip("cupy")
    hq, hkv, d, ps = 32, 8, 128, 16
    lens = [700, 33, 5000]
    cache, k, v, indptr, indices, last = make_cache(lens, ps, hkv, d, torch.float16, "NHD", form="5d")
    q = torch.randn(len(lens), hq, d, dtype=torch.float16, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(64 << 20, dtype=torch.uint8, device=CUDA), "NHD")
    w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=torch.float16)
    o, lse = w.run(q, cache, return_lse=True)
    check_batch(o, lse, q, (k, v, indptr, indices, last), "NHD")
    torch.cuda.synchronize()
    q_c, cache_c = cupy.from_dlpack(q), cupy.from_dlpack(cache)
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        o_c, lse_c = w.run(q_c, cache_c, return_lse=True)
        o_t = w.run(q_c, (cupy.from_dlpack(k), cupy.from_dlpack(v)), v_scale=2.0)
    stream.synchronize()
    assert isinstance(o_c, cupy.ndarray) and isinstance(lse_c, cupy.ndarray) and isinstance(o_t, cupy.ndarray)
    assert torch.equal(torch.from_dlpack(o_c), o) and torch.equal(torch.from_dlpack(lse_c), lse)
    assert torch.equal(torch.from_dlpack(o_t), o * 2.0)
    out_c = cupy.empty_like(q_c)
    assert w.run(q_c, cache_c, out=out_c) is out_c
    cupy.cuda.get_current_stream().synchronize()
    assert torch.equal(torch.from_dlpack(out_c), o)
    with pytest.raises(KeyError, match="unsupported paged_kv_cache type"):  # as with torch q
        w.run(q_c, object())
    with pytest.raises(NotImplementedError):  # (optional in the API)
        w.workspace_size()


def test_disable_split_kv_is_batch_invariant():
    hq, hkv, d, ps = 32, 8, 128, 16
    lens = [9000, 5, 20000, 0, 300]
    cache, k, v, indptr, indices, last = make_cache(lens, ps, hkv, d, torch.bfloat16, "NHD")
    q = torch.randn(len(lens), hq, d, dtype=torch.bfloat16, device=CUDA)
    ws = torch.empty(64 << 20, dtype=torch.uint8, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD")
    w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=torch.bfloat16, disable_split_kv=True)
    full, full_lse = w.run(q, cache, return_lse=True)
    w.plan([0, indptr[1] - indptr[0]], indices[indptr[0]:indptr[1]], [last[0]], hq, hkv, d, ps,
           q_data_type=torch.bfloat16, disable_split_kv=True)
    alone, alone_lse = w.run(q[:1].contiguous(), cache, return_lse=True)
    assert torch.equal(full[0], alone[0]) and torch.equal(full_lse[0], alone_lse[0])


@pytest.mark.parametrize("use_tc,hq,hkv,d", [(False, 32, 8, 128), (True, 32, 8, 128), (False, 16, 2, 512)])
def test_cuda_graph_replan_and_replay(use_tc, hq, hkv, d):
    ps, batch = 16, 7
    max_pages = 4096
    indptr_buf = torch.empty(batch + 1, dtype=torch.int32, device=CUDA)
    indices_buf = torch.empty(max_pages, dtype=torch.int32, device=CUDA)
    last_buf = torch.empty(batch, dtype=torch.int32, device=CUDA)
    ws = torch.empty(128 << 20, dtype=torch.uint8, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, "NHD", use_cuda_graph=True, use_tensor_cores=use_tc,
                                                      paged_kv_indptr_buffer=indptr_buf,
                                                      paged_kv_indices_buffer=indices_buf,
                                                      paged_kv_last_page_len_buffer=last_buf)
    k = torch.randn(max_pages, ps, hkv, d, dtype=torch.float16, device=CUDA)
    v = torch.randn_like(k)
    q = torch.randn(batch, hq, d, dtype=torch.float16, device=CUDA)
    out = torch.empty_like(q)
    lse = torch.empty(batch, hq, dtype=torch.float32, device=CUDA)

    def plan(lens, whole_buffer=False):
        n = [(l + ps - 1) // ps for l in lens]
        indptr = [0]
        for x in n:
            indptr.append(indptr[-1] + x)
        indices = torch.randperm(max_pages)[:indptr[-1]].tolist()
        last = [0 if x == 0 else l - (x - 1) * ps for l, x in zip(lens, n)]
        if whole_buffer:  # as SGLang does: write the page ids into the graph's buffer, pass all of it
            indices_buf.fill_(-7)
            indices_buf[:len(indices)].copy_(torch.tensor(indices, dtype=torch.int32))
            w.plan(torch.tensor(indptr, dtype=torch.int32, device=CUDA), indices_buf,
                   torch.tensor(last, dtype=torch.int32, device=CUDA), hq, hkv, d, ps, q_data_type=torch.float16)
        else:
            w.plan(indptr, indices, last, hq, hkv, d, ps, q_data_type=torch.float16)
        return indptr, indices, last

    meta = plan([100] * batch)  # short: no split at capture time
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w.run(q, (k, v), out=out, lse=lse)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.run(q, (k, v), out=out, lse=lse)
    for lens, whole in (([100] * batch, False), ([30000, 1, 0, 4000, 17, 16, 8000], False),
                        ([5, 6, 7, 8, 9, 10, 11], False), ([2000, 0, 300, 4096, 1, 64, 900], True)):
        meta = plan(lens, whole)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check_batch(out, lse, q, (k, v) + tuple(meta), "NHD")


def test_cuda_graph_plan_refuses_pages_beyond_the_captured_cache():
    """A replay skips run()'s checks: after a capture on a cache of 40 pages, a plan whose page
    indices reach page 40 raises (naming the captured size) and leaves the last plan in place;
    runs outside a capture set no limit."""
    ps, batch, hq, hkv, d = 16, 3, 8, 2, 128
    indptr_buf = torch.empty(batch + 1, dtype=torch.int32, device=CUDA)
    indices_buf = torch.empty(64, dtype=torch.int32, device=CUDA)
    last_buf = torch.empty(batch, dtype=torch.int32, device=CUDA)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(32 << 20, dtype=torch.uint8, device=CUDA), "NHD",
                                                      use_cuda_graph=True, paged_kv_indptr_buffer=indptr_buf,
                                                      paged_kv_indices_buffer=indices_buf,
                                                      paged_kv_last_page_len_buffer=last_buf)
    big = torch.randn(80, ps, hkv, d, dtype=torch.float16, device=CUDA)
    k, v = torch.randn(40, ps, hkv, d, dtype=torch.float16, device=CUDA), torch.randn(40, ps, hkv, d,
                                                                                   dtype=torch.float16, device=CUDA)
    q = torch.randn(batch, hq, d, dtype=torch.float16, device=CUDA)
    out = torch.empty_like(q)
    w.plan([0, 2, 3, 5], [70, 71, 72, 73, 79], [16, 5, 9], hq, hkv, d, ps, q_data_type=torch.float16)
    w.run(q, (big, big), out=out)  # an eager run on a larger cache: no limit
    good = ([0, 2, 3, 5], [3, 39, 0, 17, 8], [16, 5, 9])
    w.plan(*good, hq, hkv, d, ps, q_data_type=torch.float16)
    g = capture_graph(lambda: w.run(q, (k, v), out=out))
    with pytest.raises(ValueError, match="indices reference page 40, but a CUDA graph captured run\\(\\) on a "
                                         "paged_kv_cache of 40 pages"):
        w.plan([0, 2, 3, 5], [3, 40, 0, 17, 8], [16, 5, 9], hq, hkv, d, ps, q_data_type=torch.float16)
    out.fill_(float("nan"))
    g.replay()  # the refused plan changed nothing: the last good plan replays
    torch.cuda.synchronize()
    check_batch(out, None, q, (k, v) + good, "NHD")


# ---- validation (plan / run) ------------------------------------------------------------------------

def _wrapper():
    return flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16 << 20, dtype=torch.uint8, device=CUDA))


@pytest.mark.parametrize("indptr,indices,last,match", [
    ([1, 2], [0, 1], [1], "indptr\\[0\\] must be 0"),
    ([0, 3, 2], [0, 1, 2], [1, 1], "nondecreasing"),
    ([0, 2], [0, 1, 2], [1], "indptr\\[-1\\]"),
    ([0, 2], [0, 1], [17], "last_page_len\\[0\\]"),
    ([0, 2], [0, 1], [0], "last_page_len\\[0\\]"),
    ([0, 2], [0, -1], [1], "indices must be >= 0"),
    ([0, 2], [0, 1], [1, 1], "last_page_len must have"),
])
def test_plan_rejects_bad_page_table(indptr, indices, last, match):
    with pytest.raises(ValueError, match=match):
        _wrapper().plan(indptr, indices, last, 8, 8, 128, 16)


def test_plan_rejects_bad_heads_and_head_dim():
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        _wrapper().plan([0, 1], [0], [1], 12, 8, 128, 16)
    with pytest.raises(ValueError, match="head_dim"):
        _wrapper().plan([0, 1], [0], [1], 8, 8, 96, 16)
    with pytest.raises(KeyError):
        _wrapper().plan([0, 1], [0], [1], 8, 8, 128, 16, pos_encoding_mode="YARN")


def test_plan_names_wrongly_typed_sizes_and_modes():
    with pytest.raises(TypeError, match="^head_dim must be an int; got str '128'$"):
        _wrapper().plan([0, 1], [0], [1], 8, 8, "128", 16)
    with pytest.raises(TypeError, match="^num_kv_heads must be an int; got float 2.5$"):
        _wrapper().plan([0, 1], [0], [1], 8, 2.5, 128, 16)
    for mode in (True, 5, "YARN", None):
        with pytest.raises(KeyError, match="pos_encoding_mode must be 'NONE', 'ROPE_LLAMA' or 'ALIBI'"):
            _wrapper().plan([0, 1], [0], [1], 8, 8, 128, 16, pos_encoding_mode=mode)
    w = _wrapper()  # integral floats are taken, as int() would
    w.plan([0, 1], [0], [5], 8.0, 2, 128.0, 16.0, q_data_type=torch.float16)
    q = torch.randn(1, 8, 128, dtype=torch.float16, device=CUDA)
    k, v = (torch.randn(1, 16, 2, 128, dtype=torch.float16, device=CUDA) for _ in range(2))
    check_batch(w.run(q, (k, v)), None, q, (k, v, [0, 1], [0], [5]), "NHD")


def test_plan_rejects_small_workspace():
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(1024, dtype=torch.uint8, device=CUDA))
    with pytest.raises(ValueError, match="too small"):
        w.plan([0, 2048], list(range(2048)), [16], 32, 8, 128, 16)


@pytest.mark.parametrize("bad", [float("nan"), float("inf")])
def test_scales_and_rope_parameters_must_be_finite(bad):
    """NaN / inf scales (and a ROPE_LLAMA rope_scale / rope_theta that is not positive) would make
    every output NaN: plan, run and single decode raise naming them."""
    w = _wrapper()
    with pytest.raises(ValueError, match="plan: sm_scale must be a finite number"):
        w.plan([0, 2], [0, 3], [5], 8, 2, 128, 16, q_data_type=torch.float16, sm_scale=bad)
    for name, value in (("rope_scale", bad), ("rope_theta", 0.0)):
        with pytest.raises(ValueError, match=f"plan: {name} must be a positive finite number"):
            w.plan([0, 2], [0, 3], [5], 8, 2, 128, 16, q_data_type=torch.float16, pos_encoding_mode="ROPE_LLAMA",
                   **{name: value})
    w.plan([0, 2], [0, 3], [5], 8, 2, 128, 16, q_data_type=torch.float16)
    q = torch.randn(1, 8, 128, dtype=torch.float16, device=CUDA)
    k = torch.randn(4, 16, 2, 128, dtype=torch.float16, device=CUDA)
    for name in ("q_scale", "k_scale", "v_scale"):
        with pytest.raises(ValueError, match=f"run: {name} must be a finite number"):
            w.run(q, (k, k), **{name: bad})
    kc = torch.randn(37, 2, 128, dtype=torch.float16, device=CUDA)
    for kw in (dict(sm_scale=bad), dict(k_scale=bad), dict(v_scale=bad),
               dict(pos_encoding_mode="ROPE_LLAMA", rope_theta=-1.0)):
        with pytest.raises(ValueError, match="single_decode_with_kv_cache: .* must be a"):
            flashinfer.single_decode_with_kv_cache(q[0], kc, kc, **kw)


@pytest.mark.parametrize("use_tc", [False, True])
def test_run_out_may_be_q_itself_but_not_overlap_it(use_tc):
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(16 << 20, dtype=torch.uint8, device=CUDA),
                                                      use_tensor_cores=use_tc)
    meta = ([0, 2, 3, 5], [0, 3, 1, 4, 2], [5, 16, 9])
    w.plan(*meta, 8, 2, 128, 16, q_data_type=torch.float16)
    k, v = (torch.randn(5, 16, 2, 128, dtype=torch.float16, device=CUDA) for _ in range(2))
    buf = torch.randn(4, 8, 128, dtype=torch.float16, device=CUDA)
    q = buf[:3]
    with pytest.raises(ValueError, match="out must not overlap q"):
        w.run(q, (k, v), out=buf[1:])
    q0 = q.clone()
    assert w.run(q, (k, v), out=q) is q  # in place
    check_batch(q, None, q0, (k, v) + meta, "NHD")


def test_run_rejects_mismatches():
    w = _wrapper()
    w.plan([0, 2], [0, 3], [5], 8, 2, 128, 16, q_data_type=torch.float16)
    q = torch.randn(1, 8, 128, dtype=torch.float16, device=CUDA)
    k = torch.randn(4, 16, 2, 128, dtype=torch.float16, device=CUDA)
    with pytest.raises(ValueError, match="does not match the q_data_type"):
        w.run(q.bfloat16(), (k, k))
    with pytest.raises(ValueError, match="page_size"):
        w.run(q, (k[:, :8].contiguous(), k[:, :8].contiguous()))
    with pytest.raises(ValueError, match="only 2 pages"):
        w.run(q, (k[:2], k[:2]))
    with pytest.raises(ValueError, match="num_kv_heads"):
        w.run(q, (k[:, :, :1], k[:, :, :1]))
    with pytest.raises(KeyError):
        w.run(q, [k])
    with pytest.raises(ValueError, match="does not match the kv_data_type"):
        w.run(q, (k.bfloat16(), k.bfloat16()))


def test_cuda_graph_requires_buffers():
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=CUDA)
    with pytest.raises(ValueError, match="use_cuda_graph=True requires"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, use_cuda_graph=True)


def test_workspace_alignment():
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=CUDA)
    with pytest.raises(ValueError, match="16-byte aligned"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws[1:])


def test_workspace_buffers_are_checked():
    """A strided float workspace (sized by numel) and an int workspace on another device or not
    contiguous are refused; an int workspace of another dtype is taken as its raw bytes."""
    ws = torch.empty(16 << 20, dtype=torch.uint8, device=CUDA)
    with pytest.raises(ValueError, match="float_workspace_buffer must be contiguous"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws[:1].expand(1 << 20))
    w = _wrapper()
    with pytest.raises(ValueError, match="int_workspace_buffer must be a CUDA tensor on cuda"):
        w.reset_workspace_buffer(ws, torch.empty(1 << 20, dtype=torch.uint8))
    with pytest.raises(ValueError, match="int_workspace_buffer must be contiguous"):
        w.reset_workspace_buffer(ws, torch.empty(2 << 20, dtype=torch.uint8, device=CUDA)[::2])
    # an int32 int workspace: plan() writes byte offsets into it; the answer must be right
    lens, hq, hkv, d = [40, 300, 17], 8, 2, 128
    cache, k, v, indptr, indices, last = make_cache(lens, 16, hkv, d, torch.float16, "NHD")
    w.reset_workspace_buffer(ws, torch.zeros(1 << 18, dtype=torch.int32, device=CUDA))
    w.plan(indptr, indices, last, hq, hkv, d, 16, q_data_type=torch.float16)
    q = torch.randn(len(lens), hq, d, dtype=torch.float16, device=CUDA)
    o, lse = w.run(q, cache, return_lse=True)
    check_batch(o, lse, q, (k, v, indptr, indices, last), "NHD")


def test_cuda_graph_buffers_must_be_contiguous_and_on_the_device():
    ws = torch.empty(1 << 20, dtype=torch.uint8, device=CUDA)
    ok = dict(paged_kv_indptr_buffer=torch.zeros(5, dtype=torch.int32, device=CUDA),
              paged_kv_indices_buffer=torch.zeros(64, dtype=torch.int32, device=CUDA),
              paged_kv_last_page_len_buffer=torch.zeros(4, dtype=torch.int32, device=CUDA))
    flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, use_cuda_graph=True, **ok)
    bad = dict(ok, paged_kv_indices_buffer=torch.zeros(128, dtype=torch.int32, device=CUDA)[::2])
    with pytest.raises(ValueError, match="paged_kv_indices_buffer must be a contiguous 1-D tensor"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, use_cuda_graph=True, **bad)
    bad = dict(ok, paged_kv_indptr_buffer=torch.zeros(5, 1, dtype=torch.int32, device=CUDA))
    with pytest.raises(ValueError, match="paged_kv_indptr_buffer must be a contiguous 1-D tensor"):
        flashinfer.BatchDecodeWithPagedKVCacheWrapper(ws, use_cuda_graph=True, **bad)


def test_soft_cap_must_be_finite():
    with pytest.raises(ValueError, match="logits_soft_cap must be a finite number >= 0"):
        _wrapper().plan([0, 1], [0], [1], 8, 8, 128, 16, logits_soft_cap=float("nan"))
    with pytest.raises(ValueError, match="logits_soft_cap must be a finite number >= 0"):
        _wrapper().plan([0, 1], [0], [1], 8, 8, 128, 16, logits_soft_cap=float("inf"))
    q = torch.randn(8, 128, dtype=torch.float16, device=CUDA)
    k = torch.randn(10, 8, 128, dtype=torch.float16, device=CUDA)
    for cap in (-1.0, float("nan")):
        with pytest.raises(ValueError, match="logits_soft_cap must be a finite number >= 0"):
            flashinfer.single_decode_with_kv_cache(q, k, k, logits_soft_cap=cap)


def test_plan_rejects_requests_of_2_31_keys():
    n = 2 ** 21 + 1  # pages of 1024 keys (one page id, repeated)
    with pytest.raises(ValueError, match="fewer than 2\\*\\*31"):
        _wrapper().plan([0, n], [0] * n, [1024], 8, 8, 128, 1024)


def test_forward_keeps_the_plans_other_options():
    """The deprecated forward() re-plans with its own options only: seq_lens stays."""
    lens, hq, hkv, d = [40, 300], 8, 2, 128
    cache, k, v, indptr, indices, last = make_cache(lens, 16, hkv, d, torch.float16, "NHD")
    short = [3, 200]
    w = _wrapper()
    w.plan(indptr, indices, last, hq, hkv, d, 16, q_data_type=torch.float16, seq_lens=torch.tensor(short))
    q = torch.randn(2, hq, d, dtype=torch.float16, device=CUDA)
    ref = w.run(q, cache)
    got = w.forward(q, cache)
    torch.testing.assert_close(got, ref, rtol=0, atol=0)
    for b, s in enumerate(short):  # against the reference over the first s keys
        kb, vb = gather_pages(k, v, "NHD", indptr, indices, last, b)
        ro, _ = decode_one(q[b], kb[:s], vb[:s], sm_scale=1.0 / math.sqrt(d))
        assert_attention_close(got[b], ro, f"o[{b}]")


def test_forward_with_an_engines_plan_and_changed_options():
    """forward() with the plan's own options runs the plan as it is; with other options it plans
    again by the class's plan, also where an engine bound fast_decode_plan as wrapper.plan (which
    takes no seq_lens / o_data_type keywords)."""
    import types

    lens, hq, hkv, d = [40, 300], 8, 2, 128
    cache, k, v, indptr, indices, last = make_cache(lens, 16, hkv, d, torch.float16, "NHD")
    q = torch.randn(2, hq, d, dtype=torch.float16, device=CUDA)
    w = _wrapper()
    w.plan = types.MethodType(flashinfer.decode.fast_decode_plan, w)
    w.plan(indptr, indices, last, hq, hkv, d, 16, q_data_type=torch.float16)
    runner = w._runner
    got = w.forward(q, cache)
    assert w._runner is runner  # same options: no re-plan
    check_batch(got, None, q, (k, v, indptr, indices, last), "NHD")
    capped = w.forward(q, cache, logits_soft_cap=5.0)
    assert w._runner is not runner
    ref = _wrapper()
    ref.plan(indptr, indices, last, hq, hkv, d, 16, q_data_type=torch.float16, logits_soft_cap=5.0)
    torch.testing.assert_close(capped, ref.run(q, cache), rtol=0, atol=0)


def test_out_on_another_device_is_named():
    w = _wrapper()
    w.plan([0, 1], [0], [1], 8, 8, 128, 16, q_data_type=torch.float16)
    q = torch.randn(1, 8, 128, dtype=torch.float16, device=CUDA)
    k = torch.randn(2, 16, 8, 128, dtype=torch.float16, device=CUDA)
    with pytest.raises(ValueError, match="out must be a CUDA tensor"):
        w.run(q, (k, k), out=torch.empty(1, 8, 128, dtype=torch.float16))


@pytest.mark.parametrize("form", ["tuple", "5d"])
def test_run_names_a_non_tensor_argument(form):
    """run() after a plan: a cache element, out or lse that is no tensor raises a TypeError
    naming it (the binding's generic error is caught and replaced); a valid call afterwards
    still matches the reference."""
    lens, ps, hq, hkv, d = [40, 17], 16, 8, 2, 128
    cache, k, v, indptr, indices, last = make_cache(lens, ps, hkv, d, torch.float16, "NHD", form=form)
    w = flashinfer.BatchDecodeWithPagedKVCacheWrapper(torch.empty(32 << 20, dtype=torch.uint8, device=CUDA), "NHD",
                                                      use_tensor_cores=True)
    w.plan(torch.tensor(indptr, dtype=torch.int32), torch.tensor(indices, dtype=torch.int32),
           torch.tensor(last, dtype=torch.int32), hq, hkv, d, ps, q_data_type=torch.float16)
    q = torch.randn(len(lens), hq, d, dtype=torch.float16, device=CUDA)
    names = {"out": dict(out=[0.0]), "lse": dict(lse=[0.0], return_lse=True)}
    if form == "tuple":
        names["paged_kv_cache\\[1\\]"] = dict(paged_kv_cache=(k, None))
        names["paged_kv_cache\\[0\\]"] = dict(paged_kv_cache=([0.0], v))
    for name, kwargs in names.items():
        with pytest.raises(TypeError, match=f"^{name} must be a tensor supporting DLPack .*; got "):
            w.run(q, kwargs.pop("paged_kv_cache", cache), **kwargs)
    o = w.run(q, cache)
    for b in range(len(lens)):
        kk, vv = gather_pages(k, v, "NHD", indptr, indices, last, b)
        ref, _ = decode_one(q[b], kk, vv, sm_scale=1.0 / math.sqrt(d))
        assert_attention_close(o[b], ref)
