// _cuda: the few device facts the Python layer needs (device count, compute capability).
// Linked against the static CUDA runtime, so importing it needs no driver.
#include <nanobind/stl/pair.h>
#include <nanobind/stl/string.h>

#include "common.h"

namespace flashinfer_bind {
cudaError_t launch_empty(cudaStream_t stream, bool pdl, int path);  // cuda_probe.cu
}
namespace fb = flashinfer_bind;
namespace nb = nanobind;
using namespace nb::literals;

NB_MODULE(_cuda, m) {
  flashinfer_bind::register_argument_error();
  m.doc() = "flashinfer CUDA runtime queries";
  // Number of visible CUDA devices; 0 (not an error) where there is no GPU or driver.
  m.def("device_count", []() {
    int n = 0;
    return cudaGetDeviceCount(&n) == cudaSuccess ? n : 0;
  });
  // Why there is no device, as the CUDA runtime words it ("" when there is one).
  m.def("unavailable_reason", []() -> std::string {
    int n = 0;
    const cudaError_t err = cudaGetDeviceCount(&n);
    if (err != cudaSuccess) return std::string(cudaGetErrorName(err)) + ": " + cudaGetErrorString(err);
    return n > 0 ? "" : "no CUDA device is visible";
  });
  m.def(
      "compute_capability",
      [](int device) {
        int major = 0, minor = 0;
        cudaError_t err = cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device);
        if (err == cudaSuccess) err = cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device);
        if (err != cudaSuccess) fb::throw_cuda("compute_capability", err);
        return std::make_pair(major, minor);
      },
      "device"_a);
  // Launches an empty kernel: the host cost of a bare launch (a benchmark probe). path: 0 the
  // bindings' launcher (cudaLaunchKernelEx), 1 <<<...>>>, 2 the driver's cuLaunchKernelEx, 3 the
  // launcher with 1 KiB of kernel parameters.
  m.def(
      "launch_empty",
      [](uintptr_t stream, bool pdl, int path) {
        int dev = 0;
        const cudaError_t dev_err = flashinfer::current_device(&dev);
        if (dev_err != cudaSuccess) fb::throw_cuda("launch_empty", dev_err);
        const cudaError_t err = fb::launch_empty(fb::as_stream(stream, dev), pdl, path);
        if (err != cudaSuccess) fb::throw_cuda("launch_empty", err);
      },
      "stream"_a, "pdl"_a = false, "path"_a = 0);
  // What taking tensors costs, without a launch (benchmark probes): three DLPack tensors
  // imported as nb::ndarray, against three raw pointers passed as integers.
  m.def(
      "probe_tensors",
      [](fb::MutTensor a, fb::MutTensor b, fb::MutTensor c) {
        return reinterpret_cast<uintptr_t>(a.data()) ^ reinterpret_cast<uintptr_t>(b.data()) ^
               reinterpret_cast<uintptr_t>(c.data());
      },
      "a"_a, "b"_a, "c"_a);
  // What a binding sees of a tensor argument (tests: the exchange table's path against
  // nanobind's DLPack import): (data address, shape, strides, (code, bits, lanes), device
  // type, device id).
  m.def(
      "describe_tensor",
      [](fb::MutTensor t) {
        nb::list shape, strides;
        for (size_t i = 0; i < t.ndim(); ++i) {
          shape.append(static_cast<int64_t>(t.shape(i)));
          strides.append(t.stride(i));
        }
        const auto d = t.dtype();
        return nb::make_tuple(reinterpret_cast<uintptr_t>(t.data()), nb::tuple(shape), nb::tuple(strides),
                              nb::make_tuple(int(d.code), int(d.bits), int(d.lanes)), t.device_type(),
                              t.device_id());
      },
      "t"_a);
  // Whether tensors of this Python type reach the bindings through DLPack's C exchange table.
  m.def("takes_exchange_api", &fb::takes_exchange_api, "type"_a);
  // The `stream` value that asks for the current stream of the call's framework (common.h), and
  // the stream a binding taking tensor `t` would launch on for a given `stream` (a test probe).
  m.attr("FRAMEWORK_STREAM") = fb::kFrameworkStream;
  m.def(
      "resolve_stream",
      [](fb::MutTensor t, uintptr_t stream) {
        return reinterpret_cast<uintptr_t>(fb::as_stream(stream, t.device_id()));
      },
      "t"_a, "stream"_a);
  m.def("probe_ints", [](uintptr_t a, uintptr_t b, uintptr_t c) { return a ^ b ^ c; }, "a"_a, "b"_a, "c"_a);
  m.def("runtime_version", []() {
    int v = 0;
    cudaRuntimeGetVersion(&v);
    return v;
  });
}
