"""GPU tests for the fp8-output norms (rmsnorm_quant, fused_add_rmsnorm_quant, layernorm_quant)
against float64 references quantized by torch's own float8 cast.

Each output must be within one fp8 step of the float64 value and equal to the reference's
rounding almost everywhere (fp32 vs float64 differ only next to a rounding boundary); scales of
0.01 push many values past the format's largest finite value, which must saturate.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = pytest.importorskip("torch.nn.functional")

import flashinfer  # noqa: E402
from checks import CUDA, grid  # noqa: E402

pytestmark = pytest.mark.gpu

FP8 = (torch.float8_e4m3fn, torch.float8_e5m2)
# mantissa bits -> one step relative to the value; smallest subnormal step
_STEP = {torch.float8_e4m3fn: (2.0 ** -3, 2.0 ** -9), torch.float8_e5m2: (2.0 ** -2, 2.0 ** -16)}


def quantize_ref(y64: torch.Tensor, fp8) -> torch.Tensor:
    m = torch.finfo(fp8).max
    return y64.clamp(-m, m).to(torch.float32).to(fp8)


def check_fp8(got: torch.Tensor, y64: torch.Tensor, fp8, what: str):
    """got (fp8) against the unrounded float64 values y64: within one step, and equal to the
    reference rounding on >= 99.9% of the elements."""
    assert got.dtype == fp8
    m = torch.finfo(fp8).max
    yc = y64.clamp(-m, m)
    g = got.to(torch.float64)
    assert torch.isfinite(g).all(), f"{what}: non-finite fp8 output"
    rel, tiny = _STEP[fp8]
    err = (g - yc).abs()
    bad = err > rel * yc.abs() + tiny
    assert not bad.any(), f"{what}: {int(bad.sum())} values off by more than one fp8 step; worst {float(err.max())}"
    same = (got.view(torch.uint8) == quantize_ref(y64, fp8).view(torch.uint8)).double().mean().item()
    assert same >= 0.999, f"{what}: only {same:.5f} of the values round as the reference does"


def rms64(x, w, eps):
    x64 = x.to(torch.float64)
    return x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + eps) * w.to(torch.float64)


def rows(n, hidden, dtype, strided):
    if strided:  # a view of every other row of a wider buffer, columns offset by 8
        return torch.randn(2 * n, hidden + 16, dtype=dtype, device=CUDA)[::2, 8:8 + hidden]
    return torch.randn(n, hidden, dtype=dtype, device=CUDA)


def fp8_out(n, hidden, fp8, strided):
    if strided:
        buf = torch.full((n, hidden + 24), 1.0, device=CUDA).to(fp8)
        return buf, buf[:, 8:8 + hidden]
    o = torch.full((n, hidden), float("nan"), device=CUDA).to(fp8)
    return o, o


def as_scale(s, form):
    if form == "tensor":  # read by the kernel on the device
        return torch.tensor(s, dtype=torch.float32, device=CUDA)
    return torch.tensor(s) if form == "cpu" else s  # (a CPU tensor is passed by value)


CASES = grid((torch.float16, torch.bfloat16), FP8, (111, 1024, 4096, 16384), (1, 19, 99))


@pytest.mark.parametrize("dtype, fp8, hidden, n", CASES)
@pytest.mark.parametrize("scale, form", [(0.01, "tensor"), (1.0, "float"), (10.0, "tensor")])
def test_rmsnorm_quant(dtype, fp8, hidden, n, scale, form):
    x = rows(n, hidden, dtype, False)
    w = torch.randn(hidden, dtype=dtype, device=CUDA)
    buf, out = fp8_out(n, hidden, fp8, False)
    x0 = x.clone()
    r = flashinfer.norm.rmsnorm_quant(out, x, w, as_scale(scale, form), 1e-6)
    assert r is out
    check_fp8(out, rms64(x, w, 1e-6) / scale, fp8, "rmsnorm_quant")
    assert torch.equal(x, x0)


@pytest.mark.parametrize("dtype, fp8, hidden, n", CASES)
@pytest.mark.parametrize("scale, form", [(0.01, "float"), (1.0, "tensor"), (0.25, "cpu")])
def test_fused_add_rmsnorm_quant(dtype, fp8, hidden, n, scale, form):
    x = rows(n, hidden, dtype, False)
    res = torch.randn(n, hidden, dtype=dtype, device=CUDA)
    w = torch.randn(hidden, dtype=dtype, device=CUDA)
    _, out = fp8_out(n, hidden, fp8, False)
    x0, res0 = x.clone(), res.clone()
    s = x0.to(torch.float64) + res0.to(torch.float64)
    flashinfer.fused_add_rmsnorm_quant(out, x, res, w, as_scale(scale, form), 1e-5)
    y64 = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-5) * w.to(torch.float64) / scale
    check_fp8(out, y64, fp8, "fused_add_rmsnorm_quant")
    assert torch.equal(res, (x0.float() + res0.float()).to(dtype)), "residual must receive input + residual, rounded"
    assert torch.equal(x, x0), "input is not written"


@pytest.mark.parametrize("fp8, hidden, n", grid(FP8, (128, 129, 1024, 16384), (1, 3, 128)))
@pytest.mark.parametrize("scale, form", [(0.05, "tensor"), (2.0, "float")])
def test_layernorm_quant(fp8, hidden, n, scale, form):
    x = torch.randn(n, hidden, dtype=torch.bfloat16, device=CUDA) * 3 + 1
    g = torch.randn(hidden, dtype=torch.float32, device=CUDA)
    b = torch.randn(hidden, dtype=torch.float32, device=CUDA)
    _, out = fp8_out(n, hidden, fp8, False)
    flashinfer.layernorm_quant(out, x, g, b, as_scale(scale, form), 1e-6)
    ln = F.layer_norm(x.to(torch.float64), (hidden,), g.to(torch.float64), b.to(torch.float64), 1e-6)
    y64 = ln.to(torch.bfloat16).to(torch.float64) / scale  # rounded to the input dtype first
    check_fp8(out, y64, fp8, "layernorm_quant")


@pytest.mark.parametrize("dtype, fp8, hidden", grid((torch.float16, torch.bfloat16), FP8, (111, 4096)))
def test_quant_strided_rows_and_out(dtype, fp8, hidden):
    """Row-strided input, residual and out views (16-byte vectors where the rows allow them,
    single elements at hidden 111): the bytes of out's buffer outside the view stay as they were."""
    n = 7
    x = rows(n, hidden, dtype, True)
    w = torch.randn(hidden, dtype=dtype, device=CUDA)
    buf, out = fp8_out(n, hidden, fp8, True)
    before = buf.view(torch.uint8).clone()
    flashinfer.rmsnorm_quant(out, x, w, 0.5)
    check_fp8(out, rms64(x, w, 1e-6) / 0.5, fp8, "strided rmsnorm_quant")
    mask = torch.ones_like(before, dtype=torch.bool)
    mask[:, 8:8 + hidden] = False
    assert torch.equal(buf.view(torch.uint8)[mask], before[mask]), "bytes outside out were written"
    res = rows(n, hidden, dtype, True)
    res0, x0 = res.clone(), x.clone()
    flashinfer.fused_add_rmsnorm_quant(out, x, res, w, 0.5)
    s = x0.to(torch.float64) + res0.to(torch.float64)
    y64 = s * torch.rsqrt(s.pow(2).mean(-1, keepdim=True) + 1e-6) * w.to(torch.float64) / 0.5
    check_fp8(out, y64, fp8, "strided fused_add_rmsnorm_quant")
    assert torch.equal(res, (x0.float() + res0.float()).to(dtype))


