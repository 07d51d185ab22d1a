"""Timing method shared by every routine (see ../shared/reference/peer-figures.md):

* GPU time: a GPU sleep is enqueued first, then each rep is [L2 flush (256 MiB memset),
  start event, op, end event]; the flush takes far longer on the GPU than the host needs to
  enqueue a rep, so the GPU never waits for the host and the events time the op alone.
* Host time: wall time of one Python call (perf_counter), in short batches with a sync
  between batches so the launch queue never fills; median over all calls.
"""

from __future__ import annotations

import os
import statistics
import time
from dataclasses import dataclass
from typing import Callable, List

COPY_CEILING_GBPS = 4273.0  # H200 device-to-device copy, bytes read + written
MATMUL_CEILING_TFLOPS = 775.0  # H200 bf16 GEMM 8192^3


def ceiling_fraction(tb_per_s, tflop_per_s):
    """The fraction of the ceiling that binds: the larger of bandwidth / copy ceiling and
    TFLOP/s / matmul ceiling, over the figures a case has (None: neither)."""
    fracs = []
    if tb_per_s:
        fracs.append(tb_per_s * 1e3 / COPY_CEILING_GBPS)
    if tflop_per_s:
        fracs.append(tflop_per_s / MATMUL_CEILING_TFLOPS)
    return max(fracs) if fracs else None


@dataclass
class Stats:
    median: float
    p10: float
    p90: float
    n: int
    max: float = 0.0

    @staticmethod
    def of(xs: List[float]) -> "Stats":
        xs = sorted(xs)
        q = statistics.quantiles(xs, n=10) if len(xs) >= 10 else [xs[0]] * 9
        return Stats(statistics.median(xs), q[0], q[-1], len(xs), xs[-1])


class Timer:
    def __init__(self, torch, flush_mib: int = 256, device=None):
        self.torch = torch
        self.device = device or torch.device("cuda")
        self.flush = torch.empty(flush_mib << 20, dtype=torch.uint8, device=self.device)
        # FLASHINFER_BENCH_FLUSH=read (a diagnostic, not the peers' method): flush by reading the
        # buffer, which leaves L2 full of clean lines instead of the memset's dirty ones.
        if os.environ.get("FLASHINFER_BENCH_FLUSH") == "read":
            words = self.flush.view(torch.int32)
            self.flush_l2 = lambda: words.amax()
        else:
            self.flush_l2 = self.flush.zero_
        # torch.cuda._sleep spins this many cycles; ~2 GHz -> 1 ms hides any enqueue burst.
        self.sleep_cycles = 2_000_000

    def gpu_us(self, fn: Callable[[], object], reps: int = 100, warmup: int = 5) -> Stats:
        torch = self.torch
        for _ in range(warmup):  # the timed sequence itself (flush, events, op), first uses included
            self.flush_l2()
            e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            e0.record()
            fn()
            e1.record()
        torch.cuda.synchronize()
        starts = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        ends = [torch.cuda.Event(enable_timing=True) for _ in range(reps)]
        torch.cuda._sleep(self.sleep_cycles)
        for i in range(reps):
            self.flush_l2()
            starts[i].record()
            fn()
            ends[i].record()
        torch.cuda.synchronize()
        return Stats.of([s.elapsed_time(e) * 1e3 for s, e in zip(starts, ends)])

    def host_us(self, fn: Callable[[], object], calls: int = 2000, batch: int = 50) -> Stats:
        torch = self.torch
        fn()
        torch.cuda.synchronize()
        xs: List[float] = []
        pc = time.perf_counter
        for _ in range(max(1, calls // batch)):
            for _ in range(batch):
                t0 = pc()
                fn()
                xs.append((pc() - t0) * 1e6)
            torch.cuda.synchronize()
        return Stats.of(xs)
