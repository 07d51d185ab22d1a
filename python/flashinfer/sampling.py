"""Sorting-free sampling (FlashInfer-compatible ``flashinfer.sampling``).

One kernel per call, one block per output row (or, on sm_90 at small batches, one cluster of
up to 16 blocks per row, each holding a slice of the row in shared memory; the environment
variable FLASHINFER_SAMPLING_CLUSTER=1 keeps one block, =n forces n): top-k / top-p / min-p
(joint or top-k-first) draw by dual-pivot rejection sampling, the renorm and mask functions find the
exact threshold by bracket search, ``sampling_from_logits`` is Gumbel-max. Nothing is sorted.
Randomness is Philox4x32-10; ``(seed, offset)`` fix every draw bit for bit for a given split of
the row (the automatic split depends on the batch size at small batches). Probabilities
need not be normalized; a row with NaN or no positive mass samples 0 with ``valid=False``.
"""

from __future__ import annotations

import numbers
import sys
from typing import Any, Optional, Tuple, Union

from . import _index_check, _sampling
from ._ext import dtype_str as _dtype_str
from ._ext import framework_of, to_dlpack, torch_exporter, torch_stream_source
from ._ext import integer_arg as _integer

__all__ = [
    "softmax",
    "sampling_from_logits",
    "sampling_from_probs",
    "top_p_sampling_from_probs",
    "top_k_sampling_from_probs",
    "min_p_sampling_from_probs",
    "top_k_top_p_sampling_from_probs",
    "top_k_top_p_sampling_from_logits",
    "top_p_renorm_probs",
    "top_p_renorm_prob",
    "top_k_renorm_probs",
    "top_k_renorm_prob",
    "top_k_mask_logits",
    "chain_speculative_sampling",
]

_TOP_K = _sampling.FILTER_TOP_K
_TOP_P = _sampling.FILTER_TOP_P
_MIN_P = _sampling.FILTER_MIN_P
_TOP_K_FIRST = _sampling.FILTER_TOP_K_FIRST
_ROUNDS = 32  # uniforms a filtered row may draw (the generator advances 32 per row)
_MASK64 = (1 << 64) - 1

# ---- framework plumbing ---------------------------------------------------------------------


def _is_tensor(x: Any) -> bool:
    return not isinstance(x, numbers.Number) and hasattr(x, "__dlpack__")


def _cast(fw: Any, x: Any, dtype: str) -> Any:
    """``x`` as ``dtype`` (no copy when it already is)."""
    if fw.name == "torch":
        want = getattr(fw.torch, dtype)
        return x if x.dtype == want else x.to(want)
    if fw.name in ("cupy", "numpy"):
        return x.astype(dtype, copy=False)
    return x


def _empty(fw: Any, like: Any, shape: Tuple[int, ...], dtype: str, zero: bool = False) -> Any:
    """A new tensor of ``shape`` and ``dtype`` on ``like``'s device, from ``like``'s framework."""
    if fw.name == "torch":
        make = fw.torch.zeros if zero else fw.torch.empty
        return make(shape, dtype=getattr(fw.torch, dtype), device=like.device)
    if fw.name == "cupy":
        with like.device:
            return (fw.cupy.zeros if zero else fw.cupy.empty)(shape, dtype=dtype)
    if fw.name == "numpy":  # host arrays: the binding says they must be on a CUDA device
        import numpy as np

        return (np.zeros if zero else np.empty)(shape, dtype=dtype)
    raise TypeError(f"flashinfer cannot allocate outputs for a {type(like).__module__}.{type(like).__name__}")


def _dl(x: Any, name: str) -> Any:
    return None if x is None else to_dlpack(x, name)


def _check_nan(fw: Any, x: Any, message: str) -> None:
    if fw.name == "torch":
        bad = bool(fw.torch.isnan(x).any())
    elif fw.name in ("cupy", "numpy"):
        mod = fw.cupy if fw.name == "cupy" else sys.modules["numpy"]
        bad = bool(mod.isnan(x).any())
    else:
        return
    if bad:
        raise ValueError(message)


def _check_range(fw: Any, x: Any, n: int, name: str, what: str) -> None:
    """FLASHINFER_CHECK_INDICES: every entry of the integer tensor ``x`` in [0, n) (reads the
    tensor back: the host waits for the stream)."""
    if fw.name not in ("torch", "cupy", "numpy") or not int(x.size if fw.name != "torch" else x.numel()):
        return
    lo, hi = int(x.min()), int(x.max())
    if lo < 0 or hi >= n:
        raise ValueError(f"{name} must be in [0, {n}) ({what}); got {lo if lo < 0 else hi}")


