#!/usr/bin/env bash
# Session 30's device calls (benchmarks/NOTES.md, session 30): bash scripts/s30.sh <call>.
#   check  the package built; whether torch publishes DLPack's C exchange table and the bindings
#          take it; benchmarks/host_overhead.py (the table's route against capsules, in one
#          process); then every test file (the tensor-argument path of every binding changed),
#          tensor_arg / framework / validation files and the slowest first, until PYTEST_TIMEOUT
#   stream the package built; host_overhead.py; every test file but test_sampling_cluster (its
#          binding path is test_sampling's), without test_sampling's eight longest tests
#          (the 128256 x 512 set-membership draws and the early-accept modes, 40-250 s each),
#          until PYTEST_TIMEOUT (call 4: the stream asked through the exchange table)
#   rest   the package built unless installed (a warm machine of `check`), the test files FILES,
#          then the closing bench (benchmarks/final_cases.txt, with its host column)
set -uo pipefail
source "$(dirname "$0")/sweep_lib.sh"

# tests/python's files, $1 (names) first, then the rest but $2 (names)
test_files() {
  printf 'tests/python/%s\n' $1
  ls tests/python/test_*.py | grep -v -x -F "$(printf 'tests/python/%s\n' $1 ${2:-})"
}

case "${1:-}" in
  check)
    pip_build || exit 1
    python3 -c "import torch; from flashinfer import _cuda; print('torch', torch.__version__, \
'table:', hasattr(torch.Tensor, '__dlpack_c_exchange_api__'), hasattr(torch.Tensor, '__c_dlpack_exchange_api__'), \
'taken:', _cuda.takes_exchange_api(torch.Tensor))"
    python3 benchmarks/host_overhead.py > "$OUT/host.txt" 2>&1
    cat "$OUT/host.txt"
    run_tests ${PYTEST_TIMEOUT:-380} $(test_files "test_tensor_arg.py test_framework.py test_validation.py
      test_sampling.py test_sampling_cluster.py test_batch_prefill.py test_decode.py")
    ;;
  stream)
    pip_build || exit 1
    python3 benchmarks/host_overhead.py > "$OUT/host.txt" 2>&1
    cat "$OUT/host.txt"
    skip=()
    for k in top_p top_k min_p joint plain top_k_first; do
      skip+=(--deselect "tests/python/test_sampling.py::test_draws_stay_in_the_set[$k-128256-512]")
    done
    skip+=(--deselect "tests/python/test_sampling.py::test_top_p_early_accept_modes[0]"
           --deselect "tests/python/test_sampling.py::test_top_p_early_accept_modes[1]")
    run_tests ${PYTEST_TIMEOUT:-300} "${skip[@]}" $(test_files "test_tensor_arg.py test_framework.py test_decode.py
      test_sampling.py test_batch_prefill.py" test_sampling_cluster.py)
    ;;
  rest)
    python3 -c "import flashinfer" 2>/dev/null || pip_build || exit 1
    [ -n "${FILES:-}" ] && run_tests ${TEST_TIMEOUT:-300} $FILES
    timeout ${BENCH_TIMEOUT:-240} python3 -m flashinfer.bench --testlist benchmarks/final_cases.txt \
      --output-path "$OUT/bench.csv" > "$OUT/bench.txt" 2> "$OUT/bench.err"
    echo "bench rc $?"
    cut -c1-160 "$OUT/bench.txt"
    tail -3 "$OUT/bench.err"
    ;;
  *)
    echo "usage: bash scripts/s30.sh check|stream|rest" >&2
    exit 2
    ;;
esac
