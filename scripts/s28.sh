#!/usr/bin/env bash
# Session 28's device calls (benchmarks/NOTES.md, session 28): bash scripts/s28.sh <call>.
#   diet    the tree's package (all modules) against an older tree's modules OLD_MODULES (default
#           _decode) swapped into a copy of it (ab_old/: `git archive <commit> | tar -x -C ab_old`,
#           not committed), over CASES (default benchmarks/sweeps/s28_diet.txt); then the decode
#           tests on the tree's package. Call 1: ab_old = c93e7ff (the split epilogue's and
#           merge's instruction diet, 2059fc6); call 2: ab_old = 2059fc6, OLD_MODULES="_decode
#           _cascade", CASES=benchmarks/sweeps/s28_diet2.txt (page splits by shifts, state.h's
#           merge weights on the special-function unit)
#   fence   the tensor-core loop's per-tile fence.proxy.async dropped (A/B, then the decode tests)
set -uo pipefail
source "$(dirname "$0")/sweep_lib.sh"

case "${1:-}" in
  diet)
    t0=$(date +%s)
    MODULES="$ALL" TEST_TIMEOUT=1 bash scripts/gpu_dev.sh > "$OUT/dev.txt" 2>&1 &
    (cmake -S ab_old -B build/ab-old -G Ninja -DFLASHINFER_BUILD_PYTHON=ON -DFLASHINFER_BUILD_TESTS=OFF \
       -DPython_EXECUTABLE="$(command -v python3)" > "$OUT/old-configure.log" 2>&1 &&
     cmake --build build/ab-old -j 8 --target ${OLD_MODULES:-_decode} > "$OUT/old-build.log" 2>&1) &
    wait
    echo "builds: $(( $(date +%s) - t0 )) s"; head -3 "$OUT/dev.txt"; tail -2 "$OUT/old-build.log"
    rm -rf build/oldpkg && cp -r build/devpkg build/oldpkg
    for m in ${OLD_MODULES:-_decode}; do cp build/ab-old/bindings/$m.*.so build/oldpkg/flashinfer/; done
    NO_BUILD=1 build_and_sweep $'new|\nold|PYTHONPATH='"$PWD"'/build/oldpkg' ${CASES:-benchmarks/sweeps/s28_diet.txt} diet
    F=${TEST_FILES:-"tests/python/test_decode.py tests/python/test_page_decode.py tests/python/test_decode_host.py tests/python/test_cascade_wrappers.py"}
    PYTHONPATH=$PWD/build/devpkg timeout -s INT ${TEST_TIMEOUT:-120} python3 -m pytest -q -n 15 -p no:cacheprovider $F \
      > "$OUT/pytest-decode.txt" 2>&1
    echo "decode tests: rc $? $(tail -1 "$OUT/pytest-decode.txt")"
    grep -h "^FAILED\|^ERROR" "$OUT/pytest-decode.txt" | head -20
    ;;
  fence)
    # the tensor-core loop without the per-tile fence.proxy.async (the tree) against with it
    # (-DFLASHINFER_DECODE_TILE_FENCE=1, a temporary #if); the decode tests on the tree's build
    VARIANTS=$'nofence|| \nfence|-DFLASHINFER_DECODE_TILE_FENCE=1' MODULES=_decode \
      CASES=benchmarks/sweeps/s28_diet2.txt AB_TIMEOUT=${AB_TIMEOUT:-330} TEST_TIMEOUT=${TEST_TIMEOUT:-100} \
      TESTS="${TESTS:-1:test_decode.py test_page_decode.py test_cascade_wrappers.py}" bash scripts/s24_ab.sh
    ;;
  *)
    echo "usage: bash scripts/s28.sh diet|fence" >&2
    exit 2
    ;;
esac
