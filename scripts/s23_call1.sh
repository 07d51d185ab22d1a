#!/usr/bin/env bash
# Session 23, device call 1: A/B of the warp-specialized two-M-tile prefill kernels
# (FLASHINFER_PREFILL_WS 1 / 2 / 3, setmaxnreg budget FLASHINFER_PREFILL_WS_REGS) against HEAD,
# then the prefill GPU tests on two of the variants' packages.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
VARIANTS=$'head|| \nws1|-DFLASHINFER_PREFILL_WS=1\nws2|-DFLASHINFER_PREFILL_WS=2\nws3|-DFLASHINFER_PREFILL_WS=3\nws3r|-DFLASHINFER_PREFILL_WS=3 -DFLASHINFER_PREFILL_WS_REGS=200' \
  MODULES=_prefill CASES=benchmarks/sweeps/s23_ws.txt ROUNDS=1 timeout 430 bash scripts/gpu_ab.sh > "$OUT/ab.txt" 2>&1
echo "ab rc $?"
for v in 4:test_prefill.py 4:test_batch_prefill.py 2:test_prefill.py; do
  n=${v%%:*}; f=${v#*:}
  PYTHONPATH=$PWD/build/ab-pkg-$n timeout 50 python3 -m pytest -q -x -n 15 -p no:cacheprovider tests/python/$f > "$OUT/pytest-pkg$n-$f.txt" 2>&1
  echo "pkg $n $f: rc $? $(tail -1 "$OUT/pytest-pkg$n-$f.txt")"
done
grep -h "builds:\|total:" "$OUT/ab.txt"
tail -30 "$OUT/ab.txt"
