"""The package surface and its framework plumbing.

CPU: version, public names, FlashInfer-compatible signatures, import side effects.
GPU: torch and CuPy give identical results; calls are enqueued on the caller's current
stream (torch and CuPy); back-to-back launches with PDL see their producers' output; tensors
on a second GPU are handled under a device guard.
"""

from __future__ import annotations

import inspect
import re
import subprocess
import sys

import pytest

import flashinfer

# FlashInfer's public signatures: name -> [(parameter, default or REQUIRED)]
REQUIRED = inspect.Parameter.empty
SIGNATURES = {
    "rmsnorm": [("input", REQUIRED), ("weight", REQUIRED), ("eps", 1e-6), ("out", None), ("enable_pdl", None)],
    "gemma_rmsnorm": [("input", REQUIRED), ("weight", REQUIRED), ("eps", 1e-6), ("out", None),
                      ("enable_pdl", None)],
    "fused_add_rmsnorm": [("input", REQUIRED), ("residual", REQUIRED), ("weight", REQUIRED), ("eps", 1e-6),
                          ("enable_pdl", None)],
    "gemma_fused_add_rmsnorm": [("input", REQUIRED), ("residual", REQUIRED), ("weight", REQUIRED),
                                ("eps", 1e-6), ("enable_pdl", None)],
    "layernorm": [("input", REQUIRED), ("gemma", REQUIRED), ("beta", REQUIRED), ("eps", 1e-6)],
    "silu_and_mul": [("input", REQUIRED), ("out", None), ("enable_pdl", None)],
    "gelu_and_mul": [("input", REQUIRED), ("out", None), ("enable_pdl", None)],
    "gelu_tanh_and_mul": [("input", REQUIRED), ("out", None), ("enable_pdl", None)],
}
SUBMODULE = {name: ("activation" if name.endswith("_and_mul") else "norm") for name in SIGNATURES}


# --- CPU: the package surface ----------------------------------------------------------------

def test_version_is_a_release_string():
    assert isinstance(flashinfer.__version__, str)
    assert re.fullmatch(r"\d+\.\d+\.\d+([.+-]?\w+)*", flashinfer.__version__), flashinfer.__version__


@pytest.mark.parametrize("name", SIGNATURES)
def test_public_function_is_exported_at_top_level_and_in_its_module(name):
    module = getattr(flashinfer, SUBMODULE[name])
    assert callable(getattr(flashinfer, name))
    assert getattr(module, name) is getattr(flashinfer, name)
    assert name in flashinfer.__all__ and name in module.__all__


@pytest.mark.parametrize("name", SIGNATURES)
def test_signature_matches_flashinfer(name):
    params = list(inspect.signature(getattr(flashinfer, name)).parameters.values())
    assert [(p.name, p.default) for p in params] == SIGNATURES[name]
    assert all(p.kind is inspect.Parameter.POSITIONAL_OR_KEYWORD for p in params)


def test_import_loads_no_framework():
    """``import flashinfer`` imports neither torch nor CuPy (they are looked up only when a
    caller passes their tensors)."""
    code = "import sys, flashinfer; print(sorted(m for m in ('torch', 'cupy') if m in sys.modules))"
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.strip() == "[]"


