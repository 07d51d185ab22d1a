#!/usr/bin/env bash
# Session 33's device calls (benchmarks/NOTES.md, session 33): bash scripts/s33.sh <call>.
# Both run the package prebuilt here (scripts/build_carry_pkg.sh; the call carries build/py312pkg),
# so no device time goes to the pip build.
#   suite  every tests/python file on the GPU (the slowest files first), until TEST_TIMEOUT
#          (default 565 s): the first GPU run of session 32's host checks
#   final  host_overhead.py, the closing bench (benchmarks/final_cases.txt), then the tests the
#          suite call did not reach (LEFT: a file of node ids from scripts/junit_union.py --left)
#          or the test files TESTS
set -uo pipefail
source "$(dirname "$0")/sweep_lib.sh"
export PYTHONPATH=$PWD/build/py312pkg
python3 -c "import flashinfer, flashinfer._norm; print('package', flashinfer.__version__, flashinfer.__file__)" || exit 1
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader

case "${1:-}" in
  suite)
    SLOW="tests/python/test_sampling.py tests/python/test_sampling_cluster.py tests/python/test_batch_prefill.py tests/python/test_decode.py"
    rest=$(ls tests/python/test_*.py | grep -v -x -F "$(printf '%s\n' $SLOW)")
    run_tests ${TEST_TIMEOUT:-565} $SLOW $rest
    ;;
  final)
    timeout 150 python3 benchmarks/host_overhead.py > "$OUT/host.txt" 2>&1
    echo "host rc $?"
    timeout ${BENCH_TIMEOUT:-220} python3 -m flashinfer.bench --testlist benchmarks/final_cases.txt \
      --output-path "$OUT/bench.csv" > "$OUT/bench.txt" 2> "$OUT/bench.err"
    echo "bench rc $?"
    if [ -n "${LEFT:-}" ] && [ -s "$LEFT" ]; then
      mapfile -t ids < "$LEFT"
      run_tests ${TEST_TIMEOUT:-200} "${ids[@]}"
    elif [ -n "${TESTS:-}" ]; then
      run_tests ${TEST_TIMEOUT:-200} $TESTS
    fi
    cut -c1-150 "$OUT/bench.txt"
    cat "$OUT/host.txt"
    ;;
  *)
    echo "usage: bash scripts/s33.sh suite|final" >&2
    exit 2
    ;;
esac
