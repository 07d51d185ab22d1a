// Block-wide collectives of the sampling kernels: multi-value sums, min/max, exclusive scans.
// Every result is bitwise identical in all threads (the butterfly pairs commute and every
// thread folds the warp totals in the same order), so control flow that depends on it stays
// uniform and the kernels are deterministic. Each collective ends with a barrier.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "config.h"
#include "sampling_params.h"

namespace flashinfer {
namespace sampling {
namespace blk {

// Dynamic shared memory of every sampling kernel, laid out by ScanLayout: this scratch at 0,
// then the row cache, the mass tables and the candidate list.
FLASHINFER_EXTERN_SHARED __align__(16) unsigned char sampling_smem[];

// Reduction scratch, plus a slot to broadcast one picked element.
struct Scratch {
  float f[32 * kTableCols];
  int i[32 * kTableCols];
  float value;
};
static_assert(sizeof(Scratch) <= kScratchBytes, "kScratchBytes must hold blk::Scratch");

FLASHINFER_DEVICE Scratch& scratch() { return *reinterpret_cast<Scratch*>(sampling_smem); }

FLASHINFER_DEVICE int lane() { return static_cast<int>(threadIdx.x & 31u); }
FLASHINFER_DEVICE int warp() { return static_cast<int>(threadIdx.x >> 5); }
FLASHINFER_DEVICE int warps() { return static_cast<int>(blockDim.x >> 5); }

template <typename V>
FLASHINFER_DEVICE V warp_sum(V v) {
  FLASHINFER_UNROLL
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  return v;
}

// In place: every thread's v[n] becomes the block sum of v[n]. smem: 32 * N values.
template <int N, typename V>
FLASHINFER_DEVICE void sum(V (&v)[N], V* smem) {
  FLASHINFER_UNROLL
  for (int n = 0; n < N; ++n) v[n] = warp_sum(v[n]);
  if (lane() == 0) {
    FLASHINFER_UNROLL
    for (int n = 0; n < N; ++n) smem[warp() * N + n] = v[n];
  }
  __syncthreads();
  FLASHINFER_UNROLL
  for (int n = 0; n < N; ++n) v[n] = warp_sum(lane() < warps() ? smem[lane() * N + n] : V(0));
  __syncthreads();
}

template <typename V, class Op>
FLASHINFER_DEVICE V reduce(V v, V* smem, Op op) {
  FLASHINFER_UNROLL
  for (int o = 16; o > 0; o >>= 1) v = op(v, __shfl_xor_sync(0xffffffffu, v, o));
  if (lane() == 0) smem[warp()] = v;
  __syncthreads();
  V w = smem[0];
  for (int j = 1; j < warps(); ++j) w = op(w, smem[j]);
  __syncthreads();
  return w;
}

FLASHINFER_DEVICE float max(float v) {
  return reduce(v, scratch().f, [](float a, float b) { return fmaxf(a, b); });
}
FLASHINFER_DEVICE float min(float v) {
  return reduce(v, scratch().f, [](float a, float b) { return fminf(a, b); });
}
FLASHINFER_DEVICE int max(int v) {
  return reduce(v, scratch().i, [](int a, int b) { return a > b ? a : b; });
}
FLASHINFER_DEVICE int min(int v) {
  return reduce(v, scratch().i, [](int a, int b) { return a < b ? a : b; });
}

// The sum of v over the threads before this one (thread order); *total: over all threads.
template <typename V>
FLASHINFER_DEVICE V exclusive_scan(V v, V* smem, V* total) {
  V incl = v;
  FLASHINFER_UNROLL
  for (int o = 1; o < 32; o <<= 1) {
    const V y = __shfl_up_sync(0xffffffffu, incl, o);
    if (lane() >= o) incl += y;
  }
  V excl = __shfl_up_sync(0xffffffffu, incl, 1);
  if (lane() == 0) excl = V(0);
  if (lane() == 31) smem[warp()] = incl;
  __syncthreads();
  V base = V(0);
  for (int j = 0; j < warp(); ++j) base += smem[j];
  V tot = base;
  for (int j = warp(); j < warps(); ++j) tot += smem[j];
  __syncthreads();
  if (total) *total = tot;
  return base + excl;
}

}  // namespace blk
}  // namespace sampling
}  // namespace flashinfer
