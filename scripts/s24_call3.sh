#!/usr/bin/env bash
# Session 24, device call 3: A/B of head / flat / flat + one-thread merge fence / head + that fence
# (_decode rebuilt per variant), cases benchmarks/sweeps/s24_flat2.txt, two rounds.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
VARIANTS=$'head|| \nflat|-DFLASHINFER_DECODE_TC_FLAT=1\nflat-f1|-DFLASHINFER_DECODE_TC_FLAT=1 -DFLASHINFER_DECODE_FENCE1=1\nhead-f1|-DFLASHINFER_DECODE_FENCE1=1' \
  MODULES=_decode CASES=benchmarks/sweeps/s24_flat2.txt ROUNDS=${ROUNDS:-2} timeout ${AB_TIMEOUT:-540} bash scripts/gpu_ab.sh > "$OUT/ab.txt" 2>&1
echo "ab rc $?"
grep -h "builds:\|total:" "$OUT/ab.txt"
tail -20 "$OUT/ab.txt"
