#!/usr/bin/env bash
# Shared by the session scripts (scripts/s26.sh, s27.sh, s29.sh), which source it first: it moves to the
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

# the package pip-installed from the tree (all cores), its time printed
pip_build() {
  local t0
  t0=$(date +%s)
  python3 -m pip install --no-build-isolation --no-deps . > "$OUT/build.log" 2>&1 || { tail -20 "$OUT/build.log"; return 1; }
  echo "build: $(( $(date +%s) - t0 )) s"
}

# pytest on the test files $2... until $1 seconds (SIGINT: it still prints its counts), on the
# GPU with 15 workers; junit in $OUT/pytest.xml, log in $OUT/tests.log, the counts and failures
# printed
run_tests() {
  local limit=$1
  shift
  timeout -s INT "$limit" python3 -m pytest -q -n 15 -p no:cacheprovider --junitxml="$OUT/pytest.xml" "$@" \
    > "$OUT/tests.log" 2>&1
  echo "tests: rc $? $(tail -1 "$OUT/tests.log")"
  grep -h "^FAILED\|^ERROR" "$OUT/tests.log" | head -20
}
