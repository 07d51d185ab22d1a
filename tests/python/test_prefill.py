"""single_prefill_with_kv_cache: GPU results against the float64 reference (reference_prefill.py)
over lengths, head dims, GQA groups, dtypes, layouts, causal (also qo_len > kv_len), sliding
window, soft cap, ALiBi, custom / packed masks, RoPE, k_scale / v_scale, fp8 K / V, LSE, strided
views, o_dtype, CuPy and empty queries; and, without a GPU, the argument checks, the module surface
and the reference itself (against a loop over the spec's definition and against SDPA), including
proof that the comparison fails the bugs a prefill kernel typically has.
"""

from __future__ import annotations

import inspect
import math
from types import SimpleNamespace

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")
flashinfer = pytest.importorskip("flashinfer", reason="flashinfer (with its _prefill binding) is not importable",
                                 exc_type=ImportError)

from reference_prefill import (  # noqa: E402
    alibi_slopes, assert_prefill_close, assert_prefill_lse_close, prefill_ref, prefill_scalar_ref)

CUDA = "cuda"
B, H = torch.bfloat16, torch.float16
gpu = pytest.mark.gpu


def make_qkv(qo_len, kv_len, hq, hkv, dqk, dvo, dtype, layout="NHD"):
    """Random q [qo, hq, dqk] and k / v in `layout`, and the NHD views of k / v for the reference."""
    q = torch.randn(qo_len, hq, dqk, dtype=dtype, device=CUDA)
    if layout == "NHD":
        k = torch.randn(kv_len, hkv, dqk, dtype=dtype, device=CUDA)
        v = torch.randn(kv_len, hkv, dvo, dtype=dtype, device=CUDA)
        return q, k, v, k, v
    k = torch.randn(hkv, kv_len, dqk, dtype=dtype, device=CUDA)
    v = torch.randn(hkv, kv_len, dvo, dtype=dtype, device=CUDA)
    return q, k, v, k.transpose(0, 1), v.transpose(0, 1)


def check(o, lse, ref_o, ref_lse, name=""):
    assert_prefill_close(o, ref_o, "o" + name, empty_rows=torch.isinf(ref_lse))
    if lse is not None:
        assert_prefill_lse_close(lse, ref_lse, "lse" + name)


# --- the grid: every value of every axis appears; the risky combinations are crossed ---------------
# (qo_len, kv_len, hq, hkv, head_dim_qk, head_dim_vo, dtype, layout, causal)
CASES = [
    (1, 1, 8, 8, 128, 128, H, "NHD", False),
    (1, 1000, 32, 8, 128, 128, B, "HND", True),  # one row: decode-like
    (1, 64, 28, 4, 256, 256, H, "NHD", False),  # group 7
    (7, 15, 28, 4, 64, 64, H, "NHD", True),  # group 7, a partial row tile
    (7, 1, 8, 2, 128, 128, B, "NHD", True),  # qo_len > kv_len: rows 0..5 see no key
    (7, 511, 7, 1, 192, 128, B, "HND", True),  # DeepSeek dims, group 7
    (64, 64, 32, 8, 128, 128, B, "NHD", True),
    (64, 64, 16, 16, 256, 256, H, "HND", False),
    (64, 511, 28, 4, 128, 128, H, "NHD", True),
    (64, 1000, 16, 4, 192, 128, H, "HND", False),
    (127, 127, 8, 2, 64, 64, B, "HND", True),
    (127, 15, 16, 4, 128, 128, H, "HND", True),  # qo_len > kv_len
    (127, 1000, 32, 8, 256, 256, B, "NHD", False),
    (300, 64, 8, 8, 128, 128, H, "NHD", True),  # qo_len > kv_len, group 1
    (300, 511, 16, 16, 192, 128, B, "NHD", True),
    (300, 1000, 28, 4, 128, 128, B, "NHD", True),  # group 7, many tiles
    (300, 1000, 4, 1, 64, 64, H, "HND", False),
    (37, 300, 8, 2, 512, 512, B, "NHD", True),  # head_dim 512
    (1, 64, 4, 4, 512, 512, H, "HND", False),
]


def _case_id(c):
    qo, kv, hq, hkv, dqk, dvo, dtype, layout, causal = c
    dt = "bf16" if dtype is B else "fp16"
    return f"qo{qo}-kv{kv}-h{hq}/{hkv}-d{dqk}/{dvo}-{dt}-{layout}-{'causal' if causal else 'full'}"


@gpu
@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_single_prefill(case):
    qo_len, kv_len, hq, hkv, dqk, dvo, dtype, layout, causal = case
    q, k, v, kr, vr = make_qkv(qo_len, kv_len, hq, hkv, dqk, dvo, dtype, layout)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout, return_lse=True)
    assert o.shape == (qo_len, hq, dvo) and o.dtype == dtype
    assert lse.shape == (qo_len, hq) and lse.dtype == torch.float32
    check(o, lse, *prefill_ref(q, kr, vr, causal=causal))
    o2 = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout)
    assert torch.equal(o2, o), "return_lse must not change o"


# Grids of >= 2 CTAs per SM of 128 packed rows take the kernel with two 16-row M tiles per warp
# (prefill_m_tiles; head dims <= 128); the cases above are all smaller and take one.
@gpu
@pytest.mark.parametrize("qo_len,kv_len,dqk,dtype,layout,causal,extra", [
    (2048, 2048, 128, B, "NHD", True, {}),
    (1100, 1500, 64, H, "HND", False, {}),
    (1056, 2000, 128, H, "NHD", True, {"window_left": 100, "logits_soft_cap": 30.0}),
    (1500, 1500, 128, B, "HND", False, {"pos_encoding_mode": "ALIBI"}),
    (1200, 1300, 64, B, "NHD", True, {"custom_mask": True}),
])
def test_two_m_tile_kernel(qo_len, kv_len, dqk, dtype, layout, causal, extra):
    q, k, v, kr, vr = make_qkv(qo_len, kv_len, 32, 8, dqk, dqk, dtype, layout)
    kw = dict(extra)
    ref_kw = {"causal": causal, "window_left": kw.get("window_left", -1), "soft_cap": kw.get("logits_soft_cap", 0.0),
              "alibi": kw.get("pos_encoding_mode") == "ALIBI"}
    if kw.pop("custom_mask", False):
        mask = torch.rand(qo_len, kv_len, device=CUDA) < 0.5
        kw["custom_mask"] = mask
        ref_kw["mask"] = mask
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout, return_lse=True, **kw)
    check(o, lse, *prefill_ref(q, kr, vr, **ref_kw))


