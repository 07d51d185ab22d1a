// Device math: PDL grid-dependency control, warp and block reductions.
#pragma once

#include <cuda_runtime.h>

#include "config.h"

namespace flashinfer {

// Wait until the preceding kernel in the stream has completed and flushed its writes
// (no-op when this kernel was not launched with PDL, or before sm_90).
FLASHINFER_DEVICE void pdl_wait() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.wait;" ::: "memory");
#endif
}

// Allow the next PDL kernel in the stream to start its prologue.
FLASHINFER_DEVICE void pdl_launch_dependents() {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("griddepcontrol.launch_dependents;" ::: "memory");
#endif
}

// Asks for the line holding p in L1 ahead of a load (a no-op off the GPU, e.g. under the CPU
// emulator).
FLASHINFER_DEVICE void prefetch_l1(const void* p) {
#if defined(__CUDA_ARCH__)
  asm volatile("prefetch.global.L1 [%0];" ::"l"(p));
#endif
}

// *p += v at GPU scope with release and acquire semantics (atom.add.acq_rel.gpu); returns the old
// value. Release is cumulative: writes of other threads of the CTA ordered before the call by a
// __syncthreads() are visible to whoever acquires *p after this add; acquire, with a
// __syncthreads() after the call, orders the CTA's later loads after the adds it observed.
// (Off the GPU, e.g. under the CPU emulator: fence, add, fence.)
FLASHINFER_DEVICE int atomic_add_acq_rel_gpu(int* p, int v) {
#if defined(__CUDA_ARCH__)
  int old;
  asm volatile("atom.add.acq_rel.gpu.global.s32 %0, [%1], %2;" : "=r"(old) : "l"(p), "r"(v) : "memory");
  return old;
#else
  __threadfence();
  const int old = atomicAdd(p, v);
  __threadfence();
  return old;
#endif
}

// Special-function-unit math for softmax weights and state merges, where the accurate
// library calls cost instructions on latency-bound paths (exp2f wraps MUFU.EX2 in a three-
// instruction range fix-up, log2f is a polynomial of ~30, 1.f / x an IEEE division with a slow
// path). Off the GPU (the CPU emulator): the library functions.
// 2^x (ex2.approx.ftz: 2^-inf = 0, subnormal results flushed, ~2 ulp).
FLASHINFER_DEVICE float fast_exp2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return exp2f(x);
#endif
}
// log2(x) for x > 0 (lg2.approx.ftz: absolute error ~2^-22 near 1, ~2 ulp elsewhere).
FLASHINFER_DEVICE float fast_log2(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("lg2.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return log2f(x);
#endif
}
// 1 / x (rcp.approx.ftz: ~1 ulp).
FLASHINFER_DEVICE float fast_rcp(float x) {
#if defined(__CUDA_ARCH__)
  float y;
  asm("rcp.approx.ftz.f32 %0, %1;" : "=f"(y) : "f"(x));
  return y;
#else
  return 1.f / x;
#endif
}

namespace warp {

// All 32 lanes must call; every lane receives the sum.
FLASHINFER_DEVICE float reduce_sum(float v) {
  FLASHINFER_UNROLL
  for (int offset = 16; offset > 0; offset >>= 1) v += __shfl_xor_sync(0xffffffffu, v, offset);
  return v;
}

}  // namespace warp

namespace block {

// All threads of the block must call; every thread receives the sum. smem: 32 floats.
// Ends with a barrier so the caller may reuse smem immediately.
FLASHINFER_DEVICE float reduce_sum(float v, float* smem) {
  v = warp::reduce_sum(v);
  const int lane = threadIdx.x & 31, w = threadIdx.x >> 5;
  if (lane == 0) smem[w] = v;
  __syncthreads();
  v = lane < static_cast<int>(blockDim.x >> 5) ? smem[lane] : 0.f;
  v = warp::reduce_sum(v);
  __syncthreads();
  return v;
}

}  // namespace block
}  // namespace flashinfer