def test_single_decode_is_one_op_under_torch_compile():
    """torch.compile(fullgraph=True) traces single_decode_with_kv_cache as one custom op,
    torch.ops.flashinfer.single_decode_with_kv_cache, whose fake function gives o [H, D] and lse
    [H] (or no lse). Traced on CPU tensors: running the graph then fails in the kernel call (no
    GPU here, or the binding refusing host tensors), after tracing has succeeded."""
    torch = pytest.importorskip("torch")
    graphs = []

    def backend(gm, example_inputs):
        graphs.append(gm)
        return gm.forward

    def fn(q, k, v):
        o, lse = flashinfer.single_decode_with_kv_cache(q, k, v, use_tensor_cores=True, return_lse=True)
        return o * 2, lse

    q = torch.randn(32, 128, dtype=torch.bfloat16)
    k = torch.randn(100, 8, 128, dtype=torch.bfloat16)
    with pytest.raises((RuntimeError, ValueError)):
        torch.compile(fn, fullgraph=True, backend=backend)(q, k, k)
    assert len(graphs) == 1 and "torch.ops.flashinfer.single_decode_with_kv_cache" in graphs[0].code

    from torch._subclasses.fake_tensor import FakeTensorMode

    with FakeTensorMode():
        fq, fk = torch.empty(32, 128, dtype=torch.float16), torch.empty(100, 8, 128, dtype=torch.float16)
        op = torch.ops.flashinfer.single_decode_with_kv_cache
        o, lse = op(fq, fk, fk, "NHD", "NONE", False, None, None, None, -1, None, None, None, None, True)
        assert o.shape == (32, 128) and o.dtype == torch.float16 and lse.shape == (32,) and lse.dtype == torch.float32
        _, no_lse = op(fq, fk, fk, "NHD", "NONE", False, None, None, None, -1, None, None, None, None, False)
        assert no_lse.shape == (0,)


def test_torch_imported_after_flashinfer_gets_the_ops_on_the_first_call():
    code = ("import flashinfer, torch, flashinfer.decode as d\n"
            "before = d._TORCH_OPS is None\n"
            "try:\n"
            "    flashinfer.single_decode_with_kv_cache(torch.randn(8, 64), torch.randn(5, 8, 64), torch.randn(5, 8, 64))\n"
            "except Exception:\n"
            "    pass\n"
            "print(before, d._TORCH_OPS is not None, hasattr(torch.ops.flashinfer, 'single_decode_with_kv_cache'))")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert result.stdout.split() == ["True", "True", "True"], result.stdout + result.stderr


def test_binding_argument_errors_are_value_and_runtime_errors():
    """FlashInfer raises ValueError from its Python checks and RuntimeError from its C++ ones;
    our bindings' checks raise one type that is both, so code written for either catches it."""
    np = pytest.importorskip("numpy")
    from flashinfer._ext import ArgumentError

    assert issubclass(ArgumentError, ValueError) and issubclass(ArgumentError, RuntimeError)
    x = np.zeros((4, 64), np.float16)  # a host array: the binding says it must be on a CUDA device
    for catch in (ValueError, RuntimeError):
        with pytest.raises(catch, match="^rmsnorm: input must be a CUDA tensor") as info:
            flashinfer.rmsnorm(x, np.zeros(64, np.float16))
        assert type(info.value) is ArgumentError


def test_cupy_outputs_are_allocated_on_the_inputs_device():
    """CuPy allocates on its current device, not the input's: the framework layer enters the
    input's device for every allocation (a fake CuPy records where each one happens)."""
    from flashinfer._ext import _CuPy

    log = []

    class Device:
        def __init__(self, i):
            self.id = i

        def __enter__(self):
            log.append(("enter", self.id))

        def __exit__(self, *a):
            log.append(("exit", self.id))

    class Arr:
        def __init__(self, dev, dtype="float16"):
            self.device, self.dtype = Device(dev), dtype

        def astype(self, dtype):
            log.append(("alloc", "astype"))
            return Arr(self.device.id, dtype)

    class FakeCuPy:
        float32 = "float32"

        def empty_like(self, x):
            log.append(("alloc", "empty_like"))
            return Arr(x.device.id)

        def empty(self, shape, dtype):
            log.append(("alloc", "empty"))
            return Arr(0, dtype)

    fw = _CuPy(FakeCuPy())
    x = Arr(1)
    for call in (lambda: fw.empty_like(x), lambda: fw.empty((3,), x), lambda: fw.empty_f32((3,), x),
                 lambda: fw.as_f32(x)):
        log.clear()
        call()
        assert [e[0] for e in log] == ["enter", "alloc", "exit"] and log[0] == ("enter", 1), log


