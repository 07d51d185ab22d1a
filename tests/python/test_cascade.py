"""GPU correctness tests for flashinfer.cascade (merge_state, merge_state_in_place,
merge_states) against the float64 references in reference_cascade.py.

Values: elementwise |out - ref| <= atol + rtol * |ref| and a relative-L2 bound (checks.py's
rtol / rel_norm for the dtype; atol 1e-5 for two-state merges, 1e-4 for many-state merges,
whose fp32 accumulation over up to 100 states adds ~K * 6e-8 * max|v|). LSEs (float32):
|out - ref| <= 1e-5 + 1e-6 * |ref| (5e-5 for many states), and -inf exactly where the reference
has -inf. Empty states are checked bitwise: merging with one is the identity, two give v = 0
and s = -inf. Before each out-of-place call the caching allocator is handed NaN-filled blocks
of the outputs' sizes, so an output element the kernel never wrote is likely to show as NaN.
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
import reference_cascade as ref  # noqa: E402
from checks import CUDA, DTYPES, TOLERANCES, grid, short  # noqa: E402

pytestmark = pytest.mark.gpu

INF = math.inf
SEQS = (1, 7, 2048)
HEADS = (1, 8, 32)
HEAD_DIMS = (64, 128, 256)


# --- helpers ------------------------------------------------------------------------------------

def randn(*shape, dtype=torch.float32):
    return torch.randn(*shape, dtype=dtype, device=CUDA)


def rand_lse(seq, heads, spread=None):
    """Base-2 LSEs: even rows with a small spread (both states weigh in), odd rows with a wide
    one (one state dominates by up to 2^-100), plus a per-row offset up to +-300."""
    if spread is not None:
        return randn(seq, heads) * spread
    s = randn(seq, heads)
    wide = (torch.arange(seq, device=CUDA) % 2 == 1)[:, None]
    s = torch.where(wide, s * 40.0, s * 2.0)
    return s + randn(seq, 1) * 100.0


def poison_allocator(*specs):
    """Allocates NaN-filled blocks of the given (shape, dtype)s and frees them, so that PyTorch's
    caching allocator is likely to hand the same memory to the outputs of the next call."""
    blocks = [torch.full(shape, math.nan, dtype=dtype, device=CUDA) for shape, dtype in specs]
    del blocks


def assert_values(actual, expected, atol=1e-5, name="v"):
    """A float16/bfloat16 result against a float64 reference (see the module docstring)."""
    tol = TOLERANCES[actual.dtype]
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    a = actual.detach().double()
    e = expected.detach().to(device=a.device, dtype=torch.float64)
    n_nan = int(torch.isnan(a).sum())
    assert n_nan == 0, f"{name}: {n_nan} of {a.numel()} elements are NaN (never written, or computed from NaN)"
    if a.numel() == 0:
        return
    err = (a - e).abs()
    bound = atol + tol.rtol * e.abs()
    bad = err > bound
    if bad.any():
        worst = int(torch.argmax(err / bound))
        raise AssertionError(
            f"{name} ({short(actual.dtype)}): {int(bad.sum())} of {a.numel()} elements exceed {atol:g} + "
            f"{tol.rtol:g}*|ref|; worst at flat index {worst}: got {a.flatten()[worst].item():.7g}, expected "
            f"{e.flatten()[worst].item():.7g}")
    diff, norm = torch.linalg.vector_norm(a - e).item(), torch.linalg.vector_norm(e).item()
    limit = tol.rel_norm * norm + atol * math.sqrt(a.numel())
    assert diff <= limit, f"{name}: ||out - ref|| = {diff:.4g} exceeds {limit:.4g} (||ref|| = {norm:.4g})"


def assert_lse(actual, expected, atol=1e-5, rtol=1e-6, name="s"):
    assert actual.dtype == torch.float32, f"{name}: dtype {actual.dtype}, expected float32"
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{name}: shape {tuple(actual.shape)} != {tuple(expected.shape)}")
    a = actual.detach().double()
    e = expected.detach().to(device=a.device, dtype=torch.float64)
    assert not torch.isnan(a).any(), f"{name}: NaN in the LSE output"
    a_inf, e_inf = torch.isneginf(a), torch.isneginf(e)
    assert torch.equal(a_inf, e_inf), (
        f"{name}: -inf at {int((a_inf & ~e_inf).sum())} unexpected places, missing at {int((e_inf & ~a_inf).sum())}")
    fin = ~e_inf
    err = (a[fin] - e[fin]).abs()
    bound = atol + rtol * e[fin].abs()
    assert bool((err <= bound).all()), (
        f"{name}: {int((err > bound).sum())} LSEs off by more than {atol:g} + {rtol:g}*|ref|; max error "
        f"{err.max().item():.3g}")


def merge_state_checked(v_a, s_a, v_b, s_b):
    """flashinfer.merge_state on NaN-poisoned output memory, checking result types and shapes
    and that the inputs are unchanged."""
    seq, heads, d = v_a.shape
    before = [t.clone() for t in (v_a, s_a, v_b, s_b)]
    poison_allocator(((seq, heads, d), v_a.dtype), ((seq, heads), torch.float32))
    v, s = flashinfer.merge_state(v_a, s_a, v_b, s_b)
    assert v.dtype == v_a.dtype and tuple(v.shape) == (seq, heads, d) and v.device == v_a.device
    assert s.dtype == torch.float32 and tuple(s.shape) == (seq, heads) and s.device == v_a.device
    for t, b in zip((v_a, s_a, v_b, s_b), before):
        assert torch.equal(t, b), "an input was modified"
    return v, s


def strided_values(seq, heads, d, dtype, layout):
    """A [seq, heads, d] values view in `layout`; returns (view, backing buffer)."""
    if layout == "contiguous":
        buf = randn(seq, heads, d, dtype=dtype)
        return buf, buf
    if layout == "head_padded":  # row and head strides with padding: still 16-byte vectors
        buf = randn(seq, heads, d + 16, dtype=dtype)
        return buf[:, :, :d], buf
    if layout == "every_other_head":  # a [seq, 2 * heads, d] buffer's even heads
        buf = randn(seq, 2 * heads, d, dtype=dtype)
        return buf[:, ::2], buf
    if layout == "hnd":  # heads outermost in memory
        buf = randn(heads, seq, d, dtype=dtype)
        return buf.transpose(0, 1), buf
    if layout == "misaligned":  # base and strides not multiples of 8 elements: scalar path
        buf = randn(seq, heads, d + 5, dtype=dtype)
        return buf[:, :, 3:3 + d], buf
    raise ValueError(layout)


def outside_view(buf, view):
    """The parts of `buf`'s last dimension outside the columns `view` covers."""
    start = (view.data_ptr() - buf.data_ptr()) // buf.element_size() % buf.shape[-1]
    return [buf[..., :start], buf[..., start + view.shape[-1]:]]


