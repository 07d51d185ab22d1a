// Host replay of sampling.h's loops: an exact Source (float sums in index order, optional
// gathered list), the per-row sampling composition of sampling.cuh's SamplingKernel, and the
// float64 filtered-set definitions. Shared by test_sampling.cpp and the emulated kernel test
// (tests/cpp/emu). Pure C++17.
#pragma once

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "check.h"
#include "flashinfer/philox.h"
#include "flashinfer/sampling.h"

namespace sampling_replay {

using namespace flashinfer;
using namespace flashinfer::sampling;


// The row or, after gather(), base + list: what the kernel's block-wide sources compute, with
// float sums in index order.
struct HostSource {
  const std::vector<float>& p;
  int cap = 0;
  bool listed = false;
  std::vector<int> list;
  int base_cnt = 0;
  float base_sum = 0.f;
  int passes = 0;
  int gpasses = 0;  // aggregates over the whole row
  bool shuffle_sums = false;  // sum each pivot in its own random order (non-monotone rounding)
  std::mt19937 rng{7};

  explicit HostSource(const std::vector<float>& probs, int capacity = 0) : p(probs), cap(capacity) {}

  std::vector<int> order() const {
    std::vector<int> o;
    if (listed) return list;
    o.resize(p.size());
    std::iota(o.begin(), o.end(), 0);
    return o;
  }
  template <int P>
  void aggregate(const uint32_t (&piv)[P], int (&cnt)[P], float (&sum)[P]) {
    ++passes;
    gpasses += !listed;
    std::vector<int> o = order();
    for (int m = 0; m < P; ++m) {
      if (shuffle_sums) std::shuffle(o.begin(), o.end(), rng);
      cnt[m] = listed ? base_cnt : 0;
      sum[m] = listed ? base_sum : 0.f;
      for (int i : o) {
        if (order_key(p[i]) > piv[m]) {
          ++cnt[m];
          sum[m] += p[i];
        }
      }
    }
  }
  Pick pick(uint32_t low, int, float u) const {
    float run = 0.f;
    Pick last;
    for (int i : order()) {
      if (order_key(p[i]) <= low) continue;
      run += p[i];
      last.index = i;
      last.value = p[i];
      if (run > u) return last;
    }
    return last;
  }
  bool in_list() const { return listed; }
  int list_capacity() const { return cap; }
  void gather(uint32_t lo, uint32_t hi, int bc, float bs) {
    list.clear();
    for (int i = 0; i < static_cast<int>(p.size()); ++i) {
      const uint32_t k = order_key(p[i]);
      if (k > lo && k <= hi) list.push_back(i);
    }
    CHECK(static_cast<int>(list.size()) <= cap);
    listed = true;
    base_cnt = bc;
    base_sum = bs;
  }
};

inline RowStats first_pass(const std::vector<float>& p) {
  RowStats s;
  s.max = -INFINITY;
  s.min = INFINITY;
  for (float x : p) {
    s.has_nan |= x != x;
    s.max = std::max(s.max, x);
    if (order_key(x) > kKeyZero) {
      s.total += x;
      s.min = std::min(s.min, x);
      ++s.count;
    }
  }
  return s;
}

enum class Mode { kJoint, kTopKFirst };

struct Run {
  SampleResult r;
  Bracket topk;  // top-k-first: the resolved top-k bracket
  bool used_topk = false;
};

// One sample as the kernel takes it (sampling.cuh's SamplingKernel), on the CPU.
inline Run sample_row(const std::vector<float>& p, const RowFilter& f, Mode mode, const PhiloxStream& stream,
               int cap = 16, bool shuffle = false) {
  const RowStats s = first_pass(p);
  auto uniform = [&](int d) { return uniform_co(stream.word(static_cast<uint32_t>(d))); };
  HostSource src(p, cap);
  src.shuffle_sums = shuffle;
  Run run;
  if (mode == Mode::kTopKFirst && top_k_active(f.top_k, s.count)) {
    Criterion ck;
    ck.top_k = f.top_k;
    ck.max_key = order_key(s.max);
    run.topk = select_threshold(src, ck, full_bracket(s), true, false);
    run.used_topk = true;
    const SamplingStart st = top_k_first_start(order_key(s.max), f.top_p, run.topk, !src.listed);
    const bool all_above = src.listed && src.base_cnt == 0;
    if (!all_above) {
      HostSource row(p);
      row.shuffle_sums = shuffle;
      run.r = rejection_sample(row, st.crit, st.state, uniform, kMaxDraws);
    } else {
      run.r = rejection_sample(src, st.crit, st.state, uniform, kMaxDraws);
    }
    return run;
  }
  RowFilter g = f;
  if (mode == Mode::kTopKFirst) g.top_k = 0;
  const SamplingStart st = joint_start(s, g);
  const bool filtered = st.crit.filters();
  run.r = rejection_sample(src, st.crit, st.state, uniform, filtered ? kMaxDraws : 1);
  return run;
}

// The filtered set by definition, in double: top-k = {#greater < k}, top-p = {mass greater <
// top_p * total}, min-p = {p >= min_p * max}, the row maximum always in, zeros never.
inline std::vector<bool> exact_set(const std::vector<float>& p, const RowFilter& f, Mode mode, double slack = 0.0) {
  const int n = static_cast<int>(p.size());
  double total = 0, mx = 0;
  int pos = 0;
  for (float x : p)
    if (x > 0) total += x, mx = std::max(mx, double(x)), ++pos;
  // Positive values in descending order; #greater and the mass greater via binary search.
  std::vector<double> desc;
  for (float x : p)
    if (x > 0) desc.push_back(x);
  std::sort(desc.rbegin(), desc.rend());
  std::vector<double> prefix(desc.size() + 1, 0.0);
  for (size_t i = 0; i < desc.size(); ++i) prefix[i + 1] = prefix[i] + desc[i];
  auto greater = [&](double v) {  // elements strictly greater than v
    return static_cast<int>(std::lower_bound(desc.begin(), desc.end(), v, std::greater<double>()) - desc.begin());
  };
  const bool use_k = f.top_k > 0 && f.top_k < pos;
  const double kth = use_k ? desc[f.top_k - 1] : 0.0;
  const int n_ge_kth = static_cast<int>(
      std::upper_bound(desc.begin(), desc.end(), kth, std::greater<double>()) - desc.begin());
  const double mass_k = use_k ? prefix[n_ge_kth] : total;
  const double ref_mass = mode == Mode::kTopKFirst ? mass_k : total;
  std::vector<bool> in(n, false);
  for (int i = 0; i < n; ++i) {
    if (!(p[i] > 0)) continue;
    if (p[i] == mx) {
      in[i] = true;
      continue;
    }
    const int g = greater(p[i]);
    bool ok = !use_k || g < f.top_k;
    if (f.top_p < 1.f) ok = ok && prefix[g] < double(f.top_p) * ref_mass * (1 + slack);
    if (f.min_p > 0.f) ok = ok && p[i] >= double(f.min_p) * mx;
    in[i] = ok;
  }
  return in;
}

inline std::vector<float> normalized(std::vector<float> p) {
  double s = 0;
  for (float x : p) s += x;
  for (float& x : p) x = static_cast<float>(x / s);
  return p;
}

struct Case {
  const char* name;
  std::vector<float> p;
};

inline std::vector<Case> distributions() {
  std::vector<Case> cs;
  std::mt19937 g(42);
  std::normal_distribution<float> nd;
  cs.push_back({"ties", normalized({3, 3, 3, 2, 2, 2, 2, 1, 1, 1, 1, 1, 0.5f, 0.5f, 0, 0})});
  std::vector<float> onehot(37, 0.f);
  onehot[19] = 1.f;
  cs.push_back({"one-hot", onehot});
  cs.push_back({"uniform", std::vector<float>(50, 0.02f)});
  std::vector<float> tail(64, 0.f);
  for (int i = 0; i < 32; ++i) tail[i] = std::exp(nd(g));
  cs.push_back({"zero-tail", normalized(tail)});
  std::vector<float> spike(300, 1e-9f);
  spike[123] = 1.f;
  for (int i = 0; i < 20; ++i) spike[i] = 1e-40f;  // denormals
  cs.push_back({"spike+denormals", spike});
  std::vector<float> geo(200);
  for (int i = 0; i < 200; ++i) geo[i] = std::ldexp(1.f, -i);  // 2^-i, underflows to 0
  cs.push_back({"geometric", geo});
  std::vector<float> rn(257);
  for (float& x : rn) x = std::exp(nd(g));
  cs.push_back({"randn", normalized(rn)});
  std::vector<float> rn5(257);
  for (float& x : rn5) x = std::exp(5 * nd(g));
  cs.push_back({"randn5-unnormalized", rn5});
  std::uniform_real_distribution<float> ud(0.f, 1.f);
  std::vector<float> flat(500);
  for (float& x : flat) x = ud(g) * 0.37f;
  cs.push_back({"rand-unnormalized", flat});
  cs.push_back({"single", {0.7f}});
  cs.push_back({"two-equal", {0.f, 0.5f, 0.5f, 0.f}});
  return cs;
}

// Empirical frequencies of many replays against the filtered, renormalized distribution.
inline double chi_square(const std::vector<int>& counts, const std::vector<double>& prob, int n, bool* zero_hit) {
  double stat = 0;
  *zero_hit = false;
  for (size_t i = 0; i < counts.size(); ++i) {
    const double e = prob[i] * n;
    if (e == 0) {
      *zero_hit |= counts[i] > 0;
      continue;
    }
    stat += (counts[i] - e) * (counts[i] - e) / e;
  }
  return stat;
}

inline std::vector<double> filtered_dist(const std::vector<float>& p, const std::vector<bool>& in) {
  std::vector<double> d(p.size(), 0.0);
  double s = 0;
  for (size_t i = 0; i < p.size(); ++i)
    if (in[i]) s += p[i];
  for (size_t i = 0; i < p.size(); ++i)
    if (in[i]) d[i] = p[i] / s;
  return d;
}

}  // namespace sampling_replay
