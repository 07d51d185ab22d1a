// Sorting-free sampling logic: order keys, the top-k / top-p / min-p set criterion, the
// dual-pivot rejection step and the exact-threshold bracket search, plus the two loop drivers
// that the kernels run (with block-wide sources, sampling.cuh) and that the CPU replay in
// tests/cpp/host/test_sampling.cpp runs (with exact host sources). Pure C++17.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstring>
#include <type_traits>

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

// Branch-free, on the bits (exact whatever the float mode: no flush of denormals).
FLASHINFER_HOST_DEVICE uint32_t order_key(float x) {
  const uint32_t b = float_to_bits(x);
  const uint32_t a = b & 0x7FFFFFFFu;  // |x|
  const uint32_t k = (b & 0x80000000u) ? ~b : (b | 0x80000000u);
  return a > 0x7F800000u ? kKeyNaN : (a == 0u ? kKeyZero : k);
}

// The number with key k (k in [kKeyNegInf, kKeyPosInf]; NaN outside).
FLASHINFER_HOST_DEVICE float key_value(uint32_t k) {
  return bits_to_float((k & 0x80000000u) ? (k & 0x7FFFFFFFu) : ~k);
}

// The float test of "key above pivot": order_key(x) > piv <=> x >= key_floor(piv), for every
// float x (NaN included) and every pivot. key_floor(piv) is the smallest number whose key
// exceeds piv: -inf below key(-inf) (every number), NaN from key(+inf) on (x >= NaN is false
// for all x: no number), else the number with key piv + 1 (-0 for the key 0x7FFFFFFF that -0
// would have without canonicalisation, so x >= -0 keeps both zeros). The per-element loops of
// the kernels compare floats against it; they must not flush denormals (no fast math).
FLASHINFER_HOST_DEVICE float key_floor(uint32_t piv) {
  if (piv < kKeyNegInf) return bits_to_float(0xFF800000u);   // -inf
  if (piv >= kKeyPosInf) return bits_to_float(0x7FC00000u);  // NaN
  return key_value(piv + 1u);
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
  bool has_nan = false;  // (padding included when a kernel pads with NaN: TopK, which ignores it)
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
//   optional, detected by kEarlyAccept (the one-block kernel's source):
//   bool aggregate_or_accept(const uint32_t (&piv)[1], int column, float bound, int (&cnt)[1], float (&sum)[1]):
//       aggregate of one pivot that may stop early and return true once the mass of the
//       candidates with key <= piv[0] (column's mass minus the mass above piv[0], chunk by
//       chunk) exceeds `bound`; false: cnt / sum / columns as aggregate gives them.
// uniform(d): the d-th uniform in [0, 1) of the row's stream.
// Accepts a draw when its value is in the set; otherwise the pivots move the candidate range
// to one of four sub-brackets, so it at least quarters (in value) every round.
template <class S, class = void>
struct HasEarlyAccept : std::false_type {};
template <class S>
struct HasEarlyAccept<S, std::void_t<decltype(S::kEarlyAccept)>> : std::integral_constant<bool, S::kEarlyAccept> {};

FLASHINFER_HD_TEMPLATE
template <class Source, class Uniform>
FLASHINFER_HOST_DEVICE SampleResult rejection_sample(Source& src, const Criterion& c, RejectState s,
                                                     const Uniform& uniform, int max_draws) {
  uint32_t piv[kRejectPivots];
  int cnt[kRejectPivots];
  float sum[kRejectPivots];
  SampleResult r;
  for (int d = 0;;) {  // d: draws so far
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
    // One pivot where one answers the question: the candidates' mass, and the first draw's
    // check when no top-k bound applies (top-p / min-p: most first draws are accepted, and a
    // one-pivot pass costs about half a four-pivot one). A rejected draw then only moves low
    // to its key; every later round splits the bracket with all kRejectPivots pivots.
    if (!drawn || (d == 1 && c.top_k <= 0)) {
      const uint32_t one[1] = {piv[0]};
      int cnt1[1];
      float sum1[1];
      // The first draw under top-p: accepted as soon as the candidates at or below it hold
      // more than mass - top_p_mass (then the mass above it is below top_p_mass); a sampled
      // value is usually mid-distribution, so this settles after a fraction of the row.
      bool accepted = false;
      if constexpr (HasEarlyAccept<Source>::value) {
        if (drawn && c.use_top_p && piv[0] < c.max_key)
          accepted = src.aggregate_or_accept(one, s.column, s.mass - c.top_p_mass, cnt1, sum1);
        else
          src.aggregate(one, cnt1, sum1);
      } else {
        src.aggregate(one, cnt1, sum1);
      }
      if (accepted) return r;
      FLASHINFER_HD_UNROLL
      for (int m = 0; m < kRejectPivots; ++m) {
        piv[m] = one[0];
        cnt[m] = cnt1[0];
        sum[m] = sum1[0];
      }
    } else {
      src.aggregate(piv, cnt, sum);
    }
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
  int col_lo = -1;               // the last aggregate's column whose pivot is lo (-1: none)
  uint32_t width_before = 0;     // hi - lo before the last search round (0: no round yet)
  int inside_before = 0;         // cnt_lo - cnt_hi before it

  FLASHINFER_HOST_DEVICE bool resolved() const { return hi - lo <= 1u || cnt_lo == cnt_hi; }
  // One element left in (lo, hi]: it is in the set (nothing else lies between it and hi), so
  // the kept set {key > lo} is final, though hi is not that element's key.
  FLASHINFER_HOST_DEVICE bool isolated() const { return cnt_lo - cnt_hi == 1; }
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

// Approximate log2 of x > 0, piecewise linear in the float's bits (pivot placement only).
FLASHINFER_HOST_DEVICE float approx_log2(float x) {
  const uint32_t b = float_to_bits(x);
  return static_cast<float>(static_cast<int>(b >> 23) - 127) + static_cast<float>(b & 0x7FFFFFu) * (1.f / 8388608.f);
}

// Top-k once the bracket is known to narrow: one pivot halving the bracket (the bound), and
// seven at the keys where a model of the count puts k - 0.5 +- a spread (log2 of the count
// linear in key between the ends), so one round usually isolates the k-th element: a pivot
// between it and each neighbour (Bracket::isolated). The spread follows the count's noise
// (~sqrt of the elements inside), at least half an element. With at most three elements left
// the model says little: eight pivots split the keys evenly.
FLASHINFER_HOST_DEVICE void count_pivots(const Bracket& b, int k, uint32_t* piv) {
  const uint32_t w = b.hi - b.lo;  // >= 2: the bracket is unresolved
  if (b.cnt_lo - b.cnt_hi <= 3) {  // a few elements, anywhere: split the keys evenly
    FLASHINFER_HD_UNROLL
    for (int m = 0; m < kSelectPivots; ++m) {
      const uint32_t o = static_cast<uint32_t>(uint64_t{w} * static_cast<uint64_t>(m + 1) / (kSelectPivots + 1));
      piv[m] = b.lo + (o < 1u ? 1u : o);  // (< w)
    }
    return;
  }
  piv[0] = b.lo + w / 2u;
  const float fl = approx_log2(static_cast<float>(b.cnt_lo) + 0.5f);
  const float fh = approx_log2(static_cast<float>(b.cnt_hi) + 0.5f);
  const float inside = static_cast<float>(b.cnt_lo - b.cnt_hi);
  float spread = 0.3f * sqrtf(inside);
  if (!(spread >= 0.5f)) spread = 0.5f;
  const float lo_t = static_cast<float>(b.cnt_hi) + 0.25f, hi_t = static_cast<float>(b.cnt_lo) - 0.25f;
  FLASHINFER_HD_UNROLL
  for (int q = 0; q < kSelectPivots - 1; ++q) {
    float t = static_cast<float>(k) - 0.5f + static_cast<float>(q - (kSelectPivots - 2) / 2) * spread;
    t = t < lo_t ? lo_t : (t > hi_t ? hi_t : t);
    // (the count is cnt_lo at lo and cnt_hi at hi; linear in count if the logs coincide)
    const float frac = fl > fh ? (fl - approx_log2(t + 0.5f)) / (fl - fh)
                               : (static_cast<float>(b.cnt_lo) - t) / inside;
    const float off = frac * static_cast<float>(w);  // (NaN: 1)
    uint32_t o = off >= 4294967040.f ? 0xFFFFFF00u : (off >= 1.f ? static_cast<uint32_t>(off) : 1u);
    if (o > w - 1u) o = w - 1u;
    piv[1 + q] = b.lo + o;
  }
}

// The next round's pivots: count_pivots for a top-k search while its rounds pay off (the last
// one narrowed the keys 5x, as select_pivots' rounds do, or cut the elements inside 4x);
// select_pivots otherwise: the first round, top-p, ties at the threshold (only key bisection
// separates them). Every second round at least narrows 5x in key or 4x in count, so the search
// stays bounded (at most ~2 x (14 + 15) rounds; typically 3-4 for top-k on 128K-wide rows).
FLASHINFER_HOST_DEVICE void next_pivots(const Bracket& b, const Criterion& c, uint32_t* piv) {
  const uint32_t w = b.hi - b.lo;
  const bool narrowed = w <= b.width_before / 5u || b.cnt_lo - b.cnt_hi <= b.inside_before / 4;
  if (c.top_k > 0 && !c.use_top_p && b.width_before != 0u && narrowed) {
    count_pivots(b, c.top_k, piv);
  } else {
    select_pivots(b, piv);
  }
}

FLASHINFER_HOST_DEVICE void select_update(Bracket& b, const Criterion& c, const uint32_t* piv,
                                          const int* cnt, const float* sum, int n) {
  b.col_lo = -1;  // the aggregate's columns replaced the previous ones
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
      b.col_lo = m;
    }
  }
}

// Source: aggregate() as above with P = kSelectPivots; bool in_list(); int list_capacity();
// void gather(lo, hi, base_cnt, base_sum): copy the elements with lo < key <= hi to the
// source's list, after which aggregates are base + list (valid for pivots in [lo, hi]).
// keep_all_above: gather everything above lo as soon as it fits (the caller samples from it).
// exact_hi: run until hi is the threshold's own key (hi == lo + 1, what TopKKernel needs);
// otherwise also stop once one element is left in (lo, hi] (the kept set is the same).
FLASHINFER_HD_TEMPLATE
template <class Source>
FLASHINFER_HOST_DEVICE Bracket select_threshold(Source& src, const Criterion& c, Bracket b,
                                                bool keep_all_above, bool exact_hi = true) {
  uint32_t piv[kSelectPivots];
  int cnt[kSelectPivots];
  float sum[kSelectPivots];
  while (!b.resolved() && (exact_hi || !b.isolated())) {
    if (!src.in_list()) {
      const int cap = src.list_capacity();
      if (keep_all_above && b.cnt_lo <= cap) {
        src.gather(b.lo, kKeyMax, 0, 0.f);
      } else if (b.cnt_lo - b.cnt_hi <= cap) {
        src.gather(b.lo, b.hi, b.cnt_hi, b.sum_hi);
      }
    }
    const uint32_t w = b.hi - b.lo;
    const int inside = b.cnt_lo - b.cnt_hi;
    next_pivots(b, c, piv);
    src.aggregate(piv, cnt, sum);
    select_update(b, c, piv, cnt, sum, kSelectPivots);
    b.width_before = w;
    b.inside_before = inside;
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
// columns_current: the source's last aggregate was the search's last round over the row (no
// list), so its column b.col_lo (pivot b.lo) already holds the candidates' mass and the first
// draw needs no aggregate of its own.
FLASHINFER_HOST_DEVICE SamplingStart top_k_first_start(uint32_t max_key, float top_p, const Bracket& b,
                                                       bool columns_current = false) {
  SamplingStart r;
  r.crit.max_key = max_key;
  if (top_p_active(top_p)) {
    r.crit.use_top_p = true;
    r.crit.top_p_mass = top_p * b.sum_lo;
  }
  r.state.low = b.lo;
  r.state.high = max_key;
  r.state.column = -1;
  if (columns_current && b.col_lo >= 0) {
    r.state.column = b.col_lo;
    r.state.mass = b.sum_lo;
  }
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
