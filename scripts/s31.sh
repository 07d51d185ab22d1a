#!/usr/bin/env bash
# Session 31's device calls (benchmarks/NOTES.md, session 31): bash scripts/s31.sh <call>.
#   ncu    the modules built (gpu_dev.sh); ncu's warp-stall
#          reasons per issue (no_instruction: the kernel waiting on its own code) for the small
#          goal cases and the split decode cases (gpu_ncu_metrics.sh)
#   pcsamp the modules built unless build/devpkg is there (a warm machine of `ncu`); ncu's
#          per-instruction warp-state samples of decode tc 1 x 4096, rmsnorm 1 row and append 1
#          token, summarised by benchmarks/pc_stalls.py (where the kernels wait on their own code)
#   host   the package built; benchmarks/host_overhead.py (three routes in one process); the test
#          files of the wrappers that changed; per-instruction samples of decode 1 x 4096 and
#          1 x 32768 at the finest sampling interval
#   warm   A/B of _decode variants (FLASHINFER_DECODE_WARM_MERGE: a temporary switch, gone now): head; 1: every
#          CTA of a split request runs the merge's code after counting, the last one storing; 2:
#          the merge a noinline function that every CTA runs once, storing nothing, when its first
#          item starts (its code in the SM's instruction cache and L2 before the last CTA needs
#          it); the decode test files on variant 2
#   final  the package built; host_overhead.py (the three routes interleaved); the closing bench
#          (benchmarks/final_cases.txt); the test files `host` did not run, until TEST_TIMEOUT
#   host2  (host_overhead.py's A/B loop had rebound the `k` its RoPE rows use) the package built
#          unless installed; host_overhead.py; test_prefill and the reference files
#   last   the package built; the chain-speculative tests of test_sampling, the decode and RoPE
#          files, test_sampling_validation (single decode's and chain_speculative_sampling's
#          argument checks changed after `final`)
set -uo pipefail
source "$(dirname "$0")/sweep_lib.sh"

# ncu's per-instruction warp-state samples of the cases in $1 ("tag|kernel regex|bench case flags"
# per line; SAMPLING: ncu's --warp-sampling-interval, 2^(5 + n) cycles), each summarised by
# benchmarks/pc_stalls.py; the CSVs and summaries in $OUT/pc.tar.gz
pc_samples() {
  local tag regex flags
  ncu --version | tail -1
  while IFS='|' read -r tag regex flags; do
    ncu --clock-control none --section SourceCounters --section WarpStateStats --warp-sampling-interval "${SAMPLING:-auto}" \
      -k "regex:$regex" -s 2 -c 1 -f -o "$OUT/pc_$tag" python3 benchmarks/profile_case.py $flags > "$OUT/pc_$tag.log" 2>&1
    ncu -i "$OUT/pc_$tag.ncu-rep" --page source --csv --print-source sass > "$OUT/pc_$tag.csv" 2> "$OUT/pc_$tag.err"
    python3 benchmarks/pc_stalls.py "$OUT/pc_$tag.csv" > "$OUT/pc_$tag.txt" 2>&1
    echo "== $tag: $flags"
    grep -A30 "most no_instruction" "$OUT/pc_$tag.txt"
    tail -c 1200 "$OUT/pc_$tag.txt"
    rm -f "$OUT/pc_$tag.ncu-rep"
  done <<< "$1"
  (cd "$OUT" && tar czf pc.tar.gz pc_* && rm -f pc_*.csv pc_*.log pc_*.err pc_*.txt)
}

case "${1:-}" in
  ncu)
    MODULES="$ALL" TEST_TIMEOUT=1 bash scripts/gpu_dev.sh > "$OUT/dev.txt" 2>&1
    head -3 "$OUT/dev.txt"
    NCU_CASES="decode tc 1x4096|DecodeTC||--routine batch_decode --batch-size 1 --kv-len 4096 --use-tensor-cores
