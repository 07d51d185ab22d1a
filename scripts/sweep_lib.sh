#!/usr/bin/env bash
# Shared by the session scripts (scripts/s26.sh, s27.sh), which source it first: it moves to the
# repository root and sets OUT (default ./out).
cd "$(dirname "${BASH_SOURCE[0]}")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
ALL="_cuda _norm _activation _decode _cascade _rope _page _prefill _sampling"

# the package built (all modules), then two rounds of CONFIGS ($1) over CASES ($2), the second in
# reverse order, as one table ($3: tag)
build_and_sweep() {
  if [ -z "${NO_BUILD:-}" ]; then
    MODULES="$ALL" TEST_TIMEOUT=1 bash scripts/gpu_dev.sh > "$OUT/dev.txt" 2>&1
    head -3 "$OUT/dev.txt"
  fi
  local r c
  for r in 1 2; do
    c="$1"
    [ $r -eq 2 ] && c="$(printf '%s\n' "$1" | tac)"
    TAG=$3$r CONFIGS="$c" CASES=$2 bash scripts/gpu_sweep.sh > "$OUT/$3$r.txt" 2>&1
  done
  python3 scripts/sweep_table.py "$OUT/${3}1.txt" "$OUT/${3}2.txt"
}
