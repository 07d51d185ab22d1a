// The attention state (o, lse) of a query row over a set of keys, and the one merge of two
// states. lse is base 2: lse = log2(sum_j exp(s_j)). The empty state (lse = -inf, o = 0) is
// the identity; merging two empty states gives the empty state, never NaN. Pure C++17:
// split-KV decode, cascade merges and ctest all call these functions.
#pragma once

#include <cmath>

#include "../config.h"
#include "../fast_math.h"

namespace flashinfer {
namespace attention {

// INFINITY, not std::numeric_limits (a constexpr __host__ function nvcc rejects in device code
// without --expt-relaxed-constexpr).
FLASHINFER_HOST_DEVICE float neg_inf() { return -INFINITY; }

// How to combine two states: o = wa * o_a + wb * o_b, lse = the merged lse.
struct MergeWeights {
  float wa, wb, lse;
};

FLASHINFER_HOST_DEVICE MergeWeights merge_weights(float lse_a, float lse_b) {
  const float m = lse_a > lse_b ? lse_a : lse_b;
  if (m == neg_inf()) return {0.f, 0.f, neg_inf()};  // both empty
  const float ea = fast_exp2(lse_a - m), eb = fast_exp2(lse_b - m);  // one of them is exactly 1
  const float sum = ea + eb, inv = fast_rcp(sum);  // sum in [1, 2]
  return {ea * inv, eb * inv, m + fast_log2(sum)};
}

// Merges state b into state a (n values of o), in place.
FLASHINFER_HOST_DEVICE void merge_state(float* o_a, float* lse_a, const float* o_b, float lse_b, int n) {
  const MergeWeights w = merge_weights(*lse_a, lse_b);
  for (int i = 0; i < n; ++i) o_a[i] = w.wa * o_a[i] + w.wb * o_b[i];
  *lse_a = w.lse;
}

// The state a kernel accumulates while streaming keys (online softmax, base 2): running max
// m of the log2-scaled scores, denominator d = sum 2^(s - m), and o = sum 2^(s - m) * v kept
// unnormalized. to_lse() / the 1/d factor turn it into a merge-ready (o, lse) state.
struct OnlineSoftmax {
  float m = neg_inf();
  float d = 0.f;

  // Adds a score (log2 units); returns the factor the caller must apply to its running o
  // (scale) and the weight of the new value (p).
  FLASHINFER_HOST_DEVICE void update(float s, float* scale, float* p) {
    const float m_new = s > m ? s : m;
    if (m_new == neg_inf()) {  // masked key and nothing seen yet
      *scale = 1.f;
      *p = 0.f;
      return;
    }
    *scale = fast_exp2(m - m_new);
    *p = fast_exp2(s - m_new);
    d = d * *scale + *p;
    m = m_new;
  }
  FLASHINFER_HOST_DEVICE float lse() const { return d > 0.f ? m + fast_log2(d) : neg_inf(); }
  FLASHINFER_HOST_DEVICE float inv_d() const { return d > 0.f ? fast_rcp(d) : 0.f; }
};

}  // namespace attention
}  // namespace flashinfer
