#!/usr/bin/env bash
# Session 24's device calls: an A/B of _decode build variants (VARIANTS, as scripts/gpu_ab.sh takes
# them), timed on CASES for ROUNDS rounds; then test files on variant packages (TESTS: entries
# "n:file file ..." separated by ';', n = the variant's line; TEST_TIMEOUT seconds each, SIGINT so
# pytest still prints its counts); then, with BENCH_PKG=n, benchmarks/final_cases.txt on package n.
# The calls (benchmarks/NOTES.md, session 24):
#   1, 2: VARIANTS=$'head|| \nflat|-DFLASHINFER_DECODE_TC_FLAT=1' CASES=benchmarks/sweeps/s24_flat.txt
#         TESTS="2:test_decode.py test_page_decode.py test_decode_host.py"
#   3: four variants (FLASHINFER_DECODE_FENCE1), CASES=benchmarks/sweeps/s24_flat2.txt
#   4: four variants (FLASHINFER_DECODE_QPF, _NO_ITEM_PF), CASES=benchmarks/sweeps/s24_flat3.txt
#   5: VARIANTS=$'flat|| \nearly|-DFLASHINFER_DECODE_EARLY_PF=1' CASES=benchmarks/sweeps/s24_early.txt
#      TESTS="1:<decode files> test_framework.py test_page.py;2:<decode files>" BENCH_PKG=1
#   7: VARIANTS=$'head|| \nfence-t1|-DFLASHINFER_DECODE_FENCE_T1=1' CASES=benchmarks/sweeps/s24_fence.txt
#      AB_TIMEOUT=220 TEST_TIMEOUT=90 TESTS="2:test_decode.py test_page_decode.py test_decode_host.py test_cascade_wrappers.py"
# (those switches were temporary #ifs of decode_tc.cuh / decode.cuh; the tree has none now).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
MODULES=_decode ROUNDS=${ROUNDS:-2} timeout ${AB_TIMEOUT:-380} bash scripts/gpu_ab.sh > "$OUT/ab.txt" 2>&1
echo "ab rc $?"
IFS=';' read -ra entries <<< "${TESTS:-}"
for e in "${entries[@]}"; do
  n=${e%%:*}
  PYTHONPATH=$PWD/build/ab-pkg-$n timeout -s INT ${TEST_TIMEOUT:-150} python3 -m pytest -q -n 15 -p no:cacheprovider \
    $(printf 'tests/python/%s ' ${e#*:}) > "$OUT/pytest-pkg$n.txt" 2>&1
  echo "pkg $n tests: rc $? $(tail -1 "$OUT/pytest-pkg$n.txt")"
done
if [ -n "${BENCH_PKG:-}" ]; then
  PYTHONPATH=$PWD/build/ab-pkg-$BENCH_PKG timeout ${BENCH_TIMEOUT:-170} python3 -m flashinfer.bench \
    --testlist benchmarks/final_cases.txt --output-path "$OUT/bench.csv" > "$OUT/bench.txt" 2> "$OUT/bench.err"
  echo "bench rc $?"
fi
grep -h "builds:\|total:" "$OUT/ab.txt"
tail -20 "$OUT/ab.txt"
[ -n "${BENCH_PKG:-}" ] && cut -c1-150 "$OUT/bench.txt" | tail -60
exit 0
