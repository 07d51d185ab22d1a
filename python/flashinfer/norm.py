"""Normalization kernels (FlashInfer-compatible ``flashinfer.norm``).

All math is fp32 with one rounding at the end. Inputs need only a contiguous last
dimension; rows may have any stride (a view into a wider tensor is read in place).
"""

from __future__ import annotations

from typing import Any, Optional

from . import _norm
from ._ext import framework_of, to_dlpack

__all__ = ["rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm", "layernorm"]


def rmsnorm(input: Any, weight: Any, eps: float = 1e-6, out: Optional[Any] = None,
            enable_pdl: Optional[bool] = None) -> Any:
    r"""Root-mean-square normalization: ``out = input / sqrt(mean(input**2) + eps) * weight``.

    input: ``[num_tokens, hidden]`` or ``[num_tokens, num_heads, head_dim]`` (per-head QK-norm),
    float16/bfloat16. weight: ``[hidden]``, same dtype. out: optional, input's shape and dtype.
    enable_pdl: ``None``/``True`` use programmatic dependent launch where the GPU has it (sm_90+).
    Returns ``out``.
    """
    fw = framework_of(input)
    if out is None:
        out = fw.empty_like(input)
    dl = fw.to_dlpack
    _norm.rmsnorm(dl(input), to_dlpack(weight, "weight"), to_dlpack(out, "out"), eps, fw.stream(input),
                  enable_pdl is not False)
    return out


def gemma_rmsnorm(input: Any, weight: Any, eps: float = 1e-6, out: Optional[Any] = None,
                  enable_pdl: Optional[bool] = None) -> Any:
    r"""Gemma-style RMSNorm: ``out = input / sqrt(mean(input**2) + eps) * (1 + weight)``."""
    fw = framework_of(input)
    if out is None:
        out = fw.empty_like(input)
    dl = fw.to_dlpack
    _norm.gemma_rmsnorm(dl(input), to_dlpack(weight, "weight"), to_dlpack(out, "out"), eps,
                        fw.stream(input), enable_pdl is not False)
    return out


def fused_add_rmsnorm(input: Any, residual: Any, weight: Any, eps: float = 1e-6,
                      enable_pdl: Optional[bool] = None) -> None:
    r"""In place: ``residual += input``; ``input = residual / sqrt(mean(residual**2) + eps) * weight``.

    The normalization uses the unrounded fp32 sum; ``residual`` receives it rounded.
    input, residual: ``[num_tokens, hidden]``; weight ``[hidden]``.
    """
    fw = framework_of(input)
    _norm.fused_add_rmsnorm(fw.to_dlpack(input), to_dlpack(residual, "residual"), to_dlpack(weight, "weight"),
                            eps, fw.stream(input), enable_pdl is not False)


def gemma_fused_add_rmsnorm(input: Any, residual: Any, weight: Any, eps: float = 1e-6,
                            enable_pdl: Optional[bool] = None) -> None:
    r"""As :func:`fused_add_rmsnorm` with Gemma's ``(1 + weight)`` scale."""
    fw = framework_of(input)
    _norm.gemma_fused_add_rmsnorm(fw.to_dlpack(input), to_dlpack(residual, "residual"),
                                  to_dlpack(weight, "weight"), eps, fw.stream(input), enable_pdl is not False)


def layernorm(input: Any, gemma: Any, beta: Any, eps: float = 1e-6) -> Any:
    r"""``(input - mean) / sqrt(var + eps) * gemma + beta`` (biased variance).

    input: ``[num_tokens, hidden]`` bfloat16 (float16 also accepted); gemma, beta: ``[hidden]``
    float32. Returns a new tensor of input's dtype.
    """
    fw = framework_of(input)
    out = fw.empty_like(input)
    _norm.layernorm(fw.to_dlpack(input), to_dlpack(gemma, "gemma"), to_dlpack(beta, "beta"),
                    fw.to_dlpack(out), eps, fw.stream(input))
    return out
