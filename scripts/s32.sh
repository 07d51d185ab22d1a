#!/usr/bin/env bash
# Session 32's device calls (benchmarks/NOTES.md, session 32): bash scripts/s32.sh <call>.
#   ab1    A/B of _decode variants of the split merge's code size (temporary switches
#          FLASHINFER_MERGE_FLOATS: floats of o per thread per L2 round trip, 64 = 16 slots at 4
#          dims; FLASHINFER_MERGE_LEAN: clamped slot loads instead of predicated ones); the decode
#          test files on the smallest variant
#   long   a control (the head tree built twice, the second with a flag nothing reads: what a
#          separate build costs or gains) and the long requests' plans by knobs on the head
#          package: deep plans up to 2048 keys x KV heads per SM (FLASHINFER_DECODE_DEEP=2048:
#          1 x 32768 as 16 chunks of 2048 keys, one CTA per SM, the in-kernel merge) at 2, 3 and
#          4 stages, and 2048-key chunks on the default shape (FLASHINFER_DECODE_MIN_CHUNK=2048)
#   ub     upper bounds of the split tail (wrong results; temporary FLASHINFER_S32_UB): 1, the
#          merging CTA stores zeros instead of folding the partial states; 2, no count and no
#          merge after the partial write
#   staged the tensor-core kernel's split merge folding through shared memory (merge_staged)
#          against the register fold (temporary FLASHINFER_MERGE_STAGED=0), ROUNDS rounds
#          (default 3; call 4 ran ROUNDS=2 TEST_TIMEOUT=120); the decode and cascade-wrapper test
#          files on the staged build
#   final  the package built; the closing bench (benchmarks/final_cases.txt); run()'s new
#          non-tensor test and the test files session 31 did not run (batch prefill, the
#          samplers), until TEST_TIMEOUT
# (every switch named here was a temporary #if of decode.cuh / decode_tc.cuh; the tree has none)
set -uo pipefail
source "$(dirname "$0")/sweep_lib.sh"

case "${1:-}" in
  ab1)
    VARIANTS=$'head|| \nb32|-DFLASHINFER_MERGE_FLOATS=32\nb16|-DFLASHINFER_MERGE_FLOATS=16\nlean|-DFLASHINFER_MERGE_LEAN=1' \
      CASES=benchmarks/sweeps/s32_merge.txt AB_TIMEOUT=${AB_TIMEOUT:-420} TEST_TIMEOUT=${TEST_TIMEOUT:-100} \
      TESTS="${TESTS:-3:test_decode.py test_page_decode.py}" bash scripts/s24_ab.sh
    ;;
  long)
    P=$PWD/build/ab-pkg-1
    VARIANTS=$'head|| \ncontrol|-DFLASHINFER_S32_CONTROL=1' CASES=benchmarks/sweeps/s32_long.txt \
      AB_TIMEOUT=${AB_TIMEOUT:-500} EXTRA_CONFIGS="deep2048|PYTHONPATH=$P FLASHINFER_DECODE_DEEP=2048
deep2048s3|PYTHONPATH=$P FLASHINFER_DECODE_DEEP=2048 FLASHINFER_DECODE_STAGES=3
deep2048s4|PYTHONPATH=$P FLASHINFER_DECODE_DEEP=2048 FLASHINFER_DECODE_STAGES=4
chunk2048|PYTHONPATH=$P FLASHINFER_DECODE_MIN_CHUNK=2048
" bash scripts/s24_ab.sh
    ;;
  ub)
    VARIANTS=$'head|| \nnomerge|-DFLASHINFER_S32_UB=1\nnocount|-DFLASHINFER_S32_UB=2' \
      CASES=benchmarks/sweeps/s32_ub.txt AB_TIMEOUT=${AB_TIMEOUT:-400} bash scripts/s24_ab.sh
    ;;
  staged)
    VARIANTS=$'staged|| \nhead|-DFLASHINFER_MERGE_STAGED=0' CASES=benchmarks/sweeps/s32_merge.txt \
      AB_TIMEOUT=${AB_TIMEOUT:-330} TEST_TIMEOUT=${TEST_TIMEOUT:-150} ROUNDS=${ROUNDS:-3} \
      TESTS="${TESTS:-1:test_decode.py test_page_decode.py test_decode_host.py test_cascade_wrappers.py}" bash scripts/s24_ab.sh
    ;;
  final)
    pip_build || exit 1
    nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
    timeout ${BENCH_TIMEOUT:-200} python3 -m flashinfer.bench --testlist benchmarks/final_cases.txt \
      --output-path "$OUT/bench.csv" > "$OUT/bench.txt" 2> "$OUT/bench.err"
    echo "bench rc $?"
    cut -c1-150 "$OUT/bench.txt"
    run_tests ${TEST_TIMEOUT:-220} "tests/python/test_decode.py::test_run_names_a_non_tensor_argument" \
      tests/python/test_batch_prefill.py tests/python/test_sampling_cluster.py tests/python/test_sampling.py
    ;;
  *)
    echo "usage: bash scripts/s32.sh ab1|long|ub|staged|final" >&2
    exit 2
    ;;
esac
