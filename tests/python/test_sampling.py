"""GPU tests of flashinfer.sampling against the float64 definitions in reference_sampling.py.

* Statistics (vocab 8 / 64 / 1024): 2^17 draws of one row through ``indices`` per filter (plain,
  top-k, top-p, min-p, joint, top-k-first) with a fixed seed; the counts must pass a chi-square
  test against the exact filtered, renormalized distribution and never hit a token outside the
  set, and a deliberately wrong reference (k off by one, top-p on the wrong mass, min-p against
  the wrong maximum) must fail the same test.
* Invariants at vocab 128256 (and odd vocab sizes), batch 1..512, many seeds and adversarial
  rows (ties, one dominant token, zero tails, denormals): every draw lies in its set and never
  on a zero-probability token.
* Renorm / mask: support exactly as the reference (top-p: wherever the boundary is not within
  fp32 rounding), values within 1e-5 (fp32) or one 16-bit rounding.
* softmax, Gumbel sampling from logits, seeds / offsets / generators, indices dtypes, NaN rows,
  chain speculative sampling (the output distribution is the target's).
"""

from __future__ import annotations

import math

import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
import flashinfer.sampling as fs  # noqa: E402
import reference_sampling as ref  # noqa: E402

pytestmark = pytest.mark.gpu

CUDA = "cuda"
N_DRAWS = 1 << 17


def softmax_row(vocab, scale, seed, zeros=0.0):
    g = torch.Generator().manual_seed(seed)
    logits = torch.randn(vocab, generator=g, dtype=torch.float64) * scale
    if zeros:
        logits[torch.randperm(vocab, generator=g)[: int(vocab * zeros)]] = -math.inf
    return torch.softmax(logits, 0).float()


def clear_row(vocab, seed, top_p_values):
    """A row whose top-p boundaries are clear of fp32 rounding for every top_p given."""
    for s in range(seed, seed + 200):
        p = softmax_row(vocab, 1.5, s)[None]
        if all(not (~ref.top_p_mask(p, tp, 1e-4)[0] & ~ref.top_p_mask(p, tp, 1e-4)[1]).any() for tp in top_p_values):
            return p
    raise AssertionError("no row with clear top-p boundaries")


def draw(fn, p, *args, **kw):
    """N_DRAWS samples of row 0 of p (on the GPU) through indices."""
    idx = torch.zeros(N_DRAWS, dtype=torch.int32, device=CUDA)
    return fn(p.to(CUDA), *args, indices=idx, seed=1234, offset=0, **kw)


def assert_distribution(samples, p, mask, wrong_masks=()):
    counts = ref.counts_of(samples.cpu(), p.shape[-1])
    p, mask = p.cpu(), mask.cpu()
    dist = ref.filtered_dist(p, mask)[0]
    assert int(counts[~mask[0]].sum()) == 0, "drew a token outside the filtered set"
    stat, df, _ = ref.chi_square(counts, dist)
    assert stat < ref.chi_square_bound(df), f"chi-square {stat:.1f} with {df} degrees of freedom"
    checked = 0
    for wrong in wrong_masks:
        wdist = ref.filtered_dist(p, wrong.cpu())[0]
        if float((wdist - dist).abs().sum()) < 0.04:  # too close to tell apart with 2^17 draws
            continue
        wstat, wdf, whits = ref.chi_square(counts, wdist)
        assert wstat > ref.chi_square_bound(wdf) or whits > 0, "a wrong reference passed the test"
        checked += 1
    return checked


VOCABS = (8, 64, 1024)


@pytest.mark.parametrize("vocab", VOCABS)
def test_plain_distribution(vocab):
    p = softmax_row(vocab, 1.5, vocab, zeros=0.25)
    samples = draw(fs.sampling_from_probs, p[None])
    assert_distribution(samples, p[None], p[None] > 0)


