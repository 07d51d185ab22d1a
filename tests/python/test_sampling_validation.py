"""flashinfer.sampling argument validation on the CPU (no GPU needed).

The binding checks shapes and dtypes before the device, so CPU tensors reach every check;
valid CPU arguments end in "must be a CUDA tensor". The per-row parameter messages are
FlashInfer's own (its tests match them by regex); so are the seed/offset, filter order, NaN
and softmax temperature messages.
"""

from __future__ import annotations

import re

import numpy as np
import pytest

torch = pytest.importorskip("torch")

import flashinfer  # noqa: E402
import flashinfer.sampling as fs  # noqa: E402

R, V = 4, 50

ZERO_D = r"Expected a 1D tensor of shape \(batch_size,\) or scalar for the sampling parameter, but got a 0-dimensional tensor\."
TWO_D = r"Expected a 1D tensor or scalar for the sampling parameter, but got a 2D tensor\."
LENGTH = (r"Sampling parameter tensor batch size mismatch: expected length 4 to match the reference tensor batch "
          r"size, but got length 3\.")
ON_CPU = r"must be a CUDA tensor"


def probs(rows=R, vocab=V, dtype=torch.float32):
    p = torch.rand(rows, vocab)
    return (p / p.sum(-1, keepdim=True)).to(dtype)


# (name, call(probs, param)) for every function taking one per-row parameter
ONE_PARAM = {
    "top_p_sampling_from_probs": lambda p, x: fs.top_p_sampling_from_probs(p, x),
    "top_k_sampling_from_probs": lambda p, x: fs.top_k_sampling_from_probs(p, x),
    "min_p_sampling_from_probs": lambda p, x: fs.min_p_sampling_from_probs(p, x),
    "top_p_renorm_probs": lambda p, x: fs.top_p_renorm_probs(p, x),
    "top_k_renorm_probs": lambda p, x: fs.top_k_renorm_probs(p, x),
    "top_k_mask_logits": lambda p, x: fs.top_k_mask_logits(p, x),
    "top_k_top_p(k)": lambda p, x: fs.top_k_top_p_sampling_from_probs(p, x, 0.9),
    "top_k_top_p(p)": lambda p, x: fs.top_k_top_p_sampling_from_probs(p, 5, x),
    "top_k_top_p_joint(k)": lambda p, x: fs.top_k_top_p_sampling_from_probs(p, x, 0.9, filter_apply_order="joint"),
    "top_k_top_p_joint(p)": lambda p, x: fs.top_k_top_p_sampling_from_probs(p, 5, x, filter_apply_order="joint"),
}

ALL_PROBS = {
    "sampling_from_probs": lambda p: fs.sampling_from_probs(p),
    "sampling_from_logits": lambda p: fs.sampling_from_logits(p),
    "top_p_sampling_from_probs": lambda p: fs.top_p_sampling_from_probs(p, 0.9),
    "top_k_sampling_from_probs": lambda p: fs.top_k_sampling_from_probs(p, 5),
    "min_p_sampling_from_probs": lambda p: fs.min_p_sampling_from_probs(p, 0.1),
    "top_k_top_p_sampling_from_probs": lambda p: fs.top_k_top_p_sampling_from_probs(p, 5, 0.9),
    "top_k_top_p_sampling_from_logits": lambda p: fs.top_k_top_p_sampling_from_logits(p, 5, 0.9),
    "top_p_renorm_probs": lambda p: fs.top_p_renorm_probs(p, 0.9),
    "top_k_renorm_probs": lambda p: fs.top_k_renorm_probs(p, 5),
    "top_k_mask_logits": lambda p: fs.top_k_mask_logits(p, 5),
}


@pytest.mark.parametrize("name", sorted(ALL_PROBS))
def test_valid_cpu_arguments_reach_the_device_check(name):
    with pytest.raises(ValueError, match=ON_CPU):
        ALL_PROBS[name](probs())


