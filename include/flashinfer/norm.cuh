// RMSNorm, fused add + RMSNorm (plain and Gemma) and LayerNorm kernels and their launcher.
// Parameters, validation and launch arithmetic live in norm.h.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "dispatch.h"
#include "math.cuh"
#include "norm.h"
#include "utils.cuh"
#include "vec_dtypes.cuh"

namespace flashinfer {
namespace norm {
namespace detail {

// Sum over the threads that own one row: a warp (rows_per_block > 1) or the whole block.
FLASHINFER_DEVICE float row_sum(float v, bool warp_per_row, float* smem) {
  return warp_per_row ? warp::reduce_sum(v) : block::reduce_sum(v, smem);
}

// Loads kN weight (or bias) values as fp32, whatever their storage type.
template <int kN, typename WT>
FLASHINFER_DEVICE void load_weight_f32(const WT* p, float* f) {
  constexpr int kW = 16 / sizeof(WT) < kN ? 16 / sizeof(WT) : kN;
  FLASHINFER_UNROLL
  for (int i = 0; i < kN; i += kW) {
    Vec<WT, kW> w;
    w.load(p + i);
    w.to_float(f + i);
  }
}

}  // namespace detail

// Vectorised path: the row lives in registers (as loaded, 16-bit) between the reduction
// and the write, so every byte is read once and written once. Each thread owns kVecs
// 16-byte vectors strided by threads_per_row * kVecElems elements; all its loads are
// issued before the first use.
template <typename T, typename WT, int kVecs, NormKind kKind>
__global__ void NormKernel(const NormParams<T, WT> p, const int threads_per_row) {
  constexpr int kE = kVecElems<T>;
  constexpr bool kFused = kKind == NormKind::kFusedAddRMS;
  __shared__ float smem[32];
  const bool warp_per_row = threads_per_row == 32 && blockDim.x > 32;
  const int rows_per_block = blockDim.x / threads_per_row;
  const int t = threadIdx.x % threads_per_row;
  const int64_t nvec = p.hidden / kE;
  const float inv_h = 1.f / static_cast<float>(p.hidden);

  pdl_wait();
  for (int64_t base = int64_t{blockIdx.x} * rows_per_block; base < p.rows;
       base += int64_t{gridDim.x} * rows_per_block) {
    const int64_t row = base + threadIdx.x / threads_per_row;
    const bool row_ok = row < p.rows;
    const T* in = p.input + (row_ok ? p.in_rows.offset(row) : 0);
    T* res = kFused ? p.residual + (row_ok ? p.res_rows.offset(row) : 0) : nullptr;
    Vec<T, kE> xv[kVecs], rv[kFused ? kVecs : 1];
    FLASHINFER_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      const int64_t j = int64_t{i} * threads_per_row + t;
      if (row_ok && j < nvec) {
        xv[i].load_stream(in + j * kE);
        if constexpr (kFused) rv[i].load_stream(res + j * kE);
      }
    }
    // x (or x + residual) in fp32, recomputed from the registers wherever it is needed.
    auto value = [&](int i, float* f) {
      xv[i].to_float(f);
      if constexpr (kFused) {
        float g[kE];
        rv[i].to_float(g);
        FLASHINFER_UNROLL
        for (int e = 0; e < kE; ++e) f[e] += g[e];
      }
    };
    float acc = 0.f;
    FLASHINFER_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      if (!(row_ok && int64_t{i} * threads_per_row + t < nvec)) continue;
      float f[kE];
      value(i, f);
      FLASHINFER_UNROLL
      for (int e = 0; e < kE; ++e) acc += kKind == NormKind::kLayer ? f[e] : f[e] * f[e];
    }
    float mean = 0.f;
    float ms = detail::row_sum(acc, warp_per_row, smem) * inv_h;
    if constexpr (kKind == NormKind::kLayer) {
      // Second reduction over the registers: sum (x - mean)^2 is exact where
      // E[x^2] - mean^2 would cancel.
      mean = ms;
      acc = 0.f;
      FLASHINFER_UNROLL
      for (int i = 0; i < kVecs; ++i) {
        if (!(row_ok && int64_t{i} * threads_per_row + t < nvec)) continue;
        float f[kE];
        value(i, f);
        FLASHINFER_UNROLL
        for (int e = 0; e < kE; ++e) acc += (f[e] - mean) * (f[e] - mean);
      }
      ms = detail::row_sum(acc, warp_per_row, smem) * inv_h;
    }
    const float rstd = rsqrtf(ms + p.eps);
    if (!row_ok) continue;
    T* out = p.out + p.out_rows.offset(row);
    FLASHINFER_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      const int64_t j = int64_t{i} * threads_per_row + t;
      if (j >= nvec) continue;
      float f[kE], w[kE], y[kE];
      value(i, f);
      detail::load_weight_f32<kE>(p.weight + j * kE, w);
      if constexpr (kKind == NormKind::kLayer) {
        float b[kE];
        detail::load_weight_f32<kE>(p.bias + j * kE, b);
        FLASHINFER_UNROLL
        for (int e = 0; e < kE; ++e) y[e] = (f[e] - mean) * rstd * w[e] + b[e];
      } else {
        FLASHINFER_UNROLL
        for (int e = 0; e < kE; ++e) y[e] = f[e] * rstd * (w[e] + p.weight_offset);
      }
      if constexpr (kFused) {
        Vec<T, kE> r;
        r.from_float(f);
        r.store_stream(res + j * kE);
      }
      Vec<T, kE> o;
      o.from_float(y);
      o.store_stream(out + j * kE);
    }
  }
  pdl_launch_dependents();
}

