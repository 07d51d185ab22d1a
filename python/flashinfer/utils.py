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
    "FP4Tensor",
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
    if isinstance(device, str):  # "cuda", "cuda:1" (torch's spelling; torch need not be imported)
        kind, _, idx = device.partition(":")
        if kind != "cuda":
            raise ValueError(f"expected a CUDA device; got {device!r}")
        return int(idx) if idx else 0
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


class FP4Tensor:
    """A packed FP4 (e2m1) tensor as FlashInfer's FP4 GEMMs exchange it: ``data`` uint8 with two
    values per byte (innermost dimension ceil(original / 2)), ``scale`` float8_e4m3fn block scale
    factors, ``scale_start_index`` the first token the scales cover, ``original_shape`` the
    unpacked shape. A container only: no kernel here takes FP4 (engines import the name)."""

    def __init__(self, data: Any, scale: Any, scale_start_index: int = 0, original_shape: Any = None) -> None:
        if str(getattr(data, "dtype", "")).replace("torch.", "") != "uint8":
            raise ValueError(f"FP4Tensor: data must be uint8; got {getattr(data, 'dtype', type(data))}")
        if str(getattr(scale, "dtype", "")).replace("torch.", "") != "float8_e4m3fn":
            raise ValueError(f"FP4Tensor: scale must be float8_e4m3fn; got {getattr(scale, 'dtype', type(scale))}")
        self.data = data
        self.scale = scale
        self.scale_start_index = int(scale_start_index)
        self.original_shape = original_shape
        self.dtype = "nvfp4"


def cuda_available() -> bool:
    """True when the CUDA runtime sees at least one device (False, not an error, without a driver)."""
    return _cuda.device_count() > 0
