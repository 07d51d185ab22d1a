#!/usr/bin/env bash
# Raw ncu metrics (instructions, active cycles, DRAM, every warp-stall reason per issue) of a
# few bench cases, after scripts/gpu_dev.sh built build/devpkg. Each line of NCU_CASES:
# "<label>|<kernel regex>|<env assignments>|<bench case flags>" (NCU_EXTRA: more metrics). Compact table per case;
# full reports under $OUT/ncum_*.txt.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
export PYTHONPATH=$PWD/build/devpkg
M="gpu__time_duration.sum,smsp__inst_executed.sum,sm__cycles_active.avg,sm__cycles_active.max,smsp__warps_active.avg.per_cycle_active"
M="$M,dram__throughput.avg.pct_of_peak_sustained_elapsed,dram__bytes_read.sum,dram__bytes_write.sum,smsp__issue_active.avg.pct_of_peak_sustained_active"
for r in long_scoreboard short_scoreboard barrier membar wait math_pipe_throttle mio_throttle lg_throttle \
         not_selected selected dispatch_stall no_instruction branch_resolving sleeping drain imc_miss tex_throttle misc; do
  M="$M,smsp__average_warps_issue_stalled_${r}_per_issue_active.ratio"
done
[ -n "${NCU_EXTRA:-}" ] && M="$M,$NCU_EXTRA"  # more metrics, comma-separated
i=0
while IFS='|' read -r label regex assigns flags; do
  [ -z "$label" ] && continue
  i=$((i + 1))
  env $assigns timeout 150 ncu --clock-control none -k "regex:$regex" -s 2 -c 1 --metrics "$M" \
    python3 benchmarks/profile_case.py $flags > "$OUT/ncum_$i.txt" 2>&1
  echo "== $label ($assigns) $flags"
  grep -E "^\s+(gpu__|smsp__|sm__|dram__|lts__|l1tex__)" "$OUT/ncum_$i.txt" | sed -E 's/smsp__average_warps_issue_stalled_//; s/_per_issue_active.ratio//' |
    awk '{ if ($NF+0 >= 0.05 || $1 !~ /^[a-z_]+$/ || $1 ~ /__/) printf "  %s %s %s\n", $1, $2, $NF }'
done <<< "${NCU_CASES}"
