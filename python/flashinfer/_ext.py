"""Framework plumbing shared by every module: which framework a tensor belongs to, how to
export it through DLPack cheaply, how to allocate outputs with it, and its current CUDA
stream. Importing this module touches no CUDA API and imports no framework; torch and CuPy
are looked up in ``sys.modules`` only when a caller passes their tensors.

Cost notes (H200 image, per call): torch's ``x.__dlpack__()`` costs ~2.5 us while
``torch._C._to_dlpack(x)`` costs ~0.3 us, and ``torch.cuda.current_stream()`` ~5.8 us while
``torch._C._cuda_getCurrentRawStream(idx)`` ~0.1 us, so torch tensors take those routes. Where
torch publishes DLPack's C exchange table (``torch.Tensor.__dlpack_c_exchange_api__``, torch >=
2.10) the bindings read torch tensors through it directly (bindings/tensor_arg.h): torch tensors
are passed as they are, and the stream argument is ``FRAMEWORK_STREAM``, which the binding
resolves through the same table (see :func:`torch_exporter`, :func:`torch_stream_source`).
"""

from __future__ import annotations

import numbers
import operator
import sys
from typing import Any, Callable, Dict, Tuple

__all__ = ["framework_of", "to_dlpack", "export_args", "require_tensors", "not_a_tensor", "torch_exporter",
           "torch_direct", "torch_stream_source", "Framework", "ArgumentError", "FRAMEWORK_STREAM"]


class ArgumentError(ValueError, RuntimeError):
    """A bad argument found by the C++ bindings (dtype, shape, device, layout, range). FlashInfer's
    C++-side checks surface as RuntimeError and its Python-level ones as ValueError; code written
    for either catches this one (the bindings raise it through common.h's fail())."""


class Framework:
    """How one array library exports, allocates and orders its tensors."""

    name = "dlpack"
    # True where the bindings take this framework's tensors as they are and ask its current stream
    # themselves (torch with DLPack's C exchange table): a call whose tensor arguments all have the
    # first one's type passes them straight through, with FRAMEWORK_STREAM; others go through
    # export_args().
    direct = False

    def to_dlpack(self, x: Any) -> Any:  # a DLPack capsule, or any object nanobind accepts
        return x.__dlpack__()

    def stream(self, x: Any) -> int:
        # An unknown producer: the legacy default stream orders against all others.
        return 0

    def empty_like(self, x: Any) -> Any:
        raise TypeError(
            f"flashinfer cannot allocate an output for a {type(x).__module__}.{type(x).__name__} (it allocates "
            "torch, CuPy and NumPy arrays): pass a tensor of one of those, or out= where the function takes it"
        )

    def empty(self, shape: Tuple[int, ...], like: Any) -> Any:
        return self.empty_like(like)

    def empty_f32(self, shape: Tuple[int, ...], like: Any) -> Any:
        """A float32 tensor of ``shape`` on ``like``'s device (LSE and partial-state buffers)."""
        return self.empty_like(like)

    def as_f32(self, x: Any) -> Any:
        """``x`` if it is float32, else a float32 copy (``.float()``); unknown producers pass
        through and the binding checks their dtype."""
        return x

    def scale_(self, x: Any, s: float) -> None:
        """``x *= s`` in place, on the framework's current stream."""
        raise TypeError(f"flashinfer cannot scale a {type(x).__module__}.{type(x).__name__} in place")


class _Torch(Framework):
    name = "torch"

    def __init__(self, torch: Any) -> None:
        self.torch = torch
        self.to_dlpack = torch_exporter(torch)  # type: ignore[assignment]
        self._raw_stream: Callable[[int], int] | None = getattr(torch._C, "_cuda_getCurrentRawStream", None)
        self.empty_like = torch.empty_like  # type: ignore[assignment]
        if self.to_dlpack is _as_is:  # the binding asks torch for the stream itself
            self.stream = _framework_stream  # type: ignore[method-assign]
            self.direct = True  # (torch_direct(torch))

    def stream(self, x: Any) -> int:
        d = x.get_device()
        if d < 0 or self._raw_stream is None:
            return 0
        return self._raw_stream(d)

    def empty(self, shape: Tuple[int, ...], like: Any) -> Any:
        return like.new_empty(shape)

    def empty_f32(self, shape: Tuple[int, ...], like: Any) -> Any:
        return self.torch.empty(shape, dtype=self.torch.float32, device=like.device)

    def as_f32(self, x: Any) -> Any:
        return x if x.dtype is self.torch.float32 else x.float()

    def scale_(self, x: Any, s: float) -> None:
        x.mul_(s)


