"""Merging attention states (FlashInfer-compatible ``flashinfer.cascade``).

A state ``(v, s)`` is the attention output ``v [seq_len, num_heads, head_dim]`` (float16 or
bfloat16) over a set of keys and the base-2 log-sum-exp ``s [seq_len, num_heads]`` (float32) of
its logits. Merging states A and B gives the state of the union of their key sets::

    m = max(s_a, s_b);  w_a = 2**(s_a - m);  w_b = 2**(s_b - m)
    v = (w_a * v_a + w_b * v_b) / (w_a + w_b)      (fp32, rounded once)
    s = m + log2(w_a + w_b)

The empty state (``s = -inf``, ``v = 0``) is the identity; two empty states merge into the
empty state (``v = 0``, never NaN). Value tensors need only a contiguous last dimension; LSE
tensors may have any strides. LSE inputs of another dtype are converted with ``.float()``
(so ``merge_state_in_place`` updates ``s`` only when it is already float32). Shape mismatches
raise RuntimeError (as FlashInfer's C++ checks do); other bad arguments raise ValueError.

Cascade attention wrappers, built on these merges and on the prefill / decode wrappers:

* ``MultiLevelCascadeAttentionWrapper``: ``num_levels`` levels, each a
  ``BatchPrefillWithPagedKVCacheWrapper`` with its own ``qo_indptr`` (over the same q rows) and
  page table into one shared paged cache (e.g. level 0 ``[0, B]``: every query reads one shared
  prefix; the last level one request per query block: each request's own keys). ``run``
  computes the last level with its LSE, then each other level (0, 1, ..., num_levels - 2) with
  its LSE, merged in place into the last level's state: attention over the concatenated keys.
* the legacy two-level wrappers ``BatchDecodeWithSharedPrefixPagedKVCacheWrapper`` and
  ``BatchPrefillWithSharedPrefixPagedKVCacheWrapper``: the shared prefix as contiguous
  ``k_shared`` / ``v_shared`` (one ``single_prefill_with_kv_cache`` call, all q rows as one
  request, non-causal), merged with the batch decode / prefill attention over each request's
  unique paged keys.
"""

from __future__ import annotations

from typing import Any, Optional, Sequence, Tuple

from . import _cascade
from . import decode as _decode_mod
from . import prefill as _prefill_mod
from ._ext import ArgumentError, framework_of, to_dlpack
from ._ext import dtype_str as _dtype_str

__all__ = [
    "merge_state",
    "merge_state_in_place",
    "merge_states",
    "MultiLevelCascadeAttentionWrapper",
    "BatchDecodeWithSharedPrefixPagedKVCacheWrapper",
    "BatchPrefillWithSharedPrefixPagedKVCacheWrapper",
]


def _f32(s: Any, name: str) -> Any:
    return framework_of(s, name).as_f32(s)


def merge_state(v_a: Any, s_a: Any, v_b: Any, s_b: Any) -> Tuple[Any, Any]:
    r"""Merges the states of two key sets: returns new ``(v_merged, s_merged)``.

    v_a, v_b: ``[seq_len, num_heads, head_dim]`` float16/bfloat16 (same dtype); s_a, s_b:
    ``[seq_len, num_heads]`` base-2 LSE. ``v_merged`` has ``v_a``'s dtype, ``s_merged`` is float32.
    """
    fw = framework_of(v_a, "v_a")
    fs = framework_of(s_a, "s_a")
    s_a = fs.as_f32(s_a)
    s_b = _f32(s_b, "s_b")
    v_merged = fw.empty_like(v_a)
    s_merged = fs.empty_like(s_a)  # float32 [seq_len, num_heads] (the binding checks the shape)
    dl = fw.to_dlpack
    _cascade.merge_state(dl(v_a), to_dlpack(s_a, "s_a"), to_dlpack(v_b, "v_b"), to_dlpack(s_b, "s_b"),
                         dl(v_merged), dl(s_merged), fw.stream(v_a))
    return v_merged, s_merged


def merge_state_in_place(v: Any, s: Any, v_other: Any, s_other: Any, mask: Optional[Any] = None) -> None:
    r"""Merges ``(v_other, s_other)`` into ``(v, s)`` in place.

    v, v_other: ``[seq_len, num_heads, head_dim]`` float16/bfloat16; s, s_other:
    ``[seq_len, num_heads]`` float32 (another dtype is converted, and then ``s`` itself is not
    updated). mask: optional bool/uint8 ``[seq_len]`` on the same device; rows where it is 0
    are left untouched (useful under CUDA graphs).
    """
    fw = framework_of(v, "v")
    s = _f32(s, "s")
    s_other = _f32(s_other, "s_other")
    _cascade.merge_state_in_place(fw.to_dlpack(v), to_dlpack(s, "s"), to_dlpack(v_other, "v_other"),
                                  to_dlpack(s_other, "s_other"), None if mask is None else to_dlpack(mask, "mask"),
                                  fw.stream(v))


