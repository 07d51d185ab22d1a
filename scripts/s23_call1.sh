#!/usr/bin/env bash
# Session 23, device call 1: the warp-specialized two-M-tile prefill (64-key tiles, shared K / V
# stages, a producer that waited for its copies): FLASHINFER_PREFILL_WS 1 / 2 / 3 and setmaxnreg 200
# against HEAD (as of 7cb2b0e), then test_prefill / test_batch_prefill on modes 3 and 1.
VARIANTS=$'head|| \nws1|-DFLASHINFER_PREFILL_WS=1\nws2|-DFLASHINFER_PREFILL_WS=2\nws3|-DFLASHINFER_PREFILL_WS=3\nws3r|-DFLASHINFER_PREFILL_WS=3 -DFLASHINFER_PREFILL_WS_REGS=200' \
  TESTS="4:test_prefill.py:50 4:test_batch_prefill.py:50 2:test_prefill.py:50" AB_TIMEOUT=430 exec bash "$(dirname "$0")/s23_ab.sh"
