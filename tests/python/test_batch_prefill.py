"""BatchPrefillWithPagedKVCacheWrapper / BatchPrefillWithRaggedKVCacheWrapper.

GPU: results against the float64 reference (reference_prefill.prefill_ref, request by request)
over the spec §1.6 grid at moderate sizes: batch {1, 3, 12} with ragged lengths including empty
requests (qo_len 0, kv_len 0), qo_len {1, 17, 37, 127}, kv_len {1, 54, 97, 512}, page_size
{1, 5, 16}, head dims (64, 64), (128, 128), (256, 256), (192, 128) (and (512, 512) once each),
groups {1, 4, 7}, NHD / HND, fp16 / bf16, causal on / off, all four paged-cache forms; sliding
window, soft cap, ALiBi, custom and packed masks, RoPE (ragged and paged), fp8 K / V (e4m3 / e5m2,
paged and ragged, against the reference on the dequantized values with amax / 256 scales; with
RoPE), LSE base / layout variants, preallocated out / lse, o_data_type, scales, seq_lens, batch vs
per-request single_prefill_with_kv_cache, batch invariance with fixed_split_size, CUDA-graph
capture / re-plan / replay, the two-M-tile kernel, strided views, CuPy; and the run-time /
plan-time argument checks.

CPU (no GPU needed): the signatures and module surface, the constructors' checks, the cache-form
unpacking, the mask segment offsets, plan_batch's work items, and the wrappers' host side end to
end (plan's lengths, index copies, mask packing, work items, CUDA-graph padding, RoPE positions,
the paged gather of fp8 / RoPE plans, the fp8 casts and scales, LSE base / layout, output casts)
with the kernel emulated in float64 from its binding contract (``emulated`` fixture).
"""

from __future__ import annotations

import contextlib
import functools
import inspect
import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
flashinfer = pytest.importorskip("flashinfer", reason="flashinfer (with its _prefill binding) is not importable",
                                 exc_type=ImportError)

import flashinfer.prefill as fprefill  # noqa: E402
from checks import capture_graph  # noqa: E402
from reference_attention import gather_pages, rope_rotate_half  # noqa: E402
from reference_page import make_page_table  # noqa: E402
from reference_prefill import assert_prefill_close, assert_prefill_lse_close, prefill_ref  # noqa: E402

CUDA = "cuda"
B, H = torch.bfloat16, torch.float16
gpu = pytest.mark.gpu
Paged = flashinfer.BatchPrefillWithPagedKVCacheWrapper
Ragged = flashinfer.BatchPrefillWithRaggedKVCacheWrapper

# request lengths by batch size: every qo_len / kv_len of the grid, empty requests included
LENS = {
    1: ([127], [512]),
    3: ([17, 0, 37], [97, 54, 0]),  # request 1: no query rows; request 2: no keys
    12: ([1, 17, 37, 127, 0, 17, 1, 127, 37, 1, 17, 37], [54, 97, 512, 1, 54, 0, 512, 97, 54, 1, 512, 97]),
}


def workspace(dev=CUDA):
    return torch.empty(32 << 20, dtype=torch.uint8, device=dev)


def indptr_of(lens):
    out = [0]
    for n in lens:
        out.append(out[-1] + n)
    return out


class Batch:
    """The inputs of one batch: q, and either ragged k / v or a paged cache in one of the four
    forms; per-request NHD keys / values for the reference; the plan's positional arguments."""

    def __init__(self, kind, qo_lens, kv_lens, hq, hkv, dqk, dvo, dtype, layout="NHD", page_size=16, form="tuple4",
                 dev=CUDA, spare_pages=3):
        self.kind, self.layout, self.dtype = kind, layout, dtype
        self.qo_lens, self.kv_lens = list(qo_lens), list(kv_lens)
        self.hq, self.hkv, self.dqk, self.dvo = hq, hkv, dqk, dvo
        self.qo_indptr = indptr_of(qo_lens)
        self.q = torch.randn(self.qo_indptr[-1], hq, dqk, dtype=dtype, device=dev)
        if kind == "ragged":
            self.kv_indptr = indptr_of(kv_lens)
            n = self.kv_indptr[-1]
            k = torch.randn(n, hkv, dqk, dtype=dtype, device=dev)
            v = torch.randn(n, hkv, dvo, dtype=dtype, device=dev)
            self.kv = [(k[a:b], v[a:b]) for a, b in zip(self.kv_indptr[:-1], self.kv_indptr[1:])]
            if layout == "HND":
                k, v = k.transpose(0, 1).contiguous(), v.transpose(0, 1).contiguous()
            self.k, self.v = k, v
            return
        self.page_size, self.form = page_size, form
        gen = torch.Generator().manual_seed(sum(kv_lens) * 7 + page_size)
        t = make_page_table(kv_lens, page_size, dev, spare_pages=spare_pages, generator=gen)
        self.table = t
        P = t.num_pages
        if form in ("4d", "tuple3"):
            assert page_size == 1
        if form in ("5d", "4d"):
            assert dqk == dvo
        shape = (lambda d: (P, page_size, hkv, d)) if layout == "NHD" else (lambda d: (P, hkv, page_size, d))
        self._set_cache(*(torch.randn(shape(d), dtype=dtype, device=dev) for d in (dqk, dvo)))

    def _set_cache(self, k4, v4):
        """The cache in this batch's form from 4-D k / v pages, and the per-request reference keys /
        values (fp8 pages: their values cast to q's dtype)."""
        layout, form = self.layout, self.form
        if form in ("5d", "4d"):
            full = k4.new_empty((k4.shape[0], 2) + tuple(k4.shape[1:]))
            full[:, 0], full[:, 1] = k4, v4
            k4, v4 = full[:, 0], full[:, 1]
            self.cache = full if form == "5d" else full.squeeze(2 if layout == "NHD" else 3)
        elif form == "tuple4":
            self.cache = (k4, v4)
        else:  # tuple3: [P, hkv, d]
            self.cache = (k4.squeeze(1 if layout == "NHD" else 2), v4.squeeze(1 if layout == "NHD" else 2))
        self.k4, self.v4 = k4, v4
        kd, vd = k4.to(self.dtype), v4.to(self.dtype)
        t = self.table
        ip, ind, last = t.indptr.tolist(), t.indices.tolist(), t.last_page_len.tolist()
        self.kv = [gather_pages(kd, vd, layout, ip, ind, last, b) if ip[b + 1] > ip[b] else
                   (kd.new_zeros(0, self.hkv, self.dqk), vd.new_zeros(0, self.hkv, self.dvo))
                   for b in range(len(self.kv_lens))]

    def quantize(self, fp8):
        """K / V (the cache, or ragged k / v) stored as fp8 ``x / scale`` with per-tensor scales
        ``amax / 256`` (FlashInfer's tests); the reference keys / values become the stored values
        dequantized by a plain cast. Returns (k_scale, v_scale): the factors of sm_scale and o."""
        k, v = (self.k4, self.v4) if self.kind == "paged" else (self.k, self.v)
        ks, vs = (x.abs().amax().item() / 256 for x in (k, v))
        k8, v8 = (k.float() / ks).to(fp8), (v.float() / vs).to(fp8)
        if self.kind == "paged":
            self._set_cache(k8, v8)
        else:
            self.k, self.v = k8, v8
            kd, vd = (x.to(self.dtype) if self.layout == "NHD" else x.to(self.dtype).transpose(0, 1) for x in (k8, v8))
            self.kv = [(kd[a:b], vd[a:b]) for a, b in zip(self.kv_indptr[:-1], self.kv_indptr[1:])]
        return ks, vs

    def plan_args(self):
        dev = self.q.device
        qo = torch.tensor(self.qo_indptr, dtype=torch.int32, device=dev)
        if self.kind == "ragged":
            return (qo, torch.tensor(self.kv_indptr, dtype=torch.int32, device=dev), self.hq, self.hkv, self.dqk,
                    self.dvo)
        t = self.table
        return (qo, t.indptr, t.indices, t.last_page_len, self.hq, self.hkv, self.dqk, self.page_size, self.dvo)

    def run_args(self):
        return (self.q, self.cache) if self.kind == "paged" else (self.q, self.k, self.v)

    def wrapper(self, dev=CUDA, **kw):
        cls = Paged if self.kind == "paged" else Ragged
        return cls(workspace(dev), self.layout, **kw)

    def plan(self, w, **kw):
        kw.setdefault("q_data_type", self.dtype)
        w.plan(*self.plan_args(), **kw)

    def ref(self, masks=None, rope=False, **kw):
        """Concatenated per-request float64 reference (o, lse); ``masks``: per-request bool masks."""
        os_, ls_ = [], []
        for b, (qa, qb) in enumerate(zip(self.qo_indptr[:-1], self.qo_indptr[1:])):
            k, v = self.kv[b]
            o, lse = prefill_ref(self.q[qa:qb], k, v, mask=None if masks is None else masks[b], rope=rope,
                                 rope_dtype=self.dtype if rope else None, **kw)
            os_.append(o)
            ls_.append(lse)
        return torch.cat(os_), torch.cat(ls_)

    def random_masks(self, p=0.5):
        dev = self.q.device
        masks = []
        for qo, kv in zip(self.qo_lens, self.kv_lens):
            m = torch.rand(qo, kv, device=dev) < p
            if qo > 2 and kv:
                m[1] = False  # a row with no key
                m[2] = True
            masks.append(m)
        return masks

    def causal_masks(self):
        dev = self.q.device
        return [torch.ones(qo, kv, dtype=torch.bool, device=dev).tril(kv - qo) for qo, kv in
                zip(self.qo_lens, self.kv_lens)]


def flat(masks):
    return torch.cat([m.reshape(-1) for m in masks])


def pack_segments(masks):
    """Each request's mask bits packed little-endian into byte-aligned segments (numpy, independent
    of flashinfer's packing)."""
    parts = [np.packbits(m.cpu().numpy().reshape(-1), bitorder="little") for m in masks]
    data = np.concatenate(parts) if parts else np.zeros(0, np.uint8)
    return torch.from_numpy(data.astype(np.uint8))


def check(o, lse, ref_o, ref_lse, name=""):
    assert_prefill_close(o, ref_o, "o" + name, empty_rows=torch.isinf(ref_lse))
    if lse is not None:
        assert_prefill_lse_close(lse, ref_lse, "lse" + name)


# ==================================================================================================
# GPU: the grid
# ==================================================================================================

# (batch, page_size, layout, head_dim_qk, head_dim_vo, hq, hkv, dtype, causal, cache form)
PAGED_CASES = [
    (1, 16, "NHD", 128, 128, 32, 8, H, True, "5d"),
    (3, 5, "HND", 64, 64, 28, 4, B, False, "tuple4"),  # group 7
    (12, 1, "NHD", 128, 128, 8, 8, B, True, "4d"),  # group 1, single 4-D tensor (page_size 1)
    (12, 16, "HND", 256, 256, 16, 4, H, True, "5d"),
    (3, 1, "HND", 192, 128, 28, 4, B, True, "tuple3"),  # DeepSeek dims, tuple of 3-D (page_size 1)
    (12, 5, "NHD", 192, 128, 32, 8, H, False, "tuple4"),
    (3, 16, "NHD", 64, 64, 8, 8, H, True, "tuple4"),
    (1, 5, "HND", 256, 256, 7, 1, B, False, "5d"),  # group 7
    (12, 1, "NHD", 64, 64, 28, 4, H, False, "tuple3"),
    (3, 1, "HND", 128, 128, 32, 8, B, True, "4d"),
    (12, 16, "NHD", 128, 128, 28, 4, B, True, "tuple4"),
    (1, 1, "HND", 64, 64, 4, 1, H, True, "tuple3"),
    (12, 5, "HND", 128, 128, 16, 4, H, True, "5d"),
    (3, 16, "NHD", 512, 512, 8, 2, B, True, "tuple4"),  # head_dim 512
]


def _paged_id(c):
    b, ps, layout, dqk, dvo, hq, hkv, dt, causal, form = c
    return (f"b{b}-ps{ps}-{layout}-d{dqk}/{dvo}-h{hq}/{hkv}-{'bf16' if dt is B else 'fp16'}-"
            f"{'causal' if causal else 'full'}-{form}")


@gpu
@pytest.mark.parametrize("case", PAGED_CASES, ids=_paged_id)
def test_paged(case):
    batch, ps, layout, dqk, dvo, hq, hkv, dtype, causal, form = case
    qo_lens, kv_lens = LENS[batch]
    bt = Batch("paged", qo_lens, kv_lens, hq, hkv, dqk, dvo, dtype, layout, ps, form)
    w = bt.wrapper()
    bt.plan(w, causal=causal)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    assert o.shape == (sum(qo_lens), hq, dvo) and o.dtype == dtype
    assert lse.shape == (sum(qo_lens), hq) and lse.dtype == torch.float32
    check(o, lse, *bt.ref(causal=causal))
    o2 = w.run(*bt.run_args())
    assert torch.equal(o2, o), "return_lse must not change o"


# (batch, layout, head_dim_qk, head_dim_vo, hq, hkv, dtype, causal)
RAGGED_CASES = [
    (1, "NHD", 128, 128, 32, 8, B, True),
    (3, "HND", 64, 64, 28, 4, H, False),
    (12, "NHD", 256, 256, 8, 8, B, True),
    (12, "HND", 192, 128, 28, 4, H, True),
    (3, "NHD", 192, 128, 16, 4, B, False),
    (12, "NHD", 64, 64, 7, 1, H, True),
    (1, "HND", 256, 256, 16, 4, H, False),
    (3, "HND", 128, 128, 8, 2, B, True),
    (12, "HND", 128, 128, 32, 8, H, False),
    (3, "HND", 512, 512, 8, 8, H, False),  # head_dim 512
]


