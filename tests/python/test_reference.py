"""CPU checks of the test machinery itself: the float64 references agree with torch's own
float64 implementations, and assert_close accepts the best possible kernel output (the
reference rounded once) while rejecting outputs of deliberately wrong definitions."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")
import torch.nn.functional as F  # noqa: E402

import reference as ref  # noqa: E402
from checks import DTYPES, assert_close, short  # noqa: E402

F64 = torch.float64


def _close64(a: torch.Tensor, b: torch.Tensor) -> None:
    torch.testing.assert_close(a, b, rtol=1e-12, atol=1e-12)


# --- the references match torch's float64 implementations ------------------------------------

@pytest.mark.parametrize("eps", [1e-6, 1e-1])
def test_rmsnorm_reference_matches_torch(eps):
    x, w = torch.randn(7, 96, dtype=F64), torch.randn(96, dtype=F64)
    _close64(ref.rmsnorm(x, w, eps), F.rms_norm(x, (96,), w, eps))
    _close64(ref.gemma_rmsnorm(x, w, eps), F.rms_norm(x, (96,), 1 + w, eps))


def test_rmsnorm_reference_normalizes_each_head_of_a_3d_input():
    x, w = torch.randn(5, 4, 64, dtype=F64), torch.randn(64, dtype=F64)
    _close64(ref.rmsnorm(x, w), ref.rmsnorm(x.reshape(20, 64), w).reshape(5, 4, 64))


@pytest.mark.parametrize("gemma", [False, True])
def test_fused_add_reference_normalizes_the_unrounded_sum(gemma):
    x = torch.randn(3, 64, dtype=torch.bfloat16)
    r = torch.randn(3, 64, dtype=torch.bfloat16)
    w = torch.randn(64, dtype=torch.bfloat16)
    normed, new_res = ref.fused_add_rmsnorm(x, r, w, gemma=gemma)
    exact_sum = x.double() + r.double()
    assert new_res.dtype == torch.bfloat16
    assert torch.equal(new_res, exact_sum.to(torch.bfloat16))
    expected = (ref.gemma_rmsnorm if gemma else ref.rmsnorm)(exact_sum, w)
    _close64(normed, expected)


@pytest.mark.parametrize("eps", [1e-6, 1e-1])
def test_layernorm_reference_matches_torch(eps):
    x, g, b = torch.randn(6, 129, dtype=F64) * 3 + 1, torch.randn(129, dtype=F64), torch.randn(129, dtype=F64)
    _close64(ref.layernorm(x, g, b, eps), F.layer_norm(x, (129,), g, b, eps))


@pytest.mark.parametrize("name, torch_act", [
    ("silu_and_mul", F.silu),
    ("gelu_and_mul", F.gelu),
    ("gelu_tanh_and_mul", lambda a: F.gelu(a, approximate="tanh")),
])
def test_activation_reference_matches_torch(name, torch_act):
    x = torch.randn(2, 5, 2 * 33, dtype=F64) * 3
    _close64(getattr(ref, name)(x), torch_act(x[..., :33]) * x[..., 33:])


# --- assert_close has teeth -------------------------------------------------------------------

def _ideal(reference: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """The best any kernel can do: the exact result rounded once to the output dtype."""
    return reference.to(dtype)


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_assert_close_accepts_correctly_rounded_outputs(dtype):
    x = torch.randn(64, 4096, dtype=dtype)
    w = torch.randn(4096, dtype=dtype)
    expected = ref.rmsnorm(x, w)
    assert_close(_ideal(expected, dtype), expected)
    # tiny outputs (fp16 subnormals) are covered by atol
    tiny = torch.randn(1000, dtype=F64) * 1e-6
    assert_close(_ideal(tiny, dtype), tiny)


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_assert_close_rejects_wrong_norm_definitions(dtype):
    """The outputs of kernels with common bugs fail against the right reference."""
    x = torch.randn(7, 128, dtype=dtype)
    w = torch.randn(128, dtype=dtype)
    eps = 0.1
    expected = ref.rmsnorm(x, w, eps)
    x64, w64 = x.double(), w.double()
    rms = torch.sqrt(x64.square().mean(-1, keepdim=True))
    wrong_outputs = {
        "eps outside the sqrt": x64 / (rms + eps) * w64,
        "missing weight": x64 / torch.sqrt(rms**2 + eps),
        "1 + w instead of w": ref.gemma_rmsnorm(x, w, eps),
        "rows shifted by one": expected.roll(1, dims=0),
        "mean over all rows": x64 / torch.sqrt(x64.square().mean() + eps) * w64,
    }
    for what, wrong in wrong_outputs.items():
        with pytest.raises(AssertionError):
            assert_close(_ideal(wrong, dtype), expected, name=what)


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_assert_close_rejects_swapped_gelu_flavours(dtype):
    x = torch.randn(16, 2 * 1024, dtype=dtype) * 2
    with pytest.raises(AssertionError):
        assert_close(_ideal(ref.gelu_tanh_and_mul(x), dtype), ref.gelu_and_mul(x))
    with pytest.raises(AssertionError):
        assert_close(_ideal(ref.gelu_and_mul(x), dtype), ref.gelu_tanh_and_mul(x))


@pytest.mark.parametrize("dtype", DTYPES, ids=short)
def test_assert_close_rejects_one_bad_element_and_unwritten_elements(dtype):
    expected = torch.randn(33, 111, dtype=F64)
    expected[17, 50] = 1.0
    out = _ideal(expected, dtype)
    ulp_at_one = 2.0 ** -(7 if dtype == torch.bfloat16 else 10)
    one_off = out.clone()
    one_off[17, 50] = 1.0 + 4 * ulp_at_one  # exactly representable, 4 ulps too large
    with pytest.raises(AssertionError, match=r"1 of 3663 elements .* index \(17, 50\)"):
        assert_close(one_off, expected)
    unwritten = out.clone()
    unwritten[-1, -1] = math.nan
    with pytest.raises(AssertionError, match="NaN"):
        assert_close(unwritten, expected)
