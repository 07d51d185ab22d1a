"""Normalization kernels (FlashInfer-compatible ``flashinfer.norm``).

All math is fp32 with one rounding at the end. Inputs need only a contiguous last
dimension; rows may have any stride (a view into a wider tensor is read in place).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _norm
from ._ext import _BY_TYPE, FRAMEWORK_STREAM, export_args, framework_of, name_bad_scalars, to_dlpack

# Host time matters per call (a bare launch is ~3.5 us): the hot paths below look the
# framework up once and, when every tensor has the input's type and the bindings read that
# framework's tensors themselves (``fw.direct``: torch with DLPack's C exchange table), pass them
# straight through with FRAMEWORK_STREAM; else export_args() exports each by its own framework
# (and names a non-tensor argument).
_rmsnorm = _norm.rmsnorm
_gemma_rmsnorm = _norm.gemma_rmsnorm
_fused_add_rmsnorm = _norm.fused_add_rmsnorm
_gemma_fused_add_rmsnorm = _norm.gemma_fused_add_rmsnorm

__all__ = ["rmsnorm", "fused_add_rmsnorm", "gemma_rmsnorm", "gemma_fused_add_rmsnorm", "layernorm", "rmsnorm_quant",
           "fused_add_rmsnorm_quant", "layernorm_quant"]


def rmsnorm(input: Any, weight: Any, eps: float = 1e-6, out: Optional[Any] = None,
            enable_pdl: Optional[bool] = None) -> Any:
    r"""Root-mean-square normalization: ``out = input / sqrt(mean(input**2) + eps) * weight``.

    input: ``[num_tokens, hidden]`` or ``[num_tokens, num_heads, head_dim]`` (per-head QK-norm),
    float16/bfloat16. weight: ``[hidden]``, same dtype. out: optional, input's shape and dtype.
    enable_pdl: ``None``/``True`` use programmatic dependent launch where the GPU has it (sm_90+).
    Returns ``out``.
    """
    t = type(input)
    fw = _BY_TYPE.get(t) or framework_of(input)
    if out is None:
        out = fw.empty_like(input)
    try:
        if fw.direct and type(weight) is t and type(out) is t:
            _rmsnorm(input, weight, out, eps, FRAMEWORK_STREAM, enable_pdl is not False)
        else:
            s, i, w, o = export_args(fw, t, input=input, weight=weight, out=out)
            _rmsnorm(i, w, o, eps, s, enable_pdl is not False)
    except TypeError:
        name_bad_scalars(eps=(eps, "real"))  # (else the argument error as it was)
        raise
    return out


def gemma_rmsnorm(input: Any, weight: Any, eps: float = 1e-6, out: Optional[Any] = None,
                  enable_pdl: Optional[bool] = None) -> Any:
    r"""Gemma-style RMSNorm: ``out = input / sqrt(mean(input**2) + eps) * (1 + weight)``."""
    t = type(input)
    fw = _BY_TYPE.get(t) or framework_of(input)
    if out is None:
        out = fw.empty_like(input)
    try:
        if fw.direct and type(weight) is t and type(out) is t:
            _gemma_rmsnorm(input, weight, out, eps, FRAMEWORK_STREAM, enable_pdl is not False)
        else:
            s, i, w, o = export_args(fw, t, input=input, weight=weight, out=out)
            _gemma_rmsnorm(i, w, o, eps, s, enable_pdl is not False)
    except TypeError:
        name_bad_scalars(eps=(eps, "real"))  # (else the argument error as it was)
        raise
    return out


def fused_add_rmsnorm(input: Any, residual: Any, weight: Any, eps: float = 1e-6,
                      enable_pdl: Optional[bool] = None) -> None:
    r"""In place: ``residual += input``; ``input = residual / sqrt(mean(residual**2) + eps) * weight``.

    The normalization uses the unrounded fp32 sum; ``residual`` receives it rounded.
    input, residual: ``[num_tokens, hidden]``; weight ``[hidden]``.
    """
    t = type(input)
    fw = _BY_TYPE.get(t) or framework_of(input)
    try:
        if fw.direct and type(residual) is t and type(weight) is t:
            _fused_add_rmsnorm(input, residual, weight, eps, FRAMEWORK_STREAM, enable_pdl is not False)
        else:
            s, i, r, w = export_args(fw, t, input=input, residual=residual, weight=weight)
            _fused_add_rmsnorm(i, r, w, eps, s, enable_pdl is not False)
    except TypeError:
        name_bad_scalars(eps=(eps, "real"))  # (else the argument error as it was)
        raise


def gemma_fused_add_rmsnorm(input: Any, residual: Any, weight: Any, eps: float = 1e-6,
                            enable_pdl: Optional[bool] = None) -> None:
    r"""As :func:`fused_add_rmsnorm` with Gemma's ``(1 + weight)`` scale."""
    t = type(input)
    fw = _BY_TYPE.get(t) or framework_of(input)
    try:
        if fw.direct and type(residual) is t and type(weight) is t:
            _gemma_fused_add_rmsnorm(input, residual, weight, eps, FRAMEWORK_STREAM, enable_pdl is not False)
        else:
            s, i, r, w = export_args(fw, t, input=input, residual=residual, weight=weight)
            _gemma_fused_add_rmsnorm(i, r, w, eps, s, enable_pdl is not False)
    except TypeError:
        name_bad_scalars(eps=(eps, "real"))  # (else the argument error as it was)
        raise