// Scalar path for any hidden size or alignment: one block per row, passes over global
// memory (the re-reads of a row mostly hit L1/L2). For kFusedAddRMS the residual is only
// overwritten in the last pass, after every thread has read its own elements.
template <typename T, typename WT, NormKind kKind>
__global__ void NormScalarKernel(const NormParams<T, WT> p) {
  __shared__ float smem[32];
  const float inv_h = 1.f / static_cast<float>(p.hidden);
  pdl_wait();
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* in = p.input + p.in_rows.offset(row);
    T* res = kKind == NormKind::kFusedAddRMS ? p.residual + p.res_rows.offset(row) : nullptr;
    auto value = [&](int64_t j) {
      float v = to_float(in[j]);
      if constexpr (kKind == NormKind::kFusedAddRMS) v += to_float(res[j]);
      return v;
    };
    float acc = 0.f;
    for (int64_t j = threadIdx.x; j < p.hidden; j += blockDim.x) {
      const float v = value(j);
      acc += kKind == NormKind::kLayer ? v : v * v;
    }
    float mean = 0.f;
    float ms = block::reduce_sum(acc, smem) * inv_h;
    if constexpr (kKind == NormKind::kLayer) {
      mean = ms;
      acc = 0.f;
      for (int64_t j = threadIdx.x; j < p.hidden; j += blockDim.x) {
        const float d = value(j) - mean;
        acc += d * d;
      }
      ms = block::reduce_sum(acc, smem) * inv_h;
    }
    const float rstd = rsqrtf(ms + p.eps);
    T* out = p.out + p.out_rows.offset(row);
    for (int64_t j = threadIdx.x; j < p.hidden; j += blockDim.x) {
      const float v = value(j);
      const float w = to_float(p.weight[j]);
      float y;
      if constexpr (kKind == NormKind::kLayer) {
        y = (v - mean) * rstd * w + to_float(p.bias[j]);
      } else {
        y = v * rstd * (w + p.weight_offset);
      }
      if constexpr (kKind == NormKind::kFusedAddRMS) res[j] = from_float<T>(v);
      out[j] = from_float<T>(y);
    }
  }
  pdl_launch_dependents();
}

// The grid loops over rows, so the block count is capped well under gridDim.x's limit.
constexpr int64_t kMaxBlocks = int64_t{1} << 30;

template <NormKind kKind, typename T, typename WT>
cudaError_t NormDispatched(const NormParams<T, WT>& p, const NormLaunch& l, cudaStream_t stream) {
  const dim3 grid(static_cast<unsigned>(l.blocks < kMaxBlocks ? l.blocks : kMaxBlocks));
  const dim3 block(l.threads);
  if (!l.vectorized) {
    return launch(NormScalarKernel<T, WT, kKind>, grid, block, 0, stream, p.pdl, p);
  }
  cudaError_t err = cudaErrorInvalidValue;
  with_int<1, 2, 4, 8>(l.vecs_per_thread, [&](auto v) {
    err = launch(NormKernel<T, WT, decltype(v)::value, kKind>, grid, block, 0, stream, p.pdl, p,
                 l.threads_per_row);
    return Status::kSuccess;
  });
  return err;
}

// Launches `kind` on `stream`. Rows with a stride are read in place (see RowLayout).
template <typename T, typename WT>
cudaError_t Norm(const NormParams<T, WT>& p, NormKind kind, cudaStream_t stream) {
  if (validate(p, kind) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  constexpr int kE = kVecElems<T>;
  bool aligned16 = aligned(p.input) && aligned(p.out) && aligned(p.weight) &&
                   p.in_rows.strides_multiple_of(kE) && p.out_rows.strides_multiple_of(kE);
  if (kind == NormKind::kFusedAddRMS)
    aligned16 = aligned16 && aligned(p.residual) && p.res_rows.strides_multiple_of(kE);
  if (kind == NormKind::kLayer) aligned16 = aligned16 && aligned(p.bias);
  const NormLaunch l = norm_launch_config(p.rows, p.hidden, kE, aligned16, kind);
  switch (kind) {
    case NormKind::kRMS: return NormDispatched<NormKind::kRMS>(p, l, stream);
    case NormKind::kFusedAddRMS: return NormDispatched<NormKind::kFusedAddRMS>(p, l, stream);
    case NormKind::kLayer: return NormDispatched<NormKind::kLayer>(p, l, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace norm
}  // namespace flashinfer
