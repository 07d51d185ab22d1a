#!/usr/bin/env bash
# Env-knob sweep on a GPU machine (after scripts/gpu_dev.sh built build/devpkg): runs the
# bench testlist CASES once per line of CONFIGS ("label|VAR=val VAR2=val ..."; an empty
# assignment list = defaults), GPU time only (no host timing, no PyTorch reference), and
# prints one compact table per config (scripts/sweep_table.py joins rounds into one table).
# Full output under $OUT/sweep_*.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
export PYTHONPATH=$PWD/build/devpkg
i=0
while IFS='|' read -r label assigns; do
  [ -z "$label" ] && continue
  i=$((i + 1))
  env $assigns python3 -m flashinfer.bench --testlist "${CASES}" --no-ref --host-calls ${HOST_CALLS:-50} \
    --reps ${REPS:-50} > "$OUT/${TAG:-sweep}_$i.txt" 2> "$OUT/${TAG:-sweep}_$i.err"
  echo "== $label ($assigns)"
  cut -c1-130 "$OUT/${TAG:-sweep}_$i.txt"; tail -2 "$OUT/${TAG:-sweep}_$i.err"
done <<< "${CONFIGS}"
