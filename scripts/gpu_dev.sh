#!/usr/bin/env bash
# Development loop on a GPU machine when only some families should be built: builds the
# listed extension modules with CMake (all cores), assembles a package under build/devpkg,
# runs the listed pytest files/args (within TEST_TIMEOUT seconds) and bench arguments against it,
# summary last.
#   MODULES="_cuda _norm _decode" TESTS="tests/python/test_decode.py" BENCH="--routine batch_decode" \
#     bash scripts/gpu_dev.sh
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONUNBUFFERED=1
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
export CUDACXX=${CUDACXX:-$(command -v nvcc)}
B=build/dev
t0=$(date +%s)
cmake -S . -B $B -G Ninja -DFLASHINFER_BUILD_PYTHON=ON -DFLASHINFER_BUILD_TESTS=OFF -DFLASHINFER_PTXAS_VERBOSE=ON \
  -DPython_EXECUTABLE="$(command -v python3)" > "$OUT/dev-configure.log" 2>&1 || { tail -20 "$OUT/dev-configure.log"; exit 1; }
cmake --build $B -j "$(nproc)" --target ${MODULES:-_cuda _norm _activation} > "$OUT/dev-build.log" 2>&1
build_rc=$?
echo "build: $(( $(date +%s) - t0 )) s rc=$build_rc"
[ $build_rc -eq 0 ] || { grep -E "error" "$OUT/dev-build.log" | head -20; exit 1; }
python3 scripts/ptxas_report.py < "$OUT/dev-build.log" > "$OUT/dev-ptxas.txt"
rm -rf build/devpkg && mkdir -p build/devpkg && cp -r python/flashinfer build/devpkg/ && cp $B/bindings/*.so build/devpkg/flashinfer/
export PYTHONPATH=$PWD/build/devpkg
test_rc=0
if [ -n "${TESTS:-}" ]; then
  timeout "${TEST_TIMEOUT:-1200}" python3 -m pytest -q --maxfail=40 --tb=line --durations=30 -p no:cacheprovider ${TESTS} \
    > "$OUT/dev-pytest.log" 2>&1
  test_rc=$?
fi
if [ -n "${HOST:-}" ]; then python3 benchmarks/host_overhead.py > "$OUT/dev-host.txt" 2>&1; fi
if [ -n "${BENCH:-}" ]; then
  python3 -m flashinfer.bench ${BENCH} --output-path "$OUT/dev-bench.csv" > "$OUT/dev-bench.txt" 2> "$OUT/dev-bench.err"
fi
echo "================ summary ================"
tail -1 "$OUT/dev-ptxas.txt"
grep -E "SPILLS" "$OUT/dev-ptxas.txt" | head -5
[ -n "${TESTS:-}" ] && { grep -E "^(FAILED|ERROR)" "$OUT/dev-pytest.log" | head -15; tail -1 "$OUT/dev-pytest.log"; }
[ -n "${HOST:-}" ] && cat "$OUT/dev-host.txt"
[ -n "${BENCH:-}" ] && { cat "$OUT/dev-bench.txt"; tail -3 "$OUT/dev-bench.err"; }
exit $test_rc
