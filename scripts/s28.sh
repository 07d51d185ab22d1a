#!/usr/bin/env bash
# Session 28's device calls (benchmarks/NOTES.md, session 28): bash scripts/s28.sh <call>.
#   diet    the tree's package (all modules) against the session's starting decode module
#           (ab_old/: a copy of c93e7ff's sources, _decode only, swapped into a copy of the
#           package): the split epilogue's and merge's instruction diet; then the decode tests
#           on the tree's package
set -uo pipefail
source "$(dirname "$0")/sweep_lib.sh"

case "${1:-}" in
  diet)
    t0=$(date +%s)
    MODULES="$ALL" TEST_TIMEOUT=1 bash scripts/gpu_dev.sh > "$OUT/dev.txt" 2>&1 &
    (cmake -S ab_old -B build/ab-old -G Ninja -DFLASHINFER_BUILD_PYTHON=ON -DFLASHINFER_BUILD_TESTS=OFF \
       -DPython_EXECUTABLE="$(command -v python3)" > "$OUT/old-configure.log" 2>&1 &&
     cmake --build build/ab-old -j 8 --target _decode > "$OUT/old-build.log" 2>&1) &
    wait
    echo "builds: $(( $(date +%s) - t0 )) s"; head -3 "$OUT/dev.txt"; tail -2 "$OUT/old-build.log"
    rm -rf build/oldpkg && cp -r build/devpkg build/oldpkg && cp build/ab-old/bindings/_decode.*.so build/oldpkg/flashinfer/
    NO_BUILD=1 build_and_sweep $'new|\nold|PYTHONPATH='"$PWD"'/build/oldpkg' benchmarks/sweeps/s28_diet.txt diet
    F="tests/python/test_decode.py tests/python/test_page_decode.py tests/python/test_decode_host.py tests/python/test_cascade_wrappers.py"
    PYTHONPATH=$PWD/build/devpkg timeout -s INT ${TEST_TIMEOUT:-120} python3 -m pytest -q -n 15 -p no:cacheprovider $F \
      > "$OUT/pytest-decode.txt" 2>&1
    echo "decode tests: rc $? $(tail -1 "$OUT/pytest-decode.txt")"
    grep -h "^FAILED\|^ERROR" "$OUT/pytest-decode.txt" | head -20
    ;;
  *)
    echo "usage: bash scripts/s28.sh diet" >&2
    exit 2
    ;;
esac
