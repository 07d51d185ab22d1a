"""Prefill attention (FlashInfer-compatible ``flashinfer.prefill``): the query rows of one
request against its contiguous keys, ``single_prefill_with_kv_cache``, with GQA (any group
size), bottom-right causal mask, custom mask, sliding window, soft cap, ALiBi, RoPE and LSE.

What is checked here, before the binding (``_prefill``): the option strings and enums
(``KeyError`` for an unknown ``kv_layout`` / ``pos_encoding_mode``), the unsupported features
(``NotImplementedError``: other backends, fp8, per-head ``scale_*``, ``kv_cache_sf``), the
dtypes, the head counts and the custom mask's size. The binding checks the rest (head dims,
shapes, strides, devices, the packed mask's length) and raises ``flashinfer._ext.ArgumentError``
(a ``ValueError``) naming the argument.

``pos_encoding_mode="ROPE_LLAMA"`` rotates copies of q and k with this package's RoPE kernels
(flashinfer.rope, non-interleaved over the whole head_dim; query row i at position
``i + kv_len - qo_len``, key j at ``j``) and runs the attention on them: one extra pass over q
and k. The rotated values are rounded to q's dtype, as FlashInfer's kernels round them when
they rotate the 16-bit tiles in shared memory.
"""

from __future__ import annotations

import functools
import math
from typing import Any, Optional

from . import _prefill
from ._ext import framework_of, to_dlpack
from .decode import _dtype_name, _layout_code, _pos_code, _soft_cap
from .quantization import packbits

__all__ = [
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
]

_OP = "single_prefill_with_kv_cache"
_BACKENDS = ("auto", "fa2", "fa3")
_HALF = ("float16", "bfloat16")


def _dtype_of(t: Any) -> str:
    """The dtype of a torch / CuPy / NumPy tensor as a name ('float16', 'float8_e4m3fn', ...)."""
    return str(getattr(t, "dtype", type(t).__name__)).replace("torch.", "")


def _positions(fw: Any, like: Any, start: int, n: int) -> Any:
    """int32 ``[start, start + n)`` on ``like``'s device, in ``like``'s framework."""
    if fw.name == "torch":
        torch = fw.torch
        return torch.arange(start, start + n, dtype=torch.int32, device=like.device)
    if fw.name == "cupy":
        with like.device:
            return fw.cupy.arange(start, start + n, dtype=fw.cupy.int32)
    if fw.name == "numpy":  # (the RoPE binding then says that q must be a CUDA tensor)
        import numpy as np

        return np.arange(start, start + n, dtype=np.int32)
    raise TypeError(f"{_OP}: pos_encoding_mode='ROPE_LLAMA' needs torch tensors or CuPy arrays; got q as "
                    f"{type(like).__module__}.{type(like).__name__}")


def _check_rope_param(value: Optional[float], name: str, default: float) -> float:
    x = default if value is None else float(value)
    if not (x > 0.0 and math.isfinite(x)):
        raise ValueError(f"{_OP}: {name} must be a positive finite number (or None: {default:g}); got {value}")
    return x


def _rope_copies(fw: Any, q: Any, k: Any, layout: int, qo_len: int, kv_len: int, rope_scale: float,
                 rope_theta: float):
    """Rotated copies of q (row i at position i + kv_len - qo_len) and k (key j at j), k in its
    own layout. apply_rope_pos_ids rotates a q and a k of one length at the same positions, so
    unequal lengths take one call each, with a one-head view of the same tensor as the other
    argument (read only; its rotated copy is dropped)."""
    from .rope import apply_rope_pos_ids

    k_nhd = k if layout == 0 else k.swapaxes(0, 1)  # [kv_len, num_kv_heads, d], strided for HND
    if qo_len == kv_len:
        q_rot, k_rot = apply_rope_pos_ids(q, k_nhd, _positions(fw, q, 0, qo_len), rope_scale=rope_scale,
                                          rope_theta=rope_theta)
    else:
        q_rot, _ = apply_rope_pos_ids(q, q[:, :1], _positions(fw, q, kv_len - qo_len, qo_len), rope_scale=rope_scale,
                                      rope_theta=rope_theta)
        if kv_len == 0:
            return q_rot, k
        k_rot, _ = apply_rope_pos_ids(k_nhd, k_nhd[:, :1], _positions(fw, q, 0, kv_len), rope_scale=rope_scale,
                                      rope_theta=rope_theta)
    return q_rot, (k_rot if layout == 0 else k_rot.swapaxes(0, 1))


