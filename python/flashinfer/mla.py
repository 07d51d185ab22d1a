"""DeepSeek MLA attention with matrix absorption (FlashInfer-compatible ``flashinfer.mla``, spec
§8.1): ``BatchMLAPagedAttentionWrapper``. Every query head attends one shared latent KV "head":
``K = [ckv || kpe]`` (512 + 64, or 512 without kpe), ``V = ckv``, ``q = [q_nope || q_pe]``.

``plan`` does the host work, as the batch prefill wrappers do (it reuses their workspace, staging
and work-item machinery from flashinfer.prefill): it reads the index arrays on the host (may
synchronize), checks them, derives each request's last-page length from ``kv_len_arr``, asks
``_prefill.mla_plan`` for the (request, 64-row tile[, key chunk]) work items (packed rows are
``token * num_heads + head``) and copies everything to the device. ``run`` checks its tensors against the
plan (no host synchronization) and launches ``_prefill.mla_run``, allocating only its outputs.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

from . import _prefill
from ._ext import framework_of, to_dlpack, torch_exporter, torch_stream_source
from .decode import _dtype_name, _host_ints, _torch
from .prefill import (_LN2, _TILE_ROWS, _BatchPrefillBase, _check_indptr, _check_output,
                      _host_indptrs, _num_sms, _pad_items)

__all__ = ["BatchMLAPagedAttentionWrapper"]

_HEAD_DIM_CKV = 512
_HEAD_DIMS_KPE = (64, 0)


def _shape(t: Any) -> tuple:
    return tuple(int(x) for x in getattr(t, "shape", ()))


class BatchMLAPagedAttentionWrapper(_BatchPrefillBase):
    r"""MLA paged attention (DeepSeek v2 / v3 with matrix absorption), decode and incremental
    prefill: request ``b`` owns q / o rows ``qo_indptr[b]:qo_indptr[b+1]`` and the pages
    ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]`` of ``ckv_cache [num_pages, page_size, 512]`` and
    ``kpe_cache [num_pages, page_size, 64]``; its first ``kv_len_arr[b]`` tokens are its keys.

    Scores ``sm_scale * (q_nope . ckv + q_pe . kpe)`` (fp32 accumulation), bottom-right causal per
    request when ``causal`` (query row i of qo_len sees keys ``j <= i + kv_len - qo_len``); output
    ``[qo_indptr[-1], num_heads, 512]`` in q's dtype, LSE ``[qo_indptr[-1], num_heads]`` float32,
    base 2 of the scaled logits (base e with ``return_lse_base_on_e=True``). A row with no key
    (``kv_len`` 0, or above the causal diagonal) gives o = 0, lse = -inf.

    Supported: ``head_dim_ckv`` 512, ``head_dim_kpe`` 64 or 0 (no rope part: ``q_pe`` / ``kpe_cache``
    may then be None or have a last dimension of 0), q and caches float16 / bfloat16 of one dtype,
    any ``page_size`` >= 1, any ``num_heads``, ``backend`` "auto" / "fa2" / "fa3" (one kernel).
    Only the last dimension of q_nope / q_pe / the caches / out must be contiguous (the caches may
    be views into one ``[num_pages, page_size, 576]`` buffer). Raises ``ValueError`` for other head
    dims, mismatched dtypes / shapes (checked at ``run`` against the plan) and bad index arrays;
    ``NotImplementedError`` for other backends, fp8 caches, ``use_profiler`` and ``o_scale``;
    ``run``'s ``profiler_buffer`` and ``kv_len`` / ``page_table`` (the cutlass backend's) are
    ignored, as FlashInfer's other backends do. A work item is one
    request's 64 packed (token, head) rows; when a batch has too few of them to fill the GPU's
    SMs (decode of a few requests), plan cuts every request's keys into chunks (split-KV: at most
    64, of at least 256 keys, fewer where the float workspace cannot hold their partial states),
    whose partial states (q's dtype, at the start of the float workspace) run merges into the
    output.

    CUDA graphs (``use_cuda_graph=True``): ``qo_indptr``, ``kv_indptr``, ``kv_indices`` and
    ``kv_len_arr`` (CUDA int32) are required; the batch size is ``len(qo_indptr) - 1``, the first
    plan fixes the most query rows (and so the work-item count). Every plan writes its page table
    into those buffers and its work items (padded with no-op items) and last-page lengths into
    the int workspace at fixed addresses, so a captured ``run`` replays correctly after a new plan.
    The first plan fixes the split-KV chunk count too; when it splits, later plans must keep its
    ``qo_indptr[-1]`` (the merge's row count is part of the captured launch).
    """

    _PAGED = True
    _NAME = "BatchMLAPagedAttentionWrapper"

    def __init__(self, float_workspace_buffer, use_cuda_graph: bool = False, qo_indptr=None, kv_indptr=None,
                 kv_indices=None, kv_len_arr=None, backend: str = "auto") -> None:
        self._init_common(float_workspace_buffer, "NHD", use_cuda_graph, backend, None, None, False,
                          [("qo_indptr", qo_indptr, None), ("kv_indptr", kv_indptr, 1),
                           ("kv_indices", kv_indices, None), ("kv_len_arr", kv_len_arr, 0)], None, None)
        self._qo_indptr_buf = qo_indptr
        self._kv_indptr_buf = kv_indptr
        self._kv_indices_buf = kv_indices
        self._kv_len_arr_buf = kv_len_arr
        self._use_profiler = False
        self._graph_chunks = None

    def plan(self, qo_indptr, kv_indptr, kv_indices, kv_len_arr, num_heads: int, head_dim_ckv: int,
             head_dim_kpe: int, page_size: int, causal: bool, sm_scale: float, q_data_type: Any, kv_data_type: Any,
             use_profiler: bool = False) -> None:
        """Plans the batch (host work; may synchronize). ``qo_indptr [B+1]`` (tokens),
        ``kv_indptr [B+1]`` (pages), ``kv_indices`` (page ids; entries past ``kv_indptr[-1]`` are
        ignored), ``kv_len_arr [B]`` (each request's KV length, ``0 <= kv_len <= pages * page_size``):
        int32 tensors on the host or the device (copied to the host here)."""
        op = f"{self._NAME}.plan"
        torch = _torch()
        if use_profiler:
            raise NotImplementedError(f"{op}: use_profiler (the intra-kernel profiler) is not supported")
        num_heads, head_dim_ckv, head_dim_kpe, page_size = (int(x) for x in (num_heads, head_dim_ckv, head_dim_kpe,
                                                                              page_size))
        if head_dim_ckv != _HEAD_DIM_CKV:
            raise ValueError(f"{op}: head_dim_ckv must be 512; got {head_dim_ckv}")
        if head_dim_kpe not in _HEAD_DIMS_KPE:
            raise ValueError(f"{op}: head_dim_kpe must be 64 or 0; got {head_dim_kpe}")
        if num_heads < 1:
            raise ValueError(f"{op}: num_heads must be >= 1; got {num_heads}")
        if page_size < 1:
            raise ValueError(f"{op}: page_size must be >= 1; got {page_size}")
        if sm_scale is None or not math.isfinite(float(sm_scale)):
            raise ValueError(f"{op}: sm_scale must be a finite number (FlashInfer's tests pass 1/sqrt(192)); got "
                             f"{sm_scale}")
        q_name = _dtype_name(q_data_type, "q_data_type")
        if q_name is None:
            raise ValueError(f"{op}: q_data_type must be float16 or bfloat16; got None")
        kv_name = _dtype_name(kv_data_type, "kv_data_type", fp8_ok=True) or q_name
        if kv_name.startswith("float8"):
            raise NotImplementedError(f"{op}: kv_data_type {kv_name}: fp8 MLA caches are not supported")
        if kv_name != q_name:
            raise ValueError(f"{op}: kv_data_type ({kv_name}) must equal q_data_type ({q_name})")

        # index arrays on the host
        qo_h, kv_h = _host_indptrs(qo_indptr, kv_indptr, "kv_indptr", op)
        qo_lens = _check_indptr(qo_h, "qo_indptr")
        num_pages = _check_indptr(kv_h, "kv_indptr")
        batch = qo_lens.size
        pages_h = _host_ints(kv_indices, "kv_indices")
        if kv_h[-1] > pages_h.size:
            raise ValueError(f"{op}: kv_indptr[-1] ({kv_h[-1]}) must be <= len(kv_indices) ({pages_h.size})")
        pages_h = pages_h[:kv_h[-1]]
        if pages_h.size and pages_h.min() < 0:
            raise ValueError(f"{op}: kv_indices must be >= 0; got {pages_h.min()}")
        kv_lens = _host_ints(kv_len_arr, "kv_len_arr")
        if kv_lens.size != batch:
            raise ValueError(f"{op}: kv_len_arr must have batch_size ({batch}) entries; got {kv_lens.size}")
        cap = num_pages * page_size
        bad = (kv_lens < 0) | (kv_lens > cap)
        if np.any(bad):
            b = int(np.argmax(bad))
            raise ValueError(f"{op}: kv_len_arr[{b}] = {kv_lens[b]} must be in [0, pages * page_size = {cap[b]}] "
                             f"(request {b} has {num_pages[b]} pages)")
        if batch and int(kv_lens.max()) >= 2 ** 31 - 64:
            raise ValueError(f"{op}: a request must have fewer than 2**31 - 64 keys; got {int(kv_lens.max())}")
        total_q = int(qo_h[-1])
        if total_q * num_heads >= 2 ** 31 - 128:
            raise ValueError(f"{op}: qo_indptr[-1] * num_heads must be < 2**31 - 128")
        # the kernel's KV length is (pages - 1) * page_size + last_page_len (0 without pages)
        last_h = np.where(num_pages > 0, kv_lens - (num_pages - 1) * page_size, 0)

        graph = self._use_cuda_graph
        if graph:
            self._check_graph_plan(batch, total_q)
            if pages_h.size > len(self._kv_indices_buf):
                raise ValueError(f"The length of kv_indices ({pages_h.size}) exceeds the allocated buffer size "
                                 f"({len(self._kv_indices_buf)})")

        # work items: (request, 64-row tile) pairs over the packed rows token * num_heads + head,
        # each cut into `chunks` key chunks when the batch has too few to fill the SMs (split-KV;
        # under CUDA graphs the first plan picks the count by its items alone, and it stays)
        forced = (self._graph_chunks if self._graph_chunks is not None else -1) if graph else 0
        sms = _num_sms(self.device)
        items_list, chunks = _prefill.mla_plan(qo_lens.tolist(), kv_lens.tolist(), num_heads, sms, forced)
        max_rows = total_q
        if graph:
            if chunks > 1 and self._max_total_num_rows is not None and total_q != self._max_total_num_rows:
                raise ValueError(f"{op}: under CUDA graphs with split-KV (the first plan's {chunks} key chunks per "
                                 f"request) qo_indptr[-1] must stay {self._max_total_num_rows}; got {total_q}")
            max_rows = total_q if self._max_total_num_rows is None else self._max_total_num_rows
        # split-KV's partial states: o [rows, chunks, num_heads, 512] (q's dtype) and lse
        # [rows, chunks + 1, num_heads] (float32) at the start of the float workspace; a workspace
        # too small for them takes as many chunks as fit (none: no split)
        ws = self._float_workspace_buffer

        def part_bytes(c):
            return (max_rows * c * num_heads * _HEAD_DIM_CKV * 2 + 255) // 256 * 256, max_rows * (c + 1) * num_heads * 4

        if chunks > 1 and sum(part_bytes(chunks)) > ws.numel() and not (graph and self._graph_chunks is not None):
            fit = chunks
            while fit > 1 and sum(part_bytes(fit)) > ws.numel():
                fit -= 1
            items_list, chunks = _prefill.mla_plan(qo_lens.tolist(), kv_lens.tolist(), num_heads, sms, fit)
        items = np.asarray(items_list, dtype=np.int32).reshape(-1, 2)
        if graph:
            items = _pad_items(items, (max_rows * num_heads + (_TILE_ROWS - 1) * batch) // _TILE_ROWS * chunks, op)
        self._o_part = self._lse_part = None
        if chunks > 1:
            o_bytes, l_bytes = part_bytes(chunks)
            if ws.numel() < o_bytes + l_bytes:
                raise ValueError(f"{op}: float_workspace_buffer too small: split-KV over {chunks} key chunks needs "
                                 f"{o_bytes + l_bytes} bytes; it has {ws.numel()}")
            self._o_part = ws[:o_bytes].view(getattr(torch, q_name))
            self._lse_part = ws[o_bytes:o_bytes + l_bytes].view(torch.float32)
        # device copies: one pinned staging buffer -> int workspace copy (under CUDA graphs the page
        # table goes to the caller's buffers; items and last-page lengths stay at fixed offsets)
        arrays = {"qo": qo_h, "kv": kv_h, "pages": pages_h, "kv_len": kv_lens}
        parts = [("items", items.reshape(-1)), ("last", last_h.astype(np.int32))]
        if not graph:
            parts += [(name, a.astype(np.int32)) for name, a in arrays.items()]
        views = self._stage(parts, True)
        if graph:
            bufs = {"qo": self._qo_indptr_buf, "kv": self._kv_indptr_buf, "pages": self._kv_indices_buf,
                    "kv_len": self._kv_len_arr_buf}
            with torch.cuda.device(self.device):
                for name, a in arrays.items():
                    bufs[name][:a.size].copy_(torch.from_numpy(a.astype(np.int32)), non_blocking=True)
            if self._max_total_num_rows is None:
                self._max_total_num_rows = total_q
            self._graph_chunks = chunks
        else:
            self._qo_indptr_buf, self._kv_indptr_buf = views["qo"], views["kv"]
            self._kv_indices_buf, self._kv_len_arr_buf = views["pages"], views["kv_len"]
        self._last_page_len = views["last"]
        self._items = views["items"]
        self._num_items = int(items.shape[0])
        self._num_chunks = int(chunks)

        # the plan (FlashInfer's attribute names where it has them)
        self._batch_size = batch
        self._total_q = total_q
        self._num_heads, self._head_dim_ckv, self._head_dim_kpe = num_heads, head_dim_ckv, head_dim_kpe
        self._page_size = page_size
        self._max_page = int(pages_h.max()) if pages_h.size else -1
        self._causal = bool(causal)
        self._sm_scale = float(sm_scale)
        self._use_profiler = False
        self._q_name = self._kv_name = q_name
        self._cached_q_data_type = self._cached_kv_data_type = getattr(torch, q_name)
        self._f32 = torch.float32
        self._to_dlpack = torch_exporter(torch)
        self._tensor_type = torch.Tensor
        self._raw_stream = torch_stream_source(torch)
        self._dev_index = self.device.index or 0
        self._planned = True

    def run(self, q_nope, q_pe, ckv_cache, kpe_cache, out=None, lse=None, return_lse: bool = False,
            profiler_buffer=None, kv_len=None, page_table=None, return_lse_base_on_e: bool = False, o_scale=None):
        """o ``[qo_indptr[-1], num_heads, 512]`` (q's dtype) and, with ``return_lse`` (or into a
        given ``lse``, contiguous float32 ``[qo_indptr[-1], num_heads]``), the LSE: base 2, or base
        e with ``return_lse_base_on_e``. ``q_nope [qo_indptr[-1], num_heads, 512]``, ``q_pe [...,
        64]``, ``ckv_cache [num_pages, page_size, 512]``, ``kpe_cache [num_pages, page_size, 64]``
        (with head_dim_kpe 0, q_pe / kpe_cache may be None). No host synchronization; allocates
        only the outputs."""
        if not self._planned:
            raise RuntimeError(f"{self._NAME}.run: call plan() first")
        # (profiler_buffer: read only with use_profiler, which plan refuses; kv_len / page_table:
        # the cutlass backend's, ignored by the others, as in FlashInfer)
        if o_scale is not None:
            raise NotImplementedError(f"{self._NAME}.run: o_scale (fp8 output) is not supported")
        n, h, dkpe = self._total_q, self._num_heads, self._head_dim_kpe
        is_torch = type(q_nope) is self._tensor_type
        fw = framework_of(q_nope, "q_nope")
        self._check_q(q_nope, "q_nope", (n, h, _HEAD_DIM_CKV))
        self._check_cache(ckv_cache, "ckv_cache", _HEAD_DIM_CKV)
        if dkpe:
            self._check_q(q_pe, "q_pe", (n, h, dkpe))
            self._check_cache(kpe_cache, "kpe_cache", dkpe)
            if _shape(kpe_cache)[0] != _shape(ckv_cache)[0]:
                raise ValueError(f"kpe_cache has {_shape(kpe_cache)[0]} pages; ckv_cache has {_shape(ckv_cache)[0]}")
        else:
            for name, t in (("q_pe", q_pe), ("kpe_cache", kpe_cache)):
                if t is not None and _shape(t)[-1:] != (0,):
                    raise ValueError(f"{name} must be None or have a last dimension of 0 (head_dim_kpe=0 was planned); "
                                     f"got shape {_shape(t)}")
        o_shape = (n, h, _HEAD_DIM_CKV)
        if out is None:
            out = fw.empty(o_shape, q_nope)
        elif is_torch:
            _check_output(out, "out", o_shape, q_nope.dtype, q_nope.device)
        if lse is None:
            if return_lse:
                lse = fw.empty_f32((n, h), q_nope)
        elif is_torch:
            _check_output(lse, "lse", (n, h), self._f32, q_nope.device)
            if not lse.is_contiguous():
                raise ValueError("Invalid layout of lse: it must be contiguous")
        if n and self._num_items:
            dl = self._to_dlpack if is_torch else fw.to_dlpack
            td = self._to_dlpack
            tt = self._tensor_type
            ckv_dl = td(ckv_cache) if type(ckv_cache) is tt else to_dlpack(ckv_cache, "ckv_cache")
            kpe_dl = None
            if dkpe:
                kpe_dl = td(kpe_cache) if type(kpe_cache) is tt else to_dlpack(kpe_cache, "kpe_cache")
            _prefill.mla_run(dl(q_nope), dl(q_pe) if dkpe else None, ckv_dl, kpe_dl, dl(out),
                             None if lse is None else dl(lse), td(self._qo_indptr_buf), td(self._kv_indptr_buf),
                             td(self._kv_indices_buf), td(self._last_page_len), td(self._items), self._num_items,
                             self._num_chunks, None if self._o_part is None else td(self._o_part),
                             None if self._lse_part is None else td(self._lse_part),
                             self._page_size, self._causal, self._sm_scale,
                             self._raw_stream(self._dev_index) if is_torch else fw.stream(q_nope), True)
            if return_lse_base_on_e and lse is not None:
                fw.scale_(lse, _LN2)
        return (out, lse) if return_lse else out

    def _check_q(self, t: Any, name: str, shape: tuple) -> None:
        """q_nope / q_pe against the plan: dtype (FlashInfer's message) and shape."""
        if t is None:
            raise ValueError(f"{name} is required (head_dim_kpe={self._head_dim_kpe} was planned)")
        self._check_plan_dtype(t, name, "q")
        if _shape(t) != shape:
            raise ValueError(f"{name} must be [qo_indptr[-1], num_heads, {shape[2]}] = {list(shape)} as planned; got "
                             f"shape {_shape(t)}")

    def _check_cache(self, t: Any, name: str, dim: int) -> None:
        """ckv_cache / kpe_cache against the plan: dtype, [num_pages, page_size, dim], enough pages."""
        if t is None:
            raise ValueError(f"{name} is required (head_dim_kpe={self._head_dim_kpe} was planned)")
        self._check_plan_dtype(t, name)
        s = _shape(t)
        if len(s) != 3 or s[2] != dim:
            raise ValueError(f"{name} must be [num_pages, page_size, {dim}]; got shape {s}")
        if s[1] != self._page_size:
            raise ValueError(f"the page_size of {name} ({s[1]}) does not match the page_size of the plan "
                             f"({self._page_size})")
        if s[0] <= self._max_page:
            raise ValueError(f"{name} has {s[0]} pages; the planned page table uses page {self._max_page}")
