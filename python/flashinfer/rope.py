"""Rotary position embedding (FlashInfer-compatible ``flashinfer.rope``).

``q [nnz, num_q_heads, head_dim]`` and ``k [nnz, num_k_heads, head_dim]`` (float16/bfloat16,
last dimension contiguous, other strides free, e.g. views of a packed QKV buffer) are rotated
over their first ``rotary_dim`` features (default: all); the rest are copied unchanged. The
rotation of a pair ``(a, b)`` by angle ``theta`` is ``(a cos - b sin, b cos + a sin)`` in fp32:

* ``interleave=False`` (NeoX, rotate-half): pairs ``(d, d + rotary_dim/2)``;
* ``interleave=True`` (GPT-J): pairs ``(2d, 2d + 1)``;

and pair ``d`` turns by ``theta = pos * inv_freq_d``, computed in fp32 from the fp32-rounded
``inv_freq_d = rope_theta ** (-2d / rotary_dim) / rope_scale`` (Llama-3.1 variants smooth it,
see :func:`apply_llama31_rope`), with an accurate ``sincos``. Positions come either from
``pos_ids [nnz]`` or, in the ragged form, from ``indptr [B+1]`` / ``offsets [B]``: token ``t``
of segment ``b`` has position ``offsets[b] + t - indptr[b]``. Index tensors are int32 or int64.

Bad indices: a token outside every ``indptr`` segment, or (cos/sin-cache form) a position
outside ``[0, cos_sin_cache.shape[0])``, is skipped on the device (nothing is read or written
for it): in place its rows keep their values; out of place its rows of the returned tensors are
left unwritten (uninitialized memory). Set ``FLASHINFER_CHECK_INDICES=1`` to have the call raise
``ValueError`` naming it instead (this synchronizes the host; see ``flashinfer._index_check``).
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _index_check, _rope
from ._ext import _BY_TYPE, FRAMEWORK_STREAM, export_args, framework_of, name_bad_scalars

__all__ = [
    "apply_rope",
    "apply_rope_inplace",
    "apply_rope_pos_ids",
    "apply_rope_pos_ids_inplace",
    "apply_llama31_rope",
    "apply_llama31_rope_inplace",
    "apply_llama31_rope_pos_ids",
    "apply_llama31_rope_pos_ids_inplace",
    "apply_rope_with_cos_sin_cache",
    "apply_rope_with_cos_sin_cache_inplace",
]

_ic = _index_check


def _new_outputs(fw: Any, q: Any, k: Any) -> Tuple[Any, Any, Any, Any]:
    """New tensors like ``q`` and ``k``, each by its own framework, and their exports."""
    fk = framework_of(k, "k")
    q_rope, k_rope = fw.empty_like(q), fk.empty_like(k)
    return q_rope, k_rope, fw.to_dlpack(q_rope), fk.to_dlpack(k_rope)


def _err(fw: Any, like: Any) -> Any:
    """The error record's DLPack export (callers test ``_ic.enabled`` first: no call when off)."""
    buf = _ic.error_buffer(fw, like)
    return None if buf is None else fw.to_dlpack(buf)


def _scalars(rotary_dim: Any, interleave: Any, rope_scale: Any, rope_theta: Any, low: Any = 1.0, high: Any = 4.0,
             old: Any = 8192.0) -> None:
    """On the binding's TypeError: the scalar argument it could not take, named (else returns)."""
    name_bad_scalars(rotary_dim=(rotary_dim, "int?"), interleave=(interleave, "bool"), rope_scale=(rope_scale, "real"),
                     rope_theta=(rope_theta, "real"), low_freq_factor=(low, "real"), high_freq_factor=(high, "real"),
                     old_context_len=(old, "real"))


# Each public function below spells out its route (direct, or export_args; see norm.py) rather
# than calling one shared helper: the extra Python call with its ~15 arguments measured 0.08 us
# per call (session 31), more than the direct route saves.

# --- indptr / offsets form -------------------------------------------------------------------

def apply_rope_inplace(q: Any, k: Any, indptr: Any, offsets: Any, rotary_dim: Optional[int] = None,
                       interleave: bool = False, rope_scale: float = 1, rope_theta: float = 1e4) -> None:
    r"""Applies RoPE to ``q`` and ``k`` in place; positions from ``indptr``/``offsets``.

    q: ``[nnz, num_q_heads, head_dim]``; k: ``[nnz, num_k_heads, head_dim]``; indptr: ``[batch_size + 1]``;
    offsets: ``[batch_size]`` (same int dtype). Token ``t`` of segment ``b`` has position
    ``offsets[b] + t - indptr[b]``. rotary_dim: even, ``<= head_dim`` (``None``: head_dim).
    """
    t = type(q)
    fw = _BY_TYPE.get(t) or framework_of(q, "q")
    if fw.direct and type(k) is t and type(indptr) is t and type(offsets) is t:
        s, cq, ck, ci, co = FRAMEWORK_STREAM, q, k, indptr, offsets
    else:
        s, cq, ck, ci, co = export_args(fw, t, q=q, k=k, indptr=indptr, offsets=offsets)
    try:
        _rope.apply_rope("apply_rope_inplace", cq, ck, None, None, None, ci, co, rotary_dim, interleave, rope_scale,
                         rope_theta, False, 1.0, 4.0, 8192.0, s, _err(fw, q) if _ic.enabled else None)
    except TypeError:
        _scalars(rotary_dim, interleave, rope_scale, rope_theta)
        raise


