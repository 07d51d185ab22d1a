"""Decode attention (FlashInfer-compatible ``flashinfer.decode``): one query token per
request against a contiguous or paged KV cache, with GQA, RoPE/ALiBi, soft cap, sliding
window, LSE output and split-KV planned on the host.

What is checked: every argument's dtype, shape, layout and device at call time; the page
table (indptr, indices, last_page_len, seq_lens) on the host in ``plan`` (indptr starts at
0, is nondecreasing and ends at len(indices), or under CUDA graphs at most there: the rest of
an engine's fixed-size indices buffer is ignored; 1 <= last_page_len <= page_size for non-empty
requests; indices >= 0, and at ``run`` the largest planned page index is compared with the
cache's page count). The kernels read only the planned page table, so nothing is read out
of bounds for a page table that passed ``plan``.
"""

from __future__ import annotations

import functools
import math
import sys
import warnings
from typing import Any, Optional, Tuple, Union

import numpy as np

from . import _decode
from ._ext import (FRAMEWORK_STREAM, framework_of, integer_arg, not_a_tensor, require_tensors, to_dlpack,
                   torch_direct, torch_exporter, torch_stream_source)

__all__ = [
    "single_decode_with_kv_cache",
    "BatchDecodeWithPagedKVCacheWrapper",
    "CUDAGraphBatchDecodeWithPagedKVCacheWrapper",
    "fast_decode_plan",
]

_LAYOUTS = {"NHD": 0, "HND": 1}
_POS_MODES = {"NONE": 0, "ROPE_LLAMA": 1, "ALIBI": 2}
_INT_WORKSPACE_BYTES = 8 << 20
_SUPPORTED_HEAD_DIMS = (64, 128, 256, 512)


def _layout_code(kv_layout: str) -> int:
    return _LAYOUTS[kv_layout]  # KeyError for anything else, as FlashInfer


def _pos_code(mode: Union[str, int]) -> int:
    if isinstance(mode, int) and not isinstance(mode, bool):
        if mode in (0, 1, 2):
            return mode
    else:
        name = getattr(mode, "name", mode)  # accept flashinfer.utils.PosEncodingMode members
        if isinstance(name, str) and name in _POS_MODES:
            return _POS_MODES[name]
    raise KeyError(f"pos_encoding_mode must be 'NONE', 'ROPE_LLAMA' or 'ALIBI' (or 0, 1, 2); got {mode!r}")


# The cache element type codes of the bindings (KVCache): q's dtype, or fp8 values that
# dequantize by a plain cast (k_scale / v_scale are per-tensor factors of sm_scale / the output).
_KV_FP8_CODES = {"float8_e4m3fn": 1, "float8_e5m2": 2}


def _dtype_name(dt: Any, arg: str, fp8_ok: bool = False) -> Optional[str]:
    """torch.dtype, numpy dtype or string -> 'float16' / 'bfloat16' (and, for a KV dtype,
    'float8_e4m3fn' / 'float8_e5m2'); None stays None."""
    if dt is None:
        return None
    name = dt if isinstance(dt, str) else str(dt).replace("torch.", "")
    name = {"half": "float16", "fp16": "float16", "bf16": "bfloat16"}.get(name, name)
    if fp8_ok and name in _KV_FP8_CODES:
        return name
    if name not in ("float16", "bfloat16"):
        more = ", float8_e4m3fn or float8_e5m2" if fp8_ok else ""
        raise ValueError(f"{arg} must be float16 or bfloat16{more}; got {dt}")
    return name


def _fp8_kv_code(t: Any) -> int:
    """0 for an fp16 / bf16 cache tensor, else its fp8 code (_KV_FP8_CODES)."""
    return _KV_FP8_CODES.get(str(getattr(t, "dtype", "")).replace("torch.", ""), 0)


def _host_ints(x: Any, name: str) -> np.ndarray:
    """A 1-D int64 numpy copy of a torch/CuPy/numpy/list index array (may sync the device)."""
    if hasattr(x, "detach"):  # torch
        x = x.detach().cpu().numpy()
    elif hasattr(x, "get") and not isinstance(x, (list, tuple, np.ndarray)):  # cupy
        x = x.get()
    a = np.asarray(x)
    if a.ndim != 1:
        raise ValueError(f"{name} must be 1-D; got shape {a.shape}")
    if a.size and not np.issubdtype(a.dtype, np.integer):
        raise ValueError(f"{name} must be an integer tensor (int32); got {a.dtype}")
    return a.astype(np.int64, copy=False)


def _check_page_table(indptr: np.ndarray, indices: np.ndarray, last_page_len: np.ndarray, page_size: int,
                      allow_tail: bool = False) -> Tuple[np.ndarray, np.ndarray]:
    """Validates the CSR page table; returns each request's KV length and the indices in use.
    allow_tail (CUDA-graph plans): indices may run past indptr[-1], as when an engine passes the
    whole fixed-size indices buffer (SGLang does); only indices[:indptr[-1]] are checked and used."""
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1; got {page_size}")
    if indptr.size < 1:
        raise ValueError("indptr must have batch_size + 1 >= 1 entries; got 0")
    batch = indptr.size - 1
    if indptr[0] != 0:
        raise ValueError(f"indptr[0] must be 0; got {indptr[0]}")
    if np.any(np.diff(indptr) < 0):
        i = int(np.argmax(np.diff(indptr) < 0))
        raise ValueError(f"indptr must be nondecreasing; indptr[{i}]={indptr[i]} > indptr[{i + 1}]={indptr[i + 1]}")
    if allow_tail:
        if indptr[-1] > indices.size:
            raise ValueError(f"indptr[-1] ({indptr[-1]}) must be <= len(indices) ({indices.size})")
        indices = indices[:indptr[-1]]
    elif indptr[-1] != indices.size:
        raise ValueError(f"indptr[-1] ({indptr[-1]}) must equal len(indices) ({indices.size})")
    if last_page_len.size != batch:
        raise ValueError(f"last_page_len must have batch_size ({batch}) entries; got {last_page_len.size}")
    if indices.size and indices.min() < 0:
        raise ValueError(f"indices must be >= 0; got {indices.min()}")
    pages = np.diff(indptr)
    nonempty = pages > 0
    bad = nonempty & ((last_page_len < 1) | (last_page_len > page_size))
    if np.any(bad):
        b = int(np.argmax(bad))
        raise ValueError(f"last_page_len[{b}] must be in [1, page_size={page_size}] for a non-empty request; "
                         f"got {last_page_len[b]}")
    bad = ~nonempty & ((last_page_len < 0) | (last_page_len > page_size))
    if np.any(bad):
        b = int(np.argmax(bad))
        raise ValueError(f"last_page_len[{b}] of an empty request must be in [0, page_size]; got {last_page_len[b]}")
    return np.where(nonempty, (pages - 1) * page_size + last_page_len, 0), indices


