"""CPU checks of the float64 state-merge references (reference_cascade.py) that the GPU tests
compare against: they reproduce attention over the union of key sets, treat empty states as
the identity, and agree with a direct logsumexp formulation."""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import reference_cascade as ref  # noqa: E402


def _split_states(h=4, d=16, n=37, parts=5, seed=0):
    g = torch.Generator().manual_seed(seed)
    q = torch.randn(h, d, generator=g, dtype=torch.float64)
    k = torch.randn(n, h, d, generator=g, dtype=torch.float64)
    v = torch.randn(n, h, d, generator=g, dtype=torch.float64)
    owner = torch.randint(0, parts, (n,), generator=g)
    owner[:3] = 0  # part `parts - 1` may still be empty; force one empty part explicitly below
    return q, k, v, owner


@pytest.mark.parametrize("parts", [1, 2, 5, 9])
def test_merging_partition_states_equals_attention_over_all_keys(parts):
    q, k, v, owner = _split_states(parts=parts)
    scale = 1 / math.sqrt(q.shape[-1])
    full_o, full_s = ref.attention_state(q, k, v, scale)
    states = [ref.attention_state(q, k[owner == p], v[owner == p], scale) for p in range(parts)]
    states.append(ref.attention_state(q, k[:0], v[:0], scale))  # an empty part
    vs = torch.stack([o for o, _ in states])[None]  # [1, K, H, D]
    ss = torch.stack([s for _, s in states])[None]  # [1, K, H]
    mo, ms = ref.merge_states(vs, ss)
    torch.testing.assert_close(mo[0], full_o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(ms[0], full_s, rtol=1e-12, atol=1e-12)
    # Pairwise merges in any order give the same state.
    acc_o, acc_s = states[-1][0][None], states[-1][1][None]
    for o, s in reversed(states[:-1]):
        acc_o, acc_s = ref.merge_state(acc_o, acc_s, o[None], s[None])
    torch.testing.assert_close(acc_o[0], full_o, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(acc_s[0], full_s, rtol=1e-12, atol=1e-12)


def test_lse_is_base_2():
    q = torch.zeros(1, 4, dtype=torch.float64)
    k = torch.zeros(8, 1, 4, dtype=torch.float64)
    _, s = ref.attention_state(q, k, torch.zeros(8, 1, 4, dtype=torch.float64), 1.0)
    assert s.item() == pytest.approx(3.0)  # log2(8 * e^0)


def test_empty_state_is_the_identity_and_empty_plus_empty_is_zero():
    v_a = torch.randn(3, 2, 8, dtype=torch.float64)
    s_a = torch.randn(3, 2, dtype=torch.float64)
    empty_v = torch.randn(3, 2, 8, dtype=torch.float64)  # ignored: zero weight
    empty_s = torch.full((3, 2), -math.inf, dtype=torch.float64)
    o, s = ref.merge_state(v_a, s_a, empty_v, empty_s)
    assert torch.equal(o, v_a) and torch.equal(s, s_a)
    o, s = ref.merge_state(empty_v * 0, empty_s, empty_v * 0, empty_s)
    assert torch.equal(o, torch.zeros_like(o)) and torch.isneginf(s).all()
    o, s = ref.merge_states(torch.zeros(2, 0, 3, 4), torch.zeros(2, 0, 3))
    assert torch.equal(o, torch.zeros(2, 3, 4, dtype=torch.float64)) and torch.isneginf(s).all()


def test_merge_state_matches_the_spec_formula_with_large_spreads():
    g = torch.Generator().manual_seed(1)
    v_a, v_b = torch.randn(5, 3, 8, generator=g), torch.randn(5, 3, 8, generator=g)
    s_a, s_b = torch.randn(5, 3, generator=g) * 40, torch.randn(5, 3, generator=g) * 40
    o, s = ref.merge_state(v_a, s_a, v_b, s_b)
    a, b = s_a.double(), s_b.double()
    m = torch.maximum(a, b)
    wa, wb = torch.exp2(a - m), torch.exp2(b - m)
    torch.testing.assert_close(o, (wa[..., None] * v_a.double() + wb[..., None] * v_b.double()) / (wa + wb)[..., None])
    torch.testing.assert_close(s, m + torch.log2(wa + wb))
    # Same as a natural-log logsumexp of the two LSEs, converted.
    torch.testing.assert_close(s, torch.logsumexp(torch.stack([a, b]) * ref.LN2, dim=0) / ref.LN2)


def test_merge_states_chunking_does_not_change_the_result():
    v = torch.randn(10, 6, 2, 4)
    s = torch.randn(10, 6, 2) * 5
    s[3, :, 1] = -math.inf  # a row-head whose states are all empty
    o1, s1 = ref.merge_states(v, s, chunk_rows=3)
    o2, s2 = ref.merge_states(v, s, chunk_rows=64)
    assert torch.equal(o1, o2) and torch.equal(s1, s2)
    assert torch.equal(o1[3, 1], torch.zeros(4, dtype=torch.float64)) and torch.isneginf(s1[3, 1])