@gpu
@pytest.mark.parametrize("mode", ["default", "reduce-overhead"])
def test_single_prefill_under_torch_compile(mode):
    """Spec 1.6: torch.compile(fullgraph=True) around single prefill (a torch custom op) runs and
    matches the eager call; "reduce-overhead" replays it from a CUDA graph."""
    q, k, v, _, _ = make_qkv(300, 700, 32, 8, 128, 128, B)

    def fn(q, k, v):
        o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
        return o.float() * 2, lse

    compiled = torch.compile(fn, fullgraph=True, mode=mode)
    want = fn(q, k, v)
    for _ in range(3):  # (reduce-overhead records the graph on a later call)
        got = compiled(q, k, v)
        torch.cuda.synchronize()
        assert torch.equal(got[0], want[0]) and torch.equal(got[1], want[1])


def test_custom_op_fake_shapes():
    """The custom op's fake function (what torch.compile traces) gives o [qo, Hq, Dvo] in o_dtype or
    q's dtype, and lse [qo, Hq] (or an empty placeholder without return_lse)."""
    ops = pytest.importorskip("flashinfer._torch_ops")
    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        q = torch.empty(5, 8, 192, dtype=B)
        k = torch.empty(7, 2, 192, dtype=B)
        v = torch.empty(7, 2, 128, dtype=B)
        op = torch.ops.flashinfer.single_prefill_with_kv_cache
        o, lse = op(q, k, v, None, None, True, "NHD", "NONE", None, -1, None, None, None, "auto", True, None, None, None)
        assert o.shape == (5, 8, 128) and o.dtype == B and lse.shape == (5, 8) and lse.dtype == torch.float32
        o, lse = op(q, k, v, None, None, False, "NHD", "NONE", None, -1, None, None, None, "auto", False, None, None,
                    "float16")
        assert o.dtype == H and lse.shape == (0,)
    assert ops.single_prefill is not None


@gpu
@pytest.mark.smoke
def test_single_prefill_smoke():
    test_single_prefill(CASES[8])


@gpu
def test_fully_masked_rows_are_zero_and_lse_minus_inf():
    """Spec 1.6: qo_len=34 > kv_len=1 with causal: the first 33 rows see no key: o == 0 exactly, lse == -inf."""
    q, k, v, _, _ = make_qkv(34, 1, 8, 2, 128, 128, H)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    assert torch.equal(o[:33], torch.zeros_like(o[:33]))
    assert bool(torch.isinf(lse[:33]).all()) and bool((lse[:33] < 0).all())
    check(o, lse, *prefill_ref(q, k, v, causal=True))


@gpu
def test_extreme_scores():
    """Raw scores near -5e5 still give o = v exactly (one key) and the exact LSE."""
    d = 128
    q = torch.full((3, 4, d), 50.0, dtype=H, device=CUDA)
    k = torch.full((1, 4, d), -80.0, dtype=H, device=CUDA)
    v = torch.randn(1, 4, d, dtype=H, device=CUDA)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, sm_scale=1.0, return_lse=True)
    assert torch.equal(o, v.expand(3, 4, d))
    expected = -50.0 * 80.0 * d / math.log(2.0)
    assert torch.allclose(lse.double(), torch.full_like(lse.double(), expected), rtol=1e-5, atol=1e-3)


# --- variants -------------------------------------------------------------------------------------

@gpu
@pytest.mark.parametrize("qo_len,kv_len,window,causal,layout", [
    (127, 511, 17, True, "NHD"),
    (64, 1000, 100, False, "HND"),
    (300, 64, 3, True, "HND"),  # qo_len > kv_len: the window starts before key 0
    (1, 1000, 33, False, "NHD"),
    (64, 64, 0, True, "NHD"),  # only the diagonal
])
def test_sliding_window(qo_len, kv_len, window, causal, layout):
    q, k, v, kr, vr = make_qkv(qo_len, kv_len, 16, 4, 128, 128, B, layout)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout, window_left=window,
                                                     return_lse=True)
    check(o, lse, *prefill_ref(q, kr, vr, causal=causal, window_left=window))


@gpu
def test_window_equals_explicit_mask():
    """Spec 1.6: the sliding window equals the same keys given as a custom mask."""
    qo_len, kv_len, w = 127, 511, 40
    q, k, v, _, _ = make_qkv(qo_len, kv_len, 8, 2, 128, 128, H)
    i = torch.arange(qo_len, device=CUDA)[:, None]
    j = torch.arange(kv_len, device=CUDA)[None, :]
    mask = (j <= i + kv_len - qo_len) & (j >= i + kv_len - qo_len - w)
    o_w = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, window_left=w)
    o_m = flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask)
    assert (o_w.float() - o_m.float()).abs().max().item() <= 1e-3


@gpu
@pytest.mark.parametrize("cap,causal,dtype", [(1.0, True, H), (30.0, False, B), (50.0, True, B)])
def test_soft_cap(cap, causal, dtype):
    q, k, v, kr, vr = make_qkv(127, 511, 32, 8, 128, 128, dtype)
    q = q * 4  # logits large enough for the cap to bend them
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, logits_soft_cap=cap, return_lse=True)
    check(o, lse, *prefill_ref(q, kr, vr, causal=causal, soft_cap=cap))


