#!/usr/bin/env bash
# Session 25's device calls (benchmarks/NOTES.md, session 25): bash scripts/s25.sh <call>.
#   floor   benchmarks/experiments/read_floor.cu (what streaming the decode cases' bytes costs
#           under the bench's method), the package built, the cascade tests, merge_state A/B over
#           FLASHINFER_MERGE_FLAT / _THREADS, the small decode plans under FLASHINFER_DECODE_WAVES,
#           and the decode goal cases under the memset and a read flush (calls 1-2)
#   trace   a -DFLASHINFER_DECODE_TRACE=1 build runs benchmarks/trace_decode.py (calls 3-4; call 4
#           also traced a build with the prologue's page-id loads hoisted, a temporary #if)
#   ab      A/B of _decode builds (VARIANTS as scripts/gpu_ab.sh takes them) on
#           benchmarks/sweeps/s25_ab.txt with the decode tests on the last variant (call 5 ran
#           head / hoisted prologue / + merge-record prefetch, and FLASHINFER_DECODE_STAGES=5, 6;
#           those switches were temporary #ifs, the tree has none now)
# The closing check (call 6) was scripts/gpu_check.sh (see NOTES).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT" build
command -v nvcc >/dev/null || export PATH=/usr/local/cuda/bin:$PATH
export CUDACXX=${CUDACXX:-$(command -v nvcc)}
ALL="_cuda _norm _activation _decode _cascade _rope _page _prefill _sampling"

# two rounds of CONFIGS ($1) over CASES ($2), the second in reverse order, as one table ($3: tag)
sweep2() {
  local rounds=() r c
  for r in 1 2; do
    c="$1"
    [ $r -eq 2 ] && c="$(printf '%s\n' "$1" | tac)"
    TAG=$3$r CONFIGS="$c" CASES=$2 bash scripts/gpu_sweep.sh > "$OUT/$3$r.txt" 2>&1
    rounds+=("$OUT/$3$r.txt")
  done
  python3 scripts/sweep_table.py "${rounds[@]}" > "$OUT/$3_table.txt" 2>&1
}

case "${1:-}" in
  floor)
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
    (nvcc -O3 -std=c++17 -arch=sm_90 -Iinclude -o build/read_floor benchmarks/experiments/read_floor.cu > "$OUT/rf-build.txt" 2>&1 &&
      ./build/read_floor > "$OUT/read_floor.txt" 2>&1; echo "read_floor rc $?") &
    MODULES="$ALL" TEST_TIMEOUT=1 bash scripts/gpu_dev.sh > "$OUT/dev.txt" 2>&1
    wait
    head -3 "$OUT/dev.txt"
    export PYTHONPATH=$PWD/build/devpkg
    timeout 150 python3 -m pytest -q -n 15 -p no:cacheprovider tests/python/test_cascade.py \
      tests/python/test_cascade_validation.py tests/python/test_cascade_wrappers.py > "$OUT/pytest-cascade.txt" 2>&1
    echo "cascade tests: rc $? $(tail -1 "$OUT/pytest-cascade.txt")"
    sweep2 $'tiles|FLASHINFER_MERGE_FLAT=0\nflat128|\nflat2|FLASHINFER_MERGE_FLAT=2\nflat4|FLASHINFER_MERGE_FLAT=4\nflat256|FLASHINFER_MERGE_THREADS=256\nflat512|FLASHINFER_MERGE_THREADS=512' \
      benchmarks/sweeps/s25_merge.txt merge
    sweep2 $'default|\nwaves1|FLASHINFER_DECODE_WAVES=1\nwaves2|FLASHINFER_DECODE_WAVES=2\nwaves4|FLASHINFER_DECODE_WAVES=4\nnodeep|FLASHINFER_DECODE_DEEP=0' \
      benchmarks/sweeps/s25_small.txt small
    CONFIGS=$'memset|\nread|FLASHINFER_BENCH_FLUSH=read' TAG=flush CASES=benchmarks/sweeps/l2_flush.txt bash scripts/gpu_sweep.sh > "$OUT/flush.txt" 2>&1
    python3 scripts/sweep_table.py "$OUT/flush.txt" > "$OUT/flush_table.txt" 2>&1
    echo "================ summary ================"
    cat "$OUT/gpu.txt" "$OUT/read_floor.txt" "$OUT/merge_table.txt" "$OUT/small_table.txt" "$OUT/flush_table.txt"
    ;;
  trace)
    t0=$(date +%s)
    B=build/trace
    cmake -S . -B $B -G Ninja -DFLASHINFER_BUILD_PYTHON=ON -DFLASHINFER_BUILD_TESTS=OFF \
      -DPython_EXECUTABLE="$(command -v python3)" -DCMAKE_CUDA_FLAGS=-DFLASHINFER_DECODE_TRACE=1 \
      -DCMAKE_CXX_FLAGS=-DFLASHINFER_DECODE_TRACE=1 > "$OUT/configure.log" 2>&1 || { tail "$OUT/configure.log"; exit 1; }
    cmake --build $B -j "$(nproc)" --target $ALL > "$OUT/build.log" 2>&1 || { grep "error:" "$OUT/build.log" | head; exit 1; }
    echo "build: $(($(date +%s) - t0)) s"
    P=build/tracepkg
    rm -rf $P && mkdir -p $P && cp -r python/flashinfer $P/ && cp $B/bindings/*.so $P/flashinfer/
    PYTHONPATH=$PWD/$P timeout 200 python3 benchmarks/trace_decode.py --reps ${REPS:-20} ${TRACE_CASES:+--cases $TRACE_CASES} > "$OUT/trace.txt" 2>&1
    echo "trace rc $?"
    cat "$OUT/trace.txt"
    ;;
  ab)
    : "${VARIANTS:?VARIANTS: lines of label|cuda flags}"
    CASES=benchmarks/sweeps/s25_ab.txt AB_TIMEOUT=330 TEST_TIMEOUT=150 \
      TESTS="${TESTS:-3:test_decode.py test_page_decode.py test_decode_host.py test_cascade_wrappers.py}" bash scripts/s24_ab.sh
    ;;
  *)
    echo "usage: bash scripts/s25.sh floor|trace|ab" >&2
    exit 2
    ;;
esac
