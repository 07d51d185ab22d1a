"""GPU tests of every norm and activation kernel variant that the benchmark knobs select
(FLASHINFER_NORM_VARIANT / _VPT / _ROWS / _LOAD and FLASHINFER_ACT_VARIANT / _UNROLL, read
once at start-up). The tests switch variants in-process through the modules' ``_set_tuning``
hooks and restore the previous setting afterwards.

Shapes are chosen so that each variant takes its own kernel: hidden 1032 (129 vectors: one
live lane in the last warp), 2048 .. 16384 (one to eight vectors per thread), and row
counts that leave the last group of a 2- or 4-row block partly empty. Outputs are
NaN-poisoned with guard zones (GuardedOutput) and compared with the float64 references.
"""

from __future__ import annotations

import contextlib

import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
import reference as ref  # noqa: E402
from checks import (  # noqa: E402
    CUDA, DTYPES, STRIDED_LAYOUTS, GuardedOutput, assert_all_nan, assert_close, grid, nan_full, strided_rows,
    untouched_columns,
)
from flashinfer import _activation, _norm  # noqa: E402

pytestmark = pytest.mark.gpu

# id -> _norm._set_tuning arguments (variant, vecs_per_thread, rows_per_block, load)
NORM_VARIANTS = {
    "auto": ("auto", 0, 0, "plain"),
    "pipe": ("pipe", 0, 0, "plain"),
    "rows": ("rows", 0, 0, "plain"),
    **{f"rows-v{v}r{r}": ("rows", v, r, "plain") for v in (1, 2, 4, 8) for r in (1, 2, 4) if v * r <= 8},
    "rows-v1r1-na": ("rows", 1, 1, "na"),
    "rows-v1r2-na": ("rows", 1, 2, "na"),
    "rows-v4r2-na": ("rows", 4, 2, "na"),
}
# id -> _activation._set_tuning arguments (variant, unroll)
ACT_VARIANTS = {
    "auto": ("auto", 0),
    "pipe": ("pipe", 0),
    **{f"flat-u{u}": ("flat", u) for u in (1, 2, 4, 8)},
}

RMS = {"rmsnorm": (flashinfer.rmsnorm, ref.rmsnorm), "gemma_rmsnorm": (flashinfer.gemma_rmsnorm, ref.gemma_rmsnorm)}
FUSED = {"fused_add_rmsnorm": False, "gemma_fused_add_rmsnorm": True}
NORMS = (*RMS, *FUSED, "layernorm")

HIDDEN = (64, 1032, 2048, 4096, 8192, 16384)
ROWS = (1, 3, 130)


@contextlib.contextmanager
def norm_variant(key):
    saved = _norm._tuning()
    _norm._set_tuning(*NORM_VARIANTS[key])
    try:
        yield
    finally:
        _norm._set_tuning(*saved)


@contextlib.contextmanager
def act_variant(key):
    saved = _activation._tuning()
    _activation._set_tuning(*ACT_VARIANTS[key])
    try:
        yield
    finally:
        _activation._set_tuning(*saved)


def randn(*shape, dtype):
    return torch.randn(*shape, dtype=dtype, device=CUDA)


def check_norm(name, x, dtype, **kw):
    """Runs norm `name` on x (any row layout) and checks every output against the reference."""
    hidden = x.shape[-1]
    if name in RMS:
        kernel, reference = RMS[name]
        w = randn(hidden, dtype=dtype)
        out = GuardedOutput(tuple(x.shape), dtype)
        x_before = x.clone()
        assert kernel(x, w, out=out.tensor, **kw) is out.tensor
        assert_close(out.tensor, reference(x, w))
        out.assert_guards_untouched()
        assert torch.equal(x, x_before), "input was modified"
        assert_close(kernel(x, w, **kw), reference(x, w), name="out=None")
    elif name in FUSED:
        residual = randn(*x.shape, dtype=dtype)
        w = randn(hidden, dtype=dtype)
        normed, new_residual = ref.fused_add_rmsnorm(x, residual, w, gemma=FUSED[name])
        assert getattr(flashinfer, name)(x, residual, w, **kw) is None
        assert_close(x, normed, name="input (normalized in place)")
        assert_close(residual, new_residual, name="residual (input + residual, in place)")
    else:
        gemma, beta = randn(hidden, dtype=torch.float32), randn(hidden, dtype=torch.float32)
        x = (x.float() * 2 + randn(x.shape[0], 1, dtype=torch.float32)).to(dtype)  # a mean per row
        assert_close(flashinfer.layernorm(x, gemma, beta), ref.layernorm(x, gemma, beta))