def merge_states(v: Any, s: Any) -> Tuple[Any, Any]:
    r"""Merges ``num_states`` states per row: returns new ``(v_merged, s_merged)``.

    v: ``[seq_len, num_states, num_heads, head_dim]`` float16/bfloat16; s:
    ``[seq_len, num_states, num_heads]`` base-2 LSE. ``v_merged [seq_len, num_heads, head_dim]``
    has ``v``'s dtype, ``s_merged [seq_len, num_heads]`` is float32. Each state is read once;
    zero states give the empty state (``v = 0``, ``s = -inf``).
    """
    fw = framework_of(v, "v")
    shape = getattr(v, "shape", None)
    if shape is None:  # a bare DLPack producer: nothing to allocate the outputs with
        fw.empty_like(v)  # (raises the TypeError that says so)
    if len(shape) != 4:
        raise ArgumentError(f"merge_states: v must be 4-D [seq_len, num_states, num_heads, head_dim]; got a "
                            f"{len(shape)}-D tensor of shape {tuple(shape)}")
    s = _f32(s, "s")
    v_merged = fw.empty((shape[0], shape[2], shape[3]), v)
    s_merged = fw.empty_f32((shape[0], shape[2]), v)
    dl = fw.to_dlpack
    _cascade.merge_states(dl(v), to_dlpack(s, "s"), dl(v_merged), dl(s_merged), fw.stream(v))
    return v_merged, s_merged


# ================================================================================================
# Cascade attention wrappers
# ================================================================================================

def _per_level(arr: Any, name: str, num_levels: int) -> list:
    """``arr`` (a list or tuple) as a list of ``num_levels`` per-level entries; ValueError
    otherwise (FlashInfer zips the lists with ``strict=True``)."""
    if not isinstance(arr, Sequence) or isinstance(arr, (str, bytes)):
        raise ValueError(f"{name} must be a list of {num_levels} tensors (one per level); got {type(arr).__name__}")
    if len(arr) != num_levels:
        raise ValueError(f"{name} must have one entry per level ({num_levels}); got {len(arr)}")
    return list(arr)


