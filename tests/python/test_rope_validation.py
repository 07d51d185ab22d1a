"""flashinfer.rope argument validation, on the CPU (no GPU needed), plus CPU checks of the
RoPE references themselves.

The binding checks shapes, dtypes, strides and scalars before the device, so CPU tensors reach
every check; valid CPU arguments end in "must be a CUDA tensor". Messages name the function,
the argument, the expectation and the value; cos_sin_cache's dtype error is FlashInfer's own
"cos_sin_cache should be float32".
"""

from __future__ import annotations

import math
import re

import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
import reference_rope as ref  # noqa: E402

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

INDPTR_FNS = ("apply_rope", "apply_rope_inplace", "apply_llama31_rope", "apply_llama31_rope_inplace")
POS_FNS = ("apply_rope_pos_ids", "apply_rope_pos_ids_inplace", "apply_llama31_rope_pos_ids",
           "apply_llama31_rope_pos_ids_inplace")
CACHE_FNS = ("apply_rope_with_cos_sin_cache", "apply_rope_with_cos_sin_cache_inplace")


def qk(nnz=6, hq=4, hk=2, d=64, dtype=F16):
    return torch.randn(nnz, hq, d, dtype=dtype), torch.randn(nnz, hk, d, dtype=dtype)


def indptr_args(nnz=6, dtype=torch.int32):
    return torch.tensor([0, 2, nnz], dtype=dtype), torch.tensor([0, 5], dtype=dtype)


def call(name, q, k, **kw):
    if name in INDPTR_FNS:
        indptr, offsets = kw.pop("indptr", None), kw.pop("offsets", None)
        if indptr is None:
            indptr, offsets = indptr_args(q.shape[0])
        return getattr(flashinfer, name)(q, k, indptr, offsets, **kw)
    pos = kw.pop("pos_ids", None)
    if pos is None:
        pos = torch.arange(q.shape[0], dtype=torch.int32)
    return getattr(flashinfer, name)(q, k, pos, **kw)


def raises(name, message, exc=ValueError):
    return pytest.raises(exc, match="^" + re.escape(f"{name}: {message}"))


ALL = INDPTR_FNS + POS_FNS


# --- q / k ----------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_valid_cpu_arguments_reach_the_device_check(name):
    q, k = qk()
    with raises(name, "q must be a CUDA tensor; got a tensor on device type cpu"):
        call(name, q, k)


@pytest.mark.parametrize("name", ALL)
def test_q_must_be_3d(name):
    q, k = qk()
    with raises(name, "q must be 3-D [nnz, num_q_heads, head_dim]; got a 2-D tensor of shape (6, 256)"):
        call(name, q.flatten(1), k)


@pytest.mark.parametrize("name", ALL)
def test_q_dtype(name):
    q, k = qk(dtype=F32)
    with raises(name, "q.dtype must be float16 or bfloat16; got float32"):
        call(name, q, k)


@pytest.mark.parametrize("name", ALL)
def test_q_last_dim_contiguous(name):
    q, k = qk()
    q = torch.randn(6, 4, 128, dtype=F16)[..., ::2]
    with raises(name, "q must be contiguous in its last dimension (stride 1); got stride 2"):
        call(name, q, k)


@pytest.mark.parametrize("name", ALL)
def test_k_must_match_q(name):
    q, _ = qk()
    with raises(name, "k.dtype must be float16; got bfloat16"):
        call(name, q, torch.randn(6, 2, 64, dtype=BF16))
    with raises(name, "k.shape[0] must equal q.shape[0] (nnz) (6); got 5"):
        call(name, q, torch.randn(5, 2, 64, dtype=F16))
    with raises(name, "k.shape[2] must equal q.shape[2] (head_dim) (64); got 128"):
        call(name, q, torch.randn(6, 2, 128, dtype=F16))
    with raises(name, "k must be 3-D [nnz, num_k_heads, head_dim]; got a 2-D tensor of shape (6, 64)"):
        call(name, q, torch.randn(6, 64, dtype=F16))


@pytest.mark.parametrize("name", [n for n in ALL if n.endswith("_inplace")])
@pytest.mark.parametrize("which", ["q", "k"])
def test_in_place_q_k_with_overlapping_rows_are_rejected(name, which):
    """q and k are written in place: an expand()ed one would have its rows' writes race."""
    q, k = qk()
    t = q if which == "q" else k
    t = t[:1].expand(t.shape)
    args = (t, k) if which == "q" else (q, t)
    with pytest.raises(ValueError, match=f"^{name}: the rows of {which} must not overlap"):
        call(name, *args)


