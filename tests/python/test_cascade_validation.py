"""Argument validation of flashinfer.cascade (merge_state, merge_state_in_place, merge_states)
on CPU: no GPU needed.

The binding checks ndim, dtype, shapes and strides before the device, so CPU tensors exercise
every check; a call that passes them all fails on "must be a CUDA tensor". Shape mismatches
between arguments raise RuntimeError (spec §2, as FlashInfer's C++ checks do); every other
bad argument raises ValueError naming the function and the argument; a non-tensor is a
TypeError. LSE inputs of another dtype are converted with .float() before the checks. The
last tests call the raw binding with DLPack capsules that claim CUDA memory.
"""

from __future__ import annotations

import re

import pytest

torch = pytest.importorskip("torch")
np = pytest.importorskip("numpy")

import flashinfer  # noqa: E402
from fake_dlpack import K_DL_CPU, K_DL_CUDA, FakeTensor  # noqa: E402
from flashinfer import _cascade, _cuda  # noqa: E402

F16, BF16, F32 = torch.float16, torch.bfloat16, torch.float32
FUNCS = ("merge_state", "merge_state_in_place", "merge_states")
DEVICE_MSG = "must be a CUDA tensor; got a tensor on device type cpu"
FIRST_ARG = {"merge_state": "v_a", "merge_state_in_place": "v", "merge_states": "v"}


def two_states(seq=4, heads=3, d=64, dtype=F16):
    return (torch.randn(seq, heads, d, dtype=dtype), torch.randn(seq, heads),
            torch.randn(seq, heads, d, dtype=dtype), torch.randn(seq, heads))


def valid_args(name, seq=4, heads=3, d=64, dtype=F16, states=5):
    """Arguments that pass every check except the device one (they are on the CPU)."""
    if name == "merge_states":
        return dict(v=torch.randn(seq, states, heads, d, dtype=dtype), s=torch.randn(seq, states, heads))
    v_a, s_a, v_b, s_b = two_states(seq, heads, d, dtype)
    if name == "merge_state":
        return dict(v_a=v_a, s_a=s_a, v_b=v_b, s_b=s_b)
    return dict(v=v_a, s=s_a, v_other=v_b, s_other=s_b)


def call(name, **kwargs):
    return getattr(flashinfer, name)(**kwargs)


def value_error(name, message):
    return pytest.raises(ValueError, match="^" + re.escape(f"{name}: {message}") + "$")


def shape_error(name, message):
    return pytest.raises(RuntimeError, match="^" + re.escape(f"{name}: {message}") + "$")


def device_error(name):
    return value_error(name, f"{FIRST_ARG[name]} {DEVICE_MSG}")


# --- device ----------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("dtype", [F16, BF16], ids=["fp16", "bf16"])
def test_cpu_tensors_are_rejected_naming_cuda(name, dtype):
    with device_error(name):
        call(name, **valid_args(name, dtype=dtype))


@pytest.mark.parametrize("name", FUNCS)
def test_numpy_arrays_are_rejected_naming_cuda(name):
    args = {k: v.numpy() for k, v in valid_args(name).items()}
    with device_error(name):
        call(name, **args)


def test_the_package_exports_the_cascade_module_and_names():
    assert flashinfer.cascade.merge_state is flashinfer.merge_state
    assert flashinfer.cascade.merge_state_in_place is flashinfer.merge_state_in_place
    assert flashinfer.cascade.merge_states is flashinfer.merge_states
    for n in ("cascade",) + FUNCS:
        assert n in flashinfer.__all__


# --- shape mismatches: RuntimeError ------------------------------------------------------------

@pytest.mark.parametrize("shape", [(5, 3, 64), (4, 2, 64), (4, 3, 32)], ids=["seq", "heads", "head_dim"])
def test_merge_state_v_b_shape_must_equal_v_a_shape(shape):
    args = valid_args("merge_state")
    args["v_b"] = torch.randn(*shape, dtype=F16)
    with shape_error("merge_state", f"v_b.shape must equal v_a.shape (4, 3, 64); got {tuple(shape)}"):
        call("merge_state", **args)


