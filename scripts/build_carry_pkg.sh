#!/usr/bin/env bash
# Builds the Python package on this (CPU) machine for the GPU machine's Python 3.12 and sm_90a,
# into build/py312pkg (about 58 MiB: under the device tool's 64 MiB carry limit), so a device call
# that only measures or tests can skip the 2-minute pip build there:
#   run(command="PYTHONPATH=$PWD/build/py312pkg python3 -m flashinfer.bench ...", carry=["build/py312pkg"])
# BUILD_DIR (default /tmp/flashinfer-py312) keeps the ninja state between runs; PY312 is the interpreter.
set -euo pipefail
cd "$(dirname "$0")/.."
PY312=${PY312:-/root/.pyenv/versions/3.12.1/bin/python3.12}
B=${BUILD_DIR:-/tmp/flashinfer-py312}
command -v nvcc >/dev/null || export PATH=/usr/local/cuda-13.0/bin:$PATH
"$PY312" -m nanobind --cmake_dir >/dev/null 2>&1 || "$PY312" -m pip install -q nanobind==3.1.0
cmake -S . -B "$B" -G Ninja -DCMAKE_BUILD_TYPE=Release -DFLASHINFER_BUILD_PYTHON=ON -DFLASHINFER_BUILD_TESTS=OFF \
  -DFLASHINFER_CUDA_ARCH_LIST=9.0 -DPython_EXECUTABLE="$PY312" > /dev/null
ninja -C "$B" _cuda _norm _activation _decode _cascade _rope _page _prefill _sampling
rm -rf build/py312pkg && mkdir -p build/py312pkg
cp -r python/flashinfer build/py312pkg/
cp "$B"/bindings/*.so build/py312pkg/flashinfer/
du -sh build/py312pkg