def strided_lse(seq, heads, layout):
    if layout == "contiguous":
        return rand_lse(seq, heads)
    if layout in ("head_padded", "misaligned"):
        return rand_lse(seq, heads + 3)[:, 1:heads + 1]
    if layout == "every_other_head":
        return rand_lse(seq, 2 * heads)[:, ::2]
    if layout == "hnd":
        return rand_lse(seq, heads).t().contiguous().t()
    raise ValueError(layout)


LAYOUTS = ("contiguous", "head_padded", "every_other_head", "hnd", "misaligned")


# --- merge_state --------------------------------------------------------------------------------

def _smoke(dtype, seq, heads, d):
    return seq == 7 and heads == 8 and d == 128


@pytest.mark.parametrize("dtype, seq, heads, d", grid(DTYPES, SEQS, HEADS, HEAD_DIMS, smoke=_smoke))
def test_merge_state_matches_reference(dtype, seq, heads, d):
    v_a, v_b = randn(seq, heads, d, dtype=dtype), randn(seq, heads, d, dtype=dtype)
    s_a, s_b = rand_lse(seq, heads), rand_lse(seq, heads)
    v, s = merge_state_checked(v_a, s_a, v_b, s_b)
    ev, es = ref.merge_state(v_a, s_a, v_b, s_b)
    assert_values(v, ev)
    assert_lse(s, es)


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
@pytest.mark.parametrize("center, spread", [(1e4, 1.0), (-1e4, 1.0), (0.0, 1e4), (0.0, 1e-3)])
def test_merge_state_extreme_lse_values(dtype, center, spread):
    """Large magnitudes (fp32 LSE ulp ~1e-3 at 1e4), huge spreads (weights 2^-10000 = 0) and
    near-ties (both weights ~1/2)."""
    seq, heads, d = 64, 8, 128
    v_a, v_b = randn(seq, heads, d, dtype=dtype), randn(seq, heads, d, dtype=dtype)
    s_a, s_b = center + randn(seq, heads) * spread, center + randn(seq, heads) * spread
    v, s = merge_state_checked(v_a, s_a, v_b, s_b)
    ev, es = ref.merge_state(v_a, s_a, v_b, s_b)
    assert_values(v, ev)
    assert_lse(s, es)


