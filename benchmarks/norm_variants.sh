#!/usr/bin/env bash
# One H200 run of every norm / activation variant: the bench over dev_cases_norm.txt once per
# setting of the run-time knobs (read once per process, so one process per setting).
# Usage: [ONLY="auto rows_v1r2 ..."] benchmarks/norm_variants.sh [extra bench flags, e.g. --no-ref --reps 50]
# (ONLY: run just these labels, e.g. to split the sweep over several 10-minute commands)
# Output: one block per setting, headed "### <setting>"; CSVs in ${OUT:-/tmp}/norm_<label>.csv.
set -u
cd "$(dirname "$0")/.."
OUT=${OUT:-/tmp}
CASES=benchmarks/dev_cases_norm.txt
run() {  # run <label> <env assignments...>
  local label=$1; shift
  if [ -n "${ONLY:-}" ] && [[ " $ONLY " != *" $label "* ]]; then return; fi
  echo "### $label: $*"
  env "$@" python3 -m flashinfer.bench --testlist "$CASES" --output-path "$OUT/norm_$label.csv" ${EXTRA[@]+"${EXTRA[@]}"}
}
EXTRA=("$@")
# defaults (auto: norm rows kernel per norm_plan, activation flat u=4)
run auto
# norm: the previous persistent TMA/cp.async pipeline (activation: its pipeline too)
run pipe FLASHINFER_NORM_VARIANT=pipe FLASHINFER_ACT_VARIANT=pipe
# norm rows kernel: vectors per thread x rows per block (auto = v1, r2 for RMSNorm >= 16384 rows, else r1)
run rows_v1r1 FLASHINFER_NORM_VARIANT=rows FLASHINFER_NORM_VPT=1 FLASHINFER_NORM_ROWS=1 FLASHINFER_ACT_UNROLL=1
run rows_v1r2 FLASHINFER_NORM_VARIANT=rows FLASHINFER_NORM_VPT=1 FLASHINFER_NORM_ROWS=2 FLASHINFER_ACT_UNROLL=2
run rows_v2r1 FLASHINFER_NORM_VARIANT=rows FLASHINFER_NORM_VPT=2 FLASHINFER_NORM_ROWS=1 FLASHINFER_ACT_UNROLL=8
run rows_v2r2 FLASHINFER_NORM_VARIANT=rows FLASHINFER_NORM_VPT=2 FLASHINFER_NORM_ROWS=2
run rows_v1r4 FLASHINFER_NORM_VARIANT=rows FLASHINFER_NORM_VPT=1 FLASHINFER_NORM_ROWS=4
run rows_v4r1 FLASHINFER_NORM_VARIANT=rows FLASHINFER_NORM_VPT=4 FLASHINFER_NORM_ROWS=1
run rows_v4r2 FLASHINFER_NORM_VARIANT=rows FLASHINFER_NORM_VPT=4 FLASHINFER_NORM_ROWS=2
# loads with L1::no_allocate.L2::256B instead of ld.global.cs
run na_v1r1 FLASHINFER_NORM_VARIANT=rows FLASHINFER_NORM_VPT=1 FLASHINFER_NORM_ROWS=1 FLASHINFER_NORM_LOAD=na
run na_v1r2 FLASHINFER_NORM_VARIANT=rows FLASHINFER_NORM_VPT=1 FLASHINFER_NORM_ROWS=2 FLASHINFER_NORM_LOAD=na