@pytest.mark.parametrize("name", sorted(ONE_PARAM))
@pytest.mark.parametrize("dtype", [torch.float32, torch.int32, torch.int64])
def test_per_row_parameter_shape_messages(name, dtype):
    fn = ONE_PARAM[name]
    value = 3 if dtype != torch.float32 else 0.5
    with pytest.raises(ValueError, match=ZERO_D):
        fn(probs(), torch.tensor(value, dtype=dtype))
    with pytest.raises(ValueError, match=TWO_D):
        fn(probs(), torch.full((R, V), value, dtype=dtype))
    with pytest.raises(ValueError, match=LENGTH):
        fn(probs(), torch.full((3,), value, dtype=dtype))
    with pytest.raises(ValueError, match=ON_CPU):  # the right length and any numeric dtype pass
        fn(probs(), torch.full((R,), value, dtype=dtype))


def test_per_row_parameters_follow_the_distribution_rows_not_indices():
    idx = torch.zeros(7, dtype=torch.int32)
    with pytest.raises(ValueError, match=LENGTH.replace("length 3", "length 7")):
        fs.top_k_sampling_from_probs(probs(), torch.full((7,), 3), indices=idx)
    with pytest.raises(ValueError, match=ON_CPU):
        fs.top_k_sampling_from_probs(probs(), torch.full((R,), 3), indices=idx)


@pytest.mark.parametrize("bad, message", [
    (torch.rand(V), "probs must be 2-D"),
    (torch.rand(2, 3, V), "probs must be 2-D"),
    (torch.rand(R, 0), re.escape("probs.shape[1] (vocab size) must be in [1, 2^30]; got 0")),
    (torch.rand(R, 2 * V)[:, ::2], "probs must be contiguous in its last dimension"),
])
def test_probs_shape(bad, message):
    with pytest.raises(ValueError, match=message):
        fs.sampling_from_probs(bad)


def test_indices():
    with pytest.raises(ValueError, match="indices.dtype must be int32 or int64; got float32"):
        fs.sampling_from_probs(probs(), indices=torch.zeros(3))
    with pytest.raises(ValueError, match="indices must be 1-D"):
        fs.sampling_from_probs(probs(), indices=torch.zeros(3, 2, dtype=torch.int32))
    for dt in (torch.int32, torch.int64):
        with pytest.raises(ValueError, match=ON_CPU):
            fs.sampling_from_probs(probs(), indices=torch.zeros(3, dtype=dt))


def test_seed_and_offset():
    with pytest.raises(ValueError, match="^seed and offset must both be tensors or both be scalars$"):
        fs.sampling_from_probs(probs(), seed=torch.tensor([1]), offset=0)
    with pytest.raises(ValueError, match="^seed and offset must both be tensors or both be scalars$"):
        fs.top_p_sampling_from_probs(probs(), 0.9, seed=1, offset=torch.tensor([0]))
    good = torch.zeros(1, dtype=torch.int64)
    with pytest.raises(ValueError, match="seed tensor must be int64/uint64"):
        fs.sampling_from_probs(probs(), seed=torch.zeros(1, dtype=torch.int32), offset=good)
    with pytest.raises(ValueError, match="offset tensor must be 1D"):
        fs.sampling_from_probs(probs(), seed=good, offset=torch.zeros(1, 1, dtype=torch.int64))
    with pytest.raises(ValueError, match="seed tensor length must be 1 or 4"):
        fs.sampling_from_probs(probs(), seed=torch.zeros(3, dtype=torch.int64), offset=good)
    for n in (1, R):
        with pytest.raises(ValueError, match=ON_CPU):
            fs.sampling_from_probs(probs(), seed=torch.zeros(n, dtype=torch.int64), offset=torch.zeros(n, dtype=torch.int64))
    with pytest.raises(ValueError, match=ON_CPU):  # scalars of any size are taken modulo 2^64
        fs.sampling_from_probs(probs(), seed=2**64 + 5, offset=-1)


def test_filter_apply_order():
    for fn in (fs.top_k_top_p_sampling_from_probs, fs.top_k_top_p_sampling_from_logits):
        with pytest.raises(ValueError, match="^Invalid filter_apply_order: top_p_first$"):
            fn(probs(), 5, 0.9, filter_apply_order="top_p_first")