@pytest.mark.parametrize("dtype, d", grid(DTYPES, (64, 128, 256, 100)))
def test_empty_state_is_the_identity(dtype, d):
    """s = -inf on one side: the result is the other state, bitwise (weights 1 and 0 exactly),
    whatever the empty side's values are."""
    seq, heads = 33, 8
    v_a, v_b = randn(seq, heads, d, dtype=dtype), randn(seq, heads, d, dtype=dtype)
    s_a, s_b = rand_lse(seq, heads), rand_lse(seq, heads)
    a_empty = torch.rand(seq, heads, device=CUDA) < 0.3
    b_empty = ~a_empty & (torch.rand(seq, heads, device=CUDA) < 0.5)
    s_a = torch.where(a_empty, torch.full_like(s_a, -INF), s_a)
    s_b = torch.where(b_empty, torch.full_like(s_b, -INF), s_b)
    v, s = merge_state_checked(v_a, s_a, v_b, s_b)
    assert torch.equal(v[a_empty], v_b[a_empty]) and torch.equal(s[a_empty], s_b[a_empty])
    assert torch.equal(v[b_empty], v_a[b_empty]) and torch.equal(s[b_empty], s_a[b_empty])
    both = ~a_empty & ~b_empty
    ev, es = ref.merge_state(v_a, s_a, v_b, s_b)
    assert_values(v[both], ev[both])
    assert_lse(s[both], es[both])
    # every row of one side empty
    s_full = rand_lse(seq, heads)
    v, s = merge_state_checked(v_a, s_full, v_b, torch.full_like(s_b, -INF))
    assert torch.equal(v, v_a) and torch.equal(s, s_full)


@pytest.mark.parametrize("dtype, d", grid(DTYPES, (64, 128, 100)))
def test_two_empty_states_give_zero_and_minus_inf(dtype, d):
    seq, heads = 9, 4
    v_a, v_b = randn(seq, heads, d, dtype=dtype), randn(seq, heads, d, dtype=dtype)
    empty = torch.full((seq, heads), -INF, device=CUDA)
    v, s = merge_state_checked(v_a, empty, v_b, empty.clone())
    assert not torch.isnan(v.float()).any(), "empty + empty produced NaN"
    assert torch.equal(v, torch.zeros_like(v)), "empty + empty must give v = 0"
    assert torch.isneginf(s).all(), "empty + empty must give s = -inf"


@pytest.mark.parametrize("dtype, layout", grid(DTYPES, LAYOUTS))
def test_merge_state_strided_views(dtype, layout):
    """Inputs are views with row/head strides (and LSE views with strides); the misaligned
    layout takes the single-element path. The backing buffers are not written."""
    seq, heads, d = 19, 6, 128
    v_a, buf_a = strided_values(seq, heads, d, dtype, layout)
    v_b, buf_b = strided_values(seq, heads, d, dtype, "hnd" if layout == "contiguous" else layout)
    s_a, s_b = strided_lse(seq, heads, layout), strided_lse(seq, heads, "hnd")
    bufs_before = (buf_a.clone(), buf_b.clone())
    v, s = merge_state_checked(v_a, s_a, v_b, s_b)
    ev, es = ref.merge_state(v_a, s_a, v_b, s_b)
    assert_values(v, ev)
    assert_lse(s, es)
    assert torch.equal(buf_a, bufs_before[0]) and torch.equal(buf_b, bufs_before[1]), "an input buffer was modified"


@pytest.mark.parametrize("dtype, d", grid(DTYPES, (8, 24, 72, 100, 200, 520, 1024, 2048)))
def test_merge_state_head_dims_beyond_64_128_256(dtype, d):
    """head_dim is a runtime value: small ones, multiples of 8 (16-byte vectors), others (one
    element at a time), and heads wider than one round of 32 lanes (several tiles per head)."""
    seq, heads = 5, 3
    v_a, v_b = randn(seq, heads, d, dtype=dtype), randn(seq, heads, d, dtype=dtype)
    s_a, s_b = rand_lse(seq, heads), rand_lse(seq, heads)
    v, s = merge_state_checked(v_a, s_a, v_b, s_b)
    ev, es = ref.merge_state(v_a, s_a, v_b, s_b)
    assert_values(v, ev)
    assert_lse(s, es)


@pytest.mark.parametrize("s_dtype", [torch.float64, torch.bfloat16, torch.float16])
def test_merge_state_converts_lse_inputs_to_float32(s_dtype):
    seq, heads, d = 7, 4, 64
    v_a, v_b = randn(seq, heads, d, dtype=torch.float16), randn(seq, heads, d, dtype=torch.float16)
    s_a, s_b = rand_lse(seq, heads, spread=4).to(s_dtype), rand_lse(seq, heads, spread=4).to(s_dtype)
    v, s = merge_state_checked(v_a, s_a, v_b, s_b)
    ev, es = ref.merge_state(v_a, s_a.float(), v_b, s_b.float())
    assert_values(v, ev)
    assert_lse(s, es)


