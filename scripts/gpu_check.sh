#!/usr/bin/env bash
# One command for a GPU machine (e.g. the H200): build with all cores, run ctest + pytest on
# the GPU, the benchmark's default suite, and print a short summary last. Full logs go to
# $OUT (default ./out). Extra bench cases: BENCH_ARGS="--testlist file". PYTEST_EXTRA adds pytest
# arguments ("-n 14"), PYTEST_PATHS picks test files, SKIP_BENCH=1 / FLASHINFER_TEST_NO_CPP=1
# skip parts: the whole suite needs ~470 s at -n 14 on the H200, so within a 600 s call split it
# (benchmarks/NOTES.md, session 19), or run it alone with PYTEST_FIRST (the files to run first, e.g.
# those of the kernels that changed; every other tests/python file follows) and PYTEST_TIMEOUT
# (seconds; pytest is interrupted and still prints its counts); the slowest files follow them
# (SLOW below), then the rest. Session 20's whole-suite call was
#   PYTEST_FIRST="tests/python/test_batch_prefill.py ..." PYTEST_TIMEOUT=455 PYTEST_EXTRA="-n 15" \
#     FLASHINFER_TEST_NO_CPP=1 SKIP_BENCH=1 bash scripts/gpu_check.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
JOBS=$(nproc)
export CMAKE_BUILD_PARALLEL_LEVEL=$JOBS
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
export CUDACXX=${CUDACXX:-$(command -v nvcc)}

nvidia-smi --query-gpu=name,compute_cap,driver_version,clocks.sm,clocks.mem --format=csv > "$OUT/gpu.txt" 2>&1
python3 -c "import torch; p = torch.cuda.get_device_properties(0); print(f'SMs {p.multi_processor_count}, L2 {p.L2_cache_size / 2**20:.0f} MiB')" >> "$OUT/gpu.txt" 2>&1

echo "== build (pip, $JOBS cores, ptxas -v)"
rm -rf build
t0=$(date +%s.%N)
FLASHINFER_PTXAS_VERBOSE=ON python3 -m pip install -v --no-build-isolation --no-deps . > "$OUT/build.log" 2>&1
build_rc=$?
build_s=$(python3 -c "print(f'{$(date +%s.%N) - $t0:.1f}')")
python3 scripts/ptxas_report.py < "$OUT/build.log" > "$OUT/ptxas.txt" 2>&1
ptxas_rc=$?

# The files with the longest single tests go right after PYTEST_FIRST: pytest-xdist hands tests
# out in the order given, and a 100-230 s test that starts late sets the suite's end (session 29:
# 5560 s of test time over 15 workers, test_sampling's longest 227 s).
SLOW="tests/python/test_sampling.py tests/python/test_sampling_cluster.py tests/python/test_batch_prefill.py tests/python/test_decode.py"
if [ -z "${PYTEST_PATHS:-}" ]; then
  first=$(printf '%s\n' ${PYTEST_FIRST:-} $SLOW | awk '!seen[$0]++')
  rest=$(ls tests/python/test_*.py | grep -v -x -F "$first")
  export PYTEST_PATHS="$(echo $first $rest)"
fi
echo "== tests"
FLASHINFER_TEST_NO_DEPS=1 FLASHINFER_TEST_NO_BUILD=1 PYTEST_ARGS="--junitxml=$OUT/pytest.xml ${PYTEST_EXTRA:-}" bash scripts/test.sh > "$OUT/tests.log" 2>&1
test_rc=$?

bench_rc=0
if [ -z "${SKIP_BENCH:-}" ]; then
  echo "== host overhead"
  python3 benchmarks/host_overhead.py > "$OUT/host.txt" 2>&1
  echo "== bench"
  python3 -m flashinfer.bench ${BENCH_ARGS:-} --output-path "$OUT/bench.csv" > "$OUT/bench.txt" 2> "$OUT/bench.err"
  bench_rc=$?
fi

echo
echo "================ summary ================"
sed -n '2p;$p' "$OUT/gpu.txt"
echo "package build: ${build_s}s (rc=$build_rc, $JOBS cores)"
tail -1 "$OUT/ptxas.txt"
grep -E "tests passed|tests failed" "$OUT/tests.log" | tail -1
grep -E "rmsnorm_example" "$OUT/tests.log" | tail -1
grep -E "^(=+ )?[0-9]+ (passed|failed)|passed|failed" "$OUT/tests.log" | grep -E "in [0-9.]+s" | tail -1
grep -E "rc=" "$OUT/tests.log" | tail -1
if [ -z "${SKIP_BENCH:-}" ]; then
  echo "bench (rc=$bench_rc):"
  cat "$OUT/bench.txt"
  tail -3 "$OUT/bench.err"
  cat "$OUT/host.txt"
fi
exit $(( build_rc || test_rc || bench_rc ))