def apply_rope(q: Any, k: Any, indptr: Any, offsets: Any, rotary_dim: Optional[int] = None, interleave: bool = False,
               rope_scale: float = 1, rope_theta: float = 1e4) -> Tuple[Any, Any]:
    r"""As :func:`apply_rope_inplace`, into new tensors; returns ``(q_rope, k_rope)``."""
    t = type(q)
    fw = _BY_TYPE.get(t) or framework_of(q, "q")
    if fw.direct and type(k) is t and type(indptr) is t and type(offsets) is t:
        s, cq, ck, ci, co = FRAMEWORK_STREAM, q, k, indptr, offsets
        q_rope = cq_rope = fw.empty_like(q)
        k_rope = ck_rope = fw.empty_like(k)
    else:
        s, cq, ck, ci, co = export_args(fw, t, q=q, k=k, indptr=indptr, offsets=offsets)
        q_rope, k_rope, cq_rope, ck_rope = _new_outputs(fw, q, k)
    try:
        _rope.apply_rope("apply_rope", cq, ck, cq_rope, ck_rope, None, ci, co, rotary_dim, interleave, rope_scale,
                         rope_theta, False, 1.0, 4.0, 8192.0, s, _err(fw, q) if _ic.enabled else None)
    except TypeError:
        _scalars(rotary_dim, interleave, rope_scale, rope_theta)
        raise
    return q_rope, k_rope


def apply_llama31_rope_inplace(q: Any, k: Any, indptr: Any, offsets: Any, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 8, rope_theta: float = 5e5,
                               low_freq_factor: float = 1, high_freq_factor: float = 4,
                               old_context_len: int = 8192) -> None:
    r"""Llama-3.1 RoPE in place (positions from ``indptr``/``offsets``).

    With base frequency ``f_d = rope_theta ** (-2d / rotary_dim)``:
    ``smooth = clamp((old_context_len * f_d / (2 pi) - low_freq_factor) / (high_freq_factor - low_freq_factor), 0, 1)``
    and ``inv_freq_d = (1 - smooth) * f_d / rope_scale + smooth * f_d``: wavelengths longer than
    ``old_context_len / low_freq_factor`` are stretched by ``rope_scale``, those shorter than
    ``old_context_len / high_freq_factor`` are kept, smoothly in between.
    """
    t = type(q)
    fw = _BY_TYPE.get(t) or framework_of(q, "q")
    if fw.direct and type(k) is t and type(indptr) is t and type(offsets) is t:
        s, cq, ck, ci, co = FRAMEWORK_STREAM, q, k, indptr, offsets
    else:
        s, cq, ck, ci, co = export_args(fw, t, q=q, k=k, indptr=indptr, offsets=offsets)
    try:
        _rope.apply_rope("apply_llama31_rope_inplace", cq, ck, None, None, None, ci, co, rotary_dim, interleave,
                         rope_scale, rope_theta, True, low_freq_factor, high_freq_factor, old_context_len, s,
                         _err(fw, q) if _ic.enabled else None)
    except TypeError:
        _scalars(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor,
                 old_context_len)
        raise


def apply_llama31_rope(q: Any, k: Any, indptr: Any, offsets: Any, rotary_dim: Optional[int] = None,
                       interleave: bool = False, rope_scale: float = 8, rope_theta: float = 5e5,
                       low_freq_factor: float = 1, high_freq_factor: float = 4,
                       old_context_len: int = 8192) -> Tuple[Any, Any]:
    r"""As :func:`apply_llama31_rope_inplace`, into new tensors; returns ``(q_rope, k_rope)``."""
    t = type(q)
    fw = _BY_TYPE.get(t) or framework_of(q, "q")
    if fw.direct and type(k) is t and type(indptr) is t and type(offsets) is t:
        s, cq, ck, ci, co = FRAMEWORK_STREAM, q, k, indptr, offsets
        q_rope = cq_rope = fw.empty_like(q)
        k_rope = ck_rope = fw.empty_like(k)
    else:
        s, cq, ck, ci, co = export_args(fw, t, q=q, k=k, indptr=indptr, offsets=offsets)
        q_rope, k_rope, cq_rope, ck_rope = _new_outputs(fw, q, k)
    try:
        _rope.apply_rope("apply_llama31_rope", cq, ck, cq_rope, ck_rope, None, ci, co, rotary_dim, interleave,
                         rope_scale, rope_theta, True, low_freq_factor, high_freq_factor, old_context_len, s,
                         _err(fw, q) if _ic.enabled else None)
    except TypeError:
        _scalars(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor,
                 old_context_len)
        raise
    return q_rope, k_rope


