"""Runs one bench case a few times so a profiler (ncu) can capture its kernels:
    ncu --clock-control none -k regex:Norm -c 3 python3 benchmarks/profile_case.py --routine rmsnorm ...
Takes the bench CLI's case flags."""

import argparse
import sys

import torch

from flashinfer.bench.routines import ROUTINES, add_case_args


def main(argv=None):
    p = argparse.ArgumentParser()
    add_case_args(p)
    p.add_argument("--calls", type=int, default=5)
    args = p.parse_args(argv)
    case = ROUTINES[args.routine](torch, args)
    for _ in range(args.calls):
        case.ours()
    torch.cuda.synchronize()
    print(f"ran {case.routine} {case.shape} x{args.calls}", file=sys.stderr)


if __name__ == "__main__":
    main()