class _CuPy(Framework):
    name = "cupy"

    def __init__(self, cupy: Any) -> None:
        self.cupy = cupy

    # CuPy allocates on the *current* device; outputs belong on the input's.
    def empty_like(self, x: Any) -> Any:
        with x.device:
            return self.cupy.empty_like(x)

    def to_dlpack(self, x: Any) -> Any:
        # stream=-1: no synchronization by the producer (the kernels run on CuPy's current
        # stream, see stream()); toDlpack() is deprecated in CuPy 14
        return x.__dlpack__(stream=-1)

    def stream(self, x: Any) -> int:
        try:
            return self.cupy.cuda.get_current_stream(x.device.id).ptr
        except TypeError:  # older CuPy: current device only
            with x.device:
                return self.cupy.cuda.get_current_stream().ptr

    def empty(self, shape: Tuple[int, ...], like: Any) -> Any:
        with like.device:
            return self.cupy.empty(shape, dtype=like.dtype)

    def empty_f32(self, shape: Tuple[int, ...], like: Any) -> Any:
        with like.device:
            return self.cupy.empty(shape, dtype=self.cupy.float32)

    def as_f32(self, x: Any) -> Any:
        if x.dtype == self.cupy.float32:
            return x
        with x.device:
            return x.astype(self.cupy.float32)

    def scale_(self, x: Any, s: float) -> None:
        with x.device:
            x *= s


class _NumPy(Framework):
    """Host arrays: accepted so that the binding can say they must be on a CUDA device."""

    name = "numpy"

    def __init__(self, np: Any) -> None:
        self.empty_like = np.empty_like  # type: ignore[assignment]

    def empty(self, shape: Tuple[int, ...], like: Any) -> Any:
        import numpy as np

        return np.empty(shape, dtype=like.dtype)

    def empty_f32(self, shape: Tuple[int, ...], like: Any) -> Any:
        import numpy as np

        return np.empty(shape, dtype=np.float32)

    def as_f32(self, x: Any) -> Any:
        import numpy as np

        return x if x.dtype == np.float32 else x.astype(np.float32)


def _as_is(x: Any) -> Any:
    return x


FRAMEWORK_STREAM = (1 << 64) - 1  # (= _cuda.FRAMEWORK_STREAM, common.h's kFrameworkStream)


def _framework_stream(_: Any) -> int:
    return FRAMEWORK_STREAM


def _no_stream(_: Any) -> int:
    return 0


_TORCH_ROUTE: Any = None


def _torch_route(torch: Any) -> Tuple[Callable[[Any], Any], Callable[[int], int]]:
    global _TORCH_ROUTE
    if _TORCH_ROUTE is None:
        from . import _cuda  # (loading it touches no CUDA API)

        if _cuda.takes_exchange_api(torch.Tensor):
            _TORCH_ROUTE = (_as_is, _framework_stream)
        else:
            _TORCH_ROUTE = (torch._C._to_dlpack, getattr(torch._C, "_cuda_getCurrentRawStream", None) or _no_stream)
    return _TORCH_ROUTE


def torch_exporter(torch: Any) -> Callable[[Any], Any]:
    """What torch tensors go through on their way to a binding: nothing (the tensor itself) when
    the bindings read torch tensors through DLPack's C exchange table (one C call, tens of ns),
    else ``torch._C._to_dlpack`` (a capsule, ~0.3 us plus its import). Asked once per process."""
    return _torch_route(torch)[0]


def torch_direct(torch: Any) -> bool:
    """Whether torch tensors go to the bindings as they are, with ``FRAMEWORK_STREAM`` (the
    bindings read them through DLPack's C exchange table). Asked once per process."""
    return _torch_route(torch)[0] is _as_is


def torch_stream_source(torch: Any) -> Callable[[int], int]:
    """The ``stream`` argument for torch tensors on device index i: ``FRAMEWORK_STREAM`` (the
    binding asks torch through the exchange table, in C) with the table, else torch's current
    raw stream (``torch._C._cuda_getCurrentRawStream(i)``; 0 in a torch without CUDA)."""
    return _torch_route(torch)[1]


_BY_TYPE: Dict[type, Framework] = {}
_GENERIC = Framework()


