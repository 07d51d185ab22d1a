#!/usr/bin/env bash
# Session 22, device call 1: A/B of the default-off prefill variants (MLA on wgmma, overlap modes
# 1 / 2) against HEAD, then the GPU tests of the variants that could be turned on.
set -uo pipefail
cd "$(dirname "$0")/.."
OUT=${OUT:-$PWD/out}
mkdir -p "$OUT"
nvidia-smi --query-gpu=name,clocks.sm,clocks.mem,temperature.gpu --format=csv > "$OUT/gpu.txt" 2>&1
VARIANTS=$'head|| \nmla-wg|-DFLASHINFER_MLA_WGMMA=1\nov1|-DFLASHINFER_PREFILL_WG_OVERLAP=1\nov2|-DFLASHINFER_PREFILL_WG_OVERLAP=2' \
  MODULES=_prefill CASES=benchmarks/sweeps/s22_ab.txt ROUNDS=1 timeout 420 bash scripts/gpu_ab.sh > "$OUT/ab.txt" 2>&1
echo "ab rc $?"
for v in 2:test_mla.py 4:test_prefill.py; do
  n=${v%%:*}; f=${v#*:}
  PYTHONPATH=$PWD/build/ab-pkg-$n timeout 60 python3 -m pytest -q -n 8 -p no:cacheprovider tests/python/$f > "$OUT/pytest-pkg$n-$f.txt" 2>&1
  echo "pkg $n $f: rc $? $(tail -1 "$OUT/pytest-pkg$n-$f.txt")"
done
tail -40 "$OUT/ab.txt"
