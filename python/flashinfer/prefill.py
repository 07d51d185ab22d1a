"""Prefill attention (FlashInfer-compatible ``flashinfer.prefill``): the query rows of one
request against its contiguous keys, ``single_prefill_with_kv_cache``, with GQA (any group
size), bottom-right causal mask, custom mask, sliding window, soft cap, ALiBi, RoPE and LSE.

What is checked here, before the binding (``_prefill``): the option strings and enums
(``KeyError`` for an unknown ``kv_layout`` / ``pos_encoding_mode``), the unsupported features
(``NotImplementedError``: other backends, an fp8 q, per-head ``scale_*``, ``kv_cache_sf``), the
dtypes, the head counts and the custom mask's size. The binding checks the rest (head dims,
shapes, strides, devices, the packed mask's length) and raises ``flashinfer._ext.ArgumentError``
(a ``ValueError``) naming the argument.

``pos_encoding_mode="ROPE_LLAMA"`` rotates copies of q and k with this package's RoPE kernels
(flashinfer.rope, non-interleaved over the whole head_dim; query row i at position
``i + kv_len - qo_len``, key j at ``j``) and runs the attention on them: one extra pass over q
and k. The rotated values are rounded to q's dtype, as FlashInfer's kernels round them when
they rotate the 16-bit tiles in shared memory.

fp8 K / V (``torch.float8_e4m3fn`` / ``torch.float8_e5m2``, with a float16 / bfloat16 q; spec
§8.3) are cast to q's dtype (exact: every fp8 value is a float16 and a bfloat16 value) and run by
the 16-bit kernels; ``k_scale`` (and, in the batch wrappers, ``q_scale``) multiplies sm_scale,
``v_scale`` the output, not the LSE. The paged wrapper, with an fp8 cache or with
``pos_encoding_mode="ROPE_LLAMA"``, gathers the plan's tokens out of the pages into ragged K / V
(an index array built at plan) and runs the ragged kernel on them (one extra pass over the keys
and values the batch reads; the cache itself is neither cast nor rotated).

The batch wrappers, ``BatchPrefillWithPagedKVCacheWrapper`` and
``BatchPrefillWithRaggedKVCacheWrapper``, run the same kernel over many requests at once: ``plan``
reads the index arrays on the host (it may synchronize), checks them, asks the binding for the
batch's work items (``_prefill.plan_batch``: one (request, row tile) pair per CTA column) and
copies the index arrays, the packed custom mask's segment offsets and the work items to the
device (the int workspace, or the caller's buffers under CUDA graphs); ``run`` checks the tensors
it is given against the plan (no host synchronization) and launches ``_prefill.batch_prefill``,
allocating only its outputs (and, for fp8 K / V or paged RoPE, the gathered / cast / rotated
copies). See the classes for what is and is not supported.

Not supported (``NotImplementedError``): an fp8 q (FA3's per-head ``scale_q`` / ``scale_k`` /
``scale_v``), NVFP4 caches (``kv_cache_sf``), sinks, multi-item scoring, custom variants, other
backends; and, in the paged wrapper under CUDA graphs (``use_cuda_graph=True``), fp8 caches and
``pos_encoding_mode="ROPE_LLAMA"`` (the gathered copies' sizes depend on the plan).
"""

from __future__ import annotations

import functools
import math
import sys
from typing import Any, Optional, Tuple

import numpy as np

from . import _prefill
from . import decode as _decode_mod
from ._ext import framework_of, to_dlpack, torch_exporter, torch_stream_source
from .decode import (_KV_FP8_CODES, BatchDecodeWithPagedKVCacheWrapper, _check_page_table, _check_rope_param,
                     _dtype_name, _finite, _host_ints, _layout_code, _pos_code, _soft_cap, _torch)
from .page import _split_cache
from .quantization import packbits, segment_packbits

__all__ = [
    "single_prefill_with_kv_cache",
    "single_prefill_with_kv_cache_return_lse",
    "BatchPrefillWithPagedKVCacheWrapper",
    "BatchPrefillWithRaggedKVCacheWrapper",
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
    ``[num_kv_heads, kv_len, head_dim_qk]`` (HND); v likewise with ``head_dim_vo``; q float16 /
    bfloat16, k and v q's dtype or both fp8 (``torch.float8_e4m3fn`` / ``torch.float8_e5m2``:
    cast to q's dtype here, exactly, then the 16-bit kernel), last dimension contiguous (other
    strides free). Head dims (qk, vo): (64, 64), (128, 128), (256, 256), (512, 512), (192, 128).
    Returns ``o [qo_len, num_qo_heads, head_dim_vo]`` (dtype ``o_dtype or q.dtype``) and, with
    ``return_lse``, the base-2 ``lse [qo_len, num_qo_heads]`` float32 of the scaled logits.

    Causal (bottom-right: row i sees keys ``j <= i + kv_len - qo_len``) is ignored when a custom
    mask is given: ``custom_mask`` bool ``[qo_len, kv_len]`` (packed here, which may sync) or
    ``packed_custom_mask`` (its bits packed little-endian within each byte, as
    ``packbits(mask.flatten(), bitorder="little")``; it wins when both are given). The sliding
    window (``window_left >= 0``) keeps keys ``j >= i + kv_len - qo_len - window_left``, with or
    without a mask. ``sm_scale`` (default ``1/sqrt(head_dim_qk)``) is multiplied by ``k_scale``;
    ``v_scale`` multiplies the output (not the LSE); both apply to any K / V dtype. A row with no
    key gives o = 0, lse = -inf. ``use_fp16_qk_reduction`` is accepted and ignored (a performance
    hint). Under torch.compile it is one custom op,
    ``torch.ops.flashinfer.single_prefill_with_kv_cache`` (flashinfer/_torch_ops.py), so
    ``fullgraph=True`` and ``mode="reduce-overhead"`` trace it.
    """
    torch = sys.modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        ops = _decode_mod._TORCH_OPS
        if ops is None:
            raise RuntimeError(f"{_OP} under torch.compile: its custom op is registered when flashinfer is imported "
                               "after torch, or on the first call outside torch.compile")
        if scale_q is not None or scale_k is not None or scale_v is not None or kv_cache_sf is not None:
            raise NotImplementedError(f"{_OP} under torch.compile: scale_q / scale_k / scale_v / kv_cache_sf")
        o_name = None if o_dtype is None else _dtype_name(o_dtype, f"{_OP}: o_dtype")
        o, lse = ops.single_prefill(q, k, v, custom_mask, packed_custom_mask, bool(causal), kv_layout,
                                    _decode_mod._pos_name(pos_encoding_mode), sm_scale, int(window_left),
                                    logits_soft_cap, rope_scale, rope_theta, backend, bool(return_lse), k_scale,
                                    v_scale, o_name)
        return (o, lse) if return_lse else o
    if _decode_mod._TORCH_OPS is None and torch is not None:
        _decode_mod._load_torch_ops()
    return _single_prefill(q, k, v, scale_q, scale_k, scale_v, o_dtype, custom_mask, packed_custom_mask, causal,
                           kv_layout, pos_encoding_mode, use_fp16_qk_reduction, sm_scale, window_left,
                           logits_soft_cap, rope_scale, rope_theta, backend, return_lse, kv_cache_sf, k_scale,
                           v_scale)


def _single_prefill(q: Any, k: Any, v: Any, scale_q: Any = None, scale_k: Any = None, scale_v: Any = None,
                    o_dtype: Any = None, custom_mask: Any = None, packed_custom_mask: Any = None,
                    causal: bool = False, kv_layout: str = "NHD", pos_encoding_mode: str = "NONE",
                    use_fp16_qk_reduction: bool = False, sm_scale: Optional[float] = None,
                    window_left: int = -1, logits_soft_cap: Optional[float] = None,
                    rope_scale: Optional[float] = None, rope_theta: Optional[float] = None,
                    backend: str = "auto", return_lse: bool = False, kv_cache_sf: Any = None,
                    k_scale: Optional[float] = None, v_scale: Optional[float] = None):
    """single_prefill_with_kv_cache, eagerly (the custom op runs this too)."""
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
    if q_dt.startswith("float8"):
        raise NotImplementedError(f"{_OP}: q.dtype {q_dt}: an fp8 q is not supported (use float16 or bfloat16; k and "
                                  "v may be fp8)")
    if q_dt not in _HALF:
        raise ValueError(f"{_OP}: q.dtype must be float16 or bfloat16; got {q_dt}")
    kv_fp8 = k_dt in _KV_FP8_CODES
    if k_dt != q_dt and not kv_fp8:
        raise ValueError(f"{_OP}: k.dtype must be {q_dt} (q's dtype), float8_e4m3fn or float8_e5m2; got {k_dt}")
    if v_dt != k_dt:
        raise ValueError(f"{_OP}: v.dtype must be {k_dt} (" + ("k's dtype" if kv_fp8 else "q's dtype") + f"); got "
                         f"{v_dt}")
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
    scale = 1.0 / math.sqrt(head_dim_qk) if sm_scale is None else _finite(sm_scale, "sm_scale", _OP)
    if k_scale is not None:
        scale *= _finite(k_scale, "k_scale", _OP)
    out_scale = 1.0 if v_scale is None else _finite(v_scale, "v_scale", _OP)
    window = -1 if window_left is None or window_left < 0 else int(window_left)
    cap = _soft_cap(logits_soft_cap)
    if pos == 1:
        rope_scale = _check_rope_param(rope_scale, "rope_scale", 1.0, _OP)
        rope_theta = _check_rope_param(rope_theta, "rope_theta", 1e4, _OP)

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
    if kv_fp8:  # exact cast to q's dtype (fp8 tensors are torch's), then the 16-bit kernel
        to = getattr(_torch(), q_dt)
        k, v = k.to(to), v.to(to)
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


# ================================================================================================
# Batch prefill: BatchPrefillWithPagedKVCacheWrapper / BatchPrefillWithRaggedKVCacheWrapper
# ================================================================================================

_BATCH_HEAD_DIMS = ((64, 64), (128, 128), (256, 256), (512, 512), (192, 128))
# Packed rows (query rows x group) of one work item's row tile with one 16-row M tile per warp:
# prefill.h prefill_rows(1) = 4 warps x 16. Only used to size the padded work-item list under
# CUDA graphs; plan() checks every plan's item count against that size.
_TILE_ROWS = 64
# num_sms for plan_batch that makes it choose one M tile whatever the batch (CUDA graphs, and
# fixed_split_size / disable_split_kv: the row tiling must not depend on the other requests).
_ONE_M_TILE_SMS = 1 << 30
# A padding work item: request 0, a row tile past every request's rows (the kernel returns at once).
_PAD_TILE = (1 << 31) - 1
_LN2 = math.log(2.0)
_NUM_SMS: dict = {}


def _num_sms(device: Any) -> int:
    """The device's SM count (torch.cuda.get_device_properties, cached per device index)."""
    idx = device.index or 0
    n = _NUM_SMS.get(idx)
    if n is None:
        import torch

        n = _NUM_SMS[idx] = int(torch.cuda.get_device_properties(idx).multi_processor_count)
    return n


