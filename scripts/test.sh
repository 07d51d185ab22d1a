#!/usr/bin/env bash
# Installs what testing needs, builds the package and the C++ tests, runs ctest and pytest.
# Works on a fresh machine with the CUDA toolkit (nvcc) installed; GPU tests skip without a GPU.
#   FLASHINFER_CUDA_ARCH_LIST="9.0" bash scripts/test.sh        (one SM target: fastest build)
#   FLASHINFER_TEST_NO_DEPS=1   skip the pip install of test dependencies (offline GPU machines)
#   FLASHINFER_TEST_NO_CPP=1    skip the C++ part (ctest and the example), e.g. to fit a time limit
#   FLASHINFER_TEST_NO_BUILD=1  skip the package build (already installed, e.g. by gpu_check.sh)
#   PYTEST_PATHS="tests/python/test_a.py ..."  the pytest files (default: tests/python)
#   PYTEST_TIMEOUT=<s>          interrupt pytest (SIGINT) after s seconds: it still prints its counts
set -euo pipefail
cd "$(dirname "$0")/.."
PY=${PYTHON:-python3}
JOBS=${JOBS:-$(nproc)}

if ! command -v nvcc >/dev/null 2>&1; then
  for d in /usr/local/cuda/bin /usr/local/cuda-13.0/bin; do
    if [ -x "$d/nvcc" ]; then export PATH="$d:$PATH"; break; fi
  done
fi
command -v nvcc >/dev/null || { echo "test.sh: nvcc not found (install the CUDA toolkit)"; exit 1; }
export CUDACXX=${CUDACXX:-$(command -v nvcc)}

if [ -z "${FLASHINFER_TEST_NO_DEPS:-}" ]; then
  # torch==2.13.0 resolves to a local CPU wheel where one is provided (CI); elsewhere any torch works.
  $PY -m pip install -q "numpy" "pytest" "nanobind>=2.4" "scikit-build-core>=0.10" "cmake>=3.24" "ninja"
  $PY -c "import torch" 2>/dev/null || $PY -m pip install -q "torch==2.13.0" || $PY -m pip install -q torch
fi

if [ -z "${FLASHINFER_TEST_NO_BUILD:-}" ]; then
  echo "== build and install the Python package (FLASHINFER_CUDA_ARCH_LIST='${FLASHINFER_CUDA_ARCH_LIST:-auto}')"
  t0=$(date +%s)
  CMAKE_BUILD_PARALLEL_LEVEL=$JOBS $PY -m pip install -q --no-build-isolation --no-deps .
  echo "   package build: $(( $(date +%s) - t0 )) s"
fi

ctest_rc=0
ex_rc=0
if [ -z "${FLASHINFER_TEST_NO_CPP:-}" ]; then
  echo "== C++ tests (ctest) and the installed-package example"
  B=build/ctest
  cmake -S . -B $B -G Ninja -DCMAKE_BUILD_TYPE=Release -DCMAKE_INSTALL_PREFIX="$PWD/build/prefix" \
    -DFLASHINFER_CUDA_ARCH_LIST="${FLASHINFER_CUDA_ARCH_LIST:-}" -DFLASHINFER_BUILD_EMU_TESTS=ON > build/ctest-configure.log
  cmake --build $B -j "$JOBS"
  cmake --install $B > /dev/null
  ARCHS=$(sed -n 's/^CMAKE_CUDA_ARCHITECTURES:[A-Z]*=//p' $B/CMakeCache.txt)
  cmake -S examples/cpp -B build/example -G Ninja -DCMAKE_PREFIX_PATH="$PWD/build/prefix" \
    -DCMAKE_CUDA_ARCHITECTURES="${ARCHS:-90}" > build/example-configure.log
  cmake --build build/example -j "$JOBS"
  set +e
  (cd $B && ctest --output-on-failure -j "$JOBS")
  ctest_rc=$?
  ./build/example/rmsnorm_example
  ex_rc=$?
  [ $ex_rc -eq 77 ] && ex_rc=0
  set -e
else
  echo "== C++ tests skipped (FLASHINFER_TEST_NO_CPP)"
fi
set +e
echo "== pytest"
${PYTEST_TIMEOUT:+timeout -s INT $PYTEST_TIMEOUT} $PY -m pytest ${PYTEST_PATHS:-tests/python} -q -rs --durations=15 \
  ${PYTEST_ARGS:-}
py_rc=$?
set -e
echo "ctest rc=$ctest_rc example rc=$ex_rc pytest rc=$py_rc"
[ $ctest_rc -eq 0 ] && [ $ex_rc -eq 0 ] && [ $py_rc -eq 0 ]
