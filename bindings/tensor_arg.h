// How a tensor argument reaches a binding: `Tensor`, an nb::ndarray<> whose caster first asks
// the argument's type for DLPack's C exchange table (`type(x).__dlpack_c_exchange_api__`, DLPack
// 1.3; torch.Tensor has one) and reads the tensor through it in one C call, with no capsule and
// no Python-level `__dlpack__`. Anything else (a DLPack capsule, a CuPy array, a producer without
// the table, or a tensor the table refuses) takes nanobind's own ndarray import, unchanged.
//
// Why: torch's `_to_dlpack(x)` plus the capsule's import cost ~0.4 us per tensor, and a decode
// step makes hundreds of calls of three to eight tensors each. The table's non-owning export is
// tens of nanoseconds; the ndarray built from it keeps the Python tensor alive as its owner. The
// same table answers the framework's current stream (common.h's as_stream, kFrameworkStream).
#pragma once

#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>

namespace flashinfer_bind {

namespace nb = nanobind;

// DLPack's C exchange table, declared from its ABI (dlpack.h 1.3, DLPackExchangeAPI). Only the
// non-owning export is called; the other entries are kept as opaque pointers for the layout.
namespace dlpack_exchange {

struct Version {
  uint32_t major;
  uint32_t minor;
};
struct Header {
  Version version;
  Header* prev_api;
};
struct Api {
  Header header;
  void* managed_tensor_allocator;
  void* managed_tensor_from_py_object_no_sync;
  void* managed_tensor_to_py_object_no_sync;
  // Fills *out with a view of py_object valid while py_object lives; 0, or -1 with a Python error.
  int (*dltensor_from_py_object_no_sync)(void* py_object, nb::dlpack::dltensor* out);
  // The framework's current stream on (device type, device id); 0, or -1 with a Python error.
  int (*current_work_stream)(int32_t device_type, int32_t device_id, void** out_stream);
};

// The table of `tp`, or nullptr: none, an unknown major version, or no non-owning export. Newer
// producers publish a capsule named "dlpack_exchange_api"; early ones (torch 2.10) an integer
// address under `__c_dlpack_exchange_api__`.
inline const Api* lookup(PyTypeObject* tp) {
  PyObject* t = reinterpret_cast<PyObject*>(tp);
  PyObject* attr = PyObject_GetAttrString(t, "__dlpack_c_exchange_api__");
  if (!attr) {
    PyErr_Clear();
    attr = PyObject_GetAttrString(t, "__c_dlpack_exchange_api__");
  }
  if (!attr) {
    PyErr_Clear();
    return nullptr;
  }
  void* p = nullptr;
  if (PyCapsule_CheckExact(attr))
    p = PyCapsule_GetPointer(attr, "dlpack_exchange_api");
  else if (PyLong_Check(attr))
    p = PyLong_AsVoidPtr(attr);
  if (!p) PyErr_Clear();
  Py_DECREF(attr);  // (the table itself is static in its library: it outlives the attribute)
  const Api* api = static_cast<const Api*>(p);
  if (!api || api->header.version.major != 1 || !api->dltensor_from_py_object_no_sync) return nullptr;
  return api;
}

// The table the last tensor argument was read through (in this module): the one a call's
// kFrameworkStream asks, since a call's arguments are all converted before its body runs.
inline const Api*& last_api() {
  static const Api* api = nullptr;
  return api;
}

// lookup() cached per type (a handful of types ever reach a binding: torch.Tensor, its
// subclasses such as nn.Parameter, capsules, CuPy arrays). The cache holds a reference to each
// type so that an address is never reused by another type. Called with the GIL held.
inline const Api* api_of(PyTypeObject* tp) {
  struct Entry {
    PyTypeObject* type;
    const Api* api;
  };
  static Entry cache[16];
  static int size = 0;
  for (int i = 0; i < size; ++i)
    if (cache[i].type == tp) return cache[i].api;
  const Api* api = lookup(tp);
  if (size < 16) {
    Py_INCREF(reinterpret_cast<PyObject*>(tp));
    cache[size++] = {tp, api};
  }
  return api;
}

}  // namespace dlpack_exchange

struct Tensor : nb::ndarray<> {
  using nb::ndarray<>::ndarray;
  Tensor() = default;
  explicit Tensor(const nb::ndarray<>& a) : nb::ndarray<>(a) {}
};

// Whether arguments of type `tp` take the exchange table (the Python side passes such tensors
// as they are instead of exporting them first).
inline bool takes_exchange_api(nb::handle tp) {
  return PyType_Check(tp.ptr()) && dlpack_exchange::api_of(reinterpret_cast<PyTypeObject*>(tp.ptr())) != nullptr;
}

}  // namespace flashinfer_bind

namespace nanobind::detail {

template <>
struct type_caster<flashinfer_bind::Tensor> {
  using Base = make_caster<ndarray<>>;
  NB_TYPE_CASTER(flashinfer_bind::Tensor, Base::Name)

  bool from_python(handle src, uint32_t flags, cleanup_list* cleanup) noexcept {
    PyTypeObject* tp = Py_TYPE(src.ptr());
    if (tp != &PyCapsule_Type && !src.is_none()) {
      if (const auto* api = flashinfer_bind::dlpack_exchange::api_of(tp)) {
        dlpack::dltensor t;
        if (api->dltensor_from_py_object_no_sync(src.ptr(), &t) == 0) {
          flashinfer_bind::dlpack_exchange::last_api() = api;
          static_assert(sizeof(size_t) == sizeof(int64_t), "DLPack shapes are read as size_t");
          value = flashinfer_bind::Tensor(ndarray<>(
              t.data, static_cast<size_t>(t.ndim), reinterpret_cast<const size_t*>(t.shape), src, t.strides,
              t.dtype, t.device.device_type, t.device.device_id, 'C', t.byte_offset));
          return true;
        }
        PyErr_Clear();  // (refused: nanobind's import below says why, through __dlpack__)
      }
    }
    Base base;
    if (!base.from_python(src, flags, cleanup)) return false;
    value = flashinfer_bind::Tensor(base.value);
    return true;
  }

  static handle from_cpp(const flashinfer_bind::Tensor& t, rv_policy policy, cleanup_list* cleanup) noexcept {
    return Base::from_cpp(t, policy, cleanup);
  }
};

}  // namespace nanobind::detail