def test_quant_misaligned_out_takes_single_elements():
    """out starting one byte into its buffer cannot take 8-byte stores: the scalar path."""
    x = torch.randn(5, 4096, dtype=torch.bfloat16, device=CUDA)
    w = torch.randn(4096, dtype=torch.bfloat16, device=CUDA)
    buf = torch.zeros(5 * 4096 + 1, device=CUDA).to(torch.float8_e4m3fn)
    out = buf[1:].view(5, 4096)
    flashinfer.rmsnorm_quant(out, x, w, 1.0)
    check_fp8(out, rms64(x, w, 1e-6), torch.float8_e4m3fn, "misaligned out")
    assert buf.view(torch.uint8)[0].item() == 0


def test_quant_errors():
    x = torch.randn(4, 128, dtype=torch.float16, device=CUDA)
    w = torch.randn(128, dtype=torch.float16, device=CUDA)
    out = torch.empty(4, 128, device=CUDA).to(torch.float8_e4m3fn)
    with pytest.raises(ValueError, match="float8"):
        flashinfer.rmsnorm_quant(torch.empty_like(x), x, w, 1.0)
    with pytest.raises(ValueError, match="scale must be a scalar tensor"):
        flashinfer.rmsnorm_quant(out, x, w, torch.ones(2, device=CUDA))
    with pytest.raises(ValueError, match="scale"):
        flashinfer.rmsnorm_quant(out, x, w, 0.0)
    with pytest.raises(ValueError, match="out"):
        flashinfer.rmsnorm_quant(out[:3], x, w, 1.0)
    with pytest.raises(ValueError, match="weight"):
        flashinfer.rmsnorm_quant(out, x, w[:64], 1.0)
    with pytest.raises(ValueError, match="residual"):
        flashinfer.fused_add_rmsnorm_quant(out, x, x, w, 1.0)  # residual aliases input
    g = torch.randn(128, device=CUDA)
    with pytest.raises(RuntimeError, match="input must be bfloat16"):
        flashinfer.layernorm_quant(out, x, g, g, 1.0)
    xb = torch.randn(4, 256, dtype=torch.bfloat16, device=CUDA)[:, :128]
    with pytest.raises(RuntimeError, match="input must be contiguous"):
        flashinfer.layernorm_quant(out, xb, g, g, 1.0)
    with pytest.raises(ValueError, match="CUDA"):
        flashinfer.rmsnorm_quant(out, x, w.cpu(), 1.0)


def test_wrong_reference_fails():
    """The check catches a kernel that ignores the weight or the scale."""
    x = torch.randn(19, 1024, dtype=torch.bfloat16, device=CUDA)
    w = torch.randn(1024, dtype=torch.bfloat16, device=CUDA)
    out = torch.empty(19, 1024, device=CUDA).to(torch.float8_e4m3fn)
    flashinfer.rmsnorm_quant(out, x, w, 2.0)
    check_fp8(out, rms64(x, w, 1e-6) / 2.0, torch.float8_e4m3fn, "right")
    x64 = x.to(torch.float64)
    for wrong in (x64 * torch.rsqrt(x64.pow(2).mean(-1, keepdim=True) + 1e-6) / 2.0, rms64(x, w, 1e-6)):
        with pytest.raises(AssertionError):
            check_fp8(out, wrong, torch.float8_e4m3fn, "wrong")
