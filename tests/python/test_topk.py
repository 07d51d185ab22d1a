"""GPU tests of flashinfer.top_k (flashinfer.topk.top_k): shapes and dtypes, values equal to the
input at the returned indices, the exact top-k set (float64 reference on the same values), tie
breaking at the k-th value, sorted order and determinism; index agreement with torch.topk."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
from flashinfer.topk import TopKTieBreak, top_k  # noqa: E402

pytestmark = pytest.mark.gpu

CUDA = "cuda"


def reference_sets(x, k, tie_break):
    """The expected index set per row: everything above the k-th value, then the ties at it by
    index (largest first for LARGE, smallest otherwise); NaN ranks lowest."""
    out = []
    xd = x.double().cpu()
    for row in xd:
        key = torch.where(torch.isnan(row), torch.full_like(row, -float("inf")), row)
        nan = torch.isnan(row)
        idx = torch.arange(row.numel())
        # sort by (not NaN, value) descending, then index per the tie break
        order = sorted(range(row.numel()), key=lambda i: (bool(nan[i]), -float(key[i]),
                                                          -i if tie_break == TopKTieBreak.LARGE else i))
        out.append(set(int(idx[i]) for i in order[:k]))
    return out


@pytest.mark.parametrize("batch", [1, 16, 64])
@pytest.mark.parametrize("vocab", [32000, 65536, 128512])
@pytest.mark.parametrize("k", [256, 512, 1024])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_top_k_matches_torch(batch, vocab, k, dtype):
    x = torch.randn(batch, vocab, device=CUDA).to(dtype)
    values, indices = top_k(x, k)
    assert values.shape == (batch, k) and indices.shape == (batch, k)
    assert values.dtype == dtype and indices.dtype == torch.int64
    assert torch.equal(values, torch.gather(x, 1, indices))
    ref_vals, ref_idx = torch.topk(x, k, dim=-1)
    # the same multiset of values (ties may pick other indices)
    assert torch.equal(torch.sort(values.float(), -1).values, torch.sort(ref_vals.float(), -1).values)
    agree = sum(len(set(a.tolist()) & set(b.tolist())) for a, b in zip(indices, ref_idx)) / (batch * k)
    assert agree >= 0.97, f"index agreement {agree:.3f}"
    if dtype == torch.float32:
        assert agree == 1.0


@pytest.mark.parametrize("tie_break", [TopKTieBreak.NONE, TopKTieBreak.SMALL, TopKTieBreak.LARGE])
@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
def test_exact_set_with_ties_and_nan(tie_break, dtype):
    g = torch.Generator().manual_seed(int(tie_break))
    x = (torch.randint(0, 16, (8, 5000), generator=g).float() / 4).to(dtype)  # heavy ties
    x[3, ::7] = float("nan")
    x[4] = float("nan")
    x[4, :3] = 1.0
    x[5, 100:] = -float("inf")
    x = x.to(CUDA)
    for k in (1, 7, 100, 4999, 5000):
        values, indices = top_k(x, k, tie_break=tie_break)
        expect = reference_sets(x, k, tie_break)
        for r in range(x.shape[0]):
            assert set(indices[r].tolist()) == expect[r], f"row {r} k={k}"
        v = torch.gather(x, 1, indices)
        assert torch.equal(torch.isnan(values), torch.isnan(v)) and torch.equal(values[~torch.isnan(v)], v[~torch.isnan(v)])


def test_sorted_and_deterministic():
    x = torch.randn(16, 65536, device=CUDA)
    x[:, :50] = 3.0  # ties kept in index order when sorted
    values, indices = top_k(x, 300, sorted=True)
    assert bool((values[:, 1:] <= values[:, :-1]).all())
    ref_vals, _ = torch.topk(x, 300, dim=-1, sorted=True)
    assert torch.equal(values, ref_vals)
    tied = values == values[:, :1]
    for r in range(x.shape[0]):
        t = indices[r][tied[r]]
        assert bool((t[1:] > t[:-1]).all())
    for _ in range(3):
        v2, i2 = top_k(x, 300, sorted=True)
        assert torch.equal(v2, values) and torch.equal(i2, indices)
    u1, j1 = top_k(x, 300)
    u2, j2 = top_k(x, 300, deterministic=True)
    assert torch.equal(u1, u2) and torch.equal(j1, j2)


def test_top_level_exports():
    assert flashinfer.top_k is top_k and flashinfer.topk.top_k is top_k
    assert flashinfer.TopKTieBreak is TopKTieBreak and int(TopKTieBreak.LARGE) == 2
