#!/usr/bin/env bash
# Session 24, device call 4: A/B of head / flat / flat + q prefetch / flat without the descriptor prefetch
# (_decode rebuilt per variant), cases benchmarks/sweeps/s24_flat3.txt, two rounds.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
VARIANTS=$'head|| \nflat|-DFLASHINFER_DECODE_TC_FLAT=1\nflat-qpf|-DFLASHINFER_DECODE_TC_FLAT=1 -DFLASHINFER_DECODE_QPF=1\nflat-noipf|-DFLASHINFER_DECODE_TC_FLAT=1 -DFLASHINFER_DECODE_NO_ITEM_PF' \
  MODULES=_decode CASES=benchmarks/sweeps/s24_flat3.txt ROUNDS=${ROUNDS:-2} timeout ${AB_TIMEOUT:-540} bash scripts/gpu_ab.sh > "$OUT/ab.txt" 2>&1
echo "ab rc $?"
grep -h "builds:\|total:" "$OUT/ab.txt"
tail -20 "$OUT/ab.txt"