def test_cuda_available_agrees_with_the_runtime():
    from flashinfer import _cuda

    n = _cuda.device_count()
    assert isinstance(n, int) and n >= 0
    assert flashinfer.utils.cuda_available() is (n > 0)
    if n == 0:
        assert isinstance(_cuda.unavailable_reason(), str) and _cuda.unavailable_reason()


def test_utils_device_helpers_take_every_device_spelling():
    """get_compute_capability / device_support_pdl / is_sm90a_supported take what FlashInfer's
    take (torch hands them the device): an index, a torch.device, or a string "cuda" / "cuda:1"."""
    from flashinfer.utils import _device_index

    assert _device_index(None) == 0 and _device_index(3) == 3
    assert _device_index("cuda") == 0 and _device_index("cuda:1") == 1
    with pytest.raises(ValueError, match="CUDA device"):
        _device_index("cpu")
    torch = pytest.importorskip("torch")
    assert _device_index(torch.device("cuda", 2)) == 2 and _device_index(torch.device("cuda")) == 0


@pytest.mark.gpu
def test_utils_device_helpers_on_a_string_device():
    assert flashinfer.utils.get_compute_capability("cuda:0") == flashinfer.utils.get_compute_capability(0)
    assert flashinfer.utils.device_support_pdl("cuda") == flashinfer.utils.device_support_pdl(0)
    assert flashinfer.utils.is_sm90a_supported("cuda:0") == flashinfer.utils.is_sm90a_supported(0)


# --- GPU --------------------------------------------------------------------------------------

def _torch():
    return pytest.importorskip("torch")


def _inputs_for(name, torch, dtype, rows=64, hidden=1024):
    """Fresh CUDA inputs for `name` as a tuple of positional arguments."""
    def r(*shape, dt=dtype):
        return torch.randn(*shape, dtype=dt, device="cuda")
    if name in ("rmsnorm", "gemma_rmsnorm"):
        return (r(rows, hidden), r(hidden))
    if name in ("fused_add_rmsnorm", "gemma_fused_add_rmsnorm"):
        return (r(rows, hidden), r(rows, hidden), r(hidden))
    if name == "layernorm":
        return (r(rows, hidden), r(hidden, dt=torch.float32), r(hidden, dt=torch.float32))
    return (r(rows, 2 * hidden),)


@pytest.mark.gpu
@pytest.mark.smoke
@pytest.mark.parametrize("name", SIGNATURES)
def test_cupy_and_torch_give_identical_results(name):
    torch = _torch()
    cupy = pytest.importorskip("cupy")
    args = _inputs_for(name, torch, torch.float16)  # CuPy has no bfloat16
    torch_args = [a.clone() for a in args]
    cupy_args = [cupy.from_dlpack(a.clone()) for a in args]
    torch.cuda.synchronize()

    fn = getattr(flashinfer, name)
    torch_out = fn(*torch_args)
    cupy_out = fn(*cupy_args)
    cupy.cuda.get_current_stream().synchronize()
    torch.cuda.synchronize()

    if "fused_add" in name:  # in place: compare input and residual
        assert torch_out is None and cupy_out is None
        for t, c in zip(torch_args[:2], cupy_args[:2]):
            assert torch.equal(t, torch.from_dlpack(c))
    else:
        assert isinstance(cupy_out, cupy.ndarray), type(cupy_out)
        assert cupy_out.dtype == cupy.float16 and tuple(cupy_out.shape) == tuple(torch_out.shape)
        assert torch.equal(torch_out, torch.from_dlpack(cupy_out))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["rmsnorm", "gemma_rmsnorm", "silu_and_mul"])