def test_fused_qkv_views_pass_the_overlap_checks():
    """q and k as views of one packed QKV buffer share memory without sharing elements: only the
    device check fires (CPU tensors)."""
    qkv = torch.randn(6, (4 + 2 + 2) * 64, dtype=F16)
    q, k = qkv[:, :256].view(6, 4, 64), qkv[:, 256:384].view(6, 2, 64)
    with raises("apply_rope_pos_ids_inplace", "q must be a CUDA tensor"):
        call("apply_rope_pos_ids_inplace", q, k)
    with raises("apply_rope_with_cos_sin_cache_inplace", "query must be a CUDA tensor"):
        flashinfer.apply_rope_with_cos_sin_cache_inplace(torch.arange(6), qkv[:, :256], qkv[:, 256:384], 64,
                                                         torch.randn(16, 64))


@pytest.mark.parametrize("name", [n for n in ALL if n.endswith("_inplace")])
def test_in_place_q_and_k_must_not_share_memory(name):
    """Both are rotated in place: k aliasing q (or a head of it) would be rotated twice, racing."""
    q, _ = qk()
    qkv = torch.randn(6, 8 * 64, dtype=F16)
    fused_q = qkv[:, :256].view(6, 4, 64)
    shifted_k = qkv[:, 192:320].view(6, 2, 64)  # its first head is q's last
    for qq, k in ((q, q), (q, q[:, :1]), (fused_q, shifted_k)):
        with raises(name, "k must not overlap q in memory (both are rotated in place)") as info:
            call(name, qq, k)
        assert "strides" in str(info.value)


def test_per_head_interleaved_qkv_views_pass_the_overlap_check():
    """A [N, H, 3d] buffer (each head's q, k, v side by side, as GPT-NeoX lays it out): q and k
    interleave token by token and head by head without sharing an element."""
    qkv = torch.randn(6, 4, 3 * 64, dtype=F16)
    with raises("apply_rope_pos_ids_inplace", "q must be a CUDA tensor"):
        call("apply_rope_pos_ids_inplace", qkv[..., :64], qkv[..., 64:128])
    with raises("apply_rope_pos_ids_inplace", "k must not overlap q in memory"):  # k one feature into q
        call("apply_rope_pos_ids_inplace", qkv[..., :64], qkv[..., 63:127])


def test_in_place_query_and_key_must_not_share_memory():
    qkv = torch.randn(6, 8 * 64, dtype=F16)
    with raises("apply_rope_with_cos_sin_cache_inplace", "key must not overlap query in memory"):
        flashinfer.apply_rope_with_cos_sin_cache_inplace(torch.arange(6), qkv[:, :256], qkv[:, 128:256], 64,
                                                         torch.randn(16, 64))


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("rotary_dim", (63, 66, 0, -2, 1))
def test_rotary_dim_must_be_even_and_at_most_head_dim(name, rotary_dim):
    q, k = qk()
    with raises(name, f"rotary_dim must be a positive even number <= head_dim (64); got {rotary_dim}"):
        call(name, q, k, rotary_dim=rotary_dim)


@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("rotary_dim", (2, 16, 34, 64))
def test_rotary_dim_accepted(name, rotary_dim):
    q, k = qk()
    with raises(name, "q must be a CUDA tensor"):
        call(name, q, k, rotary_dim=rotary_dim)


# --- positions ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", POS_FNS)
def test_pos_ids(name):
    q, k = qk()
    with raises(name, "pos_ids.dtype must be int32 or int64; got float32"):
        call(name, q, k, pos_ids=torch.zeros(6))
    with raises(name, "pos_ids must be 1-D; got a 2-D tensor of shape (6, 1)"):
        call(name, q, k, pos_ids=torch.zeros(6, 1, dtype=torch.int32))
    with raises(name, "pos_ids.shape[0] must equal q.shape[0] (nnz) (6); got 7"):
        call(name, q, k, pos_ids=torch.zeros(7, dtype=torch.int64))
    with raises(name, "pos_ids must be contiguous; got stride 2"):
        call(name, q, k, pos_ids=torch.zeros(12, dtype=torch.int32)[::2])
    with raises(name, "q must be a CUDA tensor"):  # int64 is accepted
        call(name, q, k, pos_ids=torch.zeros(6, dtype=torch.int64))