@gpu
@pytest.mark.parametrize("qo_len,kv_len,hq,hkv,causal,layout", [
    (127, 511, 32, 8, True, "NHD"),
    (64, 1000, 28, 4, False, "HND"),  # 28 heads: the second slope series (H not a power of 2)
    (300, 64, 12, 4, True, "NHD"),  # qo_len > kv_len
])
def test_alibi(qo_len, kv_len, hq, hkv, causal, layout):
    q, k, v, kr, vr = make_qkv(qo_len, kv_len, hq, hkv, 128, 128, H, layout)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout,
                                                     pos_encoding_mode="ALIBI", return_lse=True)
    check(o, lse, *prefill_ref(q, kr, vr, causal=causal, alibi=True))


@gpu
@pytest.mark.parametrize("qo_len,kv_len,causal,layout,dtype,scale,theta", [
    (64, 64, True, "NHD", H, None, None),  # equal lengths: q and k rotated by one call
    (127, 1000, True, "HND", B, None, None),  # q positions 873..999
    (300, 64, True, "NHD", B, None, None),  # qo_len > kv_len: negative q positions
    (7, 511, False, "HND", H, 2.0, 5e5),
    (1, 15, False, "NHD", B, None, None),
])
def test_rope(qo_len, kv_len, causal, layout, dtype, scale, theta):
    q, k, v, kr, vr = make_qkv(qo_len, kv_len, 16, 4, 128, 128, dtype, layout)
    q0, k0 = q.clone(), k.clone()
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=causal, kv_layout=layout,
                                                     pos_encoding_mode="ROPE_LLAMA", rope_scale=scale,
                                                     rope_theta=theta, return_lse=True)
    assert torch.equal(q, q0) and torch.equal(k, k0), "RoPE must not modify the inputs"
    check(o, lse, *prefill_ref(q, kr, vr, causal=causal, rope=True, rope_scale=scale or 1.0,
                               rope_theta=theta or 1e4, rope_dtype=dtype))


# (fp8 dtype, q dtype, layout, causal, qo_len, kv_len, rope)
FP8_CASES = [("float8_e4m3fn", H, "NHD", True, 127, 511, False), ("float8_e5m2", B, "HND", False, 64, 1000, False),
             ("float8_e4m3fn", B, "HND", True, 300, 64, False), ("float8_e5m2", H, "NHD", True, 37, 300, True)]


@gpu
@pytest.mark.parametrize("fp8,dtype,layout,causal,qo_len,kv_len,rope", FP8_CASES)
def test_fp8_kv(fp8, dtype, layout, causal, qo_len, kv_len, rope):
    """fp8 K / V (spec 8.3): the stored values dequantized by a plain cast, k_scale (amax / 256, as
    in FlashInfer's tests) multiplying sm_scale, v_scale o (not the LSE); with RoPE: cast, then
    rotate."""
    q, k, v, _, _ = make_qkv(qo_len, kv_len, 16, 4, 128, 128, dtype, layout)
    ks, vs = k.abs().amax().item() / 256, v.abs().amax().item() / 256
    f8 = getattr(torch, fp8)
    k8, v8 = (k.float() / ks).to(f8), (v.float() / vs).to(f8)
    kr, vr = (x.to(dtype) if layout == "NHD" else x.to(dtype).transpose(0, 1) for x in (k8, v8))
    pos = "ROPE_LLAMA" if rope else "NONE"
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k8, v8, causal=causal, kv_layout=layout, k_scale=ks,
                                                     v_scale=vs, pos_encoding_mode=pos, return_lse=True)
    assert o.dtype == dtype
    check(o, lse, *prefill_ref(q, kr, vr, causal=causal, sm_scale=ks / math.sqrt(128), v_scale=vs, rope=rope,
                               rope_dtype=dtype if rope else None))


@gpu
def test_rope_is_not_applied_without_the_mode():
    """A sanity check of the RoPE test itself: the rotated reference differs from the plain one."""
    q, k, v, _, _ = make_qkv(64, 511, 8, 2, 128, 128, H)
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
    ref_rope, _ = prefill_ref(q, k, v, causal=True, rope=True, rope_dtype=H)
    with pytest.raises(AssertionError):
        assert_prefill_close(o, ref_rope)


@gpu
@pytest.mark.parametrize("mode,name", [(1, "ROPE_LLAMA"), ("rope_enum", "ROPE_LLAMA"), (2, "ALIBI"),
                                       ("alibi_enum", "ALIBI"), (0, "NONE"), ("none_enum", "NONE")])
def test_pos_encoding_mode_forms(mode, name):
    """PosEncodingMode members and their ints mean the same as the strings."""
    from flashinfer.utils import PosEncodingMode

    mode = {"rope_enum": PosEncodingMode.ROPE_LLAMA, "alibi_enum": PosEncodingMode.ALIBI,
            "none_enum": PosEncodingMode.NONE}.get(mode, mode)
    q, k, v, _, _ = make_qkv(64, 100, 8, 2, 64, 64, B)
    got = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, pos_encoding_mode=mode)
    want = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, pos_encoding_mode=name)
    assert torch.equal(got, want)


# --- custom masks -----------------------------------------------------------------------------------

def random_mask(qo_len, kv_len, p=0.5):
    m = torch.rand(qo_len, kv_len, device=CUDA) < p
    if qo_len > 2:
        m[1] = False  # a row with no key
        m[2] = True
    return m


def pack_little(mask):
    """numpy.packbits, little bit order, of the row-major mask (independent of flashinfer.packbits)."""
    return torch.from_numpy(np.packbits(mask.cpu().numpy().ravel(), bitorder="little")).to(CUDA)