def _torch():
    import torch

    return torch


def _forward_opts(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
                  head_dim, op: str = "BatchDecodeWithPagedKVCacheWrapper.plan") -> Tuple:
    """The options forward() may change, as the kernels see them (defaults filled in; checked)."""
    pos = _pos_code(pos_encoding_mode)
    rope = (_check_rope_param(rope_scale, "rope_scale", 1.0, op), _check_rope_param(rope_theta, "rope_theta", 1e4, op)) \
        if pos == 1 else (1.0 if rope_scale is None else float(rope_scale), 1e4 if rope_theta is None else float(rope_theta))
    return (pos, -1 if window_left is None else int(window_left), _soft_cap(logits_soft_cap),
            1.0 / math.sqrt(head_dim) if sm_scale is None else _finite(sm_scale, "sm_scale", op)) + rope


def _finite(x: Any, name: str, op: str) -> float:
    """A scale argument as a float: NaN and inf raise (they would make every output NaN)."""
    try:
        v = float(x)
    except (TypeError, ValueError):
        raise TypeError(f"{op}: {name} must be a real number; got {type(x).__name__}") from None
    if not math.isfinite(v):
        raise ValueError(f"{op}: {name} must be a finite number; got {x}")
    return v


def _check_rope_param(value: Optional[float], name: str, default: float, op: str) -> float:
    """rope_scale / rope_theta of ROPE_LLAMA: a positive finite number (None: the default)."""
    x = default if value is None else float(value)
    if not (x > 0.0 and math.isfinite(x)):
        raise ValueError(f"{op}: {name} must be a positive finite number (or None: {default:g}); got {value}")
    return x


def _soft_cap(logits_soft_cap: Any) -> float:
    """logits_soft_cap as the kernels take it: a finite cap > 0, or 0.0 for off (None / 0)."""
    if not logits_soft_cap:
        return 0.0
    cap = float(logits_soft_cap)
    if not math.isfinite(cap) or cap < 0:
        raise ValueError(f"logits_soft_cap must be a finite number >= 0 (or None); got {logits_soft_cap}")
    return cap


_RUN = "BatchDecodeWithPagedKVCacheWrapper.run"


