"""GPU tests of the sampling kernels' two paths: the one-block kernel (one CTA per row) and the
cluster path (sm_90: a thread-block cluster of 2..16 CTAs per row, each CTA keeping a slice of
the row in shared memory and exchanging counts and masses through distributed shared memory).
``fs._force_cluster(n)`` picks the path (1: one block; n >= 2: clusters of n where the slices
fit; -1: the launcher's choice, which is clusters at small batches on long rows).

* Every draw lies in its filtered set, never on a zero-probability token, for every filter, at
  vocab 128256 / 128257 / 32000 and batch 1 / 3 / 64 / 256, on each path (the cluster sizes
  4, 8, 16 and the automatic choice).
* The same (seed, offset) draws the same tokens on each path, and per-row parameters work.
* The cluster path's draws follow the filtered distribution (chi-square, vocab 1024 split over
  4 and 16 CTAs), invalid rows give (0, False) there too.
* The short Python path (default generator, scalar filters) draws exactly what the general path
  draws from the same (seed, offset), and advances the generator alike.
"""

from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")

import flashinfer.sampling as fs  # noqa: E402
import reference_sampling as ref  # noqa: E402
from test_sampling import adversarial_rows, allowed, assert_distribution, clear_row, draw  # noqa: E402

pytestmark = pytest.mark.gpu

CUDA = "cuda"
PATHS = [1, 4, 8, 16, -1]  # one block, clusters of 4 / 8 / 16, automatic


def _sm90():
    return torch.cuda.is_available() and torch.cuda.get_device_capability()[0] >= 9


def call(name, p, k, tp, mp, seed, offset):
    if name == "plain":
        return fs.sampling_from_probs(p, seed=seed, offset=offset)
    if name == "top_k":
        return fs.top_k_sampling_from_probs(p, k, seed=seed, offset=offset)
    if name == "top_p":
        return fs.top_p_sampling_from_probs(p, tp, seed=seed, offset=offset)
    if name == "min_p":
        return fs.min_p_sampling_from_probs(p, mp, seed=seed, offset=offset)
    order = "joint" if name == "joint" else "top_k_first"
    return fs.top_k_top_p_sampling_from_probs(p, k, tp, filter_apply_order=order, seed=seed, offset=offset)


NAMES = ["plain", "top_k", "top_p", "min_p", "joint", "top_k_first"]


@pytest.mark.parametrize("vocab, batch", [(128256, 1), (128256, 3), (128257, 64), (128256, 256), (32000, 8)])
@pytest.mark.parametrize("path", PATHS)
@pytest.mark.parametrize("name", NAMES)
def test_draws_stay_in_the_set_on_each_path(vocab, batch, path, name):
    p = adversarial_rows(vocab, batch, vocab + batch + 1).to(CUDA)
    rows = torch.arange(batch, device=CUDA)
    with fs._force_cluster(path):
        for k, tp, mp in [(1, 0.1, 0.05), (50, 0.9, 0.1), (1000, 0.99, 0.7), (vocab + 3, 1.0, 0.0)]:
            ok = allowed(name, p, k, tp, mp)
            for seed in range(2):
                a = call(name, p, k, tp, mp, seed, 4 * seed)
                assert a.dtype == torch.int32 and a.shape == (batch,)
                good = ok[rows, a.long()]
                assert bool(good.all()), (f"{name} path={path} k={k} p={tp} min_p={mp} seed={seed}: rows "
                                          f"{torch.nonzero(~good).flatten().tolist()[:8]} drew outside the set")
                assert torch.equal(a, call(name, p, k, tp, mp, seed, 4 * seed))  # deterministic


@pytest.mark.parametrize("path", PATHS)
def test_per_row_parameters_on_each_path(path):
    vocab, batch = 128256, 5
    p = adversarial_rows(vocab, batch, 17).to(CUDA)
    k = torch.tensor([1, 7, 50, vocab, 300], dtype=torch.int32, device=CUDA)
    tp = torch.tensor([0.5, 0.9, 0.2, 0.95, 1.0], device=CUDA)
    rows = torch.arange(batch, device=CUDA)
    with fs._force_cluster(path):
        for order in ("joint", "top_k_first"):
            s = fs.top_k_top_p_sampling_from_probs(p, k, tp, filter_apply_order=order, seed=3, offset=0)
            assert bool(ref.top_k_mask(p, k)[rows, s.long()].all())
            samples, stats = fs._sample_with_stats(p, top_k=k, top_p=tp, filter_apply_order=order, seed=3, offset=0)
            assert torch.equal(samples, s)
            assert bool((stats[:, 0] >= 1).all()) and bool((stats[:, 0] <= 32).all())
            assert bool((stats[:, 1] >= 1).all())
        assert int(fs.top_k_sampling_from_probs(p, k, seed=1, offset=0)[0]) == int(p[0].argmax())  # k = 1


