"""Helpers shared by the tests: the comparison against a float64 reference, NaN-poisoned
output buffers that catch unwritten elements and stray writes, and parameter grids.

Tolerances. The kernels compute in fp32 and round once to the 16-bit output type, whose
unit roundoff u is 2**-8 (bf16) or 2**-11 (fp16); fp32 arithmetic adds ~1e-6 relative. So a
correct output is within about u*|ref| of the exact value. We require, elementwise,

    |out - ref| <= atol + rtol * |ref|,   rtol = 2u  (bf16 7.8e-3, fp16 9.8e-4), atol = 1e-5

(atol only covers fp16 subnormals and fp32 cancellation near zero, e.g. 1 + tanh(z) for very
negative z), and for the whole tensor

    ||out - ref|| <= rel_norm * ||ref|| + atol * sqrt(n),   rel_norm 4e-3 (bf16), 1e-3 (fp16)

(random rounding errors give ~0.6u, i.e. ~2.3e-3 for bf16 and ~2.8e-4 for fp16). A kernel
with eps outside the sqrt (eps=0.1: ~5% off), a missing or wrong weight, a wrong row, or the
erf/tanh GELU swapped (tail elements 3% to 80% off, far above atol) cannot pass; the
*_fails tests in test_reference.py, test_norm.py and test_activation.py show it.
"""

from __future__ import annotations

import dataclasses
import itertools
import math
from typing import Any, Callable, Iterable, List, Sequence, Tuple

import pytest
import torch

CUDA = "cuda"
DTYPES = (torch.float16, torch.bfloat16)


@dataclasses.dataclass(frozen=True)
class Tolerance:
    rtol: float  # elementwise, relative to |ref|
    atol: float  # elementwise, absolute
    rel_norm: float  # ||out - ref|| / ||ref||


TOLERANCES = {
    torch.bfloat16: Tolerance(rtol=2.0**-7, atol=1e-5, rel_norm=4e-3),
    torch.float16: Tolerance(rtol=2.0**-10, atol=1e-5, rel_norm=1e-3),
}


def _unravel(flat: int, shape: Sequence[int]) -> Tuple[int, ...]:
    idx = []
    for n in reversed(shape):
        idx.append(flat % n)
        flat //= n
    return tuple(reversed(idx))


def assert_close(actual: torch.Tensor, expected: torch.Tensor, name: str = "output") -> None:
    """Checks a kernel output (float16/bfloat16) against a float64 reference.

    Fails on any NaN in ``actual`` (outputs are NaN-poisoned before the call, so a NaN means
    an element was never written), on any element outside ``atol + rtol * |ref|``, and on a
    relative L2 error above ``rel_norm``.
    """
    tol = TOLERANCES[actual.dtype]
    assert tuple(actual.shape) == tuple(expected.shape), (
        f"{name}: shape {tuple(actual.shape)} != reference shape {tuple(expected.shape)}")
    a = actual.detach().to(torch.float64)
    e = expected.detach().to(device=a.device, dtype=torch.float64)
    n = a.numel()
    n_nan = int(torch.isnan(a).sum())
    if n_nan:
        raise AssertionError(f"{name}: {n_nan} of {n} elements are NaN: never written "
                             "(outputs are NaN-poisoned before the call) or computed from unwritten data")
    if n == 0:
        return
    err = (a - e).abs()
    bound = tol.atol + tol.rtol * e.abs()
    bad = err > bound
    n_bad = int(bad.sum())
    if n_bad:
        worst = int(torch.argmax(err / bound))
        where = _unravel(worst, a.shape)
        raise AssertionError(
            f"{name} ({str(actual.dtype).removeprefix('torch.')}): {n_bad} of {n} elements differ from the "
            f"float64 reference by more than {tol.atol:g} + {tol.rtol:g}*|ref|; worst at index {where}: "
            f"got {a.flatten()[worst].item():.7g}, expected {e.flatten()[worst].item():.7g}")
    diff_norm = torch.linalg.vector_norm(a - e).item()
    ref_norm = torch.linalg.vector_norm(e).item()
    limit = tol.rel_norm * ref_norm + tol.atol * math.sqrt(n)
    if not diff_norm <= limit:
        raise AssertionError(
            f"{name}: ||out - ref|| / ||ref|| = {diff_norm / max(ref_norm, 1e-300):.3g} exceeds {tol.rel_norm:g} "
            f"(||out - ref|| = {diff_norm:.4g}, allowed {limit:.4g})")


