// Shared by every binding: DLPack tensor checks with messages that name the argument, the
// device guard, the per-device PDL query, and CUDA error translation. No math here.
#pragma once

#include <cuda_runtime.h>
#include <nanobind/nanobind.h>
#include <nanobind/ndarray.h>

#include <cstdint>
#include <cstdlib>
#include <initializer_list>
#include <stdexcept>
#include <string>

#include "flashinfer/layout.h"
#include "flashinfer/utils.cuh"
#include "tensor_arg.h"

namespace flashinfer_bind {

namespace nb = nanobind;

// Every tensor argument (tensor_arg.h: torch tensors through DLPack's C exchange table).
using MutTensor = Tensor;

enum class DType { kF16, kBF16, kF32, kI32, kI64, kU8, kOther };

inline DType dtype_of(const MutTensor& t) {
  const auto d = t.dtype();
  if (d.lanes != 1) return DType::kOther;
  using C = nb::dlpack::dtype_code;
  if (d.code == uint8_t(C::Float) && d.bits == 16) return DType::kF16;
  if (d.code == uint8_t(C::Float) && d.bits == 32) return DType::kF32;
  if (d.code == uint8_t(C::Bfloat) && d.bits == 16) return DType::kBF16;
  if (d.code == uint8_t(C::Int) && d.bits == 32) return DType::kI32;
  if (d.code == uint8_t(C::Int) && d.bits == 64) return DType::kI64;
  if (d.code == uint8_t(C::UInt) && d.bits == 8) return DType::kU8;  // (fp8 tensors arrive as their uint8 views)
  return DType::kOther;
}

inline std::string dtype_name(const MutTensor& t) {
  const auto d = t.dtype();
  using C = nb::dlpack::dtype_code;
  std::string base = d.code == uint8_t(C::Float)    ? "float"
                     : d.code == uint8_t(C::Bfloat) ? "bfloat"
                     : d.code == uint8_t(C::Int)    ? "int"
                     : d.code == uint8_t(C::UInt)   ? "uint"
                     : d.code == uint8_t(C::Bool)   ? "bool"
                                                    : "dtype-code-" + std::to_string(d.code);
  return base + std::to_string(d.bits);
}

inline const char* dtype_str(DType d) {
  switch (d) {
    case DType::kF16: return "float16";
    case DType::kBF16: return "bfloat16";
    case DType::kF32: return "float32";
    case DType::kI32: return "int32";
    case DType::kI64: return "int64";
    case DType::kU8: return "uint8";
    default: return "other";
  }
}

inline std::string shape_str(const MutTensor& t) {
  std::string s = "(";
  for (size_t i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.shape(i));
  return s + (t.ndim() == 1 ? ",)" : ")");
}

inline std::string stride_str(const MutTensor& t) {
  std::string s = "(";
  for (size_t i = 0; i < t.ndim(); ++i) s += (i ? ", " : "") + std::to_string(t.stride(i));
  return s + (t.ndim() == 1 ? ",)" : ")");
}

// A bad argument. Python sees flashinfer._ext.ArgumentError, a subclass of both ValueError and
// RuntimeError (FlashInfer raises either, depending on where its check lives): each module
// registers the translation at import (register_argument_error).
struct ArgumentError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] inline void fail(const std::string& msg) { throw ArgumentError(msg); }

inline void register_argument_error() {
  nb::register_exception_translator([](const std::exception_ptr& p, void*) {
    try {
      std::rethrow_exception(p);
    } catch (const ArgumentError& e) {
      static PyObject* const type = [] {  // looked up once, kept for the process
        PyObject* t = nullptr;
        if (PyObject* mod = PyImport_ImportModule("flashinfer._ext")) {
          t = PyObject_GetAttrString(mod, "ArgumentError");
          Py_DECREF(mod);
        }
        if (!t) {  // (a module loaded outside the package)
          PyErr_Clear();
          t = PyExc_ValueError;
          Py_INCREF(t);
        }
        return t;
      }();
      PyErr_SetString(type, e.what());
    }
  });
}

// For the overlap checks (layout.h works in bytes): a row layout in elements of `e` bytes as
// bytes, and how many bytes after a's data b's starts.
inline flashinfer::RowLayout in_bytes(const flashinfer::RowLayout& l, int64_t e) {
  return {l.inner, l.stride_outer * e, l.stride_inner * e};
}
inline int64_t byte_delta(const MutTensor& a, const MutTensor& b) {
  return static_cast<int64_t>(reinterpret_cast<intptr_t>(b.data()) - reinterpret_cast<intptr_t>(a.data()));
}

// `op: name ...` prefix for every message.
struct Checker {
  const char* op;

