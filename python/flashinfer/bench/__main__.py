"""Command line: ``python -m flashinfer.bench [--routine R shape flags | --testlist FILE]``."""

from __future__ import annotations

import argparse
import csv
import json
import shlex
import sys
import time
from typing import List, Optional

from .routines import DEFAULT_SUITE, ROUTINES, add_case_args
from .timing import Timer, ceiling_fraction


def _parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(prog="flashinfer-bench", description=__doc__)
    add_case_args(p)
    p.add_argument("--testlist", help="file with one case per line (the flags above); '#' comments")
    p.add_argument("--output-path", help="write results to this .csv or .json file")
    p.add_argument("--dry-run", action="store_true", help="list the cases without running them")
    p.add_argument("--reps", type=int, default=100, help="timed reps per case (GPU time)")
    p.add_argument("--host-calls", type=int, default=2000, help="calls timed for host enqueue time")
    p.add_argument("--no-ref", action="store_true", help="skip the PyTorch reference")
    return p


def _cases(args, parser) -> List[argparse.Namespace]:
    lines: List[str] = []
    if args.testlist:
        with open(args.testlist) as f:
            lines = [ln.split("#", 1)[0].strip() for ln in f]
        lines = [ln for ln in lines if ln]
    elif args.routine:
        return [args]
    else:
        lines = DEFAULT_SUITE
    case_parser = argparse.ArgumentParser(prog="testlist line")
    add_case_args(case_parser)
    out = []
    for ln in lines:
        ns = case_parser.parse_args(shlex.split(ln))
        if ns.routine is None:
            parser.error(f"testlist line without --routine: {ln!r}")
        out.append(ns)
    return out


def _fmt(x: Optional[float], spec: str) -> str:
    return "-" if x is None else format(x, spec)


def main(argv: Optional[List[str]] = None) -> int:
    parser = _parser()
    args = parser.parse_args(argv)
    cases = _cases(args, parser)
    if args.dry_run:
        for c in cases:
            print(" ".join(f"{k}={v}" for k, v in vars(c).items()))
        return 0
    try:
        import torch
    except ImportError:
        print("flashinfer-bench: PyTorch is required to run the benchmark (pip install torch)", file=sys.stderr)
        return 2
    if not torch.cuda.is_available():
        print("flashinfer-bench: no CUDA device available; nothing to measure", file=sys.stderr)
        return 2
    timer = Timer(torch)
    rows = []
    t_start = time.time()
    hdr = (f"{'routine':<20} {'shape':>12} {'dtype':>8} {'gpu_us':>9} {'p10-p90':>15} {'TB/s':>6} {'%peak':>6} "
           f"{'host_us':>8} {'host_out':>8} {'torch_us':>9} {'vs_torch':>8} {'max/med':>7}")
    print(hdr)
    for i, cargs in enumerate(cases):
        case = ROUTINES[cargs.routine](torch, cargs)
        g = timer.gpu_us(case.ours, reps=args.reps)
        h = timer.host_us(case.ours, calls=args.host_calls)
        ho = timer.host_us(case.ours_out, calls=args.host_calls) if case.ours_out else None
        ref = None if args.no_ref or case.ref is None else timer.gpu_us(case.ref, reps=args.reps)
        tbs = case.bytes / (g.median * 1e-6) / 1e12 if case.bytes else None
        tflops = case.flops / (g.median * 1e-6) / 1e12 if case.flops else None
        frac = ceiling_fraction(tbs, tflops)
        row = {
            "routine": case.routine, "shape": case.shape, "dtype": case.dtype,
            "gpu_us": round(g.median, 2), "gpu_us_p10": round(g.p10, 2), "gpu_us_p90": round(g.p90, 2),
            "host_us": round(h.median, 2), "host_out_us": round(ho.median, 2) if ho else None,
            "tb_per_s": round(tbs, 3) if tbs else None, "tflop_per_s": round(tflops, 1) if tflops else None,
            "frac_of_ceiling": round(frac, 3) if frac else None,
            "torch_ref": case.ref_name, "torch_us": round(ref.median, 2) if ref else None,
            "speedup_vs_torch": round(ref.median / g.median, 2) if ref else None,
            "bytes": case.bytes, "flops": case.flops,
            "gpu_us_max": round(g.max, 2), "gpu_spread": round(g.max / g.median, 2) if g.median else None,
            "host_us_max": round(h.max, 2),
        }
        row.update({k: (round(v, 3) if isinstance(v, float) else v) for k, v in case.extra.items()})
        rows.append(row)
        print(f"{case.routine:<20} {case.shape:>12} {case.dtype:>8} {g.median:9.2f} "
              f"{g.p10:7.1f}-{g.p90:<7.1f} {_fmt(tbs, '6.2f')} {_fmt(frac and frac * 100, '5.1f'):>5}% "
              f"{h.median:8.2f} {_fmt(ho and ho.median, '8.2f')} {_fmt(ref and ref.median, '9.2f')} "
              f"{_fmt(row['speedup_vs_torch'], '7.2f')}x {_fmt(row['gpu_spread'], '7.2f')}", flush=True)
        if case.extra:
            print("    " + "  ".join(f"{k}={_fmt(v, '.2f') if isinstance(v, float) else v}"
                                     for k, v in case.extra.items()), flush=True)
        if len(cases) > 20:
            print(f"  [{i + 1}/{len(cases)}] {time.time() - t_start:.0f}s", file=sys.stderr, flush=True)
    if args.output_path:
        if args.output_path.endswith(".json"):
            with open(args.output_path, "w") as f:
                json.dump(rows, f, indent=1)
        else:
            with open(args.output_path, "w", newline="") as f:
                fields = list(dict.fromkeys(k for r in rows for k in r))  # (extra keys vary by routine)
                w = csv.DictWriter(f, fieldnames=fields, restval="")
                w.writeheader()
                w.writerows(rows)
    return 0


if __name__ == "__main__":
    sys.exit(main())
