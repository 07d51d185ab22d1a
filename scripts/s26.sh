#!/usr/bin/env bash
# Session 26's device calls (benchmarks/NOTES.md, session 26): bash scripts/s26.sh <call>.
#   merge   A/B of the merge of split decode states: the old DecodeMergeKernel (one 16-thread
#           group per row; -DFLASHINFER_DECODE_MERGE_ROWS16, a temporary #if, gone now) against the slot-lane
#           one, each under FLASHINFER_DECODE_MERGE=last / kernel / auto, on
#           benchmarks/sweeps/s26_merge.txt; then the decode tests on the new build
#   deep    the deep plans (1 x 4096 ...) with fewer, longer chunks and deeper pipelines (knobs)
#   knobs   the deep plans at 2 / 3 stages; the long requests' split under the planner's knobs
#   big     the larger plans at 2 stages
set -uo pipefail
source "$(dirname "$0")/sweep_lib.sh"

case "${1:-}" in
  merge)
    P2=$PWD/build/ab-pkg-2
    VARIANTS=$'rows16|-DFLASHINFER_DECODE_MERGE_ROWS16=1\nlanes|' \
      EXTRA_CONFIGS="rows16-last|PYTHONPATH=$PWD/build/ab-pkg-1 FLASHINFER_DECODE_MERGE=last"$'\n'"lanes-last|PYTHONPATH=$P2 FLASHINFER_DECODE_MERGE=last"$'\n'"lanes-kernel|PYTHONPATH=$P2 FLASHINFER_DECODE_MERGE=kernel" \
      CASES=benchmarks/sweeps/s26_merge.txt AB_TIMEOUT=${AB_TIMEOUT:-420} TEST_TIMEOUT=${TEST_TIMEOUT:-120} \
      TESTS="${TESTS:-2:test_decode.py test_page_decode.py test_decode_host.py test_cascade_wrappers.py}" bash scripts/s24_ab.sh
    ;;
  deep)
    # fewer, longer chunks with deeper pipelines on the deep plans (FLASHINFER_DECODE_MIN_CHUNK /
    # _STAGES): what the streaming costs at 64 or 32 CTAs, before a cluster merge is worth writing
    build_and_sweep $'default|\nc512s4|FLASHINFER_DECODE_MIN_CHUNK=512\nc512s6|FLASHINFER_DECODE_MIN_CHUNK=512 FLASHINFER_DECODE_STAGES=6\nc512s7|FLASHINFER_DECODE_MIN_CHUNK=512 FLASHINFER_DECODE_STAGES=7\nc1024s7|FLASHINFER_DECODE_MIN_CHUNK=1024 FLASHINFER_DECODE_STAGES=7\ns5|FLASHINFER_DECODE_STAGES=5' \
      benchmarks/sweeps/s26_deep.txt deep
    ;;
  knobs)
    # the deep plans at 2 / 3 stages, and the split of the long single requests (chunk floor,
    # waves, item cost) now that many chunks merge in one trip (call 4 ran both tables in one build)
    build_and_sweep $'default|\ns2|FLASHINFER_DECODE_STAGES=2\ns3|FLASHINFER_DECODE_STAGES=3' benchmarks/sweeps/s26_deep.txt stg
    C=$'default|\nmc256|FLASHINFER_DECODE_MIN_CHUNK=256\nmc1024|FLASHINFER_DECODE_MIN_CHUNK=1024\nw1|FLASHINFER_DECODE_WAVES=1\nw2|FLASHINFER_DECODE_WAVES=2\nic48|FLASHINFER_DECODE_ITEM_COST=48\nic192|FLASHINFER_DECODE_ITEM_COST=192\nnowide|FLASHINFER_DECODE_WIDE=0'
    NO_BUILD=1 build_and_sweep "$C" benchmarks/sweeps/s26_split.txt spl
    ;;
  big)
    # the plans beyond the deep ones at two stages (same plan, a third fewer bytes in flight)
    build_and_sweep $'default|\ns2|FLASHINFER_DECODE_STAGES=2' benchmarks/sweeps/s26_big.txt big
    ;;
  *)
    echo "usage: bash scripts/s26.sh merge|deep|knobs|big" >&2
    exit 2
    ;;
esac
