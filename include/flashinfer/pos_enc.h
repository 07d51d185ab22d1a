// Rotary position embedding (RoPE): the frequency schedule (plain and Llama-3.1 smoothed), the
// RoPE op's parameters, validation and launch arithmetic. Pure C++17: kernels, the attention
// code (pos_encoding_mode=ROPE_LLAMA) and ctest share one definition of every frequency.
#pragma once

#include <cmath>
#include <cstddef>
#include <cstdint>

#include "config.h"
#include "status.h"

namespace flashinfer {

// FlashInfer's PosEncodingMode values (the Python enum mirrors them).
enum class PosEncodingMode : int { kNone = 0, kRoPELlama = 1, kALiBi = 2 };

// Which frequencies a rotary embedding uses. Pair d (0 <= d < rotary_dim / 2) rotates by
// angle = pos * inv_freq(d), with base frequency f_d = theta^(-2d / rotary_dim):
//   plain:      inv_freq = f_d / scale
//   Llama-3.1:  smooth = clamp((old_context_len * f_d / (2 pi) - low) / (high - low), 0, 1),
//               inv_freq = (1 - smooth) * f_d / scale + smooth * f_d
struct RopeFreq {
  double theta = 1e4;
  double scale = 1.0;
  bool llama31 = false;
  double low_freq_factor = 1.0;
  double high_freq_factor = 4.0;
  double old_context_len = 8192.0;
};

// inv_freq(d) in double. Every caller rounds it once to float (rope_inv_freq), so kernels and
// references agree bit for bit: at positions near 1e6 one float ulp of inv_freq moves the
// angle by ~0.06 rad, so the frequency must not depend on which fast pow a device picks.
FLASHINFER_HOST_DEVICE double rope_inv_freq_f64(const RopeFreq& f, int64_t d, int64_t rotary_dim) {
  const double base = ::pow(f.theta, -2.0 * static_cast<double>(d) / static_cast<double>(rotary_dim));
  if (!f.llama31) return base / f.scale;
  constexpr double kTwoPi = 6.283185307179586476925286766559;
  double smooth = (f.old_context_len * base / kTwoPi - f.low_freq_factor) /
                  (f.high_freq_factor - f.low_freq_factor);
  smooth = smooth < 0.0 ? 0.0 : (smooth > 1.0 ? 1.0 : smooth);
  return (1.0 - smooth) * base / f.scale + smooth * base;
}

FLASHINFER_HOST_DEVICE float rope_inv_freq(const RopeFreq& f, int64_t d, int64_t rotary_dim) {
  return static_cast<float>(rope_inv_freq_f64(f, d, rotary_dim));
}

// The rotation angle, computed in fp32 exactly as FlashInfer does (float(pos) * inv_freq),
// then fed to an accurate sincosf.
FLASHINFER_HOST_DEVICE float rope_angle(int64_t pos, float inv_freq) {
  return static_cast<float>(pos) * inv_freq;
}

// Which features form a rotation pair, and which frequency index d a feature uses.
//   interleave=false (NeoX, rotate-half): pair d = (d, d + rotary_dim / 2)
//   interleave=true  (GPT-J):             pair d = (2d, 2d + 1)
FLASHINFER_HOST_DEVICE int64_t rope_pair_first(int64_t d, bool interleave) {
  return interleave ? 2 * d : d;
}
FLASHINFER_HOST_DEVICE int64_t rope_pair_second(int64_t d, int64_t rotary_dim, bool interleave) {
  return interleave ? 2 * d + 1 : d + rotary_dim / 2;
}
FLASHINFER_HOST_DEVICE int64_t rope_freq_index(int64_t feature, int64_t rotary_dim, bool interleave) {
  return interleave ? feature / 2 : feature % (rotary_dim / 2);
}

namespace rope {

// Bits a kernel records (see index_check.cuh) when FLASHINFER_CHECK_INDICES asks it to.
enum RopeIndexError : int32_t {
  kPositionOutOfRange = 1,  // cos/sin-cache form: pos outside [0, max_pos)
  kTokenNotInIndptr = 2,    // indptr form: no segment indptr[b] <= t < indptr[b+1] holds token t
};

// q_out = rope(q), k_out = rope(k). Positions come from pos_ids, or (when pos_ids is null)
// from the ragged form: token t of segment b has pos = offsets[b] + t - indptr[b]. cos/sin come
// from cos_sin_cache when given (cos = row[d], sin = row[rotary_dim/2 + d]), otherwise from
// `freq`. Features [rotary_dim, head_dim) are copied unchanged (not touched when in place).
template <typename T, typename IdType>
struct RopeParams {
  T* q_out;                    // [nnz, num_q_heads, head_dim] via q_out_stride_n/h
  T* k_out;                    // [nnz, num_k_heads, head_dim] via k_out_stride_n/h
  const T* q;                  // [nnz, num_q_heads, head_dim] via q_stride_n/h
  const T* k;                  // [nnz, num_k_heads, head_dim] via k_stride_n/h
  const IdType* pos_ids;       // [nnz], or null for the indptr form
  const IdType* indptr;        // [batch_size + 1] (indptr form)
  const IdType* offsets;       // [batch_size] (indptr form)
  const float* cos_sin_cache;  // [max_pos, rotary_dim] via cache_stride, or null
  int64_t nnz;
  int64_t batch_size;
  int64_t num_q_heads, num_k_heads;
  int64_t head_dim;
  int64_t rotary_dim;
  int64_t max_pos;       // rows of cos_sin_cache
  int64_t cache_stride;  // elements between cos_sin_cache rows
  int64_t q_stride_n, q_stride_h, k_stride_n, k_stride_h;
  int64_t q_out_stride_n, q_out_stride_h, k_out_stride_n, k_out_stride_h;
  RopeFreq freq;
  bool interleave;
  int32_t* err;  // [2] or null: index errors recorded by index_check.cuh (opt-in)
  bool pdl;      // launch with programmatic dependent launch (the kernels wait first)

