"""Paged KV-cache utilities (FlashInfer-compatible ``flashinfer.page``).

The paged cache and its page table are described in the spec (§1.0): a cache is a tuple
``(k_cache, v_cache)`` of 4-D ``[max_num_pages, page_size, num_kv_heads, head_dim]`` (NHD) /
``[max_num_pages, num_kv_heads, page_size, head_dim]`` (HND) tensors, or of 3-D
``[max_num_pages, num_kv_heads, head_dim]`` tensors (page_size 1), or a single 5-D
``[max_num_pages, 2, page_size, num_kv_heads, head_dim]`` (NHD) /
``[max_num_pages, 2, num_kv_heads, page_size, head_dim]`` (HND) tensor, or a single 4-D
``[max_num_pages, 2, num_kv_heads, head_dim]`` tensor (page_size 1); ``[:, 0]`` is K, ``[:, 1]``
is V. Request ``b`` owns pages ``kv_indices[kv_indptr[b]:kv_indptr[b+1]]``; its token ``p`` sits
in page ``kv_indices[kv_indptr[b] + p // page_size]``, slot ``p % page_size``.
"""

from __future__ import annotations

import operator
from typing import Any, Callable, Dict, Optional, Tuple

from . import _index_check, _page
from ._ext import _BY_TYPE, FRAMEWORK_STREAM, framework_of, not_a_tensor, to_dlpack

__all__ = ["append_paged_kv_cache", "get_batch_indices_positions", "get_seq_lens"]

_LAYOUTS = {"NHD": 0, "HND": 1}
_ic = _index_check

# type -> (the framework's int32 dtype object, a cast to it); filled on first use per type.
_INT32: Dict[type, Tuple[Any, Callable[[Any], Any]]] = {}


def _int32_of(x: Any) -> Tuple[Any, Callable[[Any], Any]]:
    fw = framework_of(x)
    if fw.name == "torch":
        i32 = fw.torch.int32
        entry = (i32, lambda t: t.to(i32))
    else:
        import numpy as np

        i32 = np.dtype(np.int32)
        entry = (i32, lambda t: t.astype(i32))
    _INT32[type(x)] = entry
    return entry


def _is_integer(dtype: Any) -> bool:
    kind = getattr(dtype, "kind", None)  # NumPy / CuPy dtypes
    if kind is not None:
        return kind in "iu"
    return not (dtype.is_floating_point or dtype.is_complex) and str(dtype) != "torch.bool"


def _as_int32(x: Any, name: str) -> Any:
    """``x`` itself when it is int32, else a cast copy (FlashInfer casts index tensors with ``.int()``);
    a tensor of floats, bools or complex numbers is refused rather than truncated. Under
    ``FLASHINFER_CHECK_INDICES=1`` wider integers must also fit int32 (a check that reads them)."""
    e = _INT32.get(type(x))
    if e is None:
        e = _int32_of(x)
    if x.dtype == e[0]:
        return x
    if not _is_integer(x.dtype):
        raise ValueError(f"{name}.dtype must be an integer type (int32; other integer types are cast); got {x.dtype}")
    if _ic.enabled and x.shape[0] > 0:  # (reads the indices: one min and one max)
        lo, hi = int(x.min()), int(x.max())
        if lo < -2**31 or hi > 2**31 - 1:
            raise ValueError(f"{name} holds values outside int32 (min {lo}, max {hi})")
    return e[1](x)


def _int_arg(x: Any, name: str) -> int:
    """An integer argument (an int, NumPy integer or integer 0-d tensor), never a truncated float."""
    try:
        return operator.index(x)
    except TypeError:
        raise TypeError(f"{name} must be an integer; got {type(x).__name__}") from None


def _require_tensor(x: Any, name: str) -> None:
    if not hasattr(x, "__dlpack__") or not hasattr(x, "shape"):
        raise not_a_tensor(name, x)


def _split_cache(paged_kv_cache: Any) -> Tuple[Any, Any]:
    if isinstance(paged_kv_cache, (tuple, list)):
        if len(paged_kv_cache) != 2:
            raise ValueError(f"paged_kv_cache as a tuple must be (k_cache, v_cache); got {len(paged_kv_cache)} items")
        return paged_kv_cache[0], paged_kv_cache[1]
    if hasattr(paged_kv_cache, "__dlpack__"):
        return paged_kv_cache, None
    raise KeyError(f"Unrecognized paged_kv_cache type {type(paged_kv_cache)}, expect a single tensor or a tuple of "
                   "tensor.")