class MultiLevelCascadeAttentionWrapper:
    r"""Multi-level cascade attention over one paged KV cache (spec §2).

    Level ``l`` is a :class:`~flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper` (all levels
    share ``float_workspace_buffer``; each has its own int workspace) with its own ``qo_indptr``
    in token units over the *same* q (every level's ``qo_indptr[-1]`` is ``q.shape[0]``) and its
    own page table. A query row's result is attention over the union of the keys each level
    gives it: e.g. two levels with ``qo_indptr_arr = [[0, B], arange(B + 1)]`` (decode), level 0
    one request holding the shared prefix's pages, level 1 each request's unique pages.

    ``causal`` applies to the last level only (the others are non-causal; bottom-right within
    the last level's keys, which equals causal attention over the concatenated keys when the
    levels above hold earlier positions and no request has more q rows than last-level keys). The other options (``pos_encoding_mode``,
    ``window_left``, ``logits_soft_cap``, ``sm_scale``, dtypes) go to every level as in FlashInfer;
    ``window_left`` then counts within each level's own keys. ``pos_encoding_mode="ROPE_LLAMA"``
    is not supported (``NotImplementedError``: each level's keys would be rotated from position 0).

    ``run`` computes the last level with its LSE, then levels 0, 1, ..., ``num_levels - 2`` each
    with its LSE, merged in place into the result (:func:`merge_state_in_place`): no host
    synchronization; it allocates the result and its LSE and one more (o, LSE) pair that the
    other levels reuse in turn (stream order makes each merge read it before the next level
    writes it). CUDA graphs (``use_cuda_graph=True``): the four ``*_buf_arr`` lists give each
    level's buffers, as for the prefill wrapper (``ValueError`` if missing).
    """

    def __init__(self, num_levels, float_workspace_buffer, kv_layout: str = "NHD", use_cuda_graph: bool = False,
                 qo_indptr_buf_arr=None, paged_kv_indptr_buf_arr=None, paged_kv_indices_buf_arr=None,
                 paged_kv_last_page_len_buf_arr=None) -> None:
        if isinstance(num_levels, bool) or not isinstance(num_levels, int) or num_levels < 1:
            raise ValueError(f"num_levels must be an int >= 1; got {num_levels!r}")
        _decode_mod._layout_code(kv_layout)  # KeyError for anything but "NHD" / "HND"
        Paged = _prefill_mod.BatchPrefillWithPagedKVCacheWrapper
        self._use_cuda_graph = bool(use_cuda_graph)
        if self._use_cuda_graph:
            bufs = [_per_level(arr, name, num_levels) for arr, name in (
                (qo_indptr_buf_arr, "qo_indptr_buf_arr"), (paged_kv_indptr_buf_arr, "paged_kv_indptr_buf_arr"),
                (paged_kv_indices_buf_arr, "paged_kv_indices_buf_arr"),
                (paged_kv_last_page_len_buf_arr, "paged_kv_last_page_len_buf_arr"))]
            self._batch_prefill_wrappers = [
                Paged(float_workspace_buffer, kv_layout, use_cuda_graph=True, qo_indptr_buf=qo,
                      paged_kv_indptr_buf=indptr, paged_kv_indices_buf=indices, paged_kv_last_page_len_buf=last)
                for qo, indptr, indices, last in zip(*bufs)]
        else:
            self._batch_prefill_wrappers = [Paged(float_workspace_buffer, kv_layout) for _ in range(num_levels)]
        self._num_levels = num_levels
        self._kv_layout = kv_layout
        self._float_workspace_buffer = float_workspace_buffer
        self._planned = False

    @property
    def is_cuda_graph_enabled(self) -> bool:
        return self._use_cuda_graph

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffers) -> None:
        """New workspaces: one float workspace for all levels, a list of ``num_levels`` int
        workspaces (an entry may be None: a new 8 MiB buffer). The next plan uses them."""
        ints = _per_level(int_workspace_buffers, "int_workspace_buffers", self._num_levels)
        for wrapper, int_ws in zip(self._batch_prefill_wrappers, ints):
            wrapper.reset_workspace_buffer(float_workspace_buffer, int_ws)
        self._float_workspace_buffer = float_workspace_buffer

    def plan(self, qo_indptr_arr, paged_kv_indptr_arr, paged_kv_indices_arr, paged_kv_last_page_len,
             num_qo_heads: int, num_kv_heads: int, head_dim: int, page_size: int, causal: bool = False,
             pos_encoding_mode: str = "NONE", use_fp16_qk_reduction: bool = False, sm_scale: Optional[float] = None,
             window_left: int = -1, logits_soft_cap: Optional[float] = None, rope_scale: Optional[float] = None,
             rope_theta: Optional[float] = None, q_data_type: Any = "float16", kv_data_type: Any = None) -> None:
        """Plans every level (host work; may synchronize). Each ``*_arr`` (and
        ``paged_kv_last_page_len``) is a list with one index tensor per level; level ``l`` is
        planned as ``BatchPrefillWithPagedKVCacheWrapper.plan(qo_indptr_arr[l], ...,
        causal=causal if l == num_levels - 1 else False, ...)``. Every level must cover all q
        rows: equal ``qo_indptr[-1]`` (``ValueError``)."""
        if _decode_mod._pos_code(pos_encoding_mode) == 1:
            raise NotImplementedError("MultiLevelCascadeAttentionWrapper: pos_encoding_mode='ROPE_LLAMA' is not "
                                      "supported (each level's keys would be rotated from position 0); apply RoPE "
                                      "before appending to the cache and plan with pos_encoding_mode='NONE'")
        n = self._num_levels
        levels = [_per_level(arr, name, n) for arr, name in (
            (qo_indptr_arr, "qo_indptr_arr"), (paged_kv_indptr_arr, "paged_kv_indptr_arr"),
            (paged_kv_indices_arr, "paged_kv_indices_arr"), (paged_kv_last_page_len, "paged_kv_last_page_len"))]
        self._planned = False
        for i, (wrapper, qo_indptr, kv_indptr, kv_indices, kv_last) in enumerate(
                zip(self._batch_prefill_wrappers, *levels)):
            wrapper.plan(qo_indptr, kv_indptr, kv_indices, kv_last, num_qo_heads, num_kv_heads, head_dim, page_size,
                         causal=bool(causal) if i == n - 1 else False, pos_encoding_mode=pos_encoding_mode,
                         use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale, window_left=window_left,
                         logits_soft_cap=logits_soft_cap, rope_scale=rope_scale, rope_theta=rope_theta,
                         q_data_type=q_data_type, kv_data_type=kv_data_type)
        rows = [w._qo_indptr_last for w in self._batch_prefill_wrappers]
        if any(r != rows[-1] for r in rows):
            raise ValueError(f"every level's qo_indptr[-1] must be the number of q rows (all levels read the same q); "
                             f"got {rows}")
        self._planned = True

    begin_forward = plan

    def run(self, q, paged_kv_cache):
        """o ``[q.shape[0], num_qo_heads, head_dim]`` (q's dtype): attention of each q row over
        the keys of all levels. ``paged_kv_cache``: any of the four cache forms (spec §1.0),
        shared by the levels. No host synchronization."""
        if not self._planned:
            raise RuntimeError("MultiLevelCascadeAttentionWrapper.run: call plan() (begin_forward) first")
        wrappers = self._batch_prefill_wrappers
        out, lse = wrappers[-1].run(q, paged_kv_cache, return_lse=True)
        o_i = lse_i = None
        for wrapper in wrappers[:-1]:
            if o_i is None:
                o_i, lse_i = wrapper.run(q, paged_kv_cache, return_lse=True)
            else:  # the previous level's temporaries (its merge is queued before this level's launch)
                wrapper.run(q, paged_kv_cache, out=o_i, lse=lse_i)
            merge_state_in_place(out, lse, o_i, lse_i)
        return out

    forward = run