def test_check_nan():
    p = probs()
    p[1, 3] = float("nan")
    for fn in (lambda: fs.sampling_from_probs(p, check_nan=True), lambda: fs.top_p_sampling_from_probs(p, 0.5, check_nan=True),
               lambda: fs.top_k_top_p_sampling_from_probs(p, 3, 0.5, check_nan=True)):
        with pytest.raises(ValueError, match=r"^Input probs contains NaN\.$"):
            fn()
    with pytest.raises(ValueError, match=r"^Input logits contains NaN\.$"):
        fs.sampling_from_logits(p, check_nan=True)
    with pytest.raises(ValueError, match=ON_CPU):  # without check_nan, NaN rows are the kernel's business
        fs.sampling_from_probs(p)


def test_renorm_dtypes():
    with pytest.raises(ValueError, match="top_k_renorm_probs: probs.dtype must be float32, float16 or bfloat16; got int32"):
        fs.top_k_renorm_probs(torch.ones(R, V, dtype=torch.int32), 3)
    with pytest.raises(ValueError, match="top_k_mask_logits: logits.dtype must be float32, float16 or bfloat16; got float64"):
        fs.top_k_mask_logits(torch.ones(R, V, dtype=torch.float64), 3)
    for dt in (torch.float16, torch.bfloat16, torch.float32):
        with pytest.raises(ValueError, match=ON_CPU):
            fs.top_k_renorm_probs(probs(dtype=dt), 3)
        with pytest.raises(ValueError, match=ON_CPU):
            fs.top_k_mask_logits(probs(dtype=dt), 3)
        with pytest.raises(ValueError, match=ON_CPU):  # up-cast to float32 first
            fs.top_p_renorm_probs(probs(dtype=dt), 0.5)
    assert fs.top_p_renorm_prob is fs.top_p_renorm_probs and fs.top_k_renorm_prob is fs.top_k_renorm_probs


def test_softmax_arguments():
    with pytest.raises(ValueError, match="^logits must be a CUDA tensor, got device=cpu$"):
        fs.softmax(probs())
    x = np.random.rand(R, V).astype(np.float32)  # numpy: the temperature checks run, then the device one
    for bad in ("hot", True, [1.0]):
        with pytest.raises(TypeError, match="temperature must be None, a real scalar"):
            fs.softmax(x, temperature=bad)
    with pytest.raises(ValueError, match=re.escape("temperature tensor must be 1D with one value per logits row, got shape (4, 1)")):
        fs.softmax(x, temperature=np.ones((R, 1), dtype=np.float32))
    with pytest.raises(ValueError, match=re.escape("temperature tensor length must equal logits.size(0) (4), got 3")):
        fs.softmax(x, temperature=np.ones(3, dtype=np.float32))
    with pytest.raises(ValueError, match="temperature tensor must have dtype float16, bfloat16, float32, or float64"):
        fs.softmax(x, temperature=np.ones(R, dtype=np.int32))
    for t in (None, 0.5, 0, np.ones(R, dtype=np.float64)):
        with pytest.raises(ValueError, match=ON_CPU):
            fs.softmax(x, temperature=t)


@pytest.mark.parametrize("arg", ["draft_probs", "draft_token_ids", "target_probs", "maybe_output_accepted_token_num",
                                 "maybe_output_emitted_draft_token_num"])
@pytest.mark.parametrize("value", [[0, 1], 2.5])
def test_chain_speculative_non_tensor_is_a_type_error_naming_it(arg, value):
    b, n = 3, 2
    args = dict(draft_probs=probs(b * n).view(b, n, V), draft_token_ids=torch.randint(0, V, (b, n)),
                target_probs=probs(b * (n + 1)).view(b, n + 1, V))
    args[arg] = value
    with pytest.raises(TypeError, match=f"^{arg} must be a tensor supporting DLPack .*; got {type(value).__name__}$"):
        fs.chain_speculative_sampling(**args)