@gpu
@pytest.mark.parametrize("qo_len,kv_len,hq,hkv,dqk,dvo,layout,dtype", [
    (127, 511, 32, 8, 128, 128, "NHD", H),
    (7, 15, 28, 4, 64, 64, "HND", B),  # qo_len * kv_len = 105: the last byte partly used
    (300, 1000, 16, 16, 192, 128, "NHD", B),
    (64, 64, 8, 2, 256, 256, "HND", H),
])
def test_custom_mask(qo_len, kv_len, hq, hkv, dqk, dvo, layout, dtype):
    q, k, v, kr, vr = make_qkv(qo_len, kv_len, hq, hkv, dqk, dvo, dtype, layout)
    mask = random_mask(qo_len, kv_len)
    # causal=True is ignored with a mask
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, causal=True, kv_layout=layout,
                                                     return_lse=True)
    check(o, lse, *prefill_ref(q, kr, vr, mask=mask))
    o_p, lse_p = flashinfer.single_prefill_with_kv_cache(q, k, v, packed_custom_mask=pack_little(mask),
                                                         kv_layout=layout, return_lse=True)
    assert torch.equal(o_p, o) and torch.equal(lse_p, lse)


@gpu
def test_packed_mask_wins_over_custom_mask():
    q, k, v, _, _ = make_qkv(64, 511, 8, 2, 128, 128, B)
    mask = random_mask(64, 511)
    everything = torch.ones(64, 511, dtype=torch.bool, device=CUDA)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=everything,
                                                     packed_custom_mask=pack_little(mask), return_lse=True)
    check(o, lse, *prefill_ref(q, k, v, mask=mask))


@gpu
@pytest.mark.parametrize("window", [0, 20])
def test_custom_mask_with_window(window):
    q, k, v, _, _ = make_qkv(127, 1000, 16, 4, 128, 128, H)
    mask = random_mask(127, 1000, p=0.7)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, window_left=window, return_lse=True)
    check(o, lse, *prefill_ref(q, k, v, mask=mask, window_left=window))


@gpu
@pytest.mark.parametrize("qo_len,kv_len", [(127, 511), (300, 64)])
def test_causal_mask_equals_causal(qo_len, kv_len):
    """Spec 1.6: the bottom-right causal mask given explicitly equals causal=True."""
    q, k, v, _, _ = make_qkv(qo_len, kv_len, 16, 4, 128, 128, B)
    mask = torch.ones(qo_len, kv_len, dtype=torch.bool, device=CUDA).tril(kv_len - qo_len)
    o_c, lse_c = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    o_m, lse_m = flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=mask, return_lse=True)
    assert (o_c.float() - o_m.float()).abs().max().item() <= 1e-3
    assert torch.equal(torch.isinf(lse_c), torch.isinf(lse_m))
    fin = ~torch.isinf(lse_c)
    assert (lse_c[fin] - lse_m[fin]).abs().max().item() <= 1e-3


# --- scales, LSE, dtypes, views, frameworks, empty -------------------------------------------------

@gpu
@pytest.mark.parametrize("sm_scale,k_scale,v_scale", [(None, 0.5, 2.0), (0.05, None, 0.25), (0.1, 1.5, None)])
def test_scales(sm_scale, k_scale, v_scale):
    q, k, v, _, _ = make_qkv(64, 511, 16, 4, 128, 128, B)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, sm_scale=sm_scale, k_scale=k_scale,
                                                     v_scale=v_scale, return_lse=True)
    scale = (1 / math.sqrt(128) if sm_scale is None else sm_scale) * (k_scale or 1.0)
    check(o, lse, *prefill_ref(q, k, v, causal=True, sm_scale=scale, v_scale=v_scale or 1.0))


@gpu
def test_return_lse_partial():
    q, k, v, _, _ = make_qkv(127, 511, 8, 2, 128, 128, H)
    o1, lse1 = flashinfer.single_prefill_with_kv_cache_return_lse(q, k, v, causal=True)
    o2, lse2 = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, return_lse=True)
    o3, lse3 = flashinfer.prefill.single_prefill_with_kv_cache_return_lse(q, k, v, causal=True)
    assert torch.equal(o1, o2) and torch.equal(lse1, lse2) and torch.equal(o1, o3) and torch.equal(lse1, lse3)
    check(o1, lse1, *prefill_ref(q, k, v, causal=True))


@gpu
@pytest.mark.parametrize("backend", ["fa2", "fa3"])
def test_backends_agree(backend):
    q, k, v, _, _ = make_qkv(64, 511, 8, 2, 128, 128, B)
    want = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
    got = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, backend=backend, use_fp16_qk_reduction=True)
    assert (got.float() - want.float()).abs().max().item() <= 1e-3


@gpu
@pytest.mark.parametrize("pos", ["NONE", "ROPE_LLAMA"])
def test_strided_views_of_fused_qkv(pos):
    """Spec 1.6: q, k, v as views of one packed QKV buffer (no copies), with and without RoPE; and
    HND k / v whose rows are padded."""
    L, hq, hkv, d = 300, 28, 4, 128
    qkv = torch.randn(L, hq + 2 * hkv, d, dtype=B, device=CUDA)
    q, k, v = qkv[:, :hq], qkv[:, hq:hq + hkv], qkv[:, hq + hkv:]
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, pos_encoding_mode=pos, return_lse=True)
    check(o, lse, *prefill_ref(q, k, v, causal=True, rope=pos == "ROPE_LLAMA", rope_dtype=B))
    # HND views with a padded last dimension: [hkv, kv_len, 2 * d][..., :d]
    kb = torch.randn(hkv, 511, 2 * d, dtype=B, device=CUDA)
    vb = torch.randn(hkv, 511, 2 * d, dtype=B, device=CUDA)
    k2, v2 = kb[..., :d], vb[..., d:]
    q2 = q[:64]
    o2, lse2 = flashinfer.single_prefill_with_kv_cache(q2, k2, v2, causal=True, kv_layout="HND",
                                                       pos_encoding_mode=pos, return_lse=True)
    check(o2, lse2, *prefill_ref(q2, k2.transpose(0, 1), v2.transpose(0, 1), causal=True,
                                 rope=pos == "ROPE_LLAMA", rope_dtype=B))


