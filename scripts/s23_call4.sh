#!/usr/bin/env bash
# Session 23, device call 4 (package built here by scripts/build_carry_pkg.sh and carried:
# carry=["build/py312pkg"]): the prefill-family GPU tests on the final code, then the closing
# prefill bench (GPU time, no PyTorch reference). PYTEST_FILES / CASES / PYTEST_TIMEOUT override
# them (call 4b: scripts/s23_call4b.sh).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
export PYTHONPATH=$PWD/build/py312pkg
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv,noheader
python3 -c "import flashinfer, torch; print(flashinfer.__version__, torch.__version__, torch.cuda.get_device_name())"
files=${PYTEST_FILES:-"tests/python/test_prefill.py tests/python/test_batch_prefill.py tests/python/test_cascade.py tests/python/test_mla.py"}
timeout ${PYTEST_TIMEOUT:-300} python3 -m pytest -q -n 15 -p no:cacheprovider $files > "$OUT/pytest-prefill.txt" 2>&1
echo "pytest ($files) rc $?: $(tail -1 "$OUT/pytest-prefill.txt")"
grep -E "^FAILED|^ERROR" "$OUT/pytest-prefill.txt" | head -10
timeout ${BENCH_TIMEOUT:-200} python3 -m flashinfer.bench --testlist "${CASES:-benchmarks/sweeps/s23_final.txt}" --no-ref --reps 30 \
  > "$OUT/bench.txt" 2> "$OUT/bench.err"
echo "bench rc $?"
cut -c1-150 "$OUT/bench.txt"
tail -3 "$OUT/bench.err"