# --- pos_ids form ------------------------------------------------------------------------------

def apply_rope_pos_ids_inplace(q: Any, k: Any, pos_ids: Any, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 1, rope_theta: float = 1e4) -> None:
    r"""Applies RoPE to ``q`` and ``k`` in place; token ``i`` has position ``pos_ids[i]`` (``[nnz]``,
    int32 or int64)."""
    t = type(q)
    fw = _BY_TYPE.get(t) or framework_of(q, "q")
    if fw.direct and type(k) is t and type(pos_ids) is t:
        s, cq, ck, cp = FRAMEWORK_STREAM, q, k, pos_ids
    else:
        s, cq, ck, cp = export_args(fw, t, q=q, k=k, pos_ids=pos_ids)
    try:
        _rope.apply_rope("apply_rope_pos_ids_inplace", cq, ck, None, None, cp, None, None, rotary_dim, interleave,
                         rope_scale, rope_theta, False, 1.0, 4.0, 8192.0, s, _err(fw, q) if _ic.enabled else None)
    except TypeError:
        _scalars(rotary_dim, interleave, rope_scale, rope_theta)
        raise


def apply_rope_pos_ids(q: Any, k: Any, pos_ids: Any, rotary_dim: Optional[int] = None, interleave: bool = False,
                       rope_scale: float = 1, rope_theta: float = 1e4) -> Tuple[Any, Any]:
    r"""As :func:`apply_rope_pos_ids_inplace`, into new tensors; returns ``(q_rope, k_rope)``."""
    t = type(q)
    fw = _BY_TYPE.get(t) or framework_of(q, "q")
    if fw.direct and type(k) is t and type(pos_ids) is t:
        s, cq, ck, cp = FRAMEWORK_STREAM, q, k, pos_ids
        q_rope = cq_rope = fw.empty_like(q)
        k_rope = ck_rope = fw.empty_like(k)
    else:
        s, cq, ck, cp = export_args(fw, t, q=q, k=k, pos_ids=pos_ids)
        q_rope, k_rope, cq_rope, ck_rope = _new_outputs(fw, q, k)
    try:
        _rope.apply_rope("apply_rope_pos_ids", cq, ck, cq_rope, ck_rope, cp, None, None, rotary_dim, interleave,
                         rope_scale, rope_theta, False, 1.0, 4.0, 8192.0, s, _err(fw, q) if _ic.enabled else None)
    except TypeError:
        _scalars(rotary_dim, interleave, rope_scale, rope_theta)
        raise
    return q_rope, k_rope


def apply_llama31_rope_pos_ids_inplace(q: Any, k: Any, pos_ids: Any, rotary_dim: Optional[int] = None,
                                       interleave: bool = False, rope_scale: float = 8, rope_theta: float = 5e5,
                                       low_freq_factor: float = 1, high_freq_factor: float = 4,
                                       old_context_len: int = 8192) -> None:
    r"""Llama-3.1 RoPE in place, positions from ``pos_ids`` (see :func:`apply_llama31_rope_inplace`)."""
    t = type(q)
    fw = _BY_TYPE.get(t) or framework_of(q, "q")
    if fw.direct and type(k) is t and type(pos_ids) is t:
        s, cq, ck, cp = FRAMEWORK_STREAM, q, k, pos_ids
    else:
        s, cq, ck, cp = export_args(fw, t, q=q, k=k, pos_ids=pos_ids)
    try:
        _rope.apply_rope("apply_llama31_rope_pos_ids_inplace", cq, ck, None, None, cp, None, None, rotary_dim,
                         interleave, rope_scale, rope_theta, True, low_freq_factor, high_freq_factor, old_context_len,
                         s, _err(fw, q) if _ic.enabled else None)
    except TypeError:
        _scalars(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor,
                 old_context_len)
        raise