@pytest.mark.parametrize("arg", ["s_a", "s_b"])
@pytest.mark.parametrize("shape", [(5, 3), (4, 2), (3, 4)])
def test_merge_state_lse_shape_must_equal_v_rows_and_heads(arg, shape):
    args = valid_args("merge_state")
    args[arg] = torch.randn(*shape)
    with shape_error("merge_state", f"{arg}.shape must equal v_a.shape[:2] (4, 3); got {tuple(shape)}"):
        call("merge_state", **args)


def test_merge_state_in_place_shapes_must_match():
    args = valid_args("merge_state_in_place")
    args["v_other"] = torch.randn(4, 3, 128, dtype=F16)
    with shape_error("merge_state_in_place", "v_other.shape must equal v.shape (4, 3, 64); got (4, 3, 128)"):
        call("merge_state_in_place", **args)
    args = valid_args("merge_state_in_place")
    args["s"] = torch.randn(4, 1)
    with shape_error("merge_state_in_place", "s.shape must equal v.shape[:2] (4, 3); got (4, 1)"):
        call("merge_state_in_place", **args)
    args = valid_args("merge_state_in_place")
    args["s_other"] = torch.randn(8, 3)
    with shape_error("merge_state_in_place", "s_other.shape must equal v.shape[:2] (4, 3); got (8, 3)"):
        call("merge_state_in_place", **args)


@pytest.mark.parametrize("shape", [(5, 5, 3), (4, 6, 3), (4, 5, 2)], ids=["seq", "states", "heads"])
def test_merge_states_s_shape_must_equal_v_shape_prefix(shape):
    args = valid_args("merge_states")
    args["s"] = torch.randn(*shape)
    with shape_error("merge_states", f"s.shape must equal v.shape[:3] (4, 5, 3); got {tuple(shape)}"):
        call("merge_states", **args)


@pytest.mark.parametrize("length", [3, 5, 1])
def test_mask_length_must_equal_seq_len(length):
    args = valid_args("merge_state_in_place")
    with shape_error("merge_state_in_place", f"mask.shape must equal (seq_len,) = (4,); got ({length},)"):
        call("merge_state_in_place", **args, mask=torch.ones(length, dtype=torch.bool))


def test_shape_errors_are_runtime_errors_not_value_errors():
    args = valid_args("merge_state")
    args["v_b"] = torch.randn(4, 3, 32, dtype=F16)
    with pytest.raises(RuntimeError) as info:
        call("merge_state", **args)
    assert not isinstance(info.value, ValueError)


# --- ndim: ValueError ----------------------------------------------------------------------------

@pytest.mark.parametrize("shape", [(4, 64), (4, 3, 2, 64), (64,)])
def test_merge_state_values_must_be_3d(shape):
    args = valid_args("merge_state")
    args["v_a"] = torch.randn(*shape, dtype=F16)
    with value_error("merge_state", f"v_a must be 3-D [seq_len, num_heads, head_dim]; got a {len(shape)}-D "
                                    f"tensor of shape {tuple(shape)}"):
        call("merge_state", **args)
    args = valid_args("merge_state")
    args["v_b"] = torch.randn(*shape, dtype=F16)
    with value_error("merge_state", f"v_b must be 3-D [seq_len, num_heads, head_dim]; got a {len(shape)}-D "
                                    f"tensor of shape {tuple(shape)}"):
        call("merge_state", **args)


@pytest.mark.parametrize("name, arg", [("merge_state", "s_a"), ("merge_state", "s_b"),
                                       ("merge_state_in_place", "s"), ("merge_state_in_place", "s_other")])
@pytest.mark.parametrize("shape", [(4,), (4, 3, 1)])
def test_lse_must_be_2d(name, arg, shape):
    args = valid_args(name)
    args[arg] = torch.randn(*shape)
    with value_error(name, f"{arg} must be 2-D [seq_len, num_heads]; got a {len(shape)}-D tensor of shape "
                           f"{tuple(shape)}"):
        call(name, **args)


