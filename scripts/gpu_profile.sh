#!/usr/bin/env bash
# ncu profiles of a few bench cases (after scripts/gpu_dev.sh built build/devpkg). Each
# line of PROFILE_CASES: "<kernel regex>|<bench case flags>". Reports under $OUT.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
export PYTHONPATH=$PWD/build/devpkg
i=0
while IFS='|' read -r regex flags; do
  [ -z "$regex" ] && continue
  i=$((i + 1))
  timeout 120 ncu --clock-control none -k "regex:$regex" -s 2 -c 1 \
    --section SpeedOfLight --section MemoryWorkloadAnalysis --section WarpStateStats --section Occupancy \
    --section LaunchStats python3 benchmarks/profile_case.py $flags > "$OUT/ncu_$i.txt" 2>&1
  echo "== $regex | $flags"
  grep -iE "stalled|DRAM Throughput|Memory Throughput|Duration|Achieved Occupancy|Theoretical Occupancy|Registers Per|Warp Cycles Per Issued|Stall|Block Limit|Mem Busy|Max Bandwidth|L2 Hit|Compute \(SM\)" "$OUT/ncu_$i.txt" | head -24
done <<< "${PROFILE_CASES}"