def test_chain_speculative_shapes():
    b, n = 3, 2
    draft = probs(b * n).view(b, n, V)
    ids = torch.randint(0, V, (b, n))
    target = probs(b * (n + 1)).view(b, n + 1, V)
    with pytest.raises(ValueError, match=ON_CPU):
        fs.chain_speculative_sampling(draft, ids, target)
    with pytest.raises(ValueError, match=re.escape("target_probs.shape[1] must equal num_speculate_tokens + 1 (3); got 2")):
        fs.chain_speculative_sampling(draft, ids, target[:, :n])
    with pytest.raises(ValueError, match=re.escape("draft_token_ids.shape[1] must equal draft_probs.shape[1] (2); got 1")):
        fs.chain_speculative_sampling(draft, ids[:, :1], target)
    with pytest.raises(ValueError, match="draft_token_ids must be 2-D"):
        fs.chain_speculative_sampling(draft, ids[0], target)
    with pytest.raises(ValueError, match=re.escape("accepted_num.shape[0] must equal the batch size (3); got 2")):
        fs.chain_speculative_sampling(draft, ids, target, torch.zeros(2, dtype=torch.int32))


def test_numpy_and_top_level_exports():
    with pytest.raises(ValueError, match=ON_CPU):
        fs.sampling_from_probs(np.random.rand(R, V).astype(np.float32))
    for name in fs.__all__:
        assert getattr(flashinfer, name) is getattr(fs, name)
    assert flashinfer.sampling is fs


def test_top_k_arguments():
    from flashinfer.topk import TopKTieBreak, top_k

    x = torch.randn(3, 40)
    with pytest.raises(ValueError, match=ON_CPU):
        top_k(x, 5)
    with pytest.raises(ValueError, match=ON_CPU):
        top_k(x.to(torch.bfloat16), 40, sorted=True, tie_break=TopKTieBreak.LARGE)
    with pytest.raises(ValueError, match=re.escape("top_k: k must be in [1, input.shape[1]] = [1, 40]; got 41")):
        top_k(x, 41)
    with pytest.raises(ValueError, match=re.escape("top_k: k must be in [1, input.shape[1]] = [1, 40]; got 0")):
        top_k(x, 0)
    with pytest.raises(ValueError, match="top_k: tie_break must be 0 \\(NONE\\), 1 \\(SMALL\\) or 2 \\(LARGE\\); got 3"):
        top_k(x, 5, tie_break=3)
    with pytest.raises(ValueError, match="top_k: input must be 2-D"):
        top_k(x[0], 5)
    with pytest.raises(ValueError, match="top_k: input.dtype must be float32, float16 or bfloat16; got int32"):
        top_k(x.int(), 5)
    assert flashinfer.top_k is top_k and flashinfer.TopKTieBreak is TopKTieBreak


def test_short_path_binding_checks():
    """The short binding entry point (the fast path's) runs the same checks as the general one."""
    from flashinfer import _sampling

    dl = torch._C._to_dlpack
    out = torch.empty(R, dtype=torch.int32)
    with pytest.raises(ValueError, match=ON_CPU):
        _sampling.sample_probs("top_k_sampling_from_probs", dl(probs()), dl(out), 1, None, 5, None, 1.0, None, 0.0,
                               1, 0, -1, 0)
    with pytest.raises(ValueError, match="top_k_sampling_from_probs: probs.dtype must be float32; got float16"):
        _sampling.sample_probs("top_k_sampling_from_probs", dl(probs(dtype=torch.float16)), dl(out), 1, None, 5,
                               None, 1.0, None, 0.0, 1, 0, -1, 0)
    with pytest.raises(ValueError, match=re.escape("out.shape[0] must equal the batch size (4); got 3")):
        _sampling.sample_probs("sampling_from_probs", dl(probs()), dl(torch.empty(3, dtype=torch.int32)), 0, None, 0,
                               None, 1.0, None, 0.0, 1, 0, -1, 0)
    # per-row parameters on the short path: the general path's messages
    with pytest.raises(ValueError, match=LENGTH):
        _sampling.sample_probs("top_k_sampling_from_probs", dl(probs()), dl(out), 1,
                               dl(torch.full((3,), 5, dtype=torch.int32)), 0, None, 1.0, None, 0.0, 1, 0, -1, 0)
    with pytest.raises(ValueError, match=LENGTH):
        _sampling.sample_probs("top_p_sampling_from_probs", dl(probs()), dl(out), 2, None, 0,
                               dl(torch.full((3,), 0.5)), 0.0, None, 0.0, 1, 0, -1, 0)
    with pytest.raises(ValueError, match=LENGTH):
        _sampling.sample_probs("min_p_sampling_from_probs", dl(probs()), dl(out), 4, None, 0, None, 1.0,
                               dl(torch.full((3,), 0.5)), 0.0, 1, 0, -1, 0)


