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
"""

from __future__ import annotations

from typing import Any, Optional, Tuple

from . import _cascade
from ._ext import ArgumentError, framework_of, to_dlpack

__all__ = ["merge_state", "merge_state_in_place", "merge_states"]


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
    shape = v.shape
    if len(shape) != 4:
        raise ArgumentError(f"merge_states: v must be 4-D [seq_len, num_states, num_heads, head_dim]; got a "
                            f"{len(shape)}-D tensor of shape {tuple(shape)}")
    s = _f32(s, "s")
    v_merged = fw.empty((shape[0], shape[2], shape[3]), v)
    s_merged = fw.empty_f32((shape[0], shape[2]), v)
    dl = fw.to_dlpack
    _cascade.merge_states(dl(v), to_dlpack(s, "s"), dl(v_merged), dl(s_merged), fw.stream(v))
    return v_merged, s_merged
