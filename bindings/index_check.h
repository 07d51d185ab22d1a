// Binding side of the opt-in device index check (include/flashinfer/index_check.h): zero the
// error record before the launch, read it back after (a host sync: debug mode only).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <string>

#include "common.h"
#include "flashinfer/index_check.h"

namespace flashinfer_bind {

// `err` is an int32 tensor of >= 2 elements on the launch device (Python allocates it when
// FLASHINFER_CHECK_INDICES is set), or an invalid ndarray (None): checking off.
class IndexCheck {
 public:
  IndexCheck(const Checker& c, const MutTensor& err) {
    if (!err.is_valid()) return;
    c.dtype_is(err, "err", DType::kI32);
    if (err.ndim() != 1 || err.shape(0) < flashinfer::kIndexErrorWords || err.stride(0) != 1)
      fail(std::string(c.op) + ": err must be a contiguous int32 tensor of >= 2 elements");
    dev_ = static_cast<int32_t*>(err.data());
  }
  int32_t* device_ptr() const { return dev_; }

  // Call after the device guard, before the launch.
  void begin(const char* op, cudaStream_t stream) const {
    if (!dev_) return;
    const cudaError_t e = cudaMemsetAsync(dev_, 0, flashinfer::kIndexErrorWords * sizeof(int32_t), stream);
    if (e != cudaSuccess) throw_cuda(op, e);
  }
  // Waits for the kernel; returns false (and fills bits/row) when it recorded an error.
  bool ok(const char* op, cudaStream_t stream, int32_t* bits, int64_t* row) const {
    if (!dev_) return true;
    int32_t h[flashinfer::kIndexErrorWords] = {0, 0};
    cudaError_t e = cudaMemcpyAsync(h, dev_, sizeof(h), cudaMemcpyDeviceToHost, stream);
    if (e == cudaSuccess) e = cudaStreamSynchronize(stream);
    if (e != cudaSuccess) throw_cuda(op, e);
    *bits = h[0];
    *row = flashinfer::first_error_row(h);
    return h[0] == 0;
  }

 private:
  int32_t* dev_ = nullptr;
};

// Reads element `i` of a device int32/int64 vector (debug messages only; syncs).
inline int64_t read_index(const MutTensor& t, int64_t i, cudaStream_t stream) {
  int64_t v = 0;
  const size_t bytes = t.dtype().bits / 8;
  if (i < 0 || i >= static_cast<int64_t>(t.shape(0)) || (bytes != 4 && bytes != 8)) return -1;
  const char* src = static_cast<const char*>(t.data()) + i * t.stride(0) * bytes;
  if (bytes == 4) {
    int32_t v32 = 0;
    if (cudaMemcpyAsync(&v32, src, 4, cudaMemcpyDeviceToHost, stream) == cudaSuccess &&
        cudaStreamSynchronize(stream) == cudaSuccess)
      v = v32;
  } else if (cudaMemcpyAsync(&v, src, 8, cudaMemcpyDeviceToHost, stream) != cudaSuccess ||
             cudaStreamSynchronize(stream) != cudaSuccess) {
    v = -1;
  }
  return v;
}

}  // namespace flashinfer_bind
