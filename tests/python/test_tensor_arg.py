"""How tensor arguments reach the bindings (bindings/tensor_arg.h).

Types that publish DLPack's C exchange table (``__dlpack_c_exchange_api__``: torch.Tensor) are
read through it in one C call; everything else (capsules, NumPy, CuPy, producers without the
table or with one the bindings do not take) goes through nanobind's DLPack import. Each path must
describe the tensor exactly as its producer does: address, shape, strides (in elements), dtype,
device. ``_cuda.describe_tensor`` returns what a binding sees. The same table gives the framework's
current stream when a call's ``stream`` is ``FRAMEWORK_STREAM`` (``_cuda.resolve_stream``: the
stream a binding would launch on).

CPU: torch views of every kind against torch's own metadata and against the capsule path;
hand-built producers (ctypes) exercise the table's two published forms, a refused export, an
unknown major version, the stream query. GPU: the same for CUDA tensors; the resolved stream is
torch's current one, on the default stream and under ``torch.cuda.stream``.
"""

from __future__ import annotations

import ctypes
import sys

import numpy as np
import pytest

from fake_dlpack import DLDataType, DLDevice, DLTensor, K_DL_CPU, K_DL_CUDA

from flashinfer import _cuda, _ext

# DLPack's type codes (dlpack.h DLDataTypeCode): kDLInt 0, kDLUInt 1, kDLFloat 2, kDLBfloat 4.
DL_DTYPE = {"float16": (2, 16, 1), "bfloat16": (4, 16, 1), "float32": (2, 32, 1), "int32": (0, 32, 1),
            "int64": (0, 64, 1), "uint8": (1, 8, 1)}


def expected(x, device_type):
    import torch

    name = str(x.dtype).replace("torch.", "")
    dev = x.device.index if x.device.type == "cuda" else 0
    assert isinstance(x, torch.Tensor)
    return (x.data_ptr(), tuple(x.shape), tuple(x.stride()), DL_DTYPE[name], device_type, dev)


def torch_views(device):
    """Tensors and views of every layout a caller can pass."""
    import torch

    g = torch.Generator().manual_seed(7)
    base = torch.randn(6, 10, 8, generator=g).to(device)
    views = {
        "contiguous": base,
        "row slice with offset": base[2:5],
        "strided slice": base[1:4, 2:9:3],
        "transposed": base.transpose(0, 2),
        "permuted": base.permute(1, 2, 0),
        "0-dim": base[2, 3, 4],
        "1 element": base[2, 3, 4:5],
        "empty": base[:0],
        "expanded (stride 0)": base[:1, :1].expand(5, 4, 8),
        "unsqueezed": base[1].unsqueeze(1),
        "requires_grad": torch.randn(3, 5, generator=g).to(device).requires_grad_(),
        "nn.Parameter": torch.nn.Parameter(torch.randn(4, 7, generator=g).to(device)),
    }
    for name in ("float16", "bfloat16", "int32", "int64", "uint8"):
        views[name] = (torch.arange(60, device=device) % 7).to(getattr(torch, name)).view(6, 10)[1:, 3:]
    return views


def check_torch_views(device, device_type):
    import torch

    assert _cuda.takes_exchange_api(torch.Tensor) == _has_table(torch.Tensor)
    for name, x in torch_views(device).items():
        want = expected(x, device_type)
        assert _cuda.describe_tensor(x) == want, name
        # the capsule path (torch's own exporter) describes it the same way
        assert _cuda.describe_tensor(torch._C._to_dlpack(x.detach())) == want, name


def _has_table(tp) -> bool:
    return hasattr(tp, "__dlpack_c_exchange_api__") or hasattr(tp, "__c_dlpack_exchange_api__")


# --- CPU -------------------------------------------------------------------------------------

def test_torch_tensors_are_described_exactly_on_cpu():
    pytest.importorskip("torch")
    check_torch_views("cpu", K_DL_CPU)


