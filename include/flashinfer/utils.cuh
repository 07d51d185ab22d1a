// Host-side CUDA helpers shared by every launcher: error propagation, the one device query,
// and a typed launch that can request programmatic dependent launch (PDL).
#pragma once

#include <cuda_runtime.h>

#include <utility>

#include "device_info.h"

#define FLASHINFER_CUDA_TRY(expr)               \
  do {                                          \
    cudaError_t flashinfer_err_ = (expr);       \
    if (flashinfer_err_ != cudaSuccess) return flashinfer_err_; \
  } while (0)

namespace flashinfer {

// The only place the library asks the device about itself.
inline cudaError_t query_device_info(int device, DeviceInfo* info) {
  FLASHINFER_CUDA_TRY(cudaDeviceGetAttribute(&info->num_sms, cudaDevAttrMultiProcessorCount, device));
  FLASHINFER_CUDA_TRY(
      cudaDeviceGetAttribute(&info->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  FLASHINFER_CUDA_TRY(cudaDeviceGetAttribute(&info->cc_major, cudaDevAttrComputeCapabilityMajor, device));
  FLASHINFER_CUDA_TRY(cudaDeviceGetAttribute(&info->cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  return cudaSuccess;
}

// kernel<<<grid, block, smem, stream>>>(args...) with type checking, optionally marked for
// PDL so it may start while the previous kernel in the stream drains (the kernel must call
// pdl_wait() before reading what that kernel wrote).
template <typename... KArgs, typename... Args>
cudaError_t launch(void (*kernel)(KArgs...), dim3 grid, dim3 block, size_t smem,
                   cudaStream_t stream, bool pdl, Args&&... args) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = grid;
  cfg.blockDim = block;
  cfg.dynamicSmemBytes = smem;
  cfg.stream = stream;
  cudaLaunchAttribute attr[1];
  attr[0].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[0].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = pdl ? 1 : 0;
  return cudaLaunchKernelEx(&cfg, kernel, std::forward<Args>(args)...);
}

}  // namespace flashinfer
