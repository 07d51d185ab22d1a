"""GPU correctness tests for flashinfer.norm against the float64 references.

Every output is NaN-poisoned before the call and checked for full coverage; inputs are
checked unchanged (except the in-place fused-add ones); strided views check that the columns
of the wider buffer outside the view are untouched. Tolerances: see checks.py.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
import reference as ref  # noqa: E402
from checks import (  # noqa: E402
    CUDA, DTYPES, STRIDED_LAYOUTS, GuardedOutput, assert_all_nan, assert_close, grid, nan_full, short,
    strided_rows, untouched_columns,
)

pytestmark = pytest.mark.gpu

HIDDEN = (64, 111, 128, 4096, 8192, 16384)
ROWS = (1, 7, 128, 4096)

# name -> (kernel, reference) for out-of-place RMSNorm; name -> gemma flag for the fused ones.
RMS = {
    "rmsnorm": (flashinfer.rmsnorm, ref.rmsnorm),
    "gemma_rmsnorm": (flashinfer.gemma_rmsnorm, ref.gemma_rmsnorm),
}
FUSED = {"fused_add_rmsnorm": False, "gemma_fused_add_rmsnorm": True}


def _is_smoke(name, dtype, hidden, rows):
    return rows == 7 and hidden in (111, 4096)


def randn(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device=CUDA)


def run_fused(name, x, residual, weight, **kw):
    """Runs a fused-add kernel in place; returns the float64 references computed beforehand."""
    expected = ref.fused_add_rmsnorm(x, residual, weight, kw.get("eps", 1e-6), gemma=FUSED[name])
    result = getattr(flashinfer, name)(x, residual, weight, **kw)
    assert result is None, f"{name} works in place and returns None; got {type(result).__name__}"
    return expected


# --- RMSNorm / Gemma RMSNorm ---------------------------------------------------------------

@pytest.mark.parametrize("name, dtype, hidden, rows", grid(RMS, DTYPES, HIDDEN, ROWS, smoke=_is_smoke))
def test_rmsnorm_matches_reference(name, dtype, hidden, rows):
    kernel, reference = RMS[name]
    x, w = randn(rows, hidden, dtype=dtype), randn(hidden, dtype=dtype)
    x_before = x.clone()
    out = kernel(x, w)
    assert out.shape == x.shape and out.dtype == dtype and out.device == x.device
    assert_close(out, reference(x, w))
    assert torch.equal(x, x_before), "input was modified"


@pytest.mark.parametrize("name, dtype, hidden, rows", grid(RMS, DTYPES, (64, 111, 4096, 16384), (1, 7, 128),
                                                          smoke=_is_smoke))
def test_rmsnorm_writes_the_given_out_and_returns_it(name, dtype, hidden, rows):
    kernel, reference = RMS[name]
    x, w = randn(rows, hidden, dtype=dtype), randn(hidden, dtype=dtype)
    out = GuardedOutput((rows, hidden), dtype)
    result = kernel(x, w, out=out.tensor)
    assert result is out.tensor, "rmsnorm(out=...) must return the given out object"
    assert_close(out.tensor, reference(x, w))
    out.assert_guards_untouched()


@pytest.mark.parametrize("name, dtype, hidden, layout", grid(RMS, DTYPES, (64, 111, 128, 4096), STRIDED_LAYOUTS))
def test_rmsnorm_strided_rows(name, dtype, hidden, layout):
    """Input and out are column slices of wider buffers: rows are read and written in place."""
    kernel, reference = RMS[name]
    rows = 33
    x, x_buf = strided_rows(rows, hidden, layout, dtype)
    out, out_buf = strided_rows(rows, hidden, layout, dtype, fill="nan")
    w = randn(hidden, dtype=dtype)
    x_buf_before = x_buf.clone()
    assert kernel(x, w, out=out) is out
    assert_close(out, reference(x, w))
    for part in untouched_columns(out_buf, out):
        assert_all_nan(part, "out buffer outside the out view")
    assert torch.equal(x_buf, x_buf_before), "input buffer was modified"
    # out=None with a strided input allocates a fresh output
    assert_close(kernel(x, w), reference(x, w))


@pytest.mark.parametrize("name, dtype, heads, head_dim", grid(RMS, DTYPES, (4, 7, 16), (64, 128, 256),
                                                             smoke=lambda n, d, h, hd: h == 7 and hd == 128))
def test_qk_norm_3d_contiguous(name, dtype, heads, head_dim):
    kernel, reference = RMS[name]
    rows = 19
    x, w = randn(rows, heads, head_dim, dtype=dtype), randn(head_dim, dtype=dtype)
    out = GuardedOutput((rows, heads, head_dim), dtype)
    assert kernel(x, w, out=out.tensor) is out.tensor
    assert_close(out.tensor, reference(x, w))
    out.assert_guards_untouched()
    assert_close(kernel(x, w), reference(x, w))


@pytest.mark.parametrize("dtype, heads, head_dim", grid(DTYPES, (4, 7, 16), (64, 128, 256)))
def test_qk_norm_3d_views_of_a_fused_qkv_buffer(dtype, heads, head_dim):
    """q and k are [N, heads, d] views of a fused [N, (heads + 2 kv) * d] QKV projection;
    they are normalized per head into the same views of a NaN-filled fused output buffer."""
    rows, kv = 23, max(1, heads // 4)
    width = (heads + 2 * kv) * head_dim
    qkv = randn(rows, width, dtype=dtype)
    qkv_before = qkv.clone()
    q = qkv.view(rows, heads + 2 * kv, head_dim)[:, :heads]
    k = qkv.view(rows, heads + 2 * kv, head_dim)[:, heads:heads + kv]
    assert not q.is_contiguous()
    wq, wk = randn(head_dim, dtype=dtype), randn(head_dim, dtype=dtype)

    out_qkv = nan_full((rows, width), dtype)
    out_q = out_qkv.view(rows, heads + 2 * kv, head_dim)[:, :heads]
    out_k = out_qkv.view(rows, heads + 2 * kv, head_dim)[:, heads:heads + kv]
    assert flashinfer.rmsnorm(q, wq, out=out_q) is out_q
    assert flashinfer.rmsnorm(k, wk, out=out_k) is out_k
    assert_close(out_q, ref.rmsnorm(q, wq), name="q")
    assert_close(out_k, ref.rmsnorm(k, wk), name="k")
    assert_all_nan(out_qkv[:, (heads + kv) * head_dim:], "v columns of the fused output")
    assert torch.equal(qkv, qkv_before), "the fused qkv input was modified"

    # the same q view built with as_strided, and out=None
    q2 = qkv.as_strided((rows, heads, head_dim), (width, head_dim, 1))
    assert_close(flashinfer.rmsnorm(q2, wq), ref.rmsnorm(q, wq), name="q (as_strided)")


@pytest.mark.parametrize("name, dtype, hidden", grid(
    RMS, DTYPES,
    # around the vector-width (8 elements) and per-thread-vector (32/64/128 vectors) steps,
    # the scalar path's block-size steps (1024, 4096), and rows too wide for registers
    (1, 3, 8, 16, 248, 256, 264, 512, 520, 1023, 1024, 1025, 1032, 2056, 4095, 4097, 8200,
     32768, 65536, 65544, 131072)))
def test_rmsnorm_hidden_size_boundaries(name, dtype, hidden):
    kernel, reference = RMS[name]
    x, w = randn(5, hidden, dtype=dtype), randn(hidden, dtype=dtype)
    out = GuardedOutput((5, hidden), dtype)
    kernel(x, w, out=out.tensor)
    assert_close(out.tensor, reference(x, w))
    out.assert_guards_untouched()


def test_rmsnorm_fp16_accumulates_squares_in_fp32():
    """x ~ 1000: x^2 overflows fp16 (max 65504) but not fp32."""
    x = randn(8, 4096, dtype=torch.float16) * 1000
    w = randn(4096, dtype=torch.float16)
    assert torch.isfinite(x).all()
    assert_close(flashinfer.rmsnorm(x, w), ref.rmsnorm(x, w))


# --- fused add + RMSNorm -------------------------------------------------------------------

@pytest.mark.parametrize("name, dtype, hidden, rows", grid(FUSED, DTYPES, HIDDEN, ROWS, smoke=_is_smoke))
def test_fused_add_rmsnorm_matches_reference(name, dtype, hidden, rows):
    x, residual = randn(rows, hidden, dtype=dtype), randn(rows, hidden, dtype=dtype)
    w = randn(hidden, dtype=dtype)
    normed, new_residual = run_fused(name, x, residual, w)
    assert_close(x, normed, name="input (normalized in place)")
    assert_close(residual, new_residual, name="residual (input + residual, in place)")


# Row counts where the default plan takes two rows per block (norm_plan: >= 16384 rows; RMSNorm
# v2r2 at 4096 and v4r2 at 8192, fused add v1r2 at 4096), the second with a partial last group;
# LayerNorm takes one row of the register kernel at 4096 and the pipelined kernel at 8192.
@pytest.mark.parametrize("name, hidden, rows", grid((*RMS, *FUSED, "layernorm"), (4096, 8192), (16384, 16387)))
def test_norms_over_many_rows(name, hidden, rows):
    dtype = torch.bfloat16
    x, w = randn(rows, hidden, dtype=dtype), randn(hidden, dtype=dtype)
    if name == "layernorm":
        gamma, beta = randn(hidden, dtype=torch.float32), randn(hidden, dtype=torch.float32)
        assert_close(flashinfer.layernorm(x, gamma, beta), ref.layernorm(x, gamma, beta))
        return
    if name in RMS:
        kernel, reference = RMS[name]
        assert_close(kernel(x, w), reference(x, w))
        return
    residual = randn(rows, hidden, dtype=dtype)
    normed, new_residual = run_fused(name, x, residual, w)
    assert_close(x, normed, name="input (normalized in place)")
    assert_close(residual, new_residual, name="residual (input + residual, in place)")


@pytest.mark.parametrize("name, dtype, hidden, layout", grid(FUSED, DTYPES, (64, 111, 4096), STRIDED_LAYOUTS))
def test_fused_add_rmsnorm_strided_rows(name, dtype, hidden, layout):
    rows = 33
    x, x_buf = strided_rows(rows, hidden, layout, dtype)
    # the residual uses a different layout from the input
    other = {"first_half": "second_half", "second_half": "misaligned", "misaligned": "first_half"}[layout]
    residual, r_buf = strided_rows(rows, hidden, other, dtype)
    w = randn(hidden, dtype=dtype)
    x_outside = [p.clone() for p in untouched_columns(x_buf, x)]
    r_outside = [p.clone() for p in untouched_columns(r_buf, residual)]
    normed, new_residual = run_fused(name, x, residual, w)
    assert_close(x, normed, name="input")
    assert_close(residual, new_residual, name="residual")
    for before, after in zip(x_outside, untouched_columns(x_buf, x)):
        assert torch.equal(before, after), "input buffer modified outside the input view"
    for before, after in zip(r_outside, untouched_columns(r_buf, residual)):
        assert torch.equal(before, after), "residual buffer modified outside the residual view"


# --- LayerNorm -----------------------------------------------------------------------------

@pytest.mark.parametrize("dtype, hidden, rows", grid(
    (torch.bfloat16, torch.float16), (128, 129, 1024, 4096, 16384), (1, 2, 3, 128),
    smoke=lambda d, h, r: r == 3 and h in (129, 1024)))
def test_layernorm_matches_reference(dtype, hidden, rows):
    # an offset and a spread per row make the mean matter
    x = (randn(rows, hidden, dtype=torch.float32) * 2 + randn(rows, 1, dtype=torch.float32)).to(dtype)
    gemma = randn(hidden, dtype=torch.float32)
    beta = randn(hidden, dtype=torch.float32)
    x_before = x.clone()
    out = flashinfer.layernorm(x, gemma, beta)
    assert out.shape == x.shape and out.dtype == dtype
    assert_close(out, ref.layernorm(x, gemma, beta))
    assert torch.equal(x, x_before), "input was modified"


@pytest.mark.parametrize("hidden, layout", grid((128, 129, 4096), STRIDED_LAYOUTS))
def test_layernorm_strided_input_rows(hidden, layout):
    x, x_buf = strided_rows(17, hidden, layout, torch.bfloat16)
    gemma, beta = randn(hidden, dtype=torch.float32), randn(hidden, dtype=torch.float32)
    x_buf_before = x_buf.clone()
    assert_close(flashinfer.layernorm(x, gemma, beta), ref.layernorm(x, gemma, beta))
    assert torch.equal(x_buf, x_buf_before)


# --- eps, enable_pdl, empty inputs ---------------------------------------------------------

NORM_NAMES = ("rmsnorm", "gemma_rmsnorm", "fused_add_rmsnorm", "gemma_fused_add_rmsnorm", "layernorm")


def _run_and_check(name, dtype, rows, hidden, scale=1.0, **kw):
    """Runs norm `name` on fresh data (inputs multiplied by `scale`) and checks every output."""
    x = randn(rows, hidden, dtype=torch.float32).mul_(scale).to(dtype)
    if name in RMS:
        kernel, reference = RMS[name]
        w = randn(hidden, dtype=dtype)
        out = GuardedOutput((rows, hidden), dtype)
        assert kernel(x, w, out=out.tensor, **kw) is out.tensor
        assert_close(out.tensor, reference(x, w, kw.get("eps", 1e-6)))
        out.assert_guards_untouched()
    elif name in FUSED:
        residual = randn(rows, hidden, dtype=torch.float32).mul_(scale).to(dtype)
        normed, new_residual = run_fused(name, x, residual, randn(hidden, dtype=dtype), **kw)
        assert_close(x, normed, name="input")
        assert_close(residual, new_residual, name="residual")
    else:
        gemma, beta = randn(hidden, dtype=torch.float32), randn(hidden, dtype=torch.float32)
        assert_close(flashinfer.layernorm(x, gemma, beta, **kw), ref.layernorm(x, gemma, beta, kw.get("eps", 1e-6)))


@pytest.mark.parametrize("name, dtype, hidden", grid(NORM_NAMES, DTYPES, (111, 4096)))
def test_eps_is_added_inside_the_sqrt(name, dtype, hidden):
    """eps = 0.1 on unit-scale data, and the default eps on data scaled by 1e-3 (mean square
    1e-6, same size as eps): putting eps outside the sqrt or dropping it is off by > 4%."""
    _run_and_check(name, dtype, 9, hidden, eps=0.1)
    _run_and_check(name, dtype, 9, hidden, scale=1e-3)


@pytest.mark.parametrize("name, dtype, enable_pdl", grid(NORM_NAMES[:4], DTYPES, (None, True, False)))
def test_enable_pdl_variants(name, dtype, enable_pdl):
    _run_and_check(name, dtype, 128, 4096, enable_pdl=enable_pdl)
    _run_and_check(name, dtype, 7, 111, enable_pdl=enable_pdl)  # scalar path


@pytest.mark.parametrize("name, dtype", grid(NORM_NAMES, DTYPES))
def test_zero_rows_is_a_no_op(name, dtype):
    x = randn(0, 64, dtype=dtype)
    if name in RMS:
        w = randn(64, dtype=dtype)
        assert RMS[name][0](x, w).shape == (0, 64)
        out = torch.empty(0, 64, dtype=dtype, device=CUDA)
        assert RMS[name][0](x, w, out=out) is out
        assert RMS[name][0](randn(0, 4, 64, dtype=dtype), w).shape == (0, 4, 64)
    elif name in FUSED:
        assert getattr(flashinfer, name)(x, torch.empty_like(x), randn(64, dtype=dtype)) is None
    else:
        out = flashinfer.layernorm(x, randn(64, dtype=torch.float32), randn(64, dtype=torch.float32))
        assert out.shape == (0, 64) and out.dtype == dtype
    torch.cuda.synchronize()  # surfaces an asynchronous launch error, if any


# --- the comparison has teeth on real kernel output ------------------------------------------

@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_wrong_references_fail_on_kernel_output(dtype):
    """The kernel's output passes against the right reference and fails against references
    with the bugs a wrong kernel could have (see also test_reference.py)."""
    rows, hidden, eps = 7, 4096, 0.1
    x, w = randn(rows, hidden, dtype=dtype), randn(hidden, dtype=dtype)
    out = flashinfer.rmsnorm(x, w, eps=eps)
    gemma_out = flashinfer.gemma_rmsnorm(x, w, eps=eps)
    assert_close(out, ref.rmsnorm(x, w, eps))
    assert_close(gemma_out, ref.gemma_rmsnorm(x, w, eps))

    x64, w64 = x.double(), w.double()
    rms = torch.sqrt(x64.square().mean(-1, keepdim=True))
    wrong = {
        "eps outside the sqrt": (out, x64 / (rms + eps) * w64),
        "weight missing": (out, x64 / torch.sqrt(rms**2 + eps)),
        "rows shifted by one": (out, ref.rmsnorm(x, w, eps).roll(1, dims=0)),
        "gemma: w instead of 1 + w": (gemma_out, ref.rmsnorm(x, w, eps)),
    }
    for what, (actual, wrong_reference) in wrong.items():
        with pytest.raises(AssertionError):
            assert_close(actual, wrong_reference, name=what)
