// Sorting-free sampling logic: order keys, the top-k / top-p / min-p set criterion, the
// dual-pivot rejection step and the exact-threshold bracket search, plus the two loop drivers
// that the kernels run (with block-wide sources, sampling.cuh) and that the CPU replay in
// tests/cpp/host/test_sampling.cpp runs (with exact host sources). Pure C++17.
#pragma once

#include <cstdint>
#include <cstring>

#include "config.h"

// The drivers are __host__ __device__ templates whose Source may be device-only.
#if defined(__CUDACC__)
#define FLASHINFER_HD_TEMPLATE _Pragma("nv_exec_check_disable")
#else
#define FLASHINFER_HD_TEMPLATE
#endif

namespace flashinfer {
namespace sampling {

// ---- order keys: uint32 with x < y <=> key(x) < key(y) for numbers ---------------------------

constexpr uint32_t kKeyNaN = 0u;              // NaN sorts below every number
constexpr uint32_t kKeyNegInf = 0x007FFFFFu;  // key(-inf)
constexpr uint32_t kKeyZero = 0x80000000u;    // key(+0) == key(-0)
constexpr uint32_t kKeyPosInf = 0xFF800000u;  // key(+inf)
constexpr uint32_t kKeyMax = 0xFFFFFFFFu;     // above every number

FLASHINFER_HOST_DEVICE uint32_t float_to_bits(float x) {
#if defined(__CUDA_ARCH__)
  return __float_as_uint(x);
#else
  uint32_t b;
  std::memcpy(&b, &x, sizeof(b));
  return b;
#endif
}

FLASHINFER_HOST_DEVICE float bits_to_float(uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __uint_as_float(b);
#else
  float x;
  std::memcpy(&x, &b, sizeof(x));
  return x;
#endif
}

FLASHINFER_HOST_DEVICE uint32_t order_key(float x) {
  if (x != x) return kKeyNaN;
  if (x == 0.f) return kKeyZero;
  const uint32_t b = float_to_bits(x);
  return (b & 0x80000000u) ? ~b : (b | 0x80000000u);
}

// The number with key k (k in [kKeyNegInf, kKeyPosInf]; NaN outside).
FLASHINFER_HOST_DEVICE float key_value(uint32_t k) {
  return bits_to_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

FLASHINFER_HOST_DEVICE bool is_finite(float x) { return x - x == 0.f; }

// ---- the filtered set ---------------------------------------------------------------------

// Membership of a value with key `key`, given the number `cnt` of elements strictly above it
// and their mass `sum`. Monotone: a larger key (smaller cnt and sum) is never less "in". Every
// filter keeps the row maximum (keys >= max_key), so the set is never empty: top_p <= 0,
// min_p >= 1 or top_k == 1 all mean greedy.
struct Criterion {
  int top_k = 0;             // active when > 0
  bool use_top_p = false;
  float top_p_mass = 0.f;    // top_p * (the mass top-p is relative to)
  uint32_t max_key = kKeyMax;

  FLASHINFER_HOST_DEVICE bool filters() const { return top_k > 0 || use_top_p; }
  FLASHINFER_HOST_DEVICE bool in_set(uint32_t key, int cnt, float sum) const {
    if (key >= max_key) return true;
    if (top_k > 0 && cnt >= top_k) return false;
    if (use_top_p && !(sum < top_p_mass)) return false;
    return true;
  }
};

// What the first pass over a row reports (elements compared by key against its pivot).
struct RowStats {
  float total = 0.f;  // mass of the elements above the pivot
  float max = 0.f;    // largest element
  float min = 0.f;    // smallest element above the pivot
  int count = 0;      // elements above the pivot
  bool has_nan = false;
};

// A probability row can be sampled: no NaN, positive finite mass.
FLASHINFER_HOST_DEVICE bool probs_valid(const RowStats& s) {
  return !s.has_nan && s.total > 0.f && is_finite(s.total);
}

// One row's filters after per-row resolution; "off" is top_k <= 0 or >= #positive, top_p >= 1,
// min_p <= 0.
struct RowFilter {
  int top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
};

FLASHINFER_HOST_DEVICE bool top_k_active(int k, int count) { return k > 0 && k < count; }
FLASHINFER_HOST_DEVICE bool top_p_active(float p) { return p < 1.f; }  // NaN: off

// ---- dual-pivot rejection sampling ----------------------------------------------------------

constexpr int kRejectPivots = 4;
constexpr int kMaxDraws = 32;  // uniforms one filtered row may consume (the generator advances 32)

// The round's pivots after drawing value x: x, then three evenly spaced values in (x, high],
// as keys (non-decreasing).
FLASHINFER_HOST_DEVICE void reject_pivots(float x, float high, uint32_t* piv) {
  piv[0] = order_key(x);
  const float w = high > x ? high - x : 0.f;
  FLASHINFER_HD_UNROLL
  for (int m = 1; m < kRejectPivots; ++m) {
    float v = x + w * (0.25f * static_cast<float>(m));
    if (v > high) v = high;
    const uint32_t k = order_key(v);
    piv[m] = k > piv[m - 1] ? k : piv[m - 1];
  }
}

// The search state: candidates are the elements with key > low; the set's threshold lies in
// (low, high] (in_set(high) holds). `column` names the source's last aggregate column whose
// pivot is `low` (-1: none yet), and `mass` is the candidates' mass in it.
struct RejectState {
  uint32_t low = kKeyZero;
  uint32_t high = kKeyMax;
  int column = -1;
  float mass = 0.f;
};

struct Pick {
  int64_t index = -1;
  float value = 0.f;
};

struct SampleResult {
  int64_t index = -1;
  float value = 0.f;
  int draws = 0;
  bool fallback = false;  // the draw budget ran out; sampled from {key >= high}, inside the set
};

// Source (all threads of a block call it alike; the host replay calls it once):
//   void aggregate(const uint32_t (&piv)[P], int (&cnt)[P], float (&sum)[P]):
//       count and mass of the candidates with key > piv[m], m < P; remembers them as columns.
//   Pick pick(uint32_t low, int column, float u): in the source's fixed order, the first
//       element with key > low where the running mass of such elements exceeds u (u < the
//       column's mass); the last such element when rounding leaves the sum short of u.
// uniform(d): the d-th uniform in [0, 1) of the row's stream.
// Accepts a draw when its value is in the set; otherwise the pivots move the candidate range
// to one of four sub-brackets, so it at least quarters (in value) every round.
FLASHINFER_HD_TEMPLATE
template <class Source, class Uniform>
FLASHINFER_HOST_DEVICE SampleResult rejection_sample(Source& src, const Criterion& c, RejectState s,
                                                     const Uniform& uniform, int max_draws) {
  uint32_t piv[kRejectPivots];
  int cnt[kRejectPivots];
  float sum[kRejectPivots];
  SampleResult r;
  for (int d = 0;;) {  // d: draws so far. One aggregate call site: the kernel inlines it once.
    const bool drawn = s.column >= 0;
    if (drawn) {
      const Pick p = src.pick(s.low, s.column, uniform(d) * s.mass);
      ++d;
      r.index = p.index;
      r.value = p.value;
      r.draws = d;
      if (!c.filters() || r.fallback || p.index < 0) return r;
      reject_pivots(p.value, key_value(s.high), piv);
    } else {  // the candidates' mass is not known yet
      FLASHINFER_HD_UNROLL
      for (int m = 0; m < kRejectPivots; ++m) piv[m] = s.low;
    }
    src.aggregate(piv, cnt, sum);
    if (!drawn) {
      s.column = 0;
      s.mass = sum[0];
      continue;
    }
    if (c.in_set(piv[0], cnt[0], sum[0])) return r;
    // Walk the pivots while they stay outside the set: the last such becomes low, the first
    // one inside (if any) high. A running flag, not an index, so the arrays stay in registers.
    bool outside = true;
    FLASHINFER_HD_UNROLL
    for (int j = 0; j < kRejectPivots; ++j) {
      const bool out_j = outside && (j == 0 || !c.in_set(piv[j], cnt[j], sum[j]));
      if (out_j && piv[j] > s.low) {
        s.low = piv[j];
        s.column = j;
        s.mass = sum[j];
      } else if (outside && !out_j && piv[j] < s.high) {
        s.high = piv[j];
      }
      outside = out_j;
    }
    if (d + 1 >= max_draws) {  // one draw left: take it from {key >= high}, all inside the set
      s.low = s.high - 1;
      s.column = -1;
      r.fallback = true;
    }
  }
}

// ---- exact threshold (renorm, mask, top-k-first) --------------------------------------------

constexpr int kSelectPivots = 8;

// in_set(hi) holds and in_set(lo) does not, so the kept set is {key > lo} once no element with
// a key other than hi's is left in (lo, hi].
struct Bracket {
  uint32_t lo = 0, hi = kKeyMax;
  int cnt_lo = 0, cnt_hi = 0;  // elements with key > lo / > hi
  float sum_lo = 0.f, sum_hi = 0.f;

  FLASHINFER_HOST_DEVICE bool resolved() const { return hi - lo <= 1u || cnt_lo == cnt_hi; }
};

// Four pivots evenly spaced in key space (the bracket narrows at least 5x per pass, so a
// 32-bit key range resolves in at most 14) and four evenly spaced in value when both ends
// are finite (fast when the values crowd into a small range of keys), all inside (lo, hi).
FLASHINFER_HOST_DEVICE void select_pivots(const Bracket& b, uint32_t* piv) {
  const uint64_t w = uint64_t{b.hi} - b.lo;
  const float a = key_value(b.lo), z = key_value(b.hi);
  const bool finite = is_finite(a) && is_finite(z);
  FLASHINFER_HD_UNROLL
  for (int m = 0; m < 4; ++m) {
    piv[m] = b.lo + static_cast<uint32_t>(w * static_cast<uint64_t>(m + 1) / 5u);
    uint32_t k = finite ? order_key(a + (z - a) * (0.2f * static_cast<float>(m + 1))) : piv[m];
    if (k <= b.lo) k = b.lo + 1u;
    if (k >= b.hi) k = b.hi - 1u;
    piv[4 + m] = k;
  }
}

FLASHINFER_HOST_DEVICE void select_update(Bracket& b, const Criterion& c, const uint32_t* piv,
                                          const int* cnt, const float* sum, int n) {
  FLASHINFER_HD_UNROLL
  for (int m = 0; m < n; ++m) {
    const uint32_t k = piv[m];
    if (k <= b.lo || k >= b.hi) continue;
    if (c.in_set(k, cnt[m], sum[m])) {
      b.hi = k;
      b.cnt_hi = cnt[m];
      b.sum_hi = sum[m];
    } else {
      b.lo = k;
      b.cnt_lo = cnt[m];
      b.sum_lo = sum[m];
    }
  }
}

// Source: aggregate() as above with P = kSelectPivots; bool in_list(); int list_capacity();
// void gather(lo, hi, base_cnt, base_sum): copy the elements with lo < key <= hi to the
// source's list, after which aggregates are base + list (valid for pivots in [lo, hi]).
// keep_all_above: gather everything above lo as soon as it fits (the caller samples from it).
FLASHINFER_HD_TEMPLATE
template <class Source>
FLASHINFER_HOST_DEVICE Bracket select_threshold(Source& src, const Criterion& c, Bracket b,
                                                bool keep_all_above) {
  uint32_t piv[kSelectPivots];
  int cnt[kSelectPivots];
  float sum[kSelectPivots];
  while (!b.resolved()) {
    if (!src.in_list()) {
      const int cap = src.list_capacity();
      if (keep_all_above && b.cnt_lo <= cap) {
        src.gather(b.lo, kKeyMax, 0, 0.f);
      } else if (b.cnt_lo - b.cnt_hi <= cap) {
        src.gather(b.lo, b.hi, b.cnt_hi, b.sum_hi);
      }
    }
    select_pivots(b, piv);
    src.aggregate(piv, cnt, sum);
    select_update(b, c, piv, cnt, sum, kSelectPivots);
  }
  return b;
}

// ---- per-row starting states ----------------------------------------------------------------

// Sampling with joint filters (top-k and/or top-p of the row, min-p): the criterion and the
// first state. The first pass (pivot kKeyZero) already aggregated column 0 = all positives.
struct SamplingStart {
  Criterion crit;
  RejectState state;
};

FLASHINFER_HOST_DEVICE SamplingStart joint_start(const RowStats& s, const RowFilter& f) {
  SamplingStart r;
  r.crit.max_key = order_key(s.max);
  if (top_k_active(f.top_k, s.count)) r.crit.top_k = f.top_k;
  if (top_p_active(f.top_p)) {
    r.crit.use_top_p = true;
    r.crit.top_p_mass = f.top_p * s.total;
  }
  r.state.high = r.crit.max_key;
  r.state.low = kKeyZero;
  r.state.column = 0;
  r.state.mass = s.total;
  if (f.min_p > 0.f) {  // candidates start at the min-p threshold (never above the max)
    float thr = f.min_p * s.max;
    if (!(thr <= s.max)) thr = s.max;
    if (thr > 0.f) {
      r.state.low = order_key(thr) - 1u;
      r.state.column = -1;
    }
  }
  return r;
}

// Top-p on the top-k-renormalized row, once the top-k threshold search resolved `b`: the
// candidates are the top-k set {key > b.lo}, and top-p is relative to its mass b.sum_lo.
// max_key: order_key of the row maximum.
FLASHINFER_HOST_DEVICE SamplingStart top_k_first_start(uint32_t max_key, float top_p, const Bracket& b) {
  SamplingStart r;
  r.crit.max_key = max_key;
  if (top_p_active(top_p)) {
    r.crit.use_top_p = true;
    r.crit.top_p_mass = top_p * b.sum_lo;
  }
  r.state.low = b.lo;
  r.state.high = max_key;
  r.state.column = -1;
  return r;
}

// The bracket a threshold search starts from: (key(min) - 1, key(max)], everything above the
// first pass's pivot inside it.
FLASHINFER_HOST_DEVICE Bracket full_bracket(const RowStats& s) {
  Bracket b;
  b.hi = order_key(s.max);
  b.lo = order_key(s.min) - 1u;
  if (b.lo >= b.hi) b.lo = b.hi - 1u;
  b.cnt_lo = s.count;
  b.sum_lo = s.total;
  b.cnt_hi = 0;
  b.sum_hi = 0.f;
  return b;
}

}  // namespace sampling
}  // namespace flashinfer