def layernorm(input: Any, gemma: Any, beta: Any, eps: float = 1e-6) -> Any:
    r"""``(input - mean) / sqrt(var + eps) * gemma + beta`` (biased variance).

    input: ``[num_tokens, hidden]`` bfloat16 (float16 also accepted); gemma, beta: ``[hidden]``
    float32. Returns a new tensor of input's dtype.
    """
    fw = framework_of(input)
    out = fw.empty_like(input)
    try:
        _norm.layernorm(fw.to_dlpack(input), to_dlpack(gemma, "gemma"), to_dlpack(beta, "beta"),
                        fw.to_dlpack(out), eps, fw.stream(input))
    except TypeError:
        name_bad_scalars(eps=(eps, "real"))
        raise
    return out


# ---- fp8 outputs: out = fp8(clamp(norm(x) / scale)) (round to nearest, saturated) ----

def _fp8_out(out: Any) -> Tuple[Any, int]:
    """The uint8 view of a float8 `out` the binding takes, and its format (0 e4m3fn, 1 e5m2)."""
    name = str(getattr(out, "dtype", type(out).__name__))
    if name.endswith("float8_e4m3fn"):
        code = 0
    elif name.endswith("float8_e5m2"):
        code = 1
    else:
        raise ValueError(f"out must be a float8_e4m3fn or float8_e5m2 tensor; got dtype {name}")
    import torch

    return out.view(torch.uint8), code


def _scale(scale: Any) -> Tuple[Any, float]:
    """(DLPack of a 1-element float32 device tensor, 0.0) or (None, the float): a Python number
    or a 1-element host tensor / array is passed by value (reading it needs no synchronisation)."""
    if isinstance(scale, (int, float)) and not isinstance(scale, bool):
        return None, float(scale)
    numel = scale.numel() if callable(getattr(scale, "numel", None)) else getattr(scale, "size", None)
    if numel != 1:
        raise ValueError("scale must be a scalar tensor")
    device = getattr(scale, "device", "cpu")
    if getattr(device, "type", device) == "cpu":  # torch CPU tensors and numpy arrays
        return None, float(scale.reshape(-1)[0])
    if str(scale.dtype).rsplit(".", 1)[-1] != "float32":
        scale = scale.float() if hasattr(scale, "float") else scale.astype("float32")
    return to_dlpack(scale, "scale"), 0.0


def rmsnorm_quant(out: Any, input: Any, weight: Any, scale: Any, eps: float = 1e-6,
                  enable_pdl: Optional[bool] = None) -> Any:
    r"""RMSNorm into an fp8 tensor: ``out = fp8(clamp(input / sqrt(mean(input**2) + eps) * weight / scale))``.

    out: ``[num_tokens, hidden]`` float8_e4m3fn or float8_e5m2; input ``[num_tokens, hidden]``
    float16/bfloat16; weight ``[hidden]``; scale a float or a 1-element tensor on the device
    (read by the kernel). Returns ``out``."""
    fw = framework_of(input)
    o8, code = _fp8_out(out)
    st, sv = _scale(scale)
    try:
        _norm.rmsnorm_quant(fw.to_dlpack(o8), fw.to_dlpack(input), to_dlpack(weight, "weight"), st, sv, eps, code,
                            fw.stream(input), enable_pdl is not False)
    except TypeError:
        name_bad_scalars(eps=(eps, "real"))
        raise
    return out


def fused_add_rmsnorm_quant(out: Any, input: Any, residual: Any, weight: Any, scale: Any, eps: float = 1e-6,
                            enable_pdl: Optional[bool] = None) -> Any:
    r"""``residual += input`` (rounded, in place); ``out = fp8(clamp(rmsnorm(residual) * weight / scale))``
    from the unrounded fp32 sum. ``input`` is not written. Returns ``out``."""
    fw = framework_of(input)
    o8, code = _fp8_out(out)
    st, sv = _scale(scale)
    try:
        _norm.fused_add_rmsnorm_quant(fw.to_dlpack(o8), fw.to_dlpack(input), to_dlpack(residual, "residual"),
                                      to_dlpack(weight, "weight"), st, sv, eps, code, fw.stream(input),
                                      enable_pdl is not False)
    except TypeError:
        name_bad_scalars(eps=(eps, "real"))
        raise
    return out


def layernorm_quant(out: Any, input: Any, gemma: Any, beta: Any, scale: Any, eps: float = 1e-6) -> Any:
    r"""LayerNorm into an fp8 tensor: ``out = fp8(clamp(bf16(layernorm(input) * gemma + beta) / scale))``.

    input: ``[num_tokens, hidden]`` bfloat16, contiguous; gemma, beta ``[hidden]`` float32.
    Returns ``out``."""
    fw = framework_of(input)
    if str(getattr(input, "dtype", "")).rsplit(".", 1)[-1] != "bfloat16":
        raise RuntimeError("input must be bfloat16")
    if hasattr(input, "is_contiguous") and not input.is_contiguous():
        raise RuntimeError("input must be contiguous")
    o8, code = _fp8_out(out)
    st, sv = _scale(scale)
    try:
        _norm.layernorm_quant(fw.to_dlpack(o8), fw.to_dlpack(input), to_dlpack(gemma, "gemma"), to_dlpack(beta, "beta"),
                              st, sv, eps, code, fw.stream(input))
    except TypeError:
        name_bad_scalars(eps=(eps, "real"))
        raise
    return out
