// Device math: PDL grid-dependency control, warp and block reductions (and, through
// fast_math.h, the special-function unit's exp2 / log2 / reciprocal).
#pragma once

#include <cuda_runtime.h>

#include "config.h"
#include "fast_math.h"

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