@pytest.mark.skipif(not _sm90(), reason="the cluster path needs sm_90")
@pytest.mark.parametrize("cluster", [4, 16])
def test_cluster_path_distributions(cluster):
    vocab = 1024  # split into slices of 256 / 64 elements
    with fs._force_cluster(cluster):
        p = clear_row(vocab, vocab + 3, (0.6,))
        assert_distribution(draw(fs.sampling_from_probs, p), p, p > 0)
        for k in (1, 3, 100):
            assert_distribution(draw(fs.top_k_sampling_from_probs, p, k), p, ref.top_k_mask(p, k),
                                [ref.top_k_mask(p, k + 1)] if k > 1 else [])
        assert_distribution(draw(fs.top_p_sampling_from_probs, p, 0.6), p, ref.top_p_mask(p, 0.6))
        assert_distribution(draw(fs.min_p_sampling_from_probs, p, 0.2), p, ref.min_p_mask(p, 0.2))
        assert_distribution(draw(fs.top_k_top_p_sampling_from_probs, p, 200, 0.6, filter_apply_order="joint"), p,
                            ref.joint_mask(p, 200, 0.6))


@pytest.mark.parametrize("path", PATHS)
def test_invalid_rows_on_each_path(path):
    batch, vocab = 9, 20000
    p = torch.rand(batch, vocab, device=CUDA)
    p = p / p.sum(-1, keepdim=True)
    p[0] = float("nan")
    p[4, 19999] = float("nan")  # in the last slice
    p[8] = 0.0
    bad = torch.zeros(batch, dtype=torch.bool, device=CUDA)
    bad[[0, 4, 8]] = True
    with fs._force_cluster(path):
        for call_ in (lambda: fs.sampling_from_probs(p, return_valid=True),
                      lambda: fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, return_valid=True),
                      lambda: fs.min_p_sampling_from_probs(p, 0.1, return_valid=True)):
            s, valid = call_()
            assert torch.equal(valid, ~bad) and bool((s[bad] == 0).all())
        idx = torch.tensor([1, 99, -1, 2], dtype=torch.int64, device=CUDA)
        s, valid = fs.sampling_from_probs(p, indices=idx, return_valid=True)
        assert valid.tolist() == [True, False, False, True] and s.dtype == torch.int64


@pytest.mark.parametrize("batch", [1, 64, 256])
def test_short_python_path_matches_the_general_one(batch):
    vocab = 128256
    p = torch.softmax(torch.randn(batch, vocab, device=CUDA), -1)
    gen = torch.cuda.default_generators[torch.cuda.current_device()]
    ks = torch.randint(1, 200, (batch,), dtype=torch.int32, device=CUDA)
    ps = torch.rand(batch, device=CUDA) * 0.5 + 0.4
    ms = torch.rand(batch, device=CUDA) * 0.2
    calls = [
        (lambda **kw: fs.sampling_from_probs(p, **kw), 1),
        (lambda **kw: fs.top_p_sampling_from_probs(p, 0.9, **kw), 32),
        (lambda **kw: fs.top_k_sampling_from_probs(p, 50, **kw), 32),
        (lambda **kw: fs.min_p_sampling_from_probs(p, 0.1, **kw), 1),
        (lambda **kw: fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, **kw), 32),
        (lambda **kw: fs.top_k_top_p_sampling_from_probs(p, 50, 0.9, filter_apply_order="joint", **kw), 32),
        # per-row int32 / float32 tensors also take the short path
        (lambda **kw: fs.top_k_top_p_sampling_from_probs(p, ks, ps, **kw), 32),
        (lambda **kw: fs.top_k_sampling_from_probs(p, ks, **kw), 32),
        (lambda **kw: fs.top_p_sampling_from_probs(p, ps, **kw), 32),
        (lambda **kw: fs.min_p_sampling_from_probs(p, ms, **kw), 1),
        (lambda **kw: fs.top_p_sampling_from_probs(p, 1, **kw), 32),  # an int top_p
    ]
    for fn, draws in calls:
        seed, off = gen.initial_seed(), gen.get_offset()
        fast = fn()  # the short path: default generator
        assert gen.get_offset() - off == (batch * draws + 3) // 4 * 4
        general = fn(seed=seed, offset=off)
        assert torch.equal(fast, general)