class BatchDecodeWithSharedPrefixPagedKVCacheWrapper:
    r"""Legacy two-level cascade decode (deprecated in FlashInfer's docs; see
    :class:`MultiLevelCascadeAttentionWrapper`): one query row per request, attention over a
    shared prefix given as contiguous ``k_shared`` / ``v_shared`` (``[shared_len, num_kv_heads,
    head_dim]`` NHD, ``[num_kv_heads, shared_len, head_dim]`` HND) and each request's unique keys
    in a paged cache.

    ``forward`` = ``single_prefill_with_kv_cache(q, k_shared, v_shared, causal=False,
    return_lse=True)`` (all B rows as one request) merged in place with the batch decode
    attention over the unique pages (:class:`~flashinfer.decode.BatchDecodeWithPagedKVCacheWrapper`
    planned by ``begin_forward``). ``data_type`` (float16 / bfloat16) is the dtype of q and of
    both caches; a forward whose q has another 16-bit dtype plans the same page table again with
    q's dtype first (once; it synchronizes) where FlashInfer 0.7.2 would reject it.
    """

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD") -> None:
        self._batch_decode_wrapper = _decode_mod.BatchDecodeWithPagedKVCacheWrapper(float_workspace_buffer, kv_layout)
        self._kv_layout = kv_layout
        self._plan_args = None
        self._q_name = None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer) -> None:
        self._batch_decode_wrapper.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def begin_forward(self, unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len, num_qo_heads: int,
                      num_kv_heads: int, head_dim: int, page_size: int, data_type: Any = "float16") -> None:
        """Plans the unique-KV batch decode (host work; may synchronize)."""
        name = _decode_mod._dtype_name(data_type, "data_type", fp8_ok=True)
        if name is None:
            name = "float16"
        if name not in ("float16", "bfloat16"):
            raise NotImplementedError(f"data_type {name}: fp8 caches are not supported by the shared-prefix wrapper "
                                      "(its shared prefix goes through single_prefill_with_kv_cache, which takes "
                                      "16-bit K / V)")
        self._plan_args = (unique_kv_indptr, unique_kv_indices, unique_kv_last_page_len, num_qo_heads, num_kv_heads,
                           head_dim, page_size)
        self._plan(name)

    def _plan(self, name: str) -> None:
        self._batch_decode_wrapper.plan(*self._plan_args, pos_encoding_mode="NONE", q_data_type=name,
                                        kv_data_type=name)
        self._q_name = name

    def forward(self, q, k_shared, v_shared, unique_kv_cache):
        """o ``[B, num_qo_heads, head_dim]`` (q ``[B, num_qo_heads, head_dim]``): attention over
        the shared prefix and each request's unique keys."""
        if self._plan_args is None:
            raise RuntimeError("BatchDecodeWithSharedPrefixPagedKVCacheWrapper.forward: call begin_forward() first")
        q_name = _dtype_str(q)
        if q_name != self._q_name and q_name in ("float16", "bfloat16"):
            self._plan(q_name)
        dw = self._batch_decode_wrapper
        v_shared_o, s_shared = _prefill_mod.single_prefill_with_kv_cache(
            q, k_shared, v_shared, causal=False, pos_encoding_mode="NONE", kv_layout=self._kv_layout,
            sm_scale=dw._sm_scale, rope_scale=dw._rope_scale, rope_theta=dw._rope_theta, return_lse=True)
        v_unique, s_unique = dw.run(q, unique_kv_cache, return_lse=True)
        merge_state_in_place(v_shared_o, s_shared, v_unique, s_unique)
        return v_shared_o

    def end_forward(self) -> None:
        """Deprecated; has no effect."""


