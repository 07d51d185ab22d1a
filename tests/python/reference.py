"""Independent float64 references for the kernels under test.

Every function takes tensors of any dtype on any device, computes in float64 on that device
from the definitions below (no flashinfer code, no torch.nn.functional), and returns float64
results. test_reference.py cross-checks them against torch's own float64 implementations.

Definitions (H = hidden size, the last dimension; means are over it):
  rmsnorm(x, w)        = x / sqrt(mean(x^2) + eps) * w
  gemma_rmsnorm(x, w)  = x / sqrt(mean(x^2) + eps) * (1 + w)
  fused_add_rmsnorm    : r = x + residual; residual <- round(r); x <- rmsnorm(r, w) of the
                         UNROUNDED r
  layernorm(x, g, b)   = (x - mean(x)) / sqrt(var(x) + eps) * g + b, var biased (divide by H)
  act_and_mul(x)       = act(x[..., :H]) * x[..., H:], input last dim 2H
    silu(a)            = a / (1 + exp(-a))
    gelu(a)            = a / 2 * (1 + erf(a / sqrt(2)))
    gelu_tanh(a)       = a / 2 * (1 + tanh(sqrt(2 / pi) * (a + 0.044715 a^3)))
"""

from __future__ import annotations

import math
from typing import Tuple

import torch

__all__ = [
    "rmsnorm",
    "gemma_rmsnorm",
    "fused_add_rmsnorm",
    "layernorm",
    "silu_and_mul",
    "gelu_and_mul",
    "gelu_tanh_and_mul",
]


def _f64(t: torch.Tensor) -> torch.Tensor:
    return t.detach().to(torch.float64)


def _rms_normalize(x64: torch.Tensor, eps: float) -> torch.Tensor:
    return x64 / torch.sqrt(x64.square().mean(dim=-1, keepdim=True) + eps)


def rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return _rms_normalize(_f64(x), eps) * _f64(weight)


def gemma_rmsnorm(x: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    return _rms_normalize(_f64(x), eps) * (1.0 + _f64(weight))


def fused_add_rmsnorm(x: torch.Tensor, residual: torch.Tensor, weight: torch.Tensor, eps: float = 1e-6,
                      gemma: bool = False) -> Tuple[torch.Tensor, torch.Tensor]:
    """Returns ``(normed, new_residual)``: the float64 normalized sum, and the sum rounded to
    ``residual.dtype`` (what the kernel stores back into ``residual``)."""
    r = _f64(x) + _f64(residual)
    normed = (gemma_rmsnorm if gemma else rmsnorm)(r, weight, eps)
    return normed, r.to(residual.dtype)


def layernorm(x: torch.Tensor, gemma: torch.Tensor, beta: torch.Tensor, eps: float = 1e-6) -> torch.Tensor:
    x64 = _f64(x)
    mean = x64.mean(dim=-1, keepdim=True)
    var = (x64 - mean).square().mean(dim=-1, keepdim=True)  # biased
    return (x64 - mean) / torch.sqrt(var + eps) * _f64(gemma) + _f64(beta)


def _halves(x: torch.Tensor) -> Tuple[torch.Tensor, torch.Tensor]:
    h = x.shape[-1] // 2
    return _f64(x[..., :h]), _f64(x[..., h:])


def silu_and_mul(x: torch.Tensor) -> torch.Tensor:
    a, b = _halves(x)
    return a / (1.0 + torch.exp(-a)) * b


def gelu_and_mul(x: torch.Tensor) -> torch.Tensor:
    a, b = _halves(x)
    return 0.5 * a * (1.0 + torch.erf(a / math.sqrt(2.0))) * b


def gelu_tanh_and_mul(x: torch.Tensor) -> torch.Tensor:
    a, b = _halves(x)
    return 0.5 * a * (1.0 + torch.tanh(math.sqrt(2.0 / math.pi) * (a + 0.044715 * a.pow(3)))) * b