@gpu
@pytest.mark.parametrize("q_dtype,o_dtype", [(H, B), (B, H), (H, "bfloat16")])
def test_o_dtype(q_dtype, o_dtype):
    q, k, v, _, _ = make_qkv(64, 511, 8, 2, 128, 128, q_dtype)
    want = {"bfloat16": B}.get(o_dtype, o_dtype)
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, o_dtype=o_dtype, return_lse=True)
    assert o.dtype == want and o.shape == (64, 8, 128)
    same = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True)
    assert torch.equal(o, same.to(want))
    check(o, lse, *prefill_ref(q, k, v, causal=True))
    assert flashinfer.single_prefill_with_kv_cache(q, k, v, o_dtype=q_dtype).dtype == q_dtype


@gpu
@pytest.mark.parametrize("layout", ["NHD", "HND"])
def test_empty_queries(layout):
    q, k, v, _, _ = make_qkv(0, 511, 16, 4, 192, 128, B, layout)
    o = flashinfer.single_prefill_with_kv_cache(q, k, v, causal=True, kv_layout=layout)
    assert o.shape == (0, 16, 128) and o.dtype == B and o.device == q.device
    o, lse = flashinfer.single_prefill_with_kv_cache(q, k, v, kv_layout=layout, return_lse=True,
                                                     custom_mask=torch.zeros(0, 511, dtype=torch.bool, device=CUDA),
                                                     pos_encoding_mode="ROPE_LLAMA")
    assert o.shape == (0, 16, 128) and lse.shape == (0, 16) and lse.dtype == torch.float32
    assert flashinfer.single_prefill_with_kv_cache(q, k, v, kv_layout=layout, o_dtype=H).dtype == H


@gpu
def test_cupy_arrays():
    """CuPy q / k / v (DLPack): CuPy outputs, run on CuPy's current stream, the numbers torch gives;
    the RoPE path too."""
    cupy = pytest.importorskip("cupy")
    q, k, v, _, _ = make_qkv(127, 511, 16, 4, 128, 128, H, "HND")
    mask = random_mask(127, 511)
    want = [flashinfer.single_prefill_with_kv_cache(q, k, v, kv_layout="HND", causal=True, return_lse=True),
            flashinfer.single_prefill_with_kv_cache(q, k, v, kv_layout="HND", pos_encoding_mode="ROPE_LLAMA",
                                                    causal=True, return_lse=True),
            flashinfer.single_prefill_with_kv_cache(q, k, v, kv_layout="HND", custom_mask=mask, return_lse=True)]
    torch.cuda.synchronize()
    qc, kc, vc, mc = (cupy.from_dlpack(t) for t in (q, k, v, mask))
    stream = cupy.cuda.Stream(non_blocking=True)
    with stream:
        got = [flashinfer.single_prefill_with_kv_cache(qc, kc, vc, kv_layout="HND", causal=True, return_lse=True),
               flashinfer.single_prefill_with_kv_cache(qc, kc, vc, kv_layout="HND", pos_encoding_mode="ROPE_LLAMA",
                                                       causal=True, return_lse=True),
               flashinfer.single_prefill_with_kv_cache(qc, kc, vc, kv_layout="HND", custom_mask=mc, return_lse=True)]
    stream.synchronize()
    for (o_w, lse_w), (o_g, lse_g) in zip(want, got):
        assert isinstance(o_g, cupy.ndarray) and isinstance(lse_g, cupy.ndarray)
        assert torch.equal(torch.from_dlpack(o_g), o_w) and torch.equal(torch.from_dlpack(lse_g), lse_w)
    with pytest.raises(ValueError, match="torch tensors only"):
        flashinfer.single_prefill_with_kv_cache(qc, kc, vc, kv_layout="HND", o_dtype="bfloat16")


# --- argument checks (CPU: the binding checks shapes and dtypes before the device) -----------------

OP = "single_prefill_with_kv_cache"


def cpu_qkv(qo_len=4, kv_len=16, hq=8, hkv=2, dqk=128, dvo=128, dtype=H, layout="NHD"):
    q = torch.randn(qo_len, hq, dqk).to(dtype)
    shape_k = (kv_len, hkv, dqk) if layout == "NHD" else (hkv, kv_len, dqk)
    shape_v = (kv_len, hkv, dvo) if layout == "NHD" else (hkv, kv_len, dvo)
    return q, torch.randn(shape_k).to(dtype), torch.randn(shape_v).to(dtype)


def test_cpu_tensors_are_rejected_naming_cuda():
    q, k, v = cpu_qkv()
    with pytest.raises(ValueError, match="CUDA"):
        flashinfer.single_prefill_with_kv_cache(q, k, v)


@pytest.mark.parametrize("bad", [torch.float32, torch.float64, torch.int32])
def test_q_dtype(bad):
    q, k, v = cpu_qkv()
    with pytest.raises(ValueError, match=f"^{OP}: q.dtype must be float16 or bfloat16; got {str(bad)[6:]}$"):
        flashinfer.single_prefill_with_kv_cache(q.to(bad), k, v)


@pytest.mark.parametrize("arg,want", [("k", "bfloat16 \\(q's dtype\\), float8_e4m3fn or float8_e5m2"),
                                      ("v", "bfloat16 \\(q's dtype\\)")])
def test_kv_dtype_must_equal_q(arg, want):
    q, k, v = cpu_qkv(dtype=B)
    args = dict(q=q, k=k, v=v)
    args[arg] = args[arg].to(H)
    with pytest.raises(ValueError, match=f"^{OP}: {arg}.dtype must be {want}; got float16$"):
        flashinfer.single_prefill_with_kv_cache(**args)


