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


def test_page_table_check_exact_and_graph_tail():
    """Outside CUDA graphs indptr[-1] must equal len(indices); CUDA-graph plans accept a longer
    indices (an engine's whole fixed-size buffer, as SGLang passes it) and use only the prefix:
    entries past indptr[-1] (stale, even negative) are neither checked nor returned."""
    import numpy as np
    import pytest

    indptr = np.array([0, 2, 3], dtype=np.int64)
    last = np.array([5, 16], dtype=np.int64)
    exact = np.array([7, 3, 9], dtype=np.int64)
    lens, used = decode._check_page_table(indptr, exact, last, 16)
    assert lens.tolist() == [21, 16] and used.tolist() == [7, 3, 9]
    longer = np.array([7, 3, 9, -5, 123456], dtype=np.int64)
    with pytest.raises(ValueError, match=r"indptr\[-1\] \(3\) must equal len\(indices\) \(5\)"):
        decode._check_page_table(indptr, longer, last, 16)
    lens, used = decode._check_page_table(indptr, longer, last, 16, allow_tail=True)
    assert lens.tolist() == [21, 16] and used.tolist() == [7, 3, 9]
    with pytest.raises(ValueError, match=r"indptr\[-1\] \(3\) must be <= len\(indices\) \(2\)"):
        decode._check_page_table(indptr, exact[:2], last, 16, allow_tail=True)
    with pytest.raises(ValueError, match="indices must be >= 0"):  # the prefix is still checked
        decode._check_page_table(indptr, np.array([7, -1, 9, 0]), last, 16, allow_tail=True)


def test_single_decode_non_tensor_is_a_type_error_naming_it():
    import pytest

    torch = pytest.importorskip("torch")
    qkv = dict(q=torch.randn(32, 128, dtype=torch.float16), k=torch.randn(16, 8, 128, dtype=torch.float16),
               v=torch.randn(16, 8, 128, dtype=torch.float16))
    for arg in qkv:
        for value in ([0, 1], 2.5, None):
            with pytest.raises(TypeError, match=f"^{arg} must be a tensor supporting DLPack .*; got "
                                                f"{type(value).__name__}$"):
                decode.single_decode_with_kv_cache(**dict(qkv, **{arg: value}))
