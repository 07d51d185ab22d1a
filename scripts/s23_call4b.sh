#!/usr/bin/env bash
# Session 23, device call 4b (carried package, as call 4) after the prefill_single_ws rule:
# test_prefill.py and the single-prefill bench (benchmarks/sweeps/s23_single.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/build/py312pkg
timeout 100 python3 -m pytest -q -n 15 -p no:cacheprovider tests/python/test_prefill.py > "$OUT/pytest-prefill.txt" 2>&1
echo "test_prefill rc $?: $(tail -1 "$OUT/pytest-prefill.txt")"
grep -E "^FAILED|^ERROR" "$OUT/pytest-prefill.txt" | head -10
timeout 100 python3 -m flashinfer.bench --testlist benchmarks/sweeps/s23_single.txt --no-ref --reps 30 > "$OUT/bench.txt" 2> "$OUT/bench.err"
echo "bench rc $?"
cut -c1-120 "$OUT/bench.txt"
tail -3 "$OUT/bench.err"