@pytest.mark.parametrize("shape", [(4, 3, 64), (2, 4, 5, 3, 64)])
def test_merge_states_v_must_be_4d(shape):
    with value_error("merge_states", f"v must be 4-D [seq_len, num_states, num_heads, head_dim]; got a "
                                     f"{len(shape)}-D tensor of shape {tuple(shape)}"):
        flashinfer.merge_states(torch.randn(*shape, dtype=F16), torch.randn(*shape[:-1]))


@pytest.mark.parametrize("shape", [(4, 5), (4, 5, 3, 1)])
def test_merge_states_s_must_be_3d(shape):
    with value_error("merge_states", f"s must be 3-D [seq_len, num_states, num_heads]; got a {len(shape)}-D "
                                     f"tensor of shape {tuple(shape)}"):
        flashinfer.merge_states(torch.randn(4, 5, 3, 64, dtype=F16), torch.randn(*shape))


@pytest.mark.parametrize("shape", [(4, 1), ()])
def test_mask_must_be_1d(shape):
    mask = torch.ones(shape, dtype=torch.bool)
    with value_error("merge_state_in_place", f"mask must be 1-D [seq_len]; got a {len(shape)}-D tensor of shape "
                                             + ("()" if not shape else str(tuple(shape)))):
        call("merge_state_in_place", **valid_args("merge_state_in_place"), mask=mask)


# --- dtypes: ValueError ------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("bad", [torch.float32, torch.float64, torch.int32, torch.uint8])
def test_values_dtype_must_be_fp16_or_bf16(name, bad):
    args = valid_args(name)
    key = FIRST_ARG[name]
    args[key] = args[key].to(bad)
    got = str(bad).removeprefix("torch.")
    with value_error(name, f"{key}.dtype must be float16 or bfloat16; got {got}"):
        call(name, **args)


@pytest.mark.parametrize("name, arg", [("merge_state", "v_b"), ("merge_state_in_place", "v_other")])
def test_second_values_dtype_must_match_the_first(name, arg):
    args = valid_args(name, dtype=F16)
    args[arg] = args[arg].to(BF16)
    with value_error(name, f"{arg}.dtype must equal the values' dtype float16; got bfloat16"):
        call(name, **args)
    args[arg] = args[arg].to(F32)
    with value_error(name, f"{arg}.dtype must be float16 or bfloat16; got float32"):
        call(name, **args)


@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("s_dtype", [torch.float64, torch.float16, torch.bfloat16, torch.int64])
def test_lse_of_another_dtype_is_converted_with_float(name, s_dtype):
    """FlashInfer calls s.to(float32): every LSE argument is accepted (the call then fails only
    on the device check)."""
    args = valid_args(name)
    for k in list(args):
        if k.startswith("s"):
            args[k] = args[k].to(s_dtype)
    with device_error(name):
        call(name, **args)


@pytest.mark.parametrize("bad", [torch.int32, torch.int8, torch.float32, torch.float16])
def test_mask_dtype_must_be_bool_or_uint8(bad):
    got = {torch.int32: "int32", torch.int8: "int8", torch.float32: "float32", torch.float16: "float16"}[bad]
    with value_error("merge_state_in_place", f"mask.dtype must be bool or uint8; got {got}"):
        call("merge_state_in_place", **valid_args("merge_state_in_place"), mask=torch.ones(4, dtype=bad))


@pytest.mark.parametrize("mask_dtype", [torch.bool, torch.uint8])
def test_bool_and_uint8_masks_are_accepted(mask_dtype):
    with device_error("merge_state_in_place"):
        call("merge_state_in_place", **valid_args("merge_state_in_place"), mask=torch.ones(4, dtype=mask_dtype))


def test_strided_mask_is_accepted():
    mask = torch.ones(8, dtype=torch.bool)[::2]
    with device_error("merge_state_in_place"):
        call("merge_state_in_place", **valid_args("merge_state_in_place"), mask=mask)


# --- head_dim ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FUNCS)
def test_head_dim_zero_is_rejected(name):
    args = valid_args(name, d=0)
    key = FIRST_ARG[name]
    dim = 3 if name == "merge_states" else 2
    with value_error(name, f"{key}.shape[{dim}] (head_dim) must be > 0; got 0"):
        call(name, **args)