def test_merge_state_empty_inputs_give_empty_outputs():
    for shape in [(0, 4, 64), (3, 0, 64)]:
        v_a = randn(*shape, dtype=torch.float16)
        s_a = randn(*shape[:2])
        v, s = flashinfer.merge_state(v_a, s_a, v_a.clone(), s_a.clone())
        assert tuple(v.shape) == shape and tuple(s.shape) == shape[:2]


def test_merge_state_benchmark_shape():
    """The benchmark's shape (8192 x 32 x 128 bf16), 16-byte path."""
    seq, heads, d = 8192, 32, 128
    v_a, v_b = randn(seq, heads, d, dtype=torch.bfloat16), randn(seq, heads, d, dtype=torch.bfloat16)
    s_a, s_b = rand_lse(seq, heads), rand_lse(seq, heads)
    v, s = merge_state_checked(v_a, s_a, v_b, s_b)
    ev, es = ref.merge_state(v_a, s_a, v_b, s_b)
    assert_values(v, ev)
    assert_lse(s, es)


# --- merge_state_in_place -------------------------------------------------------------------------

def in_place_checked(v, s, v_other, s_other, mask=None):
    before_other = (v_other.clone(), s_other.clone())
    result = flashinfer.merge_state_in_place(v, s, v_other, s_other, mask=mask)
    assert result is None, "merge_state_in_place returns None"
    assert torch.equal(v_other, before_other[0]) and torch.equal(s_other, before_other[1]), "v_other/s_other modified"


@pytest.mark.parametrize("dtype, d, layout", grid(DTYPES, (64, 128, 256), ("contiguous", "head_padded"))
                         + grid(DTYPES, (100, 1024), ("contiguous",)) + grid(DTYPES, (128,), ("misaligned",)))
def test_merge_state_in_place_matches_reference(dtype, d, layout):
    """Includes heads wider than one round of 32 lanes (d 100 and misaligned d 128 one element
    at a time, d 1024 in 16-byte vectors), merged in two passes so that no tile overwrites an
    LSE another tile still has to read."""
    seq, heads = 37, 8
    v, buf = strided_values(seq, heads, d, dtype, layout)
    s = strided_lse(seq, heads, layout)
    v_other, s_other = randn(seq, heads, d, dtype=dtype), rand_lse(seq, heads)
    ev, es = ref.merge_state(v, s, v_other, s_other)
    outside = [t.clone() for t in outside_view(buf, v)]
    in_place_checked(v, s, v_other, s_other)
    assert_values(v, ev)
    assert_lse(s, es)
    for before, after in zip(outside, outside_view(buf, v)):
        assert torch.equal(before, after), "the buffer outside the v view was modified"


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_merge_state_in_place_broadcast_other_state(dtype):
    """One state (e.g. a shared prefix's) merged into every row: v_other / s_other are expanded
    views with row stride 0."""
    seq, heads, d = 16, 4, 128
    v, s = randn(seq, heads, d, dtype=dtype), rand_lse(seq, heads)
    v_other = randn(1, heads, d, dtype=dtype).expand(seq, heads, d)
    s_other = rand_lse(1, heads).expand(seq, heads)
    ev, es = ref.merge_state(v, s, v_other, s_other)
    in_place_checked(v, s, v_other, s_other)
    assert_values(v, ev)
    assert_lse(s, es)


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_merge_state_in_place_mask_all_ones_equals_no_mask(dtype):
    seq, heads, d = 512, 32, 128
    v, s = randn(seq, heads, d, dtype=dtype), rand_lse(seq, heads)
    v_other, s_other = randn(seq, heads, d, dtype=dtype), rand_lse(seq, heads)
    v1, s1 = v.clone(), s.clone()
    in_place_checked(v1, s1, v_other, s_other)
    for mask_dtype in (torch.bool, torch.uint8):
        v2, s2 = v.clone(), s.clone()
        in_place_checked(v2, s2, v_other, s_other, mask=torch.ones(seq, dtype=mask_dtype, device=CUDA))
        assert torch.equal(v1, v2) and torch.equal(s1, s2)
    ev, es = ref.merge_state(v, s, v_other, s_other)
    assert_values(v1, ev)
    assert_lse(s1, es)


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_merge_state_in_place_mask_all_zeros_leaves_everything_untouched(dtype):
    seq, heads, d = 512, 32, 128
    v, s = randn(seq, heads, d, dtype=dtype), rand_lse(seq, heads)
    v_other, s_other = randn(seq, heads, d, dtype=dtype), rand_lse(seq, heads)
    v0, s0 = v.clone(), s.clone()
    in_place_checked(v, s, v_other, s_other, mask=torch.zeros(seq, dtype=torch.bool, device=CUDA))
    assert torch.equal(v, v0) and torch.equal(s, s0)


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_merge_state_in_place_random_masks(dtype):
    """50 random masks (seq 512, 32 heads, d 128): rows with mask 0 are bitwise untouched, the
    others equal the reference merge. Bool and uint8 masks (values 0/1 and other non-zeros),
    contiguous and strided."""
    seq, heads, d = 512, 32, 128
    for trial in range(50):
        v, s = randn(seq, heads, d, dtype=dtype), rand_lse(seq, heads)
        v_other, s_other = randn(seq, heads, d, dtype=dtype), rand_lse(seq, heads)
        keep = torch.rand(seq, device=CUDA) < 0.5
        if trial % 3 == 0:
            mask = keep
        elif trial % 3 == 1:
            mask = keep.to(torch.uint8) * torch.randint(1, 256, (seq,), device=CUDA, dtype=torch.uint8)
        else:
            mask = torch.stack([keep, ~keep], dim=1).reshape(-1)[::2]  # a strided bool view
        ev, es = ref.merge_state(v, s, v_other, s_other)
        v0, s0 = v.clone(), s.clone()
        in_place_checked(v, s, v_other, s_other, mask=mask)
        assert torch.equal(v[~keep], v0[~keep]) and torch.equal(s[~keep], s0[~keep]), (
            f"trial {trial}: masked rows changed")
        assert_values(v[keep], ev[keep], name=f"v (trial {trial})")
        assert_lse(s[keep], es[keep], name=f"s (trial {trial})")