@pytest.mark.parametrize("arg", ["q", "k", "v"])
def test_ndim(arg):
    q, k, v = cpu_qkv()
    args = dict(q=q, k=k, v=v)
    args[arg] = args[arg][0]
    with pytest.raises(ValueError, match=f"^{OP}: {arg} must be 3-D"):
        flashinfer.single_prefill_with_kv_cache(**args)


@pytest.mark.parametrize("hq,hkv,layout", [(8, 3, "NHD"), (7, 2, "HND"), (4, 8, "NHD")])
def test_head_counts(hq, hkv, layout):
    q, k, v = cpu_qkv(hq=hq, hkv=hkv, layout=layout)
    with pytest.raises(ValueError, match=f"num_qo_heads \\({hq}, q.shape\\[1\\]\\) must be a multiple of "
                                         f"num_kv_heads \\({hkv}"):
        flashinfer.single_prefill_with_kv_cache(q, k, v, kv_layout=layout)


@pytest.mark.parametrize("dqk,dvo", [(96, 96), (576, 512), (128, 64), (192, 192), (32, 32)])
def test_unsupported_head_dims(dqk, dvo):
    """The binding names head_dim (before the device check, so CPU tensors reach it)."""
    q, k, v = cpu_qkv(dqk=dqk, dvo=dvo)
    with pytest.raises(ValueError, match="head_dim"):
        flashinfer.single_prefill_with_kv_cache(q, k, v)


@pytest.mark.parametrize("layout", ["nhd", "NDH", "", 0])
def test_bad_kv_layout(layout):
    q, k, v = cpu_qkv()
    with pytest.raises(KeyError):
        flashinfer.single_prefill_with_kv_cache(q, k, v, kv_layout=layout)


@pytest.mark.parametrize("mode", ["ROPE", "rope_llama", "LLAMA31", 3, -1])
def test_bad_pos_encoding_mode(mode):
    q, k, v = cpu_qkv()
    with pytest.raises(KeyError):
        flashinfer.single_prefill_with_kv_cache(q, k, v, pos_encoding_mode=mode)


@pytest.mark.parametrize("backend", ["cudnn", "trtllm-gen", "cute-dsl", "cutlass", "fa4"])
def test_unsupported_backend(backend):
    q, k, v = cpu_qkv()
    with pytest.raises(NotImplementedError, match="backend"):
        flashinfer.single_prefill_with_kv_cache(q, k, v, backend=backend)


@pytest.mark.parametrize("fp8", ["float8_e4m3fn", "float8_e5m2"])
def test_fp8_q_is_not_implemented_and_kv_must_match(fp8):
    """fp8 q: NotImplementedError; fp8 k / v: both of one fp8 dtype (else ValueError naming the
    argument)."""
    q, k, v = cpu_qkv()
    f8 = getattr(torch, fp8)
    with pytest.raises(NotImplementedError, match="fp8 q"):
        flashinfer.single_prefill_with_kv_cache(q.to(f8), k, v)
    with pytest.raises(ValueError, match=f"^{OP}: v.dtype must be {fp8} \\(k's dtype\\); got float16$"):
        flashinfer.single_prefill_with_kv_cache(q, k.to(f8), v)
    with pytest.raises(ValueError, match=f"^{OP}: v.dtype must be float16 \\(q's dtype\\); got {fp8}$"):
        flashinfer.single_prefill_with_kv_cache(q, k, v.to(f8))
    with pytest.raises(ValueError, match=f"^{OP}: k.dtype must be float16 \\(q's dtype\\), float8_e4m3fn or "
                                         "float8_e5m2; got bfloat16$"):
        flashinfer.single_prefill_with_kv_cache(q, k.to(B), v.to(B))


@pytest.mark.parametrize("fp8,layout,pos", [("float8_e4m3fn", "NHD", "NONE"), ("float8_e5m2", "HND", "ROPE_LLAMA")])
def test_fp8_kv_reaches_the_kernel_as_exact_casts(monkeypatch, fp8, layout, pos):
    """fp8 k / v are cast to q's dtype (exactly) before the 16-bit kernel (the binding replaced by
    a recorder); k_scale multiplies sm_scale and v_scale is the output factor."""
    import flashinfer.prefill as fprefill
    import flashinfer.rope as frope

    seen = {}

    def single_prefill(q, k, v, out, lse, mask, kv_layout, causal, window_left, sm_scale, soft_cap, alibi, v_scale,
                       stream, pdl):
        seen.update(k=torch.from_dlpack(k), v=torch.from_dlpack(v), sm_scale=sm_scale, v_scale=v_scale)

    def rope(q, k, pos_ids, rotary_dim=None, interleave=False, rope_scale=1, rope_theta=1e4):
        return q.clone(), k.clone()  # (positions and rotation are test_rope's on the GPU)

    monkeypatch.setattr(fprefill, "_prefill", SimpleNamespace(single_prefill=single_prefill))
    monkeypatch.setattr(frope, "apply_rope_pos_ids", rope)
    q, k, v = cpu_qkv(dtype=B, layout=layout)
    f8 = getattr(torch, fp8)
    k8, v8 = k.to(f8), v.to(f8)
    fprefill._single_prefill(q, k8, v8, kv_layout=layout, pos_encoding_mode=pos, k_scale=0.25, v_scale=3.0)
    assert seen["k"].dtype == B and torch.equal(seen["k"], k8.to(B)) and torch.equal(seen["v"], v8.to(B))
    assert seen["k"].float().equal(k8.float())  # the cast is exact
    assert math.isclose(seen["sm_scale"], 0.25 / math.sqrt(128)) and seen["v_scale"] == 3.0


@pytest.mark.parametrize("arg", ["scale_q", "scale_k", "scale_v", "kv_cache_sf"])
def test_fp8_scales_and_nvfp4_are_not_implemented(arg):
    q, k, v = cpu_qkv()
    with pytest.raises(NotImplementedError, match=arg):
        flashinfer.single_prefill_with_kv_cache(q, k, v, **{arg: torch.ones(8)})