@pytest.mark.parametrize("name", FUNCS)
@pytest.mark.parametrize("d", [8, 24, 64, 72, 100, 128, 256, 512, 1000, 1024, 4096])
def test_any_head_dim_up_to_the_limit_passes_validation(name, d):
    """head_dim is a runtime value: multiples of 8 take 16-byte vectors, others one element at
    a time; only the device check remains."""
    with device_error(name):
        call(name, **valid_args(name, seq=2, heads=2, d=d, states=2))


# --- strides ---------------------------------------------------------------------------------------

@pytest.mark.parametrize("name", FUNCS)
def test_values_must_be_contiguous_in_their_last_dimension(name):
    args = valid_args(name, d=128)
    key = FIRST_ARG[name]
    args[key] = args[key][..., ::2]
    if name == "merge_states":
        args["s"] = args["s"]
    else:
        other = "v_b" if name == "merge_state" else "v_other"
        args[other] = args[other][..., :64]
    with value_error(name, f"{key} must be contiguous in its last dimension (stride 1); got stride 2"):
        call(name, **args)


@pytest.mark.parametrize("name, arg", [("merge_state", "v_b"), ("merge_state_in_place", "v_other")])
def test_second_values_must_be_contiguous_in_their_last_dimension(name, arg):
    args = valid_args(name, d=64)
    args[arg] = torch.randn(4, 3, 128, dtype=F16)[..., ::2]
    with value_error(name, f"{arg} must be contiguous in its last dimension (stride 1); got stride 2"):
        call(name, **args)


@pytest.mark.parametrize("name", FUNCS)
def test_strided_rows_heads_and_lse_pass_validation(name):
    """Only the last dimension of a values tensor must be contiguous; LSEs may have any strides."""
    if name == "merge_states":
        v = torch.randn(6, 5, 4, 2, 128, dtype=F16)[:, :, 1:4, 0, :64]  # every dim but the last strided
        s = torch.randn(3, 6, 5, 8)[1, :, :, ::2][:, :, :3]
        args = dict(v=v, s=s)
    else:
        buf = torch.randn(4, 6, 2 * 64 + 8, dtype=F16)
        v1 = buf[:, ::2, 8:72]
        v2 = torch.randn(3, 4, 64, dtype=F16).transpose(0, 1)  # [4, 3, 64], heads outer in memory
        s1 = torch.randn(3, 4).t()
        s2 = torch.randn(4, 6)[:, 1::2]
        keys = ("v_a", "s_a", "v_b", "s_b") if name == "merge_state" else ("v", "s", "v_other", "s_other")
        args = dict(zip(keys, (v1, s1, v2, s2)))
    with device_error(name):
        call(name, **args)


@pytest.mark.parametrize("arg, tensor, strides", [
    ("v", lambda: torch.randn(1, 3, 64, dtype=F16).expand(4, 3, 64), "(0, 64, 1)"),
    ("v", lambda: torch.randn(4, 64, dtype=F16)[:, None].expand(4, 3, 64), "(64, 0, 1)"),
    ("v", lambda: torch.randn(512, dtype=F16).as_strided((4, 3, 64), (64, 32, 1)), "(64, 32, 1)"),
    ("s", lambda: torch.randn(1, 3).expand(4, 3), "(0, 1)"),
    ("s", lambda: torch.randn(4, 1).expand(4, 3), "(1, 0)"),
])
def test_in_place_outputs_must_not_overlap_themselves(arg, tensor, strides):
    """v and s are written: an expanded or overlapping view would make threads race."""
    args = valid_args("merge_state_in_place")
    args[arg] = tensor()
    shape = tuple(args[arg].shape)
    with value_error("merge_state_in_place", f"{arg} is written and must not overlap itself (an expanded or "
                                             f"overlapping view); got shape {shape} and strides {strides}"):
        call("merge_state_in_place", **args)


