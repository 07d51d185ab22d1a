#!/usr/bin/env bash
# Session 26's device calls (benchmarks/NOTES.md, session 26): bash scripts/s26.sh <call>.
#   merge   A/B of the merge of split decode states: the old DecodeMergeKernel (one 16-thread
#           group per row; -DFLASHINFER_DECODE_MERGE_ROWS16, a temporary #if) against the slot-lane
#           one, each under FLASHINFER_DECODE_MERGE=last / kernel / auto, on
#           benchmarks/sweeps/s26_merge.txt; then the decode tests on the new build
#   deep    the deep plans (1 x 4096 ...) with fewer, longer chunks and deeper pipelines (knobs)
#   knobs   the deep plans at 2 / 3 stages; the long requests' split under the planner's knobs
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
  deep)
    # fewer, longer chunks with deeper pipelines on the deep plans (FLASHINFER_DECODE_MIN_CHUNK /
    # _STAGES): what the streaming costs at 64 or 32 CTAs, before a cluster merge is worth writing
    MODULES="_cuda _norm _activation _decode _cascade _rope _page _prefill _sampling" TEST_TIMEOUT=1 \
      bash scripts/gpu_dev.sh > "$OUT/dev.txt" 2>&1
    head -3 "$OUT/dev.txt"
    C=$'default|\nc512s4|FLASHINFER_DECODE_MIN_CHUNK=512\nc512s6|FLASHINFER_DECODE_MIN_CHUNK=512 FLASHINFER_DECODE_STAGES=6\nc512s7|FLASHINFER_DECODE_MIN_CHUNK=512 FLASHINFER_DECODE_STAGES=7\nc1024s7|FLASHINFER_DECODE_MIN_CHUNK=1024 FLASHINFER_DECODE_STAGES=7\ns5|FLASHINFER_DECODE_STAGES=5'
    for r in 1 2; do
      c="$C"
      [ $r -eq 2 ] && c="$(printf '%s\n' "$C" | tac)"
      TAG=deep$r CONFIGS="$c" CASES=benchmarks/sweeps/s26_deep.txt bash scripts/gpu_sweep.sh > "$OUT/deep$r.txt" 2>&1
    done
    python3 scripts/sweep_table.py "$OUT/deep1.txt" "$OUT/deep2.txt"
    ;;
  knobs)
    # knob sweeps on the merge-kernel tree: the deep plans at 2 / 3 stages, and the split of the
    # long single requests (chunk floor, waves, item cost) now that many chunks merge in one trip
    MODULES="_cuda _norm _activation _decode _cascade _rope _page _prefill _sampling" TEST_TIMEOUT=1 \
      bash scripts/gpu_dev.sh > "$OUT/dev.txt" 2>&1
    head -3 "$OUT/dev.txt"
    C1=$'default|\ns2|FLASHINFER_DECODE_STAGES=2\ns3|FLASHINFER_DECODE_STAGES=3'
    C2=$'default|\nmc256|FLASHINFER_DECODE_MIN_CHUNK=256\nmc1024|FLASHINFER_DECODE_MIN_CHUNK=1024\nw1|FLASHINFER_DECODE_WAVES=1\nw2|FLASHINFER_DECODE_WAVES=2\nic48|FLASHINFER_DECODE_ITEM_COST=48\nic192|FLASHINFER_DECODE_ITEM_COST=192\nnowide|FLASHINFER_DECODE_WIDE=0'
    for r in 1 2; do
      c1="$C1" c2="$C2"
      [ $r -eq 2 ] && c1="$(printf '%s\n' "$C1" | tac)" && c2="$(printf '%s\n' "$C2" | tac)"
      TAG=stg$r CONFIGS="$c1" CASES=benchmarks/sweeps/s26_deep.txt bash scripts/gpu_sweep.sh > "$OUT/stg$r.txt" 2>&1
      TAG=spl$r CONFIGS="$c2" CASES=benchmarks/sweeps/s26_split.txt bash scripts/gpu_sweep.sh > "$OUT/spl$r.txt" 2>&1
    done
    python3 scripts/sweep_table.py "$OUT/stg1.txt" "$OUT/stg2.txt"
    python3 scripts/sweep_table.py "$OUT/spl1.txt" "$OUT/spl2.txt"
    ;;
  *)
    echo "usage: bash scripts/s26.sh merge|deep|knobs" >&2
    exit 2
    ;;
esac
