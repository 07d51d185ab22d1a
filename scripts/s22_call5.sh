#!/usr/bin/env bash
# Session 22, device call 5 (no build: build/py312pkg is the package built on the CPU machine for
# Python 3.12 / sm_90a and carried): split-KV host time behind a GPU sleep, and the split target.
set -uo pipefail
cd "$(dirname "$0")/.."
export PYTHONPATH=$PWD/build/py312pkg
timeout 60 python3 benchmarks/host_split.py 2>&1 | tail -6
for n in 2 4 8; do
  echo "== FLASHINFER_PREFILL_SPLIT_CTAS=$n"
  FLASHINFER_PREFILL_SPLIT_CTAS=$n timeout 50 python3 -m flashinfer.bench --testlist benchmarks/sweeps/s22_chunks.txt \
    --no-ref --reps 30 --host-calls 50 2>&1 | grep -E "^(cascade|batch_prefill)|chunks" | cut -c1-120
done