def _resolve(x: Any, name: str) -> Framework:
    t = type(x)
    torch = sys.modules.get("torch")
    cupy = sys.modules.get("cupy")
    np = sys.modules.get("numpy")
    fw: Framework
    if torch is not None and isinstance(x, torch.Tensor):
        fw = _by_name("torch", lambda: _Torch(torch))
    elif cupy is not None and isinstance(x, cupy.ndarray):
        fw = _by_name("cupy", lambda: _CuPy(cupy))
    elif np is not None and isinstance(x, np.ndarray):
        fw = _by_name("numpy", lambda: _NumPy(np))
    elif hasattr(x, "__dlpack__"):
        fw = _GENERIC
    else:
        raise not_a_tensor(name, x)
    _BY_TYPE[t] = fw
    return fw


_INSTANCES: Dict[str, Framework] = {}


def _by_name(name: str, make: Callable[[], Framework]) -> Framework:
    fw = _INSTANCES.get(name)
    if fw is None:
        fw = _INSTANCES[name] = make()
    return fw


def framework_of(x: Any, name: str = "input") -> Framework:
    """The framework of ``x`` (cached by type: one dict lookup on the hot path)."""
    fw = _BY_TYPE.get(type(x))
    return fw if fw is not None else _resolve(x, name)


def to_dlpack(x: Any, name: str) -> Any:
    """A DLPack export of ``x`` by its own framework's cheapest route."""
    fw = _BY_TYPE.get(type(x))
    if fw is None:
        fw = _resolve(x, name)
    return fw.to_dlpack(x)


def export_args(fw: Framework, t: type, **tensors: Any) -> list:
    """The general route of a call's tensors (the direct one is ``Framework.direct``): ``[the
    stream of the first one's framework on its device, then each tensor's export]``, each by its
    own framework (type ``t``: ``fw``'s). Anything that is not a DLPack tensor (None too) is a
    TypeError naming its argument."""
    dl = fw.to_dlpack
    out = [fw.stream(next(iter(tensors.values())))]
    for name, x in tensors.items():
        out.append(dl(x) if type(x) is t else to_dlpack(x, name))
    return out


def integer_arg(x: Any, rule: str) -> int:
    """An integer parameter: an int (numpy's too) or a float with an integral value (5.0); else
    a TypeError saying ``rule`` and what was given."""
    try:
        return operator.index(x)
    except TypeError:
        if isinstance(x, numbers.Real) and float(x).is_integer():
            return int(x)
        raise TypeError(f"{rule}; got {type(x).__name__} {x!r}") from None


def dtype_str(x: Any) -> str:
    """``x``'s dtype as a plain name ("bfloat16", "int64"; "" without a dtype)."""
    return str(getattr(x, "dtype", "")).replace("torch.", "")


def not_a_tensor(name: str, x: Any) -> TypeError:
    """The TypeError for a non-tensor where argument ``name`` takes a tensor."""
    return TypeError(f"{name} must be a tensor supporting DLPack (torch.Tensor, cupy.ndarray, ...); got "
                     f"{type(x).__name__}")


def name_bad_scalars(**scalars: Tuple[Any, str]) -> None:
    """For a binding's TypeError (nanobind's, which lists the binding's signature): raises the
    TypeError naming the first of ``scalars`` (name: (value, kind)) whose value the binding cannot
    take, else returns (the caller re-raises). kind: "real" (an int or float), "int" (an integer
    in int64), "int?" (the same, or None), "bool"."""
    for name, (x, kind) in scalars.items():
        if kind == "bool":
            ok, want = isinstance(x, bool), "a bool"
        elif kind == "real":
            ok, want = isinstance(x, numbers.Real), "a real number"
        else:
            ok = (x is None and kind == "int?") or (
                isinstance(x, numbers.Integral) and -(2**63) <= int(x) < 2**63)
            want = "an integer (int64)" + (" or None" if kind == "int?" else "")
        if not ok:
            raise TypeError(f"{name} must be {want}; got {type(x).__name__}"
                            + (f" {x!r}" if isinstance(x, (int, float)) else ""))


def require_tensors(**tensors: Any) -> None:
    """For a binding's TypeError on arguments passed as they are: raises the TypeError naming the
    first of ``tensors`` that is neither None nor a DLPack tensor (else returns: the caller
    re-raises the binding's error)."""
    for name, x in tensors.items():
        if x is not None and not hasattr(x, "__dlpack__"):
            raise not_a_tensor(name, x)