def _layout(kv_layout: str) -> int:
    try:
        return _LAYOUTS[kv_layout]
    except (KeyError, TypeError):
        raise KeyError(f"Invalid kv_layout {kv_layout}") from None


def append_paged_kv_cache(append_key: Any, append_value: Any, batch_indices: Any, positions: Any,
                          paged_kv_cache: Any, kv_indices: Any, kv_indptr: Any, kv_last_page_len: Any,
                          kv_layout: str = "NHD") -> None:
    r"""Writes ``append_key[i]`` / ``append_value[i]`` (all heads) into the K / V cache at token
    ``positions[i]`` of request ``batch_indices[i]``; nothing else is written.

    append_key, append_value: ``[nnz, num_kv_heads, head_dim]``, the cache's dtype (float16,
    bfloat16 or float8: copied as is), last dimension contiguous, other strides free (e.g. views
    ``kv[:, 0]`` of a packed buffer). batch_indices, positions: ``[nnz]`` (int32; other integer
    dtypes are cast). paged_kv_cache: any form of the module docstring, ``kv_layout`` ``"NHD"`` or
    ``"HND"`` (tuple form: K and V must have identical strides, else ``RuntimeError``).
    kv_indices ``[kv_indptr[-1]]``, kv_indptr ``[batch_size + 1]``, kv_last_page_len ``[batch_size]``:
    the page table, which must already include the appended tokens (kv_last_page_len is checked
    for shape only). Mutates the cache; returns ``None``.

    Bad indices: an entry whose batch index is outside ``[0, batch_size)``, whose position is
    negative or beyond the request's pages in the table, or whose page id is outside the cache is
    skipped on the device (nothing is written for it). With ``FLASHINFER_CHECK_INDICES=1`` the call
    raises ``ValueError`` naming the first such entry instead (this synchronizes the host).
    """
    # The hot path is kept flat (host time per call matters): the binding checks everything,
    # and answers False when an index tensor is not int32, which is then cast and sent again.
    try:
        layout = _LAYOUTS[kv_layout]
    except (KeyError, TypeError):
        raise KeyError(f"Invalid kv_layout {kv_layout}") from None
    if type(paged_kv_cache) is tuple and len(paged_kv_cache) == 2:
        k_cache, v_cache = paged_kv_cache
    else:
        k_cache, v_cache = _split_cache(paged_kv_cache)
    t = type(append_key)
    fw = _BY_TYPE.get(t) or framework_of(append_key, "append_key")
    err = None
    if _ic.enabled:
        buf = _ic.error_buffer(fw, append_key)
        err = None if buf is None else fw.to_dlpack(buf)
    if (fw.direct and type(append_value) is t and type(batch_indices) is t and type(positions) is t
            and type(k_cache) is t and (v_cache is None or type(v_cache) is t) and type(kv_indices) is t
            and type(kv_indptr) is t and type(kv_last_page_len) is t):  # (see norm.py)
        stream = FRAMEWORK_STREAM
        caps = (append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices, kv_indptr,
                kv_last_page_len)
    else:
        stream = fw.stream(append_key)
        caps = _export(append_key, append_value, batch_indices, positions, k_cache, v_cache, kv_indices, kv_indptr,
                       kv_last_page_len)
    if not _page.append_paged_kv_cache(*caps, layout, stream, err):
        # an index tensor is not int32: cast them as FlashInfer does (.int()) and send again
        if err is not None:
            err = fw.to_dlpack(buf)
        _page.append_paged_kv_cache(*_export(append_key, append_value, _as_int32(batch_indices, "batch_indices"),
                                             _as_int32(positions, "positions"), k_cache, v_cache,
                                             _as_int32(kv_indices, "kv_indices"), _as_int32(kv_indptr, "kv_indptr"),
                                             _as_int32(kv_last_page_len, "kv_last_page_len")), layout, stream, err)


_NAMES = ("append_key", "append_value", "batch_indices", "positions", "paged_kv_cache", "paged_kv_cache[1]",
          "kv_indices", "kv_indptr", "kv_last_page_len")


def _export(*ts: Any) -> Tuple[Any, ...]:
    """DLPack exports of the append's tensors, each by its own framework (None stays None)."""
    return tuple(None if t is None else to_dlpack(t, n) for t, n in zip(ts, _NAMES))


def _empty_int32(fw: Any, like: Any, n: int) -> Any:
    if fw.name == "torch":
        return like.new_empty((n,), dtype=fw.torch.int32)
    if fw.name == "cupy":
        with like.device:
            return fw.cupy.empty((n,), dtype=fw.cupy.int32)
    import numpy as np

    return np.empty((n,), dtype=np.int32)