def test_read_only_states_may_be_broadcast():
    """One state merged into every row: v_other / s_other (and merge_state's inputs) may be
    expanded views."""
    args = valid_args("merge_state_in_place")
    args["v_other"] = torch.randn(1, 3, 64, dtype=F16).expand(4, 3, 64)
    args["s_other"] = torch.randn(1, 3).expand(4, 3)
    with device_error("merge_state_in_place"):
        call("merge_state_in_place", **args)
    with device_error("merge_state"):
        call("merge_state", v_a=args["v_other"], s_a=args["s_other"], v_b=args["v"], s_b=args["s"])


def test_in_place_states_must_not_share_memory():
    """merge_state_in_place writes v and s while it reads v_other and s_other: two of them may
    share memory only by being the very same tensor (then each element is read and written by one
    thread). Halves of one buffer interleaved by rows are apart."""
    msg = "{r} must not overlap {w} in memory (the kernel writes {w}), unless it is the same tensor"
    vb = torch.randn(5, 3, 64, dtype=F16)
    sb = torch.randn(5, 3)
    cases = [
        (dict(v=vb[:4], v_other=vb[1:]), "v_other", "v"),
        (dict(s=sb[:4], s_other=sb[1:]), "s_other", "s"),
        (dict(v=vb[:4], s=vb.view(torch.float32).view(-1)[:12].view(4, 3)), "s", "v"),
        (dict(v=vb[:4], v_other=vb[:4].transpose(0, 1).contiguous().transpose(0, 1)), None, None),
    ]
    for over, r, w in cases:
        args = valid_args("merge_state_in_place")
        args.update(over)
        if r is None:  # apart (a copy, or another buffer): on to the device check
            with device_error("merge_state_in_place"):
                call("merge_state_in_place", **args)
            continue
        with value_error("merge_state_in_place", msg.format(r=r, w=w)):
            call("merge_state_in_place", **args)
    args = valid_args("merge_state_in_place")
    args["v_other"], args["s_other"] = args["v"], args["s"]  # the same state twice: allowed
    with device_error("merge_state_in_place"):
        call("merge_state_in_place", **args)
    both = torch.randn(4, 2, 3, 64, dtype=F16)  # [seq, 2, heads, d]: v and v_other interleaved by rows
    args = valid_args("merge_state_in_place")
    args["v"], args["v_other"] = both[:, 0], both[:, 1]
    with device_error("merge_state_in_place"):
        call("merge_state_in_place", **args)


# --- non-tensors: TypeError --------------------------------------------------------------------------

@pytest.mark.parametrize("name", FUNCS)
def test_non_tensor_arguments_are_type_errors_naming_them(name):
    base = valid_args(name)
    for key in base:
        args = dict(base)
        args[key] = [[1.0, 2.0]]
        with pytest.raises(TypeError, match=rf"\b{key}\b"):
            call(name, **args)


def test_non_tensor_mask_is_a_type_error_naming_it():
    with pytest.raises(TypeError, match=r"\bmask\b"):
        call("merge_state_in_place", **valid_args("merge_state_in_place"), mask=[1, 0, 1, 1])


# --- the raw binding with DLPack capsules that claim CUDA memory ------------------------------------

Fake = FakeTensor


def _merge_state_fakes(seq=2, heads=3, d=64, **overrides):
    """Capsules at made-up addresses 256 MiB apart (merge_state_in_place refuses states that share memory)."""
    at = {k: (i + 1) << 28 for i, k in enumerate(("v_a", "s_a", "v_b", "s_b", "v_merged", "s_merged"))}
    f = dict(v_a=Fake((seq, heads, d), data=at["v_a"]), s_a=Fake((seq, heads), "f32", data=at["s_a"]),
             v_b=Fake((seq, heads, d), data=at["v_b"]), s_b=Fake((seq, heads), "f32", data=at["s_b"]),
             v_merged=Fake((seq, heads, d), data=at["v_merged"]), s_merged=Fake((seq, heads), "f32", data=at["s_merged"]))
    f.update(overrides)
    return f


def _caps(fakes):
    return [f.capsule for f in fakes.values()]


