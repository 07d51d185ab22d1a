#!/usr/bin/env bash
# Session 23, device call 2 (as of its commit): a producer that never waits for its copies
# (cp.async.mbarrier.arrive.noinc): modes 1 / 3, setmaxnreg 200, 5 stages, against HEAD; then the
# prefill GPU tests on the mode-3 package.
VARIANTS=$'head|| \nws1|-DFLASHINFER_PREFILL_WS=1\nws3|-DFLASHINFER_PREFILL_WS=3\nws3r|-DFLASHINFER_PREFILL_WS=3 -DFLASHINFER_PREFILL_WS_REGS=200\nws3s5|-DFLASHINFER_PREFILL_WS=3 -DFLASHINFER_PREFILL_WS_STAGES=5' \
  TESTS="3:test_prefill.py:50 3:test_batch_prefill.py:150" AB_TIMEOUT=430 exec bash "$(dirname "$0")/s23_ab.sh"
