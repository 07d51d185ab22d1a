#!/usr/bin/env bash
# Session 22, device call 4: build (pip), ctest, and every GPU test file but the four prefill-family
# files call 3 ran on the same code (test_batch_prefill, test_cascade, test_mla, test_prefill).
# Keeps few files under $OUT (the device tool returns a limited number).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
skip="tests/python/test_batch_prefill.py tests/python/test_cascade.py tests/python/test_mla.py tests/python/test_prefill.py"
files=$(ls tests/python/test_*.py | grep -v -x -F "$(printf '%s\n' $skip)" | tr '\n' ' ')
PYTEST_PATHS="tests/python/test_sampling_cluster.py $(echo $files | tr ' ' '\n' | grep -v test_sampling_cluster | tr '\n' ' ')" \
  PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-400} PYTEST_EXTRA="-n 15" SKIP_BENCH=1 bash scripts/gpu_check.sh > "$OUT/check.txt" 2>&1
echo "check rc $?"
tail -8 "$OUT/check.txt"
grep -E "^FAILED|^ERROR" "$OUT/tests.log" | head -20
grep -E "tests passed|tests failed|Test #|\*\*\*Failed" "$OUT/tests.log" | tail -30
rm -f "$OUT/pytest.xml" "$OUT/build.log"
