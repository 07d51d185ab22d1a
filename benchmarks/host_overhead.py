"""Where the host time of one flashinfer call goes (median us over many calls), on the GPU
machine: the pieces (DLPack export, stream query, allocation) and the whole calls."""

import statistics
import time

import torch

import flashinfer
from flashinfer import _ext


def med_us(fn, n=20000, batch=100):
    fn()
    torch.cuda.synchronize()
    xs = []
    pc = time.perf_counter
    for _ in range(n // batch):
        t0 = pc()
        for _ in range(batch):
            fn()
        xs.append((pc() - t0) * 1e6 / batch)
        torch.cuda.synchronize()
    return statistics.median(xs)


def main():
    x = torch.randn(1, 4096, dtype=torch.bfloat16, device="cuda")
    w = torch.randn(4096, dtype=torch.bfloat16, device="cuda")
    o = torch.empty_like(x)
    r = torch.randn_like(x)
    a = torch.randn(1, 2 * 4096, dtype=torch.bfloat16, device="cuda")
    ao = torch.empty(1, 4096, dtype=torch.bfloat16, device="cuda")
    fw = _ext.framework_of(x)
    rows = [
        ("torch._C._to_dlpack(x)", lambda: torch._C._to_dlpack(x)),
        ("framework_of + fw.stream(x)", lambda: _ext.framework_of(x).stream(x)),
        ("torch.empty_like(x)", lambda: torch.empty_like(x)),
        ("rmsnorm(x, w, out=o)", lambda: flashinfer.rmsnorm(x, w, out=o)),
        ("rmsnorm(x, w)", lambda: flashinfer.rmsnorm(x, w)),
        ("rmsnorm(x, w, out=o, enable_pdl=False)", lambda: flashinfer.rmsnorm(x, w, out=o, enable_pdl=False)),
        ("fused_add_rmsnorm(x, r, w)", lambda: flashinfer.fused_add_rmsnorm(x, r, w)),
        ("silu_and_mul(a, out=ao)", lambda: flashinfer.silu_and_mul(a, out=ao)),
        ("silu_and_mul(a)", lambda: flashinfer.silu_and_mul(a)),
        ("torch F.rms_norm (reference)", lambda: torch.nn.functional.rms_norm(x, (4096,), w, 1e-6)),
    ]
    del fw
    print(f"{'host call':<42} {'median us':>9}")
    for name, fn in rows:
        print(f"{name:<42} {med_us(fn):9.2f}")


if __name__ == "__main__":
    main()