def test_raw_binding_without_a_gpu_raises_a_clear_runtime_error():
    """Past validation, a machine with no usable GPU fails in the device guard with a
    RuntimeError naming CUDA, not a crash (all three entry points)."""
    if _cuda.device_count() > 0:
        pytest.skip("a CUDA device is present: this test is for machines without one")
    f = _merge_state_fakes()
    with pytest.raises(RuntimeError, match=r"^merge_state: CUDA error "):
        _cascade.merge_state(*_caps(f), 0)
    f, mask = _merge_state_fakes(), Fake((2,), "bool")  # a capsule can be consumed once
    with pytest.raises(RuntimeError, match=r"^merge_state_in_place: CUDA error "):
        _cascade.merge_state_in_place(*_caps(f)[:4], mask.capsule, 0)
    v, s, vo, so = Fake((2, 4, 3, 64)), Fake((2, 4, 3), "f32"), Fake((2, 3, 64)), Fake((2, 3), "f32")
    with pytest.raises(RuntimeError, match=r"^merge_states: CUDA error "):
        _cascade.merge_states(v.capsule, s.capsule, vo.capsule, so.capsule, 0)


def test_raw_binding_rejects_a_head_dim_beyond_the_limit():
    d = (1 << 24) + 8
    f = _merge_state_fakes(seq=1, heads=1, d=d)
    with value_error("merge_state", f"v_a.shape[2] (head_dim) must be <= 16777216; got {d}"):
        _cascade.merge_state(*_caps(f), 0)


@pytest.mark.parametrize("arg", ["s_a", "v_b", "s_b", "v_merged", "s_merged"])
def test_raw_binding_names_a_non_cuda_argument(arg):
    f = _merge_state_fakes()
    old = f[arg]
    f[arg] = Fake(tuple(old.shape), "f32" if arg.startswith("s") else "f16", device_type=K_DL_CPU)
    with value_error("merge_state", f"{arg} {DEVICE_MSG}"):
        _cascade.merge_state(*_caps(f), 0)


def test_raw_binding_refuses_tensors_on_different_gpus():
    f = _merge_state_fakes(v_b=Fake((2, 3, 64), device_id=1))
    with value_error("merge_state", "v_b is on cuda:1 but v_a is on cuda:0"):
        _cascade.merge_state(*_caps(f), 0)


@pytest.mark.parametrize("device_type, device_id, msg", [(K_DL_CPU, 0, f"mask {DEVICE_MSG}"),
                                                          (K_DL_CUDA, 1, "mask is on cuda:1 but v is on cuda:0")])
def test_raw_binding_refuses_a_mask_on_another_device(device_type, device_id, msg):
    f, mask = _merge_state_fakes(), Fake((2,), "u8", device_type=device_type, device_id=device_id)
    with value_error("merge_state_in_place", msg):
        _cascade.merge_state_in_place(*_caps(f)[:4], mask.capsule, 0)


def test_raw_binding_checks_the_output_buffers():
    f = _merge_state_fakes(v_merged=Fake((2, 3, 32)))
    with shape_error("merge_state", "v_merged.shape must equal v_a.shape (2, 3, 64); got (2, 3, 32)"):
        _cascade.merge_state(*_caps(f), 0)
    f = _merge_state_fakes(s_merged=Fake((2, 3), "f16"))
    with value_error("merge_state", "s_merged.dtype must be float32 (LSE); got float16"):
        _cascade.merge_state(*_caps(f), 0)
    v, s, vo, so = Fake((2, 4, 3, 64)), Fake((2, 4, 3), "f32"), Fake((2, 4, 64)), Fake((2, 3), "f32")
    with shape_error("merge_states", "v_merged.shape must equal (v.shape[0], v.shape[2], v.shape[3]) = (2, 3, 64); "
                                     "got (2, 4, 64)"):
        _cascade.merge_states(v.capsule, s.capsule, vo.capsule, so.capsule, 0)


def test_raw_binding_rejects_a_non_float32_lse():
    """The Python layer converts LSEs; the binding itself insists on float32."""
    f = _merge_state_fakes(s_b=Fake((2, 3), "f16"))
    with value_error("merge_state", "s_b.dtype must be float32 (LSE); got float16"):
        _cascade.merge_state(*_caps(f), 0)
