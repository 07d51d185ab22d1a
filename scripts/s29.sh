#!/usr/bin/env bash
# Session 29's device calls (benchmarks/NOTES.md, session 29): bash scripts/s29.sh <call>.
#   ab   _decode variants (temporary #ifs): "old" (-DFLASHINFER_S29_OLD=1: resolve_item's
#        sub-group branch, the CUDA-core loop's exp2f), "new" (div_mod, fast_exp2), "shfl"
#        (-DFLASHINFER_DECODE_PT_SHFL=1: the tensor-core loop's P^T by shuffles, not through
#        shared memory; also "new"'s changes), timed on benchmarks/sweeps/s29_ab.txt, two
#        rounds; then the decode test files on the "shfl" package (call 1; the switches were
#        temporary, the tree has none now)
#   check  scripts/gpu_check.sh without the bench: the build, then the test files of the decode
#          changes and those session 28 did not reach first, the rest until PYTEST_TIMEOUT (call 2)
#   rest   on the warm machine of `check` (its installed package): the test files FILES, then
#          benchmarks/host_overhead.py and the closing bench (benchmarks/final_cases.txt) (call 3)
#   goals  a fresh machine: the decode goal cases three times, then test files (call 4)
#   ids    the box engine's page-id loads with ld.global.nc.L2::256B against plain ones (call 5;
#          the hint and its FLASHINFER_DECODE_IDS switch were dropped after it, the tree has
#          neither now; call 5 ran its own copy of the two-round loop, whose config reversal lost
#          a line, so its second round timed the hint twice; it uses sweep_lib.sh's
#          build_and_sweep now)
set -uo pipefail
source "$(dirname "$0")/sweep_lib.sh"

case "${1:-}" in
  ab)
    VARIANTS=$'old|-DFLASHINFER_S29_OLD=1\nnew|| \nshfl|-DFLASHINFER_DECODE_PT_SHFL=1' \
      CASES=benchmarks/sweeps/s29_ab.txt AB_TIMEOUT=${AB_TIMEOUT:-330} TEST_TIMEOUT=${TEST_TIMEOUT:-120} \
      TESTS="${TESTS:-3:test_decode.py test_page_decode.py test_decode_host.py test_cascade_wrappers.py}" \
      bash scripts/s24_ab.sh
    ;;
  check)
    PYTEST_FIRST="$(printf 'tests/python/%s ' test_decode.py test_page_decode.py test_decode_host.py \
      test_cascade_wrappers.py test_cascade.py test_page.py test_validation.py test_topk.py \
      test_sampling_validation.py test_sampling.py test_sampling_cluster.py test_batch_prefill.py test_prefill.py)" \
      PYTEST_TIMEOUT=${PYTEST_TIMEOUT:-420} PYTEST_EXTRA="-n 15" FLASHINFER_TEST_NO_CPP=1 SKIP_BENCH=1 \
      bash scripts/gpu_check.sh
    ;;
  rest)
    [ -n "${FILES:-}" ] && run_tests ${TEST_TIMEOUT:-300} $FILES
    python3 benchmarks/host_overhead.py > "$OUT/host.txt" 2>&1
    timeout ${BENCH_TIMEOUT:-240} python3 -m flashinfer.bench --testlist benchmarks/final_cases.txt \
      --output-path "$OUT/bench.csv" > "$OUT/bench.txt" 2> "$OUT/bench.err"
    echo "bench rc $?"
    cut -c1-160 "$OUT/bench.txt"
    tail -3 "$OUT/bench.err"
    cat "$OUT/host.txt"
    ;;
  goals)
    # a fresh machine: the package built, the decode goal cases (benchmarks/sweeps/s29_goals.txt,
    # with the PyTorch reference) three times, GPU clocks and temperature before and after, then
    # the test files FILES until TEST_TIMEOUT (call 4)
    q() { nvidia-smi --query-gpu=clocks.sm,clocks.mem,temperature.gpu,power.draw --format=csv,noheader; }
    echo "gpu before: $(q)"
    pip_build || exit 1
    for r in 1 2 3; do
      python3 -m flashinfer.bench --testlist benchmarks/sweeps/s29_goals.txt > "$OUT/goals$r.txt" 2> "$OUT/goals$r.err"
      echo "round $r rc $? (gpu: $(q))"
      cut -c1-150 "$OUT/goals$r.txt" | grep -v "^\s*\[" 
    done
    [ -n "${FILES:-}" ] && run_tests ${TEST_TIMEOUT:-200} $FILES
    echo "gpu after: $(q)"
    ;;
  ids)
    # the package built once; the box engine's page-id loads with the L2::256B hint (default)
    # against plain loads (FLASHINFER_DECODE_IDS=plain), two rounds in opposite orders on
    # benchmarks/sweeps/s29_ids.txt; then the decode test files (call 5)
    pip_build || exit 1
    NO_BUILD=1 build_and_sweep $'l2|\nplain|FLASHINFER_DECODE_IDS=plain' benchmarks/sweeps/s29_ids.txt ids
    run_tests ${TEST_TIMEOUT:-90} tests/python/test_decode.py tests/python/test_page_decode.py
    ;;
  *)
    echo "usage: bash scripts/s29.sh ab|check|rest|goals|ids" >&2
    exit 2
    ;;
esac
