#!/usr/bin/env bash
# Session 26's device calls (benchmarks/NOTES.md, session 26): bash scripts/s26.sh <call>.
#   merge   A/B of the merge of split decode states: the old DecodeMergeKernel (one 16-thread
#           group per row; -DFLASHINFER_DECODE_MERGE_ROWS16, a temporary #if) against the slot-lane
#           one, each under FLASHINFER_DECODE_MERGE=last / kernel / auto, on
#           benchmarks/sweeps/s26_merge.txt; then the decode tests on the new build
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
case "${1:-}" in
  merge)
    P2=$PWD/build/ab-pkg-2
    VARIANTS=$'rows16|-DFLASHINFER_DECODE_MERGE_ROWS16=1\nlanes|' \
      EXTRA_CONFIGS="rows16-last|PYTHONPATH=$PWD/build/ab-pkg-1 FLASHINFER_DECODE_MERGE=last"$'\n'"lanes-last|PYTHONPATH=$P2 FLASHINFER_DECODE_MERGE=last"$'\n'"lanes-kernel|PYTHONPATH=$P2 FLASHINFER_DECODE_MERGE=kernel" \
      CASES=benchmarks/sweeps/s26_merge.txt AB_TIMEOUT=${AB_TIMEOUT:-420} TEST_TIMEOUT=${TEST_TIMEOUT:-120} \
      TESTS="${TESTS:-2:test_decode.py test_page_decode.py test_decode_host.py test_cascade_wrappers.py}" bash scripts/s24_ab.sh
    ;;
  *)
    echo "usage: bash scripts/s26.sh merge" >&2
    exit 2
    ;;
esac
