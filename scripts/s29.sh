#!/usr/bin/env bash
# Session 29's device calls (benchmarks/NOTES.md, session 29): bash scripts/s29.sh <call>.
#   ab   _decode variants (temporary #ifs): "old" (-DFLASHINFER_S29_OLD=1: resolve_item's
#        sub-group branch, the CUDA-core loop's exp2f), "new" (div_mod, fast_exp2), "shfl"
#        (-DFLASHINFER_DECODE_PT_SHFL=1: the tensor-core loop's P^T by shuffles, not through
#        shared memory; also "new"'s changes), timed on benchmarks/sweeps/s29_ab.txt, two
#        rounds; then the decode test files on the "shfl" package (call 1; the switches were
#        temporary, the tree has none now)
set -uo pipefail
case "${1:-}" in
  ab)
    VARIANTS=$'old|-DFLASHINFER_S29_OLD=1\nnew|| \nshfl|-DFLASHINFER_DECODE_PT_SHFL=1' \
      CASES=benchmarks/sweeps/s29_ab.txt AB_TIMEOUT=${AB_TIMEOUT:-330} TEST_TIMEOUT=${TEST_TIMEOUT:-120} \
      TESTS="${TESTS:-3:test_decode.py test_page_decode.py test_decode_host.py test_cascade_wrappers.py}" \
      bash scripts/s24_ab.sh
    ;;
  *)
    echo "usage: bash scripts/s29.sh ab" >&2
    exit 2
    ;;
esac