def test_torch_exporter_passes_tensors_as_they_are_when_the_bindings_take_the_table():
    torch = pytest.importorskip("torch")
    export = _ext.torch_exporter(torch)
    x = torch.zeros(3)
    if _cuda.takes_exchange_api(torch.Tensor):
        assert export(x) is x
    else:
        assert type(export(x)).__name__ == "PyCapsule"


def test_references_are_released():
    torch = pytest.importorskip("torch")
    x = torch.randn(4, 4)[1:]
    before = sys.getrefcount(x)
    for _ in range(200):
        _cuda.describe_tensor(x)
        _cuda.probe_tensors(x, x, x)
    assert sys.getrefcount(x) == before


def test_numpy_and_non_tensors_take_the_dlpack_import():
    a = np.arange(24, dtype=np.float32).reshape(4, 6)[1:, ::2]
    assert not _cuda.takes_exchange_api(np.ndarray)
    assert _cuda.describe_tensor(a) == (a.ctypes.data, (3, 3), (6, 2), (2, 32, 1), K_DL_CPU, 0)
    with pytest.raises(TypeError):
        _cuda.describe_tensor(3)
    with pytest.raises(TypeError):
        _cuda.describe_tensor([1.0, 2.0])


# Hand-built producers: a class whose type publishes a ctypes-made exchange table.

class _Version(ctypes.Structure):
    _fields_ = [("major", ctypes.c_uint32), ("minor", ctypes.c_uint32)]


class _Header(ctypes.Structure):
    _fields_ = [("version", _Version), ("prev_api", ctypes.c_void_p)]


_FROM_PY = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_void_p, ctypes.POINTER(DLTensor))
_STREAM = ctypes.CFUNCTYPE(ctypes.c_int, ctypes.c_int32, ctypes.c_int32, ctypes.POINTER(ctypes.c_void_p))


class _Api(ctypes.Structure):
    _fields_ = [("header", _Header), ("managed_tensor_allocator", ctypes.c_void_p),
                ("managed_tensor_from_py_object_no_sync", ctypes.c_void_p),
                ("managed_tensor_to_py_object_no_sync", ctypes.c_void_p),
                ("dltensor_from_py_object_no_sync", _FROM_PY), ("current_work_stream", _STREAM)]


_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]

SHAPE = (ctypes.c_int64 * 2)(5, 3)
STRIDES = (ctypes.c_int64 * 2)(7, 2)
CALLS = []


@_FROM_PY
def _export(obj, out):
    # obj is the PyObject* of the argument: a FakeProducer whose .refuse says what to do
    producer = ctypes.cast(obj, ctypes.py_object).value
    CALLS.append(producer.tag)
    if producer.refuse:  # (a ctypes callback cannot leave a Python error set: ctypes reports and clears it)
        return -1
    t = out.contents
    t.data, t.device, t.ndim = 0x20000, DLDevice(K_DL_CUDA, 3), 2
    t.dtype = DLDataType(4, 16, 1)
    t.shape, t.strides, t.byte_offset = SHAPE, STRIDES, 64
    return 0


FAKE_STREAM = 0x5150


@_STREAM
def _current_stream(device_type, device_id, out):
    CALLS.append(("stream", device_type, device_id))
    out[0] = FAKE_STREAM
    return 0


def _table(major, stream=True):
    api = _Api()
    api.header.version = _Version(major, 3)
    api.dltensor_from_py_object_no_sync = _export
    if stream:
        api.current_work_stream = _current_stream
    return api


TABLE_V1, TABLE_V2, TABLE_NO_STREAM = _table(1), _table(2), _table(1, stream=False)


def _producer(form, table):
    """A class publishing `table` in one of the two forms producers use."""
    if form == "capsule":
        attrs = {"__dlpack_c_exchange_api__": _PyCapsule_New(ctypes.addressof(table), b"dlpack_exchange_api", None)}
    else:  # the early form: an integer address
        attrs = {"__c_dlpack_exchange_api__": ctypes.addressof(table)}

    def __init__(self, tag, refuse=False):
        self.tag, self.refuse = tag, refuse

    def __dlpack__(self, stream=None, **kwargs):  # the fallback: a plain CPU array of another shape
        return np.zeros((2, 2), dtype=np.float16).__dlpack__()

    def __dlpack_device__(self):
        return (K_DL_CPU, 0)

    attrs.update(__init__=__init__, __dlpack__=__dlpack__, __dlpack_device__=__dlpack_device__)
    return type(f"FakeProducer_{form}", (), attrs)