decode tc 1x32768|DecodeTC||--routine batch_decode --batch-size 1 --kv-len 32768 --use-tensor-cores
decode tc 16x4096|DecodeTC||--routine batch_decode --batch-size 16 --kv-len 4096 --use-tensor-cores
single decode 32768|DecodeTC||--routine single_decode --kv-len 32768 --use-tensor-cores
rmsnorm 1 row|Norm||--routine rmsnorm --batch-size 1 --hidden-size 4096
rmsnorm 128 rows|Norm||--routine rmsnorm --batch-size 128 --hidden-size 4096
rmsnorm 4096 rows|Norm||--routine rmsnorm --batch-size 4096 --hidden-size 4096
rope 1 token|Rope||--routine rope --batch-size 1 --num-qo-heads 32 --num-kv-heads 8 --head-dim 128
append 1 token|Append||--routine append_paged_kv_cache --batch-size 1 --num-kv-heads 8 --head-dim 128 --page-size 16
merge_state|Merge||--routine merge_state --batch-size 8192 --num-heads 32 --head-dim 128" \
      bash scripts/gpu_ncu_metrics.sh 2>&1 | tee "$OUT/ncu_table.txt"
    ;;
  pcsamp)
    if ! python3 -c "import flashinfer" 2>/dev/null; then  # (an installed package: a warm machine of `host`)
      [ -d build/devpkg/flashinfer ] || MODULES="$ALL" TEST_TIMEOUT=1 bash scripts/gpu_dev.sh > "$OUT/dev.txt" 2>&1
      export PYTHONPATH=$PWD/build/devpkg
    fi
    pc_samples "dec4096|DecodeTC|--routine batch_decode --batch-size 1 --kv-len 4096 --use-tensor-cores
norm1|Norm|--routine rmsnorm --batch-size 1 --hidden-size 4096
append1|Append|--routine append_paged_kv_cache --batch-size 1 --num-kv-heads 8 --head-dim 128 --page-size 16"
    ;;
  host)
    pip_build || exit 1
    python3 benchmarks/host_overhead.py > "$OUT/host.txt" 2>&1
    cat "$OUT/host.txt"
    run_tests ${PYTEST_TIMEOUT:-300} tests/python/test_tensor_arg.py tests/python/test_framework.py \
      tests/python/test_validation.py tests/python/test_norm.py tests/python/test_norm_variants.py \
      tests/python/test_activation.py tests/python/test_rope.py tests/python/test_rope_variants.py \
      tests/python/test_rope_validation.py tests/python/test_page.py tests/python/test_page_validation.py \
      tests/python/test_page_decode.py tests/python/test_decode.py tests/python/test_decode_host.py
    SAMPLING=0 pc_samples "dec4096|DecodeTC|--routine batch_decode --batch-size 1 --kv-len 4096 --use-tensor-cores
dec32768|DecodeTC|--routine batch_decode --batch-size 1 --kv-len 32768 --use-tensor-cores"
    ;;
  warm)
    VARIANTS=$'head|| \nend|-DFLASHINFER_DECODE_WARM_MERGE=1\nstart|-DFLASHINFER_DECODE_WARM_MERGE=2' \
      CASES=benchmarks/sweeps/s31_warm.txt AB_TIMEOUT=${AB_TIMEOUT:-420} TEST_TIMEOUT=${TEST_TIMEOUT:-100} \
      TESTS="${TESTS:-3:test_decode.py test_page_decode.py}" bash scripts/s24_ab.sh
    ;;
  final)
    pip_build || exit 1
    python3 benchmarks/host_overhead.py > "$OUT/host.txt" 2>&1
    tail -14 "$OUT/host.txt"
    timeout ${BENCH_TIMEOUT:-250} python3 -m flashinfer.bench --testlist benchmarks/final_cases.txt \
      --output-path "$OUT/bench.csv" > "$OUT/bench.txt" 2> "$OUT/bench.err"
    echo "bench rc $?"
    cut -c1-150 "$OUT/bench.txt"
    run_tests ${TEST_TIMEOUT:-110} $(printf 'tests/python/%s ' test_cascade_validation.py test_sampling_validation.py \
      test_topk.py test_quantization.py test_norm_quant.py test_norm_tuning.py test_sparse.py test_cascade.py \
      test_cascade_wrappers.py test_bench.py test_mla.py)
    ;;
  host2)
    python3 -c "import flashinfer" 2>/dev/null || pip_build || exit 1
    python3 benchmarks/host_overhead.py > "$OUT/host.txt" 2>&1
    cat "$OUT/host.txt"
    run_tests ${TEST_TIMEOUT:-100} tests/python/test_prefill.py tests/python/test_reference.py \
      tests/python/test_reference_cascade.py tests/python/test_reference_sampling.py
    ;;
  last)
    pip_build || exit 1
    run_tests ${TEST_TIMEOUT:-150} $(printf 'tests/python/test_sampling.py::test_chain_speculative_%s ' structure \
      counts_of_another_dtype_are_incremented_in_place output_is_target_distribution) tests/python/test_decode.py \
      tests/python/test_decode_host.py tests/python/test_sampling_validation.py tests/python/test_rope.py
    ;;
  *)
    echo "usage: bash scripts/s31.sh ncu|pcsamp|host|warm|final|host2|last" >&2
    exit 2
    ;;
esac
