"""Argument validation, on CPU: no GPU needed.

The bindings check ndim, dtype, shape and strides before the device, so CPU tensors exercise
every check except "must be a CUDA tensor" (which CPU tensors trigger once all else is valid).
Errors are ValueErrors whose message names the function and the argument; a non-tensor is a
TypeError; the activations' Python-level out-shape checks are assertions (as in FlashInfer).
The last tests call the raw binding with hand-built DLPack capsules that claim CUDA memory.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import flashinfer  # noqa: E402
from fake_dlpack import K_DL_CPU, Bare, FakeTensor  # noqa: E402
from flashinfer import _cuda, _norm  # noqa: E402

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32

RMS = ("rmsnorm", "gemma_rmsnorm")
FUSED = ("fused_add_rmsnorm", "gemma_fused_add_rmsnorm")
NORMS = RMS + FUSED + ("layernorm",)
ACTS = ("silu_and_mul", "gelu_and_mul", "gelu_tanh_and_mul")
ALL = NORMS + ACTS
WEIGHTED = RMS + FUSED  # take a `weight` of the input's dtype


def valid_args(name, rows=4, hidden=64, dtype=F16):
    """Keyword arguments that pass every check except the device one (they are on the CPU)."""
    x = torch.randn(rows, hidden, dtype=dtype)
    if name in RMS:
        return dict(input=x, weight=torch.randn(hidden, dtype=dtype))
    if name in FUSED:
        return dict(input=x, residual=torch.randn(rows, hidden, dtype=dtype),
                    weight=torch.randn(hidden, dtype=dtype))
    if name == "layernorm":
        return dict(input=x, gemma=torch.randn(hidden), beta=torch.randn(hidden))
    return dict(input=torch.randn(rows, 2 * hidden, dtype=dtype))


def call(name, **kwargs):
    return getattr(flashinfer, name)(**kwargs)


def raises_value_error(name, message):
    """pytest.raises for ValueError('<name>: <message>'), the message matched literally."""
    return pytest.raises(ValueError, match="^" + re.escape(f"{name}: {message}") + "$")


def every_other_column(shape, dtype):
    """A tensor of `shape` whose last dimension has stride 2."""
    return torch.randn(*shape[:-1], 2 * shape[-1], dtype=dtype)[..., ::2]


# --- device ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
def test_cpu_tensors_are_rejected_naming_cuda(name, dtype):
    with raises_value_error(name, "input must be a CUDA tensor; got a tensor on device type cpu"):
        call(name, **valid_args(name, dtype=dtype))


@pytest.mark.parametrize("name", ALL)
def test_numpy_arrays_are_rejected_naming_cuda(name):
    args = {k: v.numpy() for k, v in valid_args(name).items()}
    with raises_value_error(name, "input must be a CUDA tensor; got a tensor on device type cpu"):
        call(name, **args)


# --- dtype -----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
@pytest.mark.parametrize("bad", [torch.float32, torch.float64, torch.int32, torch.uint8])
def test_input_dtype_must_be_fp16_or_bf16(name, bad):
    args = valid_args(name)
    args["input"] = args["input"].to(bad)
    with raises_value_error(name, f"input.dtype must be float16 or bfloat16; got {str(bad).removeprefix('torch.')}"):
        call(name, **args)


@pytest.mark.parametrize("name", NORMS)
def test_eps_must_be_finite_and_non_negative(name):
    """A NaN / inf / negative eps would give NaN (or zero) rows without a word."""
    for eps, shown in ((float("nan"), "nan"), (float("inf"), "inf"), (-1e-6, "-1e-06"),
                       (1e39, "1e+39")):  # (finite, but inf as the kernels' float32)
        with raises_value_error(name, f"eps must be a finite float32 number >= 0; got {shown}"):
            call(name, **valid_args(name), eps=eps)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):  # 0 is allowed
        call(name, **valid_args(name), eps=0.0)


@pytest.mark.parametrize("name", WEIGHTED)
@pytest.mark.parametrize("x_dtype, w_dtype", [(F16, BF16), (BF16, F16), (F16, F32)])
def test_weight_dtype_must_match_input(name, x_dtype, w_dtype):
    args = valid_args(name, dtype=x_dtype)
    args["weight"] = args["weight"].to(w_dtype)
    want, got = (str(d).removeprefix("torch.") for d in (x_dtype, w_dtype))
    with raises_value_error(name, f"weight.dtype must be {want}; got {got}"):
        call(name, **args)


@pytest.mark.parametrize("name", FUSED)
def test_residual_dtype_must_match_input(name):
    args = valid_args(name, dtype=BF16)
    args["residual"] = args["residual"].to(F16)
    with raises_value_error(name, "residual.dtype must be bfloat16; got float16"):
        call(name, **args)


@pytest.mark.parametrize("arg", ["gemma", "beta"])
@pytest.mark.parametrize("bad", [BF16, F16, torch.float64])
def test_layernorm_gemma_and_beta_must_be_float32(arg, bad):
    args = valid_args("layernorm", dtype=BF16)
    args[arg] = args[arg].to(bad)
    with raises_value_error("layernorm", f"{arg}.dtype must be float32; got {str(bad).removeprefix('torch.')}"):
        call("layernorm", **args)


@pytest.mark.parametrize("name", RMS + ACTS)
def test_out_dtype_must_match_input(name):
    args = valid_args(name, dtype=BF16)
    out_shape = (4, 64)
    args["out"] = torch.empty(out_shape, dtype=F16)
    with raises_value_error(name, "out.dtype must be bfloat16; got float16"):
        call(name, **args)


# --- shape and ndim --------------------------------------------------------------------------

@pytest.mark.parametrize("name", WEIGHTED)
def test_weight_length_must_equal_hidden_size(name):
    args = valid_args(name)
    args["weight"] = args["weight"][:32]
    with raises_value_error(name, "weight.shape[0] must equal input.shape[-1] (64); got 32"):
        call(name, **args)


def test_qk_norm_weight_length_must_equal_head_dim():
    x = torch.randn(4, 8, 128, dtype=F16)
    with raises_value_error("rmsnorm", "weight.shape[0] must equal input.shape[-1] (128); got 1024"):
        flashinfer.rmsnorm(x, torch.randn(8 * 128, dtype=F16))


@pytest.mark.parametrize("arg", ["gemma", "beta"])
def test_layernorm_gemma_and_beta_length_must_equal_hidden_size(arg):
    args = valid_args("layernorm")
    args[arg] = torch.randn(65)
    with raises_value_error("layernorm", f"{arg}.shape[0] must equal input.shape[-1] (64); got 65"):
        call("layernorm", **args)


@pytest.mark.parametrize("name", FUSED)
@pytest.mark.parametrize("shape", [(3, 64), (4, 32), (1, 4, 64)])
def test_residual_shape_must_equal_input_shape(name, shape):
    args = valid_args(name)
    args["residual"] = torch.randn(shape, dtype=F16)
    got = "(" + ", ".join(map(str, shape)) + ")"
    with raises_value_error(name, f"residual.shape must equal input.shape (4, 64); got {got}"):
        call(name, **args)


@pytest.mark.parametrize("name", RMS)
@pytest.mark.parametrize("shape", [(4, 65), (3, 64), (4, 1, 64), (256,)])
def test_out_shape_must_equal_input_shape(name, shape):
    args = valid_args(name)
    got = "(" + ", ".join(map(str, shape)) + ("," if len(shape) == 1 else "") + ")"
    with raises_value_error(name, f"out.shape must equal input.shape (4, 64); got {got}"):
        call(name, out=torch.empty(shape, dtype=F16), **args)


@pytest.mark.parametrize("name", ACTS)
@pytest.mark.parametrize("shape, message", [
    ((4, 65), r"out.shape\[-1\] \(65\) must be input.shape\[-1\] // 2 \(64\)"),
    ((4, 128), r"out.shape\[-1\] \(128\) must be input.shape\[-1\] // 2 \(64\)"),
    ((3, 64), r"out.shape\[:-1\] \(3,\) must equal input.shape\[:-1\] \(4,\)"),
    ((1, 4, 64), r"out.ndim \(3\) must equal input.ndim \(2\)"),
])
def test_activation_out_shape_is_asserted(name, shape, message):
    with pytest.raises(AssertionError, match=message):
        call(name, out=torch.empty(shape, dtype=F16), **valid_args(name))


@pytest.mark.parametrize("name", NORMS)
def test_1d_input_is_rejected(name):
    args = valid_args(name)
    args["input"] = args["input"][0]
    if name in FUSED:
        args["residual"] = args["residual"][0]
    what = "2-D [num_tokens, hidden_size]" + (" or 3-D [num_tokens, num_heads, head_dim]" if name in RMS else "")
    with raises_value_error(name, f"input must be {what}; got a 1-D tensor of shape (64,)"):
        call(name, **args)


@pytest.mark.parametrize("name", RMS)
def test_4d_input_is_rejected(name):
    args = valid_args(name)
    args["input"] = torch.randn(2, 2, 1, 64, dtype=F16)
    with raises_value_error(name, "input must be 2-D [num_tokens, hidden_size] or 3-D [num_tokens, num_heads, "
                                  "head_dim]; got a 4-D tensor of shape (2, 2, 1, 64)"):
        call(name, **args)


@pytest.mark.parametrize("name", FUSED + ("layernorm",))
def test_3d_input_is_rejected_where_only_2d_is_supported(name):
    args = valid_args(name)
    args["input"] = torch.randn(4, 2, 64, dtype=F16)
    if name in FUSED:
        args["residual"] = torch.randn(4, 2, 64, dtype=F16)
    with raises_value_error(name, "input must be 2-D [num_tokens, hidden_size]; got a 3-D tensor of shape (4, 2, 64)"):
        call(name, **args)


@pytest.mark.parametrize("name, arg", [(n, "weight") for n in WEIGHTED] + [("layernorm", "gemma"),
                                                                           ("layernorm", "beta")])
@pytest.mark.parametrize("shape", [(1, 64), ()])
def test_weight_must_be_1d(name, arg, shape):
    args = valid_args(name)
    args[arg] = torch.randn(shape, dtype=args[arg].dtype)
    got = f"a {len(shape)}-D tensor of shape (" + ", ".join(map(str, shape)) + ")"
    with raises_value_error(name, f"{arg} must be 1-D [hidden_size]; got {got}"):
        call(name, **args)


@pytest.mark.parametrize("name", NORMS)
def test_hidden_size_zero_is_rejected(name):
    args = {k: v[..., :0] for k, v in valid_args(name).items()}
    with raises_value_error(name, "input.shape[-1] (hidden size) must be > 0; got 0"):
        call(name, **args)


# --- strides ---------------------------------------------------------------------------------

@pytest.mark.parametrize("name", ALL)
def test_input_must_be_contiguous_in_its_last_dimension(name):
    args = valid_args(name)
    args["input"] = every_other_column(args["input"].shape, F16)
    with raises_value_error(name, "input must be contiguous in its last dimension (stride 1); got stride 2"):
        call(name, **args)


@pytest.mark.parametrize("name", RMS + ACTS)
def test_out_must_be_contiguous_in_its_last_dimension(name):
    args = valid_args(name)
    with raises_value_error(name, "out must be contiguous in its last dimension (stride 1); got stride 2"):
        call(name, out=every_other_column((4, 64), F16), **args)


@pytest.mark.parametrize("name", FUSED)
def test_residual_must_be_contiguous_in_its_last_dimension(name):
    args = valid_args(name)
    args["residual"] = every_other_column((4, 64), F16)
    with raises_value_error(name, "residual must be contiguous in its last dimension (stride 1); got stride 2"):
        call(name, **args)


@pytest.mark.parametrize("name, arg", [(n, "weight") for n in WEIGHTED] + [("layernorm", "gemma"),
                                                                           ("layernorm", "beta")])
def test_weight_must_be_contiguous(name, arg):
    args = valid_args(name)
    args[arg] = every_other_column((64,), args[arg].dtype)
    with raises_value_error(name, f"{arg} must be contiguous in its last dimension (stride 1); got stride 2"):
        call(name, **args)


@pytest.mark.parametrize("name", ACTS)
def test_activation_input_rows_must_fold_into_two_stride_levels(name):
    # [2, 3, 4, 16] with three unrelated leading strides
    x = torch.randn(20000, dtype=F16).as_strided((2, 3, 4, 16), (10000, 1000, 100, 1))
    with raises_value_error(name, "the leading dimensions of input must fold into at most two strided levels; "
                                  "got shape (2, 3, 4, 16)"):
        call(name, input=x)


@pytest.mark.parametrize("name", NORMS)
@pytest.mark.parametrize("eps, shown", [(None, "NoneType"), ("1e-6", "str"), ([1e-6], "list")])
def test_eps_of_another_type_is_a_type_error_naming_it(name, eps, shown):
    """(not nanobind's message listing the binding's signature)"""
    with pytest.raises(TypeError, match=f"^eps must be a real number; got {shown}$"):
        call(name, **valid_args(name), eps=eps)


@pytest.mark.parametrize("name", WEIGHTED)
def test_weight_must_not_overlap_a_written_tensor(name):
    """Every row reads the weight while the kernel writes out (input and residual in place): a
    weight inside one of them would be read half rewritten. Right after them: fine. (layernorm
    writes only the output it allocates.)"""
    for w in ("input", "residual") if name in FUSED else ("out",):
        args = valid_args(name)
        buf = torch.zeros(5 * 64, dtype=args["input"].dtype)
        args[w] = buf[:4 * 64].view(4, 64)
        args["weight"] = buf[2 * 64:3 * 64]  # row 2 of it
        with raises_value_error(name, f"weight must not overlap {w} in memory (the kernel writes {w} while every "
                                      "row reads weight)"):
            call(name, **args)
        args["weight"] = buf[4 * 64:]
        with pytest.raises(ValueError, match="must be a CUDA tensor"):
            call(name, **args)


# --- activations: odd last dimension -----------------------------------------------------------

@pytest.mark.parametrize("name", ACTS)
@pytest.mark.parametrize("shape", [(4, 127), (2, 3, 1), (7,)])
def test_activation_odd_last_dimension_is_rejected(name, shape):
    with pytest.raises(ValueError, match="^" + re.escape("The last dimension must be even (2 * hidden_size).") + "$"):
        call(name, input=torch.randn(shape, dtype=F16))


# --- non-tensors -------------------------------------------------------------------------------

NON_TENSOR_CASES = [(n, a, v) for n in ALL for a in valid_args(n) for v in (None, [1.0, 2.0], 3.5)]
NON_TENSOR_CASES += [(n, "out", v) for n in RMS for v in ([1.0, 2.0], 3.5)]  # out=None is valid


@pytest.mark.parametrize("name, arg, value", NON_TENSOR_CASES)
def test_non_tensor_argument_is_a_type_error_naming_it(name, arg, value):
    args = valid_args(name)
    args[arg] = value
    with pytest.raises(TypeError, match=rf"^{arg} must be a tensor supporting DLPack .*; got {type(value).__name__}$"):
        call(name, **args)


# --- formerly known gaps (strict xfails until session 9) -----------------------------------------

@pytest.mark.parametrize("name", ACTS)
def test_activation_non_tensor_out_is_a_type_error(name):
    with pytest.raises(TypeError, match="out"):
        call(name, out=[0.0] * 64, **valid_args(name))


@pytest.mark.parametrize("name", ACTS)
def test_activation_0d_input_message_names_the_dimension_count(name):
    with pytest.raises(ValueError, match="dimension"):
        try:
            call(name, input=torch.tensor(1.0, dtype=F16))
        except ValueError as e:
            assert "even" not in str(e), str(e)
            raise


@pytest.mark.parametrize("name", RMS + ACTS)
def test_out_with_overlapping_rows_is_rejected(name):
    out = torch.empty(1, 64, dtype=F16).expand(4, 64)
    with pytest.raises(ValueError, match="out"):
        try:
            call(name, out=out, **valid_args(name))
        except ValueError as e:
            assert "CUDA" not in str(e), f"only the device check fired: {e}"
            raise


@pytest.mark.parametrize("name", FUSED)
def test_fused_add_residual_aliasing_input_is_rejected(name):
    x = torch.randn(4, 64, dtype=F16)
    with pytest.raises(ValueError, match="residual"):
        try:
            call(name, input=x, residual=x, weight=torch.randn(64, dtype=F16))
        except ValueError as e:
            assert "CUDA" not in str(e), f"only the device check fired: {e}"
            raise


def test_overlap_messages_name_the_tensor_and_its_strides():
    out = torch.empty(1, 64, dtype=F16).expand(4, 64)
    with raises_value_error("rmsnorm", "the rows of out must not overlap (the kernel writes them); got shape "
                                       "(4, 64) with strides (0, 1)"):
        call("rmsnorm", out=out, **valid_args("rmsnorm"))
    x = torch.randn(4, 64, dtype=F16)
    with raises_value_error("fused_add_rmsnorm", "residual must not overlap input in memory (the kernel writes both)"):
        call("fused_add_rmsnorm", input=x, residual=x, weight=torch.randn(64, dtype=F16))


@pytest.mark.parametrize("which", ["input", "residual"])
@pytest.mark.parametrize("name", FUSED)
def test_fused_add_overlapping_rows_are_rejected(name, which):
    """Both tensors are written in place, so neither may have rows that share memory."""
    args = valid_args(name)
    args[which] = torch.randn(1, 64, dtype=F16).expand(4, 64)
    with pytest.raises(ValueError, match=f"the rows of {which} must not overlap"):
        call(name, **args)


def test_layernorm_out_with_overlapping_rows_is_rejected():
    """layernorm allocates its own output; the binding still checks one passed to it."""
    args = valid_args("layernorm")
    out = torch.empty(5 * 32, dtype=F16).as_strided((4, 64), (32, 1))  # rows half a row apart
    dl = torch.utils.dlpack.to_dlpack
    with pytest.raises(ValueError, match="the rows of out must not overlap"):
        _norm.layernorm(dl(args["input"]), dl(args["gemma"]), dl(args["beta"]), dl(out), 1e-6, 0)


@pytest.mark.parametrize("case", ["column halves", "in place", "separate rows of one buffer"])
def test_writes_that_do_not_overlap_pass_validation(case):
    """Layouts that share a buffer without sharing elements are accepted: only the device check
    (the tensors are on the CPU here) may fire."""
    if case == "column halves":  # input and residual: the two halves of each row of one buffer
        buf = torch.randn(4, 128, dtype=F16)
        fn = lambda: call("fused_add_rmsnorm", input=buf[:, :64], residual=buf[:, 64:],  # noqa: E731
                          weight=torch.randn(64, dtype=F16))
    elif case == "in place":  # rmsnorm with out = input
        x = torch.randn(4, 64, dtype=F16)
        fn = lambda: call("rmsnorm", input=x, weight=torch.randn(64, dtype=F16), out=x)  # noqa: E731
    else:  # out rows two apart in a wider buffer, interleaved with unused rows
        out = torch.empty(8, 64, dtype=F16)[::2]
        fn = lambda: call("silu_and_mul", input=torch.randn(4, 128, dtype=F16), out=out)  # noqa: E731
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        fn()


@pytest.mark.parametrize("name", RMS + ("layernorm",))
def test_out_partly_overlapping_input_is_rejected(name):
    """out = input (in place) is fine: each thread reads an element before writing it. An out
    shifted against input by less than a row races with the rows other blocks read."""
    buf = torch.randn(5, 64, dtype=F16)
    args = valid_args(name)
    args["input"] = buf[1:]
    out = buf[:-1]  # row r of out is row r - 1 of input
    if name == "layernorm":
        dl = torch.utils.dlpack.to_dlpack
        fn = lambda o: _norm.layernorm(dl(args["input"]), dl(args["gemma"]), dl(args["beta"]), dl(o), 1e-6, 0)  # noqa: E731
    else:
        fn = lambda o: call(name, out=o, **args)  # noqa: E731
    with raises_value_error(name, "out must not overlap input (other than being input itself, in place); out "
                                  "starts -64 elements from input, with strides (64, 1) against (64, 1)"):
        fn(out)
    with pytest.raises(ValueError, match="must be a CUDA tensor"):  # in place
        fn(args["input"])


def test_norm_out_on_another_head_slice_of_the_input_buffer_passes():
    """QK-norm of q written into the k slot of the same fused [N, heads, d] buffer: the two views
    share the buffer, not an element (exact two-level test, not a byte-span comparison)."""
    qkv = torch.randn(5, 12, 64, dtype=F16)
    q, k = qkv[:, :4], qkv[:, 4:8]
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        call("rmsnorm", input=q, weight=torch.randn(64, dtype=F16), out=k)
    with raises_value_error("rmsnorm", "out must not overlap input (other than being input itself, in place); out "
                                       "starts 64 elements from input, with strides (768, 64, 1) against "
                                       "(768, 64, 1)"):
        call("rmsnorm", input=q, weight=torch.randn(64, dtype=F16), out=qkv[:, 1:5])


@pytest.mark.parametrize("name", ACTS)
def test_activation_in_place_needs_input_rows_apart(name):
    """In place is only safe when the input's own rows (2 * hidden wide) do not overlap: else a
    thread writes into a row another thread reads."""
    x = torch.randn(8 * 96, dtype=F16).as_strided((4, 128), (96, 1))  # rows 96 apart, 128 wide
    for out in (x[:, :64], x[:, 64:]):
        with pytest.raises(ValueError, match="out must not overlap input"):
            call(name, input=x, out=out)


@pytest.mark.parametrize("name", ACTS)
def test_activation_out_may_be_either_half_of_input_but_nothing_else(name):
    x = torch.randn(4, 128, dtype=F16)
    for ok in (x[:, :64], x[:, 64:]):  # in place, over x or over y
        with pytest.raises(ValueError, match="must be a CUDA tensor"):
            call(name, input=x, out=ok)
    packed = torch.randn(4, 192, dtype=F16)  # rows [x | y | out]: shares the buffer, not elements
    with pytest.raises(ValueError, match="must be a CUDA tensor"):
        call(name, input=packed[:, :128], out=packed[:, 128:])
    for bad in (x[:, 32:96], x[1:, :64]):  # straddles x and y; a row off
        with pytest.raises(ValueError, match="out must not overlap input"):
            call(name, input=x[:bad.shape[0]] if bad.shape[0] < 4 else x, out=bad)


# --- the raw binding with DLPack capsules that claim CUDA memory ------------------------------

FakeCudaTensor = FakeTensor  # float16 by default
W_AT = 0x40000  # a weight's made-up address, apart from the rows at the default one (out in place)


def test_raw_binding_without_a_gpu_raises_a_clear_runtime_error():
    """On a machine with no usable GPU, a call that gets past validation fails in the device
    guard with a RuntimeError naming CUDA, not a crash."""
    if _cuda.device_count() > 0:
        pytest.skip("a CUDA device is present: this test is for machines without one")
    x, w, out = FakeCudaTensor((1, 64)), FakeCudaTensor((64,), data=W_AT), FakeCudaTensor((1, 64))
    with pytest.raises(RuntimeError, match=r"^rmsnorm: CUDA error .*") as info:
        _norm.rmsnorm(x.capsule, w.capsule, out.capsule, 1e-6, 0, True)
    assert re.search(r"CUDA driver version is insufficient|no CUDA-capable device|CUDA driver", str(info.value)), (
        str(info.value))


def test_raw_binding_names_a_non_cuda_weight():
    """The device check covers every tensor argument, not only the input."""
    x, w, out = (FakeCudaTensor((2, 64)), FakeCudaTensor((64,), device_type=K_DL_CPU, data=W_AT),
                 FakeCudaTensor((2, 64)))
    with raises_value_error("rmsnorm", "weight must be a CUDA tensor; got a tensor on device type cpu"):
        _norm.rmsnorm(x.capsule, w.capsule, out.capsule, 1e-6, 0, True)


def test_raw_binding_refuses_tensors_on_different_gpus():
    x, w, out = FakeCudaTensor((2, 64)), FakeCudaTensor((64,), data=W_AT), FakeCudaTensor((2, 64), device_id=1)
    with raises_value_error("rmsnorm", "out is on cuda:1 but input is on cuda:0"):
        _norm.rmsnorm(x.capsule, w.capsule, out.capsule, 1e-6, 0, True)


# ---- the fp8-output norms (CPU tensors: every check before the device one) ----------------

def _quant_args(rows=4, hidden=64, dtype=F16):
    x = torch.randn(rows, hidden, dtype=dtype)
    return x, torch.randn(hidden, dtype=dtype), torch.empty(rows, hidden).to(torch.float8_e4m3fn)


def test_quant_out_must_be_float8():
    x, w, _ = _quant_args()
    with pytest.raises(ValueError, match="out must be a float8_e4m3fn or float8_e5m2 tensor"):
        flashinfer.rmsnorm_quant(torch.empty_like(x), x, w, 1.0)


@pytest.mark.parametrize("scale, match", [(torch.ones(2), "scale must be a scalar tensor"),
                                          (0.0, "scale must be a finite nonzero number"),
                                          (float("inf"), "scale must be a finite nonzero number")])
def test_quant_scale_is_checked(scale, match):
    x, w, out = _quant_args()
    with pytest.raises(ValueError, match=match):
        flashinfer.rmsnorm_quant(out, x, w, scale)


def test_quant_scale_on_the_host_is_taken_by_value():
    """A 1-element CPU tensor (or numpy array) is read on the host: a zero one is refused like
    the float 0.0, a valid one gets as far as the device check."""
    x, w, out = _quant_args()
    for zero in (torch.tensor(0.0), np.zeros(1, np.float32)):
        with pytest.raises(ValueError, match="scale must be a finite nonzero number"):
            flashinfer.rmsnorm_quant(out, x, w, zero)
    for ok in (torch.tensor([2.0], dtype=torch.float64), np.float32(2.0), np.ones((1, 1))):
        with pytest.raises(ValueError, match="CUDA"):
            flashinfer.rmsnorm_quant(out, x, w, ok)


def test_quant_shapes_dtypes_and_overlap_are_checked():
    x, w, out = _quant_args()
    with pytest.raises(ValueError, match=r"rmsnorm_quant: out"):
        flashinfer.rmsnorm_quant(out[:2], x, w, 1.0)
    with pytest.raises(ValueError, match=r"rmsnorm_quant: weight"):
        flashinfer.rmsnorm_quant(out, x, w.to(BF16), 1.0)
    with pytest.raises(ValueError, match=r"fused_add_rmsnorm_quant: residual must not overlap input"):
        flashinfer.fused_add_rmsnorm_quant(out, x, x, w, 1.0)
    with pytest.raises(ValueError, match=r"eps"):
        flashinfer.rmsnorm_quant(out, x, w, 1.0, eps=-1.0)
    with pytest.raises(ValueError, match=r"rmsnorm_quant: out must not overlap input"):
        flashinfer.rmsnorm_quant(x.view(torch.uint8)[:, :64].view(torch.float8_e4m3fn), x, w, 1.0)
    with pytest.raises(ValueError, match="CUDA"):
        flashinfer.rmsnorm_quant(out, x, w, 1.0)


def test_layernorm_quant_requires_contiguous_bf16():
    g = torch.randn(64)
    out = torch.empty(4, 64).to(torch.float8_e5m2)
    with pytest.raises(RuntimeError, match="input must be bfloat16"):
        flashinfer.layernorm_quant(out, torch.randn(4, 64, dtype=F16), g, g, 1.0)
    with pytest.raises(RuntimeError, match="input must be contiguous"):
        flashinfer.layernorm_quant(out, torch.randn(4, 128, dtype=BF16)[:, :64], g, g, 1.0)
    with pytest.raises(ValueError, match="layernorm_quant: gemma"):
        flashinfer.layernorm_quant(out, torch.randn(4, 64, dtype=BF16), g.to(F16), g, 1.0)


# --- a bare DLPack producer (only __dlpack__ and __dlpack_device__, no .shape) ------------------

@pytest.mark.parametrize("name", ACTS)
def test_activation_bare_producer_without_out_says_it_cannot_allocate(name):
    with pytest.raises(TypeError, match=r"cannot allocate an output for a .*Bare.*out="):
        call(name, input=Bare(torch.randn(4, 128, dtype=F16)))


@pytest.mark.parametrize("name", ACTS)
def test_activation_bare_producer_shapes_are_checked_by_the_binding(name):
    x, out = Bare(torch.randn(4, 128, dtype=F16)), Bare(torch.empty(4, 32, dtype=F16))
    with raises_value_error(name, "out.shape must be input.shape[:-1] + (input.shape[-1] // 2,) for input "
                                  "(4, 128); got (4, 32)"):
        call(name, input=x, out=out)
    with pytest.raises(ValueError, match="CUDA"):  # a valid pair reaches the device check
        call(name, input=x, out=Bare(torch.empty(4, 64, dtype=F16)))


def test_merge_states_bare_producer_says_it_cannot_allocate():
    v, s = Bare(torch.randn(2, 3, 4, 64, dtype=F16)), torch.randn(2, 3, 4)
    with pytest.raises(TypeError, match=r"cannot allocate an output for a .*Bare"):
        flashinfer.merge_states(v, s)
