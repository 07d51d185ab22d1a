"""Gated activations (FlashInfer-compatible ``flashinfer.activation``):
``act(input[..., :H]) * input[..., H:]`` computed in fp32, rounded once."""

from __future__ import annotations

from typing import Any, Optional

from . import _activation
from ._ext import _BY_TYPE, FRAMEWORK_STREAM, export_args, framework_of

__all__ = ["silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul"]


def _act(name: str, kernel: Any, input: Any, out: Optional[Any], enable_pdl: Optional[bool]) -> Any:
    t = type(input)
    fw = _BY_TYPE.get(t) or framework_of(input)
    shape = getattr(input, "shape", None)
    if shape is None:  # a bare DLPack producer: the binding checks the shapes (and out= is needed)
        if out is None:
            out = fw.empty_like(input)  # (a TypeError: flashinfer allocates torch, CuPy, NumPy)
    elif len(shape) == 0:
        raise ValueError(f"{name}: input must have at least 1 dimension (..., 2 * hidden_size); got a 0-D tensor")
    elif shape[-1] % 2 != 0:
        raise ValueError("The last dimension must be even (2 * hidden_size).")
    elif out is None:
        out = fw.empty((*shape[:-1], shape[-1] // 2), input)
    else:
        if type(out) is not t:
            framework_of(out, "out")  # (a non-tensor: a TypeError naming `out`)
        assert out.ndim == input.ndim, f"out.ndim ({out.ndim}) must equal input.ndim ({input.ndim})"
        assert tuple(out.shape[:-1]) == tuple(shape[:-1]), (
            f"out.shape[:-1] {tuple(out.shape[:-1])} must equal input.shape[:-1] {tuple(shape[:-1])}")
        assert 2 * out.shape[-1] == shape[-1], (
            f"out.shape[-1] ({out.shape[-1]}) must be input.shape[-1] // 2 ({shape[-1] // 2})")
    if fw.direct and type(out) is t:  # (see norm.py)
        kernel(input, out, FRAMEWORK_STREAM, enable_pdl is not False)
    else:
        s, i, o = export_args(fw, t, input=input, out=out)
        kernel(i, o, s, enable_pdl is not False)
    return out


def silu_and_mul(input: Any, out: Optional[Any] = None, enable_pdl: Optional[bool] = None) -> Any:
    r"""``silu(input[..., :H]) * input[..., H:]`` with ``silu(x) = x * sigmoid(x)``; returns ``[..., H]``."""
    return _act("silu_and_mul", _activation.silu_and_mul, input, out, enable_pdl)


def gelu_and_mul(input: Any, out: Optional[Any] = None, enable_pdl: Optional[bool] = None) -> Any:
    r"""``gelu(input[..., :H]) * input[..., H:]`` with the exact (erf) GELU."""
    return _act("gelu_and_mul", _activation.gelu_and_mul, input, out, enable_pdl)


def gelu_tanh_and_mul(input: Any, out: Optional[Any] = None, enable_pdl: Optional[bool] = None) -> Any:
    r"""``gelu_tanh(input[..., :H]) * input[..., H:]`` (tanh approximation, as ``approximate="tanh"``)."""
    return _act("gelu_tanh_and_mul", _activation.gelu_tanh_and_mul, input, out, enable_pdl)