def _unpack_paged_kv_cache(paged_kv_cache: Any, layout: int) -> Tuple[Any, Any]:
    """(k_cache, v_cache) as 4-D views ``[max_num_pages, page_size, num_kv_heads, head_dim]`` (NHD) /
    ``[max_num_pages, num_kv_heads, page_size, head_dim]`` (HND) of any of the four cache forms
    (spec §1.0): a 5-D or 4-D (page_size 1) single tensor, split on dim 1, or a (k, v) tuple of
    4-D or 3-D (page_size 1) tensors. A page_size-1 form gets its page_size dimension here."""
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise KeyError(f"paged_kv_cache tuple must be (k_cache, v_cache); got {len(paged_kv_cache)} items")
        k, v = paged_kv_cache
    else:
        k, v = _split_cache(paged_kv_cache)  # KeyError for anything but a tensor or a tuple
        nd = len(k.shape)
        if nd not in (4, 5):
            raise ValueError(f"Invalid shape of paged_kv_cache: a single tensor must be 5-D [max_num_pages, 2, ...] or "
                             f"4-D [max_num_pages, 2, num_kv_heads, head_dim] (page_size 1); got {tuple(k.shape)}")
        k, v = k[:, 0], k[:, 1]
    out = []
    for name, t in (("k_cache", k), ("v_cache", v)):
        nd = len(getattr(t, "shape", ()))
        if nd == 3:  # [max_num_pages, num_kv_heads, head_dim], page_size 1
            t = t[:, None] if layout == 0 else t[:, :, None]
        elif nd != 4:
            raise ValueError(f"Invalid shape of paged_kv_cache: {name} must be 4-D (or 3-D for page_size 1); got "
                             f"{tuple(getattr(t, 'shape', ()))}")
        out.append(t)
    return out[0], out[1]