def _ragged_id(c):
    b, layout, dqk, dvo, hq, hkv, dt, causal = c
    return f"b{b}-{layout}-d{dqk}/{dvo}-h{hq}/{hkv}-{'bf16' if dt is B else 'fp16'}-{'causal' if causal else 'full'}"


@gpu
@pytest.mark.parametrize("case", RAGGED_CASES, ids=_ragged_id)
def test_ragged(case):
    batch, layout, dqk, dvo, hq, hkv, dtype, causal = case
    qo_lens, kv_lens = LENS[batch]
    bt = Batch("ragged", qo_lens, kv_lens, hq, hkv, dqk, dvo, dtype, layout)
    w = bt.wrapper()
    bt.plan(w, causal=causal)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    assert o.shape == (sum(qo_lens), hq, dvo) and o.dtype == dtype
    check(o, lse, *bt.ref(causal=causal))
    assert torch.equal(w.run(*bt.run_args()), o)


# Split-KV (prefill.h prefill_num_chunks): batches whose CTAs leave SMs idle, with keys enough for
# chunks of >= 512. (kind, qo_lens, kv_lens, head_dim_qk, head_dim_vo, hq, hkv, dtype, causal,
# layout, page_size, form, extra plan options)
SPLIT_CASES = [
    ("paged", [64], [8192], 128, 128, 32, 8, B, False, "NHD", 16, "5d", {}),  # a cascade's shared prefix
    ("ragged", [5, 64, 0, 33], [3000, 6000, 700, 0], 128, 128, 32, 8, H, True, "HND", None, None, {}),
    ("paged", [7, 1, 19], [4099, 2048, 1500], 64, 64, 28, 4, H, True, "HND", 5, "tuple4", {}),
    ("ragged", [16, 3], [5000, 1024], 256, 256, 16, 4, B, False, "NHD", None, None, {"logits_soft_cap": 30.0}),
    ("paged", [9], [4096], 192, 128, 16, 2, B, True, "NHD", 1, "tuple3", {"window_left": 1500}),
    ("ragged", [2, 1], [3000, 1100], 512, 512, 8, 8, H, True, "NHD", None, None, {}),
    ("paged", [33, 4], [2500, 3333], 128, 128, 8, 1, H, False, "HND", 16, "tuple4", {"pos_encoding_mode": "ALIBI"}),
]


def _split_id(c):
    kind, qo, kv, dqk, dvo, hq, hkv, dt, causal, layout, ps, form, extra = c
    return f"{kind}-q{sum(qo)}-kv{max(kv)}-d{dqk}/{dvo}-h{hq}/{hkv}-{'causal' if causal else 'full'}-{'-'.join(extra)}"


@gpu
@pytest.mark.parametrize("case", SPLIT_CASES, ids=_split_id)
def test_split_kv(case):
    """The plan splits these batches' keys (the wrapper's chunk count > 1) and the merged result
    matches the float64 reference, with and without the LSE; disable_split_kv plans the same batch
    unsplit (one M tile) and agrees with it."""
    kind, qo_lens, kv_lens, dqk, dvo, hq, hkv, dtype, causal, layout, ps, form, extra = case
    bt = Batch(kind, qo_lens, kv_lens, hq, hkv, dqk, dvo, dtype, layout, *((ps, form) if kind == "paged" else ()))
    w = bt.wrapper()
    bt.plan(w, causal=causal, **extra)
    assert w._num_chunks > 1, "this batch should take split-KV"
    o, lse = w.run(*bt.run_args(), return_lse=True)
    assert o.shape == (sum(qo_lens), hq, dvo) and lse.shape == (sum(qo_lens), hq)
    ref_kw = {"soft_cap": extra.get("logits_soft_cap", 0.0), "window_left": extra.get("window_left", -1),
              "alibi": extra.get("pos_encoding_mode") == "ALIBI"}
    check(o, lse, *bt.ref(causal=causal, **ref_kw))
    assert torch.equal(w.run(*bt.run_args()), o), "return_lse must not change o"
    w1 = bt.wrapper()
    bt.plan(w1, causal=causal, disable_split_kv=True, **extra)
    assert w1._num_chunks == 1
    o1, lse1 = w1.run(*bt.run_args(), return_lse=True)
    check(o1, lse1, *bt.ref(causal=causal, **ref_kw))


INPLACE_CASES = [SPLIT_CASES[1], SPLIT_CASES[2],
                 ("ragged", [300, 17, 900], [300, 400, 900], 128, 128, 32, 8, B, True, "NHD", None, None, {}),
                 ("paged", [128] * 6, [128] * 6, 128, 128, 32, 8, H, False, "NHD", 16, "tuple4", {})]


@gpu
@pytest.mark.parametrize("case", INPLACE_CASES, ids=[_split_id(c) for c in INPLACE_CASES])
def test_out_may_be_q_itself_but_not_overlap_it(case):
    """out = q (in place) matches the reference on split, causal, GQA and many-tile batches; a
    view of q shifted by one row raises before the launch."""
    kind, qo_lens, kv_lens, dqk, dvo, hq, hkv, dtype, causal, layout, ps, form, extra = case
    bt = Batch(kind, qo_lens, kv_lens, hq, hkv, dqk, dvo, dtype, layout, *((ps, form) if kind == "paged" else ()))
    w = bt.wrapper()
    bt.plan(w, causal=causal, **extra)
    ref = bt.ref(causal=causal)
    rest = bt.run_args()[1:]
    buf = torch.empty(bt.q.shape[0] + 1, hq, dqk, dtype=dtype, device=CUDA)
    q = buf[:-1]
    q.copy_(bt.q)
    with pytest.raises(ValueError, match="out must not overlap q"):
        w.run(q, *rest, out=buf[1:])
    o, lse = w.run(q, *rest, out=q, return_lse=True)
    assert o.data_ptr() == q.data_ptr()
    check(o, lse, *ref)


@gpu
@pytest.mark.smoke
def test_batch_prefill_smoke():
    test_paged(PAGED_CASES[1])
    test_ragged(RAGGED_CASES[0])


@gpu
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_all_requests_empty(kind):
    """qo_len 0 everywhere: empty outputs, nothing launched; kv_len 0 with queries: o = 0, lse = -inf."""
    bt = Batch(kind, [0, 0, 0], [5, 0, 17], 8, 2, 128, 128, H)
    w = bt.wrapper()
    bt.plan(w, causal=True, q_data_type=H)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    assert o.shape == (0, 8, 128) and lse.shape == (0, 8)
    bt = Batch(kind, [3, 34], [0, 1], 8, 2, 128, 128, H)  # 34 > 1 causal: 33 rows see no key
    w = bt.wrapper()
    bt.plan(w, causal=True)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    ref_o, ref_lse = bt.ref(causal=True)
    assert torch.equal(o[:36], torch.zeros_like(o[:36])) and bool(torch.isinf(lse[:36]).all())
    check(o, lse, ref_o, ref_lse)


# ==================================================================================================
# GPU: variants
# ==================================================================================================

@gpu
@pytest.mark.parametrize("kind,window,causal,layout", [("paged", 17, True, "NHD"), ("ragged", 3, False, "HND"),
                                                       ("paged", 0, True, "HND"), ("ragged", 100, True, "NHD")])
def test_sliding_window(kind, window, causal, layout):
    qo_lens, kv_lens = LENS[12]
    bt = Batch(kind, qo_lens, kv_lens, 16, 4, 128, 128, B, layout, 5)
    w = bt.wrapper()
    bt.plan(w, causal=causal, window_left=window)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(causal=causal, window_left=window))
    o2 = w.run(*bt.run_args(), window_left=window) if kind == "paged" else o  # the override equal to the plan
    assert torch.equal(o2, o)


@gpu
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_window_equals_explicit_mask(kind):
    qo_lens, kv_lens = LENS[12]
    w_left = 20
    bt = Batch(kind, qo_lens, kv_lens, 8, 2, 128, 128, H)
    w = bt.wrapper()
    bt.plan(w, causal=True, window_left=w_left)
    o_w = w.run(*bt.run_args())
    masks = [torch.ones(qo, kv, dtype=torch.bool, device=CUDA).tril(kv - qo).triu(kv - qo - w_left)
             for qo, kv in zip(qo_lens, kv_lens)]
    bt.plan(w, custom_mask=flat(masks))
    o_m = w.run(*bt.run_args())
    assert (o_w.float() - o_m.float()).abs().max().item() <= 1e-3


@gpu
@pytest.mark.parametrize("kind,cap,causal,dtype", [("paged", 30.0, True, H), ("ragged", 1.0, False, B),
                                                   ("ragged", 50.0, True, B), ("paged", 1.0, False, H)])
def test_soft_cap(kind, cap, causal, dtype):
    qo_lens, kv_lens = LENS[3]
    bt = Batch(kind, qo_lens, kv_lens, 32, 8, 128, 128, dtype)
    bt.q.mul_(4)  # logits large enough for the cap to bend them
    w = bt.wrapper()
    bt.plan(w, causal=causal, logits_soft_cap=cap)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(causal=causal, soft_cap=cap))


@gpu
@pytest.mark.parametrize("kind,causal,hq,hkv", [("paged", True, 28, 4), ("ragged", False, 32, 8),
                                                ("ragged", True, 12, 4)])
def test_alibi(kind, causal, hq, hkv):
    qo_lens, kv_lens = LENS[12]
    bt = Batch(kind, qo_lens, kv_lens, hq, hkv, 128, 128, H, "HND", 16)
    w = bt.wrapper()
    bt.plan(w, causal=causal, pos_encoding_mode="ALIBI")
    o, lse = w.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(causal=causal, alibi=True))


@gpu
@pytest.mark.parametrize("kind,layout,ps,batch", [("paged", "NHD", 5, 12), ("ragged", "HND", 1, 12),
                                                  ("paged", "HND", 1, 3), ("ragged", "NHD", 1, 1)])
def test_custom_mask(kind, layout, ps, batch):
    """custom_mask (flat bool, packed here) and packed_custom_mask (byte-aligned segments) agree
    with the reference and with each other; causal is ignored with a mask; the packed mask wins."""
    qo_lens, kv_lens = LENS[batch]
    bt = Batch(kind, qo_lens, kv_lens, 28, 4, 128, 128, B, layout, ps, "tuple4")
    masks = bt.random_masks()
    w = bt.wrapper()
    bt.plan(w, custom_mask=flat(masks), causal=True)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(masks=masks))
    everything = torch.ones(sum(q * k for q, k in zip(qo_lens, kv_lens)), dtype=torch.bool, device=CUDA)
    bt.plan(w, custom_mask=everything, packed_custom_mask=pack_segments(masks).to(CUDA))
    o_p, lse_p = w.run(*bt.run_args(), return_lse=True)
    assert torch.equal(o_p, o) and torch.equal(lse_p, lse)
    bt.plan(w, packed_custom_mask=pack_segments(masks))  # a CPU packed mask is copied to the device
    assert torch.equal(w.run(*bt.run_args()), o)


@gpu
@pytest.mark.parametrize("kind,extra", [("ragged", {"pos_encoding_mode": "ALIBI"}),
                                        ("ragged", {"logits_soft_cap": 30.0}), ("paged", {}),
                                        ("paged", {"window_left": 40})])
def test_causal_mask_equals_causal(kind, extra):
    """Spec 1.6: the bottom-right causal mask given explicitly equals causal=True (with ALiBi, soft cap)."""
    qo_lens, kv_lens = LENS[12]
    bt = Batch(kind, qo_lens, kv_lens, 16, 4, 128, 128, B, "NHD", 16)
    w = bt.wrapper()
    bt.plan(w, causal=True, **extra)
    o_c, lse_c = w.run(*bt.run_args(), return_lse=True)
    bt.plan(w, custom_mask=flat(bt.causal_masks()), **extra)
    o_m, lse_m = w.run(*bt.run_args(), return_lse=True)
    assert (o_c.float() - o_m.float()).abs().max().item() <= 1e-3
    assert torch.equal(torch.isinf(lse_c), torch.isinf(lse_m))
    fin = ~torch.isinf(lse_c)
    assert (lse_c[fin] - lse_m[fin]).abs().max().item() <= 1e-3


@gpu
@pytest.mark.parametrize("layout,dtype,scale,theta,causal", [("NHD", H, None, None, True), ("HND", B, 2.0, 5e5, False),
                                                             ("HND", H, None, None, True)])
def test_ragged_rope(layout, dtype, scale, theta, causal):
    """ROPE_LLAMA: query row i of request b at position i + kv_len_b - qo_len_b (negative when
    qo_len > kv_len), key j at j; the inputs are not modified."""
    qo_lens, kv_lens = LENS[12]
    bt = Batch("ragged", qo_lens, kv_lens, 16, 4, 128, 128, dtype, layout)
    q0, k0 = bt.q.clone(), bt.k.clone()
    w = bt.wrapper()
    bt.plan(w, causal=causal, pos_encoding_mode="ROPE_LLAMA", rope_scale=scale, rope_theta=theta)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    assert torch.equal(bt.q, q0) and torch.equal(bt.k, k0), "RoPE must not modify the inputs"
    check(o, lse, *bt.ref(causal=causal, rope=True, rope_scale=scale or 1.0, rope_theta=theta or 1e4))
    with pytest.raises(AssertionError):  # the test's sanity: RoPE changes the result
        check(o, lse, *bt.ref(causal=causal))


# (layout, page_size, cache form, q dtype, rope_scale, rope_theta, causal)
PAGED_ROPE_CASES = [("NHD", 16, "tuple4", H, None, None, True), ("HND", 5, "5d", B, 2.0, 5e5, False),
                    ("NHD", 1, "4d", H, None, None, False), ("HND", 1, "tuple3", B, 8.0, 1e4, True)]


