"""CPU tests of the norm / activation tuning knobs: the environment variables are read once
at start-up (checked in a fresh interpreter), invalid environment values mean auto, and the
in-process ``_set_tuning`` hooks reject bad values with a ValueError naming the knob."""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from flashinfer import _activation, _norm

_PROBE = "from flashinfer import _norm, _activation; print(_norm._tuning(), _activation._tuning())"


def _probe(env):
    full = {k: v for k, v in os.environ.items() if not k.startswith(("FLASHINFER_NORM_", "FLASHINFER_ACT_"))}
    full.update(env)
    r = subprocess.run([sys.executable, "-c", _PROBE], env=full, capture_output=True, text=True, check=True)
    return r.stdout.strip()


def test_defaults_without_environment():
    assert _probe({}) == "('auto', 0, 0, 'plain') ('auto', 0)"


def test_environment_selects_variants():
    env = {"FLASHINFER_NORM_VARIANT": "rows", "FLASHINFER_NORM_VPT": "2", "FLASHINFER_NORM_ROWS": "4",
           "FLASHINFER_NORM_LOAD": "na", "FLASHINFER_ACT_VARIANT": "pipe", "FLASHINFER_ACT_UNROLL": "8"}
    assert _probe(env) == "('rows', 2, 4, 'na') ('pipe', 8)"
    assert _probe({"FLASHINFER_NORM_VARIANT": "pipe", "FLASHINFER_ACT_VARIANT": "flat"}) == \
        "('pipe', 0, 0, 'plain') ('flat', 0)"


def test_invalid_environment_values_mean_auto():
    env = {"FLASHINFER_NORM_VARIANT": "fast", "FLASHINFER_NORM_VPT": "3", "FLASHINFER_NORM_ROWS": "8",
           "FLASHINFER_NORM_LOAD": "x", "FLASHINFER_ACT_VARIANT": "?", "FLASHINFER_ACT_UNROLL": "16"}
    assert _probe(env) == "('auto', 0, 0, 'plain') ('auto', 0)"


@pytest.mark.parametrize("args, match", [
    (("fast",), "variant must be 'auto', 'rows' or 'pipe'; got 'fast'"),
    (("rows", 3), "vecs_per_thread must be 0 \\(auto\\), 1, 2, 4 or 8; got 3"),
    (("rows", 16), "vecs_per_thread must be 0 \\(auto\\), 1, 2, 4 or 8; got 16"),
    (("rows", 1, 8), "rows_per_block must be 0 \\(auto\\), 1, 2 or 4; got 8"),
    (("rows", 1, -1), "rows_per_block must be 0 \\(auto\\), 1, 2 or 4; got -1"),
    (("rows", 1, 1, "nc"), "load must be 'plain' or 'na'; got 'nc'"),
])
def test_norm_set_tuning_rejects_bad_values(args, match):
    saved = _norm._tuning()
    with pytest.raises(ValueError, match=match):
        _norm._set_tuning(*args)
    assert _norm._tuning() == saved, "a rejected call must not change the tuning"


@pytest.mark.parametrize("args, match", [
    (("pipelined",), "variant must be 'auto', 'flat' or 'pipe'; got 'pipelined'"),
    (("flat", 3), "unroll must be 0 \\(auto\\), 1, 2, 4 or 8; got 3"),
])
def test_act_set_tuning_rejects_bad_values(args, match):
    saved = _activation._tuning()
    with pytest.raises(ValueError, match=match):
        _activation._set_tuning(*args)
    assert _activation._tuning() == saved


def test_set_tuning_round_trip():
    saved_n, saved_a = _norm._tuning(), _activation._tuning()
    try:
        _norm._set_tuning("pipe", 0, 2, "na")
        assert _norm._tuning() == ("pipe", 0, 2, "na")
        _activation._set_tuning("flat", 2)
        assert _activation._tuning() == ("flat", 2)
    finally:
        _norm._set_tuning(*saved_n)
        _activation._set_tuning(*saved_a)
    assert _norm._tuning() == saved_n and _activation._tuning() == saved_a