  void ndim_in(const MutTensor& t, const char* name, std::initializer_list<int> allowed,
               const char* what) const {
    for (int n : allowed)
      if (static_cast<int>(t.ndim()) == n) return;
    fail(std::string(op) + ": " + name + " must be " + what + "; got a " + std::to_string(t.ndim()) +
         "-D tensor of shape " + shape_str(t));
  }
  void dtype_is(const MutTensor& t, const char* name, DType want) const {
    if (dtype_of(t) != want)
      fail(std::string(op) + ": " + name + ".dtype must be " + dtype_str(want) + "; got " +
           dtype_name(t));
  }
  DType dtype_half(const MutTensor& t, const char* name) const {
    const DType d = dtype_of(t);
    if (d != DType::kF16 && d != DType::kBF16)
      fail(std::string(op) + ": " + name + ".dtype must be float16 or bfloat16; got " + dtype_name(t));
    return d;
  }
  void same_shape(const MutTensor& t, const char* name, const MutTensor& ref, const char* ref_name) const {
    bool ok = t.ndim() == ref.ndim();
    for (size_t i = 0; ok && i < t.ndim(); ++i) ok = t.shape(i) == ref.shape(i);
    if (!ok)
      fail(std::string(op) + ": " + name + ".shape must equal " + ref_name + ".shape " +
           shape_str(ref) + "; got " + shape_str(t));
  }
  void dim_is(const MutTensor& t, const char* name, int dim, int64_t want, const char* what) const {
    const int d = dim < 0 ? static_cast<int>(t.ndim()) + dim : dim;
    if (static_cast<int64_t>(t.shape(d)) != want)
      fail(std::string(op) + ": " + name + ".shape[" + std::to_string(dim) + "] must equal " + what +
           " (" + std::to_string(want) + "); got " + std::to_string(t.shape(d)));
  }
  // Only the innermost dimension must be contiguous.
  void last_contiguous(const MutTensor& t, const char* name) const {
    const size_t n = t.ndim();
    if (n > 0 && t.shape(n - 1) > 1 && t.stride(n - 1) != 1)
      fail(std::string(op) + ": " + name + " must be contiguous in its last dimension (stride 1); got stride " +
           std::to_string(t.stride(n - 1)));
  }
  flashinfer::RowLayout rows(const MutTensor& t, const char* name, int64_t* n_rows) const {
    flashinfer::RowLayout l;
    if (!flashinfer::fold_rows(static_cast<int>(t.ndim()), reinterpret_cast<const int64_t*>(t.shape_ptr()),
                               t.stride_ptr(), &l, n_rows))
      fail(std::string(op) + ": the leading dimensions of " + name +
           " must fold into at most two strided levels; got shape " + shape_str(t));
    return l;
  }
  // A tensor the kernel writes (`rows` rows of `hidden` elements, laid out by l): no two rows
  // may share an element, or the rows' writes race (an expand()ed or self-overlapping view).
  void rows_disjoint(const MutTensor& t, const char* name, const flashinfer::RowLayout& l, int64_t rows,
                     int64_t hidden) const {
    if (!flashinfer::rows_disjoint(l, rows, hidden))
      fail(std::string(op) + ": the rows of " + name + " must not overlap (the kernel writes them); got shape " +
           shape_str(t) + " with strides " + stride_str(t));
  }
  // Two tensors of one shape that the kernel both writes must not share memory.
  void no_overlap(const MutTensor& a, const char* a_name, const flashinfer::RowLayout& la, const MutTensor& b,
                  const char* b_name, const flashinfer::RowLayout& lb, int64_t rows, int64_t hidden) const {
    const int64_t e = static_cast<int64_t>(a.itemsize());
    if (flashinfer::rows_intersect(in_bytes(la, e), in_bytes(lb, e), byte_delta(a, b), rows, hidden * e))
      fail(std::string(op) + ": " + b_name + " must not overlap " + a_name + " in memory (the kernel writes both)");
  }
  // An output the kernel writes against an input other rows' threads read: no shared byte,
  // except when `out` is the input itself (in place: same row layout, `out` starting at one of
  // `alias_elems` elements into each input row), where each thread reads an element before it
  // writes it. out_w / in_w: row widths in elements.
  void out_apart(const MutTensor& out, const flashinfer::RowLayout& lo, int64_t out_w, const MutTensor& in,
                 const char* in_name, const flashinfer::RowLayout& li, int64_t in_w, int64_t rows,
                 std::initializer_list<int64_t> alias_elems) const {
    const int64_t e = static_cast<int64_t>(out.itemsize());
    const int64_t delta = byte_delta(out, in);
    // (in place also needs the input's own rows apart: a thread's write must not land in a row
    // another thread reads)
    const bool same_rows = rows <= 1 || (lo.inner == li.inner && lo.stride_outer == li.stride_outer &&
                                         (lo.inner <= 1 || lo.stride_inner == li.stride_inner) &&
                                         flashinfer::rows_disjoint(li, rows, in_w));
    for (int64_t a : alias_elems)
      if (same_rows && delta == -a * e) return;
    if (flashinfer::tensors_intersect(in_bytes(lo, e), rows, out_w * e, in_bytes(li, e), rows, in_w * e, delta))
      fail(std::string(op) + ": out must not overlap " + in_name + " (other than being " + in_name +
           " itself, in place); out starts " + std::to_string(-delta / e) + " elements from " + in_name +
           ", with strides " + stride_str(out) + " against " + stride_str(in));
  }
  // All tensors on one CUDA device; returns its id. Called after the shape/dtype checks so
  // CPU tensors exercise every other validation path.
  int cuda_device(std::initializer_list<std::pair<const MutTensor*, const char*>> ts) const {
    int dev = -1;
    const char* first = nullptr;
    for (auto [t, name] : ts) {
      if (t->device_type() != nb::device::cuda::value)
        fail(std::string(op) + ": " + name + " must be a CUDA tensor; got a tensor on device type " +
             device_type_name(t->device_type()));
      if (dev < 0) {
        dev = t->device_id();
        first = name;
      } else if (t->device_id() != dev) {
        fail(std::string(op) + ": " + name + " is on cuda:" + std::to_string(t->device_id()) + " but " +
             first + " is on cuda:" + std::to_string(dev));
      }
    }
    return dev;
  }
  static std::string device_type_name(int type) {
    switch (type) {
      case nb::device::cpu::value: return "cpu";
      case nb::device::cuda::value: return "cuda";
      case nb::device::cuda_host::value: return "cuda_host (pinned cpu)";
      case nb::device::cuda_managed::value: return "cuda_managed";
      default: return std::to_string(type);
    }
  }
};