def test_short_path_is_skipped_off_device_and_cluster_override_restores():
    # CPU tensors, non-float32 probs, tensors as parameters and generic objects take the general
    # path (which names the problem); _force_cluster restores the previous mode on exit.
    assert fs._fast("sampling_from_probs", probs(), 0, 1, 0, 1.0, 0.0) is None
    assert fs._fast("sampling_from_probs", np.random.rand(R, V).astype(np.float32), 0, 1, 0, 1.0, 0.0) is None
    with pytest.raises(ValueError, match=ON_CPU):
        fs.top_k_top_p_sampling_from_probs(probs(dtype=torch.float16), 5, 0.9)
    assert fs._cluster_mode == -1
    with fs._force_cluster(4):
        assert fs._cluster_mode == 4
        with fs._force_cluster(1):
            assert fs._cluster_mode == 1
        assert fs._cluster_mode == 4
        with pytest.raises(ValueError, match=ON_CPU):
            fs.top_p_sampling_from_probs(probs(), 0.9)
    assert fs._cluster_mode == -1


@pytest.mark.parametrize("name", sorted(ONE_PARAM))
def test_parameter_types(name):
    """A required filter parameter given as None, a string, or (top_k) a float is a TypeError
    naming it, not a silent "no filter" or truncation; NaN top_p / min_p is a ValueError."""
    fn = ONE_PARAM[name]
    param = {"top_p_sampling_from_probs": "top_p", "top_k_sampling_from_probs": "top_k",
             "min_p_sampling_from_probs": "min_p", "top_p_renorm_probs": "top_p", "top_k_renorm_probs": "top_k",
             "top_k_mask_logits": "top_k"}.get(name) or ("top_k" if "(k)" in name else "top_p")
    for bad in (None, "5"):
        with pytest.raises(TypeError, match=param):
            fn(probs(), bad)
    if param == "top_k":
        with pytest.raises(TypeError, match="top_k must be an int"):
            fn(probs(), 4.9)
        for ok in (np.int64(5), 5.0, 2 ** 70, -(2 ** 70)):  # integral values of any size (>= V, <= 0: no filter)
            with pytest.raises(ValueError, match=ON_CPU):
                fn(probs(), ok)
    else:
        with pytest.raises(ValueError, match=f"{param} must not be NaN"):
            fn(probs(), float("nan"))
        with pytest.raises(ValueError, match=ON_CPU):
            fn(probs(), np.float32(0.5))


@pytest.mark.parametrize("name", ["sampling_from_probs", "top_k_sampling_from_probs", "top_p_renorm_probs",
                                  "top_k_renorm_probs", "top_k_mask_logits", "sampling_from_logits"])
def test_overlapping_rows_are_named(name):
    """An expand()ed distribution (row stride < vocab) is refused with its name, not at launch."""
    p = probs(1).expand(R, V)
    arg = "logits" if "logits" in name else "probs"
    with pytest.raises(ValueError, match=re.escape(f"{arg} rows must not overlap: row stride 0 < vocab size {V}")):
        ALL_PROBS[name](p)


def test_top_k_k_is_checked_before_allocating():
    from flashinfer.topk import top_k

    x = torch.randn(3, 40)
    with pytest.raises(ValueError, match=re.escape("got 1099511627776")):
        top_k(x, 2 ** 40)  # (allocating [3, 2**40] first would fail as out of memory)
    with pytest.raises(ValueError, match=re.escape("got -1")):
        top_k(x, -1)
    with pytest.raises(TypeError, match="top_k: k must be an int; got float 2.9"):
        top_k(x, 2.9)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):  # an integral float is an int
        top_k(x, 5.0)


# --- arguments a kernel must not get: named before any launch ----------------------------------

