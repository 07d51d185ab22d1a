#!/usr/bin/env bash
# Session 23, device call 5 (carried package, as call 4): every GPU test file but the four
# prefill-family files call 4 ran (no ctest: its GPU part is unchanged since session 22).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/build/py312pkg
skip="tests/python/test_batch_prefill.py tests/python/test_cascade.py tests/python/test_mla.py tests/python/test_prefill.py"
files=$(ls tests/python/test_*.py | grep -v -x -F "$(printf '%s\n' $skip)" | tr '\n' ' ')
timeout ${PYTEST_TIMEOUT:-430} python3 -m pytest -q -n 15 -p no:cacheprovider -rs $files > "$OUT/pytest-rest.txt" 2>&1
echo "pytest rc $?: $(tail -1 "$OUT/pytest-rest.txt")"
grep -E "^FAILED|^ERROR|^SKIPPED" "$OUT/pytest-rest.txt" | head -20
