"""Top-k selection (FlashInfer-compatible ``flashinfer.topk``): the k largest values of each row
and their indices, without sorting the row (exact threshold search, then one compaction)."""

from __future__ import annotations

import enum
from typing import Any, Tuple

from . import _sampling
from ._ext import framework_of, to_dlpack
from ._ext import integer_arg as _integer
from .sampling import _empty

__all__ = ["top_k", "TopKTieBreak"]


class TopKTieBreak(enum.IntEnum):
    """Which ties at the k-th value are kept: any (NONE), smaller indices first (SMALL), larger
    indices first (LARGE). NONE keeps the smaller indices, deterministically."""

    NONE = 0
    SMALL = 1
    LARGE = 2


def top_k(input: Any, k: int, sorted: bool = False, deterministic: bool = False,
          tie_break: int = TopKTieBreak.NONE, dsa_graph_safe: bool = False) -> Tuple[Any, Any]:
    r"""``(values [B, k]`` in ``input``'s dtype, ``indices [B, k]`` int64): the k largest entries of
    each row of ``input [B, d]`` (float32/float16/bfloat16). Unordered (elements above the k-th
    value by index, then the kept ties) unless ``sorted=True`` (descending, ties by index).
    Deterministic always; NaN ranks below every number."""
    fw = framework_of(input, "input")
    shape = tuple(input.shape)
    if len(shape) != 2:
        raise ValueError(f"top_k: input must be 2-D [batch_size, d]; got shape {shape}")
    k = _integer(k, "top_k: k must be an int")
    if not 1 <= k <= shape[1]:  # (before the [B, k] outputs are allocated)
        raise ValueError(f"top_k: k must be in [1, input.shape[1]] = [1, {shape[1]}]; got {k}")
    values = fw.empty((shape[0], k), input)
    indices = _empty(fw, input, (shape[0], k), "int64")
    _sampling.top_k(fw.to_dlpack(input), to_dlpack(values, "values"), to_dlpack(indices, "indices"), k,
                    _integer(tie_break, "top_k: tie_break must be a TopKTieBreak (0, 1 or 2)"), fw.stream(input), True)
    if sorted:
        if fw.name == "torch":
            values, order = fw.torch.sort(values, dim=-1, descending=True, stable=True)
            indices = fw.torch.gather(indices, -1, order)
        else:  # CuPy / NumPy: a stable argsort of the negated values
            xp = fw.cupy if fw.name == "cupy" else __import__("numpy")
            order = xp.argsort(-values, axis=-1, kind="stable")
            values = xp.take_along_axis(values, order, axis=-1)
            indices = xp.take_along_axis(indices, order, axis=-1)
    return values, indices