def _mask_byte_indptr(qo_lens: np.ndarray, kv_lens: np.ndarray) -> np.ndarray:
    """Each request's packed-mask segment start in bytes (segments byte-aligned): cumsum of
    ceil(qo_len_b * kv_len_b / 8), with a leading 0 (int64, batch + 1 entries)."""
    bits = qo_lens.astype(np.int64) * kv_lens.astype(np.int64)
    out = np.zeros(bits.size + 1, np.int64)
    np.cumsum((bits + 7) // 8, out=out[1:])
    return out


def _offsets_in_requests(lens: np.ndarray) -> np.ndarray:
    """Each token's index inside its request, over the requests' tokens concatenated (int64)."""
    return np.arange(int(lens.sum()), dtype=np.int64) - np.repeat(np.cumsum(lens) - lens, lens)


def _pad_items(items: np.ndarray, cap: int, op: str, rows: int = _TILE_ROWS) -> np.ndarray:
    """The work items ([n, 2] int32) padded to ``cap`` rows with no-op items (a row tile past
    request 0's rows), so that a CUDA graph launches the same grid after every plan."""
    if items.shape[0] > cap:
        raise RuntimeError(f"{op}: {items.shape[0]} work items exceed the CUDA-graph capacity {cap} (internal: the "
                           f"row tile is not {rows} rows)")
    padded = np.empty((cap, 2), np.int32)
    padded[:, 0], padded[:, 1] = 0, _PAD_TILE
    padded[:items.shape[0]] = items
    return padded


def _check_output(t: Any, name: str, shape: tuple, dtype: Any, device: Any) -> None:
    """A caller's torch ``out`` / ``lse``: exactly this dtype, shape and device (FlashInfer's messages)."""
    if t.dtype != dtype:
        raise ValueError(f"Invalid dtype of {name}: expected {dtype}, got {t.dtype}")
    if tuple(t.shape) != shape:
        raise ValueError(f"Invalid shape of {name}: expected {shape}, got {tuple(t.shape)}")
    if t.device != device:
        raise ValueError(f"Invalid device of {name}: expected {device}, got {t.device}")


def _host_indptrs(qo_indptr: Any, kv_indptr: Any, kv_name: str, op: str) -> Tuple[np.ndarray, np.ndarray]:
    """qo_indptr and the KV indptr (named kv_name) on the host, of one length (may synchronize)."""
    qo_h = _host_ints(qo_indptr, "qo_indptr")
    kv_h = _host_ints(kv_indptr, kv_name)
    if kv_h.size != qo_h.size:
        raise ValueError(f"{op}: the length of {kv_name} ({kv_h.size}) should be equal to the length of qo_indptr "
                         f"({qo_h.size})")
    return qo_h, kv_h


def _check_indptr(indptr: np.ndarray, name: str) -> np.ndarray:
    """Validates a token indptr (starts at 0, nondecreasing, fits int32); returns its lengths."""
    if indptr.size < 1:
        raise ValueError(f"{name} must have batch_size + 1 >= 1 entries; got 0")
    if indptr[0] != 0:
        raise ValueError(f"{name}[0] must be 0; got {indptr[0]}")
    lens = np.diff(indptr)
    if np.any(lens < 0):
        i = int(np.argmax(lens < 0))
        raise ValueError(f"{name} must be nondecreasing; {name}[{i}]={indptr[i]} > {name}[{i + 1}]={indptr[i + 1]}")
    if indptr[-1] >= 2 ** 31:
        raise ValueError(f"{name}[-1] ({indptr[-1]}) must be < 2**31")
    return lens


def _as_device_u8(x: Any, device: Any) -> Any:
    """A flat torch tensor on ``device`` with x's elements (torch, CuPy / DLPack, NumPy)."""
    import torch

    if not isinstance(x, torch.Tensor):
        x = torch.from_numpy(np.ascontiguousarray(x)) if isinstance(x, np.ndarray) else torch.from_dlpack(x)
    return x.reshape(-1).to(device).contiguous()


def _is_number(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def _capturing() -> bool:
    """Whether torch's current CUDA stream is capturing a graph (False where torch has no CUDA)."""
    try:
        return bool(_torch().cuda.is_current_stream_capturing())
    except RuntimeError:
        return False


def _float_scale(x: Any, name: str) -> float:
    """A q_scale / k_scale / v_scale given as a number (tensors would need a host sync in run)."""
    if x is None:
        return 1.0
    if _is_number(x) or isinstance(x, np.floating):
        return _finite(x, name, "run")
    raise NotImplementedError(f"{name} must be a float (per-tensor scale); tensor scales are not supported")


class _BatchPrefillBase:
    """What the paged and ragged wrappers share: workspaces, CUDA-graph buffers, the plan's host
    work (lengths, custom mask, work items, the copies to the device) and the launch."""

    _PAGED = False
    _NAME = "BatchPrefillWrapper"

    # -- construction -------------------------------------------------------------------------------
    def _init_common(self, float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs,
                     variant_owns_mask, graph_bufs, custom_mask_buf, mask_indptr_buf) -> None:
        torch = _torch()
        self._layout = _layout_code(kv_layout)  # KeyError for anything but "NHD" / "HND"
        if jit_args is not None or jit_kwargs is not None:
            raise NotImplementedError("jit_args / jit_kwargs (custom attention variants) are not supported")
        if variant_owns_mask:
            raise NotImplementedError("variant_owns_mask (custom attention variants) is not supported")
        if backend not in _BACKENDS:
            raise NotImplementedError(f"backend {backend!r} is not available; use 'auto', 'fa2' or 'fa3'")
        self._kv_layout = kv_layout
        self._backend = backend
        self._use_cuda_graph = bool(use_cuda_graph)
        if self._use_cuda_graph:
            for name, buf, _ in graph_bufs:
                if not isinstance(buf, torch.Tensor):
                    raise ValueError(f"use_cuda_graph=True requires {name} (a CUDA int32 tensor); got "
                                     f"{type(buf).__name__}")
                if buf.dim() != 1:
                    raise ValueError(f"{name} must be 1-D; got shape {tuple(buf.shape)}")
            self._fixed_batch_size = len(graph_bufs[0][1]) - 1
            if self._fixed_batch_size < 0:
                raise ValueError(f"{graph_bufs[0][0]} must have batch_size + 1 >= 1 entries; got 0")
            for name, buf, extra in graph_bufs[1:]:
                if extra is not None and len(buf) != self._fixed_batch_size + extra:
                    want = "batch_size + 1" if extra == 1 else "batch_size"
                    raise ValueError(f"The length of {name} ({len(buf)}) should be {want} "
                                     f"({self._fixed_batch_size + extra}, from len({graph_bufs[0][0]}))")
        else:
            self._fixed_batch_size = 0
        self.reset_workspace_buffer(float_workspace_buffer, None)
        if self._use_cuda_graph:
            for name, buf, _ in graph_bufs:
                self._check_device_buf(buf, name, torch.int32)
        self._custom_mask_buf = custom_mask_buf
        self._mask_indptr_buf = mask_indptr_buf
        self._max_total_num_rows: Optional[int] = None
        self._copy_done = None
        self._planned = False
        self._rope_pos_buf = None  # under CUDA graphs: the RoPE positions' fixed storage
        self._rope_pos = None  # (q positions, k positions) of the current plan, or None

    def _check_device_buf(self, buf, name: str, dtype) -> None:
        if buf.dtype != dtype:
            want, got = str(dtype).replace("torch.", ""), str(buf.dtype).replace("torch.", "")
            raise ValueError(f"{name} must be {want}; got {got}")
        if not buf.is_cuda or buf.device != self.device:
            raise ValueError(f"{name} must be on {self.device} (the workspace's device); got {buf.device}")
        if not buf.is_contiguous():
            raise ValueError(f"{name} must be contiguous")

    # -- properties and helpers FlashInfer exposes -----------------------------------------------------
    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @property
    def resolved_backend(self) -> str:
        return "fa2"

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer) -> None:
        """New workspaces (the float one: a 16-byte aligned contiguous CUDA buffer; the int one
        None for a new 8 MiB buffer). The current plan keeps the buffers it was made with; the
        next plan uses these (under CUDA graphs: re-capture after it)."""
        BatchDecodeWithPagedKVCacheWrapper.reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer)

    # -- plan -----------------------------------------------------------------------------------------
    def _options(self, causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
                 head_dim_qk) -> tuple:
        """The attention options as the kernel takes them (checked): (pos code, window, cap,
        sm_scale, rope_scale, rope_theta)."""
        op = f"{self._NAME}.plan"
        pos = _pos_code(pos_encoding_mode)  # KeyError for anything but NONE / ROPE_LLAMA / ALIBI (or 0, 1, 2)
        if pos == 1 and self._PAGED and self._use_cuda_graph:
            raise NotImplementedError(
                f"{self._NAME}: pos_encoding_mode='ROPE_LLAMA' is not supported under CUDA graphs "
                "(use_cuda_graph=True): run gathers the plan's keys out of the pages into copies whose size depends "
                "on the plan; apply RoPE before appending to the cache (flashinfer.rope.apply_rope_pos_ids) and plan "
                "with pos_encoding_mode='NONE', or plan without CUDA graphs")
        window = -1 if window_left is None or int(window_left) < 0 else int(window_left)
        cap = _soft_cap(logits_soft_cap)
        scale = 1.0 / math.sqrt(head_dim_qk) if sm_scale is None else _finite(sm_scale, "sm_scale", op)
        if pos == 1:
            rs = _check_rope_param(rope_scale, "rope_scale", 1.0, op)
            rt = _check_rope_param(rope_theta, "rope_theta", 1e4, op)
        else:
            rs, rt = 1.0, 1e4
        return pos, window, cap, scale, rs, rt

    def _set_options(self, causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap, sm_scale,
                     rope_scale, rope_theta, opts=None) -> None:
        """Records the options under FlashInfer's attribute names (as given) and as the kernel
        takes them (plan() and the deprecated forward())."""
        if opts is None:
            opts = self._options(causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale,
                                 rope_theta, self._head_dim_qk)
        self._causal = bool(causal)
        self._pos_encoding_mode = pos_encoding_mode
        self._use_fp16_qk_reduction = use_fp16_qk_reduction
        self._window_left = -1 if window_left is None else int(window_left)
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        self._rope_scale = rope_scale
        self._rope_theta = rope_theta
        self._pos_code, self._k_window, self._k_cap, self._k_sm_scale, self._k_rope_scale, self._k_rope_theta = opts
        if self._pos_code == 1 and self._rope_pos is None:
            self._upload_rope_positions(self._non_blocking)
        if self._PAGED and self._gather is None and (self._pos_code == 1 or self._kv_dequant is not None):
            self._upload_gather_indices(self._non_blocking)

    @staticmethod
    def _split_part_bytes(total_q, num_qo_heads, head_dim_vo, chunks):
        """Bytes of split-KV's partial states in the float workspace: o [total_q, chunks,
        num_qo_heads, head_dim_vo] (16-bit; rounded to 256) and the LSEs [total_q, chunks + 1,
        num_qo_heads] (float32; the last slice holds the merged LSE when run asks for none)."""
        return ((total_q * chunks * num_qo_heads * head_dim_vo * 2 + 255) // 256 * 256,
                total_q * (chunks + 1) * num_qo_heads * 4)

    def _split_chunks_fit(self, total_q, num_qo_heads, head_dim_vo) -> int:
        """The most split-KV chunks whose partial states fit the float workspace (<= 64)."""
        ws = self._float_workspace_buffer
        n = ws.numel() * ws.element_size() if ws is not None else 0
        c = 64
        while c > 1 and sum(self._split_part_bytes(total_q, num_qo_heads, head_dim_vo, c)) > n:
            c //= 2
        return c

    def _plan_common(self, qo_h, kv_indptr_h, kv_lens, pages_h, last_h, page_size, num_qo_heads, num_kv_heads,
                     head_dim_qk, head_dim_vo, custom_mask, packed_custom_mask, causal, pos_encoding_mode,
                     use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta, q_data_type,
                     kv_data_type, o_data_type, non_blocking, one_m_tile) -> None:
        torch = _torch()
        op = f"{self._NAME}.plan"
        num_qo_heads, num_kv_heads, head_dim_qk = int(num_qo_heads), int(num_kv_heads), int(head_dim_qk)
        head_dim_vo = head_dim_qk if head_dim_vo is None else int(head_dim_vo)
        if num_qo_heads <= 0 or num_kv_heads <= 0 or num_qo_heads % num_kv_heads != 0:
            raise ValueError(f"{op}: num_qo_heads ({num_qo_heads}) must be a positive multiple of num_kv_heads "
                             f"({num_kv_heads})")
        if (head_dim_qk, head_dim_vo) not in _BATCH_HEAD_DIMS:
            raise ValueError(f"{op}: (head_dim_qk, head_dim_vo) must be (64, 64), (128, 128), (256, 256), (512, 512) "
                             f"or (192, 128); got ({head_dim_qk}, {head_dim_vo})")
        if str(q_data_type).replace("torch.", "") in _KV_FP8_CODES:
            raise NotImplementedError(f"{op}: q_data_type {q_data_type}: an fp8 q is not supported (use float16 or "
                                      "bfloat16; kv_data_type may be float8_e4m3fn or float8_e5m2)")
        q_name = _dtype_name(q_data_type if q_data_type is not None else "float16", "q_data_type")
        kv_name = _dtype_name(kv_data_type, "kv_data_type", fp8_ok=True) or q_name
        o_name = _dtype_name(o_data_type, "o_data_type") or q_name
        if kv_name != q_name and kv_name not in _KV_FP8_CODES:
            raise NotImplementedError(f"{op}: kv_data_type must equal q_data_type ({q_name}) or be fp8 "
                                      f"(float8_e4m3fn / float8_e5m2); got {kv_name}")
        if kv_name != q_name and self._PAGED and self._use_cuda_graph:
            raise NotImplementedError(
                f"{op}: an fp8 paged cache (kv_data_type={kv_name}) is not supported under CUDA graphs "
                "(use_cuda_graph=True): run gathers the plan's keys out of the pages into copies whose size depends "
                "on the plan; plan without CUDA graphs or with a 16-bit cache")
        opts = self._options(causal, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale,
                             rope_theta, head_dim_qk)
        qo_lens = _check_indptr(qo_h, "qo_indptr")
        batch = qo_h.size - 1
        total_q = int(qo_h[-1])
        group = num_qo_heads // num_kv_heads
        if kv_lens.size and int(kv_lens.max()) >= 2 ** 31 - 64:
            b = int(np.argmax(kv_lens))
            raise ValueError(f"{op}: request {b} has {int(kv_lens[b])} keys; a request must have fewer than 2**31 - 64")
        if total_q * group >= 2 ** 31 - 128:
            raise ValueError(f"{op}: qo_indptr[-1] * (num_qo_heads / num_kv_heads) must be < 2**31 - 128")
        graph = self._use_cuda_graph
        if graph:
            self._check_graph_plan(batch, total_q)

        # custom mask: each request's [qo_len_b, kv_len_b] bits, its segment byte-aligned
        mask_dev = None
        mask_indptr_h = None
        if packed_custom_mask is not None or custom_mask is not None:
            mask_indptr_h = _mask_byte_indptr(qo_lens, kv_lens)
            nbytes = int(mask_indptr_h[-1])
            if packed_custom_mask is not None:
                dt = str(getattr(packed_custom_mask, "dtype", "")).replace("torch.", "")
                if dt != "uint8":
                    raise ValueError(f"{op}: packed_custom_mask must be uint8 (bits packed little-endian); got {dt}")
                n = math.prod(int(x) for x in packed_custom_mask.shape)
                if n < nbytes:
                    raise ValueError(f"{op}: packed_custom_mask must hold sum(ceil(qo_len_b * kv_len_b / 8)) = "
                                     f"{nbytes} bytes (each request's segment byte-aligned); got {n}")
                packed = packed_custom_mask
            else:
                bits = qo_lens.astype(np.int64) * kv_lens.astype(np.int64)
                n = math.prod(int(x) for x in custom_mask.shape)
                if n != int(bits.sum()):
                    raise ValueError(f"{op}: custom_mask must hold sum(qo_len_b * kv_len_b) = {int(bits.sum())} "
                                     f"elements (each request's [qo_len_b, kv_len_b] block, flattened); got {n}")
                bit_indptr = np.zeros(batch + 1, np.int64)
                np.cumsum(bits, out=bit_indptr[1:])
                packed, _ = segment_packbits(custom_mask.reshape(-1), bit_indptr, bitorder="little")
            if graph:
                cbuf, ibuf = self._custom_mask_buf, self._mask_indptr_buf
                if not isinstance(cbuf, torch.Tensor):
                    raise ValueError("custom_mask_buf must be initialized with a torch.Tensor in CUDA graph mode if a "
                                     "custom mask is used")
                if not isinstance(ibuf, torch.Tensor):
                    raise ValueError("mask_indptr_buf must be initialized with a torch.Tensor in CUDA graph mode if a "
                                     "custom mask is used")
                self._check_device_buf(cbuf, "custom_mask_buf", torch.uint8)
                self._check_device_buf(ibuf, "mask_indptr_buf", torch.int32)
                if cbuf.dim() != 1 or cbuf.numel() < nbytes:
                    raise ValueError(f"custom_mask_buf must be 1-D with at least {nbytes} bytes (the packed mask); got "
                                     f"shape {tuple(cbuf.shape)}")
                if ibuf.dim() != 1 or ibuf.numel() != batch + 1:
                    raise ValueError(f"mask_indptr_buf must be 1-D with batch_size + 1 = {batch + 1} entries; got "
                                     f"shape {tuple(ibuf.shape)}")
                mask_src = _as_device_u8(packed, self.device)[:nbytes]
                with torch.cuda.device(self.device):
                    cbuf[:nbytes].copy_(mask_src, non_blocking=non_blocking)
                mask_dev = cbuf
            else:
                mask_dev = _as_device_u8(packed, self.device)

        # work items: (request, row tile) pairs; one M tile under CUDA graphs (a launch shape
        # that does not depend on the plan) and for batch invariance. Split-KV (prefill.h
        # prefill_num_chunks): a batch whose CTAs leave SMs idle (e.g. a cascade's shared prefix)
        # cuts every request's keys into chunks whose partial states go to the float workspace and
        # are merged after the kernel; not under CUDA graphs or fixed_split_size / disable_split_kv
        # (their launch shape and results must not depend on the batch), and only as many chunks
        # as the workspace holds.
        sms = _ONE_M_TILE_SMS if (graph or one_m_tile) else _num_sms(self.device)
        total_q = int(qo_h[-1])
        max_chunks = 1 if (graph or one_m_tile) else self._split_chunks_fit(total_q, num_qo_heads, head_dim_vo)
        if max_chunks > 1 and hasattr(_prefill, "plan_batch_split"):
            items_list, m_tiles, chunks = _prefill.plan_batch_split(qo_lens.tolist(), kv_lens.tolist(), num_qo_heads,
                                                                    num_kv_heads, head_dim_qk, head_dim_vo, sms,
                                                                    max_chunks)
        else:
            items_list, m_tiles = _prefill.plan_batch(qo_lens.tolist(), kv_lens.tolist(), num_qo_heads, num_kv_heads,
                                                      head_dim_qk, head_dim_vo, sms)
            chunks = 1
        self._num_chunks, self._o_part, self._lse_part = int(chunks), None, None
        if chunks > 1:
            o_bytes, l_bytes = self._split_part_bytes(total_q, num_qo_heads, head_dim_vo, chunks)
            ws = self._float_workspace_buffer
            ws = ws if ws.dtype == torch.uint8 else ws.reshape(-1).view(torch.uint8)
            self._o_part = ws[:o_bytes].view(getattr(torch, q_name))
            self._lse_part = ws[o_bytes:o_bytes + l_bytes].view(torch.float32)
        items = np.asarray(items_list, dtype=np.int32).reshape(-1, 2)
        num_items = items.shape[0]
        if graph:
            max_rows = total_q if self._max_total_num_rows is None else self._max_total_num_rows
            if self._graph_m_tiles is not None and m_tiles != self._graph_m_tiles:
                raise RuntimeError(f"{op}: the work items' M tiles changed under CUDA graphs ({self._graph_m_tiles} -> "
                                   f"{m_tiles})")
            rows = _TILE_ROWS * m_tiles
            items = _pad_items(items, (max_rows * group + (rows - 1) * batch) // rows, op, rows)
            num_items = items.shape[0]

        # device copies: one pinned staging buffer -> int workspace copy (and, under CUDA graphs,
        # the caller's buffers)
        qo_i32 = qo_h.astype(np.int32)
        kv_i32 = kv_indptr_h.astype(np.int32)
        parts = [("items", items.reshape(-1))]
        if not graph:
            parts += [("qo", qo_i32), ("kv", kv_i32)]
            if self._PAGED:
                parts += [("pages", pages_h.astype(np.int32)), ("last", last_h.astype(np.int32))]
            if mask_indptr_h is not None:
                parts.append(("mask_indptr", mask_indptr_h.astype(np.int32)))
        views = self._stage(parts, non_blocking)
        if graph:
            with torch.cuda.device(self.device):
                self._qo_indptr_buf.copy_(torch.from_numpy(qo_i32), non_blocking=non_blocking)
                self._kv_indptr_dev.copy_(torch.from_numpy(kv_i32), non_blocking=non_blocking)
                if self._PAGED:
                    self._paged_kv_indices_buf[:pages_h.size].copy_(torch.from_numpy(pages_h.astype(np.int32)),
                                                                    non_blocking=non_blocking)
                    self._paged_kv_last_page_len_buf.copy_(torch.from_numpy(last_h.astype(np.int32)),
                                                           non_blocking=non_blocking)
                if mask_indptr_h is not None:
                    self._mask_indptr_buf.copy_(torch.from_numpy(mask_indptr_h.astype(np.int32)),
                                                non_blocking=non_blocking)
            if self._max_total_num_rows is None:
                self._max_total_num_rows = total_q
            self._graph_m_tiles = m_tiles
        else:
            self._qo_indptr_buf = views["qo"]
            self._kv_indptr_dev = views["kv"]
            if self._PAGED:
                self._paged_kv_indices_buf = views["pages"]
                self._paged_kv_last_page_len_buf = views["last"]
            self._custom_mask_buf = mask_dev
            self._mask_indptr_buf = views.get("mask_indptr")
        self._set_kv_indptr_attr()

        # the plan
        self._items = views["items"]
        self._num_items = int(num_items)
        self._m_tiles = int(m_tiles)
        self._mask = mask_dev
        self._mask_indptr = self._mask_indptr_buf if mask_dev is not None else None
        self._batch_size = batch
        self._qo_indptr_last = total_q
        self._qo_lens_h, self._kv_lens_h = qo_lens, kv_lens
        self._kv_indptr_h = kv_indptr_h
        self._total_kv = int(kv_indptr_h[-1]) if not self._PAGED else int(kv_lens.sum())
        self._page_size = int(page_size)
        self._max_page = int(pages_h.max()) if (self._PAGED and pages_h.size) else -1
        self._num_qo_heads, self._num_kv_heads = num_qo_heads, num_kv_heads
        self._head_dim_qk, self._head_dim_vo = head_dim_qk, head_dim_vo
        self._q_name, self._o_name = q_name, o_name
        self._cached_q_data_type = getattr(torch, q_name)
        self._cached_kv_data_type = getattr(torch, kv_name)
        self._cached_o_data_type = getattr(torch, o_name)
        self._kv_name = kv_name
        # fp8 K / V: run casts them to q's dtype (exact) and runs the 16-bit kernel
        self._kv_dequant = self._cached_q_data_type if kv_name != q_name else None
        self._pages_h = pages_h  # (paged) the pages in use, for the gather's index arrays
        self._gather = None  # (paged, fp8 or RoPE) (page, slot, token kv_indptr) on the device
        # o_data_type other than q's: the kernel writes q's dtype into a temporary that run()
        # casts into o (one extra pass over o)
        self._o_cast = self._cached_o_data_type if o_name != q_name else None
        self._rope_pos = None
        self._non_blocking = non_blocking
        self._to_dlpack = torch_exporter(torch)
        self._tensor_type = torch.Tensor
        self._raw_stream = torch_stream_source(torch)
        self._dev_index = self.device.index or 0
        self._set_options(causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap, sm_scale,
                          rope_scale, rope_theta, opts)
        self._planned = True

    def _check_graph_plan(self, batch: int, total_q: int) -> None:
        """Under CUDA graphs: the batch size fixed at construction, at most the first plan's query rows."""
        if batch != self._fixed_batch_size:
            raise ValueError(f"The batch size should be fixed in CUDA graph mode: the runtime batch size {batch} "
                             f"mismatches the batch size {self._fixed_batch_size} set at initialization")
        if self._max_total_num_rows is not None and total_q > self._max_total_num_rows:
            raise ValueError(f"The total number of rows in qo_indptr {total_q} in CUDA graph mode cannot exceed "
                             f"the number of rows of the first plan ({self._max_total_num_rows})")

    def _stage(self, parts, non_blocking) -> dict:
        """Copies the int32 arrays ``parts`` ((name, array) pairs) into the int workspace (16-byte
        aligned regions, in order, from offset 0) through the pinned buffer; returns int32 views
        of the workspace by name."""
        torch = _torch()
        offsets, pos = [], 0
        for _, a in parts:
            offsets.append(pos)
            pos += (a.nbytes + 15) // 16 * 16
        if pos > self._int_workspace_buffer.numel():
            if self._use_cuda_graph:
                raise ValueError(f"int workspace too small for this plan under CUDA graphs ({pos} bytes; have "
                                 f"{self._int_workspace_buffer.numel()})")
            self.reset_workspace_buffer(self._float_workspace_buffer,
                                        torch.empty(pos * 2, dtype=torch.uint8, device=self.device))
        if self._copy_done is not None:
            self._copy_done.synchronize()  # the pinned staging buffer is free again
        host = self._pin_memory_int_workspace_buffer.numpy()
        for off, (_, a) in zip(offsets, parts):
            host[off:off + a.nbytes] = a.view(np.uint8)
        with torch.cuda.device(self.device):
            if pos:
                self._int_workspace_buffer[:pos].copy_(self._pin_memory_int_workspace_buffer[:pos],
                                                       non_blocking=non_blocking)
            self._copy_done = torch.cuda.Event()
            self._copy_done.record()
        ws = self._int_workspace_buffer
        return {name: ws[off:off + a.nbytes].view(torch.int32) for off, (name, a) in zip(offsets, parts)}

    def _upload_rope_positions(self, non_blocking) -> None:
        """Ragged RoPE positions: query row i of request b at i + kv_len_b - qo_len_b, key j at j
        (int32 on the device; under CUDA graphs in storage fixed by the first RoPE plan)."""
        torch = _torch()
        qo_lens, kv_lens = self._qo_lens_h, self._kv_lens_h
        nq, nk = self._qo_indptr_last, self._total_kv
        q_pos = _offsets_in_requests(qo_lens) + np.repeat(kv_lens - qo_lens, qo_lens)
        pos = np.concatenate([q_pos, _offsets_in_requests(kv_lens)]).astype(np.int32)
        with torch.cuda.device(self.device):
            if self._use_cuda_graph:
                if self._rope_pos_buf is None:
                    self._rope_pos_q_cap = max(nq, self._max_total_num_rows or 0)
                    self._rope_pos_buf = torch.empty(self._rope_pos_q_cap + max(nk, 1), dtype=torch.int32,
                                                     device=self.device)
                qcap = self._rope_pos_q_cap
                if nk > self._rope_pos_buf.numel() - qcap:
                    raise ValueError(f"{self._NAME}.plan: under CUDA graphs with ROPE_LLAMA the first RoPE plan fixes "
                                     f"the most keys ({self._rope_pos_buf.numel() - qcap}); got kv_indptr[-1] = {nk}")
                buf = self._rope_pos_buf
                buf[:nq].copy_(torch.from_numpy(pos[:nq]), non_blocking=non_blocking)
                buf[qcap:qcap + nk].copy_(torch.from_numpy(pos[nq:]), non_blocking=non_blocking)
                self._rope_pos = (buf[:nq], buf[qcap:qcap + nk])
            else:
                dev = torch.from_numpy(pos).to(self.device, non_blocking=non_blocking)
                self._rope_pos = (dev[:nq], dev[nq:])

    def _upload_gather_indices(self, non_blocking) -> None:
        """Paged fp8 / RoPE: where the plan's tokens sit. Token t of request b is in page
        ``indices[indptr[b] + t // page_size]``, slot ``t % page_size``; run gathers those (page,
        slot) pairs, in request order, into ragged ``[total_kv, num_kv_heads, head_dim]`` K / V and
        launches over the token offsets ``kv_indptr`` = cumsum(kv_len_b) (int32). Page and slot
        are int64, the index type torch's advanced indexing takes without a conversion."""
        torch = _torch()
        kv_lens, ps = self._kv_lens_h, self._page_size
        t = _offsets_in_requests(kv_lens)
        page = self._pages_h[np.repeat(self._kv_indptr_h[:-1], kv_lens) + t // ps]
        tok_indptr = np.zeros(kv_lens.size + 1, np.int32)
        tok_indptr[1:] = np.cumsum(kv_lens)
        with torch.cuda.device(self.device):
            idx = torch.from_numpy(np.stack([page, t % ps])).to(self.device, non_blocking=non_blocking)
            self._gather = (idx[0], idx[1], torch.from_numpy(tok_indptr).to(self.device, non_blocking=non_blocking))

    # -- run ------------------------------------------------------------------------------------------
    def _check_run(self):
        if not self._planned:
            raise RuntimeError(f"{self._NAME}.run: call plan() (begin_forward) first")

    def _launch(self, q, k, v, kv_indptr, pages, last, layout, out, lse, return_lse, lse_base, lse_layout, enable_pdl,
                sm_scale, v_scale):
        """Checks q / out / lse against the plan, allocates the outputs, launches the kernel (paged
        when ``pages`` is given, else ragged k / v in ``layout`` over the token offsets
        ``kv_indptr``) and applies the LSE base / layout and the o_data_type cast."""
        if lse_base not in ("log2", "ln"):
            raise ValueError(f"lse_base must be 'log2' or 'ln'; got {lse_base!r}")
        if lse_layout not in ("NH", "HN"):
            raise ValueError(f"lse_layout must be 'NH' or 'HN'; got {lse_layout!r}")
        n, hq = self._qo_indptr_last, self._num_qo_heads
        o_shape = (n, hq, self._head_dim_vo)
        is_torch = type(q) is self._tensor_type
        fw = framework_of(q, "q")
        want_lse = return_lse or lse is not None
        o_cast = self._o_cast
        if not is_torch and (o_cast is not None or (want_lse and lse_layout == "HN")):
            raise ValueError(f"{self._NAME}.run: o_data_type other than q's dtype and lse_layout='HN' are supported "
                             f"for torch tensors only; got q as {type(q).__module__}.{type(q).__name__}")
        # q against the plan (the binding checks strides, alignment, devices and k / v)
        self._check_plan_dtype(q, "q", "q")
        if len(q.shape) != 3:
            raise ValueError(f"q must be 3-D [qo_indptr[-1], num_qo_heads, head_dim_qk]; got shape {tuple(q.shape)}")
        if q.shape[0] != n:
            raise ValueError(f"q.shape[0] ({q.shape[0]}) does not match qo_indptr[-1] ({n}) of the plan: q must have "
                             "shape [total_tokens, num_heads, head_dim] where total_tokens = qo_indptr[-1]")
        if q.shape[1] != hq or q.shape[2] != self._head_dim_qk:
            raise ValueError(f"q must be [{n}, num_qo_heads={hq}, head_dim_qk={self._head_dim_qk}] as planned; got "
                             f"{tuple(q.shape)}")
        # outputs
        if out is not None and is_torch:
            want = o_cast if o_cast is not None else q.dtype
            if out.dtype != want:
                raise ValueError(f"The dtype of out {out.dtype} does not match the o_data_type {want} specified in "
                                 "plan function.")
            if tuple(out.shape) != o_shape:
                raise ValueError(f"Invalid shape of out: expected {o_shape}, got {tuple(out.shape)}")
            if out.device != q.device:
                raise ValueError(f"Invalid device of out: expected {q.device}, got {out.device}")
        k_out = out if (out is not None and o_cast is None) else fw.empty(o_shape, q)
        k_lse = None
        if want_lse:
            l_shape = (n, hq) if lse_layout == "NH" else (hq, n)
            if lse is not None and is_torch:
                if lse.dtype != self._f32:
                    raise ValueError(f"Invalid dtype of lse: expected torch.float32, got {lse.dtype}")
                if tuple(lse.shape) != l_shape:
                    raise ValueError(f"Invalid shape of lse: expected {l_shape}, got {tuple(lse.shape)}")
                if lse.device != q.device:
                    raise ValueError(f"Invalid device of lse: expected {q.device}, got {lse.device}")
            if lse_layout == "NH" and (lse is None or not is_torch or lse.is_contiguous()):
                if lse is None:
                    lse = fw.empty_f32((n, hq), q)
                k_lse = lse
            else:
                k_lse = fw.empty_f32((n, hq), q)  # the kernel's [N, H]; transposed / copied below
        if n and self._num_items:
            if self._pos_code == 1:  # ragged RoPE: rotated copies of q and k
                q, k, v = self._rope_copies(q, k, v, layout)
            dl = self._to_dlpack if is_torch else fw.to_dlpack
            mask = self._mask
            split = {} if self._num_chunks <= 1 else {"num_chunks": self._num_chunks, "o_part": self._to_dlpack(
                self._o_part), "lse_part": self._to_dlpack(self._lse_part)}
            _prefill.batch_prefill(
                dl(q), to_dlpack(k, "k"), to_dlpack(v, "v"), to_dlpack(k_out, "out"),
                None if k_lse is None else to_dlpack(k_lse, "lse"),
                None if mask is None else self._to_dlpack(mask),
                None if mask is None else self._to_dlpack(self._mask_indptr),
                self._to_dlpack(self._qo_indptr_buf), self._to_dlpack(kv_indptr),
                None if pages is None else self._to_dlpack(pages), None if last is None else self._to_dlpack(last),
                self._to_dlpack(self._items), self._num_items, self._m_tiles,
                self._page_size if pages is not None else 1, layout, self._causal and mask is None,
                self._k_window, sm_scale, self._k_cap, self._pos_code == 2, v_scale,
                self._raw_stream(self._dev_index) if is_torch else fw.stream(q), enable_pdl is not False, **split)
        if want_lse:
            if k_lse is not lse:  # (torch) HN, or a given non-contiguous NH lse
                src = k_lse if lse_layout == "NH" else k_lse.t()
                if lse is None:
                    lse = src.contiguous()
                else:
                    lse.copy_(src)
            if lse_base == "ln":
                fw.scale_(lse, _LN2)
        if o_cast is not None:
            out = k_out.to(o_cast) if out is None else out.copy_(k_out)
        else:
            out = k_out
        return (out, lse) if return_lse else out

    def _rope_copies(self, q, k, v, layout):
        """Rotated copies of q and of ragged k's (``layout``) first kv_indptr[-1] rows (v cut to as
        many rows: the binding takes k and v of one length)."""
        from .rope import apply_rope_pos_ids

        if self._rope_pos is None:
            self._upload_rope_positions(True)
        q_pos, k_pos = self._rope_pos
        rs, rt = self._k_rope_scale, self._k_rope_theta
        q_rot, _ = apply_rope_pos_ids(q, q[:, :1], q_pos, rope_scale=rs, rope_theta=rt)
        nk = self._total_kv
        if nk == 0:
            return q_rot, k, v
        hnd = layout == 1
        k_nhd = k.swapaxes(0, 1) if hnd else k  # [total_kv, num_kv_heads, d]
        if k_nhd.shape[0] != nk:
            k_nhd = k_nhd[:nk]
            v = v[:, :nk] if hnd else v[:nk]
        k_rot, _ = apply_rope_pos_ids(k_nhd, k_nhd[:, :1], k_pos, rope_scale=rs, rope_theta=rt)
        return q_rot, (k_rot.swapaxes(0, 1) if hnd else k_rot), v

    def _check_plan_dtype(self, t, what: str, kind: str = "kv") -> None:
        """``t``'s dtype against the plan's ``q_data_type`` (kind "q") or ``kv_data_type`` (kind
        "kv"), with FlashInfer's message."""
        cached, name = ((self._cached_q_data_type, self._q_name) if kind == "q" else
                        (self._cached_kv_data_type, self._kv_name))
        if type(t) is self._tensor_type:
            if t.dtype != cached:
                raise ValueError(f"The dtype of {what} {t.dtype} does not match the {kind}_data_type {cached} "
                                 "specified in plan function.")
        elif _dtype_of(t) != name:
            raise ValueError(f"The dtype of {what} {_dtype_of(t)} does not match the {kind}_data_type {name} "
                             "specified in plan function.")

    def end_forward(self) -> None:
        """Deprecated; has no effect."""


def _no_multi_item_scoring(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr) -> None:
    if (prefix_len_ptr is not None or token_pos_in_items_ptr is not None or max_item_len_ptr is not None
            or token_pos_in_items_len):
        raise NotImplementedError("multi-item scoring (prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, "
                                  "max_item_len_ptr) is not supported")


class BatchPrefillWithPagedKVCacheWrapper(_BatchPrefillBase):
    r"""Batch prefill / append attention: each request's query rows against its keys in a paged
    KV cache (spec §1.4). ``plan`` once per batch (host work), ``run`` per layer.

    Request ``b`` owns q / o rows ``qo_indptr[b]:qo_indptr[b+1]`` and the pages
    ``paged_kv_indices[paged_kv_indptr[b]:paged_kv_indptr[b+1]]`` (kv_len_b = (pages - 1) *
    page_size + last_page_len_b, or ``seq_lens[b]`` when given). Masks (bottom-right causal,
    sliding window, custom), soft cap, ALiBi, GQA of any group size and the LSE are as in
    :func:`single_prefill_with_kv_cache`; head dims (qk, vo) (64, 64), (128, 128), (256, 256),
    (512, 512), (192, 128); q float16 / bfloat16, the cache q's dtype or fp8 (``q_data_type`` /
    ``kv_data_type`` of the plan, checked at run). ``q_scale`` / ``k_scale`` multiply sm_scale,
    ``v_scale`` the output (not the LSE).

    An fp8 cache (``kv_data_type`` ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``) and
    ``pos_encoding_mode="ROPE_LLAMA"`` (query row i of request b at position ``i + kv_len_b -
    qo_len_b``, key j at j, as in the ragged wrapper) take another path: plan builds the index of
    the batch's tokens in the pages, and run gathers them into ragged K / V copies (cast to q's
    dtype, exactly; rotated copies of q and k for RoPE) and runs the ragged kernel on them. It
    costs a pass over the keys and values the batch reads and memory for those copies; it is not
    available under CUDA graphs (``NotImplementedError`` at plan: the copies' size depends on the
    plan). Not supported: fp8 q, multi-item scoring, sinks, NVFP4, custom variants.
    ``fixed_split_size`` / ``disable_split_kv`` are accepted (no split-KV here; they fix the row
    tiling, so each request's result does not depend on the rest of the batch);
    ``use_fp16_qk_reduction`` and the cuDNN-only arguments are ignored.

    CUDA graphs (``use_cuda_graph=True``): the four index buffers are required (CUDA int32;
    ``custom_mask_buf`` uint8 / ``mask_indptr_buf`` int32 when a custom mask is planned); the
    batch size is ``len(qo_indptr_buf) - 1`` and the first plan fixes the most query rows. Every
    plan writes its page table into those buffers and its work items (padded to a fixed count)
    into the int workspace, so a captured ``run`` replays correctly after a new plan.
    """

    _PAGED = True
    _NAME = "BatchPrefillWithPagedKVCacheWrapper"

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf=None, paged_kv_indptr_buf=None, paged_kv_indices_buf=None,
                 paged_kv_last_page_len_buf=None, custom_mask_buf=None, mask_indptr_buf=None, backend: str = "auto",
                 jit_args=None, jit_kwargs=None, variant_owns_mask: bool = False) -> None:
        self._init_common(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs,
                          variant_owns_mask,
                          [("qo_indptr_buf", qo_indptr_buf, None), ("paged_kv_indptr_buf", paged_kv_indptr_buf, 1),
                           ("paged_kv_indices_buf", paged_kv_indices_buf, None),
                           ("paged_kv_last_page_len_buf", paged_kv_last_page_len_buf, 0)],
                          custom_mask_buf, mask_indptr_buf)
        self._qo_indptr_buf = qo_indptr_buf
        self._paged_kv_indptr_buf = paged_kv_indptr_buf
        self._paged_kv_indices_buf = paged_kv_indices_buf
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buf
        self._kv_indptr_dev = paged_kv_indptr_buf
        self._graph_m_tiles = None
        self._f32 = _torch().float32

    def _set_kv_indptr_attr(self) -> None:
        self._paged_kv_indptr_buf = self._kv_indptr_dev

    def prewarm_paged_kv_stride_variant(self, variant: str = "independent") -> None:
        """K and V with independent strides need no separate kernel here: a no-op."""

    def plan(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads: int,
             num_kv_heads: int, head_dim_qk: int, page_size: int, head_dim_vo: Optional[int] = None, custom_mask=None,
             packed_custom_mask=None, causal: bool = False, pos_encoding_mode: str = "NONE",
             use_fp16_qk_reduction: bool = False, sm_scale: Optional[float] = None, window_left: int = -1,
             logits_soft_cap: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type: Any = "float16", kv_data_type: Any = None,
             o_data_type: Any = None, non_blocking: bool = True, prefix_len_ptr=None, token_pos_in_items_ptr=None,
             token_pos_in_items_len: int = 0, max_item_len_ptr=None, seq_lens=None, seq_lens_q=None,
             block_tables=None, max_token_per_sequence: Optional[int] = None, max_sequence_kv: Optional[int] = None,
             fixed_split_size: Optional[int] = None, disable_split_kv: bool = False,
             uniform_q_len: Optional[int] = None) -> None:
        """Plans the batch (host work; may synchronize). ``custom_mask``: bool, the flat
        concatenation of each request's row-major ``[qo_len_b, kv_len_b]`` block (packed here);
        ``packed_custom_mask``: its bits packed little-endian, each request's segment starting on
        a byte boundary (``segment_packbits(..., bitorder="little")``); it wins over ``custom_mask``.
        ``seq_lens``: each request's KV length, overriding the page table's (at most its pages x
        page_size). ``seq_lens_q``, ``block_tables``, ``max_token_per_sequence``,
        ``max_sequence_kv``, ``uniform_q_len`` (cuDNN / TensorRT-LLM) are ignored."""
        _no_multi_item_scoring(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr)
        op = f"{self._NAME}.plan"
        page_size = int(page_size)
        qo_h = _host_ints(qo_indptr, "qo_indptr")
        indptr_h = _host_ints(paged_kv_indptr, "paged_kv_indptr")
        if qo_h.size != indptr_h.size:
            raise ValueError(f"{op}: the length of qo_indptr ({qo_h.size}) and paged_kv_indptr ({indptr_h.size}) "
                             "should be the same")
        indices_h = _host_ints(paged_kv_indices, "paged_kv_indices")
        last_h = _host_ints(paged_kv_last_page_len, "paged_kv_last_page_len")
        if self._use_cuda_graph and indices_h.size > len(self._paged_kv_indices_buf):
            raise ValueError(f"The length of paged_kv_indices ({indices_h.size}) exceeds the allocated buffer size "
                             f"({len(self._paged_kv_indices_buf)})")
        # indices past indptr[-1] are ignored (SGLang passes a buffer with an uninitialized tail)
        kv_lens, pages_h = _check_page_table(indptr_h, indices_h, last_h, page_size, allow_tail=True)
        batch = indptr_h.size - 1
        if seq_lens is not None:
            seq_h = _host_ints(seq_lens, "seq_lens")
            if seq_h.size != batch:
                raise ValueError(f"{op}: seq_lens must have batch_size ({batch}) entries; got {seq_h.size}")
            cap = np.diff(indptr_h) * page_size
            bad = (seq_h < 0) | (seq_h > cap)
            if np.any(bad):
                b = int(np.argmax(bad))
                raise ValueError(f"{op}: seq_lens[{b}] = {seq_h[b]} must be in [0, pages * page_size = {cap[b]}]")
            if np.any(seq_h != kv_lens):  # a page table of exactly seq_lens keys: each request's first pages
                n_new = (seq_h + page_size - 1) // page_size
                new_indptr = np.zeros(batch + 1, np.int64)
                np.cumsum(n_new, out=new_indptr[1:])
                src = np.arange(int(new_indptr[-1]), dtype=np.int64) + np.repeat(indptr_h[:-1] - new_indptr[:-1], n_new)
                pages_h = pages_h[src]
                last_h = np.where(n_new > 0, seq_h - (n_new - 1) * page_size, 0)
                indptr_h = new_indptr
            kv_lens = seq_h
        self._plan_common(qo_h, indptr_h, kv_lens, pages_h, last_h, page_size, num_qo_heads, num_kv_heads, head_dim_qk,
                          head_dim_vo, custom_mask, packed_custom_mask, causal, pos_encoding_mode,
                          use_fp16_qk_reduction, sm_scale, window_left, logits_soft_cap, rope_scale, rope_theta,
                          q_data_type, kv_data_type, o_data_type, non_blocking,
                          fixed_split_size is not None or bool(disable_split_kv))
        self._seq_lens_kv = seq_lens
        self._block_tables = block_tables

    begin_forward = plan

    def run(self, q, paged_kv_cache, *args, q_scale=None, k_scale=None, v_scale=None, out=None, lse=None,
            return_lse: bool = False, lse_base: str = "log2", lse_layout: str = "NH", enable_pdl: Optional[bool] = None,
            window_left: Optional[int] = None, sinks=None, kv_cache_sf=None, skip_softmax_threshold_scale_factor=None,
            use_fp16_softmax=None, uses_spcompress=None):
        """o ``[qo_indptr[-1], num_qo_heads, head_dim_vo]`` (dtype o_data_type) and, with
        ``return_lse`` (or into a given ``lse``), the LSE of the scaled logits: base 2 (``lse_base
        ="log2"``) or e (``"ln"``), ``[qo_indptr[-1], num_qo_heads]`` (``lse_layout="NH"``) or
        contiguous ``[num_qo_heads, qo_indptr[-1]]`` (``"HN"``). ``paged_kv_cache``: any of the
        four forms (spec §1.0), of the planned ``kv_data_type``. ``q_scale`` / ``k_scale`` multiply
        sm_scale, ``v_scale`` o. No host synchronization; allocates only the outputs (and, with an
        fp8 cache or ROPE_LLAMA, the gathered K / V and the rotated copies)."""
        self._check_run()
        if window_left is not None:
            assert window_left == self._window_left, (
                f"window_left ({window_left}) must equal the planned window_left ({self._window_left})")
        if sinks is not None or kv_cache_sf is not None or skip_softmax_threshold_scale_factor is not None:
            raise NotImplementedError("sinks / kv_cache_sf / skip_softmax_threshold_scale_factor are not supported")
        if use_fp16_softmax or uses_spcompress:
            raise NotImplementedError("use_fp16_softmax / uses_spcompress are not supported")
        k_cache, v_cache = _unpack_paged_kv_cache(paged_kv_cache, self._layout)
        self._check_plan_dtype(k_cache, "k")
        self._check_plan_dtype(v_cache, "v")
        hn, pn = (2, 1) if self._layout == 0 else (1, 2)
        if k_cache.shape[pn] != self._page_size:
            raise ValueError(f"the cache's page_size ({k_cache.shape[pn]}) does not match the page_size of the plan "
                             f"({self._page_size})")
        if k_cache.shape[hn] != self._num_kv_heads or k_cache.shape[3] != self._head_dim_qk or \
                v_cache.shape[3] != self._head_dim_vo:
            raise ValueError(f"the cache's num_kv_heads / head dims ({k_cache.shape[hn]}, {k_cache.shape[3]}, "
                             f"{v_cache.shape[3]}) do not match the plan ({self._num_kv_heads}, {self._head_dim_qk}, "
                             f"{self._head_dim_vo})")
        if k_cache.shape[0] <= self._max_page:
            raise ValueError(f"paged_kv_cache has {k_cache.shape[0]} pages; the planned page table uses page "
                             f"{self._max_page}")
        scale = self._k_sm_scale * _float_scale(q_scale, "q_scale") * _float_scale(k_scale, "k_scale")
        if self._gather is None:
            return self._launch(q, k_cache, v_cache, self._kv_indptr_dev, self._paged_kv_indices_buf,
                                self._paged_kv_last_page_len_buf, self._layout, out, lse, return_lse, lse_base,
                                lse_layout, enable_pdl, scale, _float_scale(v_scale, "v_scale"))
        if tuple(v_cache.shape[:3]) != tuple(k_cache.shape[:3]):  # (checked before the gather reads v)
            raise ValueError(f"paged_kv_cache[1] (v) must have k's pages, page size and heads {tuple(k_cache.shape[:3])};"
                             f" got {tuple(v_cache.shape[:3])}")
        k, v = self._gathered_kv(k_cache, v_cache)  # fp8 / RoPE: the ragged kernel on the plan's tokens
        return self._launch(q, k, v, self._gather[2], None, None, 0, out, lse, return_lse, lse_base, lse_layout,
                            enable_pdl, scale, _float_scale(v_scale, "v_scale"))

    def _gathered_kv(self, k_cache, v_cache):
        """The plan's keys and values copied out of the pages (the index arrays of
        _upload_gather_indices) as ragged NHD ``[total_kv, num_kv_heads, head_dim]`` tensors of q's
        dtype; an fp8 cache is gathered as bytes, then cast (exact)."""
        if type(k_cache) is not self._tensor_type or type(v_cache) is not self._tensor_type:
            raise ValueError(f"{self._NAME}.run: an fp8 paged cache or pos_encoding_mode='ROPE_LLAMA' needs the cache "
                             f"as torch tensors; got {type(k_cache).__module__}.{type(k_cache).__name__}")
        page, slot, _ = self._gather
        to = self._kv_dequant
        out = []
        for c in (k_cache, v_cache):
            if to is not None:
                c = c.view(_torch().uint8)
            r = c[page, slot] if self._layout == 0 else c[page, :, slot]  # [total_kv, num_kv_heads, d]
            out.append(r if to is None else r.view(self._cached_kv_data_type).to(to))
        return out[0], out[1]

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, paged_kv_cache, causal: bool = False, pos_encoding_mode: str = "NONE",
                use_fp16_qk_reduction: bool = False, k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                window_left: int = -1, logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
                rope_scale: Optional[float] = None, rope_theta: Optional[float] = None):
        """Deprecated: sets these options (they replace the planned ones), then ``run``."""
        self._check_run()
        self._set_options(causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap, sm_scale,
                          rope_scale, rope_theta)
        return self.run(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q, paged_kv_cache, causal: bool = False, pos_encoding_mode: str = "NONE",
                           use_fp16_qk_reduction: bool = False, k_scale: Optional[float] = None,
                           v_scale: Optional[float] = None, window_left: int = -1,
                           logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
                           rope_scale: Optional[float] = None, rope_theta: Optional[float] = None):
        """Deprecated: as ``forward``, returning ``(o, lse)``."""
        self._check_run()
        self._set_options(causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap, sm_scale,
                          rope_scale, rope_theta)
        return self.run_return_lse(q, paged_kv_cache, k_scale=k_scale, v_scale=v_scale)