@pytest.mark.parametrize("form", ["capsule", "integer"])
def test_a_published_table_is_read_in_both_forms(form):
    cls = _producer(form, TABLE_V1)
    assert _cuda.takes_exchange_api(cls)
    CALLS.clear()
    x = cls("a")
    # data + byte_offset, shape and strides as the table filled them, the table's device
    assert _cuda.describe_tensor(x) == (0x20000 + 64, (5, 3), (7, 2), (4, 16, 1), K_DL_CUDA, 3)
    assert CALLS == ["a"]
    assert sys.getrefcount(x) == 2  # (x and getrefcount's argument: the binding kept nothing)


def test_a_refused_export_falls_back_to_dlpack():
    cls = _producer("capsule", TABLE_V1)
    CALLS.clear()
    d = _cuda.describe_tensor(cls("r", refuse=True))
    assert CALLS == ["r"]
    assert d[1:] == ((2, 2), (2, 1), (2, 16, 1), K_DL_CPU, 0)  # what __dlpack__ gave
    assert not ctypes.pythonapi.PyErr_Occurred()


def test_an_unknown_major_version_is_not_used():
    cls = _producer("capsule", TABLE_V2)
    assert not _cuda.takes_exchange_api(cls)
    CALLS.clear()
    assert _cuda.describe_tensor(cls("v2"))[1] == (2, 2)
    assert CALLS == []


def test_the_framework_stream_is_asked_through_the_table():
    assert _cuda.FRAMEWORK_STREAM == _ext.FRAMEWORK_STREAM == 2**64 - 1
    cls = _producer("capsule", TABLE_V1)
    CALLS.clear()
    assert _cuda.resolve_stream(cls("s"), _ext.FRAMEWORK_STREAM) == FAKE_STREAM
    assert CALLS == ["s", ("stream", K_DL_CUDA, 3)]  # the tensor's device (cuda:3)
    CALLS.clear()
    assert _cuda.resolve_stream(cls("raw"), 0x7777) == 0x7777  # a stream handle passes as given
    assert CALLS == ["raw"]


def test_a_table_without_a_stream_query_raises():
    cls = _producer("capsule", TABLE_NO_STREAM)
    with pytest.raises(RuntimeError, match="framework's current stream"):
        _cuda.resolve_stream(cls("n"), _ext.FRAMEWORK_STREAM)


def test_torch_stream_source_matches_the_route():
    torch = pytest.importorskip("torch")
    source = _ext.torch_stream_source(torch)
    if _cuda.takes_exchange_api(torch.Tensor):
        assert source(0) == _ext.FRAMEWORK_STREAM
        assert _ext.framework_of(torch.zeros(1)).stream(torch.zeros(1)) == _ext.FRAMEWORK_STREAM


# --- GPU -------------------------------------------------------------------------------------

@pytest.mark.gpu
def test_torch_tensors_are_described_exactly_on_the_gpu():
    import torch

    check_torch_views("cuda", K_DL_CUDA)
    if torch.cuda.device_count() > 1:
        check_torch_views("cuda:1", K_DL_CUDA)


@pytest.mark.gpu
def test_the_framework_stream_is_torchs_current_stream():
    import torch

    x = torch.zeros(4, device="cuda")
    f = _ext.FRAMEWORK_STREAM
    assert _cuda.resolve_stream(x, f) == torch.cuda.current_stream().cuda_stream
    s = torch.cuda.Stream()
    assert s.cuda_stream != torch.cuda.current_stream().cuda_stream
    with torch.cuda.stream(s):
        assert _cuda.resolve_stream(x, f) == s.cuda_stream
    assert _cuda.resolve_stream(x, f) == torch.cuda.current_stream().cuda_stream


# --- what the Python wrappers hand the bindings ----------------------------------------------------

