#!/usr/bin/env bash
# Session 24, device call 5: A/B of the second work item's descriptor asked for at kernel start
# (early, FLASHINFER_DECODE_EARLY_PF=1) or after the first is read (flat, the tree's default);
# cases benchmarks/sweeps/s24_early.txt, two rounds. Then the decode test files on both packages,
# and the closing bench (benchmarks/final_cases.txt, with references and host timing) on the first.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
VARIANTS=$'flat|| \nearly|-DFLASHINFER_DECODE_EARLY_PF=1' MODULES=_decode CASES=benchmarks/sweeps/s24_early.txt \
  ROUNDS=2 timeout 220 bash scripts/gpu_ab.sh > "$OUT/ab.txt" 2>&1
echo "ab rc $?"
T1="test_decode.py test_page_decode.py test_decode_host.py test_cascade_wrappers.py test_framework.py test_page.py"
T2="test_decode.py test_page_decode.py test_decode_host.py test_cascade_wrappers.py"
for n in 1 2; do
  T=$T1; [ $n -eq 2 ] && T=$T2
  PYTHONPATH=$PWD/build/ab-pkg-$n timeout -s INT ${TEST_TIMEOUT:-80} python3 -m pytest -q -n 15 -p no:cacheprovider \
    $(printf 'tests/python/%s ' $T) > "$OUT/pytest-pkg$n.txt" 2>&1
  echo "pkg $n tests: rc $? $(tail -1 "$OUT/pytest-pkg$n.txt")"
done
PYTHONPATH=$PWD/build/ab-pkg-1 timeout ${BENCH_TIMEOUT:-170} python3 -m flashinfer.bench --testlist benchmarks/final_cases.txt \
  --output-path "$OUT/bench.csv" > "$OUT/bench.txt" 2> "$OUT/bench.err"
echo "bench rc $?"
grep -h "builds:\|total:" "$OUT/ab.txt"
tail -9 "$OUT/ab.txt"
cut -c1-150 "$OUT/bench.txt" | tail -60