def apply_llama31_rope_pos_ids(q: Any, k: Any, pos_ids: Any, rotary_dim: Optional[int] = None,
                               interleave: bool = False, rope_scale: float = 8, rope_theta: float = 5e5,
                               low_freq_factor: float = 1, high_freq_factor: float = 4,
                               old_context_len: int = 8192) -> Tuple[Any, Any]:
    r"""As :func:`apply_llama31_rope_pos_ids_inplace`, into new tensors; returns ``(q_rope, k_rope)``."""
    t = type(q)
    fw = _BY_TYPE.get(t) or framework_of(q, "q")
    if fw.direct and type(k) is t and type(pos_ids) is t:
        s, cq, ck, cp = FRAMEWORK_STREAM, q, k, pos_ids
        q_rope = cq_rope = fw.empty_like(q)
        k_rope = ck_rope = fw.empty_like(k)
    else:
        s, cq, ck, cp = export_args(fw, t, q=q, k=k, pos_ids=pos_ids)
        q_rope, k_rope, cq_rope, ck_rope = _new_outputs(fw, q, k)
    try:
        _rope.apply_rope("apply_llama31_rope_pos_ids", cq, ck, cq_rope, ck_rope, cp, None, None, rotary_dim,
                         interleave, rope_scale, rope_theta, True, low_freq_factor, high_freq_factor, old_context_len,
                         s, _err(fw, q) if _ic.enabled else None)
    except TypeError:
        _scalars(rotary_dim, interleave, rope_scale, rope_theta, low_freq_factor, high_freq_factor,
                 old_context_len)
        raise
    return q_rope, k_rope


# --- cos/sin cache form (vLLM / SGLang) ----------------------------------------------------------

def apply_rope_with_cos_sin_cache(positions: Any, query: Any, key: Any, head_size: int, cos_sin_cache: Any,
                                  is_neox: bool = True) -> Tuple[Any, Any]:
    r"""RoPE with precomputed cos/sin (vLLM/SGLang-compatible); returns ``(query_out, key_out)``.

    positions: ``[nnz]`` int32/int64. query: ``[nnz, num_q_heads * head_size]`` (or
    ``[nnz, num_q_heads, head_size]``), key likewise, float16/bfloat16; any ``head_size``.
    cos_sin_cache: float32 ``[max_position, rotary_dim]``, cos in ``[:, :rotary_dim/2]``, sin in
    ``[:, rotary_dim/2:]``; pair ``d`` of token ``i`` uses ``cos_sin_cache[positions[i], d]`` and
    ``cos_sin_cache[positions[i], rotary_dim/2 + d]``. ``is_neox=True`` pairs ``(d, d + rotary_dim/2)``,
    ``False`` pairs ``(2d, 2d + 1)``. Positions outside ``[0, max_position)`` are skipped (see the
    module docstring for ``FLASHINFER_CHECK_INDICES``).
    """
    t = type(query)
    fw = _BY_TYPE.get(t) or framework_of(query, "query")
    if fw.direct and type(positions) is t and type(key) is t and type(cos_sin_cache) is t:
        s, cq, cp, ck, cc = FRAMEWORK_STREAM, query, positions, key, cos_sin_cache
        query_out = cquery_out = fw.empty_like(query)
        key_out = ckey_out = fw.empty_like(key)
    else:
        s, cq, cp, ck, cc = export_args(fw, t, query=query, positions=positions, key=key, cos_sin_cache=cos_sin_cache)
        query_out, key_out, cquery_out, ckey_out = _new_outputs(fw, query, key)
    try:
        _rope.apply_rope_cos_sin_cache("apply_rope_with_cos_sin_cache", cp, cq, ck, head_size, cc, is_neox, cquery_out,
                                       ckey_out, s, _err(fw, query) if _ic.enabled else None)
    except TypeError:
        name_bad_scalars(head_size=(head_size, "int"), is_neox=(is_neox, "bool"))
        raise
    return query_out, key_out


def apply_rope_with_cos_sin_cache_inplace(positions: Any, query: Any, key: Any, head_size: int, cos_sin_cache: Any,
                                          is_neox: bool = True) -> None:
    r"""As :func:`apply_rope_with_cos_sin_cache`, rotating ``query`` and ``key`` in place."""
    t = type(query)
    fw = _BY_TYPE.get(t) or framework_of(query, "query")
    if fw.direct and type(positions) is t and type(key) is t and type(cos_sin_cache) is t:
        s, cq, cp, ck, cc = FRAMEWORK_STREAM, query, positions, key, cos_sin_cache
    else:
        s, cq, cp, ck, cc = export_args(fw, t, query=query, positions=positions, key=key, cos_sin_cache=cos_sin_cache)
    try:
        _rope.apply_rope_cos_sin_cache("apply_rope_with_cos_sin_cache_inplace", cp, cq, ck, head_size, cc, is_neox,
                                       None, None, s, _err(fw, query) if _ic.enabled else None)
    except TypeError:
        name_bad_scalars(head_size=(head_size, "int"), is_neox=(is_neox, "bool"))
        raise
