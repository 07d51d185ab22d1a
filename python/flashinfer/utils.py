"""Helpers engines import from ``flashinfer.utils`` (FlashInfer-compatible names)."""

from __future__ import annotations

import enum
import functools
from typing import Any, Tuple

from . import _cuda

__all__ = [
    "PosEncodingMode",
    "MaskMode",
    "TensorLayout",
    "get_compute_capability",
    "device_support_pdl",
    "is_sm90a_supported",
    "round_up",
    "cuda_available",
]


class PosEncodingMode(enum.Enum):
    NONE = 0
    ROPE_LLAMA = 1
    ALIBI = 2


class MaskMode(enum.Enum):
    NON_CAUSAL = 0
    CAUSAL = 1
    CUSTOM = 2
    MULTIITEMSCORING = 3


class TensorLayout(enum.Enum):
    NHD = 0
    HND = 1


def _device_index(device: Any) -> int:
    if device is None:
        return 0
    if isinstance(device, int):
        return device
    idx = getattr(device, "index", None)  # torch.device
    if idx is None and hasattr(device, "id"):  # cupy.cuda.Device
        idx = device.id
    if idx is None:
        if getattr(device, "type", "cuda") != "cuda":
            raise ValueError(f"expected a CUDA device; got {device}")
        return 0
    return int(idx)


@functools.lru_cache(maxsize=None)
def _cc(index: int) -> Tuple[int, int]:
    return tuple(_cuda.compute_capability(index))  # type: ignore[return-value]


def get_compute_capability(device: Any) -> Tuple[int, int]:
    """(major, minor) of a CUDA device (a torch.device, an index, or a cupy Device)."""
    return _cc(_device_index(device))


def device_support_pdl(device: Any) -> bool:
    """Programmatic dependent launch needs compute capability 9.0 or newer."""
    return get_compute_capability(device)[0] >= 9


def is_sm90a_supported(device: Any) -> bool:
    return get_compute_capability(device) == (9, 0) and _cuda.runtime_version() >= 12030


def round_up(x: int, y: int) -> int:
    return (x + y - 1) // y * y


def cuda_available() -> bool:
    """True when the CUDA runtime sees at least one device (False, not an error, without a driver)."""
    return _cuda.device_count() > 0
