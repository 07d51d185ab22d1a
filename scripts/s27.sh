#!/usr/bin/env bash
# Session 27's device calls (benchmarks/NOTES.md, session 27): bash scripts/s27.sh <call>.
#   early   DecodeMergeKernel launched early (PDL: the decode kernel's CTAs signal
#           launch_dependents when they start; FLASHINFER_DECODE_EARLY_MERGE=0 restores the
#           signal at their end), with the merge rule as planned and with every split plan forced
#           onto the merge kernel (FLASHINFER_DECODE_MERGE=kernel); then the decode tests, as
#           built and with the merge kernel forced (the switch was temporary: reverted after
#           the call, the early signal lost 0.3-0.9 us)
#   copy    the deep plans under the other copy engines and depths (knobs)
#   fence   the in-kernel merge's fences (three builds of _decode)
#   lean    merge_partials' slot addresses by pointer steps (two builds of _decode)
set -uo pipefail
source "$(dirname "$0")/sweep_lib.sh"

case "${1:-}" in
  early)
    build_and_sweep $'late|FLASHINFER_DECODE_EARLY_MERGE=0\nearly|\nlate-kernel|FLASHINFER_DECODE_EARLY_MERGE=0 FLASHINFER_DECODE_MERGE=kernel\nearly-kernel|FLASHINFER_DECODE_MERGE=kernel' \
      benchmarks/sweeps/s27_early.txt early
    F="tests/python/test_decode.py tests/python/test_page_decode.py tests/python/test_decode_host.py tests/python/test_cascade_wrappers.py"
    PYTHONPATH=$PWD/build/devpkg timeout -s INT ${TEST_TIMEOUT:-110} python3 -m pytest -q -n 15 -p no:cacheprovider $F \
      > "$OUT/pytest-default.txt" 2>&1
    echo "tests (default): rc $? $(tail -1 "$OUT/pytest-default.txt")"
    FLASHINFER_DECODE_MERGE=kernel PYTHONPATH=$PWD/build/devpkg timeout -s INT ${TEST_TIMEOUT:-110} python3 -m pytest -q -n 15 \
      -p no:cacheprovider tests/python/test_decode.py tests/python/test_page_decode.py > "$OUT/pytest-kernel.txt" 2>&1
    echo "tests (merge kernel forced): rc $? $(tail -1 "$OUT/pytest-kernel.txt")"
    grep -h "^FAILED\|^ERROR" "$OUT"/pytest-*.txt | head -20
    ;;
  copy)
    # the deep plans (one CTA per SM) under the other copy engines and depths
    # (FLASHINFER_DECODE_COPY / _STAGES), now that they launch at two stages
    build_and_sweep $'boxes|\ncpasync|FLASHINFER_DECODE_COPY=cpasync\nrows|FLASHINFER_DECODE_COPY=rows\nboxes-s3|FLASHINFER_DECODE_STAGES=3\ncpasync-s3|FLASHINFER_DECODE_COPY=cpasync FLASHINFER_DECODE_STAGES=3\nrows-s3|FLASHINFER_DECODE_COPY=rows FLASHINFER_DECODE_STAGES=3' \
      benchmarks/sweeps/s26_deep.txt copy
    PYTHONPATH=$PWD/build/devpkg timeout -s INT ${TEST_TIMEOUT:-100} python3 -m pytest -q -n 15 -p no:cacheprovider \
      tests/python/test_decode.py > "$OUT/pytest-decode.txt" 2>&1
    echo "test_decode.py: rc $? $(tail -1 "$OUT/pytest-decode.txt")"
    grep -h "^FAILED\|^ERROR" "$OUT/pytest-decode.txt" | head
    ;;
  fence)
    # the in-kernel merge's release / acquire (merge_if_last): every thread's fence.sc (head),
    # every thread's fence.acq_rel, or thread 0's atom.acq_rel after the CTA barrier (CUTLASS's
    # pattern); -DFLASHINFER_DECODE_FENCE_AB=1 / 2, a temporary #if
    VARIANTS=$'head|| \nacqrel|-DFLASHINFER_DECODE_FENCE_AB=1\natom|-DFLASHINFER_DECODE_FENCE_AB=2' MODULES=_decode \
      CASES=benchmarks/sweeps/s27_fence.txt AB_TIMEOUT=${AB_TIMEOUT:-400} TEST_TIMEOUT=${TEST_TIMEOUT:-70} \
      TESTS="${TESTS:-2:test_decode.py test_page_decode.py;3:test_decode.py test_page_decode.py}" bash scripts/s24_ab.sh
    ;;
  lean)
    # merge_partials with pointer steps (the tree) against the 64-bit index products per slot
    # (-DFLASHINFER_DECODE_MERGE_OLD=1, a temporary #if); the decode tests on the tree's build
    VARIANTS=$'lean|| \nold|-DFLASHINFER_DECODE_MERGE_OLD=1' MODULES=_decode \
      CASES=benchmarks/sweeps/s27_lean.txt AB_TIMEOUT=${AB_TIMEOUT:-330} TEST_TIMEOUT=${TEST_TIMEOUT:-80} \
      TESTS="${TESTS:-1:test_decode.py test_page_decode.py test_cascade_wrappers.py}" bash scripts/s24_ab.sh
    ;;
  *)
    echo "usage: bash scripts/s27.sh early|copy|fence|lean" >&2
    exit 2
    ;;
esac
