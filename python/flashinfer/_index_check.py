"""Opt-in device-side index checking for kernels that take device index tensors (RoPE
positions, paged-KV batch indices / positions / page tables).

Kernels never touch memory outside their tensors: an index that would reach outside is always
skipped on the device (nothing is written for that entry). With ``FLASHINFER_CHECK_INDICES=1``
in the environment (read at import), or after ``set_check_indices(True)``, the kernel also
records the first offending entry in a small error buffer and the call raises ``ValueError``
naming it. Checking reads the buffer back, so it synchronizes the host with the stream: a
debugging aid, off by default (and not usable under CUDA-graph capture).
"""

from __future__ import annotations

import os
from typing import Any, Optional

__all__ = ["set_check_indices", "check_indices_enabled"]

enabled: bool = os.environ.get("FLASHINFER_CHECK_INDICES", "0").strip().lower() not in ("", "0", "false", "no", "off")


def set_check_indices(flag: bool) -> None:
    """Turns device-side index checking on or off for this process (overrides the environment)."""
    global enabled
    enabled = bool(flag)


def check_indices_enabled() -> bool:
    return enabled


def error_buffer(fw: Any, like: Any) -> Optional[Any]:
    """The kernel's error record: an int32 ``[2]`` tensor on ``like``'s device, allocated by
    ``like``'s framework; ``None`` when checking is off."""
    if not enabled:
        return None
    if fw.name == "torch":
        return like.new_empty((2,), dtype=fw.torch.int32)
    if fw.name == "cupy":
        with like.device:
            return fw.cupy.empty((2,), dtype=fw.cupy.int32)
    if fw.name == "numpy":  # host arrays: the binding rejects them with its own message
        return None
    raise TypeError("FLASHINFER_CHECK_INDICES needs torch or CuPy tensors to allocate its error buffer; got "
                    f"{type(like).__module__}.{type(like).__name__}")
