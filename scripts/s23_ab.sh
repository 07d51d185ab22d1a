#!/usr/bin/env bash
# Session 23's device calls 1-3: an A/B of prefill build variants (VARIANTS, as scripts/gpu_ab.sh
# takes them; MODULES _prefill, cases benchmarks/sweeps/s23_ws.txt, one round), then GPU test files
# on variant packages (TESTS: "package:file:timeout_s" words, package = the variant's line number).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
MODULES=_prefill CASES=benchmarks/sweeps/s23_ws.txt ROUNDS=1 timeout ${AB_TIMEOUT:-400} bash scripts/gpu_ab.sh > "$OUT/ab.txt" 2>&1
echo "ab rc $?"
for v in ${TESTS:-}; do
  IFS=: read -r n f lim <<< "$v"
  PYTHONPATH=$PWD/build/ab-pkg-$n timeout "$lim" python3 -m pytest -q -x -n 15 -p no:cacheprovider tests/python/$f > "$OUT/pytest-pkg$n-$f.txt" 2>&1
  echo "pkg $n $f: rc $? $(tail -1 "$OUT/pytest-pkg$n-$f.txt")"
done
grep -h "builds:\|total:" "$OUT/ab.txt"
tail -30 "$OUT/ab.txt"
