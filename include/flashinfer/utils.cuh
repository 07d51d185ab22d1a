// Host-side CUDA helpers shared by every launcher: error propagation, the one device query,
// and a typed launch that can request programmatic dependent launch (PDL).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>

#include <utility>

#include "device_info.h"

#define FLASHINFER_CUDA_TRY(expr)               \
  do {                                          \
    cudaError_t flashinfer_err_ = (expr);       \
    if (flashinfer_err_ != cudaSuccess) return flashinfer_err_; \
  } while (0)

namespace flashinfer {

// The current device, cheaply. Every runtime call costs ~2 us on the H200 VM (measured by
// benchmarks/host_overhead.py), so the answer is cached per thread against the current
// driver context, which cuCtxGetCurrent (a thread-local read, through the runtime's driver
// entry point) reports: a context belongs to one device, so the same context means the same
// device. Falls back to cudaGetDevice whenever the context changed.
inline cudaError_t current_device(int* device) {
  using CtxGetCurrentFn = CUresult (*)(CUcontext*);
  static const CtxGetCurrentFn get_current = []() -> CtxGetCurrentFn {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuCtxGetCurrent", &fn, 12000, cudaEnableDefault, &q) != cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      return nullptr;
    return reinterpret_cast<CtxGetCurrentFn>(fn);
  }();
  thread_local CUcontext cached_ctx = nullptr;
  thread_local int cached_device = -1;
  CUcontext cur = nullptr;
  if (get_current && get_current(&cur) == CUDA_SUCCESS && cur != nullptr && cur == cached_ctx) {
    *device = cached_device;
    return cudaSuccess;
  }
  FLASHINFER_CUDA_TRY(cudaGetDevice(device));
  if (get_current && get_current(&cur) == CUDA_SUCCESS && cur != nullptr) {
    cached_ctx = cur;
    cached_device = *device;
  }
  return cudaSuccess;
}

// The only place the library asks the device about itself.
inline cudaError_t query_device_info(int device, DeviceInfo* info) {
  FLASHINFER_CUDA_TRY(cudaDeviceGetAttribute(&info->num_sms, cudaDevAttrMultiProcessorCount, device));
  FLASHINFER_CUDA_TRY(
      cudaDeviceGetAttribute(&info->smem_optin, cudaDevAttrMaxSharedMemoryPerBlockOptin, device));
  FLASHINFER_CUDA_TRY(cudaDeviceGetAttribute(&info->cc_major, cudaDevAttrComputeCapabilityMajor, device));
  FLASHINFER_CUDA_TRY(cudaDeviceGetAttribute(&info->cc_minor, cudaDevAttrComputeCapabilityMinor, device));
  FLASHINFER_CUDA_TRY(
      cudaDeviceGetAttribute(&info->smem_per_sm, cudaDevAttrMaxSharedMemoryPerMultiprocessor, device));
  FLASHINFER_CUDA_TRY(
      cudaDeviceGetAttribute(&info->max_threads_per_sm, cudaDevAttrMaxThreadsPerMultiProcessor, device));
  FLASHINFER_CUDA_TRY(cudaDeviceGetAttribute(&info->regs_per_sm, cudaDevAttrMaxRegistersPerMultiprocessor, device));
  return cudaSuccess;
}

// The DeviceInfo of `dev` (the current device when dev < 0), queried once per device and
// then served from a table: launchers call this on every launch.
inline cudaError_t current_device_info(DeviceInfo* info, int dev = -1) {
  constexpr int kMaxDevices = 64;
  static DeviceInfo table[kMaxDevices];
  static bool known[kMaxDevices] = {};
  if (dev < 0) FLASHINFER_CUDA_TRY(current_device(&dev));
  if (dev >= kMaxDevices) return query_device_info(dev, info);
  if (!known[dev]) {
    FLASHINFER_CUDA_TRY(query_device_info(dev, &table[dev]));
    known[dev] = true;  // benign race: every writer stores the same values
  }
  *info = table[dev];
  return cudaSuccess;
}

// Registers per thread of a kernel (asked once per kernel).
template <auto kKernel>
int kernel_regs() {
  static const int regs = [] {
    cudaFuncAttributes attr{};
    return cudaFuncGetAttributes(&attr, kKernel) == cudaSuccess ? attr.numRegs : 64;
  }();
  return regs;
}

// Raises a kernel's dynamic shared memory limit to at least `bytes` (once per size step).
// Also needed below 48 KiB: the default limit covers static + dynamic shared memory.
template <auto kKernel>
cudaError_t ensure_dynamic_smem(size_t bytes, int dev = -1) {
  if (bytes == 0) return cudaSuccess;
  constexpr int kMaxDevices = 64;
  static size_t granted[kMaxDevices] = {};
  if (dev < 0) FLASHINFER_CUDA_TRY(current_device(&dev));
  if (dev >= 0 && dev < kMaxDevices && granted[dev] >= bytes) return cudaSuccess;
  FLASHINFER_CUDA_TRY(cudaFuncSetAttribute(kKernel, cudaFuncAttributeMaxDynamicSharedMemorySize,
                                           static_cast<int>(bytes)));
  if (dev >= 0 && dev < kMaxDevices) granted[dev] = bytes;
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