class BatchDecodeWithPagedKVCacheWrapper:
    """Batch decode over a paged KV cache: ``plan`` once per batch shape (host work, page
    table to the GPU), then ``run`` per layer (launches only; CUDA-graph capturable)."""

    _DEPRECATED_POSITIONAL = ("pos_encoding_mode", "window_left", "logits_soft_cap", "q_data_type", "kv_data_type",
                              "o_data_type", "data_type", "sm_scale", "rope_scale", "rope_theta", "non_blocking",
                              "block_tables", "seq_lens", "fixed_split_size", "disable_split_kv", "q_len_per_req")

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 use_tensor_cores: bool = False, paged_kv_indptr_buffer=None, paged_kv_indices_buffer=None,
                 paged_kv_last_page_len_buffer=None, backend: str = "auto", jit_args=None) -> None:
        torch = _torch()
        _layout_code(kv_layout)
        if jit_args is not None:
            raise NotImplementedError("jit_args (custom attention variants) are not supported")
        if backend not in ("auto", "fa2", "fa3"):
            raise NotImplementedError(f"backend {backend!r} is not available; use 'auto', 'fa2' or 'fa3'")
        self._kv_layout = kv_layout
        self._use_tensor_cores = bool(use_tensor_cores)
        self._backend = backend
        self._use_cuda_graph = bool(use_cuda_graph)
        self._runner = None
        self._graph_pages = -1  # under CUDA graphs: the fewest cache pages a captured run reads (-1: none)
        self.reset_workspace_buffer(float_workspace_buffer, None)
        if use_cuda_graph:
            for name, buf in (("paged_kv_indptr_buffer", paged_kv_indptr_buffer),
                              ("paged_kv_indices_buffer", paged_kv_indices_buffer),
                              ("paged_kv_last_page_len_buffer", paged_kv_last_page_len_buffer)):
                if not isinstance(buf, torch.Tensor) or not buf.is_cuda or buf.dtype != torch.int32:
                    raise ValueError(f"use_cuda_graph=True requires {name} as a CUDA int32 tensor")
                if buf.dim() != 1 or not buf.is_contiguous():
                    raise ValueError(f"{name} must be a contiguous 1-D tensor; got shape {tuple(buf.shape)}, "
                                     f"strides {tuple(buf.stride())}")
                if buf.device != self.device:
                    raise ValueError(f"{name} must be on {self.device} (the workspace's device); got {buf.device}")
            self._fixed_batch_size = len(paged_kv_last_page_len_buffer)
            if len(paged_kv_indptr_buffer) != self._fixed_batch_size + 1:
                raise ValueError(f"len(paged_kv_indptr_buffer) ({len(paged_kv_indptr_buffer)}) must be "
                                 f"len(paged_kv_last_page_len_buffer) + 1 ({self._fixed_batch_size + 1})")
        else:
            self._fixed_batch_size = 0
        self._graph_q_len = None  # under CUDA graphs: q_len_per_req of the first plan (frozen)
        self._q_len = 1
        self._paged_kv_indptr_buf = paged_kv_indptr_buffer
        self._paged_kv_indices_buf = paged_kv_indices_buffer
        self._paged_kv_last_page_len_buf = paged_kv_last_page_len_buffer
        self._qo_indptr_buf = None
        self._runner = None
        self._copy_done = None
        self._window_left = -1

    # -- properties FlashInfer exposes ------------------------------------------------------------
    @property
    def use_tensor_cores(self) -> bool:
        return self._use_tensor_cores

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    @property
    def resolved_backend(self) -> str:
        return "fa2"

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer) -> None:
        torch = _torch()
        if not isinstance(float_workspace_buffer, torch.Tensor) or not float_workspace_buffer.is_cuda:
            raise ValueError("float_workspace_buffer must be a CUDA tensor")
        if not float_workspace_buffer.is_contiguous():
            raise ValueError("float_workspace_buffer must be contiguous (plan() sizes it by numel() * element_size())")
        if float_workspace_buffer.data_ptr() % 16 != 0:
            raise ValueError("float_workspace_buffer must be 16-byte aligned")
        self._float_workspace_buffer = float_workspace_buffer
        self.device = float_workspace_buffer.device
        if int_workspace_buffer is None:
            int_workspace_buffer = torch.empty(_INT_WORKSPACE_BYTES, dtype=torch.uint8, device=self.device)
        else:
            if not isinstance(int_workspace_buffer, torch.Tensor) or int_workspace_buffer.device != self.device:
                raise ValueError(f"int_workspace_buffer must be a CUDA tensor on {self.device} (the float workspace's "
                                 f"device); got {getattr(int_workspace_buffer, 'device', type(int_workspace_buffer))}")
            if not int_workspace_buffer.is_contiguous():
                raise ValueError("int_workspace_buffer must be contiguous")
            if int_workspace_buffer.data_ptr() % 16 != 0:
                raise ValueError("int_workspace_buffer must be 16-byte aligned")
            if int_workspace_buffer.dtype != torch.uint8 or int_workspace_buffer.dim() != 1:
                # raw bytes, whatever the dtype (plan() writes byte offsets into it)
                int_workspace_buffer = int_workspace_buffer.reshape(-1).view(torch.uint8)
        self._int_workspace_buffer = int_workspace_buffer
        self._pin_memory_int_workspace_buffer = torch.empty(int_workspace_buffer.numel(), dtype=torch.uint8,
                                                            pin_memory=True)
        self._runner = None  # (under CUDA graphs: capture again after this)

    def _graph_page_limit(self) -> int:
        """The fewest cache pages of a run captured into a CUDA graph so far (-1: none). A replay
        skips run()'s checks, so plan() holds its page indices to this."""
        if self._runner is not None:
            n = self._runner.captured_pages
            if n >= 0:
                self._graph_pages = n if self._graph_pages < 0 else min(self._graph_pages, n)
        return self._graph_pages

    def prewarm_paged_kv_stride_variant(self, variant: str = "independent") -> None:
        """K and V with independent strides need no separate kernel here: a no-op."""

    def workspace_size(self, *args, **kwargs) -> int:
        """Not provided (optional in the API): ``plan`` raises ``ValueError`` naming the bytes it
        needs when the workspace is too small."""
        raise NotImplementedError("BatchDecodeWithPagedKVCacheWrapper.workspace_size is not supported")

    # -- plan ---------------------------------------------------------------------------------------
    def plan(self, indptr, indices, last_page_len, num_qo_heads: int, num_kv_heads: int, head_dim: int,
             page_size: int, *args, pos_encoding_mode: str = "NONE", window_left: int = -1, window_right: int = 0,
             logits_soft_cap: Optional[float] = None, q_data_type: Any = "float16", kv_data_type: Any = None,
             o_data_type: Any = None, data_type: Any = None, sm_scale: Optional[float] = None,
             rope_scale: Optional[float] = None, rope_theta: Optional[float] = None, non_blocking: bool = True,
             block_tables=None, seq_lens=None, fixed_split_size: Optional[int] = None,
             disable_split_kv: bool = False, q_len_per_req: int = 1, is_causal: Optional[bool] = None) -> None:
        torch = _torch()
        if args:
            warnings.warn("passing plan() options after page_size positionally is deprecated; use keywords",
                          DeprecationWarning, stacklevel=2)
            if len(args) > len(self._DEPRECATED_POSITIONAL):
                raise TypeError(f"plan() takes at most {7 + len(self._DEPRECATED_POSITIONAL)} positional arguments")
            opts = dict(zip(self._DEPRECATED_POSITIONAL, args))
            pos_encoding_mode = opts.get("pos_encoding_mode", pos_encoding_mode)
            window_left = opts.get("window_left", window_left)
            logits_soft_cap = opts.get("logits_soft_cap", logits_soft_cap)
            q_data_type = opts.get("q_data_type", q_data_type)
            kv_data_type = opts.get("kv_data_type", kv_data_type)
            o_data_type = opts.get("o_data_type", o_data_type)
            data_type = opts.get("data_type", data_type)
            sm_scale = opts.get("sm_scale", sm_scale)
            rope_scale = opts.get("rope_scale", rope_scale)
            rope_theta = opts.get("rope_theta", rope_theta)
            non_blocking = opts.get("non_blocking", non_blocking)
            block_tables = opts.get("block_tables", block_tables)
            seq_lens = opts.get("seq_lens", seq_lens)
            fixed_split_size = opts.get("fixed_split_size", fixed_split_size)
            disable_split_kv = opts.get("disable_split_kv", disable_split_kv)
            q_len_per_req = opts.get("q_len_per_req", q_len_per_req)
        num_qo_heads = integer_arg(num_qo_heads, "num_qo_heads must be an int")
        num_kv_heads = integer_arg(num_kv_heads, "num_kv_heads must be an int")
        head_dim = integer_arg(head_dim, "head_dim must be an int")
        page_size = integer_arg(page_size, "page_size must be an int")
        if window_right != 0:
            raise NotImplementedError("window_right != 0 is not supported in decode")
        if is_causal is not None and bool(is_causal) != (q_len_per_req > 1):
            raise NotImplementedError("is_causal must equal (q_len_per_req > 1)")
        q_len = int(q_len_per_req)
        if q_len < 1:
            raise ValueError(f"q_len_per_req must be >= 1; got {q_len_per_req}")
        if q_len > 1 and not self._use_tensor_cores:
            raise ValueError("q_len_per_req > 1 requires use_tensor_cores=True")
        if fixed_split_size is not None and not self._use_tensor_cores:
            raise ValueError("fixed_split_size requires use_tensor_cores=True")
        pos_code = _pos_code(pos_encoding_mode)
        if head_dim not in _SUPPORTED_HEAD_DIMS:
            raise ValueError(f"head_dim must be one of {_SUPPORTED_HEAD_DIMS}; got {head_dim}")
        if num_kv_heads <= 0 or num_qo_heads <= 0 or num_qo_heads % num_kv_heads != 0:
            raise ValueError(f"num_qo_heads ({num_qo_heads}) must be a positive multiple of num_kv_heads ({num_kv_heads})")
        # dtype resolution, exactly as FlashInfer
        if data_type is not None:
            if q_data_type is None:
                q_data_type = data_type
            if kv_data_type is None:
                kv_data_type = data_type
        q_name = _dtype_name(q_data_type if q_data_type is not None else "float16", "q_data_type")
        kv_name = _dtype_name(kv_data_type, "kv_data_type", fp8_ok=True) or q_name
        o_name = _dtype_name(o_data_type, "o_data_type") or q_name
        kv_code = _KV_FP8_CODES.get(kv_name, 0)
        if kv_code == 0 and kv_name != q_name:
            raise NotImplementedError(f"kv_data_type must equal q_data_type or be fp8 (got q={q_name}, kv={kv_name})")
        plan_opts = _forward_opts(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
                                  head_dim)
        _, window_left, soft_cap, sm_scale, rope_scale, rope_theta = plan_opts

        indptr_h = _host_ints(indptr, "indptr")
        indices_h = _host_ints(indices, "indices")
        last_h = _host_ints(last_page_len, "last_page_len")
        kv_lens, indices_h = _check_page_table(indptr_h, indices_h, last_h, int(page_size),
                                               allow_tail=self._use_cuda_graph)
        batch = indptr_h.size - 1
        seq_h = None
        if seq_lens is not None:
            seq_h = _host_ints(seq_lens, "seq_lens")
            if seq_h.size != batch:
                raise ValueError(f"seq_lens must have batch_size ({batch}) entries; got {seq_h.size}")
            cap = np.diff(indptr_h) * int(page_size)
            if np.any(seq_h < 0) or np.any(seq_h > cap):
                b = int(np.argmax((seq_h < 0) | (seq_h > cap)))
                raise ValueError(f"seq_lens[{b}] = {seq_h[b]} must be in [0, pages * page_size = {cap[b]}]")
            kv_lens = seq_h
        if kv_lens.size and int(kv_lens.max()) >= 2 ** 31:
            b = int(np.argmax(kv_lens))
            raise ValueError(f"request {b} has {int(kv_lens[b])} keys; a request must have fewer than 2**31")
        if self._use_cuda_graph:
            if batch != self._fixed_batch_size:
                raise ValueError(f"batch size {batch} must equal the CUDA-graph batch size {self._fixed_batch_size}")
            if indices_h.size > len(self._paged_kv_indices_buf):
                raise ValueError(f"len(indices) ({indices_h.size}) exceeds paged_kv_indices_buffer "
                                 f"({len(self._paged_kv_indices_buf)})")
            limit = self._graph_page_limit()
            if limit >= 0 and indices_h.size and int(indices_h.max()) >= limit:
                raise ValueError(f"indices reference page {int(indices_h.max())}, but a CUDA graph captured run() "
                                 f"on a paged_kv_cache of {limit} pages (a replay would read past it)")

        if q_len > 1:
            if kv_lens.size and int(kv_lens.min()) < q_len:
                b = int(np.argmin(kv_lens))
                raise ValueError(f"every kv_len must be >= q_len_per_req ({q_len}); request {b} has {int(kv_lens[b])}")
        # Multi-token decode (bottom-right causal: query token i of a request of L keys sees its
        # first L - q_len + 1 + i keys) reads each request's pages once: the kernels take the
        # tokens as extra q-head columns, q_len * group of them per KV head, and find their rows
        # (b * q_len + i) of q / o / lse themselves (attention/decode.h decode_query).
        heads = num_qo_heads * q_len  # the kernels' q-head columns
        if self._use_cuda_graph:
            if self._graph_q_len is not None and q_len != self._graph_q_len:
                raise ValueError(f"q_len_per_req is fixed under CUDA graphs by the first plan ({self._graph_q_len}); "
                                 f"got {q_len}")
            self._graph_q_len = q_len

        have_f = self._float_workspace_buffer.numel() * self._float_workspace_buffer.element_size()
        items, merge, n_partial, any_split, _chunk, grid, stages, total_keys, merge_kernel = _decode.plan(
            np.ascontiguousarray(kv_lens, dtype=np.int64), np.ascontiguousarray(indptr_h[:-1], dtype=np.int64),
            heads, num_kv_heads, head_dim, int(page_size),
            q_name, bool(disable_split_kv), int(fixed_split_size or 0) * int(page_size), self._use_tensor_cores, pos_code,
            self.device.index or 0, not self._use_cuda_graph,
            (have_f // 2) // 16 * 16 // max(1, heads * head_dim * 4),  # partial states that fit
            kv_code)
        need_f = n_partial * heads * (head_dim + 1) * 4
        if need_f > have_f:
            raise ValueError(f"float_workspace_buffer is too small: this plan needs {need_f} bytes; got {have_f}")

        # int workspace, 16-byte aligned regions whose offsets depend only on the batch size
        # (CUDA-graph replays keep the pointers captured at the first run):
        #   [num_items | merge [B,2] | kv_lens [B] | merge counters [B, units] (zero; the kernel
        #    resets them after use) | (page table, without CUDA graphs) | items [n,8]]
        units = num_kv_heads * _decode.sub_groups(heads // num_kv_heads, head_dim)
        parts = [np.array([items.shape[0]], np.int32), merge.reshape(-1).astype(np.int32),
                 kv_lens.astype(np.int32), np.zeros(batch * units, np.int32)]
        if not self._use_cuda_graph:
            parts += [indptr_h.astype(np.int32), indices_h.astype(np.int32), last_h.astype(np.int32)]
        parts.append(items.reshape(-1))
        offsets, pos = [], 0
        for p in parts:
            offsets.append(pos)
            pos += (p.nbytes + 15) // 16 * 16
        if pos > self._int_workspace_buffer.numel():
            if self._use_cuda_graph:
                raise ValueError(f"int workspace too small for this plan under CUDA graphs ({pos} bytes)")
            self.reset_workspace_buffer(self._float_workspace_buffer,
                                        torch.empty(pos * 2, dtype=torch.uint8, device=self.device))
        if self._copy_done is not None:
            self._copy_done.synchronize()  # the pinned staging buffer is free again
        host = self._pin_memory_int_workspace_buffer.numpy()
        for off, p in zip(offsets, parts):
            host[off:off + p.nbytes] = p.view(np.uint8)
        with torch.cuda.device(self.device):
            self._int_workspace_buffer[:pos].copy_(self._pin_memory_int_workspace_buffer[:pos], non_blocking=non_blocking)
            if self._use_cuda_graph:
                self._paged_kv_indptr_buf.copy_(torch.from_numpy(indptr_h.astype(np.int32)), non_blocking=True)
                self._paged_kv_indices_buf[:indices_h.size].copy_(torch.from_numpy(indices_h.astype(np.int32)),
                                                                  non_blocking=True)
                self._paged_kv_last_page_len_buf.copy_(torch.from_numpy(last_h.astype(np.int32)), non_blocking=True)
            self._copy_done = torch.cuda.Event()
            self._copy_done.record()

        base = self._int_workspace_buffer.data_ptr()
        if self._use_cuda_graph:
            ptr_indptr = self._paged_kv_indptr_buf.data_ptr()
            ptr_indices = self._paged_kv_indices_buf.data_ptr()
            ptr_last = self._paged_kv_last_page_len_buf.data_ptr()
        else:
            ptr_indptr, ptr_indices, ptr_last = base + offsets[4], base + offsets[5], base + offsets[6]
        # float workspace: partial o in the first half, partial lse in the second (fixed offsets)
        fws = self._float_workspace_buffer.data_ptr()
        half = (have_f // 2) // 16 * 16
        if n_partial * heads * head_dim * 4 > half:
            raise ValueError(f"float_workspace_buffer is too small: this plan needs {2 * need_f} bytes; got {have_f}")
        max_page = int(indices_h.max()) if indices_h.size else -1
        # Under CUDA graphs the launch shape must not depend on the plan: always the full
        # persistent grid. Split requests are merged in-kernel by the CTA that finishes last
        # (otherwise: by a second kernel where the plan says so, scheduler.h decode_merges_in_kernel).
        max_grid = 0 if self._use_cuda_graph else min(int(items.shape[0]), int(grid))
        self._runner = _decode.DecodeRunner(
            self.device.index or 0, q_name, batch, heads, num_kv_heads, head_dim, int(page_size),
            _layout_code(self._kv_layout), pos_code, window_left, sm_scale, soft_cap, rope_scale, rope_theta,
            ptr_indptr, ptr_indices, ptr_last, base + offsets[2], base + offsets[-1], base + offsets[0],
            base + offsets[1], fws, fws + half, 0 if merge_kernel else base + offsets[3], bool(merge_kernel),
            max_grid, max_page,
            self._use_tensor_cores, 0 if self._use_cuda_graph else int(items.shape[0]), stages,
            0 if self._use_cuda_graph else total_keys, kv_code, q_len)
        self._batch_size = batch
        self._q_len = q_len
        self._num_qo_heads = num_qo_heads
        self._num_kv_heads = num_kv_heads
        self._head_dim = head_dim
        self._window_left = window_left
        self._pos_encoding_mode = pos_encoding_mode
        self._logits_soft_cap = logits_soft_cap
        self._sm_scale = sm_scale
        self._rope_scale = rope_scale
        self._rope_theta = rope_theta
        self._cached_q_data_type = getattr(torch, q_name)
        self._cached_kv_data_type = getattr(torch, kv_name)
        self._kv_fp8 = self._cached_kv_data_type if kv_code else None  # run() checks and views fp8 caches
        self._cached_o_data_type = getattr(torch, o_name)
        # o_data_type other than q's: the kernels write q's dtype into a temporary that run()
        # casts into o (one extra pass over o, a few KB per step). The output is rounded twice:
        # fp16 q -> bf16 o can differ from one rounding in the last bit on ties, and bf16 q ->
        # fp16 o carries bf16's 8 significant bits, not fp16's 11.
        self._o_cast = self._cached_o_data_type if o_name != q_name else None
        self._page_size = int(page_size)
        self._plan_args = (indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size)
        self._plan_opts = plan_opts
        self._plan_kwargs = dict(q_data_type=q_name, kv_data_type=kv_name, o_data_type=o_name,
                                 non_blocking=non_blocking, block_tables=block_tables, seq_lens=seq_lens,
                                 fixed_split_size=fixed_split_size, disable_split_kv=disable_split_kv,
                                 q_len_per_req=q_len)
        self._to_dlpack = torch_exporter(torch)
        self._tensor_type = torch.Tensor
        self._raw_stream = torch_stream_source(torch)
        self._direct = torch_direct(torch)
        self._empty_like = torch.empty_like  # ~0.7 us cheaper than q.new_empty(q.shape) (no size tuple)
        self._dev_index = self.device.index or 0

    begin_forward = plan

    # -- run ----------------------------------------------------------------------------------------
    def run(self, q, paged_kv_cache, *args, q_scale: Optional[float] = None, k_scale: Optional[float] = None,
            v_scale: Optional[float] = None, out=None, lse=None, return_lse: bool = False,
            enable_pdl: Optional[bool] = None, window_left: Optional[int] = None, sinks=None,
            q_len_per_req: Optional[int] = None, skip_softmax_threshold_scale_factor=None, kv_cache_sf=None):
        runner = self._runner
        if runner is None:
            raise RuntimeError("BatchDecodeWithPagedKVCacheWrapper.run: call plan() first")
        if window_left is not None:
            assert window_left == self._window_left, (
                f"window_left ({window_left}) must equal the planned window_left ({self._window_left})")
        if sinks is not None or skip_softmax_threshold_scale_factor is not None or kv_cache_sf is not None:
            raise NotImplementedError("sinks / skip_softmax_threshold_scale_factor / kv_cache_sf are not supported")
        if q_len_per_req is not None:
            warnings.warn("run(q_len_per_req=...) is deprecated", DeprecationWarning, stacklevel=2)
            if q_len_per_req != self._q_len:
                raise ValueError(f"q_len_per_req must be {self._q_len} for this plan; got {q_len_per_req}")
        if self._q_len > 1 and q.shape[0] != self._batch_size * self._q_len:
            raise ValueError(f"q must have batch_size * q_len_per_req = {self._batch_size} * {self._q_len} rows; "
                             f"got {q.shape[0]}")
        scale = 1.0
        if q_scale is not None:
            scale = _finite(q_scale, "q_scale", _RUN)
        if k_scale is not None:
            scale *= _finite(k_scale, "k_scale", _RUN)
        if v_scale is not None and not hasattr(v_scale, "__dlpack__"):  # (a tensor scales o as it is)
            v_scale = _finite(v_scale, "v_scale", _RUN)
        if type(q) is not self._tensor_type:
            return self._run_dlpack(q, paged_kv_cache, out, lse, return_lse, scale, v_scale, enable_pdl)
        if type(paged_kv_cache) is tuple or isinstance(paged_kv_cache, (tuple, list)):
            if len(paged_kv_cache) != 2:
                raise KeyError(f"paged_kv_cache tuple must be (k_cache, v_cache); got {len(paged_kv_cache)} items")
            k_cache, v_cache = paged_kv_cache
            if v_cache is None:
                raise not_a_tensor("paged_kv_cache[1]", v_cache)
        elif hasattr(paged_kv_cache, "data_ptr"):
            k_cache, v_cache = paged_kv_cache, None
        else:
            raise KeyError(f"unsupported paged_kv_cache type {type(paged_kv_cache).__name__}")
        direct = self._direct  # (see norm.py: torch tensors go to the binding as they are)
        kv_a, kv_b = k_cache, v_cache
        if self._kv_fp8 is not None:  # the binding takes fp8 caches as their uint8 views
            kv_a, kv_b = self._fp8_cache_view(k_cache), v_cache if v_cache is None else self._fp8_cache_view(v_cache)
        elif not direct:
            kv_a, kv_b = self._to_dlpack(k_cache), v_cache if v_cache is None else self._to_dlpack(v_cache)
        o_cast = self._o_cast
        if o_cast is not None:  # the kernels write q's dtype; o is cast from it below
            result = self._checked_cast_out(q, out, o_cast)
            out = None
        if out is None:
            out = self._empty_like(q)  # (a given out is checked by the binding: shape, dtype, device)
        if return_lse and lse is None:
            lse = q.new_empty((q.shape[0], q.shape[1]), dtype=_torch().float32)
        try:
            if direct:
                runner.run(q, kv_a, kv_b, out, lse, scale, FRAMEWORK_STREAM, enable_pdl is not False)
            else:
                dl = self._to_dlpack
                runner.run(dl(q), kv_a, kv_b, dl(out), None if lse is None else dl(lse), scale,
                           self._raw_stream(self._dev_index), enable_pdl is not False)
        except TypeError:
            if v_cache is None:
                require_tensors(paged_kv_cache=k_cache, out=out, lse=lse)
            else:
                require_tensors(**{"paged_kv_cache[0]": k_cache, "paged_kv_cache[1]": v_cache}, out=out, lse=lse)
            raise
        if v_scale is not None and v_scale != 1:
            out.mul_(v_scale)
        if o_cast is not None:
            out = result.copy_(out)
        return (out, lse) if return_lse else out

    def _checked_cast_out(self, q, out, o_dtype):
        """The o tensor of a plan whose o_data_type differs from q's: ``out`` checked exactly
        (shape, dtype, device), or a new one."""
        if out is None:
            return q.new_empty(q.shape, dtype=o_dtype)
        if tuple(out.shape) != tuple(q.shape) or out.dtype != o_dtype or out.device != q.device:
            raise ValueError(f"Invalid shape of out: expected {tuple(q.shape)} {o_dtype} on {q.device}; got "
                             f"{tuple(out.shape)} {out.dtype} on {out.device}")
        return out

    def _run_dlpack(self, q, paged_kv_cache, out, lse, return_lse, scale, v_scale, enable_pdl):
        """run() for q from another DLPack framework (CuPy ...): outputs are allocated with, and
        the kernels run on the current stream of, q's framework."""
        fw = framework_of(q, "q")
        if self._kv_fp8 is not None:
            raise ValueError(f"an fp8 KV cache ({self._kv_fp8}) needs torch tensors; got q as "
                             f"{type(q).__module__}.{type(q).__name__}")
        if self._o_cast is not None:
            raise ValueError(f"o_data_type {self._o_cast} differs from q's dtype: supported for torch tensors only; "
                             f"got q as {type(q).__module__}.{type(q).__name__}")
        if isinstance(paged_kv_cache, (tuple, list)):
            if len(paged_kv_cache) != 2:
                raise KeyError(f"paged_kv_cache tuple must be (k_cache, v_cache); got {len(paged_kv_cache)} items")
            kv_a = to_dlpack(paged_kv_cache[0], "paged_kv_cache[0]")
            kv_b = to_dlpack(paged_kv_cache[1], "paged_kv_cache[1]")
        elif hasattr(paged_kv_cache, "__dlpack__"):
            kv_a, kv_b = to_dlpack(paged_kv_cache, "paged_kv_cache"), None
        else:  # (as the torch path: any other type)
            raise KeyError(f"unsupported paged_kv_cache type {type(paged_kv_cache).__name__}")
        if out is None:
            out = fw.empty_like(q)
        if return_lse and lse is None:
            lse = fw.empty_f32((q.shape[0], q.shape[1]), q)
        self._runner.run(fw.to_dlpack(q), kv_a, kv_b, to_dlpack(out, "out"),
                         None if lse is None else to_dlpack(lse, "lse"), scale, fw.stream(q), enable_pdl is not False)
        if v_scale is not None and v_scale != 1:
            fw.scale_(out, v_scale)
        return (out, lse) if return_lse else out

    def _fp8_cache_view(self, t: Any) -> Any:
        if getattr(t, "dtype", None) != self._kv_fp8:
            raise ValueError(f"The dtype of k {getattr(t, 'dtype', type(t))} does not match the kv_data_type "
                             f"{self._kv_fp8} specified in plan function.")
        return self._to_dlpack(t.view(_torch().uint8))

    run_return_lse = functools.partialmethod(run, return_lse=True)

    def forward(self, q, paged_kv_cache, pos_encoding_mode: str = "NONE", q_scale=None, k_scale=None, v_scale=None,
                window_left: int = -1, logits_soft_cap=None, sm_scale=None, rope_scale=None, rope_theta=None):
        """Deprecated: re-plan with these options, then run."""
        self._replan(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale)

    def forward_return_lse(self, q, paged_kv_cache, pos_encoding_mode: str = "NONE", q_scale=None, k_scale=None,
                           v_scale=None, window_left: int = -1, logits_soft_cap=None, sm_scale=None, rope_scale=None,
                           rope_theta=None):
        self._replan(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta)
        return self.run(q, paged_kv_cache, q_scale=q_scale, k_scale=k_scale, v_scale=v_scale, return_lse=True)

    def _replan(self, pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta):
        """forward()'s options take effect as in FlashInfer, where they are run-time attributes:
        the current plan stands when they equal its own; otherwise the same page table is planned
        again with them (by this class's plan, also where an engine replaced ``wrapper.plan``,
        e.g. with fast_decode_plan). The plan's other options (seq_lens, splits, dtypes) stay."""
        if self._runner is None:
            raise RuntimeError("call plan() (begin_forward) first")
        opts = _forward_opts(pos_encoding_mode, window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta,
                             self._head_dim, "BatchDecodeWithPagedKVCacheWrapper.forward")
        if opts == self._plan_opts:
            return
        BatchDecodeWithPagedKVCacheWrapper.plan(
            self, *self._plan_args, pos_encoding_mode=pos_encoding_mode, window_left=window_left,
            logits_soft_cap=logits_soft_cap, sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta,
            **self._plan_kwargs)


class CUDAGraphBatchDecodeWithPagedKVCacheWrapper(BatchDecodeWithPagedKVCacheWrapper):
    """``BatchDecodeWithPagedKVCacheWrapper(use_cuda_graph=True)`` with the buffers positional."""

    def __init__(self, workspace_buffer, indptr_buffer, indices_buffer, last_page_len_buffer, kv_layout: str = "NHD",
                 use_tensor_cores: bool = False) -> None:
        super().__init__(workspace_buffer, kv_layout, use_cuda_graph=True, use_tensor_cores=use_tensor_cores,
                         paged_kv_indptr_buffer=indptr_buffer, paged_kv_indices_buffer=indices_buffer,
                         paged_kv_last_page_len_buffer=last_page_len_buffer)


def fast_decode_plan(self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
                     pos_encoding_mode="NONE", window_left=-1, logits_soft_cap=None, q_data_type=None,
                     kv_data_type=None, data_type=None, sm_scale=None, rope_scale=None, rope_theta=None,
                     non_blocking=True, fixed_split_size=None, disable_split_kv=False, q_len_per_req=1,
                     global_override_indptr_cpu=None) -> None:
    """Module-level plan that engines bind as ``wrapper.plan``; same semantics as ``plan``
    (``data_type`` fills whichever of ``q_data_type`` / ``kv_data_type`` is None)."""
    if global_override_indptr_cpu is not None:
        indptr = global_override_indptr_cpu
    BatchDecodeWithPagedKVCacheWrapper.plan(
        self, indptr, indices, last_page_len, num_qo_heads, num_kv_heads, head_dim, page_size,
        pos_encoding_mode=pos_encoding_mode, window_left=window_left, logits_soft_cap=logits_soft_cap,
        q_data_type=q_data_type, kv_data_type=kv_data_type, data_type=data_type, sm_scale=sm_scale,
        rope_scale=rope_scale, rope_theta=rope_theta, non_blocking=non_blocking, fixed_split_size=fixed_split_size,
        disable_split_kv=disable_split_kv, q_len_per_req=q_len_per_req)


# single_plan's answers by (kv_len, heads, head_dim, dtype, device, tensor cores, RoPE). A decode
# loop grows kv_len every step, so the cache is emptied when it reaches _SINGLE_PLAN_CACHE_MAX.
_SINGLE_PLAN_CACHE: dict = {}
_SINGLE_PLAN_CACHE_MAX = 4096


def _remember_single_plan(key: tuple, value: tuple) -> tuple:
    if len(_SINGLE_PLAN_CACHE) >= _SINGLE_PLAN_CACHE_MAX:
        _SINGLE_PLAN_CACHE.clear()
    _SINGLE_PLAN_CACHE[key] = value
    return value


def single_decode_with_kv_cache(q, k, v, kv_layout: str = "NHD", pos_encoding_mode: str = "NONE",
                                use_tensor_cores: bool = False, q_scale: Optional[float] = None,
                                k_scale: Optional[float] = None, v_scale: Optional[float] = None,
                                window_left: int = -1, logits_soft_cap: Optional[float] = None,
                                sm_scale: Optional[float] = None, rope_scale: Optional[float] = None,
                                rope_theta: Optional[float] = None, return_lse: bool = False):
    """Attention of one query token (``q [num_qo_heads, head_dim]``) over a contiguous KV
    (``k``, ``v``: ``[kv_len, num_kv_heads, head_dim]`` NHD or ``[num_kv_heads, kv_len, head_dim]``
    HND). Returns ``o [num_qo_heads, head_dim]`` (and base-2 ``lse [num_qo_heads]`` float32).
    Under torch.compile it is one custom op, ``torch.ops.flashinfer.single_decode_with_kv_cache``
    (flashinfer/_torch_ops.py), so ``fullgraph=True`` and ``mode="reduce-overhead"`` trace it."""
    torch = sys.modules.get("torch")
    if torch is not None and torch.compiler.is_compiling():
        ops = _TORCH_OPS
        if ops is None:
            raise RuntimeError("single_decode_with_kv_cache under torch.compile: its custom op is registered when "
                               "flashinfer is imported after torch, or on the first call outside torch.compile")
        o, lse = ops.single_decode(q, k, v, kv_layout, _pos_name(pos_encoding_mode), bool(use_tensor_cores), q_scale,
                                   k_scale, v_scale, int(window_left), logits_soft_cap, sm_scale, rope_scale,
                                   rope_theta, bool(return_lse))
        return (o, lse) if return_lse else o
    if _TORCH_OPS is None and torch is not None:
        _load_torch_ops()
    return _single_decode(q, k, v, kv_layout, pos_encoding_mode, use_tensor_cores, q_scale, k_scale, v_scale,
                          window_left, logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse)


def _single_decode(q, k, v, kv_layout, pos_encoding_mode, use_tensor_cores, q_scale, k_scale, v_scale, window_left,
                   logits_soft_cap, sm_scale, rope_scale, rope_theta, return_lse):
    layout = _layout_code(kv_layout)
    pos = _pos_code(pos_encoding_mode)
    fw = framework_of(q, "q")
    framework_of(k, "k")  # (a non-tensor: a TypeError naming it)
    framework_of(v, "v")
    if len(q.shape) != 2:
        raise ValueError(f"single_decode_with_kv_cache: q must be 2-D [num_qo_heads, head_dim]; got shape {tuple(q.shape)}")
    if len(k.shape) != 3:
        raise ValueError(f"single_decode_with_kv_cache: k must be 3-D; got shape {tuple(k.shape)}")
    num_qo_heads, head_dim = q.shape
    num_kv_heads, kv_len = (k.shape[0], k.shape[1]) if layout == 1 else (k.shape[1], k.shape[0])
    if head_dim not in _SUPPORTED_HEAD_DIMS:
        raise ValueError(f"single_decode_with_kv_cache: head_dim must be one of {_SUPPORTED_HEAD_DIMS}; got {head_dim}")
    if num_kv_heads == 0 or num_qo_heads % num_kv_heads != 0:
        raise ValueError(f"single_decode_with_kv_cache: num_qo_heads ({num_qo_heads}) must be a multiple of "
                         f"num_kv_heads ({num_kv_heads})")
    dtype = str(q.dtype).replace("torch.", "")
    dev = q.device.index if hasattr(q.device, "index") else q.device.id
    if dev is None or dev < 0:
        dev = 0
    kv_code = _fp8_kv_code(k)
    if kv_code:  # fp8 K and V (both of one format), taken by the binding as their uint8 views
        if v.dtype != k.dtype:
            raise ValueError(f"single_decode_with_kv_cache: k and v must have the same dtype; got {k.dtype} and "
                             f"{v.dtype}")
        u8 = _torch().uint8
        k, v = k.view(u8), v.view(u8)
    key = (kv_len, num_qo_heads, num_kv_heads, head_dim, dtype, dev, bool(use_tensor_cores), pos, kv_code)
    chunking = _SINGLE_PLAN_CACHE.get(key)
    if chunking is None:
        if dtype not in ("float16", "bfloat16"):
            raise ValueError(f"single_decode_with_kv_cache: q.dtype must be float16 or bfloat16; got {dtype}")
        chunking = _remember_single_plan(key, _decode.single_plan(kv_len, num_qo_heads, num_kv_heads, head_dim,
                                                                  dtype, bool(use_tensor_cores), pos, dev, kv_code))
    chunk, chunks, stages = chunking
    out = fw.empty_like(q)
    lse = fw.empty_f32((num_qo_heads,), q) if return_lse else None
    # split: the chunks' partial outputs and LSEs, in one float32 allocation
    partial = fw.empty_f32((chunks * num_qo_heads * (head_dim + 1),), q) if chunks > 1 else None
    op = "single_decode_with_kv_cache"
    scale = 1.0 / math.sqrt(head_dim) if sm_scale is None else _finite(sm_scale, "sm_scale", op)
    if q_scale is not None:
        scale *= _finite(q_scale, "q_scale", op)
    if k_scale is not None:
        scale *= _finite(k_scale, "k_scale", op)
    v_mult = v_scale  # (a tensor scales o as it is)
    if v_scale is not None and not hasattr(v_scale, "__dlpack__"):
        v_mult = _finite(v_scale, "v_scale", op)
    dl = fw.to_dlpack
    _decode.single_decode(dl(q), to_dlpack(k, "k"), to_dlpack(v, "v"), dl(out), None if lse is None else dl(lse),
                          None if partial is None else dl(partial), layout, chunk, chunks, pos,
                          -1 if window_left is None else int(window_left), scale,
                          _soft_cap(logits_soft_cap),
                          _check_rope_param(rope_scale, "rope_scale", 1.0, op) if pos == 1 else 1.0,
                          _check_rope_param(rope_theta, "rope_theta", 1e4, op) if pos == 1 else 1e4,
                          bool(use_tensor_cores), fw.stream(q), True, stages, kv_code)
    if v_mult is not None and (hasattr(v_mult, "__dlpack__") or v_mult != 1):
        out = out * v_mult
    return (out, lse) if return_lse else out


def _pos_name(mode: Union[str, int]) -> str:
    """pos_encoding_mode as its name (the custom op takes a string)."""
    if isinstance(mode, int):
        names = {v: k for k, v in _POS_MODES.items()}
        if mode not in names:
            raise KeyError(mode)
        return names[mode]
    return getattr(mode, "name", mode)


# flashinfer._torch_ops (torch custom ops for torch.compile), loaded once torch is: at import when
# torch came first, else on the first call with torch loaded.
_TORCH_OPS: Any = None


def _load_torch_ops() -> None:
    global _TORCH_OPS
    from . import _torch_ops

    _TORCH_OPS = _torch_ops


def _get_range_buf(seq_len: int, device) -> Any:
    """vLLM imports this helper: arange(seq_len) as int32 on ``device``."""
    torch = _torch()
    return torch.arange(seq_len, dtype=torch.int32, device=device)


def trtllm_batch_decode_with_kv_cache(*args, **kwargs):
    raise NotImplementedError("trtllm_batch_decode_with_kv_cache (TensorRT-LLM kernels) is not available")


if "torch" in sys.modules:  # (importing flashinfer never imports torch itself)
    _load_torch_ops()
