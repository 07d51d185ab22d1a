// RoPE kernels (pos_ids / indptr positions; computed frequencies or a cos/sin cache) and
// their launcher. Frequencies, parameters and launch arithmetic live in pos_enc.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "index_check.h"
#include "pos_enc.h"
#include "utils.cuh"
#include "vec_dtypes.cuh"

namespace flashinfer {
namespace rope {
namespace detail {

constexpr int kHeadChunk = static_cast<int>(kRopeHeadChunk);

// Position of token t. The indptr form finds t's segment by binary search (the last b with
// indptr[b] <= t, so empty segments are skipped) and checks that it really holds t.
template <typename T, typename IdType>
FLASHINFER_DEVICE bool token_position(const RopeParams<T, IdType>& p, int64_t t, int64_t* pos) {
  if (p.pos_ids) {
    *pos = static_cast<int64_t>(p.pos_ids[t]);
    return true;
  }
  int64_t lo = 0, hi = p.batch_size;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (static_cast<int64_t>(p.indptr[mid]) <= t) lo = mid; else hi = mid;
  }
  const int64_t start = p.batch_size > 0 ? static_cast<int64_t>(p.indptr[lo]) : 1;
  if (p.batch_size == 0 || start > t || static_cast<int64_t>(p.indptr[lo + 1]) <= t) {
    record_index_error(p.err, kTokenNotInIndptr, t);
    return false;
  }
  *pos = static_cast<int64_t>(p.offsets[lo]) + (t - start);
  return true;
}

// Fills the block's inv_freq table (computed-frequency form); every thread of the block calls.
template <typename T, typename IdType>
FLASHINFER_DEVICE void fill_inv_freq(const RopeParams<T, IdType>& p, float* inv_freq) {
  const int64_t half = p.rotary_dim / 2;
  for (int64_t d = threadIdx.x; d < half; d += blockDim.x) inv_freq[d] = rope_inv_freq(p.freq, d, p.rotary_dim);
  __syncthreads();
}

// (x, y) -> (x cos - y sin, y cos + x sin)
FLASHINFER_DEVICE void rotate(float& x, float& y, float c, float s) {
  const float x0 = x;
  x = x0 * c - y * s;
  y = y * c + x0 * s;
}

}  // namespace detail

// Vectorised path (16-byte vectors of kE elements). Thread = (token t, head group g, unit u);
// see RopeLaunch. A rotary unit owns features [u*kE, +kE) and [half + u*kE, +kE): for NeoX
// they are each other's pair partners; for interleave each vector holds whole pairs. Its
// kE (cos, sin) values are computed once and reused for every head of the group.
// 64 registers (4 blocks of 256 per SM) keep 8 vectors in flight per thread without spills;
// unbounded, the compiler converts all heads of a chunk at once and takes 122.
template <typename T, typename IdType, int kE>
__global__ void __launch_bounds__(kRopeThreads, 4) RopeKernel(const RopeParams<T, IdType> p, const RopeLaunch l) {
  static_assert(kE % 2 == 0, "interleaved pairs must not straddle vectors");
  extern __shared__ float inv_freq[];  // [rotary_dim / 2], computed-frequency form only
  const int64_t half = p.rotary_dim / 2;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t u = i % l.units;
  const int64_t r = i / l.units;
  const int64_t g = r % l.head_groups;
  const int64_t t = r / l.head_groups;
  int64_t pos = 0;
  bool ok = t < p.nnz && detail::token_position(p, t, &pos);
  if (!p.cos_sin_cache) detail::fill_inv_freq(p, inv_freq);  // block-uniform branch
  if (!ok) return;

  const bool rot = u < l.rot_units;
  float cs[kE], sn[kE];
  if (rot) {
    const float* row = nullptr;
    if (p.cos_sin_cache) {
      if (pos < 0 || pos >= p.max_pos) {
        record_index_error(p.err, kPositionOutOfRange, t);
        return;
      }
      row = p.cos_sin_cache + pos * p.cache_stride;
    }
    FLASHINFER_UNROLL
    for (int e = 0; e < kE; ++e) {
      // frequency index of (cos, sin) slot e
      const int64_t d = !p.interleave ? u * kE + e
                        : e < kE / 2  ? u * (kE / 2) + e
                                      : (half + u * kE) / 2 + (e - kE / 2);
      if (row) {
        cs[e] = row[d];
        sn[e] = row[half + d];
      } else {
        sincosf(rope_angle(pos, inv_freq[d]), &sn[e], &cs[e]);
      }
    }
  }

  // This unit's two vectors (a copy unit at the odd end of the pass-through has one).
  int64_t off_a, off_b;
  bool two = true;
  if (rot) {
    off_a = u * kE;
    off_b = half + u * kE;
  } else {
    off_a = p.rotary_dim + (u - l.rot_units) * 2 * kE;
    off_b = off_a + kE;
    two = off_b < p.head_dim;
  }

  const int64_t nh = p.num_q_heads + p.num_k_heads;
  const int64_t h_begin = g * l.heads_per_group;
  const int64_t h_end = h_begin + l.heads_per_group < nh ? h_begin + l.heads_per_group : nh;
  const T* q_in = p.q + t * p.q_stride_n;
  const T* k_in = p.k + t * p.k_stride_n;
  T* q_out = p.q_out + t * p.q_out_stride_n;
  T* k_out = p.k_out + t * p.k_out_stride_n;
  for (int64_t h0 = h_begin; h0 < h_end; h0 += detail::kHeadChunk) {
    Vec<T, kE> a[detail::kHeadChunk], b[detail::kHeadChunk];
    FLASHINFER_UNROLL
    for (int j = 0; j < detail::kHeadChunk; ++j) {
      const int64_t h = h0 + j;
      if (h >= h_end) continue;
      const T* in = h < p.num_q_heads ? q_in + h * p.q_stride_h : k_in + (h - p.num_q_heads) * p.k_stride_h;
      a[j].load_stream(in + off_a);
      if (two) b[j].load_stream(in + off_b);
    }
    FLASHINFER_UNROLL
    for (int j = 0; j < detail::kHeadChunk; ++j) {
      const int64_t h = h0 + j;
      if (h >= h_end) continue;
      if (rot) {
        float x[kE], y[kE];
        a[j].to_float(x);
        b[j].to_float(y);
        if (!p.interleave) {
          FLASHINFER_UNROLL
          for (int e = 0; e < kE; ++e) detail::rotate(x[e], y[e], cs[e], sn[e]);
        } else {
          FLASHINFER_UNROLL
          for (int e = 0; e < kE / 2; ++e) {
            detail::rotate(x[2 * e], x[2 * e + 1], cs[e], sn[e]);
            detail::rotate(y[2 * e], y[2 * e + 1], cs[kE / 2 + e], sn[kE / 2 + e]);
          }
        }
        a[j].from_float(x);
        b[j].from_float(y);
      }
      T* out = h < p.num_q_heads ? q_out + h * p.q_out_stride_h : k_out + (h - p.num_q_heads) * p.k_out_stride_h;
      a[j].store_stream(out + off_a);
      if (two) b[j].store_stream(out + off_b);
    }
  }
}

// Scalar path: any rotary_dim, head_dim and alignment. Unit u < rotary_dim/2 is pair u;
// the rest copy one pass-through feature each.
template <typename T, typename IdType>
__global__ void RopeScalarKernel(const RopeParams<T, IdType> p, const RopeLaunch l) {
  extern __shared__ float inv_freq[];
  const int64_t half = p.rotary_dim / 2;
  const int64_t i = int64_t{blockIdx.x} * blockDim.x + threadIdx.x;
  const int64_t u = i % l.units;
  const int64_t r = i / l.units;
  const int64_t g = r % l.head_groups;
  const int64_t t = r / l.head_groups;
  int64_t pos = 0;
  bool ok = t < p.nnz && detail::token_position(p, t, &pos);
  if (!p.cos_sin_cache) detail::fill_inv_freq(p, inv_freq);
  if (!ok) return;

  const bool rot = u < half;
  float c = 1.f, s = 0.f;
  int64_t f0, f1 = 0;
  if (rot) {
    if (p.cos_sin_cache) {
      if (pos < 0 || pos >= p.max_pos) {
        record_index_error(p.err, kPositionOutOfRange, t);
        return;
      }
      const float* row = p.cos_sin_cache + pos * p.cache_stride;
      c = row[u];
      s = row[half + u];
    } else {
      sincosf(rope_angle(pos, inv_freq[u]), &s, &c);
    }
    f0 = rope_pair_first(u, p.interleave);
    f1 = rope_pair_second(u, p.rotary_dim, p.interleave);
  } else {
    f0 = p.rotary_dim + (u - half);
  }

  const int64_t nh = p.num_q_heads + p.num_k_heads;
  const int64_t h_begin = g * l.heads_per_group;
  const int64_t h_end = h_begin + l.heads_per_group < nh ? h_begin + l.heads_per_group : nh;
  for (int64_t h = h_begin; h < h_end; ++h) {
    const bool is_q = h < p.num_q_heads;
    const T* in = is_q ? p.q + t * p.q_stride_n + h * p.q_stride_h
                       : p.k + t * p.k_stride_n + (h - p.num_q_heads) * p.k_stride_h;
    T* out = is_q ? p.q_out + t * p.q_out_stride_n + h * p.q_out_stride_h
                  : p.k_out + t * p.k_out_stride_n + (h - p.num_q_heads) * p.k_out_stride_h;
    if (rot) {
      float x = to_float(in[f0]), y = to_float(in[f1]);
      detail::rotate(x, y, c, s);
      out[f0] = from_float<T>(x);
      out[f1] = from_float<T>(y);
    } else {
      out[f0] = in[f0];
    }
  }
}

// Launches RoPE on `stream`. q/k may be any strided views with a contiguous last dimension;
// q_out == q and k_out == k (same strides) runs in place.
template <typename T, typename IdType>
cudaError_t Rope(const RopeParams<T, IdType>& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  const int64_t nh = p.num_q_heads + p.num_k_heads;
  if (p.nnz == 0 || nh == 0) return cudaSuccess;
  constexpr int kE = 16 / sizeof(T);
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  auto mult = [](int64_t s) { return s % kE == 0; };
  bool aligned16 = aligned(p.q) && aligned(p.q_out) && mult(p.q_stride_n) && mult(p.q_stride_h) &&
                   mult(p.q_out_stride_n) && mult(p.q_out_stride_h);
  if (p.num_k_heads > 0)
    aligned16 = aligned16 && aligned(p.k) && aligned(p.k_out) && mult(p.k_stride_n) && mult(p.k_stride_h) &&
                mult(p.k_out_stride_n) && mult(p.k_out_stride_h);
  const RopeLaunch l = rope_launch_config(p.nnz, nh, p.head_dim, p.rotary_dim, p.in_place(),
                                          p.cos_sin_cache == nullptr, kE, aligned16);
  if (l.units == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(l.blocks)), block(l.threads);
  if (l.vectorized) return launch(RopeKernel<T, IdType, kE>, grid, block, l.smem, stream, false, p, l);
  return launch(RopeScalarKernel<T, IdType>, grid, block, l.smem, stream, false, p, l);
}

}  // namespace rope
}  // namespace flashinfer