def test_cupy_out_argument_is_returned(name):
    torch = _torch()
    cupy = pytest.importorskip("cupy")
    args = [cupy.from_dlpack(a) for a in _inputs_for(name, torch, torch.float16, rows=8, hidden=128)]
    out_torch = torch.full((8, 128), float("nan"), dtype=torch.float16, device="cuda")
    out = cupy.from_dlpack(out_torch)  # shares out_torch's memory
    torch.cuda.synchronize()
    assert getattr(flashinfer, name)(*args, out=out) is out
    cupy.cuda.get_current_stream().synchronize()
    assert not torch.isnan(out_torch).any(), "out was not fully written"


SLEEP_CYCLES = 100_000_000  # ~50 ms on an H200: the stream is still busy when we query it


def _enqueue_behind_sleep_and_check(name, torch, dtype, run_on_stream, is_done, synchronize):
    """``run_on_stream(src, dst)`` must enqueue on one stream: a sleep, copies of ``src`` into
    the zero-filled ``dst``, then the kernel on ``dst``, and return the kernel's output. A
    kernel launched on any other stream would run at once and read zeros."""
    import reference as ref
    from checks import assert_close

    src = _inputs_for(name, torch, dtype)
    dst = [torch.zeros_like(a) for a in src]
    # Warm-up: a kernel's first launch loads its module, which can wait for the device to go
    # idle (and so for the sleep); the test is about ordering, not about that.
    getattr(flashinfer, name)(*[a.clone() for a in src])
    torch.cuda.synchronize()
    result = run_on_stream(src, dst)
    assert not is_done(), "the stream finished before the sleep could have: the test proves nothing"
    synchronize()

    if name == "rmsnorm":
        assert_close(result, ref.rmsnorm(*src))
    elif name == "fused_add_rmsnorm":
        normed, new_residual = ref.fused_add_rmsnorm(*src)
        assert_close(dst[0], normed, name="input")
        assert_close(dst[1], new_residual, name="residual")
    elif name == "layernorm":
        assert_close(result, ref.layernorm(*src))
    else:
        assert_close(result, ref.silu_and_mul(*src))


@pytest.mark.gpu
@pytest.mark.parametrize("name", ["rmsnorm", "fused_add_rmsnorm", "layernorm", "silu_and_mul"])
def test_torch_call_is_ordered_on_the_current_stream(name):
    torch = _torch()
    side = torch.cuda.Stream()

    def run_on_stream(src, dst):
        with torch.cuda.stream(side):
            torch.cuda._sleep(SLEEP_CYCLES)
            for d, s in zip(dst, src):
                d.copy_(s)
            if name == "rmsnorm":
                out = torch.full_like(dst[0], float("nan"))
                assert flashinfer.rmsnorm(*dst, out=out) is out
                return out
            return getattr(flashinfer, name)(*dst)

    _enqueue_behind_sleep_and_check(name, torch, torch.bfloat16, run_on_stream, side.query, side.synchronize)


@pytest.mark.gpu
def test_cupy_call_is_ordered_on_cupys_current_stream():
    torch = _torch()
    cupy = pytest.importorskip("cupy")
    side = cupy.cuda.Stream(non_blocking=True)
    side_for_torch = torch.cuda.ExternalStream(side.ptr)  # the same CUDA stream, seen by torch

    def run_on_stream(src, dst):
        with torch.cuda.stream(side_for_torch):
            torch.cuda._sleep(SLEEP_CYCLES)
            for d, s in zip(dst, src):
                d.copy_(s)
        with side:
            out = flashinfer.rmsnorm(cupy.from_dlpack(dst[0]), cupy.from_dlpack(dst[1]))
        assert isinstance(out, cupy.ndarray)
        return torch.from_dlpack(out)

    _enqueue_behind_sleep_and_check("rmsnorm", torch, torch.float16, run_on_stream, lambda: side.done,
                                    side.synchronize)