def nan_full(shape: Sequence[int], dtype: torch.dtype, device: str = CUDA) -> torch.Tensor:
    return torch.full(tuple(shape), float("nan"), dtype=dtype, device=device)


def assert_all_nan(t: torch.Tensor, what: str) -> None:
    """``t`` is a part of a NaN-poisoned buffer that the kernel must not have written."""
    written = int((~torch.isnan(t)).sum())
    assert written == 0, f"{what}: {written} of {t.numel()} elements were overwritten (must stay untouched)"


class GuardedOutput:
    """A NaN-filled output tensor of ``shape`` placed inside a larger NaN-filled buffer with
    ``guard`` elements on each side (a multiple of 8, so the tensor stays 16-byte aligned):
    ``assert_guards_untouched`` catches writes just before or after the tensor."""

    def __init__(self, shape: Sequence[int], dtype: torch.dtype, device: str = CUDA, guard: int = 256) -> None:
        self.numel = math.prod(shape)
        self.guard = guard
        self.buffer = nan_full((self.numel + 2 * guard,), dtype, device)
        self.tensor = self.buffer[guard:guard + self.numel].view(tuple(shape))

    def assert_guards_untouched(self) -> None:
        assert_all_nan(self.buffer[:self.guard], "guard zone before the output")
        assert_all_nan(self.buffer[self.guard + self.numel:], "guard zone after the output")


def strided_rows(rows: int, hidden: int, layout: str, dtype: torch.dtype, fill: str = "randn",
                 lead: Tuple[int, ...] = ()) -> Tuple[torch.Tensor, torch.Tensor]:
    """A ``[*lead, rows, hidden]`` view whose rows sit inside a wider buffer; returns
    ``(view, buffer)``. ``fill`` is ``"randn"`` or ``"nan"``. Layouts:

    * ``first_half``: columns ``[0, hidden)`` of a ``[.., rows, 2*hidden]`` buffer
    * ``second_half``: columns ``[hidden, 2*hidden)`` of it (base pointer offset by ``hidden``)
    * ``misaligned``: columns ``[3, 3 + hidden)`` of a ``[.., rows, hidden + 5]`` buffer, so
      neither the base pointer nor the row stride is a multiple of 16 bytes
    """
    width, start = {
        "first_half": (2 * hidden, 0),
        "second_half": (2 * hidden, hidden),
        "misaligned": (hidden + 5, 3),
    }[layout]
    shape = (*lead, rows, width)
    buf = torch.randn(shape, dtype=dtype, device=CUDA) if fill == "randn" else nan_full(shape, dtype)
    return buf[..., start:start + hidden], buf


def untouched_columns(buf: torch.Tensor, view: torch.Tensor) -> List[torch.Tensor]:
    """The parts of ``buf`` (last dim) outside the columns that ``view`` covers."""
    start = (view.data_ptr() - buf.data_ptr()) // buf.element_size() % buf.shape[-1]
    stop = start + view.shape[-1]
    return [buf[..., :start], buf[..., stop:]]


STRIDED_LAYOUTS = ("first_half", "second_half", "misaligned")


def short(v: Any) -> str:
    if isinstance(v, torch.dtype):
        return {torch.float16: "fp16", torch.bfloat16: "bf16"}.get(v, str(v).removeprefix("torch."))
    if callable(v) and hasattr(v, "__name__"):
        return v.__name__
    return str(v)


def grid(*axes: Iterable[Any], smoke: Callable[..., bool] = lambda *combo: False) -> List[Any]:
    """The cross product of ``axes`` as ``pytest.param``s with readable ids; combinations for
    which ``smoke(*combo)`` is true also get the ``smoke`` mark."""
    params = []
    for combo in itertools.product(*axes):
        marks = [pytest.mark.smoke] if smoke(*combo) else []
        params.append(pytest.param(*combo, marks=marks, id="-".join(short(v) for v in combo)))
    return params


def capture_graph(fn) -> "torch.cuda.CUDAGraph":
    """``fn()`` once on a side stream (the warm-up a capture needs), then captured into a CUDA
    graph, which is returned."""
    s = torch.cuda.Stream()
    s.wait_stream(torch.cuda.current_stream())
    with torch.cuda.stream(s):
        fn()
    torch.cuda.current_stream().wait_stream(s)
    g = torch.cuda.CUDAGraph()
    with torch.cuda.graph(g):
        fn()
    return g
