// Where a function may run, and small portable attributes. Pure C++17: g++ and nvcc both
// read it, so one header serves kernels and the CPU tests.
#pragma once

#include <cstdint>

#if defined(__CUDACC__)
#define FLASHINFER_HOST_DEVICE __host__ __device__ __forceinline__
#define FLASHINFER_DEVICE __device__ __forceinline__
#else
#define FLASHINFER_HOST_DEVICE inline
#define FLASHINFER_DEVICE inline
#endif

#if defined(__CUDACC__) || defined(__clang__) || defined(__GNUC__)
#define FLASHINFER_UNROLL _Pragma("unroll")
#else
#define FLASHINFER_UNROLL
#endif

// For __host__ __device__ loops: g++ rejects "#pragma unroll" in the host pass of such code,
// so unroll in the device pass only.
#if defined(__CUDA_ARCH__)
#define FLASHINFER_HD_UNROLL _Pragma("unroll")
#else
#define FLASHINFER_HD_UNROLL
#endif

// Dynamic shared memory is declared `FLASHINFER_EXTERN_SHARED uint4 smem[];`: the CPU kernel
// emulator (tests/cpp/emu) redefines it as a plain extern array, while it gives every static
// __shared__ variable one copy per block.
#ifndef FLASHINFER_EXTERN_SHARED
#define FLASHINFER_EXTERN_SHARED extern __shared__
#endif

namespace flashinfer {

// ceil(a / b) for positive integers, usable on host and device.
template <typename T>
FLASHINFER_HOST_DEVICE constexpr T ceil_div(T a, T b) {
  return (a + b - 1) / b;
}

template <typename T>
FLASHINFER_HOST_DEVICE constexpr T round_up(T a, T b) {
  return ceil_div(a, b) * b;
}

// *q = a / b, *r = a % b for a >= 0, b > 0: a shift and a mask when b is a power of two (page
// sizes and sub-group counts are, in practice), else a 32-bit division (~20 instructions in a
// kernel).
FLASHINFER_HOST_DEVICE void div_mod(int32_t a, int32_t b, int32_t* q, int32_t* r) {
  if ((b & (b - 1)) == 0) {
#if defined(__CUDA_ARCH__)
    const int shift = __ffs(b) - 1;
#else
    const int shift = __builtin_ctz(static_cast<unsigned>(b));
#endif
    *q = a >> shift;
    *r = a & (b - 1);
  } else {
    *q = a / b;
    *r = a - *q * b;
  }
}

}  // namespace flashinfer