@pytest.mark.parametrize("name", INDPTR_FNS)
def test_indptr_and_offsets(name):
    q, k = qk()
    with raises(name, "indptr.dtype must be int32 or int64; got float32"):
        call(name, q, k, indptr=torch.tensor([0.0, 6.0]), offsets=torch.tensor([0.0]))
    with raises(name, "offsets.dtype must be int32; got int64"):
        call(name, q, k, indptr=torch.tensor([0, 6], dtype=torch.int32), offsets=torch.tensor([0]))
    with raises(name, "offsets.shape[0] must equal indptr.shape[0] - 1 (batch_size) (2); got 1"):
        call(name, q, k, indptr=torch.tensor([0, 3, 6], dtype=torch.int32),
             offsets=torch.tensor([0], dtype=torch.int32))
    with raises(name, "indptr must have batch_size + 1 >= 1 elements; got 0"):
        call(name, q, k, indptr=torch.zeros(0, dtype=torch.int32), offsets=torch.zeros(0, dtype=torch.int32))
    with raises(name, "indptr must be 1-D [batch_size + 1]; got a 2-D tensor of shape (1, 2)"):
        call(name, q, k, indptr=torch.tensor([[0, 6]], dtype=torch.int32), offsets=torch.tensor([0], dtype=torch.int32))
    with raises(name, "q must be a CUDA tensor"):  # int64 pairs are accepted
        call(name, q, k, indptr=torch.tensor([0, 6]), offsets=torch.tensor([3]))


# --- scalars --------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_rope_scale_and_theta_must_be_positive(name):
    q, k = qk()
    with raises(name, "rope_scale must be a positive finite number; got 0.000000"):
        call(name, q, k, rope_scale=0)
    with raises(name, "rope_scale must be a positive finite number; got -1.000000"):
        call(name, q, k, rope_scale=-1.0)
    with raises(name, "rope_theta must be a positive finite number; got 0.000000"):
        call(name, q, k, rope_theta=0.0)
    with raises(name, "rope_theta must be a positive finite number; got nan"):
        call(name, q, k, rope_theta=float("nan"))


@pytest.mark.parametrize("name", ALL)
def test_scalars_of_another_type_are_type_errors_naming_them(name):
    """(not nanobind's message listing the binding's signature)"""
    q, k = qk()
    cases = [("rotary_dim", 64.0, "an integer (int64) or None; got float 64.0"),
             ("rotary_dim", 2**70, f"an integer (int64) or None; got int {2**70}"),
             ("interleave", 1, "a bool; got int 1"), ("interleave", None, "a bool; got NoneType"),
             ("rope_scale", "8", "a real number; got str"), ("rope_theta", None, "a real number; got NoneType")]
    if "llama31" in name:
        cases += [("low_freq_factor", None, "a real number; got NoneType"),
                  ("old_context_len", "8192", "a real number; got str")]
    for arg, value, want in cases:
        with pytest.raises(TypeError, match="^" + re.escape(f"{arg} must be {want}") + "$"):
            call(name, q, k, **{arg: value})


@pytest.mark.parametrize("name", CACHE_FNS)
def test_cos_sin_cache_scalars_of_another_type_are_type_errors_naming_them(name):
    for arg, value, want in (("head_size", 64.0, "an integer (int64); got float 64.0"),
                             ("head_size", None, "an integer (int64); got NoneType"),
                             ("is_neox", None, "a bool; got NoneType"), ("is_neox", 0, "a bool; got int 0")):
        a = cache_args()
        a[arg] = value
        with pytest.raises(TypeError, match="^" + re.escape(f"{arg} must be {want}") + "$"):
            getattr(flashinfer, name)(**a)


@pytest.mark.parametrize("name", ALL)
def test_frequencies_must_fit_float32(name):
    """The kernels take the inverse frequencies as float32: a rope_scale or rope_theta that puts
    them beyond it would make every angle inf (NaN rows) without a word."""
    q, k = qk()  # head_dim 64: f_last = theta^(-62/64)
    with raises(name, "rope_theta 1 and rope_scale 1e-39 give inverse frequencies up to 1e+39, beyond float32"):
        call(name, q, k, rope_theta=1.0, rope_scale=1e-39)
    with raises(name, "rope_theta 1e-300 and rope_scale 1 give inverse frequencies up to 4.21697e+290, beyond float32"):
        call(name, q, k, rope_theta=1e-300, rope_scale=1.0)
    with raises(name, "q must be a CUDA tensor"):  # small but representable
        call(name, q, k, rope_theta=0.5, rope_scale=1e-30)


