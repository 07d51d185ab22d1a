#!/usr/bin/env bash
# Session 24, device call 1: A/B of the tensor-core decode kernel's cross-item pipeline
# (FLASHINFER_DECODE_TC_FLAT 0 = head, 1 = flat; _decode rebuilt), cases
# benchmarks/sweeps/s24_flat.txt, two rounds; then the decode test files on the flat package.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
VARIANTS=$'head|| \nflat|-DFLASHINFER_DECODE_TC_FLAT=1' MODULES=_decode CASES=benchmarks/sweeps/s24_flat.txt \
  ROUNDS=${ROUNDS:-2} timeout ${AB_TIMEOUT:-380} bash scripts/gpu_ab.sh > "$OUT/ab.txt" 2>&1
echo "ab rc $?"
for f in ${TEST_FILES:-test_decode.py test_page_decode.py test_decode_host.py}; do
  PYTHONPATH=$PWD/build/ab-pkg-2 timeout ${TEST_TIMEOUT:-150} python3 -m pytest -q -x -n 15 -p no:cacheprovider \
    tests/python/$f > "$OUT/pytest-$f.txt" 2>&1
  echo "flat $f: rc $? $(tail -1 "$OUT/pytest-$f.txt")"
done
grep -h "builds:\|total:" "$OUT/ab.txt"
tail -40 "$OUT/ab.txt"
