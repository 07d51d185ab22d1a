#!/usr/bin/env bash
# Session 22, device call 2: A/B of the prefill kernel changes (two warpgroups, Q in registers,
# overlap mode 2 at head_dim 256) against session 21's kernels, then the prefill / MLA GPU tests
# on the new defaults (package build/ab-pkg-1).
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
VARIANTS=$'new|| \ns21|-DFLASHINFER_PREFILL_WG2=0 -DFLASHINFER_PREFILL_WG_QREG=0 -DFLASHINFER_PREFILL_WG_OVERLAP=0\nwg2-ss|-DFLASHINFER_PREFILL_WG_QREG=0\nwg1-qreg|-DFLASHINFER_PREFILL_WG2=0' \
  MODULES=_prefill CASES=benchmarks/sweeps/s22_wg2.txt ROUNDS=${ROUNDS:-1} timeout 400 bash scripts/gpu_ab.sh > "$OUT/ab.txt" 2>&1
echo "ab rc $?"
PYTHONPATH=$PWD/build/ab-pkg-1 timeout 150 python3 -m pytest -q -n 15 -p no:cacheprovider tests/python/test_prefill.py \
  tests/python/test_batch_prefill.py tests/python/test_mla.py > "$OUT/pytest-new.txt" 2>&1
echo "pytest new: rc $? $(tail -1 "$OUT/pytest-new.txt")"
grep -E "^FAILED|Error" "$OUT/pytest-new.txt" | head -20
tail -30 "$OUT/ab.txt"