@gpu
@pytest.mark.parametrize("layout,ps,form,dtype,scale,theta,causal", PAGED_ROPE_CASES)
def test_paged_rope(layout, ps, form, dtype, scale, theta, causal):
    """Paged ROPE_LLAMA (spec 1.6): the keys gathered out of the pages, then rotated as in the
    ragged wrapper (query row i of request b at i + kv_len_b - qo_len_b, key j at j); the cache
    is not modified."""
    qo_lens, kv_lens = LENS[12]
    bt = Batch("paged", qo_lens, kv_lens, 16, 4, 128, 128, dtype, layout, ps, form)
    cache0 = [c.clone() for c in (bt.cache if isinstance(bt.cache, tuple) else (bt.cache,))]
    w = bt.wrapper()
    bt.plan(w, causal=causal, pos_encoding_mode="ROPE_LLAMA", rope_scale=scale, rope_theta=theta)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    assert all(torch.equal(a, b) for a, b in zip(cache0, bt.cache if isinstance(bt.cache, tuple) else (bt.cache,)))
    check(o, lse, *bt.ref(causal=causal, rope=True, rope_scale=scale or 1.0, rope_theta=theta or 1e4))
    with pytest.raises(AssertionError):  # the test's sanity: RoPE changes the result
        check(o, lse, *bt.ref(causal=causal))


@gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_paged_rope_v_cache_must_match_k_before_the_gather(layout):
    """The RoPE (and fp8) path gathers v out of the pages in Python: a v_cache with fewer pages,
    another page size or other heads than k raises naming it, before any gather reads it."""
    bt = Batch("paged", [5, 9], [40, 60], 8, 2, 128, 128, H, layout, 16)
    k4, v4 = bt.cache
    w = bt.wrapper()
    bt.plan(w, pos_encoding_mode="ROPE_LLAMA")
    pn = 1 if layout == "NHD" else 2
    for bad in (v4[:-1], v4.narrow(pn, 0, 8), v4[:, :, :1] if layout == "NHD" else v4[:, :1]):
        with pytest.raises(ValueError, match=r"paged_kv_cache\[1\] \(v\) must have k's pages, page size and heads"):
            w.run(bt.q, (k4, bad))
    check(*w.run(bt.q, (k4, v4), return_lse=True), *bt.ref(rope=True))


@gpu
def test_paged_rope_forward_and_replan():
    """The deprecated forward switches a NONE plan to ROPE_LLAMA (and back); a re-plan with other
    lengths rebuilds the gather's index."""
    bt = Batch("paged", *LENS[3], 8, 2, 128, 128, H, "NHD", 5)
    w = bt.wrapper()
    bt.plan(w, causal=True)
    o, lse = w.forward_return_lse(*bt.run_args(), causal=True, pos_encoding_mode="ROPE_LLAMA")
    check(o, lse, *bt.ref(causal=True, rope=True))
    o, lse = w.forward_return_lse(*bt.run_args(), causal=True)
    check(o, lse, *bt.ref(causal=True))
    b2 = Batch("paged", *LENS[12], 8, 2, 128, 128, H, "NHD", 5)
    b2.plan(w, causal=True, pos_encoding_mode="ROPE_LLAMA")
    o, lse = w.run(*b2.run_args(), return_lse=True)
    check(o, lse, *b2.ref(causal=True, rope=True))


# (fp8 dtype, q dtype, layout, page_size, cache form, causal)
PAGED_FP8_CASES = [
    ("float8_e4m3fn", H, "NHD", 16, "tuple4", True),
    ("float8_e5m2", B, "HND", 16, "5d", False),
    ("float8_e4m3fn", B, "HND", 5, "tuple4", False),
    ("float8_e5m2", H, "NHD", 5, "5d", True),
    ("float8_e4m3fn", H, "HND", 1, "tuple3", True),
    ("float8_e5m2", B, "NHD", 1, "4d", False),
]


@gpu
@pytest.mark.parametrize("fp8,dtype,layout,ps,form,causal", PAGED_FP8_CASES)
def test_paged_fp8(fp8, dtype, layout, ps, form, causal):
    """fp8 cache (spec 8.3 / 1.6): against the float64 reference on the dequantized (plain cast)
    values, k_scale folded into sm_scale, v_scale into o (not the LSE); q_scale multiplies
    sm_scale."""
    qo_lens, kv_lens = LENS[12]
    bt = Batch("paged", qo_lens, kv_lens, 28, 4, 128, 128, dtype, layout, ps, form)
    ks, vs = bt.quantize(getattr(torch, fp8))
    w = bt.wrapper()
    bt.plan(w, causal=causal, kv_data_type=getattr(torch, fp8))
    o, lse = w.run(*bt.run_args(), k_scale=ks, v_scale=vs, return_lse=True)
    assert o.dtype == dtype
    check(o, lse, *bt.ref(causal=causal, sm_scale=ks / math.sqrt(128), v_scale=vs))
    o2 = w.run(*bt.run_args(), q_scale=0.5, k_scale=ks, v_scale=vs)
    check(o2, None, *bt.ref(causal=causal, sm_scale=0.5 * ks / math.sqrt(128), v_scale=vs))


@gpu
@pytest.mark.parametrize("fp8,dtype,layout,causal", [("float8_e4m3fn", B, "NHD", True),
                                                     ("float8_e5m2", H, "HND", False), ("float8_e5m2", B, "NHD", True)])
def test_ragged_fp8(fp8, dtype, layout, causal):
    """Ragged fp8 K / V against the reference on the dequantized values: k_scale / q_scale
    multiply sm_scale, v_scale o (with fp8 K / V the scales apply, FlashInfer 0.7.2)."""
    qo_lens, kv_lens = LENS[12]
    bt = Batch("ragged", qo_lens, kv_lens, 32, 8, 128, 128, dtype, layout)
    ks, vs = bt.quantize(getattr(torch, fp8))
    w = bt.wrapper()
    bt.plan(w, causal=causal, kv_data_type=fp8)
    o, lse = w.run(*bt.run_args(), q_scale=2.0, k_scale=ks, v_scale=vs, return_lse=True)
    check(o, lse, *bt.ref(causal=causal, sm_scale=2.0 * ks / math.sqrt(128), v_scale=vs))


@gpu
@pytest.mark.parametrize("fp8,layout,ps", [("float8_e4m3fn", "HND", 16), ("float8_e5m2", "NHD", 5)])
def test_paged_fp8_rope(fp8, layout, ps):
    """fp8 cache with ROPE_LLAMA: cast, then rotate (the rotated keys rounded to q's dtype)."""
    bt = Batch("paged", *LENS[12], 16, 4, 128, 128, B, layout, ps)
    ks, vs = bt.quantize(getattr(torch, fp8))
    w = bt.wrapper()
    bt.plan(w, causal=True, kv_data_type=fp8, pos_encoding_mode="ROPE_LLAMA")
    o, lse = w.run(*bt.run_args(), k_scale=ks, v_scale=vs, return_lse=True)
    check(o, lse, *bt.ref(causal=True, rope=True, sm_scale=ks / math.sqrt(128), v_scale=vs))


@gpu
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_fp8_and_rope_checks(kind):
    _fp8_and_rope_checks(kind, CUDA)


def _fp8_and_rope_checks(kind, dev):
    """The cache / k / v dtype must be the planned kv_data_type (ValueError); fp8 q is
    NotImplementedError; under CUDA graphs the paged wrapper rejects fp8 caches and ROPE_LLAMA at
    plan and in forward (NotImplementedError), the ragged one takes fp8 K / V."""
    bt = Batch(kind, *LENS[3], 4, 2, 64, 64, H, "NHD", 16, dev=dev)
    args16 = bt.run_args()
    bt.quantize(torch.float8_e4m3fn)
    w = bt.wrapper(dev=dev)
    bt.plan(w, kv_data_type=torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="does not match the kv_data_type torch.float8_e4m3fn"):
        w.run(*args16)
    e5 = (tuple(x.to(torch.float8_e5m2) for x in args16[1]),) if kind == "paged" else tuple(
        x.to(torch.float8_e5m2) for x in args16[1:])
    with pytest.raises(ValueError, match="does not match the kv_data_type"):
        w.run(bt.q, *e5)
    bt.plan(w)
    with pytest.raises(ValueError, match="does not match the kv_data_type torch.float16"):
        w.run(*bt.run_args())
    with pytest.raises(NotImplementedError, match="fp8 q"):
        bt.plan(w, q_data_type="float8_e4m3fn", kv_data_type="float8_e4m3fn")
    with pytest.raises(NotImplementedError, match="kv_data_type must equal q_data_type"):
        bt.plan(w, kv_data_type=torch.bfloat16)
    bufs = [torch.zeros(n, dtype=torch.int32, device=dev) for n in (4, 4, 64, 3)]
    if kind == "paged":
        wg = Paged(workspace(dev), "NHD", True, *bufs)
        with pytest.raises(NotImplementedError, match="fp8 paged cache.*CUDA graphs"):
            bt.plan(wg, kv_data_type=torch.float8_e4m3fn)
        with pytest.raises(NotImplementedError, match="ROPE_LLAMA.*CUDA graphs"):
            bt.plan(wg, pos_encoding_mode="ROPE_LLAMA")
        bt.plan(wg, causal=True)
        with pytest.raises(NotImplementedError, match="ROPE_LLAMA.*CUDA graphs"):
            wg.forward(*args16, causal=True, pos_encoding_mode="ROPE_LLAMA")
    else:
        wg = Ragged(workspace(dev), "NHD", True, *bufs[:2])
        bt.plan(wg, causal=True, kv_data_type=torch.float8_e4m3fn)
        ks, vs = 0.5, 2.0
        check(wg.run(*bt.run_args(), k_scale=ks, v_scale=vs), None, *bt.ref(causal=True, sm_scale=ks / 8, v_scale=vs))


@gpu
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_lse_base_layout_and_preallocated_outputs(kind):
    qo_lens, kv_lens = LENS[12]
    bt = Batch(kind, qo_lens, kv_lens, 16, 4, 128, 128, B)
    n = sum(qo_lens)
    w = bt.wrapper()
    bt.plan(w, causal=True)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(causal=True))
    # ln / HN
    o_ln, lse_ln = w.run(*bt.run_args(), return_lse=True, lse_base="ln")
    assert torch.equal(o_ln, o) and torch.allclose(lse_ln, lse * math.log(2.0), rtol=1e-6, atol=0)
    _, lse_hn = w.run(*bt.run_args(), return_lse=True, lse_layout="HN")
    assert lse_hn.shape == (16, n) and lse_hn.is_contiguous() and torch.equal(lse_hn, lse.t())
    _, lse_hn_ln = w.run(*bt.run_args(), return_lse=True, lse_layout="HN", lse_base="ln")
    assert torch.allclose(lse_hn_ln, lse.t() * math.log(2.0), rtol=1e-6, atol=0)
    # preallocated: the same objects come back
    out = torch.empty_like(o)
    lse_buf = torch.empty(n, 16, dtype=torch.float32, device=CUDA)
    o2, lse2 = w.run(*bt.run_args(), out=out, lse=lse_buf, return_lse=True)
    assert o2 is out and lse2 is lse_buf and torch.equal(out, o) and torch.equal(lse_buf, lse)
    # lse= without return_lse: written, only o returned
    lse_buf.fill_(7.0)
    out.fill_(7.0)
    o3 = w.run(*bt.run_args(), out=out, lse=lse_buf)
    assert o3 is out and torch.equal(out, o) and torch.equal(lse_buf, lse)
    # HN and ln into given buffers; a non-contiguous NH buffer
    hn = torch.empty(16, n, dtype=torch.float32, device=CUDA)
    _, r = w.run(*bt.run_args(), lse=hn, return_lse=True, lse_layout="HN", lse_base="ln")
    assert r is hn and torch.allclose(hn, lse.t() * math.log(2.0), rtol=1e-6, atol=0)
    nh_view = torch.empty(16, n, dtype=torch.float32, device=CUDA).t()
    _, r = w.run(*bt.run_args(), lse=nh_view, return_lse=True)
    assert r is nh_view and torch.equal(nh_view, lse)
    nh = torch.empty(n, 16, dtype=torch.float32, device=CUDA)
    w.run(*bt.run_args(), lse=nh, lse_base="ln")
    assert torch.allclose(nh, lse * math.log(2.0), rtol=1e-6, atol=0)


@gpu
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_output_checks(kind):
    qo_lens, kv_lens = LENS[3]
    bt = Batch(kind, qo_lens, kv_lens, 8, 2, 128, 128, H)
    n = sum(qo_lens)
    w = bt.wrapper()
    bt.plan(w)
    with pytest.raises(ValueError, match="Invalid shape of out"):
        w.run(*bt.run_args(), out=torch.empty(n, 8, 64, dtype=H, device=CUDA))
    with pytest.raises(ValueError, match="dtype of out"):
        w.run(*bt.run_args(), out=torch.empty(n, 8, 128, dtype=B, device=CUDA))
    with pytest.raises(ValueError, match="Invalid shape of lse"):
        w.run(*bt.run_args(), lse=torch.empty(n, 9, dtype=torch.float32, device=CUDA))
    with pytest.raises(ValueError, match="Invalid shape of lse"):
        w.run(*bt.run_args(), lse=torch.empty(n, 8, dtype=torch.float32, device=CUDA), lse_layout="HN")
    with pytest.raises(ValueError, match="dtype of lse"):
        w.run(*bt.run_args(), lse=torch.empty(n, 8, dtype=torch.float64, device=CUDA))
    with pytest.raises(ValueError, match="lse_base"):
        w.run(*bt.run_args(), return_lse=True, lse_base="log10")
    with pytest.raises(ValueError, match="lse_layout"):
        w.run(*bt.run_args(), return_lse=True, lse_layout="NHD")


@gpu
@pytest.mark.parametrize("kind", ["ragged", "paged"])
@pytest.mark.parametrize("extra", [{}, {"window_left": 20, "logits_soft_cap": 30.0}, {"pos_encoding_mode": "ALIBI"},
                                   {"pos_encoding_mode": "ROPE_LLAMA"}, {"causal": False}],
                         ids=["causal", "window-softcap", "alibi", "rope", "full"])