class Recorder:
    """Stands in for a binding module: records each call's positional arguments."""

    def __init__(self, result=None):
        self.calls = []
        self.result = result

    def __getattr__(self, name):
        def fn(*args):
            self.calls.append((name, args))
            return self.result
        return fn


def is_capsule(x):
    return type(x).__name__ == "PyCapsule"


def test_wrappers_pass_torch_tensors_straight_through_with_the_framework_stream(monkeypatch):
    # torch with the exchange table: every tensor of a call is passed as it is and the stream is
    # FRAMEWORK_STREAM; one argument of another framework sends the call through export_args
    # (each tensor exported by its own framework)
    torch = pytest.importorskip("torch")
    import flashinfer
    from flashinfer import activation, norm, page, rope

    if not _ext.torch_direct(torch):
        pytest.skip("this torch has no DLPack C exchange table")
    x, w = torch.randn(4, 64, dtype=torch.float16), torch.randn(64, dtype=torch.float16)
    stub = Recorder()
    monkeypatch.setattr(norm, "_rmsnorm", getattr(stub, "rmsnorm"))
    out = flashinfer.rmsnorm(x, w)
    (_, args), = stub.calls
    assert args[0] is x and args[1] is w and args[2] is out and args[4] == _ext.FRAMEWORK_STREAM
    flashinfer.rmsnorm(x, w.numpy())  # a NumPy weight: exported by NumPy, the torch tensors as they are
    _, args = stub.calls[-1]
    assert args[0] is x and is_capsule(args[1]) and args[4] == _ext.FRAMEWORK_STREAM

    monkeypatch.setattr(norm, "_fused_add_rmsnorm", getattr(stub, "fused_add"))
    r = torch.randn_like(x)
    flashinfer.fused_add_rmsnorm(x, r, w)
    _, args = stub.calls[-1]
    assert all(a is b for a, b in zip(args, (x, r, w))) and args[4] == _ext.FRAMEWORK_STREAM

    monkeypatch.setattr(rope, "_rope", stub)
    q, k = torch.randn(3, 4, 64, dtype=torch.float16), torch.randn(3, 2, 64, dtype=torch.float16)
    pos = torch.arange(3, dtype=torch.int32)
    flashinfer.apply_rope_pos_ids_inplace(q, k, pos)
    _, args = stub.calls[-1]
    assert args[1] is q and args[2] is k and args[5] is pos and args[-2] == _ext.FRAMEWORK_STREAM
    qr, kr = flashinfer.apply_rope_pos_ids(q, k, pos)
    _, args = stub.calls[-1]
    assert args[3] is qr and args[4] is kr and args[-2] == _ext.FRAMEWORK_STREAM
    flashinfer.apply_rope_pos_ids_inplace(q, k, pos.numpy())
    _, args = stub.calls[-1]
    assert args[1] is q and is_capsule(args[5])

    monkeypatch.setattr(activation, "_activation", stub)
    a = torch.randn(4, 128, dtype=torch.float16)
    o = flashinfer.silu_and_mul(a)
    _, args = stub.calls[-1]
    assert args[0] is a and args[1] is o and args[2] == _ext.FRAMEWORK_STREAM

    monkeypatch.setattr(page, "_page", Recorder(result=True))
    kc, vc = torch.zeros(4, 16, 2, 64, dtype=torch.float16), torch.zeros(4, 16, 2, 64, dtype=torch.float16)
    i32 = torch.int32
    ak, av = torch.randn(3, 2, 64, dtype=torch.float16), torch.randn(3, 2, 64, dtype=torch.float16)
    bi, ps = torch.zeros(3, dtype=i32), torch.arange(3, dtype=i32)
    ind, ptr, last = torch.arange(1, dtype=i32), torch.tensor([0, 1], dtype=i32), torch.tensor([3], dtype=i32)
    flashinfer.append_paged_kv_cache(ak, av, bi, ps, (kc, vc), ind, ptr, last)
    (_, args), = page._page.calls
    assert all(a is b for a, b in zip(args, (ak, av, bi, ps, kc, vc, ind, ptr, last)))
    assert args[10] == _ext.FRAMEWORK_STREAM
