// Float math by the GPU's special-function unit (MUFU) for softmax weights and merges of
// attention states, where the accurate library calls cost instructions on latency-bound paths:
// exp2f wraps MUFU.EX2 in a three-instruction range fix-up, log2f is a polynomial of ~30
// instructions, and a / b an IEEE division with a slow path. On the host (ctest, the CPU
// emulator) the standard library's functions. Pure C++17 with inline PTX on the device.
#pragma once

#include <cmath>

#include "config.h"

namespace flashinfer {

// 2^x (ex2.approx.ftz: 2^-inf = 0, subnormal results flushed, ~2 ulp).
FLASHINFER_HOST_DEVICE float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::exp2(x);
#endif
}

// log2(x) for x > 0 (lg2.approx.ftz: absolute error ~2^-22 near 1, ~2 ulp elsewhere).
FLASHINFER_HOST_DEVICE float fast_log2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return std::log2(x);
#endif
}

// 1 / x (rcp.approx.ftz: ~1 ulp).
FLASHINFER_HOST_DEVICE float fast_rcp(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return 1.f / x;
#endif
}

}  // namespace flashinfer