def single_prefill_with_kv_cache(q: Any, k: Any, v: Any, scale_q: Any = None, scale_k: Any = None, scale_v: Any = None,
                                 o_dtype: Any = None, custom_mask: Any = None, packed_custom_mask: Any = None,
                                 causal: bool = False, kv_layout: str = "NHD", pos_encoding_mode: str = "NONE",
                                 use_fp16_qk_reduction: bool = False, sm_scale: Optional[float] = None,
                                 window_left: int = -1, logits_soft_cap: Optional[float] = None,
                                 rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
                                 backend: str = "auto", return_lse: bool = False, kv_cache_sf: Any = None,
                                 k_scale: Optional[float] = None, v_scale: Optional[float] = None):
    r"""Attention of one request's query rows over its keys.

    q: ``[qo_len, num_qo_heads, head_dim_qk]``; k: ``[kv_len, num_kv_heads, head_dim_qk]`` (NHD) or
    ``[num_kv_heads, kv_len, head_dim_qk]`` (HND); v likewise with ``head_dim_vo``; float16 /
    bfloat16, last dimension contiguous (other strides free). Head dims (qk, vo): (64, 64),
    (128, 128), (256, 256), (192, 128). Returns ``o [qo_len, num_qo_heads, head_dim_vo]`` (dtype
    ``o_dtype or q.dtype``) and, with ``return_lse``, the base-2 ``lse [qo_len, num_qo_heads]``
    float32 of the scaled logits.

    Causal (bottom-right: row i sees keys ``j <= i + kv_len - qo_len``) is ignored when a custom
    mask is given: ``custom_mask`` bool ``[qo_len, kv_len]`` (packed here, which may sync) or
    ``packed_custom_mask`` (its bits packed little-endian within each byte, as
    ``packbits(mask.flatten(), bitorder="little")``; it wins when both are given). The sliding
    window (``window_left >= 0``) keeps keys ``j >= i + kv_len - qo_len - window_left``, with or
    without a mask. ``sm_scale`` (default ``1/sqrt(head_dim_qk)``) is multiplied by ``k_scale``;
    ``v_scale`` multiplies the output (not the LSE). A row with no key gives o = 0, lse = -inf.
    ``use_fp16_qk_reduction`` is accepted and ignored (a performance hint).
    """
    layout = _layout_code(kv_layout)  # KeyError for anything but "NHD" / "HND"
    pos = _pos_code(pos_encoding_mode)  # KeyError for anything but NONE / ROPE_LLAMA / ALIBI (or 0, 1, 2)
    if backend not in _BACKENDS:
        raise NotImplementedError(f"{_OP}: backend {backend!r} is not available; use 'auto', 'fa2' or 'fa3'")
    if kv_cache_sf is not None:
        raise NotImplementedError(f"{_OP}: kv_cache_sf (NVFP4 KV cache scale factors) is not supported")
    if scale_q is not None or scale_k is not None or scale_v is not None:
        raise NotImplementedError(f"{_OP}: scale_q / scale_k / scale_v (per-head scales of an fp8 q, FA3) are not "
                                  "supported; for a 16-bit q use k_scale / v_scale (floats)")
    fw = framework_of(q, "q")
    for name, t in (("q", q), ("k", k), ("v", v)):
        if len(getattr(t, "shape", ())) != 3:
            what = "[qo_len, num_qo_heads, head_dim_qk]" if name == "q" else (
                "[kv_len, num_kv_heads, head_dim]" if layout == 0 else "[num_kv_heads, kv_len, head_dim]")
            raise ValueError(f"{_OP}: {name} must be 3-D {what}; got shape {tuple(getattr(t, 'shape', ()))}")
    q_dt, k_dt, v_dt = _dtype_of(q), _dtype_of(k), _dtype_of(v)
    for name, dt in (("q", q_dt), ("k", k_dt), ("v", v_dt)):
        if dt.startswith("float8"):
            raise NotImplementedError(f"{_OP}: {name}.dtype {dt}: fp8 q / K / V are not supported by single prefill "
                                      "(use float16 or bfloat16)")
    if q_dt not in _HALF:
        raise ValueError(f"{_OP}: q.dtype must be float16 or bfloat16; got {q_dt}")
    if k_dt != q_dt:
        raise ValueError(f"{_OP}: k.dtype must be {q_dt} (q's dtype); got {k_dt}")
    if v_dt != q_dt:
        raise ValueError(f"{_OP}: v.dtype must be {q_dt} (q's dtype); got {v_dt}")
    qo_len, num_qo_heads, head_dim_qk = (int(x) for x in q.shape)
    kv_len, num_kv_heads = (int(k.shape[0]), int(k.shape[1])) if layout == 0 else (int(k.shape[1]), int(k.shape[0]))
    head_dim_vo = int(v.shape[2])
    if num_kv_heads <= 0 or num_qo_heads % num_kv_heads != 0:
        raise ValueError(f"{_OP}: num_qo_heads ({num_qo_heads}, q.shape[1]) must be a multiple of num_kv_heads "
                         f"({num_kv_heads}, k.shape[{1 - layout}])")
    o_name = q_dt if o_dtype is None else _dtype_name(o_dtype, f"{_OP}: o_dtype")
    cast = o_name != q_dt
    if cast and fw.name != "torch":
        raise ValueError(f"{_OP}: o_dtype {o_name} other than q's dtype ({q_dt}) is supported for torch tensors only; "
                         f"got q as {type(q).__module__}.{type(q).__name__}")
    if packed_custom_mask is None and custom_mask is not None:
        n = math.prod(int(x) for x in custom_mask.shape)
        if n != qo_len * kv_len:
            raise ValueError(f"{_OP}: custom_mask must be [qo_len, kv_len] = [{qo_len}, {kv_len}]; got shape "
                             f"{tuple(custom_mask.shape)}")
    scale = 1.0 / math.sqrt(head_dim_qk) if sm_scale is None else float(sm_scale)
    if k_scale is not None:
        scale *= float(k_scale)
    out_scale = 1.0 if v_scale is None else float(v_scale)
    window = -1 if window_left is None or window_left < 0 else int(window_left)
    cap = _soft_cap(logits_soft_cap)
    if pos == 1:
        rope_scale = _check_rope_param(rope_scale, "rope_scale", 1.0)
        rope_theta = _check_rope_param(rope_theta, "rope_theta", 1e4)

    if qo_len == 0:  # nothing to compute (and nothing the binding would launch)
        out = fw.empty((0, num_qo_heads, head_dim_vo), q)
        lse = fw.empty_f32((0, num_qo_heads), q) if return_lse else None
        if cast:
            out = out.to(getattr(fw.torch, o_name))
        return (out, lse) if return_lse else out

    mask = None
    if kv_len > 0:  # (no keys: every row is empty whatever the mask says)
        if packed_custom_mask is not None:
            mask = packed_custom_mask
        elif custom_mask is not None:
            mask = packbits(custom_mask, bitorder="little")  # row-major over [qo_len, kv_len]
    if pos == 1:
        q, k = _rope_copies(fw, q, k, layout, qo_len, kv_len, rope_scale, rope_theta)
    out = fw.empty((qo_len, num_qo_heads, head_dim_vo), q)
    lse = fw.empty_f32((qo_len, num_qo_heads), q) if return_lse else None
    dl = fw.to_dlpack
    _prefill.single_prefill(dl(q), to_dlpack(k, "k"), to_dlpack(v, "v"), dl(out), None if lse is None else dl(lse),
                            None if mask is None else to_dlpack(mask, "packed_custom_mask"), layout,
                            bool(causal) and mask is None, window, scale, cap, pos == 2, out_scale, fw.stream(q), True)
    if cast:  # the kernels write q's dtype; one extra pass over o
        out = out.to(getattr(fw.torch, o_name))
    return (out, lse) if return_lse else out


single_prefill_with_kv_cache_return_lse = functools.partial(single_prefill_with_kv_cache, return_lse=True)


def trtllm_batch_context_with_kv_cache(*args: Any, **kwargs: Any):
    """vLLM imports this name; the TensorRT-LLM context kernels are not part of this package."""
    raise NotImplementedError("trtllm_batch_context_with_kv_cache (TensorRT-LLM kernels) is not available")
