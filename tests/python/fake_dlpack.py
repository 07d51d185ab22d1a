"""Hand-built DLPack capsules for the raw bindings: they describe memory at a made-up address
(never dereferenced: every call that uses them fails before a launch), so CPU-only machines
can reach the bindings' device checks and the no-GPU error path."""

from __future__ import annotations

import ctypes

K_DL_CPU, K_DL_CUDA = 1, 2
DL_CODES = {"f16": (2, 16), "bf16": (4, 16), "f32": (2, 32), "bool": (6, 8), "u8": (1, 8)}


class DLDevice(ctypes.Structure):
    _fields_ = [("device_type", ctypes.c_int32), ("device_id", ctypes.c_int32)]


class DLDataType(ctypes.Structure):
    _fields_ = [("code", ctypes.c_uint8), ("bits", ctypes.c_uint8), ("lanes", ctypes.c_uint16)]


class DLTensor(ctypes.Structure):
    _fields_ = [("data", ctypes.c_void_p), ("device", DLDevice), ("ndim", ctypes.c_int32),
                ("dtype", DLDataType), ("shape", ctypes.POINTER(ctypes.c_int64)),
                ("strides", ctypes.POINTER(ctypes.c_int64)), ("byte_offset", ctypes.c_uint64)]


class DLManagedTensor(ctypes.Structure):
    pass


DELETER = ctypes.CFUNCTYPE(None, ctypes.POINTER(DLManagedTensor))
DLManagedTensor._fields_ = [("dl_tensor", DLTensor), ("manager_ctx", ctypes.c_void_p), ("deleter", DELETER)]

_PyCapsule_New = ctypes.pythonapi.PyCapsule_New
_PyCapsule_New.restype = ctypes.py_object
_PyCapsule_New.argtypes = [ctypes.c_void_p, ctypes.c_char_p, ctypes.c_void_p]


@DELETER
def _no_op_deleter(_managed):  # the memory is owned by the FakeTensor object
    pass


class FakeTensor:
    """A contiguous DLPack capsule of `dtype` (a key of DL_CODES). A capsule is consumed by
    one call; keep this object alive for as long as its capsule may be used."""

    def __init__(self, shape, dtype="f16", device_type=K_DL_CUDA, device_id=0, data=0x10000):
        n = len(shape)
        self.shape = (ctypes.c_int64 * n)(*shape)
        strides, step = [], 1
        for s in reversed(shape):
            strides.insert(0, step)
            step *= s
        self.strides = (ctypes.c_int64 * n)(*strides)
        self.managed = DLManagedTensor()
        t = self.managed.dl_tensor
        t.data, t.device, t.ndim = data, DLDevice(device_type, device_id), n
        code, bits = DL_CODES[dtype]
        t.dtype = DLDataType(code, bits, 1)
        t.shape, t.strides, t.byte_offset = self.shape, self.strides, 0
        self.managed.deleter = _no_op_deleter
        self.capsule = _PyCapsule_New(ctypes.addressof(self.managed), b"dltensor", None)


class Bare:
    """The least a DLPack producer offers: ``__dlpack__`` and ``__dlpack_device__`` of a real
    tensor ``t``, and no ``.shape``, dtype or allocator."""

    def __init__(self, t):
        self._t = t

    def __dlpack__(self, stream=None, **kwargs):
        return self._t.__dlpack__()

    def __dlpack_device__(self):
        return self._t.__dlpack_device__()