@pytest.mark.gpu
@pytest.mark.parametrize("enable_pdl", [None, True, False])
def test_back_to_back_launches_see_their_producers_output(enable_pdl):
    """A chain of kernels, each reading the previous one's NaN-poisoned-then-written output
    (with torch ops in between). With PDL a consumer may start early; it must still wait
    for its producer's writes. Each stage is checked against the reference of its actual input."""
    torch = _torch()
    import reference as ref
    from checks import assert_close, nan_full

    rows, hidden, dtype = 4096, 2048, torch.bfloat16
    kw = dict(enable_pdl=enable_pdl)
    w = torch.randn(2 * hidden, dtype=dtype, device="cuda")
    w_half = torch.randn(hidden, dtype=dtype, device="cuda")
    x0 = torch.randn(rows, 2 * hidden, dtype=dtype, device="cuda")
    torch.cuda.synchronize()

    s1 = flashinfer.rmsnorm(x0, w, out=nan_full((rows, 2 * hidden), dtype), **kw)
    s2 = flashinfer.silu_and_mul(s1, out=nan_full((rows, hidden), dtype), **kw)
    s3 = flashinfer.gemma_rmsnorm(s2, w_half, out=nan_full((rows, hidden), dtype), **kw)
    s4 = flashinfer.gelu_tanh_and_mul(torch.cat([s3, s2], dim=-1), out=nan_full((rows, hidden), dtype), **kw)
    s4_in = s4.clone()
    residual = s3.clone()
    residual_in = residual.clone()
    flashinfer.fused_add_rmsnorm(s4, residual, w_half, **kw)
    s5 = flashinfer.rmsnorm(s4, w_half, out=nan_full((rows, hidden), dtype), **kw)
    torch.cuda.synchronize()

    assert_close(s1, ref.rmsnorm(x0, w), name="stage 1 rmsnorm")
    assert_close(s2, ref.silu_and_mul(s1), name="stage 2 silu_and_mul")
    assert_close(s3, ref.gemma_rmsnorm(s2, w_half), name="stage 3 gemma_rmsnorm")
    assert_close(s4_in, ref.gelu_tanh_and_mul(torch.cat([s3, s2], dim=-1)), name="stage 4 gelu_tanh_and_mul")
    normed, new_residual = ref.fused_add_rmsnorm(s4_in, residual_in, w_half)
    assert_close(s4, normed, name="stage 5 fused_add_rmsnorm input")
    assert_close(residual, new_residual, name="stage 5 fused_add_rmsnorm residual")
    assert_close(s5, ref.rmsnorm(s4, w_half), name="stage 6 rmsnorm")


@pytest.mark.gpu
def test_tensors_on_a_second_gpu_run_under_a_device_guard():
    torch = _torch()
    if torch.cuda.device_count() < 2:
        pytest.skip("needs at least 2 CUDA devices")
    import reference as ref
    from checks import assert_close

    torch.cuda.set_device(0)
    dev1 = torch.device("cuda", 1)
    x = torch.randn(33, 4096, dtype=torch.bfloat16, device=dev1)
    w = torch.randn(4096, dtype=torch.bfloat16, device=dev1)
    gate_up = torch.randn(33, 2 * 111, dtype=torch.bfloat16, device=dev1)

    out = flashinfer.rmsnorm(x, w)
    act = flashinfer.silu_and_mul(gate_up)
    assert torch.cuda.current_device() == 0, "the call left a different device current"
    assert out.device == dev1 and act.device == dev1
    torch.cuda.synchronize(dev1)
    assert_close(out, ref.rmsnorm(x, w))
    assert_close(act, ref.silu_and_mul(gate_up))

    # ordered on device 1's current stream, not device 0's
    side = torch.cuda.Stream(device=dev1)
    y = torch.zeros_like(x)
    with torch.cuda.stream(side):
        torch.cuda._sleep(SLEEP_CYCLES)
        y.copy_(x)
        out2 = flashinfer.rmsnorm(y, w)
    assert not side.query()
    side.synchronize()
    assert_close(out2, ref.rmsnorm(x, w))

    # tensors on different devices are refused, naming both
    with pytest.raises(ValueError, match=r"rmsnorm: weight is on cuda:0 but input is on cuda:1"):
        flashinfer.rmsnorm(x, w.to("cuda:0"))