def _rows(x: Any) -> int:
    return int(x.shape[0]) if len(x.shape) >= 1 else 0


# A filter parameter the call does not take (None is a user's value, and an error).
_UNUSED = object()




def _as_int32(fw: Any, x: Any) -> Any:
    """An integer tensor as int32, values beyond int32 clamped to [-1, 2**31 - 1] (a wrapped cast
    would turn them into other valid values)."""
    if _dtype_str(x) in ("int64", "uint32", "uint64") and fw.name in ("torch", "cupy", "numpy"):
        x = x.clip(-1, 0x7fffffff)
    return _cast(fw, x, "int32")


def _param(fw: Any, x: Any, dtype: str, name: str, check_nan: bool = False) -> Tuple[Any, Any]:
    """A per-row parameter as (tensor capsule or None, scalar); tensors cast to ``dtype``
    (the binding checks their shape with FlashInfer's messages): any dtype, as FlashInfer's
    ``.int()`` / ``.float()`` (int64 ``top_k`` beyond int32 clamped, as scalars are; ``top_p`` /
    ``min_p`` NaN-checked with ``check_nan``). Scalars: an integer for ``top_k``, a real number
    (not NaN) for ``top_p`` / ``min_p``."""
    if x is _UNUSED:
        return None, 0
    if _is_tensor(x):
        xf = framework_of(x, name)
        x = _as_int32(xf, x) if dtype == "int32" else _cast(xf, x, dtype)
        if check_nan:
            _check_nan(xf, x, f"{name} contains NaN.")
        return to_dlpack(x, name), 0
    if dtype == "int32":
        v = _integer(x, f"{name} must be an int or a per-row int tensor")
        return None, max(-1, min(v, 0x7fffffff))  # (<= 0 and >= V: no filter)
    if not isinstance(x, numbers.Real):
        raise TypeError(f"{name} must be a float or a per-row float tensor; got {type(x).__name__} {x!r}")
    v = float(x)
    if v != v:
        raise ValueError(f"{name} must not be NaN")
    return None, v


# ---- randomness -----------------------------------------------------------------------------

_default_generators: dict = {}
_fallback_state = [None, 0]  # (seed, offset) for frameworks without a torch generator


def _torch_generator(torch: Any, index: int) -> Any:
    gen = _default_generators.get(index)
    if gen is None:
        if not torch.cuda.default_generators:
            torch.cuda.init()
        gen = _default_generators[index] = torch.cuda.default_generators[index]
    return gen


def get_seed_and_offset(increment: int, generator: Any = None, device: Any = None) -> Tuple[int, int]:
    """Reads (seed, offset) from ``generator`` (default: the CUDA default generator of
    ``device``) and advances its offset by ``increment`` rounded up to a multiple of 4."""
    torch = sys.modules.get("torch")
    inc = (int(increment) + 3) // 4 * 4
    if generator is None:
        if torch is None:
            return _fallback_seed_offset(inc)
        index = getattr(device, "index", device)
        generator = _torch_generator(torch, 0 if index is None else int(index))
    elif torch is not None and not isinstance(generator, torch.Generator):
        raise TypeError(f"generator must be a torch.Generator (or None); got {type(generator).__name__}")
    elif device is not None and getattr(generator.device, "type", "cuda") != "cuda":
        raise ValueError(f"generator must be a CUDA generator (the sampling kernels draw on the GPU); got one on "
                         f"{generator.device}")
    try:  # CUDA generators: no tensors involved (works under set_default_device("cuda"))
        seed = generator.initial_seed()
        off = generator.get_offset()
        generator.set_offset(off + inc)
    except RuntimeError:
        state = generator.get_state()
        seed, off = (int(v) for v in state.view(torch.int64)[:2].tolist())
        new = torch.tensor([seed, off + inc], dtype=torch.int64, device="cpu").view(torch.uint8)
        generator.set_state(new)
    return int(seed) & _MASK64, int(off) & _MASK64


def _fallback_seed_offset(inc: int) -> Tuple[int, int]:
    if _fallback_state[0] is None:
        import os

        _fallback_state[0] = int.from_bytes(os.urandom(8), "little")
    off = _fallback_state[1]
    _fallback_state[1] = off + inc
    return _fallback_state[0], off


