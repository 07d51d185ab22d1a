// Hopper bulk copies (TMA engine, sm_90+): one thread moves a contiguous span global ->
// shared and an mbarrier counts the bytes in; the other threads wait on the barrier's phase.
// Used by the streaming kernels to keep many rows in flight without per-thread requests.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "config.h"
#include "cp_async.cuh"

namespace flashinfer {
namespace bulk {

#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
#define FLASHINFER_HAS_BULK_COPY 1
#endif

FLASHINFER_DEVICE void mbarrier_init(uint64_t* bar, int count) {
#ifdef FLASHINFER_HAS_BULK_COPY
  asm volatile("mbarrier.init.shared::cta.b64 [%0], %1;\n" ::"r"(cp_async::smem_addr(bar)), "r"(count) : "memory");
#endif
}

// Makes mbarrier inits visible to the async proxy (call once after init, before use).
FLASHINFER_DEVICE void fence_init() {
#ifdef FLASHINFER_HAS_BULK_COPY
  asm volatile("fence.mbarrier_init.release.cluster;\n" ::: "memory");
#endif
}

// Orders this thread's earlier shared-memory accesses before later async-proxy writes.
FLASHINFER_DEVICE void fence_proxy_async() {
#ifdef FLASHINFER_HAS_BULK_COPY
  asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory");
#endif
}

FLASHINFER_DEVICE void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
#ifdef FLASHINFER_HAS_BULK_COPY
  asm volatile("mbarrier.arrive.expect_tx.shared::cta.b64 _, [%0], %1;\n" ::"r"(cp_async::smem_addr(bar)), "r"(bytes)
               : "memory");
#endif
}

// One arrival (release semantics: this thread's earlier writes are visible to whoever sees the
// phase complete).
FLASHINFER_DEVICE void arrive(uint64_t* bar) {
#ifdef FLASHINFER_HAS_BULK_COPY
  asm volatile("mbarrier.arrive.shared::cta.b64 _, [%0];\n" ::"r"(cp_async::smem_addr(bar)) : "memory");
#endif
}

// bytes: a multiple of 16; both addresses 16-byte aligned.
FLASHINFER_DEVICE void copy(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
#ifdef FLASHINFER_HAS_BULK_COPY
  asm volatile(
      "cp.async.bulk.shared::cluster.global.mbarrier::complete_tx::bytes [%0], [%1], %2, [%3];\n" ::"r"(
          cp_async::smem_addr(smem)),
      "l"(gmem), "r"(bytes), "r"(cp_async::smem_addr(bar))
      : "memory");
#endif
}

FLASHINFER_DEVICE void wait_parity(uint64_t* bar, uint32_t parity) {
#ifdef FLASHINFER_HAS_BULK_COPY
  asm volatile(
      "{\n"
      ".reg .pred done;\n"
      "WAIT_%=:\n"
      "mbarrier.try_wait.parity.shared::cta.b64 done, [%0], %1;\n"
      "@!done bra WAIT_%=;\n"
      "}\n" ::"r"(cp_async::smem_addr(bar)),
      "r"(parity)
      : "memory");
#endif
}

}  // namespace bulk
}  // namespace flashinfer