def test_custom_mask_size():
    q, k, v = cpu_qkv(qo_len=4, kv_len=16)
    with pytest.raises(ValueError, match=r"custom_mask must be \[qo_len, kv_len\] = \[4, 16\]; got shape \(4, 15\)"):
        flashinfer.single_prefill_with_kv_cache(q, k, v, custom_mask=torch.ones(4, 15, dtype=torch.bool))


@pytest.mark.parametrize("o_dtype", [torch.float32, "float8_e4m3fn", torch.int8])
def test_bad_o_dtype(o_dtype):
    q, k, v = cpu_qkv()
    with pytest.raises(ValueError, match="o_dtype must be float16 or bfloat16"):
        flashinfer.single_prefill_with_kv_cache(q, k, v, o_dtype=o_dtype)


@pytest.mark.parametrize("cap", [-1.0, float("inf"), float("nan")])
def test_bad_soft_cap(cap):
    q, k, v = cpu_qkv()
    with pytest.raises(ValueError, match="logits_soft_cap"):
        flashinfer.single_prefill_with_kv_cache(q, k, v, logits_soft_cap=cap)


@pytest.mark.parametrize("arg,value", [("rope_scale", 0.0), ("rope_theta", -1.0), ("rope_scale", float("nan"))])
def test_bad_rope_parameters(arg, value):
    q, k, v = cpu_qkv()
    with pytest.raises(ValueError, match=arg):
        flashinfer.single_prefill_with_kv_cache(q, k, v, pos_encoding_mode="ROPE_LLAMA", **{arg: value})


# --- module surface ---------------------------------------------------------------------------------

def test_module_surface():
    import flashinfer.prefill as prefill

    assert flashinfer.single_prefill_with_kv_cache is prefill.single_prefill_with_kv_cache
    assert flashinfer.single_prefill_with_kv_cache_return_lse is prefill.single_prefill_with_kv_cache_return_lse
    assert prefill.single_prefill_with_kv_cache_return_lse.keywords == {"return_lse": True}
    assert "prefill" in flashinfer.__all__ and "single_prefill_with_kv_cache" in flashinfer.__all__
    with pytest.raises(NotImplementedError):
        prefill.trtllm_batch_context_with_kv_cache()


def test_signature_matches_the_spec():
    """Spec 1.2: names, order and defaults (callers pass options positionally)."""
    sig = inspect.signature(flashinfer.single_prefill_with_kv_cache)
    want = [("q", inspect.Parameter.empty), ("k", inspect.Parameter.empty), ("v", inspect.Parameter.empty),
            ("scale_q", None), ("scale_k", None), ("scale_v", None), ("o_dtype", None), ("custom_mask", None),
            ("packed_custom_mask", None), ("causal", False), ("kv_layout", "NHD"), ("pos_encoding_mode", "NONE"),
            ("use_fp16_qk_reduction", False), ("sm_scale", None), ("window_left", -1), ("logits_soft_cap", None),
            ("rope_scale", None), ("rope_theta", None), ("backend", "auto"), ("return_lse", False),
            ("kv_cache_sf", None), ("k_scale", None), ("v_scale", None)]
    assert [(p.name, p.default) for p in sig.parameters.values()] == want


# --- the reference and the comparison (CPU) --------------------------------------------------------

def test_alibi_slopes():
    assert alibi_slopes(8).tolist() == [2.0 ** -k for k in range(1, 9)]
    want12 = [2.0 ** -k for k in range(1, 9)] + [2.0 ** (-4 * (2 * k - 1) / 8) for k in range(1, 5)]
    assert alibi_slopes(12).tolist() == pytest.approx(want12, rel=1e-15)


@pytest.mark.parametrize("opts", [
    dict(causal=True), dict(causal=False), dict(causal=True, window_left=2), dict(window_left=0),
    dict(soft_cap=2.0, causal=True), dict(alibi=True, causal=True), dict(alibi=True), dict(mask="random"),
    dict(mask="random", window_left=3), dict(sm_scale=0.3, causal=True)])
@pytest.mark.parametrize("qo_len,kv_len", [(5, 9), (9, 5), (4, 4)])
def test_reference_matches_the_scalar_definition(opts, qo_len, kv_len):
    hq, hkv, d = 6, 2, 8  # group 3; 6 heads: both ALiBi slope series
    q, k, v = (torch.randn(qo_len, hq, d, dtype=torch.float64), torch.randn(kv_len, hkv, d, dtype=torch.float64),
               torch.randn(kv_len, hkv, d + 4, dtype=torch.float64))
    opts = dict(opts)
    if opts.get("mask") == "random":
        opts["mask"] = torch.rand(qo_len, kv_len) < 0.5
        opts["mask"][0] = False
    o, lse = prefill_ref(q, k, v, **opts)
    so, slse = prefill_scalar_ref(q, k, v, **opts)
    assert torch.equal(torch.isinf(lse), torch.isinf(slse))
    fin = ~torch.isinf(slse)
    assert torch.allclose(lse[fin], slse[fin], rtol=1e-12, atol=1e-12)
    assert torch.allclose(o, so, rtol=1e-10, atol=1e-12)
    assert torch.equal(o[torch.isinf(lse)], torch.zeros_like(o[torch.isinf(lse)]))