def _smoke_norm(variant, name, dtype, hidden, rows):
    return hidden == 4096 and rows == 3 and dtype == torch.bfloat16 and name in ("rmsnorm", "fused_add_rmsnorm")


@pytest.mark.parametrize("variant, name, dtype, hidden, rows",
                         grid(NORM_VARIANTS, NORMS, DTYPES, HIDDEN, ROWS, smoke=_smoke_norm))
def test_norm_variant_matches_reference(variant, name, dtype, hidden, rows):
    with norm_variant(variant):
        check_norm(name, randn(rows, hidden, dtype=dtype), dtype)


@pytest.mark.parametrize("variant, name, dtype, layout",
                         grid(NORM_VARIANTS, (*RMS, *FUSED), (torch.bfloat16,), STRIDED_LAYOUTS))
def test_norm_variant_strided_rows(variant, name, dtype, layout):
    """Rows are column slices of wider buffers (the misaligned layout takes the scalar path);
    columns outside the views are never written."""
    rows, hidden = 37, 4096
    with norm_variant(variant):
        x, x_buf = strided_rows(rows, hidden, layout, dtype)
        if name in RMS:
            kernel, reference = RMS[name]
            w = randn(hidden, dtype=dtype)
            out, out_buf = strided_rows(rows, hidden, layout, dtype, fill="nan")
            x_buf_before = x_buf.clone()
            assert kernel(x, w, out=out) is out
            assert_close(out, reference(x, w))
            for part in untouched_columns(out_buf, out):
                assert_all_nan(part, "out buffer outside the out view")
            assert torch.equal(x_buf, x_buf_before), "input buffer was modified"
        else:
            residual, r_buf = strided_rows(rows, hidden, "second_half" if layout != "second_half" else "first_half",
                                           dtype)
            w = randn(hidden, dtype=dtype)
            x_outside = [p.clone() for p in untouched_columns(x_buf, x)]
            r_outside = [p.clone() for p in untouched_columns(r_buf, residual)]
            normed, new_residual = ref.fused_add_rmsnorm(x, residual, w, gemma=FUSED[name])
            getattr(flashinfer, name)(x, residual, w)
            assert_close(x, normed, name="input")
            assert_close(residual, new_residual, name="residual")
            for before, after in zip(x_outside, untouched_columns(x_buf, x)):
                assert torch.equal(before, after), "input buffer modified outside the input view"
            for before, after in zip(r_outside, untouched_columns(r_buf, residual)):
                assert torch.equal(before, after), "residual buffer modified outside the residual view"


@pytest.mark.parametrize("variant, dtype, heads, head_dim",
                         grid(NORM_VARIANTS, (torch.bfloat16,), (3, 5), (256, 2048)))
def test_norm_variant_3d_views(variant, dtype, heads, head_dim):
    """[N, heads, d] views of a wider [N, heads + 2, d] buffer: two stride levels, so the
    kernels' row offsets take RowLayout's division path; the other heads stay untouched."""
    rows = 11
    with norm_variant(variant):
        buf = randn(rows, heads + 2, head_dim, dtype=dtype)
        x = buf[:, :heads]
        w = randn(head_dim, dtype=dtype)
        out_buf = nan_full((rows, heads + 2, head_dim), dtype)
        out = out_buf[:, 1:heads + 1]
        assert flashinfer.rmsnorm(x, w, out=out) is out
        assert_close(out, ref.rmsnorm(x, w))
        assert_all_nan(out_buf[:, 0], "head before the out view")
        assert_all_nan(out_buf[:, heads + 1:], "head after the out view")


@pytest.mark.parametrize("variant, name", grid(("auto", "rows-v1r2", "rows-v2r4"), (*RMS, *FUSED)))
def test_norm_variant_many_rows(variant, name):
    """16385 rows: the default takes two rows per block for RMSNorm from 16384 rows on; the
    odd count leaves the last block one row short."""
    with norm_variant(variant):
        check_norm(name, randn(16385, 2048, dtype=torch.bfloat16), torch.bfloat16)