@pytest.mark.parametrize("dtype, d", grid(DTYPES, (100, 1024)))
def test_merge_state_in_place_mask_with_wide_heads(dtype, d):
    """The two-pass path (values, then LSEs) honours the mask in both passes."""
    seq, heads = 64, 4
    for trial in range(5):
        v, s = randn(seq, heads, d, dtype=dtype), rand_lse(seq, heads)
        v_other, s_other = randn(seq, heads, d, dtype=dtype), rand_lse(seq, heads)
        keep = torch.rand(seq, device=CUDA) < 0.5
        ev, es = ref.merge_state(v, s, v_other, s_other)
        v0, s0 = v.clone(), s.clone()
        in_place_checked(v, s, v_other, s_other, mask=keep)
        assert torch.equal(v[~keep], v0[~keep]) and torch.equal(s[~keep], s0[~keep])
        assert_values(v[keep], ev[keep], name=f"v (trial {trial})")
        assert_lse(s[keep], es[keep], name=f"s (trial {trial})")


@pytest.mark.parametrize("s_dtype", [torch.float64, torch.bfloat16])
def test_merge_state_in_place_lse_of_another_dtype_is_not_updated(s_dtype):
    """As in FlashInfer: s is converted with .float(), so v is updated and the caller's s is not."""
    seq, heads, d = 16, 4, 128
    v, s = randn(seq, heads, d, dtype=torch.float16), rand_lse(seq, heads, spread=3).to(s_dtype)
    v_other, s_other = randn(seq, heads, d, dtype=torch.float16), rand_lse(seq, heads, spread=3)
    ev, _ = ref.merge_state(v, s.float(), v_other, s_other)
    s0 = s.clone()
    in_place_checked(v, s, v_other, s_other)
    assert_values(v, ev)
    assert torch.equal(s, s0)


@pytest.mark.parametrize("dtype, d", grid(DTYPES, (128, 1024)))
def test_merge_state_in_place_with_itself(dtype, d):
    """v_other is v and s_other is s: weights 1/2 each, so v is unchanged and s grows by 1."""
    seq, heads = 21, 4
    v, s = randn(seq, heads, d, dtype=dtype), rand_lse(seq, heads, spread=10)
    v0, s0 = v.clone(), s.clone()
    flashinfer.merge_state_in_place(v, s, v, s)
    assert torch.equal(v, v0)
    assert_lse(s, s0.double() + 1.0)


