#!/bin/bash
# Builds and runs one kernel-emulator test without CMake (CPU only, no GPU; the CMake route is
# -DFLASHINFER_BUILD_EMU_TESTS=ON and `ctest -L emu`).
# EMU_FLAGS: extra compiler flags (e.g. a kernel knob: -DFLASHINFER_PREFILL_FUSED_SCALE=1).
# Usage: tests/cpp/emu/run_emulated.sh decode|sampling|sampling_cluster|norm_quant|cascade|mma|prefill
set -e
ROOT=$(cd "$(dirname "$0")/../../.." && pwd)
CUDA=${CUDA:-/usr/local/cuda-13.0}
W=${W:-/tmp/flashinfer-emu}
NAME=test_${1:?decode, sampling, sampling_cluster, norm_quant, cascade, mma or prefill}_emulated
shift
mkdir -p "$W"
g++ -std=c++17 -O2 -Wall -Wno-unknown-pragmas -Wno-psabi -U_FORTIFY_SOURCE -D_FORTIFY_SOURCE=0 -I"$ROOT/tests/cpp/emu" -I"$ROOT/include" -I"$ROOT/tests/cpp/host" \
  -I"$CUDA/include" ${EMU_FLAGS:-} "$ROOT/tests/cpp/emu/$NAME.cpp" -L"$CUDA/lib64" -lcudart_static -ldl -lrt -pthread -o "$W/$NAME"
"$W/$NAME"