def test_scalar_seed_and_offset_must_be_integers():
    for seed, offset, bad in ((1.5, 0, "seed"), (3, "7", "offset")):
        with pytest.raises(TypeError, match=f"^{bad} must be an int or an int64 tensor; got "):
            fs.sampling_from_probs(probs(), seed=seed, offset=offset)
    with pytest.raises(ValueError, match=ON_CPU):  # integral floats are integers (as top_k's)
        fs.sampling_from_probs(probs(), seed=5.0, offset=np.int64(8))


@pytest.mark.parametrize("bad", [float("nan"), float("inf"), -0.5])
def test_softmax_temperature_must_be_finite_and_not_negative(bad):
    x = np.random.rand(R, V).astype(np.float32)
    with pytest.raises(ValueError, match="^temperature must be a finite number >= 0; got "):
        fs.softmax(x, temperature=bad)


def test_indices_must_be_a_tensor_naming_it():
    with pytest.raises(TypeError, match="^indices must be a tensor supporting DLPack .*; got list$"):
        fs.sampling_from_probs(probs(), indices=[0, 1])


def test_check_nan_covers_the_per_row_probability_parameters():
    p = torch.full((R,), 0.5)
    p[2] = float("nan")
    with pytest.raises(ValueError, match="^top_p contains NaN.$"):
        fs.top_p_sampling_from_probs(probs(), p, check_nan=True)
    with pytest.raises(ValueError, match="^min_p contains NaN.$"):
        fs.min_p_sampling_from_probs(probs(), p, check_nan=True)
    with pytest.raises(ValueError, match=ON_CPU):  # without check_nan: no host read
        fs.top_p_sampling_from_probs(probs(), p)


def test_chain_speculative_counts_must_be_two_tensors_and_ids_integers():
    b, n = 3, 2
    draft = probs(b * n).view(b, n, V)
    target = probs(b * (n + 1)).view(b, n + 1, V)
    ids = torch.randint(0, V, (b, n))
    both = torch.zeros(b, dtype=torch.int32)
    with pytest.raises(ValueError, match="must be two tensors; got the same one for both"):
        fs.chain_speculative_sampling(draft, ids, target, both, both)
    with pytest.raises(ValueError, match="^draft_token_ids must have an integer dtype; got float32$"):
        fs.chain_speculative_sampling(draft, ids.float(), target)


def test_index_check_mode_names_out_of_range_indices_and_draft_ids():
    from flashinfer import _index_check

    b, n = 3, 2
    draft = probs(b * n).view(b, n, V)
    target = probs(b * (n + 1)).view(b, n + 1, V)
    prev = _index_check.enabled
    _index_check.set_check_indices(True)
    try:
        with pytest.raises(ValueError, match=r"^indices must be in \[0, 4\) \(probs rows\); got 4$"):
            fs.sampling_from_probs(probs(), indices=torch.tensor([0, 4], dtype=torch.int32))
        with pytest.raises(ValueError, match=r"^indices must be in \[0, 4\) \(logits rows\); got -1$"):
            fs.sampling_from_logits(probs(), indices=torch.tensor([-1, 2]))
        with pytest.raises(ValueError, match=rf"^draft_token_ids must be in \[0, {V}\) \(the vocabulary\); got {V}$"):
            fs.chain_speculative_sampling(draft, torch.tensor([[0, 1], [2, V], [3, 4]]), target)
        with pytest.raises(ValueError, match=ON_CPU):  # in range: on to the device check
            fs.sampling_from_probs(probs(), indices=torch.tensor([0, 3]))
    finally:
        _index_check.set_check_indices(prev)


@pytest.mark.parametrize("bad", ["small", 1.5])
def test_top_k_tie_break_must_be_an_integer_mode(bad):
    with pytest.raises(TypeError, match="^top_k: tie_break must be a TopKTieBreak \\(0, 1 or 2\\); got "):
        flashinfer.top_k(torch.randn(2, 10), 3, tie_break=bad)
    with pytest.raises(ValueError, match="tie_break must be 0 \\(NONE\\), 1 \\(SMALL\\) or 2 \\(LARGE\\); got 3"):
        flashinfer.top_k(torch.randn(2, 10), 3, tie_break=3)