def test_batch_equals_single(kind, extra):
    """Each request of a batch against single_prefill_with_kv_cache on its own keys."""
    qo_lens, kv_lens = [127, 37, 17, 0, 64], [512, 97, 54, 9, 0]
    bt = Batch(kind, qo_lens, kv_lens, 28, 4, 128, 128, H, "NHD", 16)
    kw = {"causal": True, **extra}
    w = bt.wrapper()
    bt.plan(w, **kw)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    for b, (qa, qb) in enumerate(zip(bt.qo_indptr[:-1], bt.qo_indptr[1:])):
        k, v = bt.kv[b]
        o_s, lse_s = flashinfer.single_prefill_with_kv_cache(bt.q[qa:qb], k.contiguous(), v.contiguous(),
                                                             return_lse=True, **kw)
        assert torch.allclose(o[qa:qb].float(), o_s.float(), rtol=1e-3, atol=1e-3), f"request {b}"
        assert torch.equal(torch.isinf(lse[qa:qb]), torch.isinf(lse_s))
        fin = ~torch.isinf(lse_s)
        assert torch.allclose(lse[qa:qb][fin], lse_s[fin], rtol=1e-3, atol=1e-3), f"request {b}"


@gpu
@pytest.mark.parametrize("kind", ["paged", "ragged"])
@pytest.mark.parametrize("opt", [{"fixed_split_size": 2048}, {"disable_split_kv": True}])
def test_batch_invariance(kind, opt):
    """With fixed_split_size / disable_split_kv a request's output and LSE are bitwise the same
    whatever else is in the batch (here: alone, and beside seven long requests whose grid would
    otherwise pick the two-M-tile kernel)."""
    x_qo, x_kv = 300, 700
    big = Batch(kind, [x_qo] + [1024] * 7, [x_kv] + [1024] * 7, 32, 8, 128, 128, B, "NHD", 16)
    w = big.wrapper()
    big.plan(w, causal=True, **opt)
    o, lse = w.run(*big.run_args(), return_lse=True)
    alone = Batch(kind, [x_qo], [x_kv], 32, 8, 128, 128, B, "NHD", 16)
    alone.q.copy_(big.q[:x_qo])
    if kind == "ragged":
        alone.k.copy_(big.k[:x_kv])
        alone.v.copy_(big.v[:x_kv])
    else:  # the same keys in the other cache's pages
        k, v = big.kv[0]
        pages = alone.table.indices.long()
        for i in range(x_kv):
            p, s = int(pages[i // 16]), i % 16
            alone.k4[p, s] = k[i]
            alone.v4[p, s] = v[i]
    w2 = alone.wrapper()
    alone.plan(w2, causal=True, **opt)
    o2, lse2 = w2.run(*alone.run_args(), return_lse=True)
    assert torch.equal(o[:x_qo], o2) and torch.equal(lse[:x_qo], lse2)


@gpu
def test_two_m_tile_kernel():
    """A grid of >= 2 CTAs per SM of 128 packed rows takes the kernel with two M tiles per warp."""
    qo_lens, kv_lens = [1024] * 4, [1024, 1500, 1024, 2000]
    for kind, layout in (("paged", "NHD"), ("ragged", "HND")):
        bt = Batch(kind, qo_lens, kv_lens, 32, 8, 128, 128, B, layout, 16)
        w = bt.wrapper()
        bt.plan(w, causal=True)
        assert w._m_tiles == 2, "the batch should select the two-M-tile kernel"
        o, lse = w.run(*bt.run_args(), return_lse=True)
        check(o, lse, *bt.ref(causal=True))


@gpu
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_cuda_graph_replan_and_replay(kind):
    """Plan, capture run in a CUDA graph, re-plan with new lengths and page tables (same batch
    size and totals, inside the fixed buffers), replay: the new plan's results."""
    batch, hq, hkv, d, ps, dtype = 4, 32, 8, 128, 16, B
    plans = [([37, 17, 127, 1], [97, 54, 512, 1]), ([1, 127, 17, 37], [512, 1, 54, 97]),
             ([0, 100, 90, 1], [0, 300, 81, 283])]  # totals 182 / 664, then 191 rows: too many
    dev = CUDA
    qo_buf = torch.empty(batch + 1, dtype=torch.int32, device=dev)
    kv_buf = torch.empty(batch + 1, dtype=torch.int32, device=dev)
    if kind == "paged":
        idx_buf = torch.empty(256, dtype=torch.int32, device=dev)
        last_buf = torch.empty(batch, dtype=torch.int32, device=dev)
        w = Paged(workspace(), "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf, paged_kv_indptr_buf=kv_buf,
                  paged_kv_indices_buf=idx_buf, paged_kv_last_page_len_buf=last_buf)
        assert w._paged_kv_indices_buf is idx_buf and w._fixed_batch_size == batch
    else:
        w = Ragged(workspace(), "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf, kv_indptr_buf=kv_buf)
    assert w.is_cuda_graph_enabled
    batches = [Batch(kind, qo, kv, hq, hkv, d, d, dtype, "NHD", ps, spare_pages=40) for qo, kv in plans]
    first = batches[0]
    q = first.q.clone()
    if kind == "paged":  # one cache holding every plan's pages (each plan's table indexes its own copy)
        P = max(bt.k4.shape[0] for bt in batches)
        k_cache = torch.zeros(P, ps, hkv, d, dtype=dtype, device=dev)
        v_cache = torch.zeros_like(k_cache)
        kv_args = ((k_cache, v_cache),)
    else:
        k_all = first.k.clone()
        v_all = first.v.clone()
        kv_args = (k_all, v_all)

    def load(bt):
        q.copy_(bt.q)
        if kind == "paged":
            k_cache.zero_()
            v_cache.zero_()
            n = bt.k4.shape[0]
            k_cache[:n].copy_(bt.k4)
            v_cache[:n].copy_(bt.v4)
        else:
            k_all.copy_(bt.k)
            v_all.copy_(bt.v)
        bt.plan(w, causal=True)

    load(first)
    out = torch.empty(q.shape[0], hq, d, dtype=dtype, device=dev)
    lse = torch.empty(q.shape[0], hq, dtype=torch.float32, device=dev)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w.run(q, *kv_args, out=out, lse=lse)  # warm-up outside capture
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.run(q, *kv_args, out=out, lse=lse)
    for bt in batches[:2]:
        load(bt)
        out.fill_(float("nan"))
        g.replay()
        torch.cuda.synchronize()
        check(out, lse, *bt.ref(causal=True), f" ({bt.qo_lens})")
        eager, eager_lse = w.run(q, *kv_args, return_lse=True)
        assert torch.equal(eager, out) and torch.equal(eager_lse, lse)
    with pytest.raises(ValueError, match="cannot exceed"):  # the first plan fixed the most rows
        batches[2].plan(w, causal=True)
    with pytest.raises(ValueError, match="batch size"):
        w.plan(*Batch(kind, [1] * 3, [1] * 3, hq, hkv, d, d, dtype).plan_args(), causal=True, q_data_type=dtype)


@gpu
def test_cuda_graph_custom_mask():
    batch, hq, hkv, d, dtype = 3, 16, 4, 128, H
    plans = [([37, 17, 127], [97, 54, 512]), ([127, 37, 17], [512, 97, 54])]
    qo_buf = torch.empty(batch + 1, dtype=torch.int32, device=CUDA)
    kv_buf = torch.empty(batch + 1, dtype=torch.int32, device=CUDA)
    mask_buf = torch.empty(20000, dtype=torch.uint8, device=CUDA)
    mask_indptr_buf = torch.empty(batch + 1, dtype=torch.int32, device=CUDA)
    w = Ragged(workspace(), "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf, kv_indptr_buf=kv_buf,
               custom_mask_buf=mask_buf, mask_indptr_buf=mask_indptr_buf)
    bts = [Batch("ragged", qo, kv, hq, hkv, d, d, dtype) for qo, kv in plans]
    masks = [bt.random_masks() for bt in bts]
    q, k, v = bts[0].q.clone(), bts[0].k.clone(), bts[0].v.clone()
    bts[0].plan(w, custom_mask=flat(masks[0]))
    out = torch.empty(q.shape[0], hq, d, dtype=dtype, device=CUDA)
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        w.run(q, k, v, out=out)
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        w.run(q, k, v, out=out)
    for bt, m in zip(bts, masks):
        q.copy_(bt.q)
        k.copy_(bt.k)
        v.copy_(bt.v)
        bt.plan(w, custom_mask=flat(m))
        g.replay()
        torch.cuda.synchronize()
        ref_o, ref_lse = bt.ref(masks=m)
        assert_prefill_close(out, ref_o, empty_rows=torch.isinf(ref_lse))
    w2 = Ragged(workspace(), "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf, kv_indptr_buf=kv_buf)
    with pytest.raises(ValueError, match="custom_mask_buf"):
        bts[0].plan(w2, custom_mask=flat(masks[0]))


@gpu
def test_cuda_graph_ragged_plan_refuses_more_keys_than_the_captured_k():
    """A replay skips run()'s checks: after a capture on k / v of 100 rows, a plan of 101 keys
    raises (naming both) and leaves the last plan in place."""
    hq, hkv, d, dtype = 8, 2, 128, H
    qo_buf = torch.empty(3, dtype=torch.int32, device=CUDA)
    kv_buf = torch.empty(3, dtype=torch.int32, device=CUDA)
    w = Ragged(workspace(), "NHD", use_cuda_graph=True, qo_indptr_buf=qo_buf, kv_indptr_buf=kv_buf)
    bt = Batch("ragged", [5, 9], [40, 60], hq, hkv, d, d, dtype)
    bt.plan(w)
    out = torch.empty(bt.q.shape[0], hq, d, dtype=dtype, device=CUDA)
    g = capture_graph(lambda: w.run(bt.q, bt.k, bt.v, out=out))
    with pytest.raises(ValueError, match=r"kv_indptr\[-1\] is 101, but a CUDA graph captured run\(\) on k / v of 100 "
                                         r"rows"):
        Batch("ragged", [5, 9], [40, 61], hq, hkv, d, d, dtype).plan(w)
    out.fill_(float("nan"))
    g.replay()
    torch.cuda.synchronize()
    ref_o, ref_lse = bt.ref()
    assert_prefill_close(out, ref_o, empty_rows=torch.isinf(ref_lse))


@gpu
def test_nan_and_inf_scales_are_refused():
    bt = Batch("ragged", [5, 9], [40, 60], 8, 2, 128, 128, H)
    w = bt.wrapper()
    for bad in (float("nan"), float("inf")):
        with pytest.raises(ValueError, match="plan: sm_scale must be a finite number"):
            bt.plan(w, sm_scale=bad)
        with pytest.raises(ValueError, match="single_prefill_with_kv_cache: sm_scale must be a finite number"):
            flashinfer.single_prefill_with_kv_cache(bt.q[:5], bt.k[:40], bt.v[:40], sm_scale=bad)
    pb = Batch("paged", [5, 9], [40, 60], 8, 2, 128, 128, H)
    wp = pb.wrapper()
    pb.plan(wp)
    for name in ("q_scale", "k_scale", "v_scale"):
        with pytest.raises(ValueError, match=f"run: {name} must be a finite number"):
            wp.run(pb.q, pb.cache, **{name: float("nan")})
    check(*wp.run(pb.q, pb.cache, return_lse=True), *pb.ref())


@gpu
def test_seq_lens_override():
    """seq_lens replaces the page table's lengths (each request reads its first seq_lens[b] keys)."""
    qo_lens, kv_lens = [17, 37, 5], [97, 54, 40]
    bt = Batch("paged", qo_lens, kv_lens, 16, 4, 128, 128, B, "HND", 16)
    seq = [80, 54, 3]
    w = bt.wrapper()
    bt.plan(w, causal=True, seq_lens=torch.tensor(seq, dtype=torch.int32))
    o, lse = w.run(*bt.run_args(), return_lse=True)
    full = bt.kv
    bt.kv = [(k[:s], v[:s]) for (k, v), s in zip(full, seq)]
    check(o, lse, *bt.ref(causal=True))
    with pytest.raises(ValueError, match="seq_lens"):
        bt.plan(w, seq_lens=torch.tensor([97, 65, 3], dtype=torch.int32))  # request 1 has 4 pages of 16


@gpu
@pytest.mark.parametrize("kind,q_dtype,o_dtype", [("paged", H, B), ("ragged", B, H), ("ragged", H, "bfloat16")])
def test_o_data_type(kind, q_dtype, o_dtype):
    qo_lens, kv_lens = LENS[3]
    bt = Batch(kind, qo_lens, kv_lens, 8, 2, 128, 128, q_dtype)
    w = bt.wrapper()
    bt.plan(w, causal=True)
    same = w.run(*bt.run_args())
    bt.plan(w, causal=True, o_data_type=o_dtype)
    want = {"bfloat16": B}.get(o_dtype, o_dtype)
    o = w.run(*bt.run_args())
    assert o.dtype == want and torch.equal(o, same.to(want))
    out = torch.empty(o.shape, dtype=want, device=CUDA)
    assert w.run(*bt.run_args(), out=out) is out and torch.equal(out, o)
    with pytest.raises(ValueError, match="dtype of out"):
        w.run(*bt.run_args(), out=torch.empty(o.shape, dtype=q_dtype, device=CUDA))


@gpu
def test_scales():
    """Paged: q_scale and k_scale multiply sm_scale, v_scale the output (not the LSE). Ragged (as
    FlashInfer 0.7.2): the scales apply to fp8 K / V only, and are ignored for 16-bit K / V."""
    qo_lens, kv_lens = LENS[3]
    bt = Batch("paged", qo_lens, kv_lens, 16, 4, 128, 128, B)
    w = bt.wrapper()
    bt.plan(w, causal=True, sm_scale=0.05)
    o, lse = w.run(*bt.run_args(), q_scale=0.5, k_scale=3.0, v_scale=0.25, return_lse=True)
    check(o, lse, *bt.ref(causal=True, sm_scale=0.05 * 1.5, v_scale=0.25))
    rb = Batch("ragged", qo_lens, kv_lens, 16, 4, 128, 128, B)
    wr = rb.wrapper()
    rb.plan(wr, causal=True)
    assert torch.equal(wr.run(*rb.run_args(), k_scale=2.0, v_scale=0.5, q_scale=3.0), wr.run(*rb.run_args()))
    with pytest.raises(NotImplementedError, match="o_scale"):
        wr.run(*rb.run_args(), o_scale=2.0)


@gpu
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_deprecated_entry_points(kind):
    qo_lens, kv_lens = LENS[3]
    bt = Batch(kind, qo_lens, kv_lens, 16, 4, 128, 128, H)
    w = bt.wrapper()
    cls = type(w)
    assert cls.begin_forward is cls.plan
    w.begin_forward(*bt.plan_args(), causal=True, q_data_type=H)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    o2, lse2 = w.run_return_lse(*bt.run_args())
    assert torch.equal(o, o2) and torch.equal(lse, lse2)
    # forward's options replace the planned ones (FlashInfer sets them as attributes)
    o_f = w.forward(*bt.run_args(), causal=False, sm_scale=0.1)
    check(o_f, None, *bt.ref(causal=False, sm_scale=0.1))
    o_fl, lse_fl = w.forward_return_lse(*bt.run_args(), causal=True, logits_soft_cap=30.0)
    check(o_fl, lse_fl, *bt.ref(causal=True, soft_cap=30.0))
    assert w._causal is True and w._logits_soft_cap == 30.0
    w.end_forward()


@gpu
def test_strided_views():
    """q / k / v as views of one packed QKV buffer (ragged), and a paged (k, v) tuple whose tensors
    have different strides (views of wider buffers)."""
    lens = [37, 127, 17]
    hq, hkv, d = 28, 4, 128
    n = sum(lens)
    qkv = torch.randn(n, hq + 2 * hkv, d, dtype=B, device=CUDA)
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    ip = torch.tensor(indptr_of(lens), dtype=torch.int32, device=CUDA)
    w = Ragged(workspace())
    w.plan(ip, ip, hq, hkv, d, causal=True, q_data_type=B)
    o, lse = w.run(q, k, v, return_lse=True)
    refs = [prefill_ref(q[a:b], k[a:b], v[a:b], causal=True) for a, b in zip(ip[:-1].tolist(), ip[1:].tolist())]
    check(o, lse, torch.cat([r[0] for r in refs]), torch.cat([r[1] for r in refs]))
    for pos in ("ROPE_LLAMA",):
        w.plan(ip, ip, hq, hkv, d, causal=True, q_data_type=B, pos_encoding_mode=pos)
        o, lse = w.run(q, k, v, return_lse=True)
        refs = [prefill_ref(q[a:b], k[a:b], v[a:b], causal=True, rope=True, rope_dtype=B)
                for a, b in zip(ip[:-1].tolist(), ip[1:].tolist())]
        check(o, lse, torch.cat([r[0] for r in refs]), torch.cat([r[1] for r in refs]))
    bt = Batch("paged", [17, 37], [97, 54], hq, hkv, d, d, B, "HND", 16)
    kb = torch.zeros(bt.k4.shape[:-1] + (2 * d,), dtype=B, device=CUDA)
    vb = torch.zeros(bt.v4.shape[:-1] + (3 * d,), dtype=B, device=CUDA)
    kb[..., d:].copy_(bt.k4)
    vb[..., :d].copy_(bt.v4)
    bt.cache = (kb[..., d:], vb[..., :d])
    wp = bt.wrapper()
    bt.plan(wp, causal=True)
    o, lse = wp.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(causal=True))


@gpu
def test_cupy_arrays():
    cupy = pytest.importorskip("cupy")
    qo_lens, kv_lens = LENS[3]
    bt = Batch("ragged", qo_lens, kv_lens, 16, 4, 128, 128, H, "HND")
    w = bt.wrapper()
    bt.plan(w, causal=True)
    want_o, want_lse = w.run(*bt.run_args(), return_lse=True)
    torch.cuda.synchronize()
    qc, kc, vc = (cupy.from_dlpack(t) for t in bt.run_args())
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        o, lse = w.run(qc, kc, vc, return_lse=True)
    stream.synchronize()
    assert isinstance(o, cupy.ndarray) and isinstance(lse, cupy.ndarray)
    assert torch.equal(torch.from_dlpack(o), want_o) and torch.equal(torch.from_dlpack(lse), want_lse)


# ==================================================================================================
# GPU: argument checks of plan / run (they need a CUDA workspace; no kernel runs)
# ==================================================================================================

@gpu
def test_plan_checks_paged():
    bt = Batch("paged", [17, 37], [97, 54], 8, 2, 128, 128, H)
    w = bt.wrapper()
    qo, ip, ind, last, hq, hkv, d, ps, dvo = bt.plan_args()
    with pytest.raises(ValueError, match="should be the same"):
        w.plan(qo[:2], ip, ind, last, hq, hkv, d, ps)
    with pytest.raises(ValueError, match="head_dim"):
        w.plan(qo, ip, ind, last, hq, hkv, 96, ps)
    with pytest.raises(ValueError, match="head_dim"):
        w.plan(qo, ip, ind, last, hq, hkv, 128, ps, 64)
    with pytest.raises(ValueError, match="multiple of num_kv_heads"):
        w.plan(qo, ip, ind, last, 8, 3, d, ps)
    with pytest.raises(ValueError, match="last_page_len"):
        w.plan(qo, ip, ind, last + 100, hq, hkv, d, ps)
    with pytest.raises(ValueError, match="nondecreasing"):
        w.plan(torch.tensor([0, 20, 10], dtype=torch.int32), ip, ind, last, hq, hkv, d, ps)
    for arg in ("prefix_len_ptr", "token_pos_in_items_ptr", "max_item_len_ptr"):
        with pytest.raises(NotImplementedError, match="multi-item"):
            w.plan(*bt.plan_args(), **{arg: torch.zeros(2, dtype=torch.int32, device=CUDA)})
    with pytest.raises(NotImplementedError, match="multi-item"):
        w.plan(*bt.plan_args(), token_pos_in_items_len=4)
    with pytest.raises(NotImplementedError, match="kv_data_type"):
        w.plan(*bt.plan_args(), kv_data_type=torch.bfloat16)  # (q float16)
    with pytest.raises(KeyError):
        w.plan(*bt.plan_args(), pos_encoding_mode="ROPE")
    with pytest.raises(ValueError, match="custom_mask must hold"):
        w.plan(*bt.plan_args(), custom_mask=torch.ones(17 * 97 + 37 * 54 - 1, dtype=torch.bool, device=CUDA))
    with pytest.raises(ValueError, match="packed_custom_mask must hold"):
        w.plan(*bt.plan_args(), packed_custom_mask=torch.zeros(10, dtype=torch.uint8, device=CUDA))
    with pytest.raises(ValueError, match="logits_soft_cap"):
        w.plan(*bt.plan_args(), logits_soft_cap=-1.0)
    # ignored arguments are accepted
    w.plan(*bt.plan_args(), block_tables=torch.zeros(2, 8, dtype=torch.int32), seq_lens_q=[17, 37],
           max_token_per_sequence=37, max_sequence_kv=97, uniform_q_len=None, use_fp16_qk_reduction=True)


@gpu
def test_plan_checks_ragged():
    bt = Batch("ragged", [17, 37], [97, 54], 8, 2, 128, 128, H)
    w = bt.wrapper()
    qo, kv, hq, hkv, d, dvo = bt.plan_args()
    with pytest.raises(ValueError, match="length of kv_indptr"):
        w.plan(qo, kv[:2], hq, hkv, d)
    with pytest.raises(ValueError, match="kv_indptr\\[0\\] must be 0"):
        w.plan(qo, kv + 1, hq, hkv, d)
    with pytest.raises(ValueError, match="head_dim"):
        w.plan(qo, kv, hq, hkv, 192, 192)
    with pytest.raises(ValueError, match="rope_theta"):
        w.plan(qo, kv, hq, hkv, d, pos_encoding_mode="ROPE_LLAMA", rope_theta=0.0)
    w.plan(*bt.plan_args(), seq_lens=torch.tensor([97, 54]), v_indptr=kv, o_indptr=qo, max_sequence_kv=97)


@gpu
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_run_checks(kind):
    bt = Batch(kind, [17, 37], [97, 54], 8, 2, 128, 128, B)
    w = bt.wrapper()
    with pytest.raises(RuntimeError, match="plan"):
        w.run(*bt.run_args())
    w.plan(*bt.plan_args())  # q_data_type defaults to float16
    with pytest.raises(ValueError, match="does not match the (q|kv)_data_type"):
        w.run(*bt.run_args())
    bt.plan(w, causal=True)
    args = list(bt.run_args())
    with pytest.raises(ValueError, match=r"q.shape\[0\] \(53\) does not match qo_indptr\[-1\] \(54\)"):
        w.run(bt.q[:53], *args[1:])
    with pytest.raises(ValueError, match="num_qo_heads"):
        w.run(bt.q[:, :4], *args[1:])
    if kind == "paged":
        k4, v4 = bt.cache
        with pytest.raises(ValueError, match="does not match the kv_data_type"):
            w.run(bt.q, (k4.half(), v4.half()))
        with pytest.raises(KeyError):
            w.run(bt.q, [k4, v4, v4])
        with pytest.raises(KeyError):
            w.run(bt.q, "cache")
        with pytest.raises(ValueError, match="page_size"):
            w.run(bt.q, (k4[:, :8], v4[:, :8]))
        with pytest.raises(ValueError, match="pages"):
            w.run(bt.q, (k4[:2], v4[:2]))
        with pytest.raises(AssertionError):
            w.run(*args, window_left=5)
        for arg in ("sinks", "kv_cache_sf", "skip_softmax_threshold_scale_factor"):
            with pytest.raises(NotImplementedError):
                w.run(*args, **{arg: torch.zeros(8, device=CUDA)})
        with pytest.raises(NotImplementedError):
            w.run(*args, use_fp16_softmax=True)
        with pytest.raises(NotImplementedError, match="tensor scales"):
            w.run(*args, k_scale=torch.ones(2, device=CUDA))
    else:
        with pytest.raises(ValueError, match="does not match the kv_data_type"):
            w.run(bt.q, bt.k.half(), bt.v)
        with pytest.raises(ValueError, match="rows"):
            w.run(bt.q, bt.k[:100], bt.v[:100])
        with pytest.raises(NotImplementedError):
            w.run(*args, kv_cache_sf=torch.zeros(8, device=CUDA))


@gpu
def test_cuda_graph_buffer_checks_on_device():
    ws = workspace()
    i32 = dict(dtype=torch.int32, device=CUDA)
    good = dict(qo_indptr_buf=torch.empty(5, **i32), paged_kv_indptr_buf=torch.empty(5, **i32),
                paged_kv_indices_buf=torch.empty(64, **i32), paged_kv_last_page_len_buf=torch.empty(4, **i32))
    Paged(ws, use_cuda_graph=True, **good)
    with pytest.raises(ValueError, match="int32"):
        Paged(ws, use_cuda_graph=True, **{**good, "paged_kv_indices_buf": torch.empty(64, device=CUDA)})
    with pytest.raises(ValueError, match="CUDA|cuda"):
        Paged(ws, use_cuda_graph=True, **{**good, "qo_indptr_buf": torch.empty(5, dtype=torch.int32)})
    w = Paged(ws, use_cuda_graph=True, **{**good, "paged_kv_indices_buf": torch.empty(32, **i32)})
    bt = Batch("paged", [1, 2, 3, 4], [100, 200, 300, 400], 8, 2, 128, 128, H)  # 64 pages
    with pytest.raises(ValueError, match="exceeds the allocated buffer"):
        bt.plan(w)


# ==================================================================================================
# CPU: signatures, module surface, constructor checks
# ==================================================================================================

def test_module_surface():
    assert flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper is Paged
    assert flashinfer.prefill.BatchPrefillWithRaggedKVCacheWrapper is Ragged
    for name in ("BatchPrefillWithPagedKVCacheWrapper", "BatchPrefillWithRaggedKVCacheWrapper"):
        assert name in flashinfer.__all__ and name in flashinfer.prefill.__all__
    for cls in (Paged, Ragged):
        assert cls.begin_forward is cls.plan
        assert isinstance(cls.__dict__["run_return_lse"], functools.partialmethod)
        for m in ("plan", "run", "forward", "forward_return_lse", "end_forward", "reset_workspace_buffer",
                  "is_cuda_graph_enabled", "resolved_backend"):
            assert hasattr(cls, m), m
    assert hasattr(Paged, "prewarm_paged_kv_stride_variant")


def _params(fn):
    return [(p.name, p.default, p.kind) for p in inspect.signature(fn).parameters.values()]


E = inspect.Parameter.empty
PK, VAR, KW = inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.KEYWORD_ONLY


def test_signatures_match_the_spec():
    """Spec 1.4 / 1.5: names, order, defaults (callers pass plan options positionally)."""
    assert [(n, d) for n, d, _ in _params(Paged.__init__)] == [
        ("self", E), ("float_workspace_buffer", E), ("kv_layout", "NHD"), ("use_cuda_graph", False),
        ("qo_indptr_buf", None), ("paged_kv_indptr_buf", None), ("paged_kv_indices_buf", None),
        ("paged_kv_last_page_len_buf", None), ("custom_mask_buf", None), ("mask_indptr_buf", None),
        ("backend", "auto"), ("jit_args", None), ("jit_kwargs", None), ("variant_owns_mask", False)]
    assert [(n, d) for n, d, _ in _params(Ragged.__init__)] == [
        ("self", E), ("float_workspace_buffer", E), ("kv_layout", "NHD"), ("use_cuda_graph", False),
        ("qo_indptr_buf", None), ("kv_indptr_buf", None), ("custom_mask_buf", None), ("mask_indptr_buf", None),
        ("backend", "auto"), ("jit_args", None), ("jit_kwargs", None), ("variant_owns_mask", False)]
    paged_plan = [
        ("self", E), ("qo_indptr", E), ("paged_kv_indptr", E), ("paged_kv_indices", E), ("paged_kv_last_page_len", E),
        ("num_qo_heads", E), ("num_kv_heads", E), ("head_dim_qk", E), ("page_size", E), ("head_dim_vo", None),
        ("custom_mask", None), ("packed_custom_mask", None), ("causal", False), ("pos_encoding_mode", "NONE"),
        ("use_fp16_qk_reduction", False), ("sm_scale", None), ("window_left", -1), ("logits_soft_cap", None),
        ("rope_scale", None), ("rope_theta", None), ("q_data_type", "float16"), ("kv_data_type", None),
        ("o_data_type", None), ("non_blocking", True), ("prefix_len_ptr", None), ("token_pos_in_items_ptr", None),
        ("token_pos_in_items_len", 0), ("max_item_len_ptr", None), ("seq_lens", None), ("seq_lens_q", None),
        ("block_tables", None), ("max_token_per_sequence", None), ("max_sequence_kv", None),
        ("fixed_split_size", None), ("disable_split_kv", False), ("uniform_q_len", None)]
    assert [(n, d, k) for n, d, k in _params(Paged.plan)] == [(n, d, PK) for n, d in paged_plan]
    ragged_plan = [
        ("self", E), ("qo_indptr", E), ("kv_indptr", E), ("num_qo_heads", E), ("num_kv_heads", E),
        ("head_dim_qk", E), ("head_dim_vo", None), ("custom_mask", None), ("packed_custom_mask", None),
        ("causal", False), ("pos_encoding_mode", "NONE"), ("use_fp16_qk_reduction", False), ("window_left", -1),
        ("logits_soft_cap", None), ("sm_scale", None), ("rope_scale", None), ("rope_theta", None),
        ("q_data_type", "float16"), ("kv_data_type", None), ("o_data_type", None), ("non_blocking", True),
        ("prefix_len_ptr", None), ("token_pos_in_items_ptr", None), ("token_pos_in_items_len", 0),
        ("max_item_len_ptr", None), ("fixed_split_size", None), ("disable_split_kv", False), ("seq_lens", None),
        ("seq_lens_q", None), ("max_token_per_sequence", None), ("max_sequence_kv", None), ("v_indptr", None),
        ("o_indptr", None), ("uniform_q_len", None)]
    assert [(n, d, k) for n, d, k in _params(Ragged.plan)] == [(n, d, PK) for n, d in ragged_plan]
    assert _params(Paged.run) == [
        ("self", E, PK), ("q", E, PK), ("paged_kv_cache", E, PK), ("args", E, VAR), ("q_scale", None, KW),
        ("k_scale", None, KW), ("v_scale", None, KW), ("out", None, KW), ("lse", None, KW), ("return_lse", False, KW),
        ("lse_base", "log2", KW), ("lse_layout", "NH", KW), ("enable_pdl", None, KW), ("window_left", None, KW),
        ("sinks", None, KW), ("kv_cache_sf", None, KW), ("skip_softmax_threshold_scale_factor", None, KW),
        ("use_fp16_softmax", None, KW), ("uses_spcompress", None, KW)]
    assert _params(Ragged.run) == [
        ("self", E, PK), ("q", E, PK), ("k", E, PK), ("v", E, PK), ("args", E, VAR), ("q_scale", None, KW),
        ("k_scale", None, KW), ("v_scale", None, KW), ("o_scale", None, KW), ("out", None, KW), ("lse", None, KW),
        ("return_lse", False, KW), ("lse_base", "log2", KW), ("lse_layout", "NH", KW), ("enable_pdl", None, KW),
        ("kv_cache_sf", None, KW)]
    fwd_common = [("causal", False), ("pos_encoding_mode", "NONE"), ("use_fp16_qk_reduction", False)]
    tail = [("window_left", -1), ("logits_soft_cap", None), ("sm_scale", None), ("rope_scale", None),
            ("rope_theta", None)]
    for fn in (Paged.forward, Paged.forward_return_lse):
        assert [(n, d) for n, d, _ in _params(fn)] == ([("self", E), ("q", E), ("paged_kv_cache", E)] + fwd_common +
                                                       [("k_scale", None), ("v_scale", None)] + tail)
    for fn in (Ragged.forward, Ragged.forward_return_lse):
        assert [(n, d) for n, d, _ in _params(fn)] == ([("self", E), ("q", E), ("k", E), ("v", E)] + fwd_common + tail)


def _cpu_ws():
    return torch.empty(1024, dtype=torch.uint8)


@pytest.mark.parametrize("cls", [Paged, Ragged])
@pytest.mark.parametrize("layout", ["nhd", "NDH", "", 0])
def test_bad_kv_layout(cls, layout):
    with pytest.raises(KeyError):
        cls(_cpu_ws(), layout)


@pytest.mark.parametrize("cls", [Paged, Ragged])
def test_unsupported_constructor_options(cls):
    for backend in ("cudnn", "trtllm-gen", "cute-dsl", "cutlass"):
        with pytest.raises(NotImplementedError, match="backend"):
            cls(_cpu_ws(), backend=backend)
    with pytest.raises(NotImplementedError, match="jit_args"):
        cls(_cpu_ws(), jit_args=["x"])
    with pytest.raises(NotImplementedError, match="jit_args"):
        cls(_cpu_ws(), jit_kwargs={})
    with pytest.raises(NotImplementedError, match="variant_owns_mask"):
        cls(_cpu_ws(), variant_owns_mask=True)


@pytest.mark.parametrize("cls", [Paged, Ragged])
def test_workspace_must_be_cuda(cls):
    with pytest.raises(ValueError, match="CUDA"):
        cls(_cpu_ws())


def _graph_bufs(batch=4, pages=64, **over):
    i32 = torch.int32
    b = dict(qo_indptr_buf=torch.empty(batch + 1, dtype=i32), paged_kv_indptr_buf=torch.empty(batch + 1, dtype=i32),
             paged_kv_indices_buf=torch.empty(pages, dtype=i32),
             paged_kv_last_page_len_buf=torch.empty(batch, dtype=i32))
    b.update(over)
    return b


@pytest.mark.parametrize("missing", ["qo_indptr_buf", "paged_kv_indptr_buf", "paged_kv_indices_buf",
                                     "paged_kv_last_page_len_buf"])
def test_paged_cuda_graph_needs_its_buffers(missing):
    with pytest.raises(ValueError, match=missing):
        Paged(_cpu_ws(), use_cuda_graph=True, **_graph_bufs(**{missing: None}))


@pytest.mark.parametrize("over,match", [
    ({"paged_kv_indptr_buf": torch.empty(4, dtype=torch.int32)}, "paged_kv_indptr_buf"),
    ({"paged_kv_last_page_len_buf": torch.empty(5, dtype=torch.int32)}, "paged_kv_last_page_len_buf"),
    ({"qo_indptr_buf": torch.empty(2, 3, dtype=torch.int32)}, "1-D"),
])
def test_paged_cuda_graph_buffer_lengths(over, match):
    with pytest.raises(ValueError, match=match):
        Paged(_cpu_ws(), use_cuda_graph=True, **_graph_bufs(**over))


def test_ragged_cuda_graph_buffers():
    i32 = torch.int32
    with pytest.raises(ValueError, match="qo_indptr_buf"):
        Ragged(_cpu_ws(), use_cuda_graph=True, kv_indptr_buf=torch.empty(5, dtype=i32))
    with pytest.raises(ValueError, match="kv_indptr_buf"):
        Ragged(_cpu_ws(), use_cuda_graph=True, qo_indptr_buf=torch.empty(5, dtype=i32))
    with pytest.raises(ValueError, match="kv_indptr_buf"):
        Ragged(_cpu_ws(), use_cuda_graph=True, qo_indptr_buf=torch.empty(5, dtype=i32),
               kv_indptr_buf=torch.empty(4, dtype=i32))
    # buffers need not be given without CUDA graphs (the workspace check comes next)
    with pytest.raises(ValueError, match="float_workspace_buffer"):
        Ragged(_cpu_ws(), use_cuda_graph=False)


# ==================================================================================================
# CPU: helpers
# ==================================================================================================

@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_unpack_paged_kv_cache_forms(layout):
    li = 0 if layout == "NHD" else 1
    P, ps, hkv, d = 6, 4, 2, 8
    page = (P, ps, hkv, d) if layout == "NHD" else (P, hkv, ps, d)
    full = torch.randn((P, 2) + page[1:])
    k, v = fprefill._unpack_paged_kv_cache(full, li)
    assert k.shape == page and torch.equal(k, full[:, 0]) and torch.equal(v, full[:, 1])
    assert k.data_ptr() == full.data_ptr()  # views, no copies
    kt, vt = torch.randn(page), torch.randn(page[:-1] + (d * 2,))
    k, v = fprefill._unpack_paged_kv_cache((kt, vt), li)
    assert k is kt and v is vt
    one = torch.randn(P, 2, hkv, d)  # page_size 1
    k, v = fprefill._unpack_paged_kv_cache(one, li)
    want = (P, 1, hkv, d) if layout == "NHD" else (P, hkv, 1, d)
    assert k.shape == want and torch.equal(k.reshape(P, hkv, d), one[:, 0])
    k3, v3 = torch.randn(P, hkv, d), torch.randn(P, hkv, d)
    k, v = fprefill._unpack_paged_kv_cache((k3, v3), li)
    assert k.shape == want and v.shape == want and torch.equal(v.reshape(P, hkv, d), v3)
    with pytest.raises(KeyError):
        fprefill._unpack_paged_kv_cache((kt, vt, vt), li)
    with pytest.raises(KeyError):
        fprefill._unpack_paged_kv_cache("cache", li)
    with pytest.raises(ValueError, match="Invalid shape"):
        fprefill._unpack_paged_kv_cache(torch.randn(P, 2, d), li)
    with pytest.raises(ValueError, match="Invalid shape"):
        fprefill._unpack_paged_kv_cache((torch.randn(P, d), torch.randn(P, d)), li)


def test_mask_segment_offsets_match_segment_packbits():
    qo = np.array([17, 0, 37, 3, 1])
    kv = np.array([97, 54, 0, 5, 1])
    got = fprefill._mask_byte_indptr(qo, kv)
    bits = qo * kv
    x = torch.rand(int(bits.sum())) < 0.5
    y, new_indptr = flashinfer.segment_packbits(x, torch.tensor(np.concatenate([[0], np.cumsum(bits)])),
                                                bitorder="little")
    assert got.tolist() == new_indptr.tolist() == [0, 207, 207, 207, 209, 210]
    assert torch.equal(y, pack_segments([x[a:b] for a, b in zip(np.concatenate([[0], np.cumsum(bits)])[:-1],
                                                                np.cumsum(bits))]))


_HAS_PLAN_BATCH = hasattr(fprefill._prefill, "plan_batch")


@pytest.mark.skipif(not _HAS_PLAN_BATCH, reason="this build's _prefill has no plan_batch yet")
@pytest.mark.parametrize("dqk,dvo,hq,hkv", [(128, 128, 32, 8), (64, 64, 28, 4), (256, 256, 8, 8), (192, 128, 7, 1)])
def test_plan_batch_items(dqk, dvo, hq, hkv):
    """The binding's work items (the contract the wrappers rely on): every row tile of every
    request exactly once, tiles of _TILE_ROWS * m_tiles packed rows, one M tile when asked with
    _ONE_M_TILE_SMS (as the wrappers do under CUDA graphs and for batch invariance)."""
    qo, kv = LENS[12]
    group = hq // hkv
    for sms, big in ((132, False), (132, True), (fprefill._ONE_M_TILE_SMS, True)):
        q = [x * 40 for x in qo] if big else qo
        items, m_tiles = fprefill._prefill.plan_batch(q, kv, hq, hkv, dqk, dvo, sms)
        assert m_tiles in (1, 2)
        if sms == fprefill._ONE_M_TILE_SMS or dqk > 128:
            assert m_tiles == 1
        rows = fprefill._TILE_ROWS * m_tiles
        pairs = sorted(zip(items[0::2], items[1::2]))
        want = sorted((b, t) for b in range(len(q)) for t in range(-(-q[b] * group // rows)))
        assert pairs == want
    assert fprefill._prefill.plan_batch([1024] * 4, [1024] * 4, 32, 8, 128, 128, 132)[1] == 2


# ==================================================================================================
# CPU: the wrappers' host side end to end, the kernel emulated from its binding contract
# ==================================================================================================

def _from_dl(x):
    return None if x is None else torch.utils.dlpack.from_dlpack(x)


class KernelEmulator:
    """_prefill.batch_prefill per its contract, in float64 (prefill_ref per request), writing only
    the (row, head) pairs of the given work items and checking that each is written once."""

    def __init__(self):
        self.calls = 0
        self.launched_items = []

    def __call__(self, q, k, v, out, lse, mask, mask_indptr, qo_indptr, kv_indptr, page_indices, last_page_len,
                 items, num_items, m_tiles, page_size, kv_layout, causal, window_left, sm_scale, soft_cap, alibi,
                 v_scale, stream, pdl, num_chunks=1, o_part=None, lse_part=None):
        q, k, v, out, lse = (_from_dl(x) for x in (q, k, v, out, lse))
        mask, mask_indptr, qo_indptr, kv_indptr = (_from_dl(x) for x in (mask, mask_indptr, qo_indptr, kv_indptr))
        page_indices, last_page_len, items = (_from_dl(x) for x in (page_indices, last_page_len, items))
        self.calls += 1
        self.last = SimpleNamespace(paged=page_indices is not None, k_dtype=k.dtype, k_shape=tuple(k.shape),
                                    kv_layout=kv_layout, sm_scale=sm_scale, v_scale=v_scale, num_chunks=num_chunks)
        assert m_tiles in (1, 2) and items.dtype == torch.int32 and items.numel() >= 2 * num_items
        # split-KV: items (b, t * num_chunks + c), one M tile, the partial states' buffers given (the
        # binding merges them into out / lse: emulated by writing the result once per chunk)
        chunks = max(int(num_chunks), 1)
        if chunks > 1:
            o_part, lse_part = _from_dl(o_part), _from_dl(lse_part)
            hq_, dvo_ = q.shape[1], out.shape[2]
            assert m_tiles == 1 and o_part.dtype == q.dtype and lse_part.dtype == torch.float32
            assert o_part.numel() >= q.shape[0] * chunks * hq_ * dvo_ and lse_part.numel() >= q.shape[0] * (chunks + 1) * hq_
        assert qo_indptr.dtype == kv_indptr.dtype == torch.int32
        hq, hkv = q.shape[1], (k.shape[2 if kv_layout == 0 else 1] if page_indices is not None else
                               k.shape[1 if kv_layout == 0 else 0])
        group = hq // hkv
        rows_per_tile = fprefill._TILE_ROWS * m_tiles
        written = torch.zeros(q.shape[0], hq, dtype=torch.int32)
        cache = {}
        it = items[:2 * num_items].view(-1, 2).tolist()
        self.launched_items.append(len(it))
        for b, t in it:
            t //= chunks
            q0, q1 = int(qo_indptr[b]), int(qo_indptr[b + 1])
            qo_len = q1 - q0
            pr0 = t * rows_per_tile
            if pr0 >= qo_len * group:
                continue
            if b not in cache:
                a, e = int(kv_indptr[b]), int(kv_indptr[b + 1])
                if page_indices is None:
                    kb = k[a:e] if kv_layout == 0 else k[:, a:e].transpose(0, 1)
                    vb = v[a:e] if kv_layout == 0 else v[:, a:e].transpose(0, 1)
                    kv_len = e - a
                else:
                    pages = page_indices[a:e].long()
                    kv_len = (e - a - 1) * page_size + int(last_page_len[b]) if e > a else 0
                    kp, vp = k[pages], v[pages]
                    if kv_layout == 1:
                        kp, vp = kp.transpose(1, 2), vp.transpose(1, 2)
                    kb = kp.reshape(-1, hkv, k.shape[-1])[:kv_len]
                    vb = vp.reshape(-1, hkv, v.shape[-1])[:kv_len]
                m = None
                if mask is not None:
                    start = int(mask_indptr[b]) * 8
                    bits = np.unpackbits(mask.numpy(), bitorder="little")[start:start + qo_len * kv_len]
                    m = torch.from_numpy(bits.astype(bool)).view(qo_len, kv_len)
                cache[b] = prefill_ref(q[q0:q1], kb, vb, causal=causal and m is None, sm_scale=sm_scale,
                                       window_left=window_left, soft_cap=soft_cap, alibi=alibi, mask=m,
                                       v_scale=v_scale)
            o_b, lse_b = cache[b]
            pr = torch.arange(pr0, min(pr0 + rows_per_tile, qo_len * group))
            tok = pr // group
            for kvh in range(hkv):
                heads = kvh * group + pr % group
                out[q0 + tok, heads] = o_b[tok, heads].to(out.dtype)
                if lse is not None:
                    lse[q0 + tok, heads] = lse_b[tok, heads].float()
                written[q0 + tok, heads] += 1
        rows_in_requests = torch.zeros(q.shape[0], dtype=torch.bool)
        for b in range(qo_indptr.numel() - 1):
            rows_in_requests[int(qo_indptr[b]):int(qo_indptr[b + 1])] = True
        assert bool((written[rows_in_requests] == chunks).all()), "every (row, head) of a request: once per key chunk"
        assert bool((written[~rows_in_requests] == 0).all())


def _emulated_apply_rope_pos_ids(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
    pos = pos_ids.long().cpu()
    rot = lambda x: rope_rotate_half(x.double().transpose(0, 1), pos, rope_scale, rope_theta).transpose(0, 1)  # noqa
    return rot(q).to(q.dtype), rot(k).to(k.dtype)


class _Event:
    def record(self):
        pass

    def synchronize(self):
        pass


@pytest.fixture
def emulated(monkeypatch):
    """The wrappers on the CPU: CPU workspaces, no CUDA streams / events, the kernel (and RoPE)
    emulated; plan_batch is the binding's when it has one, else a Python model of its contract."""
    import flashinfer.rope as frope

    def reset(self, float_ws, int_ws):
        self._float_workspace_buffer = float_ws
        self.device = float_ws.device
        self._int_workspace_buffer = torch.empty(1 << 20, dtype=torch.uint8) if int_ws is None else int_ws
        self._pin_memory_int_workspace_buffer = torch.empty(self._int_workspace_buffer.numel(), dtype=torch.uint8)

    def check_buf(self, buf, name, dtype):
        if buf.dtype != dtype:
            raise ValueError(f"{name} must be {dtype}")

    def plan_batch(qo_lens, kv_lens, hq, hkv, dqk, dvo, num_sms):  # prefill.h's rule
        group = hq // hkv
        ctas = sum(-(-q * group // 128) for q in qo_lens) * hkv
        mt = 2 if dqk <= 128 and dvo <= 128 and ctas >= 2 * num_sms else 1
        order = sorted(range(len(qo_lens)), key=lambda b: -kv_lens[b])
        items = []
        for b in order:
            for t in reversed(range(-(-qo_lens[b] * group // (64 * mt)))):
                items += [b, t]
        return items, mt

    kernel = KernelEmulator()
    real_plan_batch = getattr(fprefill._prefill, "plan_batch", None)
    fns = dict(plan_batch=real_plan_batch or plan_batch, batch_prefill=kernel)
    if hasattr(fprefill._prefill, "plan_batch_split"):
        fns["plan_batch_split"] = fprefill._prefill.plan_batch_split
    monkeypatch.setattr(fprefill, "_prefill", SimpleNamespace(**fns))
    monkeypatch.setattr(fprefill._BatchPrefillBase, "reset_workspace_buffer", reset)
    monkeypatch.setattr(fprefill._BatchPrefillBase, "_check_device_buf", check_buf)
    monkeypatch.setattr(fprefill, "_num_sms", lambda device: 132)
    monkeypatch.setattr(torch.cuda, "device", lambda d: contextlib.nullcontext())
    monkeypatch.setattr(torch.cuda, "Event", _Event)
    monkeypatch.setattr(frope, "apply_rope_pos_ids", _emulated_apply_rope_pos_ids)
    return kernel


CPU = "cpu"
EMU_PAGED = [(3, 5, "NHD", 64, 64, 8, 2, B, True, "tuple4"), (12, 1, "HND", 64, 64, 7, 1, H, False, "4d"),
             (3, 16, "HND", 64, 64, 4, 4, H, True, "5d"), (12, 1, "NHD", 192, 128, 4, 1, B, True, "tuple3")]


@pytest.mark.parametrize("case", EMU_PAGED, ids=_paged_id)
def test_emulated_paged(emulated, case):
    batch, ps, layout, dqk, dvo, hq, hkv, dtype, causal, form = case
    qo_lens, kv_lens = LENS[batch]
    bt = Batch("paged", qo_lens, kv_lens, hq, hkv, dqk, dvo, dtype, layout, ps, form, dev=CPU)
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=causal)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    assert emulated.calls == 1
    check(o, lse, *bt.ref(causal=causal))
    # the private attributes engines read
    assert w._paged_kv_indptr_buf.tolist() == bt.table.indptr.tolist()
    assert w._paged_kv_indices_buf.tolist() == bt.table.indices.tolist()
    assert w._paged_kv_last_page_len_buf.tolist() == bt.table.last_page_len.tolist()
    assert w._qo_indptr_buf.tolist() == bt.qo_indptr and w._qo_indptr_last == sum(qo_lens)
    assert w._kv_layout == layout and w._use_cuda_graph is False and w._fixed_batch_size == 0
    for name in ("_float_workspace_buffer", "_int_workspace_buffer", "_pin_memory_int_workspace_buffer"):
        assert isinstance(getattr(w, name), torch.Tensor)


@pytest.mark.parametrize("layout,causal,pos", [("NHD", True, "NONE"), ("HND", False, "ALIBI"),
                                               ("HND", True, "ROPE_LLAMA"), ("NHD", False, "ROPE_LLAMA")])
def test_emulated_ragged(emulated, layout, causal, pos):
    qo_lens, kv_lens = LENS[12]
    bt = Batch("ragged", qo_lens, kv_lens, 8, 2, 64, 64, B, layout, dev=CPU)
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=causal, pos_encoding_mode=pos, window_left=30, logits_soft_cap=20.0 if pos == "NONE" else None)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    kw = dict(causal=causal, window_left=30, soft_cap=20.0 if pos == "NONE" else 0.0, alibi=pos == "ALIBI")
    check(o, lse, *bt.ref(rope=pos == "ROPE_LLAMA", **kw))
    assert w._kv_indptr_buf.tolist() == bt.kv_indptr


def test_emulated_ragged_rope_with_extra_key_rows(emulated):
    """k / v longer than kv_indptr[-1] (rows past it unused): RoPE rotates the planned rows."""
    qo_lens, kv_lens = LENS[3]
    bt = Batch("ragged", qo_lens, kv_lens, 4, 2, 64, 64, H, "HND", dev=CPU)
    pad = torch.randn(2, 5, 64, dtype=H)
    bt.k = torch.cat([bt.k, pad], 1)
    bt.v = torch.cat([bt.v, pad], 1)
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=True, pos_encoding_mode="ROPE_LLAMA")
    o, lse = w.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(causal=True, rope=True))


@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_emulated_masks(emulated, kind):
    qo_lens, kv_lens = LENS[12]
    bt = Batch(kind, qo_lens, kv_lens, 8, 2, 64, 64, H, "NHD", 5, dev=CPU)
    masks = bt.random_masks()
    w = bt.wrapper(dev=CPU)
    bt.plan(w, custom_mask=flat(masks), causal=True, window_left=40)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(masks=masks, window_left=40))
    assert w._mask_indptr_buf.tolist() == fprefill._mask_byte_indptr(np.array(qo_lens), np.array(kv_lens)).tolist()
    bt.plan(w, packed_custom_mask=pack_segments(masks), window_left=40)
    o2, lse2 = w.run(*bt.run_args(), return_lse=True)
    assert torch.equal(o2, o) and torch.equal(lse2, lse)
    bt.plan(w, custom_mask=np.concatenate([m.numpy().reshape(-1) for m in masks]), window_left=40)  # NumPy mask
    assert torch.equal(w.run(*bt.run_args()), o)


@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_emulated_lse_and_outputs(emulated, kind):
    qo_lens, kv_lens = LENS[3]
    bt = Batch(kind, qo_lens, kv_lens, 8, 2, 64, 64, H, dev=CPU)
    n = sum(qo_lens)
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=True, o_data_type=B)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    assert o.dtype == B
    ref_o, ref_lse = bt.ref(causal=True)
    check(o, lse, ref_o, ref_lse)
    _, lse_hn = w.run(*bt.run_args(), return_lse=True, lse_layout="HN", lse_base="ln")
    assert lse_hn.shape == (8, n) and lse_hn.is_contiguous()
    assert torch.allclose(lse_hn, lse.t() * math.log(2.0))
    out = torch.empty(n, 8, 64, dtype=B)
    lse_buf = torch.empty(8, n)
    o2 = w.run(*bt.run_args(), out=out, lse=lse_buf, lse_layout="HN")
    assert o2 is out and torch.equal(out, o) and torch.equal(lse_buf, lse.t())


@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_emulated_cuda_graph_plans(emulated, kind):
    """Under CUDA graphs every plan writes the caller's buffers and launches the same number of
    work items (padded with no-op items), one M tile, at the same addresses."""
    batch = 4
    i32 = torch.int32
    qo_buf, kv_buf = torch.full((batch + 1,), -1, dtype=i32), torch.full((batch + 1,), -1, dtype=i32)
    mask_buf, mask_indptr_buf = torch.zeros(40000, dtype=torch.uint8), torch.zeros(batch + 1, dtype=i32)
    if kind == "paged":
        idx_buf, last_buf = torch.full((300,), -1, dtype=i32), torch.full((batch,), -1, dtype=i32)
        w = Paged(_cpu_ws(), "HND", True, qo_buf, kv_buf, idx_buf, last_buf, mask_buf, mask_indptr_buf)
    else:
        w = Ragged(_cpu_ws(), "HND", True, qo_buf, kv_buf, mask_buf, mask_indptr_buf)
    plans = [([37, 17, 127, 1], [97, 54, 512, 1]), ([1, 127, 17, 37], [512, 1, 54, 97]), ([0, 0, 90, 0], [5, 0, 90, 1])]
    items_ptr = None
    for i, (qo, kv) in enumerate(plans):
        bt = Batch(kind, qo, kv, 32, 8, 64, 64, B, "HND", 16, dev=CPU)
        masks = bt.random_masks() if i == 1 else None
        bt.plan(w, causal=True, custom_mask=None if masks is None else flat(masks))
        assert w._m_tiles == 1 and w._qo_indptr_buf is qo_buf and qo_buf.tolist() == bt.qo_indptr
        if kind == "paged":
            assert w._paged_kv_indices_buf is idx_buf and w._paged_kv_indptr_buf is kv_buf
            assert idx_buf[:bt.table.indices.numel()].tolist() == bt.table.indices.tolist()
            assert last_buf.tolist() == bt.table.last_page_len.tolist()
        else:
            assert w._kv_indptr_buf is kv_buf and kv_buf.tolist() == bt.kv_indptr
        if items_ptr is None:
            items_ptr, n_items = w._items.data_ptr(), w._num_items
        assert w._items.data_ptr() == items_ptr and w._num_items == n_items
        o, lse = w.run(*bt.run_args(), return_lse=True)
        check(o, lse, *bt.ref(masks=masks, causal=masks is None))
    assert len(set(emulated.launched_items)) == 1
    with pytest.raises(ValueError, match="cannot exceed"):
        Batch(kind, [100, 100, 100, 1], [100, 100, 100, 1], 32, 8, 64, 64, B, dev=CPU).plan(w)
    with pytest.raises(ValueError, match="batch size"):
        Batch(kind, [1, 1, 1], [1, 1, 1], 32, 8, 64, 64, B, dev=CPU).plan(w)


def test_emulated_indices_tail_is_ignored(emulated):
    """paged_kv_indices may run past paged_kv_indptr[-1] (SGLang allocates 256 spare, uninitialized
    entries): only indices[:indptr[-1]] are read."""
    qo_lens, kv_lens = LENS[3]
    bt = Batch("paged", qo_lens, kv_lens, 8, 2, 64, 64, B, "NHD", 16, dev=CPU)
    w = bt.wrapper(dev=CPU)
    args = list(bt.plan_args())
    args[2] = torch.cat([args[2], torch.full((256,), -12345, dtype=torch.int32)])
    w.plan(*args, causal=True, q_data_type=B)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    check(o, lse, *bt.ref(causal=True))
    args[2] = args[2][:3]
    with pytest.raises(ValueError, match="indptr"):
        w.plan(*args, q_data_type=B)


def test_emulated_seq_lens_and_forward(emulated):
    qo_lens, kv_lens = [17, 37, 5, 3], [97, 54, 40, 16]
    bt = Batch("paged", qo_lens, kv_lens, 8, 2, 64, 64, B, "NHD", 16, dev=CPU)
    seq = [80, 54, 3, 0]
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=True, seq_lens=seq)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    full = bt.kv
    bt.kv = [(k[:s], v[:s]) for (k, v), s in zip(full, seq)]
    check(o, lse, *bt.ref(causal=True))
    o_f = w.forward(*bt.run_args(), causal=False, sm_scale=0.2, logits_soft_cap=5.0, k_scale=0.5, v_scale=2.0)
    check(o_f, None, *bt.ref(causal=False, sm_scale=0.1, soft_cap=5.0, v_scale=2.0))
    o_fl, lse_fl = w.forward_return_lse(*bt.run_args(), causal=True, pos_encoding_mode="ALIBI")
    check(o_fl, lse_fl, *bt.ref(causal=True, alibi=True))


def test_emulated_ragged_forward_switches_to_rope(emulated):
    qo_lens, kv_lens = LENS[3]
    bt = Batch("ragged", qo_lens, kv_lens, 4, 2, 64, 64, H, dev=CPU)
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=True)
    o, lse = w.forward_return_lse(*bt.run_args(), causal=True, pos_encoding_mode="ROPE_LLAMA")
    check(o, lse, *bt.ref(causal=True, rope=True))


def test_emulated_fixed_split_uses_one_m_tile(emulated):
    bt = Batch("ragged", [1024] * 8, [64] * 8, 32, 8, 64, 64, B, dev=CPU)
    w = bt.wrapper(dev=CPU)
    bt.plan(w)
    assert w._m_tiles == 2
    bt.plan(w, fixed_split_size=1024)
    assert w._m_tiles == 1
    bt.plan(w, disable_split_kv=True)
    assert w._m_tiles == 1


@pytest.mark.skipif(not hasattr(fprefill._prefill, "plan_batch_split"), reason="this build has no split-KV plan")
@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_emulated_split_kv_plan(emulated, kind):
    """A batch that leaves SMs idle with long keys: the plan cuts each row tile into key chunks
    (items (b, t * chunks + c)), the partial states live in the float workspace and go to the
    kernel; fixed_split_size / disable_split_kv and CUDA graphs plan no split; a workspace too
    small for the partial states gets fewer chunks."""
    bt = Batch(kind, [3, 40], [2048, 4096], 8, 2, 64, 64, B, dev=CPU)
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=True)
    chunks = w._num_chunks
    assert w._m_tiles == 1 and 1 < chunks <= 64
    items = w._items[:2 * w._num_items].view(-1, 2).tolist()
    tiles = {(b, t) for b, t in items}
    row_tiles = [(0, 0), (1, 0), (1, 1), (1, 2)]  # (packed rows: 3 x 4 and 40 x 4, tiles of 64)
    assert len(items) == len(tiles) == len(row_tiles) * chunks
    assert sorted({(b, t // chunks) for b, t in tiles}) == row_tiles
    o, lse = w.run(*bt.run_args(), return_lse=True)
    assert emulated.last.num_chunks == chunks
    check(o, lse, *bt.ref(causal=True))
    for kw in ({"fixed_split_size": 1024}, {"disable_split_kv": True}):
        bt.plan(w, causal=True, **kw)
        assert w._num_chunks == 1
    small = Batch(kind, [3, 40], [2048, 4096], 8, 2, 64, 64, B, dev=CPU)
    w2 = small.wrapper(dev=CPU)
    w2.reset_workspace_buffer(torch.empty(200000, dtype=torch.uint8), None)  # (4 chunks of 43 x 8 x 64 fit, 8 not)
    small.plan(w2, causal=True)
    assert 1 < w2._num_chunks < chunks


# --- fp8 K / V and paged RoPE: the gather / cast / rotate host paths --------------------------------

def _cat_rows(x, n, layout):
    """x (any dtype, fp8 included) with n random extra token rows (not planned)."""
    dim = 0 if layout == "NHD" else 1
    shape = list(x.shape)
    shape[dim] = n
    pad = torch.randn(shape).to(x.dtype)
    return torch.cat([x.view(torch.uint8), pad.view(torch.uint8)], dim).view(x.dtype)


EMU_PAGED_FP8 = [("float8_e4m3fn", H, "NHD", 5, "tuple4", True), ("float8_e5m2", B, "HND", 16, "5d", False),
                 ("float8_e4m3fn", B, "HND", 1, "tuple3", True), ("float8_e5m2", H, "NHD", 1, "4d", False),
                 ("float8_e5m2", H, "HND", 5, "tuple4", True)]


@pytest.mark.parametrize("fp8,dtype,layout,ps,form,causal", EMU_PAGED_FP8)
def test_emulated_paged_fp8(emulated, fp8, dtype, layout, ps, form, causal):
    """An fp8 paged cache: the plan's tokens gathered out of the pages (every layout / form /
    page size), cast to q's dtype, the ragged kernel launched over the token offsets; q_scale /
    k_scale multiply sm_scale, v_scale o (not the LSE)."""
    qo_lens, kv_lens = LENS[12]
    bt = Batch("paged", qo_lens, kv_lens, 8, 2, 64, 64, dtype, layout, ps, form, dev=CPU)
    ks, vs = bt.quantize(getattr(torch, fp8))
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=causal, kv_data_type=getattr(torch, fp8))
    o, lse = w.run(*bt.run_args(), q_scale=0.5, k_scale=ks, v_scale=vs, return_lse=True)
    k = emulated.last
    assert not k.paged and k.k_dtype == dtype and k.k_shape == (sum(kv_lens), 2, 64) and k.kv_layout == 0
    assert math.isclose(k.sm_scale, 0.5 * ks / 8, rel_tol=1e-12) and k.v_scale == vs
    check(o, lse, *bt.ref(causal=causal, sm_scale=0.5 * ks / 8, v_scale=vs))
    with pytest.raises(AssertionError):  # the comparison's sanity: without the scales it fails
        check(o, lse, *bt.ref(causal=causal))
    # the page table engines read is the plan's (the gather's index lives elsewhere)
    assert w._paged_kv_indptr_buf.tolist() == bt.table.indptr.tolist()
    assert w._paged_kv_indices_buf.tolist() == bt.table.indices.tolist()
    assert w._gather[2].tolist() == indptr_of(kv_lens)


@pytest.mark.parametrize("fp8,layout", [("float8_e4m3fn", "NHD"), ("float8_e5m2", "HND")])
def test_emulated_ragged_fp8(emulated, fp8, layout):
    """Ragged fp8 K / V: the planned rows cast to q's dtype (rows past kv_indptr[-1] neither cast
    nor read), the scales applied; 16-bit K / V ignore them (FlashInfer 0.7.2)."""
    qo_lens, kv_lens = LENS[12]
    bt = Batch("ragged", qo_lens, kv_lens, 8, 2, 64, 64, H, layout, dev=CPU)
    ks, vs = bt.quantize(getattr(torch, fp8))
    bt.k, bt.v = _cat_rows(bt.k, 5, layout), _cat_rows(bt.v, 5, layout)
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=True, kv_data_type=fp8)
    o, lse = w.run(*bt.run_args(), q_scale=2.0, k_scale=ks, v_scale=vs, return_lse=True)
    n = sum(kv_lens)
    assert emulated.last.k_dtype == H and emulated.last.k_shape == ((n, 2, 64) if layout == "NHD" else (2, n, 64))
    check(o, lse, *bt.ref(causal=True, sm_scale=2.0 * ks / 8, v_scale=vs))
    b16 = Batch("ragged", qo_lens, kv_lens, 8, 2, 64, 64, H, layout, dev=CPU)
    b16.plan(w, causal=True)
    assert torch.equal(w.run(*b16.run_args(), q_scale=2.0, k_scale=3.0, v_scale=0.5), w.run(*b16.run_args()))


@pytest.mark.parametrize("layout,ps,form,dtype,scale,theta,causal", PAGED_ROPE_CASES)
def test_emulated_paged_rope(emulated, layout, ps, form, dtype, scale, theta, causal):
    """Paged ROPE_LLAMA: the gathered keys and q rotated (positions as in the ragged wrapper);
    the cache is not modified."""
    qo_lens, kv_lens = LENS[12]
    bt = Batch("paged", qo_lens, kv_lens, 4, 2, 64, 64, dtype, layout, ps, form, dev=CPU)
    k0 = bt.k4.clone()
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=causal, pos_encoding_mode="ROPE_LLAMA", rope_scale=scale, rope_theta=theta)
    o, lse = w.run(*bt.run_args(), return_lse=True)
    assert not emulated.last.paged and torch.equal(bt.k4, k0)
    check(o, lse, *bt.ref(causal=causal, rope=True, rope_scale=scale or 1.0, rope_theta=theta or 1e4))
    with pytest.raises(AssertionError):
        check(o, lse, *bt.ref(causal=causal))


def test_emulated_paged_fp8_rope_and_seq_lens(emulated):
    """fp8 + RoPE (cast, then rotate), with seq_lens cutting the requests' keys short."""
    qo_lens, kv_lens = [17, 37, 5, 3], [97, 54, 40, 16]
    bt = Batch("paged", qo_lens, kv_lens, 8, 2, 64, 64, B, "HND", 5, dev=CPU)
    ks, vs = bt.quantize(torch.float8_e4m3fn)
    seq = [80, 54, 3, 0]
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=True, seq_lens=seq, kv_data_type=torch.float8_e4m3fn, pos_encoding_mode="ROPE_LLAMA")
    o, lse = w.run(*bt.run_args(), k_scale=ks, v_scale=vs, return_lse=True)
    bt.kv = [(k[:n], v[:n]) for (k, v), n in zip(bt.kv, seq)]
    check(o, lse, *bt.ref(causal=True, rope=True, sm_scale=ks / 8, v_scale=vs))


def test_emulated_paged_forward_rope_and_replan(emulated):
    """forward() switches a 16-bit NONE plan (the paged kernel, no gather) to ROPE_LLAMA (the
    gather path, index built then); a new plan starts without a gather."""
    bt = Batch("paged", *LENS[3], 4, 2, 64, 64, H, "NHD", 5, dev=CPU)
    w = bt.wrapper(dev=CPU)
    bt.plan(w, causal=True)
    assert w._gather is None
    o = w.run(*bt.run_args())
    assert emulated.last.paged
    o_r, lse_r = w.forward_return_lse(*bt.run_args(), causal=True, pos_encoding_mode="ROPE_LLAMA")
    assert not emulated.last.paged
    check(o_r, lse_r, *bt.ref(causal=True, rope=True))
    assert torch.equal(w.forward(*bt.run_args(), causal=True), o)
    b2 = Batch("paged", *LENS[12], 4, 2, 64, 64, H, "NHD", 5, dev=CPU)
    b2.plan(w, causal=True)
    assert w._gather is None
    check(w.run(*b2.run_args()), None, *b2.ref(causal=True))


def test_emulated_fp8_with_no_keys(emulated):
    """An fp8 plan whose requests have no key: empty gathers, o = 0, lse = -inf."""
    bt = Batch("paged", [3, 2], [0, 0], 4, 2, 64, 64, H, "NHD", 16, dev=CPU)
    bt.quantize(torch.float8_e5m2)
    w = bt.wrapper(dev=CPU)
    bt.plan(w, kv_data_type=torch.float8_e5m2, pos_encoding_mode="ROPE_LLAMA")
    o, lse = w.run(*bt.run_args(), return_lse=True)
    assert torch.equal(o, torch.zeros_like(o)) and bool(torch.isinf(lse).all())


@pytest.mark.parametrize("kind", ["paged", "ragged"])
def test_emulated_fp8_and_rope_checks(emulated, kind):
    _fp8_and_rope_checks(kind, CPU)


def test_emulated_head_dim_message(emulated):
    w = Paged(_cpu_ws())
    with pytest.raises(ValueError, match=r"\(256, 256\), \(512, 512\) or \(192, 128\); got \(512, 256\)"):
        w.plan([0, 1], [0, 1], [0], [1], 8, 2, 512, 16, 256)