@pytest.mark.parametrize("qo_len,kv_len,causal", [(64, 64, True), (32, 100, False), (1, 17, False)])
def test_reference_matches_sdpa(qo_len, kv_len, causal):
    F = torch.nn.functional
    hq, hkv, d = 8, 2, 32
    q = torch.randn(qo_len, hq, d, dtype=torch.float64)
    k = torch.randn(kv_len, hkv, d, dtype=torch.float64)
    v = torch.randn(kv_len, hkv, d, dtype=torch.float64)
    o, lse = prefill_ref(q, k, v, causal=causal)
    want = F.scaled_dot_product_attention(q.transpose(0, 1), k.transpose(0, 1), v.transpose(0, 1), is_causal=causal,
                                          enable_gqa=True).transpose(0, 1)
    assert torch.allclose(o, want, rtol=1e-10, atol=1e-12)
    s = torch.einsum("ihd,jhd->hij", q, k.repeat_interleave(hq // hkv, 1)) / math.sqrt(d)
    if causal:
        s = s.masked_fill(torch.ones(qo_len, kv_len, dtype=torch.bool).tril(kv_len - qo_len).logical_not(), -math.inf)
    assert torch.allclose(lse, (torch.logsumexp(s, -1) * math.log2(math.e)).transpose(0, 1), rtol=1e-12)


def _as_kernel_output(o, dtype=torch.bfloat16):
    return o.to(dtype)


@pytest.mark.parametrize("bug", ["window_off_by_one", "causal_top_left", "causal_off_by_one", "no_k_scale",
                                 "v_scale_on_lse", "wrong_gqa_head", "alibi_absolute_row", "soft_cap_before_scale",
                                 "mask_big_endian", "rope_query_position", "lse_natural_log", "nan_for_empty_rows"])
def test_comparison_catches_wrong_kernels(bug):
    """A correct result rounded to bf16 passes the comparison; a result with a typical prefill bug
    does not (in o or in the LSE)."""
    qo_len, kv_len, hq, hkv, d = 40, 130, 8, 2, 64
    if bug == "nan_for_empty_rows":
        qo_len = kv_len + 10  # causal: the first 10 rows see no key
    q = torch.randn(qo_len, hq, d).to(torch.bfloat16)
    k = torch.randn(kv_len, hkv, d).to(torch.bfloat16)
    v = torch.randn(kv_len, hkv, d).to(torch.bfloat16)
    mask = torch.rand(qo_len, kv_len) < 0.5
    sm = 1 / math.sqrt(d)
    opts = {
        "window_off_by_one": dict(causal=True, window_left=5),
        "no_k_scale": dict(causal=True, sm_scale=sm * 0.5),
        "v_scale_on_lse": dict(v_scale=0.5),
        "alibi_absolute_row": dict(alibi=True, causal=True),
        "soft_cap_before_scale": dict(soft_cap=1.0),
        "mask_big_endian": dict(mask=mask),
        "rope_query_position": dict(rope=True, causal=True),
    }.get(bug, dict(causal=True))
    ref_o, ref_lse = prefill_ref(q, k, v, **opts)
    assert_prefill_close(_as_kernel_output(ref_o), ref_o, empty_rows=torch.isinf(ref_lse))
    assert_prefill_lse_close(ref_lse.float(), ref_lse)

    bad_o, bad_lse = ref_o, ref_lse
    ones = torch.ones(qo_len, kv_len, dtype=torch.bool)
    if bug == "window_off_by_one":
        bad_o, bad_lse = prefill_ref(q, k, v, causal=True, window_left=6)
    elif bug == "causal_top_left":
        bad_o, bad_lse = prefill_ref(q, k, v, mask=ones.tril(0))
    elif bug == "causal_off_by_one":
        bad_o, bad_lse = prefill_ref(q, k, v, mask=ones.tril(kv_len - qo_len + 1))
    elif bug == "no_k_scale":
        bad_o, bad_lse = prefill_ref(q, k, v, causal=True, sm_scale=sm)
    elif bug == "v_scale_on_lse":
        bad_lse = ref_lse + math.log2(0.5)
    elif bug == "wrong_gqa_head":  # q head h reading kv head h % num_kv_heads instead of h // group
        perm = torch.arange(hq).view(hq // hkv, hkv).t().reshape(-1)
        inv = torch.argsort(perm)
        bad_o, bad_lse = prefill_ref(q[:, perm], k, v, causal=True)
        bad_o, bad_lse = bad_o[:, inv], bad_lse[:, inv]
    elif bug == "alibi_absolute_row":  # slope * (j - (i + kv_len - qo_len)): same o, LSE off (spec 10.3)
        bad_lse = ref_lse - alibi_slopes(hq)[None, :] * (kv_len - qo_len) / math.log(2.0)
    elif bug == "soft_cap_before_scale":  # sm_scale * cap * tanh(x / cap)
        bad_o, bad_lse = prefill_ref(q, k, v, soft_cap=sm * 1.0, sm_scale=sm)
    elif bug == "mask_big_endian":
        bits = np.unpackbits(np.packbits(mask.numpy().ravel(), bitorder="little"), bitorder="big")
        bad_mask = torch.from_numpy(bits[:qo_len * kv_len].astype(bool)).view(qo_len, kv_len)
        bad_o, bad_lse = prefill_ref(q, k, v, mask=bad_mask)
    elif bug == "rope_query_position":  # query i rotated at position i instead of i + kv_len - qo_len
        from reference_attention import rope_rotate_half

        q_rot = rope_rotate_half(q.double().transpose(0, 1), torch.arange(qo_len), 1.0, 1e4).transpose(0, 1)
        k_rot = rope_rotate_half(k.double().transpose(0, 1), torch.arange(kv_len), 1.0, 1e4).transpose(0, 1)
        bad_o, bad_lse = prefill_ref(q_rot, k_rot, v, causal=True)
    elif bug == "lse_natural_log":
        bad_lse = ref_lse * math.log(2.0)
    elif bug == "nan_for_empty_rows":
        bad_o = ref_o.clone()
        bad_o[torch.isinf(ref_lse)] = float("nan")
    caught = []
    for what, fn in (("o", lambda: assert_prefill_close(_as_kernel_output(bad_o), ref_o,
                                                        empty_rows=torch.isinf(ref_lse))),
                     ("lse", lambda: assert_prefill_lse_close(bad_lse.float(), ref_lse))):
        try:
            fn()
        except AssertionError:
            caught.append(what)
    assert caught, f"the comparison did not catch {bug}"
