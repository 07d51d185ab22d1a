// Named CTA barriers (bar.sync / bar.arrive with an id and a thread count): a subset of a CTA's
// warps meets without the rest, as __syncthreads (barrier 0, every thread) cannot. Ids 1-15;
// the count is a multiple of 32, the warps that take part.
#pragma once

#include "config.h"

namespace flashinfer {
namespace barrier {

// Waits until `threads` threads (this one's warp included) have reached barrier `id`.
FLASHINFER_DEVICE void sync(int id, int threads) {
#if defined(__CUDA_ARCH__)
  asm volatile("bar.sync %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// Counts this thread's warp in at barrier `id` without waiting (the barrier completes when
// `threads` threads have arrived or synced there).
FLASHINFER_DEVICE void arrive(int id, int threads) {
#if defined(__CUDA_ARCH__)
  asm volatile("bar.arrive %0, %1;\n" ::"r"(id), "r"(threads) : "memory");
#endif
}

// The calling warpgroup's register budget, raised (kInc) or lowered to kRegs per thread
// (setmaxnreg, sm_90a; a multiple of 8 in [24, 256]): a warp-specialized CTA gives its
// producer's registers to its consumers. Every warp of the warpgroup must call it.
template <int kRegs, bool kInc>
FLASHINFER_DEVICE void set_max_regs() {
#if defined(__CUDA_ARCH__) && defined(__CUDA_ARCH_FEAT_SM90_ALL)
  if constexpr (kInc) asm volatile("setmaxnreg.inc.sync.aligned.u32 %0;\n" ::"n"(kRegs));
  else asm volatile("setmaxnreg.dec.sync.aligned.u32 %0;\n" ::"n"(kRegs));
#endif
}

}  // namespace barrier
}  // namespace flashinfer
