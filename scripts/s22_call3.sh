#!/usr/bin/env bash
# Session 22, device call 3: build the package (pip), the prefill-family GPU tests (batch prefill
# with split-KV, cascade, MLA on wgmma, single prefill with overlap mode 2 at head_dim 256), then
# the split-KV / cascade bench (benchmarks/sweeps/s22_split.txt).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
PYTEST_PATHS="tests/python/test_batch_prefill.py tests/python/test_cascade.py tests/python/test_mla.py tests/python/test_prefill.py" \
  PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-300} PYTEST_EXTRA="-n 15" FLASHINFER_TEST_NO_CPP=1 SKIP_BENCH=1 \
  bash scripts/gpu_check.sh > "$OUT/check.txt" 2>&1
echo "check rc $?"
tail -4 "$OUT/check.txt"
grep -E "^FAILED" "$OUT/tests.log" | head -20
timeout 150 python3 -m flashinfer.bench --testlist benchmarks/sweeps/s22_split.txt --no-ref --reps 30 \
  --output-path "$OUT/split.csv" > "$OUT/split.txt" 2> "$OUT/split.err"
echo "bench rc $?"
cut -c1-150 "$OUT/split.txt" | tail -20
tail -3 "$OUT/split.err"