@pytest.mark.parametrize("name", [n for n in ALL if "llama31" in n])
def test_llama31_factors(name):
    q, k = qk()
    with raises(name, "high_freq_factor (1.000000) must be greater than low_freq_factor (1.000000)"):
        call(name, q, k, low_freq_factor=1.0, high_freq_factor=1.0)
    with raises(name, "high_freq_factor (2.000000) must be greater than low_freq_factor (4.000000)"):
        call(name, q, k, low_freq_factor=4.0, high_freq_factor=2.0)
    # values that would turn the frequencies into inf / NaN (every output NaN) or silently into
    # plain RoPE (old_context_len <= 0)
    for low in (0.0, -1.0, float("-inf"), float("nan")):
        with raises(name, f"low_freq_factor must be a positive finite number; got {low:f}"):
            call(name, q, k, low_freq_factor=low)
    with raises(name, "high_freq_factor must be a finite number; got inf"):
        call(name, q, k, high_freq_factor=float("inf"))
    for old in (0.0, -8192.0, float("nan"), float("inf")):
        with raises(name, f"old_context_len must be a positive finite number; got {old:f}"):
            call(name, q, k, old_context_len=old)
    with raises(name, "q must be a CUDA tensor"):  # valid factors reach the device check
        call(name, q, k, low_freq_factor=2.0, high_freq_factor=8.0, old_context_len=4096)


def test_non_tensor_is_a_type_error():
    with pytest.raises(TypeError, match="^q must be a tensor supporting DLPack"):
        flashinfer.apply_rope_pos_ids([1.0], [1.0], [0])


def rope_tensor_args(name):
    """(positional argument names, values) of a valid CPU call of ``name``."""
    if name in CACHE_FNS:
        a = cache_args()
        return ["positions", "query", "key", "cos_sin_cache"], a
    q, k = qk()
    if name in INDPTR_FNS:
        indptr, offsets = indptr_args()
        return ["q", "k", "indptr", "offsets"], dict(q=q, k=k, indptr=indptr, offsets=offsets)
    return ["q", "k", "pos_ids"], dict(q=q, k=k, pos_ids=torch.arange(6, dtype=torch.int32))


@pytest.mark.parametrize("name", ALL + CACHE_FNS)
@pytest.mark.parametrize("value", [[0, 1], 3.5, None])
def test_every_non_tensor_argument_is_a_type_error_naming_it(name, value):
    # the tensors of a call go to the binding as they are when they all share the first one's
    # type (torch with DLPack's C exchange table); any other argument is exported by name
    names, args = rope_tensor_args(name)
    for arg in names:
        bad = dict(args, **{arg: value})
        with pytest.raises(TypeError, match=f"^{arg} must be a tensor supporting DLPack .*; got "
                                            f"{type(value).__name__}$"):
            getattr(flashinfer, name)(**bad)


# --- cos/sin cache form ----------------------------------------------------------------------------

def cache_args(nnz=5, hq=4, hk=2, hs=64, rd=64, max_pos=32, dtype=F16):
    return dict(positions=torch.arange(nnz), query=torch.randn(nnz, hq * hs, dtype=dtype),
                key=torch.randn(nnz, hk * hs, dtype=dtype), head_size=hs,
                cos_sin_cache=torch.randn(max_pos, rd, dtype=F32))


@pytest.mark.parametrize("name", CACHE_FNS)
def test_cos_sin_cache_without_rows_is_refused(name):
    """Every position would be out of range: the outputs would be left unwritten."""
    a = cache_args(max_pos=0)
    with raises(name, "cos_sin_cache must have a row per position; got 0 rows for 5 tokens"):
        getattr(flashinfer, name)(**a)
    a = cache_args(nnz=0, max_pos=0)  # no tokens: nothing to read
    with raises(name, "query must be a CUDA tensor"):
        getattr(flashinfer, name)(**a)


@pytest.mark.parametrize("name", CACHE_FNS)
def test_cos_sin_cache_must_be_float32(name):
    a = cache_args()
    a["cos_sin_cache"] = a["cos_sin_cache"].half()
    with pytest.raises(ValueError, match="^cos_sin_cache should be float32$"):
        getattr(flashinfer, name)(**a)