def _check_buffer(x: Any, nnz: int, name: str, like: Any) -> None:
    """FlashInfer's check_shape_dtype_device for a provided output buffer."""
    _require_tensor(x, name)
    if tuple(x.shape) != (nnz,):
        raise ValueError(f"Invalid shape of {name}: expected {(nnz,)}, got {tuple(x.shape)}")
    e = _INT32.get(type(x)) or _int32_of(x)
    if x.dtype != e[0]:
        raise ValueError(f"Invalid dtype of {name}: expected {e[0]}, got {x.dtype}")
    if x.device != like.device:
        raise ValueError(f"Invalid device of {name}: expected {like.device}, got {x.device}")


def get_batch_indices_positions(append_indptr: Any, seq_lens: Any, nnz: int, batch_indices: Optional[Any] = None,
                                positions: Optional[Any] = None) -> Tuple[Any, Any]:
    r"""Ragged append layout -> per-entry ``(batch_indices, positions)`` (int32 ``[nnz]``).

    For request ``b`` with ``L_b = append_indptr[b+1] - append_indptr[b]`` appended tokens and total
    length ``seq_lens[b]`` (after the append), entry ``append_indptr[b] + t`` gets batch index ``b``
    and position ``seq_lens[b] - L_b + t``. Entries beyond ``append_indptr[-1]`` get batch index -1
    (and position 0 when this call allocates ``positions``; a given ``positions`` keeps its value
    there). Outputs live on ``append_indptr``'s device (CUDA, or the CPU for CPU tensors); given
    buffers must be int32 ``(nnz,)`` on that device (else ``ValueError``). ``seq_lens`` may be int32
    or int64.

    Example: ``append_indptr = [0, 1, 3, 6, 10]``, ``seq_lens = [5, 5, 5, 5]`` gives batch indices
    ``[0, 1, 1, 2, 2, 2, 3, 3, 3, 3]`` and positions ``[4, 3, 4, 2, 3, 4, 1, 2, 3, 4]``.
    """
    fw = framework_of(append_indptr, "append_indptr")
    nnz = _int_arg(nnz, "nnz")
    if nnz < 0:
        raise ValueError(f"nnz must be >= 0; got {nnz}")
    if batch_indices is None:
        batch_indices = _empty_int32(fw, append_indptr, nnz)
    else:
        _check_buffer(batch_indices, nnz, "batch_indices", append_indptr)
    zero_unheld = positions is None
    if positions is None:
        positions = _empty_int32(fw, append_indptr, nnz)
    else:
        _check_buffer(positions, nnz, "positions", append_indptr)
    _page.get_batch_indices_positions(fw.to_dlpack(append_indptr), to_dlpack(seq_lens, "seq_lens"),
                                      to_dlpack(batch_indices, "batch_indices"), to_dlpack(positions, "positions"),
                                      zero_unheld, fw.stream(append_indptr))
    return batch_indices, positions


def get_seq_lens(kv_indptr: Any, kv_last_page_len: Any, page_size: int) -> Any:
    r"""Sequence lengths of a paged cache: ``clamp(kv_indptr[1:] - kv_indptr[:-1] - 1, min=0) * page_size
    + kv_last_page_len`` (dtype and device follow the inputs; works on the CPU). kv_indptr
    ``[batch_size + 1]`` and kv_last_page_len ``[batch_size]`` are integer tensors, page_size an
    integer >= 1 (else ``TypeError`` / ``ValueError`` naming the argument)."""
    page_size = _int_arg(page_size, "page_size")
    if page_size < 1:
        raise ValueError(f"page_size must be >= 1; got {page_size}")
    for name, x in (("kv_indptr", kv_indptr), ("kv_last_page_len", kv_last_page_len)):
        _require_tensor(x, name)
        if len(x.shape) != 1 or not _is_integer(x.dtype):
            raise ValueError(f"{name} must be a 1-D integer tensor; got shape {tuple(x.shape)} and dtype {x.dtype}")
    if kv_indptr.shape[0] != kv_last_page_len.shape[0] + 1:
        raise ValueError(f"kv_indptr must have kv_last_page_len.shape[0] + 1 (batch_size + 1) = "
                         f"{kv_last_page_len.shape[0] + 1} elements; got {kv_indptr.shape[0]}")
    return (kv_indptr[1:] - kv_indptr[:-1] - 1).clip(0) * page_size + kv_last_page_len