@pytest.mark.parametrize("vocab", VOCABS)
def test_unnormalized_distribution(vocab):
    p = softmax_row(vocab, 1.0, vocab + 1)[None] * 37.5
    assert_distribution(draw(fs.sampling_from_probs, p), p, p > 0)
    k = max(2, vocab // 4)
    assert_distribution(draw(fs.top_k_sampling_from_probs, p, k), p, ref.top_k_mask(p, k))


@pytest.mark.parametrize("vocab", VOCABS)
def test_top_k_distribution(vocab):
    p = softmax_row(vocab, 1.5, vocab + 2)[None]
    checked = 0
    for k in sorted({1, 2, 3, max(3, vocab // 8)}):
        mask = ref.top_k_mask(p, k)
        checked += assert_distribution(draw(fs.top_k_sampling_from_probs, p, k), p, mask,
                                       [ref.top_k_mask(p, k + 1), ref.top_k_mask(p, k - 1)])
    assert checked >= 2


@pytest.mark.parametrize("vocab", VOCABS)
def test_top_p_distribution(vocab):
    ps = (0.3, 0.6, 0.9)
    p = clear_row(vocab, vocab + 3, ps)
    checked = 0
    for tp in ps:
        mask = ref.top_p_mask(p, tp)
        # wrong: the nucleus measured against a different total (p not renormalized first)
        checked += assert_distribution(draw(fs.top_p_sampling_from_probs, p, tp), p, mask,
                                       [ref.top_p_mask(p, tp, mass=torch.tensor([0.8]))])
    assert checked >= 1


@pytest.mark.parametrize("vocab", VOCABS)
def test_min_p_distribution(vocab):
    p = softmax_row(vocab, 1.5, vocab + 4)[None]
    checked = 0
    for mp in (0.05, 0.2, 0.5):
        mask = ref.min_p_mask(p, mp)
        second = torch.topk(p[0], 2).values[1]
        wrong = (p >= mp * second) & (p > 0)  # min-p against the wrong maximum
        checked += assert_distribution(draw(fs.min_p_sampling_from_probs, p, mp), p, mask, [wrong])
    assert checked >= 1


@pytest.mark.parametrize("vocab", VOCABS)
def test_top_k_top_p_distributions(vocab):
    tp = 0.7
    p = clear_row(vocab, vocab + 5, (tp,))
    k = max(3, vocab // 4)
    p_k = torch.where(ref.top_k_mask(p, k), p.double(), torch.zeros_like(p.double()))
    if (~ref.top_p_mask(p_k, tp, 1e-4)[0] & ~ref.top_p_mask(p_k, tp, 1e-4)[1]).any():
        pytest.skip("top-k-first boundary within rounding for this row")
    joint, first = ref.joint_mask(p, k, tp), ref.top_k_first_mask(p, k, tp)
    assert_distribution(draw(fs.top_k_top_p_sampling_from_probs, p, k, tp, filter_apply_order="joint"), p, joint,
                        [first])
    assert_distribution(draw(fs.top_k_top_p_sampling_from_probs, p, k, tp), p, first, [joint])
    # per-row tensors give the same draws as scalars
    kk = torch.full((1,), k, device=CUDA)
    pp = torch.full((1,), tp, device=CUDA)
    assert torch.equal(draw(fs.top_k_top_p_sampling_from_probs, p, kk, pp), draw(fs.top_k_top_p_sampling_from_probs, p, k, tp))


# ---- invariants on large vocabularies ------------------------------------------------------------


def adversarial_rows(vocab, rows, seed):
    g = torch.Generator().manual_seed(seed)
    out = []
    kinds = ["randn1", "randn5", "uniform", "half_zero", "dominant", "denormal", "ties", "rand"]
    for r in range(rows):
        kind = kinds[r % len(kinds)]
        if kind == "randn1":
            x = torch.softmax(torch.randn(vocab, generator=g, dtype=torch.float64), 0)
        elif kind == "randn5":
            x = torch.softmax(5 * torch.randn(vocab, generator=g, dtype=torch.float64), 0)
        elif kind == "uniform":
            x = torch.full((vocab,), 1.0 / vocab, dtype=torch.float64)
        elif kind == "half_zero":
            x = torch.rand(vocab, generator=g, dtype=torch.float64)
            x[torch.randperm(vocab, generator=g)[: vocab // 2]] = 0
        elif kind == "dominant":
            x = torch.full((vocab,), 1e-12, dtype=torch.float64)
            x[int(torch.randint(vocab, (1,), generator=g))] = 1.0
        elif kind == "denormal":
            x = torch.rand(vocab, generator=g, dtype=torch.float64) * 1e-39
            x[:7] = torch.tensor([0.3, 0.2, 0.2, 0.1, 1e-40, 0.0, 0.05], dtype=torch.float64)
        elif kind == "ties":
            x = (torch.rand(vocab, generator=g, dtype=torch.float64) * 8).floor() + 1
        else:
            x = torch.rand(vocab, generator=g, dtype=torch.float64)
        out.append(x / x.sum())
    return torch.stack(out).float()


FILTERS = {
    "top_k": lambda p, s, o: fs.top_k_sampling_from_probs(p, K, seed=s, offset=o),
    "top_p": lambda p, s, o: fs.top_p_sampling_from_probs(p, P, seed=s, offset=o),
    "min_p": lambda p, s, o: fs.min_p_sampling_from_probs(p, MINP, seed=s, offset=o),
    "joint": lambda p, s, o: fs.top_k_top_p_sampling_from_probs(p, K, P, filter_apply_order="joint", seed=s, offset=o),
    "top_k_first": lambda p, s, o: fs.top_k_top_p_sampling_from_probs(p, K, P, seed=s, offset=o),
    "plain": lambda p, s, o: fs.sampling_from_probs(p, seed=s, offset=o),
}
K, P, MINP = None, None, None


def allowed(name, p, k, tp, mp):
    """Tokens a draw may land on: the set, plus top-p members within rounding of the boundary."""
    if name == "plain":
        return p > 0
    if name == "top_k":
        return ref.top_k_mask(p, k)
    if name == "min_p":
        return ref.min_p_mask(p, mp)
    if name == "top_p":
        return ~ref.top_p_mask(p, tp, 1e-5)[1]
    pk = torch.where(ref.top_k_mask(p, k), p.double(), torch.zeros_like(p.double()))
    base = p if name == "joint" else pk
    return ref.top_k_mask(p, k) & ~ref.top_p_mask(base, tp, 1e-5)[1]


@pytest.mark.parametrize("vocab, batch", [(128256, 1), (128256, 37), (128256, 512), (128257, 16), (111, 512), (1023, 64)])
@pytest.mark.parametrize("name", sorted(FILTERS))
def test_draws_stay_in_the_set(vocab, batch, name):
    global K, P, MINP
    p = adversarial_rows(vocab, batch, vocab + batch).to(CUDA)
    for K, P, MINP in [(1, 0.1, 0.05), (10, 0.5, 0.1), (100, 0.9, 0.7), (500, 1.0, 1.0), (vocab + 3, 0.99, 0.0)]:
        ok = allowed(name, p, K, P, MINP)
        for seed in range(3):
            samples = FILTERS[name](p, seed, 4 * seed)
            assert samples.dtype == torch.int32 and samples.shape == (batch,)
            rows = torch.arange(batch, device=CUDA)
            good = ok[rows, samples.long()]
            assert bool(good.all()), (f"{name} k={K} p={P} min_p={MINP} seed={seed}: rows "
                                      f"{torch.nonzero(~good).flatten().tolist()[:8]} drew outside the set")


def test_per_row_parameters_and_draw_statistics():
    vocab, batch = 32000, 64
    p = adversarial_rows(vocab, batch, 7).to(CUDA)
    k = torch.randint(1, 200, (batch,), device=CUDA)
    k[::5] = vocab  # rows without a top-k
    tp = torch.rand(batch, device=CUDA) * 0.9 + 0.05
    for order in ("joint", "top_k_first"):
        s = fs.top_k_top_p_sampling_from_probs(p, k, tp, filter_apply_order=order, seed=3, offset=0)
        mask = ref.joint_mask(p, k, 2.0) if order == "joint" else ref.top_k_mask(p, k)  # top-k part is exact
        assert bool(mask[torch.arange(batch, device=CUDA), s.long()].all())
        samples, stats = fs._sample_with_stats(p, top_k=k, top_p=tp, filter_apply_order=order, seed=3, offset=0)
        assert torch.equal(samples, s)
        assert bool((stats[:, 0] >= 1).all()) and bool((stats[:, 0] <= 32).all()) and bool((stats[:, 1] >= 1).all())


# ---- renormalization and masks -------------------------------------------------------------------


@pytest.mark.parametrize("batch, vocab", [(1, 111), (99, 32000), (16, 128256)])
@pytest.mark.parametrize("top_p", [0.1, 0.5, 0.9, 1.0, "per_row"])
def test_top_p_renorm(batch, vocab, top_p):
    p = adversarial_rows(vocab, batch, batch + vocab).to(CUDA)
    tp = torch.linspace(0.1, 0.95, batch, device=CUDA) if top_p == "per_row" else top_p
    out = fs.top_p_renorm_probs(p, tp)
    assert out.dtype == torch.float32 and out.shape == p.shape
    sure_in, sure_out = ref.top_p_mask(p, tp, 1e-5)
    kept = out > 0
    assert bool(kept[sure_in].all()) and not bool(kept[sure_out & (p > 0)].any())
    expected = ref.renorm(p, kept)  # the reference over the kernel's (verified) support
    assert torch.allclose(out.double(), expected, atol=1e-5, rtol=1e-5)
    assert torch.allclose(out.double().sum(-1), torch.ones(batch, dtype=torch.float64, device=CUDA), atol=1e-4)


@pytest.mark.parametrize("batch, vocab", [(1, 111), (19, 32000), (8, 128256)])
@pytest.mark.parametrize("k", [1, 10, 100, 500, "per_row"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_top_k_renorm(batch, vocab, k, dtype):
    p = adversarial_rows(vocab, batch, batch * vocab).to(dtype).to(CUDA)
    kk = torch.randint(1, 600, (batch,), device=CUDA) if k == "per_row" else k
    out = fs.top_k_renorm_probs(p, kk)
    assert out.dtype == dtype and out.shape == p.shape
    mask = ref.top_k_mask(p, kk)
    expected = ref.renorm(p, mask)
    kept = out > 0
    assert not bool((kept & ~mask).any())
    assert bool((kept | ~mask | (expected < 1e-5)).all())  # (16-bit outputs may underflow to 0)
    tol = {torch.float32: 1e-5, torch.float16: 2.0**-10, torch.bfloat16: 2.0**-7}[dtype]
    assert torch.allclose(out.double(), expected, atol=1e-5, rtol=tol)


@pytest.mark.parametrize("batch, vocab", [(1, 111), (19, 32000), (8, 128256)])
@pytest.mark.parametrize("k", [1, 10, 500, "per_row"])
@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("neginf", [False, True])
def test_top_k_mask_logits(batch, vocab, k, dtype, neginf):
    g = torch.Generator().manual_seed(batch + vocab)
    logits = torch.randn(batch, vocab, generator=g) * 3
    if dtype != torch.float32:
        logits = (logits * 4).round() / 4  # ties in 16-bit
    if neginf:
        logits[torch.rand(batch, vocab, generator=g) < 0.3] = -math.inf
    logits = logits.to(dtype).to(CUDA)
    kk = torch.randint(1, 600, (batch,), device=CUDA) if k == "per_row" else k
    out = fs.top_k_mask_logits(logits, kk)
    assert out.dtype == dtype
    assert torch.equal(out.double(), ref.top_k_mask_logits(logits, kk))


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
def test_mixed_k_with_full_rows(dtype):
    batch, vocab = 64, 131072
    probs = torch.softmax(torch.rand(batch, vocab, device=CUDA), -1).to(dtype)
    k = torch.randint(1, 1000, (batch,), device=CUDA)
    k[torch.rand(batch, device=CUDA) < 0.5] = vocab
    out = fs.top_k_renorm_probs(probs, k)
    assert torch.equal(out > 0, ref.top_k_mask(probs, k))
    masked = fs.top_k_mask_logits(probs, k)
    assert torch.equal(torch.isfinite(masked), ref.top_k_mask(probs, k))
    full = k == vocab
    assert torch.equal(masked[full], probs[full])


# ---- softmax and sampling from logits -----------------------------------------------------------


@pytest.mark.parametrize("batch, vocab", [(1, 111), (99, 32000), (7, 128256)])
@pytest.mark.parametrize("temperature", [1.0, 0.5, 0.1])
@pytest.mark.parametrize("per_row", [False, True])
@pytest.mark.parametrize("neginf", [False, True])
def test_softmax(batch, vocab, temperature, per_row, neginf):
    logits = torch.randn(batch, vocab, device=CUDA) * 5
    if neginf:
        logits[torch.rand(batch, vocab, device=CUDA) < 0.5] = -math.inf
        logits[:, 0] = 0.0  # every row keeps a finite logit
    t = torch.full((batch,), temperature, device=CUDA) if per_row else temperature
    out = fs.softmax(logits, temperature=t)
    expected = torch.softmax(logits / (t[:, None] if per_row else t), -1)
    assert out.dtype == torch.float32 and torch.allclose(out, expected, atol=1e-5)
    if neginf:
        assert bool((out[torch.isinf(logits)] == 0).all())


def test_softmax_zero_temperature_and_dtypes():
    logits = torch.randn(3, 100, device=CUDA)
    logits[:, 5] = -math.inf
    out = fs.softmax(logits, temperature=0.0)
    expected = torch.full_like(out, 1 / 99)
    expected[:, 5] = 0
    assert torch.allclose(out, expected, atol=1e-6)
    for dt in (torch.float16, torch.bfloat16, torch.float64):
        t = torch.full((3,), 0.5, dtype=dt, device=CUDA)
        assert torch.allclose(fs.softmax(logits, t), torch.softmax(logits / 0.5, -1), atol=1e-5)


@pytest.mark.parametrize("vocab", [8, 64, 1024])
def test_sampling_from_logits_distribution(vocab):
    g = torch.Generator().manual_seed(vocab)
    logits = torch.randn(1, vocab, generator=g) * 2
    logits[0, torch.randperm(vocab, generator=g)[: vocab // 4]] = -math.inf
    samples = draw(fs.sampling_from_logits, logits)
    probs = torch.softmax(logits.double(), -1)
    assert_distribution(samples, probs, probs > 0)


@pytest.mark.parametrize("batch, vocab", [(1, 111), (99, 32000), (989, 128256)])
def test_sampling_from_logits_range(batch, vocab):
    logits = torch.randn(batch, vocab, device=CUDA)
    logits[:, ::3] = -math.inf
    for seed in range(3):
        s = fs.sampling_from_logits(logits, seed=seed, offset=0)
        assert s.dtype == torch.int32 and bool(((s >= 0) & (s < vocab)).all())
        assert bool(torch.isfinite(logits[torch.arange(batch, device=CUDA), s.long()]).all())


# ---- randomness, indices, validity ---------------------------------------------------------------


SAMPLERS = {
    "from_probs": lambda p, **kw: fs.sampling_from_probs(p, **kw),
    "from_logits": lambda p, **kw: fs.sampling_from_logits(torch.log(p), **kw),
    "top_p": lambda p, **kw: fs.top_p_sampling_from_probs(p, 0.9, **kw),
    "top_k": lambda p, **kw: fs.top_k_sampling_from_probs(p, 100, **kw),
    "min_p": lambda p, **kw: fs.min_p_sampling_from_probs(p, 0.1, **kw),
    "joint": lambda p, **kw: fs.top_k_top_p_sampling_from_probs(p, 100, 0.9, filter_apply_order="joint", **kw),
    "top_k_first": lambda p, **kw: fs.top_k_top_p_sampling_from_probs(p, 100, 0.9, **kw),
}
INCREMENT = {"from_probs": 1, "min_p": 1, "from_logits": None, "top_p": 32, "top_k": 32, "joint": 32,
             "top_k_first": 32}


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_seed_offset_reproducible_and_fresh(name):
    batch, vocab = 1000, 32000
    p = torch.softmax(torch.randn(batch, vocab, device=CUDA), -1)
    fn = SAMPLERS[name]
    a = fn(p, seed=12345, offset=0)
    assert torch.equal(a, fn(p, seed=12345, offset=0))
    assert not torch.equal(a, fn(p, seed=12345, offset=4000))
    assert not torch.equal(a, fn(p, seed=67890, offset=0))
    assert not torch.equal(a, fn(p, seed=12345, offset=1))
    # per-row seed / offset tensors: row b uses element b (or the single element)
    seeds = torch.full((batch,), 12345, dtype=torch.int64, device=CUDA)
    offsets = torch.zeros(1, dtype=torch.int64, device=CUDA)
    assert torch.equal(a, fn(p, seed=seeds, offset=offsets))
    seeds[7] = 1
    b = fn(p, seed=seeds, offset=offsets)
    assert torch.equal(torch.cat([a[:7], a[8:]]), torch.cat([b[:7], b[8:]]))


def test_generator_of_a_wrong_type_or_device_is_named():
    p = torch.softmax(torch.randn(3, 100, device=CUDA), -1)
    with pytest.raises(TypeError, match="^generator must be a torch.Generator \\(or None\\); got int$"):
        fs.sampling_from_probs(p, generator=5)
    with pytest.raises(ValueError, match="^generator must be a CUDA generator .*; got one on cpu$"):
        fs.top_p_sampling_from_probs(p, 0.9, generator=torch.Generator())


def test_int64_top_k_beyond_int32_is_no_filter_not_a_wrapped_one():
    """2**32 + 1 as int32 would be 1 (keep only the top token): clamped, it keeps every token,
    as the scalar does."""
    p = torch.softmax(torch.randn(4, 1000, device=CUDA), -1)
    k = torch.full((4,), 2 ** 32 + 1, dtype=torch.int64, device=CUDA)
    a = fs.top_k_sampling_from_probs(p, k, seed=3, offset=0)
    assert torch.equal(a, fs.top_k_sampling_from_probs(p, 2 ** 32 + 1, seed=3, offset=0))
    assert torch.equal(a, fs.top_k_sampling_from_probs(p, 1000, seed=3, offset=0))
    many = fs.top_k_sampling_from_probs(p.repeat(256, 1), k.repeat(256), seed=3, offset=0)
    assert not torch.equal(many, p.repeat(256, 1).argmax(-1).int()), "top_k acted as 1"


@pytest.mark.parametrize("name", sorted(SAMPLERS))
def test_generator_advances_by_the_documented_increment(name):
    batch, vocab = 13, 4096
    p = torch.softmax(torch.randn(batch, vocab, device=CUDA), -1)
    gen = torch.Generator(CUDA)
    gen.manual_seed(7)
    before = gen.get_offset()
    twin = gen.clone_state()
    a = SAMPLERS[name](p, generator=gen)
    inc = INCREMENT[name]
    expected = (batch * (vocab if inc is None else inc) + 3) // 4 * 4
    assert gen.get_offset() - before == expected
    assert torch.equal(a, SAMPLERS[name](p, generator=twin))
    c = SAMPLERS[name](p, generator=gen)  # the advanced state draws afresh
    assert not torch.equal(a, c) or batch * vocab < 100
    # the default generator is used (and advanced) without one
    default = torch.cuda.default_generators[torch.cuda.current_device()]
    off = default.get_offset()
    SAMPLERS[name](p)
    assert default.get_offset() - off == expected


@pytest.mark.parametrize("dtype", [torch.float32, torch.float16, torch.bfloat16])
@pytest.mark.parametrize("order", ["joint", "top_k_first"])
def test_logits_and_probs_entry_points_draw_identically(order, dtype):
    """The spec's identity: from_logits(logits) == from_probs(torch.softmax(logits)) with equal
    generator states, for half-precision logits too (softmax in their dtype, then up-cast)."""
    batch, vocab = 99, 32000
    logits = (torch.randn(batch, vocab, device=CUDA) * 5).to(dtype)
    g1 = torch.Generator(CUDA)
    g1.manual_seed(3)
    g2 = g1.clone_state()
    a = fs.top_k_top_p_sampling_from_logits(logits, 100, 0.5, filter_apply_order=order, generator=g1)
    b = fs.top_k_top_p_sampling_from_probs(torch.softmax(logits, -1), 100, 0.5, filter_apply_order=order, generator=g2)
    assert torch.equal(a, b)


@pytest.mark.parametrize("name", sorted(SAMPLERS))
@pytest.mark.parametrize("index_dtype", [torch.int32, torch.int64])
def test_indices_dtype_and_rows(name, index_dtype):
    rows, vocab = 5, 1000
    p = torch.zeros(rows, vocab, device=CUDA)
    for r in range(rows):
        p[r, 100 * r + 7] = 1.0  # row r can only draw 100 r + 7
    idx = torch.tensor([4, 0, 0, 3, 1, 2, 4], dtype=index_dtype, device=CUDA)
    s = SAMPLERS[name](p, indices=idx, seed=1, offset=0)
    assert s.dtype == index_dtype and s.shape == idx.shape
    assert torch.equal(s.long(), 100 * idx.long() + 7)


def test_invalid_rows_yield_zero_and_not_valid():
    batch, vocab = 19, 111
    p = torch.rand(batch, vocab, device=CUDA)
    p = p / p.sum(-1, keepdim=True)
    p[0] = float("nan")
    p[9, 5] = float("nan")
    p[18] = 0.0
    bad = torch.zeros(batch, dtype=torch.bool, device=CUDA)
    bad[[0, 9, 18]] = True
    calls = [
        lambda: fs.sampling_from_probs(p, return_valid=True),
        lambda: fs.top_k_sampling_from_probs(p, 50, return_valid=True),
        lambda: fs.top_p_sampling_from_probs(p, 0.9, return_valid=True),
        lambda: fs.min_p_sampling_from_probs(p, 0.1, return_valid=True),
        lambda: fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, filter_apply_order="joint", return_valid=True),
        lambda: fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, return_valid=True),
    ]
    for call in calls:
        s, valid = call()
        assert valid.dtype == torch.bool
        assert torch.equal(valid, ~bad)
        assert bool((s[bad] == 0).all()) and bool(((s >= 0) & (s < vocab)).all())
    idx = torch.tensor([0, 5, 99, -1], dtype=torch.int32, device=CUDA)  # out-of-range rows too
    s, valid = fs.sampling_from_probs(p, indices=idx, return_valid=True)
    assert valid.tolist() == [False, True, False, False] and s[[0, 2, 3]].tolist() == [0, 0, 0]


def test_works_under_default_device_cuda():
    original = torch.get_default_device()
    try:
        torch.set_default_device(CUDA)
        logits = torch.randn(19, 32000)
        s = fs.top_k_top_p_sampling_from_logits(logits, top_k=100, top_p=0.9)
        assert s.shape == (19,) and bool(((s >= 0) & (s < 32000)).all())
        assert fs.sampling_from_probs(torch.softmax(logits, -1)).shape == (19,)
    finally:
        torch.set_default_device(original)


@pytest.mark.parametrize("cluster", [1, 4, 16, -1])
def test_deterministic_across_runs_and_batch_invariant(cluster):
    p = adversarial_rows(128256, 32, 11).to(CUDA)
    with fs._force_cluster(cluster):
        a = fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, seed=5, offset=8)
        for _ in range(3):
            assert torch.equal(a, fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, seed=5, offset=8))
        if cluster == -1:  # the automatic split depends on the batch size: so may the draws
            return
        # for a fixed split, row b's draw depends on (seed, offset, b) and its row only
        seeds = torch.full((32,), 5, dtype=torch.int64, device=CUDA)
        offs = torch.full((32,), 8, dtype=torch.int64, device=CUDA)
        sub = fs.top_k_top_p_sampling_from_probs(p[:8], 50, 0.9, seed=seeds[:8], offset=offs[:8])
        assert torch.equal(sub, a[:8])


# ---- chain speculative sampling -----------------------------------------------------------------


@pytest.mark.parametrize("batch, vocab", [(1, 111), (99, 32000), (16, 128256)])
@pytest.mark.parametrize("n", [1, 3, 5, 7])
@pytest.mark.parametrize("onehot", [False, True])
def test_chain_speculative_structure(batch, vocab, n, onehot):
    draft = torch.rand(batch, n, vocab, device=CUDA)
    draft = draft / draft.sum(-1, keepdim=True)
    ids = torch.randint(vocab, (batch, n), device=CUDA)
    if onehot:
        target_ids = torch.randint(vocab, (batch, n + 1), device=CUDA)
        target_ids[:, :n] = ids
        target = torch.zeros(batch, n + 1, vocab, device=CUDA)
        target.scatter_(2, target_ids.unsqueeze(-1), 1)
    else:
        target = torch.rand(batch, n + 1, vocab, device=CUDA)
        target = target / target.sum(-1, keepdim=True)
    acc0 = torch.full((batch,), 5, dtype=torch.int32, device=CUDA)
    emi0 = torch.full((batch,), 2, dtype=torch.int32, device=CUDA)
    out, acc, emi = fs.chain_speculative_sampling(draft, ids, target, acc0.clone(), emi0.clone(), seed=9, offset=0)
    assert out.shape == (batch, n + 1) and out.dtype == torch.int32
    accepted, emitted = acc - acc0, emi - emi0
    if onehot:
        assert torch.equal(out, target_ids.int())
        assert bool((emitted == n).all())
    valid = out != -1
    assert torch.equal(emitted + 1, valid.sum(1).int())
    for r in range(batch):
        e = int(emitted[r])
        assert torch.equal(out[r, :e], ids[r, :e].int())  # accepted prefix
        assert 0 <= int(out[r, e]) < vocab
        assert bool((out[r, e + 1:] == -1).all())
    assert bool((accepted >= emitted).all()) and bool((accepted <= n).all())
    # without count tensors, fresh zeros are returned
    out2, acc2, emi2 = fs.chain_speculative_sampling(draft, ids, target, seed=9, offset=0)
    assert torch.equal(out2, out) and torch.equal(acc2, accepted) and torch.equal(emi2, emitted)


def test_chain_speculative_counts_of_another_dtype_are_incremented_in_place():
    """int64 count tensors (counted in an int32 copy) are still incremented in place and returned."""
    batch, vocab, n = 6, 500, 3
    draft = torch.softmax(torch.randn(batch, n, vocab, device=CUDA), -1)
    target = torch.softmax(torch.randn(batch, n + 1, vocab, device=CUDA), -1)
    ids = torch.randint(vocab, (batch, n), device=CUDA)
    acc0 = torch.full((batch,), 5, dtype=torch.int64, device=CUDA)
    emi0 = torch.full((batch,), 2, dtype=torch.int64, device=CUDA)
    acc, emi = acc0.clone(), emi0.clone()
    out, acc_r, emi_r = fs.chain_speculative_sampling(draft, ids, target, acc, emi, seed=4, offset=0)
    assert acc_r is acc and emi_r is emi and acc.dtype == torch.int64
    _, acc32, emi32 = fs.chain_speculative_sampling(draft, ids, target, seed=4, offset=0)
    assert torch.equal(acc - acc0, acc32.long()) and torch.equal(emi - emi0, emi32.long())
    assert bool(((emi - emi0) + 1 == (out != -1).sum(1)).all())


def test_chain_speculative_output_is_target_distribution():
    vocab, batch = 8, 1 << 16
    g = torch.Generator().manual_seed(0)
    q = torch.softmax(torch.randn(vocab, generator=g), 0)  # draft
    p = torch.softmax(torch.randn(vocab, generator=g), 0)  # target, position 0
    p1 = torch.softmax(torch.randn(vocab, generator=g), 0)  # target, bonus position
    draft = q.expand(batch, 1, vocab).contiguous().to(CUDA)
    target = torch.stack([p, p1]).expand(batch, 2, vocab).contiguous().to(CUDA)
    ids = torch.multinomial(q, batch, replacement=True, generator=g).view(batch, 1).int().to(CUDA)
    out, acc, emi = fs.chain_speculative_sampling(draft, ids, target, seed=2, offset=0)
    # the first emitted token follows the target distribution, whether accepted or resampled
    stat, df, _ = ref.chi_square(ref.counts_of(out[:, 0], vocab), p.double())
    assert stat < ref.chi_square_bound(df)
    stat_q, df_q, _ = ref.chi_square(ref.counts_of(out[:, 0], vocab), q.double())
    assert stat_q > ref.chi_square_bound(df_q)  # (the draft distribution is told apart)
    # acceptance rate sum_x min(p, q); bonus tokens follow the bonus target
    rate = float(torch.minimum(p, q).sum())
    assert abs(float(acc.float().mean()) - rate) < 0.01
    bonus = out[emi == 1, 1]
    stat_b, df_b, _ = ref.chi_square(ref.counts_of(bonus, vocab), p1.double())
    assert stat_b < ref.chi_square_bound(df_b)


def test_cupy_inputs():
    cupy = pytest.importorskip("cupy")
    p = cupy.random.rand(4, 1000).astype(cupy.float32)
    s = fs.top_k_top_p_sampling_from_probs(p, 10, 0.9)
    assert isinstance(s, cupy.ndarray) and s.dtype == cupy.int32 and int(s.max()) < 1000
    out = fs.softmax(p.astype(cupy.float16))
    assert isinstance(out, cupy.ndarray) and out.dtype == cupy.float32


@pytest.mark.parametrize("mode", ["0", "1"])
def test_top_p_early_accept_modes(mode):
    """The top-p early accept's other settings (FLASHINFER_SAMPLING_EARLY: 0 off, 1 checks after
    every chunk; the default, 2, runs in every other test): top-p statistics and set
    membership on long and adversarial rows. A fresh interpreter, since the knob is read once."""
    import os
    import subprocess
    import sys

    env = dict(os.environ, FLASHINFER_SAMPLING_EARLY=mode)
    r = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", __file__, "-k",
                        "test_top_p_distribution or (test_draws_stay_in_the_set and (top_p or min_p)) or "
                        "test_per_row_parameters_and_draw_statistics"],
                       env=env, capture_output=True, text=True, cwd=os.path.dirname(os.path.abspath(__file__)))
    assert r.returncode == 0, r.stdout[-4000:] + r.stderr[-2000:]
    assert " passed" in r.stdout and "failed" not in r.stdout
