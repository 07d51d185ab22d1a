#!/usr/bin/env bash
# Session 23, device call 3 (as of its commit, when the kernel was off by default): separate K / V
# pipelines and 128-key tiles (FLASHINFER_PREFILL_WS_KEYS) with setmaxnreg budgets against HEAD;
# then the prefill GPU tests on the mode-3 package.
VARIANTS=$'head|| \nws1r208|-DFLASHINFER_PREFILL_WS=1 -DFLASHINFER_PREFILL_WS_REGS=208\nws3r232|-DFLASHINFER_PREFILL_WS=3 -DFLASHINFER_PREFILL_WS_REGS=232\nws3r240|-DFLASHINFER_PREFILL_WS=3 -DFLASHINFER_PREFILL_WS_REGS=240\nws3k64|-DFLASHINFER_PREFILL_WS=3 -DFLASHINFER_PREFILL_WS_REGS=200 -DFLASHINFER_PREFILL_WS_KEYS=64 -DFLASHINFER_PREFILL_WS_STAGES=4' \
  TESTS="3:test_prefill.py:50 3:test_batch_prefill.py:130" AB_TIMEOUT=400 exec bash "$(dirname "$0")/s23_ab.sh"