def _check_seed_tensor(fw: Any, t: Any, name: str, like: Any, batch: int) -> None:
    if fw.name == "torch":
        if t.device != like.device:
            raise ValueError(f"{name} tensor must be on {like.device}")
        ok_dtype = t.dtype in (fw.torch.int64, getattr(fw.torch, "uint64", fw.torch.int64))
    else:
        ok_dtype = str(getattr(t, "dtype", "")) in ("int64", "uint64")
    if not ok_dtype:
        raise ValueError(f"{name} tensor must be int64/uint64")
    if len(t.shape) != 1:
        raise ValueError(f"{name} tensor must be 1D")
    if int(t.shape[0]) not in (1, batch):
        raise ValueError(f"{name} tensor length must be 1 or {batch}")


def _randomness(fw: Any, x: Any, generator: Any, increment: int, seed: Any, offset: Any,
                batch: int) -> Tuple[Any, int, Any, int]:
    """(seed capsule, seed, offset capsule, offset) for the binding."""
    if seed is not None and offset is not None:
        if _is_tensor(seed) != _is_tensor(offset):
            raise ValueError("seed and offset must both be tensors or both be scalars")
        if _is_tensor(seed):
            _check_seed_tensor(fw, seed, "seed", x, batch)
            _check_seed_tensor(fw, offset, "offset", x, batch)
            return to_dlpack(seed, "seed"), 0, to_dlpack(offset, "offset"), 0
        return (None, _integer(seed, "seed must be an int or an int64 tensor") & _MASK64, None,
                _integer(offset, "offset must be an int or an int64 tensor") & _MASK64)
    if fw.name == "torch":
        if x.device.type != "cuda":  # the binding reports the device
            return None, 0, None, 0
        s, o = get_seed_and_offset(increment, generator, x.device)
    elif generator is not None:
        s, o = get_seed_and_offset(increment, generator)
    else:
        s, o = _fallback_seed_offset((increment + 3) // 4 * 4)
    return None, s, None, o


# ---- the common call, on a short path ----------------------------------------------------------
#
# A CUDA float32 torch tensor, Python-scalar filters (or none), the default generator, no
# indices / valid / check_nan: one output allocation, one generator update, two DLPack exports
# and one binding call on a short argument list (the binding checks shapes and dtypes).

_cluster_mode = -1  # CTAs per row: -1 the launcher decides (FLASHINFER_SAMPLING_CLUSTER, heuristic)


class _TorchFast:
    def __init__(self, torch: Any) -> None:
        self.tensor = torch.Tensor
        self.float32 = torch.float32
        self.int32 = torch.int32
        self.empty = torch.empty
        self.to_dlpack = torch_exporter(torch)
        self.raw_stream = torch_stream_source(torch)
        self.torch = torch
        self.gens: dict = {}


_fast_torch: Optional[_TorchFast] = None


def _fast(op: str, probs: Any, filters: int, draws: int, top_k: Any, top_p: Any, min_p: Any) -> Any:
    """The common call's result, or None when the call needs the general path. Parameters:
    Python numbers, or per-row torch tensors already int32 (top_k) / float32 (top_p, min_p)."""
    t = _fast_torch
    if t is None:
        torch = sys.modules.get("torch")
        if torch is None or getattr(torch._C, "_cuda_getCurrentRawStream", None) is None:
            return None
        t = _set_fast_torch(torch)
    if type(probs) is not t.tensor or probs.dtype is not t.float32:
        return None
    dl = t.to_dlpack
    ka = pa = ma = None
    if type(top_k) is not int:
        if type(top_k) is not t.tensor or top_k.dtype is not t.int32:
            return None
        ka, top_k = dl(top_k), 0
    elif not -0x80000000 <= top_k <= 0x7fffffff:  # (the general path clamps it)
        return None
    if type(top_p) is not float:
        pa, top_p = _fast_prob(t, top_p)
        if top_p is None:
            return None
    elif top_p != top_p:  # NaN: the general path's error
        return None
    if type(min_p) is not float:
        ma, min_p = _fast_prob(t, min_p)
        if min_p is None:
            return None
    elif min_p != min_p:
        return None
    dev = probs.get_device()
    if dev < 0:
        return None
    gen = t.gens.get(dev)
    if gen is None:
        gen = t.gens[dev] = _torch_generator(t.torch, dev)
    shape = probs.shape
    rows = shape[0] if len(shape) else 0
    out = t.empty(rows, dtype=t.int32, device=probs.device)  # (an int size parses ~1 us faster than a tuple)
    try:
        seed = gen.initial_seed()
        off = gen.get_offset()
        gen.set_offset(off + (rows * draws + 3) // 4 * 4)  # (as get_seed_and_offset rounds)
    except RuntimeError:  # a generator without offset accessors: through its state
        seed, off = get_seed_and_offset(rows * draws, gen)
    _sampling.sample_probs(op, dl(probs), dl(out), filters, ka, top_k, pa, top_p, ma, min_p, seed, off,
                           _cluster_mode, t.raw_stream(dev))
    return out


def _fast_prob(t: _TorchFast, x: Any) -> Tuple[Any, Any]:
    """A non-float probability parameter on the short path: (capsule, 0.0) for a float32 torch
    tensor, (None, float) for an int, (None, None) for anything the general path must take."""
    if type(x) is t.tensor and x.dtype is t.float32:
        return t.to_dlpack(x), 0.0
    if type(x) is int:
        return None, float(x)
    return None, None


def _set_fast_torch(torch: Any) -> _TorchFast:
    global _fast_torch
    _fast_torch = _TorchFast(torch)
    return _fast_torch


# ---- samplers over probabilities --------------------------------------------------------------


def _rows_and_output(fw: Any, x: Any, name: str, check_nan: bool, indices: Any) -> Tuple[Any, int, Any]:
    """x as float32 (NaN-checked when asked), the batch size and the sampled-index output: one
    per row of x, or one per entry of ``indices`` in its dtype."""
    x = _cast(fw, x, "float32")
    if check_nan:
        _check_nan(fw, x, f"Input {name} contains NaN.")
    if indices is not None:
        fi = framework_of(indices, "indices")
        if _index_check.enabled:
            _check_range(fi, indices, _rows(x), "indices", f"{name} rows")
        return x, _rows(indices), fi.empty_like(indices)
    batch = _rows(x)
    return x, batch, _empty(fw, x, (batch,), "int32")


def _sample(op: str, probs: Any, indices: Any, generator: Any, check_nan: bool, seed: Any, offset: Any,
            return_valid: bool, filters: int, draws_per_row: int, top_k: Any = _UNUSED, top_p: Any = _UNUSED,
            min_p: Any = _UNUSED, stats: Any = None) -> Any:
    fw = framework_of(probs, "probs")
    probs, batch, out = _rows_and_output(fw, probs, "probs", check_nan, indices)
    valid = _empty(fw, probs, (batch,), "bool") if return_valid else None
    k_arr, k = _param(fw, top_k, "int32", "top_k")
    p_arr, p = _param(fw, top_p, "float32", "top_p", check_nan)
    m_arr, m = _param(fw, min_p, "float32", "min_p", check_nan)
    s_arr, s, o_arr, o = _randomness(fw, probs, generator, batch * draws_per_row, seed, offset, batch)
    _sampling.sampling(op, fw.to_dlpack(probs), fw.to_dlpack(out), _dl(valid, "valid"), _dl(indices, "indices"),
                       k_arr, k, p_arr, 1.0 if top_p is _UNUSED else p, m_arr, m, filters, s_arr, s, o_arr, o,
                       _dl(stats, "stats"), _cluster_mode, fw.stream(probs), True)
    return (out, valid) if return_valid else out


def sampling_from_probs(probs: Any, indices: Optional[Any] = None, deterministic: bool = True,
                        generator: Optional[Any] = None, check_nan: bool = False, seed: Optional[Any] = None,
                        offset: Optional[Any] = None, return_valid: bool = False) -> Any:
    r"""Category sampling proportional to ``probs`` (``[R, V]``, non-negative, any scale).

    ``indices`` (int32/int64 ``[B]``): output ``i`` samples row ``indices[i]``; the output has
    ``indices``' dtype (int32 otherwise). ``return_valid``: also return a bool ``[B]`` that is
    False for rows with NaN or no positive mass (whose sample is 0). Deterministic always.
    """
    if indices is None and generator is None and seed is None and offset is None and not check_nan and not return_valid:
        out = _fast("sampling_from_probs", probs, 0, 1, 0, 1.0, 0.0)
        if out is not None:
            return out
    return _sample("sampling_from_probs", probs, indices, generator, check_nan, seed, offset, return_valid, 0, 1)


def top_p_sampling_from_probs(probs: Any, top_p: Union[Any, float], indices: Optional[Any] = None,
                              deterministic: bool = True, generator: Optional[Any] = None, check_nan: bool = False,
                              seed: Optional[Any] = None, offset: Optional[Any] = None,
                              return_valid: bool = False) -> Any:
    r"""Nucleus sampling from ``{i : mass of tokens above p_i < top_p * total}``, renormalized.
    ``top_p``: a float or a ``[R]`` tensor (per distribution row); ``top_p >= 1`` keeps all."""
    if (indices is None and generator is None and seed is None and offset is None and not check_nan
            and not return_valid):
        out = _fast("top_p_sampling_from_probs", probs, _TOP_P, _ROUNDS, 0, top_p, 0.0)
        if out is not None:
            return out
    return _sample("top_p_sampling_from_probs", probs, indices, generator, check_nan, seed, offset, return_valid,
                   _TOP_P, _ROUNDS, top_p=top_p)


def top_k_sampling_from_probs(probs: Any, top_k: Union[Any, int], indices: Optional[Any] = None,
                              deterministic: bool = True, generator: Optional[Any] = None, check_nan: bool = False,
                              seed: Optional[Any] = None, offset: Optional[Any] = None,
                              return_valid: bool = False) -> Any:
    r"""Top-k sampling from ``{i : #{j : p_j > p_i} < top_k}`` (ties at the k-th value all kept).
    ``top_k``: an int or a ``[R]`` int tensor; ``top_k >= V`` (or ``<= 0``) is plain sampling."""
    if (indices is None and generator is None and seed is None and offset is None and not check_nan
            and not return_valid):
        out = _fast("top_k_sampling_from_probs", probs, _TOP_K, _ROUNDS, top_k, 1.0, 0.0)
        if out is not None:
            return out
    return _sample("top_k_sampling_from_probs", probs, indices, generator, check_nan, seed, offset, return_valid,
                   _TOP_K, _ROUNDS, top_k=top_k)


def min_p_sampling_from_probs(probs: Any, min_p: Union[Any, float], indices: Optional[Any] = None,
                              deterministic: bool = True, generator: Optional[Any] = None, check_nan: bool = False,
                              seed: Optional[Any] = None, offset: Optional[Any] = None,
                              return_valid: bool = False) -> Any:
    r"""Min-p sampling from ``{i : p_i >= min_p * max_j p_j}``. ``min_p``: a float or a ``[R]`` tensor."""
    if (indices is None and generator is None and seed is None and offset is None and not check_nan
            and not return_valid):
        out = _fast("min_p_sampling_from_probs", probs, _MIN_P, 1, 0, 1.0, min_p)
        if out is not None:
            return out
    return _sample("min_p_sampling_from_probs", probs, indices, generator, check_nan, seed, offset, return_valid,
                   _MIN_P, 1, min_p=min_p)


def _order_filters(filter_apply_order: str) -> int:
    if filter_apply_order == "top_k_first":
        return _TOP_K_FIRST
    if filter_apply_order == "joint":
        return _TOP_K | _TOP_P
    raise ValueError(f"Invalid filter_apply_order: {filter_apply_order}")


def top_k_top_p_sampling_from_probs(probs: Any, top_k: Union[Any, int], top_p: Union[Any, float],
                                    indices: Optional[Any] = None, filter_apply_order: str = "top_k_first",
                                    deterministic: bool = True, generator: Optional[Any] = None,
                                    check_nan: bool = False, seed: Optional[Any] = None, offset: Optional[Any] = None,
                                    return_valid: bool = False) -> Any:
    r"""Top-k and top-p together. ``"top_k_first"``: top-p applied to the top-k-renormalized
    distribution (``top_p_sampling_from_probs(top_k_renorm_probs(probs, top_k), top_p)``, fused
    into one kernel); ``"joint"``: the intersection of the top-k and top-p sets of ``probs``."""
    filters = _TOP_K_FIRST if filter_apply_order == "top_k_first" else _order_filters(filter_apply_order)
    if (indices is None and generator is None and seed is None and offset is None and not check_nan
            and not return_valid):
        out = _fast("top_k_top_p_sampling_from_probs", probs, filters, _ROUNDS, top_k, top_p, 0.0)
        if out is not None:
            return out
    return _sample("top_k_top_p_sampling_from_probs", probs, indices, generator, check_nan, seed, offset,
                   return_valid, filters, _ROUNDS, top_k=top_k, top_p=top_p)


def _probs_of_logits(fw: Any, logits: Any) -> Any:
    # torch: exactly the spec's torch.softmax(logits), in the logits' dtype (the probs path then
    # up-casts half-precision probabilities), so both entry points draw the same tokens.
    if fw.name == "torch":
        return fw.torch.softmax(logits, dim=-1)
    return softmax(logits)


def top_k_top_p_sampling_from_logits(logits: Any, top_k: Union[Any, int], top_p: Union[Any, float],
                                     indices: Optional[Any] = None, filter_apply_order: str = "top_k_first",
                                     deterministic: bool = True, generator: Optional[Any] = None,
                                     check_nan: bool = False, seed: Optional[Any] = None,
                                     offset: Optional[Any] = None) -> Any:
    r"""``top_k_top_p_sampling_from_probs(softmax(logits), ...)``: for torch inputs the softmax is
    ``torch.softmax``, so both entry points draw identically from equal generator states (the
    top-k mask then softmax of ``"top_k_first"`` equals softmax then top-k renormalization)."""
    _order_filters(filter_apply_order)
    fw = framework_of(logits, "logits")
    probs = _probs_of_logits(fw, logits)
    return top_k_top_p_sampling_from_probs(probs, top_k, top_p, indices, filter_apply_order, deterministic,
                                           generator, check_nan, seed, offset)


def sampling_from_logits(logits: Any, indices: Optional[Any] = None, deterministic: bool = True,
                         generator: Optional[Any] = None, check_nan: bool = False, seed: Optional[Any] = None,
                         offset: Optional[Any] = None) -> Any:
    r"""Categorical sampling from ``softmax(logits)`` by Gumbel-max (one pass, no softmax);
    ``-inf`` logits are never drawn. Consumes ``B * V`` random words."""
    fw = framework_of(logits, "logits")
    logits, batch, out = _rows_and_output(fw, logits, "logits", check_nan, indices)
    vocab = int(logits.shape[-1]) if len(logits.shape) else 0
    s_arr, s, o_arr, o = _randomness(fw, logits, generator, batch * vocab, seed, offset, batch)
    _sampling.sampling_from_logits(fw.to_dlpack(logits), fw.to_dlpack(out), _dl(indices, "indices"), s_arr, s, o_arr,
                                   o, fw.stream(logits), True)
    return out


# ---- renormalization, mask, softmax -----------------------------------------------------------


def _renorm(op: str, kind: int, x: Any, top_k: Any, top_p: Any, as_f32: bool) -> Any:
    fw = framework_of(x, "logits" if kind == 2 else "probs")
    if as_f32:
        x = _cast(fw, x, "float32")
    out = fw.empty_like(x)
    k_arr, k = _param(fw, top_k, "int32", "top_k")
    p_arr, p = _param(fw, top_p, "float32", "top_p")
    _sampling.renorm(op, kind, fw.to_dlpack(x), fw.to_dlpack(out), k_arr, k, p_arr, 1.0 if top_p is _UNUSED else p,
                     fw.stream(x), True)
    return out


def top_p_renorm_probs(probs: Any, top_p: Union[Any, float], is_deterministic: bool = False) -> Any:
    r"""float32 ``[R, V]``: keep ``{i : mass above p_i < top_p * total}`` (``top_p >= 1`` keeps
    all), zero the rest, divide by the kept mass."""
    return _renorm("top_p_renorm_probs", 1, probs, _UNUSED, top_p, True)


def top_k_renorm_probs(probs: Any, top_k: Union[Any, int], is_deterministic: bool = False) -> Any:
    r"""Same dtype as ``probs`` (float32/float16/bfloat16): keep the values >= the k-th largest
    (ties kept), zero the rest, divide by the kept mass; ``top_k >= V`` keeps all."""
    return _renorm("top_k_renorm_probs", 0, probs, top_k, _UNUSED, False)


def top_k_mask_logits(logits: Any, top_k: Union[Any, int]) -> Any:
    r"""Same dtype as ``logits``: values below the k-th largest become ``-inf`` (ties kept, NaN
    masked), the rest unchanged; ``top_k >= V`` returns an unchanged copy."""
    return _renorm("top_k_mask_logits", 2, logits, top_k, _UNUSED, False)


top_p_renorm_prob = top_p_renorm_probs
top_k_renorm_prob = top_k_renorm_probs

_TEMPERATURE_DTYPES = ("float16", "bfloat16", "float32", "float64")


def softmax(logits: Any, temperature: Optional[Union[Any, float]] = None, enable_pdl: Optional[bool] = None) -> Any:
    r"""float32 ``softmax(logits / temperature)`` row-wise (``-inf`` logits give 0).
    ``temperature``: None (1), a real scalar, or a ``[R]`` float tensor on ``logits``' device;
    0 means inverse temperature 0 (uniform over the finite logits)."""
    fw = framework_of(logits, "logits")
    if fw.name == "torch" and logits.device.type != "cuda":
        raise ValueError(f"logits must be a CUDA tensor, got device={logits.device}")
    t_arr, t = None, 1.0
    if temperature is not None:
        if _is_tensor(temperature):
            shape = tuple(temperature.shape)
            if len(shape) != 1:
                raise ValueError(f"temperature tensor must be 1D with one value per logits row, got shape {shape}")
            if shape[0] != _rows(logits):
                raise ValueError(f"temperature tensor length must equal logits.size(0) ({_rows(logits)}), "
                                 f"got {shape[0]}")
            if fw.name == "torch" and temperature.device != logits.device:
                raise ValueError(f"temperature tensor must be on the same device as logits ({logits.device}), "
                                 f"got {temperature.device}")
            if str(temperature.dtype).replace("torch.", "") not in _TEMPERATURE_DTYPES:
                raise ValueError("temperature tensor must have dtype float16, bfloat16, float32, or float64, "
                                 f"got {temperature.dtype}")
            t_arr = to_dlpack(_cast(fw, temperature, "float32"), "temperature")
        elif isinstance(temperature, bool) or not isinstance(temperature, numbers.Real):
            raise TypeError("temperature must be None, a real scalar, or a 1D floating-point tensor with one value "
                            "per logits row")
        else:
            t = float(temperature)
            if not t >= 0.0 or t == float("inf"):  # (NaN fails t >= 0)
                raise ValueError(f"temperature must be a finite number >= 0; got {temperature}")
    logits = _cast(fw, logits, "float32")
    out = fw.empty_like(logits)
    _sampling.softmax(fw.to_dlpack(logits), fw.to_dlpack(out), t_arr, t, fw.stream(logits), enable_pdl is not False)
    return out


# ---- speculative decoding ---------------------------------------------------------------------


def chain_speculative_sampling(draft_probs: Any, draft_token_ids: Any, target_probs: Any,
                               maybe_output_accepted_token_num: Optional[Any] = None,
                               maybe_output_emitted_draft_token_num: Optional[Any] = None,
                               deterministic: bool = True, generator: Optional[Any] = None,
                               seed: Optional[Any] = None, offset: Optional[Any] = None) -> Tuple[Any, Any, Any]:
    r"""Verifies ``n`` draft tokens per request against the target model.

    draft_probs ``[B, n, V]``, draft_token_ids ``[B, n]``, target_probs ``[B, n + 1, V]``.
    Draft ``t`` is accepted while ``u_t * draft(d_t) < target(d_t)``; at the first rejection
    ``t*`` a token is drawn from ``relu(target[t*] - draft[t*])`` (renormalized), or the bonus
    token from ``target[n]`` when all pass. Returns ``(output_token_ids [B, n + 1]`` (-1 after
    the drawn token), ``accepted [B]`` (``t*`` plus later positions that would pass),
    ``emitted [B]`` (``t*``)); given count tensors are incremented in place and returned.
    """
    fw = framework_of(draft_probs, "draft_probs")
    for name, x in (("draft_token_ids", draft_token_ids), ("target_probs", target_probs),
                    ("maybe_output_accepted_token_num", maybe_output_accepted_token_num),
                    ("maybe_output_emitted_draft_token_num", maybe_output_emitted_draft_token_num)):
        if x is not None or name[0] != "m":
            framework_of(x, name)  # (a non-tensor: a TypeError naming it)
    if maybe_output_accepted_token_num is not None and \
            maybe_output_accepted_token_num is maybe_output_emitted_draft_token_num:
        raise ValueError("maybe_output_accepted_token_num and maybe_output_emitted_draft_token_num must be two "
                         "tensors; got the same one for both")
    dt = _dtype_str(draft_token_ids)
    if not dt.startswith(("int", "uint")):
        raise ValueError(f"draft_token_ids must have an integer dtype; got {dt or type(draft_token_ids).__name__}")
    draft_probs = _cast(fw, draft_probs, "float32")
    if _index_check.enabled and len(draft_probs.shape) == 3:
        _check_range(framework_of(draft_token_ids), draft_token_ids, int(draft_probs.shape[2]), "draft_token_ids",
                     "the vocabulary")
    draft_token_ids = _as_int32(fw, draft_token_ids)  # (out of range: a rejection, not a wrapped id)
    target_probs = _cast(fw, target_probs, "float32")
    shape = tuple(draft_token_ids.shape)
    if len(shape) != 2:
        raise ValueError(f"draft_token_ids must be 2-D [batch_size, num_speculate_tokens]; got shape {shape}")
    b, n = int(shape[0]), int(shape[1])

    def counts(given: Any) -> Any:
        return _empty(fw, draft_probs, (b,), "int32", zero=True) if given is None else _cast(fw, given, "int32")

    accepted = counts(maybe_output_accepted_token_num)
    emitted = counts(maybe_output_emitted_draft_token_num)
    out = _empty(fw, draft_probs, (b, n + 1), "int32")
    s_arr, s, o_arr, o = _randomness(fw, draft_probs, generator, b * (n + 1), seed, offset, b)
    _sampling.chain_speculative_sampling(fw.to_dlpack(draft_probs), to_dlpack(draft_token_ids, "draft_token_ids"),
                                         to_dlpack(target_probs, "target_probs"), fw.to_dlpack(out),
                                         to_dlpack(accepted, "accepted"), to_dlpack(emitted, "emitted"), s_arr, s,
                                         o_arr, o, fw.stream(draft_probs), True)
    # a given count tensor of another dtype was counted in an int32 copy: add back in place
    given = (maybe_output_accepted_token_num, maybe_output_emitted_draft_token_num)
    counted = [accepted, emitted]
    for i in range(2):
        if given[i] is not None and counted[i] is not given[i]:
            if fw.name == "torch":
                given[i].copy_(counted[i])
            else:
                given[i][...] = counted[i]
            counted[i] = given[i]
    return out, counted[0], counted[1]


# ---- diagnostics ------------------------------------------------------------------------------


class _force_cluster:
    """``with _force_cluster(n):`` samples with n CTAs per row (0 or 1: the one-block kernel;
    n >= 2: a thread-block cluster of n, on sm_90 where the slices fit; -1: the launcher decides,
    as without it). For tests and benchmarks; overrides FLASHINFER_SAMPLING_CLUSTER."""

    def __init__(self, n: int) -> None:
        self.n = int(n)

    def __enter__(self) -> "_force_cluster":
        global _cluster_mode
        self.prev = _cluster_mode
        _cluster_mode = self.n
        return self

    def __exit__(self, *exc: Any) -> None:
        global _cluster_mode
        _cluster_mode = self.prev


def _sample_with_stats(probs: Any, top_k: Any = None, top_p: Any = None, min_p: Any = None,
                       filter_apply_order: str = "joint", seed: int = 0, offset: int = 0) -> Tuple[Any, Any]:
    """Samples like the public functions (the filters given) and also returns int32 ``[B, 2]``:
    per row the uniforms drawn (rejection rounds) and the passes over the row (first pass,
    aggregates and gathers; the ones served from the shared-memory cache included; on the
    cluster path, the passes of the slice of rank 0)."""
    fw = framework_of(probs, "probs")
    filters = (_TOP_K if top_k is not None else 0) | (_TOP_P if top_p is not None else 0)
    if min_p is not None:
        filters |= _MIN_P
    if top_k is not None and top_p is not None and filter_apply_order == "top_k_first":
        filters = _TOP_K_FIRST
    stats = _empty(fw, probs, (_rows(probs), 2), "int32")
    unused = lambda x: _UNUSED if x is None else x  # noqa: E731
    out = _sample("_sample_with_stats", probs, None, None, False, seed, offset, False, filters, _ROUNDS,
                  top_k=unused(top_k), top_p=unused(top_p), min_p=unused(min_p), stats=stats)
    return out, stats