def test_merge_state_in_place_under_cuda_graph_with_a_mask_buffer():
    """The in-place merge with a mask is captured once and replayed with new data and masks."""
    seq, heads, d = 64, 8, 128
    v, s = randn(seq, heads, d, dtype=torch.float16), rand_lse(seq, heads)
    v_other, s_other = randn(seq, heads, d, dtype=torch.float16), rand_lse(seq, heads)
    mask = torch.ones(seq, dtype=torch.bool, device=CUDA)
    flashinfer.merge_state_in_place(v.clone(), s.clone(), v_other, s_other, mask=mask)  # warm-up
    torch.cuda.synchronize()
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        flashinfer.merge_state_in_place(v, s, v_other, s_other, mask=mask)
    for _ in range(3):
        v.copy_(randn(seq, heads, d, dtype=torch.float16))
        s.copy_(rand_lse(seq, heads))
        keep = torch.rand(seq, device=CUDA) < 0.5
        mask.copy_(keep)
        ev, es = ref.merge_state(v, s, v_other, s_other)
        v0, s0 = v.clone(), s.clone()
        g.replay()
        torch.cuda.synchronize()
        assert torch.equal(v[~keep], v0[~keep]) and torch.equal(s[~keep], s0[~keep])
        assert_values(v[keep], ev[keep])
        assert_lse(s[keep], es[keep])


# --- merge_states ---------------------------------------------------------------------------------

def merge_states_checked(v, s):
    seq, k, heads, d = v.shape
    before = (v.clone(), s.clone())
    poison_allocator(((seq, heads, d), v.dtype), ((seq, heads), torch.float32))
    out_v, out_s = flashinfer.merge_states(v, s)
    assert out_v.dtype == v.dtype and tuple(out_v.shape) == (seq, heads, d)
    assert out_s.dtype == torch.float32 and tuple(out_s.shape) == (seq, heads)
    assert torch.equal(v, before[0]) and torch.equal(s, before[1]), "an input was modified"
    return out_v, out_s


def states_lse(seq, k, heads, empty_fraction=0.1):
    """LSEs of k states: spreads from 2 to 40, some states empty, and row 0 / head 0 with every
    state empty (when k > 0)."""
    s = randn(seq, k, heads) * (2.0 + 38.0 * torch.rand(seq, 1, heads, device=CUDA)) + randn(seq, 1, 1) * 50
    s = torch.where(torch.rand(seq, k, heads, device=CUDA) < empty_fraction, torch.full_like(s, -INF), s)
    if k > 0:
        s[0, :, 0] = -INF
    return s


@pytest.mark.parametrize("dtype, k, d, seq_heads", grid(DTYPES, (1, 2, 3, 100), HEAD_DIMS, ((1, 1), (7, 8), (256, 32)),
                                                        smoke=lambda dt, k, d, sh: sh == (7, 8) and d == 128))
def test_merge_states_matches_reference(dtype, k, d, seq_heads):
    seq, heads = seq_heads
    v, s = randn(seq, k, heads, d, dtype=dtype), states_lse(seq, k, heads)
    out_v, out_s = merge_states_checked(v, s)
    ev, es = ref.merge_states(v, s)
    assert_values(out_v, ev, atol=1e-4)
    assert_lse(out_s, es, atol=5e-5)
    assert torch.equal(out_v[0, 0], torch.zeros_like(out_v[0, 0])), "all-empty row-head must give v = 0"


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_merge_states_flashinfer_test_shape(dtype):
    """FlashInfer's test: seq 2048, 100 states, 32 heads, d 128, atol 1e-2 (and our tolerances)."""
    seq, k, heads, d = 2048, 100, 32, 128
    v, s = randn(seq, k, heads, d, dtype=dtype), randn(seq, k, heads)
    out_v, out_s = merge_states_checked(v, s)
    ev, es = ref.merge_states(v, s)
    torch.testing.assert_close(out_v.double(), ev, atol=1e-2, rtol=0)
    torch.testing.assert_close(out_s.double(), es, atol=1e-2, rtol=0)
    assert_values(out_v, ev, atol=1e-4)
    assert_lse(out_s, es, atol=5e-5)


@pytest.mark.parametrize("dtype, d", grid(DTYPES, (64, 128, 100)))
def test_merge_states_of_one_state_is_that_state(dtype, d):
    seq, heads = 13, 8
    v, s = randn(seq, 1, heads, d, dtype=dtype), rand_lse(seq, heads)[:, None]
    out_v, out_s = merge_states_checked(v, s)
    assert torch.equal(out_v, v[:, 0]) and torch.equal(out_s, s[:, 0])


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_merge_states_of_zero_states_is_the_empty_state(dtype):
    v, s = randn(5, 0, 4, 64, dtype=dtype), randn(5, 0, 4)
    out_v, out_s = merge_states_checked(v, s)
    assert torch.equal(out_v, torch.zeros_like(out_v)) and torch.isneginf(out_s).all()