  // Output aliases input exactly: the pass-through features need no copy.
  bool in_place() const {
    return q_out == q && k_out == k && q_out_stride_n == q_stride_n && q_out_stride_h == q_stride_h &&
           k_out_stride_n == k_stride_n && k_out_stride_h == k_stride_h;
  }
};

// sin and cos of an fp32 rope angle without a slow path: the reduction by pi/2 is done in
// double (exact for |angle| < 2^50, far beyond any position * inv_freq), then Cephes' sinf /
// cosf minimax polynomials on [-pi/4, pi/4] in float (~1e-7 absolute). sincosf is as accurate
// but falls back to a Payne-Hanek reduction with a local-memory table above |x| = 105615
// (position 131072 at inv_freq 1), which diverges warps and costs a stack frame.
FLASHINFER_HOST_DEVICE void rope_sincos(float angle, float* sin_out, float* cos_out) {
  const double a = static_cast<double>(angle);
  const double k = ::rint(a * 0.63661977236758134308);  // nearest multiple of pi/2
  double r = ::fma(-k, 1.5707963267948966192e+00, a);   // pi/2 = hi + lo to 106 bits
  r = ::fma(-k, 6.1232339957367658e-17, r);
  const double kq = k - 4.0 * ::floor(k * 0.25);  // quadrant 0..3 (NaN for a NaN angle)
  const float x = static_cast<float>(r);
  const float z = x * x;
  const float sp = ((-1.9515295891e-4f * z + 8.3321608736e-3f) * z - 1.6666654611e-1f) * z * x + x;
  const float cp = ((2.443315711809948e-5f * z - 1.388731625493765e-3f) * z + 4.166664568298827e-2f) * z * z -
                   0.5f * z + 1.0f;
  const bool odd = kq == 1.0 || kq == 3.0;
  float s = odd ? cp : sp, c = odd ? sp : cp;
  if (kq >= 2.0) s = -s;
  if (kq == 1.0 || kq == 2.0) c = -c;
  *sin_out = s;
  *cos_out = c;
}

// The inv_freq table travels with the launch (kernel parameters, served from the constant
// cache): frequency d < kRopeParamFreqs is read from it; larger rotary dims compute the rest
// on the device. The host fills it once per (frequency schedule, rotary_dim).
constexpr int kRopeParamFreqs = 256;
struct RopeFreqTable {
  float inv_freq[kRopeParamFreqs];
};
inline void rope_fill_freq_table(const RopeFreq& f, int64_t rotary_dim, RopeFreqTable* t) {
  const int64_t half = rotary_dim / 2;
  for (int64_t d = 0; d < kRopeParamFreqs; ++d) t->inv_freq[d] = d < half ? rope_inv_freq(f, d, rotary_dim) : 0.f;
}

// Work decomposition: thread = (token, head group, unit). A unit is one rotation "pair vector"
// (features [u*E, u*E+E) and [half+u*E, half+u*E+E), half = rotary_dim/2, E elements per
// vector), so a NeoX pair's two halves arrive in one pass; copy units move the pass-through
// features two vectors at a time. The scalar path (any alignment, any rotary_dim) uses E = 1
// and one pair per rotary unit. A thread computes its unit's cos/sin once and rotates the
// heads_per_group heads of its group with them, issuing the loads of kRopeHeadChunk heads
// (2 vectors each) together -- before its position and cos/sin are known, so the data loads
// and the position -> cos/sin chain overlap.
struct RopeLaunch {
  bool vectorized = false;
  int vec_elems = 1;
  int64_t rot_units = 0;   // per head
  int64_t copy_units = 0;  // per head (0 in place)
  int64_t units = 0;       // rot_units + copy_units
  int64_t head_groups = 1;
  int64_t heads_per_group = 1;
  int threads = 256;
  int64_t blocks = 0;
  // Scalar launches of few tokens run on a 2-D grid, x = head group, y = token, of `units`-thread
  // blocks: the kernel reads (t, g, u) from its indices instead of dividing a flat index (two
  // runtime divisions ahead of the first load; 0.1-0.25 us of a 5 us launch on the H200,
  // benchmarks/NOTES.md, session 17). blocks is then head_groups * nnz.
  bool grid2d = false;
};

constexpr int kRopeThreads = 256;
// Heads whose loads one thread keeps in flight together (2 vectors each): 8 x 16 bytes.
constexpr int64_t kRopeHeadChunk = 4;
// Below this many threads at kRopeHeadChunk heads per thread (a quarter wave of 132 SMs x
// 1024), the grid is latency-bound: one head per thread, so more SMs share the work.
constexpr int64_t kRopeSmallThreads = int64_t{132} * 256;

// Launches of at most this many tokens are latency-bound: the scalar kernel, one pair (one
// sincos) per thread, finishes sooner than a vector unit's kE / 2 sincos per thread.
constexpr int64_t kRopeScalarTokens = 16;
// The 2-D grid's limits: gridDim.y (tokens) and the block size (units per head group).
constexpr int64_t kRopeGrid2dMaxTokens = 65535;
constexpr int64_t kRopeGrid2dMaxUnits = 1024;

// vec_elems: elements of a 16-byte vector. aligned16: every base pointer is 16-byte aligned
// and every q/k stride is a multiple of vec_elems. heads_per_thread: 0 = the default
// (kRopeHeadChunk; 1 for small grids); otherwise the heads a thread rotates (rounded up to a
// multiple of kRopeHeadChunk above it), e.g. from FLASHINFER_ROPE_HEADS_PER_THREAD.
// small_tokens: nnz up to this takes the scalar kernel (e.g. FLASHINFER_ROPE_SCALAR_TOKENS).
inline RopeLaunch rope_launch_config(int64_t nnz, int64_t num_heads, int64_t head_dim, int64_t rotary_dim,
                                     bool in_place, int vec_elems, bool aligned16, int64_t heads_per_thread = 0,
                                     int64_t small_tokens = kRopeScalarTokens) {
  RopeLaunch l;
  const int64_t half = rotary_dim / 2;
  l.vectorized = aligned16 && vec_elems > 1 && half % vec_elems == 0 && head_dim % vec_elems == 0 &&
                 nnz > small_tokens;
  if (l.vectorized) {
    l.vec_elems = vec_elems;
    l.rot_units = half / vec_elems;
    l.copy_units = in_place ? 0 : ceil_div<int64_t>((head_dim - rotary_dim) / vec_elems, 2);
  } else {
    l.vec_elems = 1;
    l.rot_units = half;
    l.copy_units = in_place ? 0 : head_dim - rotary_dim;
  }
  l.units = l.rot_units + l.copy_units;
  const int64_t nh = num_heads < 1 ? 1 : num_heads;
  int64_t hpg = heads_per_thread > 0 ? heads_per_thread : kRopeHeadChunk;
  if (hpg > kRopeHeadChunk) hpg = round_up<int64_t>(hpg, kRopeHeadChunk);
  if (hpg > nh) hpg = nh;
  if (heads_per_thread <= 0 && nnz * l.units * ceil_div<int64_t>(nh, hpg) < kRopeSmallThreads) hpg = 1;
  // a grid past gridDim.x: fewer, longer threads (every head of a token in one thread)
  if (ceil_div<int64_t>(nnz * ceil_div<int64_t>(nh, hpg) * l.units, kRopeThreads) > (int64_t{1} << 31) - 1) hpg = nh;
  l.heads_per_group = hpg;
  l.head_groups = ceil_div<int64_t>(nh, hpg);
  l.threads = kRopeThreads;
  l.blocks = ceil_div<int64_t>(nnz * l.head_groups * l.units, l.threads);
  if (!l.vectorized && nnz <= small_tokens && nnz <= kRopeGrid2dMaxTokens && l.units <= kRopeGrid2dMaxUnits) {
    l.grid2d = true;
    l.threads = static_cast<int>(l.units);
    l.blocks = l.head_groups * nnz;
  }
  return l;
}

// What the kernels assume; the binding has already produced friendlier messages.
template <typename T, typename IdType>
Status validate(const RopeParams<T, IdType>& p) {
  if (p.nnz < 0 || p.num_q_heads < 0 || p.num_k_heads < 0 || p.head_dim <= 0) return Status::kInvalidArgument;
  if (p.rotary_dim <= 0 || p.rotary_dim % 2 != 0 || p.rotary_dim > p.head_dim) return Status::kInvalidArgument;
  if (p.nnz > (int64_t{1} << 31) - 1) return Status::kInvalidArgument;
  if (p.nnz == 0 || p.num_q_heads + p.num_k_heads == 0) return Status::kSuccess;
  if (!p.q_out || !p.q || (p.num_k_heads > 0 && (!p.k_out || !p.k))) return Status::kInvalidArgument;
  if (p.cos_sin_cache) {
    if (!p.pos_ids || p.max_pos < 0) return Status::kInvalidArgument;
  } else {
    if (!(p.freq.theta > 0.0) || !(p.freq.scale > 0.0)) return Status::kInvalidArgument;
    if (p.freq.llama31 && !(p.freq.high_freq_factor > p.freq.low_freq_factor)) return Status::kInvalidArgument;
  }
  if (!p.pos_ids && (!p.indptr || !p.offsets || p.batch_size < 0)) return Status::kInvalidArgument;
  if (!p.pos_ids && p.batch_size > (int64_t{1} << 31) - 2) return Status::kUnsupported;  // 32-bit search
  // Threads are indexed in int64 but the grid is 1-D: blocks must fit gridDim.x.
  const RopeLaunch l = rope_launch_config(p.nnz, p.num_q_heads + p.num_k_heads, p.head_dim, p.rotary_dim,
                                          false, 8, false);
  if (l.blocks > (int64_t{1} << 31) - 1) return Status::kUnsupported;
  return Status::kSuccess;
}

}  // namespace rope
}  // namespace flashinfer
