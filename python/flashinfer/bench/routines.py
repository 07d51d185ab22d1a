"""Benchmark routines. Each builds a Case from parsed arguments: our call (with and
without ``out=`` where the API has it), the PyTorch reference, and the bytes/FLOPs that
define achieved bandwidth. Later kernel families add their routines here."""

from __future__ import annotations

import argparse
from dataclasses import dataclass, field
from typing import Callable, Dict, List, Optional

import flashinfer


@dataclass
class Case:
    routine: str
    shape: str
    dtype: str
    ours: Callable[[], object]  # the call as a user writes it (allocates its output)
    ours_out: Optional[Callable[[], object]]  # same with out= (no allocation), if supported
    ref: Optional[Callable[[], object]]  # the PyTorch reference
    ref_name: str
    bytes: int = 0
    flops: int = 0
    extra: Dict[str, float] = field(default_factory=dict)


def _dtype(torch, name: str):
    return {"bfloat16": torch.bfloat16, "bf16": torch.bfloat16, "float16": torch.float16, "fp16": torch.float16}[name]


def _rows_hidden(args) -> tuple:
    return args.batch_size, args.hidden_size


def rmsnorm(torch, args) -> Case:
    n, h = _rows_hidden(args)
    dt = _dtype(torch, args.dtype)
    x = torch.randn(n, h, dtype=dt, device="cuda")
    w = torch.randn(h, dtype=dt, device="cuda")
    o = torch.empty_like(x)
    F = torch.nn.functional
    e = x.element_size()
    return Case("rmsnorm", f"{n}x{h}", args.dtype, lambda: flashinfer.rmsnorm(x, w),
                lambda: flashinfer.rmsnorm(x, w, out=o), lambda: F.rms_norm(x, (h,), w, 1e-6),
                "F.rms_norm", bytes=2 * n * h * e + h * e)


def gemma_rmsnorm(torch, args) -> Case:
    n, h = _rows_hidden(args)
    dt = _dtype(torch, args.dtype)
    x = torch.randn(n, h, dtype=dt, device="cuda")
    w = torch.randn(h, dtype=dt, device="cuda")
    o = torch.empty_like(x)
    e = x.element_size()

    def ref():
        xf = x.float()
        return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + 1e-6) * (1.0 + w.float())).to(dt)

    return Case("gemma_rmsnorm", f"{n}x{h}", args.dtype, lambda: flashinfer.gemma_rmsnorm(x, w),
                lambda: flashinfer.gemma_rmsnorm(x, w, out=o), ref, "eager formula", bytes=2 * n * h * e + h * e)


def fused_add_rmsnorm(torch, args) -> Case:
    n, h = _rows_hidden(args)
    dt = _dtype(torch, args.dtype)
    x = torch.randn(n, h, dtype=dt, device="cuda")
    r = torch.randn(n, h, dtype=dt, device="cuda")
    w = torch.randn(h, dtype=dt, device="cuda")
    F = torch.nn.functional
    e = x.element_size()

    def ref():  # the same in-place contract, eagerly: residual += x; x = rms_norm(residual)
        r.add_(x)
        x.copy_(F.rms_norm(r, (h,), w, 1e-6))

    def ours():
        flashinfer.fused_add_rmsnorm(x, r, w)

    return Case("fused_add_rmsnorm", f"{n}x{h}", args.dtype, ours, None, ref, "add_ + F.rms_norm",
                bytes=4 * n * h * e + h * e)


def layernorm(torch, args) -> Case:
    n, h = _rows_hidden(args)
    dt = _dtype(torch, args.dtype)
    x = torch.randn(n, h, dtype=dt, device="cuda")
    g = torch.randn(h, dtype=torch.float32, device="cuda")
    b = torch.randn(h, dtype=torch.float32, device="cuda")
    g16, b16 = g.to(dt), b.to(dt)  # F.layer_norm wants parameters in the input dtype
    F = torch.nn.functional
    e = x.element_size()
    return Case("layernorm", f"{n}x{h}", args.dtype, lambda: flashinfer.layernorm(x, g, b), None,
                lambda: F.layer_norm(x, (h,), g16, b16, 1e-6), "F.layer_norm", bytes=2 * n * h * e + 8 * h)


def rmsnorm_quant(torch, args) -> Case:
    """RMSNorm into fp8 e4m3 with a device scale; the reference: F.rms_norm, then divide, clamp, cast."""
    n, h = _rows_hidden(args)
    dt = _dtype(torch, args.dtype)
    x = torch.randn(n, h, dtype=dt, device="cuda")
    w = torch.randn(h, dtype=dt, device="cuda")
    o = torch.empty(n, h, device="cuda").to(torch.float8_e4m3fn)
    s = torch.tensor(0.5, device="cuda")
    F = torch.nn.functional
    m = torch.finfo(torch.float8_e4m3fn).max

    def ref():
        return (F.rms_norm(x.float(), (h,), w.float(), 1e-6) / s).clamp(-m, m).to(torch.float8_e4m3fn)

    return Case("rmsnorm_quant", f"{n}x{h}", args.dtype, lambda: flashinfer.rmsnorm_quant(o, x, w, s), None, ref,
                "F.rms_norm + clamp + cast", bytes=n * h * (x.element_size() + 1) + h * x.element_size())


