"""Timeline of the tensor-core decode kernel, from a diagnostic build (-DFLASHINFER_DECODE_TRACE=1,
see decode.cuh's trace_mark): thread 0 of every CTA stamps %globaltimer and clock64 at

  0 start        after griddepcontrol.wait
  1 item0        its first work item's descriptor is in registers
  2 prologue     the prologue's copies are issued and the next page ids are in registers
  3 tile0        its first tile has landed in shared memory
  4 last_tile    the math of its last item's tiles is done (stamped per item; the last stays)
  5 fence        split items: partial state written, fenced, and the merge info read
  6 atomic       ... the arrival counted (atomicAdd returned)
  7 merged       the CTA that arrived last has merged the request's partial states
  8 end          before the kernel returns
  10..15         the prologue's steps: page ids of tile s loaded (10 + 2s), tile s issued (11 + 2s);
                 with FLASHINFER_DECODE_HOIST, 10: every prologue tile's ids loaded, 11: all issued

Each rep is the bench's sequence (memset flush of 256 MiB, start event, the call, end event). The
table gives, over CTAs, min / median / max of each stamp in us after the first CTA's start, as
the median over reps; clock64 differences give per-CTA stage durations where %globaltimer is
too coarse.
  PYTHONPATH=<trace build> python3 benchmarks/trace_decode.py [--reps 20]
"""
import argparse
import os
import statistics
import types

import torch

from flashinfer.bench import routines  # noqa: F401  (imports the routine modules in order)
from flashinfer.bench import routines_decode

EVENTS = ["start", "item0", "prologue", "tile0", "last_tile", "fence", "atomic", "merged", "end"]
SLOTS = 16

CASES = [("batch", 1, 4096), ("single", 1, 4096), ("batch", 4, 1024), ("batch", 1, 32768), ("single", 1, 32768),
         ("batch", 16, 4096), ("batch", 64, 2048)]


def make(kind, b, L):
    a = types.SimpleNamespace(batch_size=b, kv_len=L, page_size=16, num_qo_heads=32, num_kv_heads=8, head_dim=128,
                              dtype="bfloat16", kv_layout="NHD", kv_dtype="same", use_tensor_cores=True,
                              pos_encoding_mode="NONE", q_len_per_req=1)
    f = routines_decode.batch_decode if kind == "batch" else routines_decode.single_decode
    return f(torch, a).ours


def trace(fn, reps):
    tr = torch.zeros(16384 * 2 * SLOTS, dtype=torch.int64, device="cuda")
    os.environ["FLASHINFER_DECODE_TRACE_PTR"] = str(tr.data_ptr())
    flush = torch.empty(256 << 20, dtype=torch.uint8, device="cuda")
    stats = {}  # name -> list over reps

    def put(k, v):
        stats.setdefault(k, []).append(v)

    for r in range(reps + 3):
        tr.zero_()
        torch.cuda._sleep(200000)
        flush.zero_()
        e0, e1 = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        e0.record()
        fn()
        e1.record()
        torch.cuda.synchronize()
        if r < 3:
            continue
        t = tr.view(-1, 2 * SLOTS).cpu()
        t = t[t[:, 0] > 0]
        g, c = t[:, :SLOTS].double(), t[:, SLOTS:].double()
        t0 = g[:, 0].min()
        put("event_us", e0.elapsed_time(e1) * 1e3)
        put("ctas", float(len(t)))
        put("items_per_cta_max", float(t[:, 9].max()))
        put("span_us", float((g[:, 8].max() - t0) / 1e3))
        starts = sorted(set(g[:, 0].tolist()))
        put("start_distinct", float(len(starts)))
        for i, name in enumerate(EVENTS):
            sel = g[:, i] > 0
            if not bool(sel.any()):
                continue
            x = ((g[sel, i] - t0) / 1e3).tolist()
            x.sort()
            put(f"{name}.n", float(len(x)))
            put(f"{name}.min", x[0])
            put(f"{name}.med", x[len(x) // 2])
            put(f"{name}.max", x[-1])
        # per-CTA durations from clock64 (cycles -> us through the CTA's own ratio to globaltimer)
        ok = (g[:, 8] > g[:, 0])
        ghz = ((c[ok, 8] - c[ok, 0]) / (g[ok, 8] - g[ok, 0])).median().item()
        put("sm_ghz", ghz)
        for a, b, name in [(0, 1, "d.item0"), (1, 2, "d.prologue"), (2, 3, "d.tile0_wait"), (3, 4, "d.tiles"),
                           (4, 8, "d.epilogue_to_end"), (4, 5, "d.to_fence"), (5, 6, "d.atomic"), (6, 7, "d.merge"),
                           # the prologue's steps: serial (ids 0, issue 0, ids 1, ...) or hoisted (all ids, all issues)
                           (1, 10, "d.p_ids0"), (10, 11, "d.p_issue0"), (11, 12, "d.p_ids1"), (12, 13, "d.p_issue1"),
                           (13, 14, "d.p_ids2"), (14, 15, "d.p_issue2"), (11, 2, "d.p_rest")]:
            sel = (c[:, a] > 0) & (c[:, b] > 0)
            if not bool(sel.any()):
                continue
            d = ((c[sel, b] - c[sel, a]) / ghz / 1e3).tolist()
            d.sort()
            put(name + ".med", d[len(d) // 2])
            put(name + ".max", d[-1])
    os.environ.pop("FLASHINFER_DECODE_TRACE_PTR", None)
    return {k: statistics.median(v) for k, v in stats.items()}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--reps", type=int, default=20)
    ap.add_argument("--cases", default="", help="kind:batch:kv_len,... (default: all of CASES)")
    args = ap.parse_args()
    cases = [(k, int(b), int(L)) for k, b, L in (c.split(":") for c in args.cases.split(","))] if args.cases else CASES
    for kind, b, L in cases:
        fn = make(kind, b, L)
        s = trace(fn, args.reps)
        print(f"== {kind} {b}x{L}: event {s['event_us']:.2f} us, span {s['span_us']:.2f}, {s['ctas']:.0f} CTAs, "
              f"<= {s['items_per_cta_max']:.0f} items each, SM {s['sm_ghz']:.2f} GHz, "
              f"{s['start_distinct']:.0f} distinct start stamps")
        print("   stamp        n      min      med      max   (us after the first CTA's start)")
        for name in EVENTS:
            if f"{name}.n" in s:
                print(f"   {name:10s} {s[name + '.n']:5.0f} {s[name + '.min']:8.2f} {s[name + '.med']:8.2f} "
                      f"{s[name + '.max']:8.2f}")
        print("   per CTA (clock64): " + ", ".join(f"{k[2:-4]} {s[k]:.2f}/{s[k[:-4] + '.max']:.2f}"
                                               for k in s if k.startswith("d.") and k.endswith(".med")))


if __name__ == "__main__":
    main()