@pytest.mark.parametrize("name", CACHE_FNS)
def test_cos_sin_cache_form(name):
    fn = getattr(flashinfer, name)
    with raises(name, "query must be a CUDA tensor"):
        fn(**cache_args())
    a = cache_args()
    a["query"] = torch.randn(5, 100, dtype=F16)
    with raises(name, "query.shape[1] (100) must be a multiple of head_size (64)"):
        fn(**a)
    a = cache_args()
    a["query"] = torch.randn(5, 4, 80, dtype=F16)
    with raises(name, "query.shape[2] must equal head_size (64); got 80"):
        fn(**a)
    a = cache_args(rd=66, hs=64)
    with raises(name, "cos_sin_cache.shape[1] (rotary_dim) must be a positive even number <= head_size (64); got 66"):
        fn(**a)
    a = cache_args(rd=31)
    with raises(name, "cos_sin_cache.shape[1] (rotary_dim) must be a positive even number <= head_size (64); got 31"):
        fn(**a)
    a = cache_args()
    a["cos_sin_cache"] = torch.randn(32 * 64)
    with raises(name, "cos_sin_cache must be 2-D [max_position, rotary_dim]; got a 1-D tensor of shape (2048,)"):
        fn(**a)
    a = cache_args()
    a["positions"] = torch.arange(4)
    with raises(name, "positions.shape[0] must equal query.shape[0] (nnz) (5); got 4"):
        fn(**a)
    a = cache_args()
    a["positions"] = torch.arange(5.0)
    with raises(name, "positions.dtype must be int32 or int64; got float32"):
        fn(**a)
    a = cache_args()
    a["key"] = torch.randn(6, 128, dtype=F16)
    with raises(name, "key.shape[0] must equal query.shape[0] (nnz) (5); got 6"):
        fn(**a)
    a = cache_args()
    a["key"] = a["key"].bfloat16()
    with raises(name, "key.dtype must be float16; got bfloat16"):
        fn(**a)
    a = cache_args()
    a["head_size"] = 0
    with raises(name, "head_size must be > 0; got 0"):
        fn(**a)
    for hs, rd in ((80, 64), (112, 64), (160, 96), (192, 128)):  # any head_size is accepted
        with raises(name, "query must be a CUDA tensor"):
            fn(**cache_args(hs=hs, rd=rd))


# --- the references (CPU) -------------------------------------------------------------------------

def test_reference_interleaved_equals_meta_complex():
    x = torch.randn(9, 3, 64, dtype=torch.float64)
    pos = torch.tensor([0, 1, 2, 100, 4095, 70000, 999999, 5, 6])
    f = ref.inv_freq(48, 1.0, 1e4)
    c, s = ref.cos_sin(pos, f)
    a = ref.rotate(x, c, s, 48, interleave=True)
    b = ref.rope_meta_complex(x, pos, f, 48)
    assert torch.allclose(a, b, rtol=0, atol=1e-12)


@pytest.mark.parametrize("is_neox", (True, False))
def test_reference_cos_sin_cache_equals_rotate(is_neox):
    hs, rd, nnz = 80, 64, 11
    cache = ref.build_cos_sin_cache(256, rd)
    pos = torch.randint(0, 256, (nnz,))
    q = torch.randn(nnz, 3 * hs, dtype=torch.float64)
    k = torch.randn(nnz, hs, dtype=torch.float64)
    got_q, got_k = ref.rope_cos_sin_cache_vllm(pos, q, k, hs, cache, is_neox)
    c, s = cache[pos, :rd // 2], cache[pos, rd // 2:]
    want_q = ref.rotate(q.view(nnz, 3, hs), c, s, rd, interleave=not is_neox).view(nnz, 3 * hs)
    assert torch.allclose(got_q, want_q, rtol=0, atol=1e-12)
    assert torch.equal(got_k[:, rd:], k[:, rd:])


@pytest.mark.parametrize("scale, low, high, old", [(8, 1, 4, 8192), (32, 2, 8, 4096), (1, 1, 4, 8192)])
def test_reference_llama31_equals_meta_apply_scaling(scale, low, high, old):
    ours = ref.inv_freq(128, scale, 5e5, True, low, high, old).double()
    meta = ref.llama31_inv_freq_meta(128, scale, 5e5, low, high, old)
    assert torch.allclose(ours, meta.float().double(), rtol=2 ** -23, atol=0)


def test_reference_plain_frequencies():
    f = ref.inv_freq(128, 2.0, 1e4).double()
    want = torch.tensor([1e4 ** (-2 * d / 128) / 2.0 for d in range(64)], dtype=torch.float64)
    assert torch.equal(f, want.float().double())
    assert f[0] == 0.5


def test_reference_rotation_is_norm_preserving_and_neox_pairs():
    x = torch.randn(4, 2, 32, dtype=torch.float64)
    pos = torch.tensor([3, 9, 27, 81])
    out = ref.rope(x, pos, 32, interleave=False)
    # each pair (d, d + 16) keeps its length
    assert torch.allclose(out[..., :16] ** 2 + out[..., 16:] ** 2, x[..., :16] ** 2 + x[..., 16:] ** 2)
    # pair 0 turns by exactly pos radians (inv_freq_0 = 1)
    ang = torch.atan2(out[..., 16], out[..., 0]) - torch.atan2(x[..., 16], x[..., 0])
    diff = torch.remainder(ang - pos[:, None].double() + math.pi, 2 * math.pi) - math.pi
    assert diff.abs().max() < 1e-9
