"""Bit packing of boolean masks (FlashInfer-compatible ``flashinfer.quantization``): ``packbits``
and ``segment_packbits`` with ``numpy.packbits`` semantics, for custom attention masks. They are
data-layout helpers built from the input framework's own operations (torch tensors and CuPy arrays
stay on their device; NumPy arrays use ``numpy.packbits``); ``segment_packbits`` sizes its output
from the segment lengths, so it reads ``indptr`` on the host."""

from __future__ import annotations

from typing import Any, Tuple

import numpy as np

__all__ = ["packbits", "segment_packbits"]


def _bit_weights(bitorder: str) -> np.ndarray:
    if bitorder == "big":
        return np.array([128, 64, 32, 16, 8, 4, 2, 1], np.int32)
    if bitorder == "little":
        return np.array([1, 2, 4, 8, 16, 32, 64, 128], np.int32)
    raise ValueError(f"bitorder must be 'big' or 'little'; got {bitorder!r}")


def _is_torch(x: Any) -> bool:
    return type(x).__module__.startswith("torch")


def _cupy_of(x: Any) -> Any:
    """The cupy module when ``x`` is a CuPy array, else None (CuPy is imported only then)."""
    if not type(x).__module__.startswith("cupy"):
        return None
    import cupy

    return cupy


def _host(a: Any) -> np.ndarray:
    """``a`` (torch tensor, CuPy or NumPy array, sequence) as a NumPy array on the host."""
    if _is_torch(a):
        return a.detach().cpu().numpy()
    if _cupy_of(a) is not None:
        return a.get()
    return np.asarray(a)


def packbits(x: Any, bitorder: str = "big") -> Any:
    r"""The elements of ``x`` (flattened; nonzero is 1) packed 8 per uint8, the first element in the
    most (``"big"``) or least (``"little"``) significant bit; the last byte is zero-padded. Same
    result as ``numpy.packbits(x, bitorder=bitorder)``."""
    w = _bit_weights(bitorder)
    cp = _cupy_of(x)
    if cp is not None:  # CuPy in, CuPy out, on the array's device
        with cp.cuda.Device(x.device.id):
            return cp.packbits((x != 0).ravel(), bitorder=bitorder)
    if not _is_torch(x):
        return np.packbits(np.asarray(x) != 0, bitorder=bitorder)
    import torch

    bits = (x.reshape(-1) != 0).to(torch.int32)
    pad = (-bits.numel()) % 8
    if pad:
        bits = torch.cat([bits, bits.new_zeros(pad)])
    weights = torch.from_numpy(w).to(bits.device)
    return (bits.view(-1, 8) * weights).sum(dim=1).to(torch.uint8)


def segment_packbits(x: Any, indptr: Any, bitorder: str = "big") -> Tuple[Any, Any]:
    r"""``packbits`` of each segment ``x[indptr[i]:indptr[i+1]]`` of the 1-D ``x``, each starting on a
    byte boundary: returns ``(y, new_indptr)`` with segment i in ``y[new_indptr[i]:new_indptr[i+1]]``
    and ``new_indptr[i+1] - new_indptr[i] = ceil(seg_len / 8)`` (``new_indptr`` int32)."""
    w = _bit_weights(bitorder)
    if not hasattr(x, "shape"):
        raise TypeError(f"segment_packbits: x must be a 1-D tensor or array; got {type(x).__name__}")
    ptr = _host(indptr)
    if ptr.dtype.kind not in "iu":
        raise ValueError(f"segment_packbits: indptr must hold integers; got dtype {ptr.dtype}")
    ptr = ptr.astype(np.int64).reshape(-1)
    n = int(x.shape[0]) if len(x.shape) == 1 else -1
    if n < 0:
        raise ValueError(f"segment_packbits: x must be 1-D; got shape {tuple(x.shape)}")
    if ptr.size < 1 or ptr[0] != 0 or np.any(np.diff(ptr) < 0) or ptr[-1] != n:
        raise ValueError(f"segment_packbits: indptr must start at 0, be nondecreasing and end at len(x) = {n}; "
                         f"got {ptr.tolist() if ptr.size <= 16 else ptr}")
    seg = np.diff(ptr)
    new_ptr = np.zeros(ptr.size, np.int64)
    np.cumsum((seg + 7) // 8, out=new_ptr[1:])
    # element j of segment s: byte new_ptr[s] + (j - ptr[s]) // 8, bit (j - ptr[s]) % 8
    local = np.arange(n, dtype=np.int64) - np.repeat(ptr[:-1], seg)
    byte = np.repeat(new_ptr[:-1], seg) + local // 8
    weight = w[local % 8]
    cp = _cupy_of(x)
    if cp is not None:  # distinct bits of a byte: the scatter-add is an exact OR
        import cupyx

        with cp.cuda.Device(x.device.id):
            y = cp.zeros(int(new_ptr[-1]), cp.int32)
            cupyx.scatter_add(y, cp.asarray(byte), cp.asarray(weight) * (x != 0).astype(cp.int32))
            return y.astype(cp.uint8), cp.asarray(new_ptr.astype(np.int32))
    if not _is_torch(x):
        y = np.zeros(int(new_ptr[-1]), np.int32)
        np.add.at(y, byte, weight * (np.asarray(x) != 0))
        return y.astype(np.uint8), new_ptr.astype(np.int32)
    import torch

    dev = x.device
    y = torch.zeros(int(new_ptr[-1]), dtype=torch.int32, device=dev)
    y.index_add_(0, torch.from_numpy(byte).to(dev), torch.from_numpy(weight).to(dev) * (x != 0).to(torch.int32))
    return y.to(torch.uint8), torch.from_numpy(new_ptr.astype(np.int32)).to(dev)
