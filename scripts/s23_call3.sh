#!/usr/bin/env bash
# Session 23, device call 3: the warp-specialized prefill with separate K / V pipelines and
# 128-key tiles (FLASHINFER_PREFILL_WS_KEYS), with setmaxnreg budgets, against HEAD; then the
# prefill GPU tests on the mode-3 package.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
VARIANTS=$'head|| \nws1r208|-DFLASHINFER_PREFILL_WS=1 -DFLASHINFER_PREFILL_WS_REGS=208\nws3r232|-DFLASHINFER_PREFILL_WS=3 -DFLASHINFER_PREFILL_WS_REGS=232\nws3r240|-DFLASHINFER_PREFILL_WS=3 -DFLASHINFER_PREFILL_WS_REGS=240\nws3k64|-DFLASHINFER_PREFILL_WS=3 -DFLASHINFER_PREFILL_WS_REGS=200 -DFLASHINFER_PREFILL_WS_KEYS=64 -DFLASHINFER_PREFILL_WS_STAGES=4' \
  MODULES=_prefill CASES=benchmarks/sweeps/s23_ws.txt ROUNDS=1 timeout 400 bash scripts/gpu_ab.sh > "$OUT/ab.txt" 2>&1
echo "ab rc $?"
for v in 3:test_prefill.py:50 3:test_batch_prefill.py:130; do
  IFS=: read -r n f lim <<< "$v"
  PYTHONPATH=$PWD/build/ab-pkg-$n timeout $lim python3 -m pytest -q -x -n 15 -p no:cacheprovider tests/python/$f > "$OUT/pytest-pkg$n-$f.txt" 2>&1
  echo "pkg $n $f: rc $? $(tail -1 "$OUT/pytest-pkg$n-$f.txt")"
done
grep -h "builds:\|total:" "$OUT/ab.txt"
tail -30 "$OUT/ab.txt"