@pytest.mark.parametrize("dtype, layout", grid(DTYPES, ("state_strided", "head_padded", "misaligned", "hnd_like")))
def test_merge_states_strided_views(dtype, layout):
    seq, k, heads, d = 11, 6, 4, 128
    if layout == "state_strided":  # every other state of a [seq, 2k, heads, d] buffer
        buf = randn(seq, 2 * k, heads, d, dtype=dtype)
        v = buf[:, ::2]
        s = states_lse(seq, 2 * k, heads)[:, 1::2]
    elif layout == "head_padded":
        buf = randn(seq, k, heads, d + 8, dtype=dtype)
        v = buf[..., :d]
        s = states_lse(seq, k, heads + 1)[..., :heads]
    elif layout == "misaligned":  # single-element path
        buf = randn(seq, k, heads, d + 3, dtype=dtype)
        v = buf[..., 3:]
        s = states_lse(seq, k, heads)
    else:  # states outermost in memory
        buf = randn(k, seq, heads, d, dtype=dtype)
        v = buf.transpose(0, 1)
        s = states_lse(k, seq, heads).transpose(0, 1)
    buf_before = buf.clone()
    out_v, out_s = merge_states_checked(v, s)
    ev, es = ref.merge_states(v, s)
    assert_values(out_v, ev, atol=1e-4)
    assert_lse(out_s, es, atol=5e-5)
    assert torch.equal(buf, buf_before)


@pytest.mark.parametrize("dtype, d, k", grid(DTYPES, (8, 72, 100, 200, 520, 1024), (1, 5, 9)))
def test_merge_states_head_dims_beyond_64_128_256(dtype, d, k):
    seq, heads = 3, 5
    v, s = randn(seq, k, heads, d, dtype=dtype), states_lse(seq, k, heads)
    out_v, out_s = merge_states_checked(v, s)
    ev, es = ref.merge_states(v, s)
    assert_values(out_v, ev, atol=1e-4)
    assert_lse(out_s, es, atol=5e-5)


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_merge_states_equals_chained_merge_state(dtype):
    seq, k, heads, d = 64, 5, 8, 128
    v, s = randn(seq, k, heads, d, dtype=dtype), states_lse(seq, k, heads)
    out_v, out_s = merge_states_checked(v, s)
    acc_v, acc_s = v[:, 0].contiguous(), s[:, 0].contiguous()
    for i in range(1, k):
        flashinfer.merge_state_in_place(acc_v, acc_s, v[:, i], s[:, i])
    # Each chained step rounds v to the dtype: |error| <= u * max|v| per step (intermediate
    # states are convex combinations), and tol.rtol is 2u.
    atol = (k - 1) * TOLERANCES[dtype].rtol * v.double().abs().max().item() + 1e-4
    torch.testing.assert_close(acc_v.double(), out_v.double(), atol=atol, rtol=0)
    assert_lse(acc_s, out_s.double(), atol=1e-4)


# --- the property cascade attention relies on ------------------------------------------------------

@pytest.mark.parametrize("dtype, d, parts", grid(DTYPES, HEAD_DIMS, (2, 3, 8)))
def test_merging_partition_states_equals_attention_over_all_keys(dtype, d, parts):
    """Split one query row's keys into random parts (one of them empty); the attention state of
    each part (float64, then rounded to the kernel dtypes) merged by merge_states, by a chain of
    merge_state and by merge_state_in_place equals attention over all keys. The only error is the
    rounding of each part's v, so the bound is absolute: 2u * max|v_part| + fp32 arithmetic."""
    heads, n_keys, rows = 8, 300, 4
    scale = 1.0 / math.sqrt(d)
    tol = TOLERANCES[dtype]
    for row in range(rows):
        q = randn(heads, d, dtype=torch.float64)
        k_all = randn(n_keys, heads, d, dtype=torch.float64) * (1.0 + row)  # sharper softmax on later rows
        v_all = randn(n_keys, heads, d, dtype=torch.float64)
        owner = torch.randint(0, parts - 1, (n_keys,), device=CUDA)  # part parts-1 stays empty
        full_o, full_s = ref.attention_state(q, k_all, v_all, scale)
        states = [ref.attention_state(q, k_all[owner == p], v_all[owner == p], scale) for p in range(parts)]
        vs = torch.stack([o for o, _ in states])[None].to(dtype)  # [1, parts, heads, d]
        ss = torch.stack([s for _, s in states])[None].float()  # [1, parts, heads]
        assert torch.isneginf(ss[0, parts - 1]).all()
        atol = 2 * tol.rtol * vs.double().abs().max().item() + 1e-5

        out_v, out_s = merge_states_checked(vs, ss)
        torch.testing.assert_close(out_v[0].double(), full_o, atol=atol, rtol=0)
        torch.testing.assert_close(out_s[0].double(), full_s, atol=1e-4, rtol=1e-6)

        acc_v, acc_s = vs[:, 0], ss[:, 0]
        for p in range(1, parts):
            acc_v, acc_s = flashinfer.merge_state(acc_v, acc_s, vs[:, p], ss[:, p])
        # each step rounds v once more
        torch.testing.assert_close(acc_v[0].double(), full_o, atol=parts * atol, rtol=0)
        torch.testing.assert_close(acc_s[0].double(), full_s, atol=1e-4, rtol=1e-6)

        ip_v, ip_s = vs[:, parts - 1].clone(), ss[:, parts - 1].clone()  # start from the empty part
        for p in range(parts - 1):
            flashinfer.merge_state_in_place(ip_v, ip_s, vs[:, p], ss[:, p])
        torch.testing.assert_close(ip_v[0].double(), full_o, atol=parts * atol, rtol=0)
        torch.testing.assert_close(ip_s[0].double(), full_s, atol=1e-4, rtol=1e-6)


