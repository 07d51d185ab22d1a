"""Host-side pieces of flashinfer.decode that need no GPU."""

from __future__ import annotations

import flashinfer.decode as decode


def test_single_plan_cache_is_bounded(monkeypatch):
    """A decode loop asks single_plan for a new kv_len every step: the cache must not grow
    without bound, and what it returns is always the value just remembered."""
    monkeypatch.setattr(decode, "_SINGLE_PLAN_CACHE", {})
    monkeypatch.setattr(decode, "_SINGLE_PLAN_CACHE_MAX", 4)
    for n in range(1, 11):
        assert decode._remember_single_plan((n,), (n, 1, 0)) == (n, 1, 0)
        assert 1 <= len(decode._SINGLE_PLAN_CACHE) <= 4
        assert decode._SINGLE_PLAN_CACHE[(n,)] == (n, 1, 0)