class BatchPrefillWithSharedPrefixPagedKVCacheWrapper:
    r"""Legacy two-level cascade prefill / append (deprecated in FlashInfer's docs; see
    :class:`MultiLevelCascadeAttentionWrapper`): request ``b``'s q rows
    ``qo_indptr[b]:qo_indptr[b+1]`` attend to a shared prefix given as contiguous ``k_shared`` /
    ``v_shared`` (``[shared_len, num_kv_heads, head_dim]`` NHD, ``[num_kv_heads, shared_len,
    head_dim]`` HND) and to the request's unique keys in a paged cache.

    ``forward`` = ``single_prefill_with_kv_cache(q, k_shared, v_shared, causal=False,
    return_lse=True)`` (all q rows as one request: the prefix is never masked) merged in place with
    the batch prefill attention over the unique pages
    (:class:`~flashinfer.prefill.BatchPrefillWithPagedKVCacheWrapper`, causal within the unique
    keys when ``causal=True``). ``begin_forward`` plans for float16 q (as FlashInfer); a forward
    with a bfloat16 q plans the same page table again for it first (once; it synchronizes) where
    FlashInfer 0.7.2 would reject it.
    """

    def __init__(self, float_workspace_buffer, kv_layout: str = "NHD") -> None:
        self._batch_prefill_wrapper = _prefill_mod.BatchPrefillWithPagedKVCacheWrapper(float_workspace_buffer,
                                                                                      kv_layout)
        self._kv_layout = kv_layout
        self._plan_args = None
        self._q_name = None

    def reset_workspace_buffer(self, float_workspace_buffer, int_workspace_buffer) -> None:
        self._batch_prefill_wrapper.reset_workspace_buffer(float_workspace_buffer, int_workspace_buffer)

    def prewarm_paged_kv_stride_variant(self, variant: str = "independent") -> None:
        self._batch_prefill_wrapper.prewarm_paged_kv_stride_variant(variant)

    def begin_forward(self, qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads: int,
                      num_kv_heads: int, head_dim: int, page_size: int) -> None:
        """Plans the unique-KV batch prefill (host work; may synchronize)."""
        self._plan_args = (qo_indptr, paged_kv_indptr, paged_kv_indices, paged_kv_last_page_len, num_qo_heads,
                           num_kv_heads, head_dim, page_size)
        self._plan("float16")

    def _plan(self, name: str) -> None:
        self._batch_prefill_wrapper.plan(*self._plan_args, q_data_type=name)
        self._q_name = name

    def forward(self, q, k_shared, v_shared, unique_kv_cache, causal: bool = False,
                use_fp16_qk_reduction: bool = False, sm_scale: Optional[float] = None,
                rope_scale: Optional[float] = None, rope_theta: Optional[float] = None):
        """o ``[qo_indptr[-1], num_qo_heads, head_dim]``: attention over the shared prefix
        (non-causal) and each request's unique keys (bottom-right causal if ``causal``)."""
        if self._plan_args is None:
            raise RuntimeError("BatchPrefillWithSharedPrefixPagedKVCacheWrapper.forward: call begin_forward() first")
        q_name = _dtype_str(q)
        if q_name != self._q_name and q_name in ("float16", "bfloat16"):
            self._plan(q_name)
        v_shared_o, s_shared = _prefill_mod.single_prefill_with_kv_cache(
            q, k_shared, v_shared, causal=False, pos_encoding_mode="NONE", kv_layout=self._kv_layout,
            use_fp16_qk_reduction=use_fp16_qk_reduction, sm_scale=sm_scale, rope_scale=rope_scale,
            rope_theta=rope_theta, return_lse=True)
        v_unique, s_unique = self._batch_prefill_wrapper.forward_return_lse(
            q, unique_kv_cache, causal=causal, pos_encoding_mode="NONE", use_fp16_qk_reduction=use_fp16_qk_reduction,
            sm_scale=sm_scale, rope_scale=rope_scale, rope_theta=rope_theta)
        merge_state_in_place(v_shared_o, s_shared, v_unique, s_unique)
        return v_shared_o

    def end_forward(self) -> None:
        """Deprecated; has no effect."""
