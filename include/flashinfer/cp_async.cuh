// Asynchronous 16-byte global -> shared copies (cp.async, sm_80+) used as a deep per-thread
// prefetch queue by the streaming kernels: a thread only ever reads back the slots it
// copied itself, so completion needs cp.async.wait_group and no block barrier.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "config.h"

namespace flashinfer {
namespace cp_async {

FLASHINFER_DEVICE uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// Copies 16 bytes (both addresses 16-byte aligned); .cg bypasses L1: the data is used once.
FLASHINFER_DEVICE void copy16(void* smem, const void* gmem) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
}

// Copies 16 bytes when `valid`, else writes 16 zero bytes (nothing is read from gmem).
FLASHINFER_DEVICE void copy16_or_zero(void* smem, const void* gmem, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
               "r"(valid ? 16 : 0)
               : "memory");
}

// kBytes (16 or 8) from gmem, or zeros when !valid. 8 bytes (the fp8 KV cache's 8-feature
// vectors) take .ca: .cg copies 16 bytes only.
template <int kBytes>
FLASHINFER_DEVICE void copy_or_zero(void* smem, const void* gmem, bool valid) {
  static_assert(kBytes == 16 || kBytes == 8, "16- or 8-byte copies");
  if constexpr (kBytes == 16) {
    copy16_or_zero(smem, gmem, valid);
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8, %2;\n" ::"r"(smem_addr(smem)), "l"(gmem),
                 "r"(valid ? 8 : 0)
                 : "memory");
  }
}
// kBytes 16, 8 or 4 (4: e.g. an LSE riding along with 16-byte copies of values; .ca, the
// only form below 16 bytes).
template <int kBytes>
FLASHINFER_DEVICE void copy(void* smem, const void* gmem) {
  static_assert(kBytes == 16 || kBytes == 8 || kBytes == 4, "16-, 8- or 4-byte copies");
  if constexpr (kBytes == 16) {
    copy16(smem, gmem);
  } else if constexpr (kBytes == 8) {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 8;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
  } else {
    asm volatile("cp.async.ca.shared.global [%0], [%1], 4;\n" ::"r"(smem_addr(smem)), "l"(gmem) : "memory");
  }
}

FLASHINFER_DEVICE void commit() { asm volatile("cp.async.commit_group;\n" ::: "memory"); }

// Arrives on the mbarrier `bar` once every cp.async this thread has issued so far has landed
// (cp.async.mbarrier.arrive.noinc, sm_80+: the arrival is one of the count the barrier was
// initialized with). No commit or wait is needed.
FLASHINFER_DEVICE void arrive_noinc(uint64_t* bar) {
  asm volatile("cp.async.mbarrier.arrive.noinc.shared::cta.b64 [%0];\n" ::"r"(smem_addr(bar)) : "memory");
}

// Waits until at most n of this thread's committed groups are still in flight (n <= 15).
FLASHINFER_DEVICE void wait(int n) {
  switch (n) {
    case 0: asm volatile("cp.async.wait_group 0;\n" ::: "memory"); break;
    case 1: asm volatile("cp.async.wait_group 1;\n" ::: "memory"); break;
    case 2: asm volatile("cp.async.wait_group 2;\n" ::: "memory"); break;
    case 3: asm volatile("cp.async.wait_group 3;\n" ::: "memory"); break;
    case 4: asm volatile("cp.async.wait_group 4;\n" ::: "memory"); break;
    case 5: asm volatile("cp.async.wait_group 5;\n" ::: "memory"); break;
    case 6: asm volatile("cp.async.wait_group 6;\n" ::: "memory"); break;
    case 7: asm volatile("cp.async.wait_group 7;\n" ::: "memory"); break;
    case 8: asm volatile("cp.async.wait_group 8;\n" ::: "memory"); break;
    case 9: asm volatile("cp.async.wait_group 9;\n" ::: "memory"); break;
    case 10: asm volatile("cp.async.wait_group 10;\n" ::: "memory"); break;
    case 11: asm volatile("cp.async.wait_group 11;\n" ::: "memory"); break;
    case 12: asm volatile("cp.async.wait_group 12;\n" ::: "memory"); break;
    case 13: asm volatile("cp.async.wait_group 13;\n" ::: "memory"); break;
    case 14: asm volatile("cp.async.wait_group 14;\n" ::: "memory"); break;
    default: asm volatile("cp.async.wait_group 15;\n" ::: "memory"); break;
  }
}

}  // namespace cp_async
}  // namespace flashinfer
