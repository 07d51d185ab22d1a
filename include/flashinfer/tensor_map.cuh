// Hopper tensor-map copies (TMA, sm_90+): one instruction moves a box of a multi-dimensional
// global tensor into shared memory, optionally 128-byte swizzled, and an mbarrier
// (bulk_copy.cuh) counts its bytes in. The host side encodes the map with the driver's
// cuTensorMapEncodeTiled, reached through the runtime (nothing links libcuda).
#pragma once

#include <cuda.h>
#include <cuda_runtime.h>
#include <cudaTypedefs.h>

#include <cstdint>

#include "config.h"
#include "cp_async.cuh"

namespace flashinfer {
namespace tma {

// Box at coordinates (c0, c1, c2, c3) (innermost first) of the 4-D tensor `map` -> `smem`;
// the copy completes bytes on `bar`. `map` must live in kernel parameters (__grid_constant__),
// constant or global memory; with a 128-byte swizzle `smem` is 1024-byte aligned.
FLASHINFER_DEVICE void copy_4d(void* smem, const CUtensorMap* map, int c0, int c1, int c2, int c3, uint64_t* bar) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes [%0], [%1, {%2, %3, %4, %5}], "
      "[%6];\n" ::"r"(cp_async::smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(cp_async::smem_addr(bar))
      : "memory");
#endif
}

// Starts fetching the descriptor `map` (kernel parameter or global memory) so that the first
// copy through it does not wait for it.
FLASHINFER_DEVICE void prefetch_map(const CUtensorMap* map) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile("prefetch.tensormap [%0];\n" ::"l"(reinterpret_cast<uint64_t>(map)) : "memory");
#endif
}

// An L2 eviction policy for every line a copy touches: evict-first (streamed data read once:
// its lines are replaced before anything else, so it does not push other data, dirty lines
// included, out of L2).
FLASHINFER_DEVICE uint64_t l2_evict_first_policy() {
  uint64_t policy = 0;
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 800)
  asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;\n" : "=l"(policy));
#endif
  return policy;
}

// copy_4d with an L2 cache policy (l2_evict_first_policy()).
FLASHINFER_DEVICE void copy_4d_hint(void* smem, const CUtensorMap* map, int c0, int c1, int c2, int c3, uint64_t* bar,
                                    uint64_t policy) {
#if defined(__CUDA_ARCH__) && (__CUDA_ARCH__ >= 900)
  asm volatile(
      "cp.async.bulk.tensor.4d.shared::cluster.global.tile.mbarrier::complete_tx::bytes.L2::cache_hint [%0], [%1, "
      "{%2, %3, %4, %5}], [%6], %7;\n" ::"r"(cp_async::smem_addr(smem)),
      "l"(reinterpret_cast<uint64_t>(map)), "r"(c0), "r"(c1), "r"(c2), "r"(c3), "r"(cp_async::smem_addr(bar)),
      "l"(policy)
      : "memory");
#endif
}

// Byte offset of 16-byte chunk `chunk` (< 8) of row `row` in a tile of 128-byte rows written
// with CU_TENSOR_MAP_SWIZZLE_128B: the chunk index is XORed with row % 8.
FLASHINFER_HOST_DEVICE constexpr uint32_t swizzle128(int row, int chunk) {
  return static_cast<uint32_t>(row * 128 + ((chunk ^ (row & 7)) << 4));
}

// A 4-D tiled map of elem_bytes-byte elements (1 or 2): dims[0] contiguous, byte strides of dims
// 1..3, box extents `box`, 128-byte swizzle, L2 promotion `promotion` (bytes L2 fetches per miss).
// Fails (cudaErrorNotSupported / cudaErrorInvalidValue) where the driver has no tensor maps
// or rejects the geometry; callers then copy otherwise.
inline cudaError_t encode_4d(CUtensorMap* map, int elem_bytes, const void* base, const uint64_t dims[4],
                             const uint64_t strides[3], const uint32_t box[4], CUtensorMapL2promotion promotion) {
  static const PFN_cuTensorMapEncodeTiled_v12000 encode = [] {
    void* fn = nullptr;
    cudaDriverEntryPointQueryResult q;
    if (cudaGetDriverEntryPointByVersion("cuTensorMapEncodeTiled", &fn, 12000, cudaEnableDefault, &q) !=
            cudaSuccess ||
        q != cudaDriverEntryPointSuccess)
      fn = nullptr;
    return reinterpret_cast<PFN_cuTensorMapEncodeTiled_v12000>(fn);
  }();
  if (!encode) return cudaErrorNotSupported;
  cuuint64_t d[4], s[3];
  cuuint32_t b[4], e[4] = {1, 1, 1, 1};
  for (int i = 0; i < 4; ++i) d[i] = dims[i], b[i] = box[i];
  for (int i = 0; i < 3; ++i) s[i] = strides[i];
  if (elem_bytes != 1 && elem_bytes != 2) return cudaErrorInvalidValue;
  const CUtensorMapDataType type = elem_bytes == 1 ? CU_TENSOR_MAP_DATA_TYPE_UINT8 : CU_TENSOR_MAP_DATA_TYPE_UINT16;
  const CUresult r = encode(map, type, 4, const_cast<void*>(base), d, s, b, e, CU_TENSOR_MAP_INTERLEAVE_NONE,
                            CU_TENSOR_MAP_SWIZZLE_128B, promotion, CU_TENSOR_MAP_FLOAT_OOB_FILL_NONE);
  return r == CUDA_SUCCESS ? cudaSuccess : cudaErrorInvalidValue;
}

}  // namespace tma
}  // namespace flashinfer
