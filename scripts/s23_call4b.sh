#!/usr/bin/env bash
# Session 23, device call 4b (carried package, as call 4) after the prefill_single_ws rule:
# test_prefill.py and the single-prefill bench (benchmarks/sweeps/s23_single.txt).
PYTEST_FILES=tests/python/test_prefill.py PYTEST_TIMEOUT=100 CASES=benchmarks/sweeps/s23_single.txt BENCH_TIMEOUT=100 \
  exec bash "$(dirname "$0")/s23_call4.sh"