@pytest.mark.parametrize("variant, name, dtype", grid(NORM_VARIANTS, NORMS, DTYPES))
def test_norm_variant_eps_and_pdl(variant, name, dtype):
    """eps inside the sqrt (data at the scale of eps) and launches with and without PDL."""
    with norm_variant(variant):
        for pdl in (True, False):
            x = (randn(9, 4096, dtype=torch.float32) * 1e-3).to(dtype)
            if name == "layernorm":
                check_norm(name, x, dtype)
            else:
                check_norm(name, x, dtype, enable_pdl=pdl)


def test_norm_set_tuning_round_trip():
    saved = _norm._tuning()
    try:
        _norm._set_tuning("rows", 2, 4, "na")
        assert _norm._tuning() == ("rows", 2, 4, "na")
    finally:
        _norm._set_tuning(*saved)
    assert _norm._tuning() == saved


# --- activations -------------------------------------------------------------------------------

ACTS = {
    "silu_and_mul": (flashinfer.silu_and_mul, ref.silu_and_mul),
    "gelu_and_mul": (flashinfer.gelu_and_mul, ref.gelu_and_mul),
    "gelu_tanh_and_mul": (flashinfer.gelu_tanh_and_mul, ref.gelu_tanh_and_mul),
}
ACT_HIDDEN = (1, 8, 64, 111, 4096, 11008, 14336)
ACT_LEAD = ((1,), (7,), (2, 17))


def gate_up(*lead, hidden, dtype):
    return (torch.randn(*lead, 2 * hidden, dtype=torch.float32, device=CUDA) * 2).to(dtype)


@pytest.mark.parametrize("variant, name, dtype, hidden, lead",
                         grid(ACT_VARIANTS, ACTS, DTYPES, ACT_HIDDEN, ACT_LEAD,
                              smoke=lambda v, n, d, h, l: h == 14336 and l == (7,) and n == "silu_and_mul"))
def test_act_variant_matches_reference(variant, name, dtype, hidden, lead):
    kernel, reference = ACTS[name]
    with act_variant(variant):
        x = gate_up(*lead, hidden=hidden, dtype=dtype)
        x_before = x.clone()
        out = GuardedOutput((*lead, hidden), dtype)
        assert kernel(x, out=out.tensor) is out.tensor
        assert_close(out.tensor, reference(x))
        out.assert_guards_untouched()
        assert torch.equal(x, x_before), "input was modified"


@pytest.mark.parametrize("variant, name, hidden", grid(ACT_VARIANTS, ("silu_and_mul",), (64, 4096, 14336)))
def test_act_variant_strided_rows(variant, name, hidden):
    """Input and output rows are slices of wider rows (one stride level) with a token
    subrange (two levels); columns and rows outside the views are never written."""
    kernel, reference = ACTS[name]
    with act_variant(variant):
        x_buf = (torch.randn(2, 20, 2 * hidden + 64, device=CUDA) * 2).to(torch.bfloat16)
        x = x_buf[:, 2:19, 8:8 + 2 * hidden]
        out_buf = nan_full((2, 20, hidden + 64), torch.bfloat16)
        out = out_buf[:, 2:19, 8:8 + hidden]
        assert kernel(x, out=out) is out
        assert_close(out, reference(x))
        for part in untouched_columns(out_buf, out):
            assert_all_nan(part, "out buffer columns outside the out view")
        assert_all_nan(out_buf[:, :2], "out rows before the view")
        assert_all_nan(out_buf[:, 19:], "out rows after the view")


@pytest.mark.parametrize("variant", ACT_VARIANTS)
def test_silu_extremes(variant):
    """silu at +-large inputs (exp overflow in 1 + exp(-x)) and at zero: finite, exact limits."""
    with act_variant(variant):
        vals = torch.tensor([-1e4, -200.0, -90.0, -88.0, -20.0, 0.0, 20.0, 90.0, 1e4], device=CUDA)
        x = torch.cat([vals, torch.ones_like(vals)]).to(torch.bfloat16)[None].repeat(3, 1)
        x = torch.nn.functional.pad(x.view(3, 2, 9), (0, 7)).reshape(3, 32)  # hidden 16: vectorised
        out = flashinfer.silu_and_mul(x)
        assert torch.isfinite(out).all()
        assert_close(out, ref.silu_and_mul(x))