def _act(name: str, torch_act_name: str):
    def build(torch, args) -> Case:
        n, h = _rows_hidden(args)
        dt = _dtype(torch, args.dtype)
        x = torch.randn(n, 2 * h, dtype=dt, device="cuda")
        o = torch.empty(n, h, dtype=dt, device="cuda")
        fn = getattr(flashinfer, name)
        F = torch.nn.functional
        act = {
            "silu": F.silu,
            "gelu": F.gelu,
            "gelu_tanh": lambda t: F.gelu(t, approximate="tanh"),
        }[torch_act_name]
        e = x.element_size()
        return Case(name, f"{n}x{h}", args.dtype, lambda: fn(x), lambda: fn(x, out=o),
                    lambda: act(x[:, :h]) * x[:, h:], f"F.{torch_act_name}(x1) * x2", bytes=3 * n * h * e)

    return build


def empty_kernel(torch, args) -> Case:
    """The floor under every small case: one empty 32-thread kernel timed the same way (flush,
    events around the call). A kernel can only be as fast as this plus its own memory latency."""
    from flashinfer import _cuda

    raw = torch._C._cuda_getCurrentRawStream

    def launch():
        _cuda.launch_empty(raw(torch.cuda.current_device()))

    return Case("empty_kernel", "1x32", "-", launch, None, None, "-")


ROUTINES: Dict[str, Callable] = {
    "empty_kernel": empty_kernel,
    "rmsnorm": rmsnorm,
    "fused_add_rmsnorm": fused_add_rmsnorm,
    "gemma_rmsnorm": gemma_rmsnorm,
    "layernorm": layernorm,
    "rmsnorm_quant": rmsnorm_quant,
    "silu_and_mul": _act("silu_and_mul", "silu"),
    "gelu_and_mul": _act("gelu_and_mul", "gelu"),
    "gelu_tanh_and_mul": _act("gelu_tanh_and_mul", "gelu_tanh"),
}

# No arguments: a small representative suite (well under a minute on an H200).
DEFAULT_SUITE: List[str] = [
    "--routine rmsnorm --batch-size 32768 --hidden-size 4096",
    "--routine rmsnorm --batch-size 32768 --hidden-size 8192",
    "--routine rmsnorm --batch-size 4096 --hidden-size 4096",
    "--routine rmsnorm --batch-size 128 --hidden-size 4096",
    "--routine rmsnorm --batch-size 1 --hidden-size 4096",
    "--routine fused_add_rmsnorm --batch-size 32768 --hidden-size 4096",
    "--routine fused_add_rmsnorm --batch-size 32768 --hidden-size 8192",
    "--routine fused_add_rmsnorm --batch-size 4096 --hidden-size 4096",
    "--routine fused_add_rmsnorm --batch-size 128 --hidden-size 4096",
    "--routine fused_add_rmsnorm --batch-size 1 --hidden-size 4096",
    "--routine gemma_rmsnorm --batch-size 32768 --hidden-size 4096",
    "--routine layernorm --batch-size 32768 --hidden-size 4096",
    "--routine silu_and_mul --batch-size 4096 --hidden-size 14336",
    "--routine gelu_tanh_and_mul --batch-size 4096 --hidden-size 14336",
]


# Families register their routines with register(): their builders, default-suite lines and
# extra flags (each family module calls it at import; see the imports at the bottom).
EXTRA_ARGS: List[Callable[[argparse.ArgumentParser], None]] = []


def register(routines: Dict[str, Callable], suite: List[str], add_args: Optional[Callable] = None) -> None:
    ROUTINES.update(routines)
    DEFAULT_SUITE.extend(suite)
    if add_args is not None:
        EXTRA_ARGS.append(add_args)


def add_case_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--routine", choices=sorted(ROUTINES), help="kernel to measure")
    p.add_argument("--batch-size", "--num-tokens", dest="batch_size", type=int, default=4096,
                   help="rows (tokens)")
    p.add_argument("--hidden-size", type=int, default=4096,
                   help="hidden size (for *_and_mul: the output width H; input is 2H)")
    p.add_argument("--dtype", default="bfloat16", choices=["bfloat16", "float16", "bf16", "fp16"])
    for add in EXTRA_ARGS:
        add(p)


from . import routines_decode  # noqa: E402,F401  (registers its routines)
from . import routines_rope  # noqa: E402,F401  (registers its routines)
from . import routines_cascade  # noqa: E402,F401  (registers its routines)
from . import routines_sampling  # noqa: E402,F401  (registers its routines)
from . import routines_prefill  # noqa: E402,F401  (registers its routines)
from . import routines_mla  # noqa: E402,F401  (registers its routines)