# --- streams and other frameworks -------------------------------------------------------------------

def test_kernels_run_on_the_current_stream():
    """Inputs are written on a side stream behind a long GPU sleep; the merges, issued on that
    stream, must see them (they would read stale data on another stream)."""
    sleep = getattr(torch.cuda, "_sleep", None)
    if sleep is None:
        pytest.skip("torch.cuda._sleep is not available")
    seq, heads, d = 256, 8, 128
    src_v = [randn(seq, heads, d, dtype=torch.float16) for _ in range(2)]
    src_s = [rand_lse(seq, heads) for _ in range(2)]
    v_a, v_b = torch.zeros_like(src_v[0]), torch.zeros_like(src_v[1])
    s_a, s_b = torch.full_like(src_s[0], -INF), torch.full_like(src_s[1], -INF)
    torch.cuda.synchronize()
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):
        sleep(100_000_000)
        v_a.copy_(src_v[0]), v_b.copy_(src_v[1]), s_a.copy_(src_s[0]), s_b.copy_(src_s[1])
        v, s = flashinfer.merge_state(v_a, s_a, v_b, s_b)
        ms_v, ms_s = flashinfer.merge_states(torch.stack([v_a, v_b], 1), torch.stack([s_a, s_b], 1))
        flashinfer.merge_state_in_place(v_a, s_a, v_b, s_b)
    side.synchronize()
    ev, es = ref.merge_state(src_v[0], src_s[0], src_v[1], src_s[1])
    for vv, sv in ((v, s), (ms_v, ms_s), (v_a, s_a)):
        assert_values(vv, ev, atol=1e-4)
        assert_lse(sv, es, atol=5e-5)


def test_cupy_arrays_in_cupy_arrays_out():
    cupy = pytest.importorskip("cupy")
    seq, heads, d = 9, 4, 64
    v_a, v_b = randn(seq, heads, d, dtype=torch.float16), randn(seq, heads, d, dtype=torch.float16)
    s_a, s_b = rand_lse(seq, heads), rand_lse(seq, heads)
    cv_a, cv_b = cupy.from_dlpack(v_a), cupy.from_dlpack(v_b)
    cs_a, cs_b = cupy.from_dlpack(s_a), cupy.from_dlpack(s_b)
    v, s = flashinfer.merge_state(cv_a, cs_a, cv_b, cs_b)
    assert isinstance(v, cupy.ndarray) and isinstance(s, cupy.ndarray) and s.dtype == cupy.float32
    cupy.cuda.get_current_stream().synchronize()
    ev, es = ref.merge_state(v_a, s_a, v_b, s_b)
    assert_values(torch.from_dlpack(v), ev)
    assert_lse(torch.from_dlpack(s), es)


@pytest.mark.parametrize("vecs", ["2", "4", "8"])
def test_merge_state_vectors_per_thread_knob(vecs):
    """FLASHINFER_MERGE_VECS (read once, so in a fresh interpreter) picks another tile shape of
    merge_state / merge_state_in_place; every one passes the merge_state tests."""
    import os
    import subprocess
    import sys
    env = dict(os.environ, FLASHINFER_MERGE_VECS=vecs)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                        "test_merge_state_matches_reference or test_merge_state_in_place_matches_reference or "
                        "test_merge_state_in_place_mask_with_wide_heads or test_merge_state_strided_views"],
                       env=env, capture_output=True, text=True, cwd=os.path.dirname(__file__))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout
