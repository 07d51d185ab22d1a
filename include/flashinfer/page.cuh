// Paged KV-cache append and get_batch_indices_positions: kernels and launchers. The index
// math (locate_checked, append_entry_position) and the Params live in page.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <type_traits>

#include "index_check.h"
#include "math.cuh"
#include "page.h"
#include "utils.cuh"
#include "vec_dtypes.cuh"

namespace flashinfer {
namespace paged_kv {

namespace detail {

// The unit one thread moves: a raw 16-byte vector (kE = 16 / sizeof(T)) or one element.
// Raw uint4 rather than Vec<T, kE>: Vec<uint8_t, 16> would live in 16 byte registers.
template <typename T, int kE>
using AppendUnit = std::conditional_t<kE == 1, T, uint4>;

// A read-once load. The 16-byte form keeps its place in program order (load128_ordered):
// after the index loads that head the lookup chain, before the lookup itself.
template <typename U>
FLASHINFER_DEVICE U load_once(const U* p) {
  if constexpr (sizeof(U) == 16) {
    return load128_ordered(p);
  } else {
    return *p;
  }
}

}  // namespace detail

// Thread = (token i, slot s), see AppendLaunch; kV = vecs_per_thread. Issue order: the
// token's batch index and position (and, for small launches, request i's indptr range), then
// all 2 kV K/V loads; the lookup's dependent loads (indptr[b] unless b == i, then the page id)
// overlap the K/V loads. A token whose (batch index, position) has no page in the table is
// skipped. Token-local vector indices are 32-bit (validate()).
// (A block-shared copy of indptr for small tables measured slower on the H200: 65536 tokens
// 78% vs 84% of the copy ceiling.)
template <typename T, typename IdType, int kE, int kV>
__global__ void __launch_bounds__(append_max_threads(kV))
    AppendPagedKVKernel(const AppendPagedKVParams<T, IdType> p, const AppendLaunch l) {
  using U = detail::AppendUnit<T, kE>;
  static_assert(sizeof(U) == kE * sizeof(T), "a unit is kE elements");
  const uint32_t slots = static_cast<uint32_t>(l.slots_per_token);
  const uint32_t vph = static_cast<uint32_t>(l.vecs_per_head), vpt = static_cast<uint32_t>(l.vecs_per_token);
  const int64_t idx = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  // 32-bit division where it fits (a 64-bit one is a ~60-instruction subroutine)
  const int64_t i = idx <= 0xffffffffLL ? int64_t{static_cast<uint32_t>(idx) / slots} : idx / l.slots_per_token;
  const uint32_t s = static_cast<uint32_t>(idx - i * l.slots_per_token);
  const bool live = i < p.nnz;
  pdl_wait();  // (launched with PDL: the previous kernel's writes are visible past this)
  int64_t b = 0, pos = 0;
  if (live) {
    b = static_cast<int64_t>(p.batch_indices[i]);
    pos = static_cast<int64_t>(p.positions[i]);
  }
  // A decode step appends token i to request i: read that request's page-table range now, beside
  // b, so the lookup that follows is one dependent load (the page id) instead of two. H200, one
  // token per request: 1 token 6.00 -> 5.66 us, 64 tokens 6.42 -> 5.98 (benchmarks/NOTES.md,
  // session 17). Small launches only (kV <= 2): at 8 vectors per thread the two registers spill.
  const PagedKV<T, IdType>& kv = p.kv;
  const bool guess = kV <= 2 && live && i < kv.batch_size;
  int64_t guess_begin = 0, guess_end = 0;
  if (guess) {
    guess_begin = static_cast<int64_t>(load_index_ordered(kv.indptr + i));
    guess_end = static_cast<int64_t>(load_index_ordered(kv.indptr + i + 1));
  }

  U kvec[kV], vvec[kV];
  uint32_t head[kV], feat[kV];
  const T* key = p.key + i * p.key_stride_n;
  const T* value = p.value + i * p.value_stride_n;
  FLASHINFER_UNROLL
  for (int m = 0; m < kV; ++m) {
    const uint32_t j = s + m * slots;  // < kV * slots <= vecs_per_token + kV: 32 bits (validate)
    head[m] = j / vph;
    feat[m] = (j - head[m] * vph) * kE;
    if (live && j < vpt) {
      kvec[m] = detail::load_once(reinterpret_cast<const U*>(key + head[m] * p.key_stride_h + feat[m]));
      vvec[m] = detail::load_once(reinterpret_cast<const U*>(value + head[m] * p.value_stride_h + feat[m]));
    }
  }
  if (!live) return;
  int64_t page = 0, entry = 0;
  const int32_t bad = guess && b == i
                          ? locate_in_range(kv, pos, guess_begin, guess_end, p.num_indices, p.max_num_pages, &page,
                                            &entry)
                          : locate_checked(kv, b, pos, p.num_indices, p.max_num_pages, &page, &entry);
  if (bad) {
    if (s == 0) record_index_error(p.err, bad, i);
    return;
  }
  const int64_t base = kv.offset(page, entry, 0);
  FLASHINFER_UNROLL
  for (int m = 0; m < kV; ++m) {
    if (s + m * slots >= vpt) continue;
    const int64_t off = base + head[m] * kv.stride_h + feat[m];
    // default caching: attention reads these next
    *reinterpret_cast<U*>(kv.k_data + off) = kvec[m];
    *reinterpret_cast<U*>(kv.v_data + off) = vvec[m];
  }
}

template <typename IdType, typename SeqT>
__global__ void BatchIndicesPositionsKernel(const BatchIndicesPositionsParams<IdType, SeqT> p) {
  const int64_t e = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  if (e < p.nnz) batch_index_position(p, e);
}

// Launches the append on `stream`. T: uint16_t (fp16/bf16) or uint8_t (fp8) storage.
template <typename T, typename IdType>
cudaError_t AppendPagedKV(const AppendPagedKVParams<T, IdType>& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.nnz == 0 || p.kv.num_heads == 0 || p.kv.head_dim == 0) return cudaSuccess;
  constexpr int kE = 16 / sizeof(T);
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  auto mult = [](int64_t s) { return s % kE == 0; };
  const bool aligned16 = aligned(p.key) && aligned(p.value) && aligned(p.kv.k_data) && aligned(p.kv.v_data) &&
                         mult(p.key_stride_n) && mult(p.key_stride_h) && mult(p.value_stride_n) &&
                         mult(p.value_stride_h) && mult(p.kv.stride_page) && mult(p.kv.stride_n) &&
                         mult(p.kv.stride_h);
  const AppendLaunch l = append_launch_config(p.nnz, p.kv.num_heads, p.kv.head_dim, kE, aligned16, append_tuning());
  if (l.blocks > (int64_t{1} << 31) - 1) return cudaErrorInvalidValue;  // validate() bounds every tuning
  const dim3 grid(static_cast<unsigned>(l.blocks)), block(l.threads);
  if (!l.vectorized) {
    return launch(AppendPagedKVKernel<T, IdType, 1, kAppendScalarVecsPerThread>, grid, block, 0, stream, p.pdl, p, l);
  }
  switch (l.vecs_per_thread) {
    case 1: return launch(AppendPagedKVKernel<T, IdType, kE, 1>, grid, block, 0, stream, p.pdl, p, l);
    case 2: return launch(AppendPagedKVKernel<T, IdType, kE, 2>, grid, block, 0, stream, p.pdl, p, l);
    case 4: return launch(AppendPagedKVKernel<T, IdType, kE, 4>, grid, block, 0, stream, p.pdl, p, l);
    case 8: return launch(AppendPagedKVKernel<T, IdType, kE, 8>, grid, block, 0, stream, p.pdl, p, l);
    default: return cudaErrorInvalidValue;
  }
}

template <typename IdType, typename SeqT>
cudaError_t BatchIndicesPositions(const BatchIndicesPositionsParams<IdType, SeqT>& p, cudaStream_t stream) {
  if (p.nnz < 0 || p.batch_size < 0) return cudaErrorInvalidValue;
  if (p.nnz == 0) return cudaSuccess;
  constexpr int kThreads = 256;
  const int64_t blocks = ceil_div<int64_t>(p.nnz, kThreads);
  if (blocks > (int64_t{1} << 31) - 1) return cudaErrorInvalidValue;
  return launch(BatchIndicesPositionsKernel<IdType, SeqT>, dim3(static_cast<unsigned>(blocks)), dim3(kThreads), 0,
                stream, false, p);
}

}  // namespace paged_kv
}  // namespace flashinfer
