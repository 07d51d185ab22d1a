// RoPE kernels (pos_ids / indptr positions; computed frequencies or a cos/sin cache) and
// their launcher. Frequencies, parameters and launch arithmetic live in pos_enc.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "index_check.h"
#include "math.cuh"
#include "pos_enc.h"
#include "utils.cuh"
#include "vec_dtypes.cuh"

namespace flashinfer {
namespace rope {
namespace detail {

constexpr int kHeadChunk = static_cast<int>(kRopeHeadChunk);

// load128_ordered (vec_dtypes.cuh) for one 2-byte element.
template <typename T>
FLASHINFER_DEVICE T load_elem_ordered(const T* ptr) {
  static_assert(sizeof(T) == 2, "fp16 / bf16 elements");
  unsigned short r;
  asm volatile("ld.global.u16 %0, [%1];" : "=h"(r) : "l"(ptr));
  T v;
  memcpy(&v, &r, 2);
  return v;
}

// Position of token t in the indptr form: binary search for the last b with indptr[b] <= t
// (empty segments are skipped), then a check that segment b really holds t.
template <typename T, typename IdType>
FLASHINFER_DEVICE bool indptr_position(const RopeParams<T, IdType>& p, int64_t t, int64_t* pos) {
  // 32-bit search indices (the binding bounds batch_size by a tensor dimension < 2^31)
  int lo = 0, hi = static_cast<int>(p.batch_size);
  while (hi - lo > 1) {
    const int mid = static_cast<int>((static_cast<unsigned>(lo) + static_cast<unsigned>(hi)) / 2u);
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

// inv_freq of pair d: from the launch's table, computed on the device past its end.
template <typename T, typename IdType>
FLASHINFER_DEVICE float inv_freq_of(const RopeParams<T, IdType>& p, const RopeFreqTable& tab, int64_t d) {
  return d < kRopeParamFreqs ? tab.inv_freq[d] : rope_inv_freq(p.freq, d, p.rotary_dim);
}
// The vectorised kernel reads the table only (rope_launch_config sends rotary dims past it
// to the scalar kernel): a device pow there would cost registers the data loads need.
template <typename T, typename IdType>
FLASHINFER_DEVICE float table_inv_freq(const RopeFreqTable& tab, int64_t d) {
  return tab.inv_freq[d];
}

// (x, y) -> (x cos - y sin, y cos + x sin)
FLASHINFER_DEVICE void rotate(float& x, float& y, float c, float s) {
  const float x0 = x;
  x = x0 * c - y * s;
  y = y * c + x0 * s;
}

// Rotates vectors a (features [u*E, +E)) and b ([half + u*E, +E)) with the unit's (cos, sin)
// slots, two elements at a time so that few fp32 temporaries are live: NeoX pairs (a[e], b[e])
// use slot e; interleaved pairs (a[2e], a[2e+1]) use slot e, (b[2e], b[2e+1]) slot E/2 + e.
template <typename T, int kE>
FLASHINFER_DEVICE void rotate_vectors(Vec<T, kE>& a, Vec<T, kE>& b, const float* cs, const float* sn,
                                      bool interleave) {
  FLASHINFER_UNROLL
  for (int e = 0; e < kE; e += 2) {
    float x0 = to_float(a.v[e]), x1 = to_float(a.v[e + 1]);
    float y0 = to_float(b.v[e]), y1 = to_float(b.v[e + 1]);
    if (!interleave) {
      rotate(x0, y0, cs[e], sn[e]);
      rotate(x1, y1, cs[e + 1], sn[e + 1]);
    } else {
      rotate(x0, x1, cs[e / 2], sn[e / 2]);
      rotate(y0, y1, cs[kE / 2 + e / 2], sn[kE / 2 + e / 2]);
    }
    a.v[e] = from_float<T>(x0);
    a.v[e + 1] = from_float<T>(x1);
    b.v[e] = from_float<T>(y0);
    b.v[e + 1] = from_float<T>(y1);
  }
}

// thread index -> (token t, head group g, unit u); 32-bit divisions where the index fits (a
// 64-bit division is a ~60-instruction subroutine).
FLASHINFER_DEVICE void decode_index(int64_t i, const RopeLaunch& l, int64_t* t, int64_t* g, int64_t* u) {
  if (i <= 0xffffffffLL) {
    const uint32_t i32 = static_cast<uint32_t>(i), units = static_cast<uint32_t>(l.units);
    const uint32_t groups = static_cast<uint32_t>(l.head_groups);
    const uint32_t r = i32 / units;
    *u = i32 - r * units;
    const uint32_t t32 = r / groups;
    *g = r - t32 * groups;
    *t = t32;
  } else {
    *u = i % l.units;
    const int64_t r = i / l.units;
    *g = r % l.head_groups;
    *t = r / l.head_groups;
  }
}

}  // namespace detail

// Vectorised path (16-byte vectors of kE elements). Thread = (token t, head group g, unit u);
// see RopeLaunch. A rotary unit owns features [u*kE, +kE) and [half + u*kE, +kE): for NeoX
// they are each other's pair partners; for interleave each vector holds whole pairs. Its
// kE (cos, sin) values are computed once and reused for every head of the group.
// Order: position load, the first chunk's q/k loads, then the position's cos/sin (cache row
// or rope_sincos), so the chain pos -> cache row overlaps the data loads.
// 80 registers (3 blocks of 256 per SM) keep 8 vectors (128 bytes) in flight per thread
// without spills; at 64 the cos/sin and the 8 vectors do not fit together.
template <typename T, typename IdType, int kE>
__global__ void __launch_bounds__(kRopeThreads, 3)
    RopeKernel(const RopeParams<T, IdType> p, const RopeLaunch l, const RopeFreqTable tab) {
  static_assert(kE % 2 == 0, "interleaved pairs must not straddle vectors");
  static_assert(sizeof(Vec<T, kE>) == 16, "16-byte vectors");
  constexpr int kC = detail::kHeadChunk;
  // 32-bit indices (nnz < 2^31, heads and features far below): 64-bit ones cost registers
  const int half = static_cast<int>(p.rotary_dim / 2);
  int64_t t64, g64, u64;
  detail::decode_index(int64_t{blockIdx.x} * blockDim.x + threadIdx.x, l, &t64, &g64, &u64);
  pdl_wait();  // (launched with PDL: the previous kernel's writes are visible past this)
  if (t64 >= p.nnz) return;
  const int t = static_cast<int>(t64);  // nnz < 2^31 (validate)
  // the position first: its load is the head of the longest dependent chain
  int64_t pos = p.pos_ids ? static_cast<int64_t>(p.pos_ids[t]) : 0;
  const int u = static_cast<int>(u64);
  const int rot_units = static_cast<int>(l.rot_units);
  const bool rot = u < rot_units;
  // This unit's two vectors (a copy unit at the odd end of the pass-through has one), as the
  // offset of the first and the distance to the second.
  int off_a, dist_b;
  bool two = true;
  if (rot) {
    off_a = u * kE;
    dist_b = half;
  } else {
    off_a = static_cast<int>(p.rotary_dim) + (u - rot_units) * 2 * kE;
    dist_b = kE;
    two = off_a + kE < p.head_dim;
  }
  const int nq = static_cast<int>(p.num_q_heads);
  const int nh = nq + static_cast<int>(p.num_k_heads);
  const int hpg = static_cast<int>(l.heads_per_group);
  const int h_begin = static_cast<int>(g64) * hpg;
  const int h_end = h_begin + hpg < nh ? h_begin + hpg : nh;
  const T* q_in = p.q + t * p.q_stride_n + off_a;
  const T* k_in = p.k + t * p.k_stride_n + off_a;
  T* q_out = p.q_out + t * p.q_out_stride_n + off_a;
  T* k_out = p.k_out + t * p.k_out_stride_n + off_a;

  Vec<T, kE> a[kC], b[kC];
  auto load_chunk = [&](int h0) {
    FLASHINFER_UNROLL
    for (int j = 0; j < kC; ++j) {
      const int h = h0 + j;
      if (h >= h_end) continue;
      const T* in = h < nq ? q_in + h * p.q_stride_h : k_in + (h - nq) * p.k_stride_h;
      *reinterpret_cast<uint4*>(&a[j]) = load128_ordered(in);
      if (two) *reinterpret_cast<uint4*>(&b[j]) = load128_ordered(in + dist_b);
    }
  };
  load_chunk(h_begin);

  if (!p.pos_ids && !detail::indptr_position(p, t, &pos)) return;
  if (p.cos_sin_cache && (pos < 0 || pos >= p.max_pos)) {  // nothing is written for the token
    record_index_error(p.err, kPositionOutOfRange, t);
    return;
  }
  float cs[kE], sn[kE];
  if (rot) {
    if (p.cos_sin_cache) {
      // cos of slots [0, kE/2) and [kE/2, kE) are two contiguous float4 runs: NeoX frequencies
      // u*kE + e; interleave u*kE/2 + e and half/2 + u*kE/2 + e. sin follows half floats later.
      // (The launcher sends caches with unaligned rows to the scalar kernel.)
      static_assert(kE == 8, "cos/sin runs of kE / 2 = 4 floats");
      const float* c0 = p.cos_sin_cache + pos * p.cache_stride + (p.interleave ? u * (kE / 2) : u * kE);
      const float* c1 = p.interleave ? c0 + half / 2 : c0 + kE / 2;
      const float4 ca = __ldg(reinterpret_cast<const float4*>(c0));
      const float4 cb = __ldg(reinterpret_cast<const float4*>(c1));
      const float4 sa = __ldg(reinterpret_cast<const float4*>(c0 + half));
      const float4 sb = __ldg(reinterpret_cast<const float4*>(c1 + half));
      cs[0] = ca.x, cs[1] = ca.y, cs[2] = ca.z, cs[3] = ca.w, cs[4] = cb.x, cs[5] = cb.y, cs[6] = cb.z, cs[7] = cb.w;
      sn[0] = sa.x, sn[1] = sa.y, sn[2] = sa.z, sn[3] = sa.w, sn[4] = sb.x, sn[5] = sb.y, sn[6] = sb.z, sn[7] = sb.w;
    } else {
      FLASHINFER_UNROLL
      for (int e = 0; e < kE; ++e) {
        const int d = e < kE / 2 ? (p.interleave ? u * (kE / 2) + e : u * kE + e)
                                     : (p.interleave ? half / 2 + u * (kE / 2) + (e - kE / 2) : u * kE + e);
        rope_sincos(rope_angle(pos, detail::table_inv_freq<T, IdType>(tab, d)), &sn[e], &cs[e]);
      }
    }
  }

  for (int h0 = h_begin;;) {
    FLASHINFER_UNROLL
    for (int j = 0; j < kC; ++j) {
      const int h = h0 + j;
      if (h >= h_end) continue;
      if (rot) detail::rotate_vectors(a[j], b[j], cs, sn, p.interleave);
      T* out = h < nq ? q_out + h * p.q_out_stride_h : k_out + (h - nq) * p.k_out_stride_h;
      a[j].store128(out);
      if (two) b[j].store128(out + dist_b);
    }
    h0 += kC;
    if (h0 >= h_end) break;
    load_chunk(h0);
  }
}

// Scalar path: any rotary_dim, head_dim and alignment, and the latency path of small launches
// (rope_launch_config: one pair, so one sincos, per thread). Unit u < rotary_dim/2 is pair u;
// the rest copy one pass-through feature each. Like the vectorised kernel it issues its first
// head's loads before the position -> cos/sin chain.
template <typename T, typename IdType>
__global__ void RopeScalarKernel(const RopeParams<T, IdType> p, const RopeLaunch l, const RopeFreqTable tab) {
  const int64_t half = p.rotary_dim / 2;
  int64_t t, g, u;
  if (l.grid2d) {
    u = threadIdx.x;
    g = blockIdx.x;
    t = blockIdx.y;
  } else {
    detail::decode_index(int64_t{blockIdx.x} * blockDim.x + threadIdx.x, l, &t, &g, &u);
  }
  pdl_wait();
  if (t >= p.nnz) return;
  int64_t pos = p.pos_ids ? static_cast<int64_t>(p.pos_ids[t]) : 0;
  const bool rot = u < half;
  const int64_t f0 = rot ? rope_pair_first(u, p.interleave) : p.rotary_dim + (u - half);
  const int64_t f1 = rot ? rope_pair_second(u, p.rotary_dim, p.interleave) : f0;
  const int64_t nh = p.num_q_heads + p.num_k_heads;
  const int64_t h_begin = g * l.heads_per_group;
  const int64_t h_end = h_begin + l.heads_per_group < nh ? h_begin + l.heads_per_group : nh;
  auto in_of = [&](int64_t h) {
    return h < p.num_q_heads ? p.q + t * p.q_stride_n + h * p.q_stride_h
                             : p.k + t * p.k_stride_n + (h - p.num_q_heads) * p.k_stride_h;
  };
  const T* in = in_of(h_begin);
  T x = detail::load_elem_ordered(in + f0), y = detail::load_elem_ordered(in + f1);

  if (!p.pos_ids && !detail::indptr_position(p, t, &pos)) return;
  if (p.cos_sin_cache && (pos < 0 || pos >= p.max_pos)) {  // nothing is written for the token
    record_index_error(p.err, kPositionOutOfRange, t);
    return;
  }
  float c = 1.f, s = 0.f;
  if (rot) {
    if (p.cos_sin_cache) {
      const float* row = p.cos_sin_cache + pos * p.cache_stride;
      c = row[u];
      s = row[half + u];
    } else {
      rope_sincos(rope_angle(pos, detail::inv_freq_of(p, tab, u)), &s, &c);
    }
  }

  for (int64_t h = h_begin;;) {
    T* out = h < p.num_q_heads ? p.q_out + t * p.q_out_stride_n + h * p.q_out_stride_h
                               : p.k_out + t * p.k_out_stride_n + (h - p.num_q_heads) * p.k_out_stride_h;
    if (rot) {
      float fx = to_float(x), fy = to_float(y);
      detail::rotate(fx, fy, c, s);
      out[f0] = from_float<T>(fx);
      out[f1] = from_float<T>(fy);
    } else {
      out[f0] = x;
    }
    if (++h >= h_end) break;
    in = in_of(h);
    x = in[f0];
    y = in[f1];
  }
}

namespace detail {

// FLASHINFER_ROPE_HEADS_PER_THREAD=<n>: heads one thread rotates (a tuning knob for
// benchmarks, read once; unset or 0: rope_launch_config's default).
inline int64_t heads_per_thread_override() {
  static const int64_t v = [] {
    const char* e = std::getenv("FLASHINFER_ROPE_HEADS_PER_THREAD");
    const long n = e ? std::atol(e) : 0;
    return n > 0 ? static_cast<int64_t>(n) : int64_t{0};
  }();
  return v;
}

// FLASHINFER_ROPE_SCALAR_TOKENS=<n>: launches of at most n tokens take the scalar kernel
// (rope_launch_config's small_tokens; a tuning knob for benchmarks, read once; unset: the
// default kRopeScalarTokens, negative: never).
inline int64_t scalar_tokens_setting() {
  static const int64_t v = [] {
    const char* e = std::getenv("FLASHINFER_ROPE_SCALAR_TOKENS");
    return e && *e ? static_cast<int64_t>(std::atol(e)) : kRopeScalarTokens;
  }();
  return v;
}

// The inv_freq table of (freq, rotary_dim), filled on the host when they change (64 double
// pows would cost microseconds per call); one cached entry per host thread.
inline const RopeFreqTable& freq_table(const RopeFreq& f, int64_t rotary_dim) {
  struct Entry {
    RopeFreq f;
    int64_t rotary_dim = -1;
    RopeFreqTable table;
  };
  thread_local Entry cached;
  const RopeFreq& c = cached.f;
  if (cached.rotary_dim != rotary_dim || c.theta != f.theta || c.scale != f.scale || c.llama31 != f.llama31 ||
      c.low_freq_factor != f.low_freq_factor || c.high_freq_factor != f.high_freq_factor ||
      c.old_context_len != f.old_context_len) {
    rope_fill_freq_table(f, rotary_dim, &cached.table);
    cached.f = f;
    cached.rotary_dim = rotary_dim;
  }
  return cached.table;
}

}  // namespace detail

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
  // The vectorised kernel reads cos/sin cache rows as float4 runs (16-byte aligned rows; the
  // sin half is aligned too since half % kE == 0 there) and inv_freq from the launch's table.
  if (p.cos_sin_cache) aligned16 = aligned16 && aligned(p.cos_sin_cache) && p.cache_stride % 4 == 0;
  else aligned16 = aligned16 && p.rotary_dim / 2 <= kRopeParamFreqs;
  const RopeLaunch l = rope_launch_config(p.nnz, nh, p.head_dim, p.rotary_dim, p.in_place(), kE, aligned16,
                                          detail::heads_per_thread_override(), detail::scalar_tokens_setting());
  if (l.units == 0) return cudaSuccess;
  if (l.blocks > (int64_t{1} << 31) - 1) return cudaErrorInvalidValue;
  static const RopeFreqTable kNoTable{};
  const RopeFreqTable& tab = p.cos_sin_cache ? kNoTable : detail::freq_table(p.freq, p.rotary_dim);
  const dim3 grid = l.grid2d ? dim3(static_cast<unsigned>(l.head_groups), static_cast<unsigned>(p.nnz))
                             : dim3(static_cast<unsigned>(l.blocks));
  const dim3 block(l.threads);
  if (l.vectorized) return launch(RopeKernel<T, IdType, kE>, grid, block, 0, stream, p.pdl, p, l, tab);
  return launch(RopeScalarKernel<T, IdType>, grid, block, 0, stream, p.pdl, p, l, tab);
}

}  // namespace rope
}  // namespace flashinfer