class BatchPrefillWithRaggedKVCacheWrapper(_BatchPrefillBase):
    r"""Batch prefill attention over ragged (contiguous, concatenated) K / V (spec §1.5): request
    ``b`` owns q / o rows ``qo_indptr[b]:qo_indptr[b+1]`` and k / v rows
    ``kv_indptr[b]:kv_indptr[b+1]`` (``[kv_indptr[-1], num_kv_heads, head_dim]`` NHD, or
    ``[num_kv_heads, kv_indptr[-1], head_dim]`` HND). Options as in
    :class:`BatchPrefillWithPagedKVCacheWrapper`, plus ``pos_encoding_mode="ROPE_LLAMA"``:
    rotated copies of q (row i of request b at position ``i + kv_len_b - qo_len_b``) and k (key j
    at j) are made at run (one extra pass over q and k, rounded to their dtype). fp8 K / V
    (``kv_data_type`` ``torch.float8_e4m3fn`` / ``torch.float8_e5m2``) are cast to q's dtype at run
    (exact; one extra pass over the planned rows). As in FlashInfer 0.7.2, ``q_scale`` /
    ``k_scale`` (factors of sm_scale) and ``v_scale`` (of the output) apply only to fp8 K / V: with
    16-bit K / V they are ignored; ``o_scale`` other than 1 raises ``NotImplementedError``.
    ``v_indptr`` / ``o_indptr`` and the other cuDNN-only arguments are ignored. Under CUDA graphs
    with ROPE_LLAMA the first RoPE plan also fixes the most keys.
    """

    _PAGED = False
    _NAME = "BatchPrefillWithRaggedKVCacheWrapper"

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf=None, kv_indptr_buf=None, custom_mask_buf=None, mask_indptr_buf=None,
                 backend: str = "auto", jit_args=None, jit_kwargs=None, variant_owns_mask: bool = False) -> None:
        self._init_common(float_workspace_buffer, kv_layout, use_cuda_graph, backend, jit_args, jit_kwargs,
                          variant_owns_mask,
                          [("qo_indptr_buf", qo_indptr_buf, None), ("kv_indptr_buf", kv_indptr_buf, 1)],
                          custom_mask_buf, mask_indptr_buf)
        self._qo_indptr_buf = qo_indptr_buf
        self._kv_indptr_buf = kv_indptr_buf
        self._kv_indptr_dev = kv_indptr_buf
        self._graph_m_tiles = None
        self._graph_kv_rows = None  # under CUDA graphs: the fewest k rows a captured run reads
        self._f32 = _torch().float32

    def _set_kv_indptr_attr(self) -> None:
        self._kv_indptr_buf = self._kv_indptr_dev

    def plan(self, qo_indptr, kv_indptr, num_qo_heads: int, num_kv_heads: int, head_dim_qk: int,
             head_dim_vo: Optional[int] = None, custom_mask=None, packed_custom_mask=None, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False, window_left: int = -1,
             logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None, q_data_type: Any = "float16",
             kv_data_type: Any = None, o_data_type: Any = None, non_blocking: bool = True, prefix_len_ptr=None,
             token_pos_in_items_ptr=None, token_pos_in_items_len: int = 0, max_item_len_ptr=None,
             fixed_split_size: Optional[int] = None, disable_split_kv: bool = False, seq_lens=None, seq_lens_q=None,
             max_token_per_sequence: Optional[int] = None, max_sequence_kv: Optional[int] = None, v_indptr=None,
             o_indptr=None, uniform_q_len: Optional[int] = None) -> None:
        """Plans the batch (host work; may synchronize). Custom masks as in the paged wrapper,
        request b's block ``[qo_len_b, kv_indptr[b+1] - kv_indptr[b]]``."""
        _no_multi_item_scoring(prefix_len_ptr, token_pos_in_items_ptr, token_pos_in_items_len, max_item_len_ptr)
        op = f"{self._NAME}.plan"
        qo_h, kv_h = _host_indptrs(qo_indptr, kv_indptr, "kv_indptr", op)
        kv_lens = _check_indptr(kv_h, "kv_indptr")
        if self._graph_kv_rows is not None and int(kv_h[-1]) > self._graph_kv_rows:  # (a replay skips run's checks)
            raise ValueError(f"kv_indptr[-1] is {int(kv_h[-1])}, but a CUDA graph captured run() on k / v of "
                             f"{self._graph_kv_rows} rows (a replay would read past them)")
        self._plan_common(qo_h, kv_h, kv_lens, None, None, 1, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo,
                          custom_mask, packed_custom_mask, causal, pos_encoding_mode, use_fp16_qk_reduction, sm_scale,
                          window_left, logits_soft_cap, rope_scale, rope_theta, q_data_type, kv_data_type, o_data_type,
                          non_blocking, fixed_split_size is not None or bool(disable_split_kv))

    begin_forward = plan

    def run(self, q, k, v, *args, q_scale=None, k_scale=None, v_scale=None, o_scale=None, out=None, lse=None,
            return_lse: bool = False, lse_base: str = "log2", lse_layout: str = "NH", enable_pdl: Optional[bool] = None,
            kv_cache_sf=None):
        """o ``[qo_indptr[-1], num_qo_heads, head_dim_vo]`` (dtype o_data_type) and the LSE as in
        the paged wrapper's ``run``. No host synchronization; allocates only the outputs (and,
        with ROPE_LLAMA, the rotated copies of q and k; with fp8 K / V, their casts)."""
        self._check_run()
        if kv_cache_sf is not None:
            raise NotImplementedError("kv_cache_sf (NVFP4 K / V scale factors) is not supported")
        if o_scale is not None and o_scale != 1:
            raise NotImplementedError("o_scale (fp8 output) is not supported")
        self._check_plan_dtype(k, "k")
        self._check_plan_dtype(v, "v")
        if len(k.shape) != 3 or len(v.shape) != 3:
            raise ValueError(f"k and v must be 3-D; got shapes {tuple(k.shape)} and {tuple(v.shape)}")
        tn, hn = (0, 1) if self._layout == 0 else (1, 0)
        if k.shape[tn] < self._total_kv:
            raise ValueError(f"k has {k.shape[tn]} rows; the plan's kv_indptr[-1] is {self._total_kv}")
        if self._use_cuda_graph and _capturing():
            rows = int(k.shape[tn])
            self._graph_kv_rows = rows if self._graph_kv_rows is None else min(self._graph_kv_rows, rows)
        if k.shape[hn] != self._num_kv_heads or k.shape[2] != self._head_dim_qk or v.shape[2] != self._head_dim_vo:
            raise ValueError(f"k / v num_kv_heads and head dims ({k.shape[hn]}, {k.shape[2]}, {v.shape[2]}) do not "
                             f"match the plan ({self._num_kv_heads}, {self._head_dim_qk}, {self._head_dim_vo})")
        scale, out_scale = self._k_sm_scale, 1.0
        if self._kv_dequant is not None:  # fp8 K / V: the scales apply; the 16-bit kernel on exact casts
            scale *= _float_scale(q_scale, "q_scale") * _float_scale(k_scale, "k_scale")
            out_scale = _float_scale(v_scale, "v_scale")
            nk = self._total_kv
            if k.shape[tn] != nk:  # (rows past kv_indptr[-1] are not read: not cast either)
                k, v = (k[:nk], v[:nk]) if tn == 0 else (k[:, :nk], v[:, :nk])
            k, v = k.to(self._kv_dequant), v.to(self._kv_dequant)
        return self._launch(q, k, v, self._kv_indptr_dev, None, None, self._layout, out, lse, return_lse, lse_base,
                            lse_layout, enable_pdl, scale, out_scale)

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, k, v, causal: bool = False, pos_encoding_mode: str = "NONE",
                use_fp16_qk_reduction: bool = False, window_left: int = -1, logits_soft_cap: Optional[float] = None,
                sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                rope_theta: Optional[float] = None):
        """Deprecated: sets these options (they replace the planned ones), then ``run``."""
        self._check_run()
        self._set_options(causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap, sm_scale,
                          rope_scale, rope_theta)
        return self.run(q, k, v)

    def forward_return_lse(self, q, k, v, causal: bool = False, pos_encoding_mode: str = "NONE",
                           use_fp16_qk_reduction: bool = False, window_left: int = -1,
                           logits_soft_cap: Optional[float] = None, sm_scale: Optional[float] = None,
                           rope_scale: Optional[float] = None, rope_theta: Optional[float] = None):
        """Deprecated: as ``forward``, returning ``(o, lse)``."""
        self._check_run()
        self._set_options(causal, pos_encoding_mode, use_fp16_qk_reduction, window_left, logits_soft_cap, sm_scale,
                          rope_scale, rope_theta)
        return self.run_return_lse(q, k, v)
