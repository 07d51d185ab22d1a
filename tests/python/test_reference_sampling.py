"""CPU cross-checks of reference_sampling against brute-force O(V^2) definitions, and of the
chi-square helper (a right reference passes, a wrong one fails) on torch.multinomial draws."""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import reference_sampling as ref  # noqa: E402


def brute_sets(p, k, top_p, min_p):
    p = p.double()
    z, mx = float(p[p > 0].sum()), float(p.max())
    ink, inp, inm = [], [], []
    for i in range(p.numel()):
        x = float(p[i])
        greater = p[p > x]
        ink.append(x > 0 and (k <= 0 or k >= int((p > 0).sum()) or greater.numel() < k))
        inp.append(x > 0 and (top_p >= 1 or float(greater.sum()) < top_p * z or x == mx))
        inm.append(x > 0 and (min_p <= 0 or x >= min_p * mx or x == mx))
    return torch.tensor(ink), torch.tensor(inp), torch.tensor(inm)


@pytest.mark.parametrize("trial", range(20))
def test_masks_match_brute_force(trial):
    g = torch.Generator().manual_seed(trial)
    v = [5, 8, 17, 64][trial % 4]
    p = torch.rand(v, generator=g)
    if trial % 3 == 0:  # ties and zeros
        p = (p * 4).floor() / 4
    p = p / p.sum()
    for k in (0, 1, 3, v, v + 5):
        for top_p in (0.1, 0.5, 0.9, 1.0):
            for min_p in (0.0, 0.3, 1.0):
                ink, inp, inm = brute_sets(p, k, top_p, min_p)
                assert torch.equal(ref.top_k_mask(p[None], k)[0], ink)
                assert torch.equal(ref.top_p_mask(p[None], top_p)[0], inp)
                assert torch.equal(ref.min_p_mask(p[None], min_p)[0], inm)
                assert torch.equal(ref.joint_mask(p[None], k, top_p)[0], ink & inp)
                pk = torch.where(ink, p.double(), torch.zeros_like(p.double()))
                assert torch.equal(ref.top_k_first_mask(p[None], k, top_p)[0], ink & brute_sets(pk, 0, top_p, 0)[1])


def test_per_row_parameters_and_margin():
    p = torch.tensor([[0.5, 0.3, 0.2, 0.0], [0.1, 0.2, 0.3, 0.4]])
    assert ref.top_k_mask(p, torch.tensor([1, 3])).tolist() == [[True, False, False, False], [False, True, True, True]]
    sure_in, sure_out = ref.top_p_mask(p, 0.7, margin=1e-6)
    assert sure_in[0].tolist() == [True, True, False, False] and sure_out[0].tolist() == [False, False, True, True]
    # 0.5 + 0.3 == 0.8: the third entry sits on the boundary, neither sure in nor sure out
    sure_in, sure_out = ref.top_p_mask(torch.tensor([[0.5, 0.3, 0.2]]), 0.8, margin=1e-6)
    assert not sure_in[0, 2] and not sure_out[0, 2]


def test_mask_logits_reference():
    x = torch.tensor([[1.0, float("-inf"), 3.0, 3.0, float("nan"), 0.5]])
    out = ref.top_k_mask_logits(x, 2)
    assert out[0].tolist()[:4] == [float("-inf"), float("-inf"), 3.0, 3.0]
    assert torch.isinf(out[0, 4]) and torch.isinf(out[0, 5])
    assert torch.equal(ref.top_k_mask_logits(x, 6)[0, :4], x[0, :4].double())


def test_chi_square_accepts_right_and_rejects_wrong_reference():
    g = torch.Generator().manual_seed(0)
    p = torch.tensor([0.3, 0.25, 0.2, 0.1, 0.1, 0.05, 0.0])
    mask = ref.top_k_mask(p[None], 3)[0]
    dist = ref.filtered_dist(p[None], mask[None])[0]
    draws = torch.multinomial(dist.float(), 200000, replacement=True, generator=g)
    stat, df, zero_hits = ref.chi_square(ref.counts_of(draws, 7), dist)
    assert zero_hits == 0 and stat < ref.chi_square_bound(df)
    wrong = ref.filtered_dist(p[None], ref.top_k_mask(p[None], 4))[0]  # k off by one
    stat, df, zero_hits = ref.chi_square(ref.counts_of(draws, 7), wrong)
    assert stat > ref.chi_square_bound(df) or zero_hits > 0