[[noreturn]] inline void throw_cuda(const char* op, cudaError_t err) {
  throw std::runtime_error(std::string(op) + ": CUDA error " + cudaGetErrorName(err) + ": " +
                           cudaGetErrorString(err));
}

// Makes `device` current for the scope of a call, restoring the caller's device after.
// flashinfer::current_device() answers from a per-thread cache keyed by the driver context,
// so the common case (the tensors' device is already current) makes no runtime call.
class DeviceGuard {
 public:
  DeviceGuard(const char* op, int device) {
    cudaError_t err = flashinfer::current_device(&prev_);
    if (err != cudaSuccess) throw_cuda(op, err);
    if (prev_ != device) {
      err = cudaSetDevice(device);
      if (err != cudaSuccess) throw_cuda(op, err);
      switched_ = true;
    }
  }
  ~DeviceGuard() {
    if (switched_) cudaSetDevice(prev_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int prev_ = 0;
  bool switched_ = false;
};

// Programmatic dependent launch on `device`: compute capability 9.0+ (asked once per device,
// then cached), unless FLASHINFER_PDL=0 (read once: a switch for measurements and debugging).
inline bool device_supports_pdl(int device) {
  static const bool off = [] {
    const char* e = std::getenv("FLASHINFER_PDL");
    return e && e[0] == '0' && e[1] == 0;
  }();
  static int cc_major[64] = {};  // 0 = not asked yet
  if (off || device < 0 || device >= 64) return false;
  if (cc_major[device] == 0) {
    int major = -1;
    if (cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device) != cudaSuccess) major = -1;
    cc_major[device] = major;
  }
  return cc_major[device] >= 9;
}

// The stream a binding launches on, on `device` (the call's, made current by its DeviceGuard):
// the handle the caller passed, or for kFrameworkStream the current stream of the framework
// whose tensors the call read through DLPack's C exchange table (tensor_arg.h), asked in one C
// call (torch: what torch.cuda.current_stream(device) is) instead of a Python-level query.
inline constexpr uintptr_t kFrameworkStream = ~uintptr_t{0};
inline cudaStream_t as_stream(uintptr_t s, int device) {
  if (s != kFrameworkStream) return reinterpret_cast<cudaStream_t>(s);
  const dlpack_exchange::Api* api = dlpack_exchange::last_api();
  void* stream = nullptr;
  constexpr int32_t kDLCUDA = 2;
  if (!api || !api->current_work_stream || api->current_work_stream(kDLCUDA, device, &stream) != 0) {
    PyErr_Clear();
    throw std::runtime_error("flashinfer: the stream argument asks for the framework's current stream, but no "
                             "tensor of this call came through a framework that can say it");
  }
  return static_cast<cudaStream_t>(stream);
}

inline bool aligned16(const void* p) { return reinterpret_cast<uintptr_t>(p) % 16 == 0; }

}  // namespace flashinfer_bind
