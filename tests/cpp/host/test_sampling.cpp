// CPU replay of the sampling loops in sampling.h with exact host sources: every draw of the
// dual-pivot rejection loop terminates inside the top-k / top-p / min-p set (ties, one-hot,
// uniform, zero tails, denormals, k >= vocab, p = 1, min_p = 0, draw-budget fallback), its
// empirical distribution is the filtered one (chi-square, and a wrong reference fails it),
// the exact-threshold search keeps exactly the top-k / top-p set through both gather modes,
// and the launch layout covers every element.
#include <algorithm>
#include <cfloat>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <functional>
#include <numeric>
#include <random>
#include <vector>

#include "check.h"
#include "flashinfer/sampling_params.h"
#include "sampling_replay.h"

using namespace flashinfer;
using namespace flashinfer::sampling;

namespace {

using namespace sampling_replay;

void check_membership() {
  const RowFilter filters[] = {
      {0, 1.f, 0.f},      {1, 1.f, 0.f},     {2, 1.f, 0.f},      {5, 1.f, 0.f},    {50, 1.f, 0.f},
      {100000, 1.f, 0.f}, {0, 0.1f, 0.f},    {0, 0.5f, 0.f},     {0, 0.9f, 0.f},   {0, 0.999f, 0.f},
      {0, 0.f, 0.f},      {0, 1.f, 0.05f},   {0, 1.f, 0.5f},     {0, 1.f, 1.f},    {0, 1.f, 2.f},
      {3, 0.5f, 0.f},     {20, 0.9f, 0.f},   {-1, 1.f, 0.f},     {7, 0.3f, 0.f},   {1, 0.f, 0.f},
  };
  for (const Case& c : distributions()) {
    for (const RowFilter& f : filters) {
      for (Mode mode : {Mode::kJoint, Mode::kTopKFirst}) {
        const std::vector<bool> in = exact_set(c.p, f, mode, 1e-5);
        const std::vector<bool> in_tight = exact_set(c.p, f, mode, -1e-5);
        for (uint32_t seed = 0; seed < 40; ++seed) {
          for (bool shuffle : {false, true}) {
            const Run run = sample_row(c.p, f, mode, PhiloxStream{seed, 4u * seed, seed % 3}, 3, shuffle);
            const int64_t i = run.r.index;
            const bool ok = i >= 0 && i < static_cast<int64_t>(c.p.size()) && c.p[i] > 0 && in[i];
            if (!ok) {
              std::printf("%s k=%d p=%g min_p=%g mode=%d seed=%u shuffle=%d: got %lld (p=%g)\n", c.name, f.top_k,
                          f.top_p, f.min_p, int(mode), seed, int(shuffle), static_cast<long long>(i),
                          i >= 0 ? c.p[i] : -1.f);
            }
            CHECK(ok);
            CHECK(run.r.draws >= 1 && run.r.draws <= kMaxDraws);
            if (ok && !shuffle) (void)in_tight;
          }
        }
      }
    }
  }
}

// Top-k alone keeps exactly the ties at the k-th value; draws never leave it, at vocab 128256
// too (the budget-exhaustion fallback included when forced).
void check_large_vocab() {
  std::mt19937 g(3);
  std::normal_distribution<float> nd;
  std::vector<float> p(128256);
  for (float& x : p) x = std::exp(nd(g));
  p = normalized(p);
  for (int k : {1, 50, 1000}) {
    const RowFilter f{k, 1.f, 0.f};
    const std::vector<bool> in = exact_set(p, f, Mode::kJoint);
    for (uint32_t seed = 0; seed < 4; ++seed) {
      const Run a = sample_row(p, f, Mode::kJoint, PhiloxStream{seed, 0, 0});
      CHECK(a.r.index >= 0 && in[a.r.index]);
      const Run b = sample_row(p, f, Mode::kTopKFirst, PhiloxStream{seed, 0, 0}, 8192);
      CHECK(b.r.index >= 0 && in[b.r.index]);
    }
  }
  // A two-draw budget forces the fallback: still inside the set.
  const RowStats s = first_pass(p);
  const SamplingStart st = joint_start(s, RowFilter{50, 1.f, 0.f});
  const std::vector<bool> in = exact_set(p, RowFilter{50, 1.f, 0.f}, Mode::kJoint);
  for (uint32_t seed = 0; seed < 8; ++seed) {
    HostSource src(p);
    const PhiloxStream stream{seed, 0, 1};
    auto uniform = [&](int d) { return uniform_co(stream.word(static_cast<uint32_t>(d))); };
    const SampleResult r = rejection_sample(src, st.crit, st.state, uniform, 2);
    CHECK(r.draws <= 2 && r.index >= 0 && in[r.index]);
  }
}

void check_distribution() {
  const std::vector<float> p =
      normalized({0.20f, 0.02f, 0.15f, 0.15f, 0.08f, 0.30f, 0.01f, 0.0f, 0.05f, 0.04f, 0.10f, 0.03f, 0.09f});
  struct F {
    RowFilter f;
    Mode mode;
  };
  const F fs[] = {{{0, 1.f, 0.f}, Mode::kJoint},   {{4, 1.f, 0.f}, Mode::kJoint},   {{0, 0.6f, 0.f}, Mode::kJoint},
                  {{0, 1.f, 0.25f}, Mode::kJoint},  {{5, 0.7f, 0.f}, Mode::kJoint},  {{5, 0.7f, 0.f}, Mode::kTopKFirst},
                  {{6, 0.8f, 0.f}, Mode::kTopKFirst}, {{2, 0.9f, 0.f}, Mode::kTopKFirst}};
  const int n = 100000;
  int wrong_checked = 0;
  const int df_max = static_cast<int>(p.size());
  const double bound = df_max + 6 * std::sqrt(2.0 * df_max);
  for (const F& x : fs) {
    const std::vector<bool> in = exact_set(p, x.f, x.mode);
    std::vector<int> counts(p.size(), 0);
    for (int t = 0; t < n; ++t) {
      const Run r = sample_row(p, x.f, x.mode, PhiloxStream{2024, 64, static_cast<uint32_t>(t)});
      ++counts[r.r.index];
    }
    bool zero_hit = false;
    const double stat = chi_square(counts, filtered_dist(p, in), n, &zero_hit);
    if (!(stat < bound) || zero_hit)
      std::printf("distribution k=%d p=%g min_p=%g mode=%d: chi2=%.1f (bound %.1f) zero_hit=%d\n", x.f.top_k,
                  x.f.top_p, x.f.min_p, int(x.mode), stat, bound, int(zero_hit));
    CHECK(stat < bound);
    CHECK(!zero_hit);
    // A wrong reference (top-k off by one, or top-p applied to the wrong mass) fails the test.
    if (x.f.top_k > 0) {
      RowFilter wrong = x.f;
      wrong.top_k += 1;
      const std::vector<bool> in_wrong = exact_set(p, wrong, x.mode);
      if (in_wrong != in) {  // (top-p may bind first, making k + 1 the same set)
        bool zh = false;
        const double sw = chi_square(counts, filtered_dist(p, in_wrong), n, &zh);
        CHECK(sw > bound || zh);
        ++wrong_checked;
      }
    }
    if (x.f.top_p < 1.f && x.f.top_k > 0) {
      const Mode other = x.mode == Mode::kJoint ? Mode::kTopKFirst : Mode::kJoint;
      const std::vector<bool> in_other = exact_set(p, x.f, other);
      if (in_other != in) {
        bool zh = false;
        const double sw = chi_square(counts, filtered_dist(p, in_other), n, &zh);
        CHECK(sw > bound || zh);
        ++wrong_checked;
      }
    }
  }
  std::printf("wrong references checked: %d\n", wrong_checked);
  CHECK(wrong_checked >= 4);
}

// The exact-threshold search keeps exactly {p >= k-th largest} (top-k) and the top-p set,
// whether it resolves on the row, on a bracket gather or on an all-above gather.
void check_select() {
  for (const Case& c : distributions()) {
    const RowStats s = first_pass(c.p);
    for (int k : {1, 2, 3, 10, 50, 200}) {
      if (!top_k_active(k, s.count)) continue;
      std::vector<float> sorted = c.p;
      std::sort(sorted.rbegin(), sorted.rend());
      const float kth = sorted[k - 1];
      for (int cap : {0, 4, 64, 100000}) {
        for (bool all_above : {false, true}) {
          HostSource src(c.p, cap);
          Criterion ck;
          ck.top_k = k;
          ck.max_key = order_key(s.max);
          const Bracket b = select_threshold(src, ck, full_bracket(s), all_above);
          int kept = 0;
          for (float x : c.p) {
            const bool keep = order_key(x) > b.lo;
            CHECK(keep == (x >= kth && x > 0));
            kept += keep;
          }
          CHECK(kept == b.cnt_lo);
          CHECK(src.passes <= 40);
        }
      }
    }
    for (float top_p : {0.1f, 0.5f, 0.9f, 0.99f}) {
      const std::vector<bool> loose = exact_set(c.p, RowFilter{0, top_p, 0.f}, Mode::kJoint, 1e-5);
      const std::vector<bool> tight = exact_set(c.p, RowFilter{0, top_p, 0.f}, Mode::kJoint, -1e-5);
      for (int cap : {0, 4, 100000}) {
        HostSource src(c.p, cap);
        Criterion cp;
        cp.use_top_p = true;
        cp.top_p_mass = top_p * s.total;
        cp.max_key = order_key(s.max);
        const Bracket b = select_threshold(src, cp, full_bracket(s), false);
        for (size_t i = 0; i < c.p.size(); ++i) {
          const bool keep = order_key(c.p[i]) > b.lo;
          if (tight[i]) CHECK(keep);
          if (!loose[i]) CHECK(!keep);
        }
      }
    }
  }
}

// A HostSource that remembers its last aggregate's pivots (col_lo must name lo's column).
struct RecordingSource : HostSource {
  uint32_t last[kSelectPivots] = {};
  using HostSource::HostSource;
  template <int P>
  void aggregate(const uint32_t (&piv)[P], int (&cnt)[P], float (&sum)[P]) {
    HostSource::aggregate(piv, cnt, sum);
    for (int m = 0; m < P && m < kSelectPivots; ++m) last[m] = piv[m];
  }
};

std::vector<float> softmax_randn(std::mt19937& g, int n, float scale) {
  std::normal_distribution<float> nd;
  std::vector<float> lg(size_t(n), 0.f);
  for (float& x : lg) x = scale * nd(g);
  const float mx = *std::max_element(lg.begin(), lg.end());
  std::vector<float> p(static_cast<size_t>(n));
  double s = 0;
  for (int i = 0; i < n; ++i) s += (p[size_t(i)] = std::exp(lg[size_t(i)] - mx));
  for (float& x : p) x = static_cast<float>(x / s);
  return p;
}

// The search with exact_hi = false (sampling, renorm) keeps exactly the set exact_hi = true
// keeps, stopping once one element is left in (lo, hi]; exact_hi = true ends at the k-th
// largest's own key (TopKKernel). col_lo names the last aggregate's column of pivot lo, and
// top_k_first_start takes the candidates' mass from it. On the bench's rows (softmax of randn
// and of 4 * randn, 128256 wide) top-k = 50 takes a few rounds (10-12 with the key/value
// pivots alone).
void check_select_rounds() {
  std::vector<Case> cases = distributions();
  std::mt19937 g(5);
  std::vector<float> ties(4000);
  for (size_t i = 0; i < ties.size(); ++i) ties[i] = static_cast<float>(1 + (i * 7919) % 13);  // 13 values, tied
  cases.push_back({"many-ties", normalized(ties)});
  std::vector<float> near(3000);
  for (size_t i = 0; i < near.size(); ++i) near[i] = 1.f + static_cast<float>(i % 1000) * 1.1920929e-7f;  // adjacent keys
  cases.push_back({"adjacent-keys", normalized(near)});
  cases.push_back({"softmax-randn", softmax_randn(g, 20000, 1.f)});
  cases.push_back({"softmax-4randn", softmax_randn(g, 20000, 4.f)});
  for (const Case& c : cases) {
    const RowStats s = first_pass(c.p);
    std::vector<float> sorted = c.p;
    std::sort(sorted.rbegin(), sorted.rend());
    for (int k : {1, 2, 3, 7, 50, 200, 1000, s.count - 1, s.count, s.count + 5}) {
      if (!top_k_active(k, s.count)) continue;
      const float kth = sorted[size_t(k - 1)];
      int want = 0;
      for (float x : c.p) want += x >= kth && x > 0;
      for (int cap : {0, 64}) {
        for (bool exact : {true, false}) {
          RecordingSource src(c.p, cap);
          Criterion ck;
          ck.top_k = k;
          ck.max_key = order_key(s.max);
          const Bracket b = select_threshold(src, ck, full_bracket(s), true, exact);
          int kept = 0;
          for (float x : c.p) kept += order_key(x) > b.lo;
          CHECK(kept == want && b.cnt_lo == want);
          CHECK(b.resolved() || (!exact && b.isolated()));
          if (exact) CHECK(b.hi == order_key(kth) && b.cnt_lo - b.cnt_hi == want - b.cnt_hi);
          CHECK(src.passes <= 40);
          if (b.col_lo >= 0) CHECK(src.passes > 0 && src.last[b.col_lo] == b.lo);
          if (!src.listed && b.col_lo >= 0) {
            const SamplingStart st = top_k_first_start(ck.max_key, 0.9f, b, true);
            CHECK(st.state.column == b.col_lo && st.state.mass == b.sum_lo && st.state.low == b.lo);
            // the mass the rejection loop's own first aggregate would report, bit for bit
            uint32_t piv[kRejectPivots];
            int cnt[kRejectPivots];
            float sum[kRejectPivots];
            for (uint32_t& x : piv) x = b.lo;
            src.aggregate(piv, cnt, sum);
            CHECK(sum[0] == b.sum_lo && cnt[0] == b.cnt_lo);
          }
          CHECK(top_k_first_start(ck.max_key, 0.9f, b, false).state.column == -1);
        }
      }
    }
  }
  // The bench's rows: rounds of the top-k = 50 search without a list (the cluster path).
  for (float scale : {1.f, 4.f}) {
    int total = 0, worst = 0;
    const int rows = 6;
    for (int r = 0; r < rows; ++r) {
      const std::vector<float> p = softmax_randn(g, 128256, scale);
      const RowStats s = first_pass(p);
      HostSource src(p, 0);
      Criterion ck;
      ck.top_k = 50;
      ck.max_key = order_key(s.max);
      const Bracket b = select_threshold(src, ck, full_bracket(s), true, false);
      CHECK(b.cnt_lo == 50);
      total += src.passes;
      worst = std::max(worst, src.passes);
    }
    std::printf("top-k 50 search rounds on softmax(%g * randn), 128256: mean %.2f, max %d\n", scale,
                double(total) / rows, worst);
    CHECK(total <= 5 * rows && worst <= 8);
  }
  // Pivots lie strictly inside any unresolved bracket, for every count layout.
  for (uint32_t lo : {kKeyZero, order_key(1e-6f), 0x00000001u}) {
    for (uint32_t w : {2u, 3u, 9u, 1000u, 0x1000000u, 0xFFFFFFFEu - lo}) {
      for (int cl : {2, 3, 4, 51, 128256}) {
        for (int ch : {0, 1, cl - 1}) {
          if (ch >= cl) continue;
          for (int k : {ch + 1, (ch + cl + 1) / 2, cl}) {
            if (k <= ch || k > cl) continue;
            Bracket b;
            b.lo = lo;
            b.hi = lo + w;
            b.cnt_lo = cl;
            b.cnt_hi = ch;
            uint32_t sp[kSelectPivots];
            count_pivots(b, k, sp);
            int inside = 0;
            for (uint32_t x : sp) {
              CHECK(x > b.lo && x < b.hi);
              inside += x > b.lo && x < b.hi;
            }
            CHECK(inside == kSelectPivots);
            Criterion c;
            c.top_k = k;
            b.width_before = w;  // not narrowing: select_pivots
            next_pivots(b, c, sp);
            uint32_t ref[kSelectPivots];
            select_pivots(b, ref);
            CHECK(std::equal(sp, sp + kSelectPivots, ref));
          }
        }
      }
    }
  }
}

void check_keys() {
  const float xs[] = {-INFINITY, -3.4e38f, -1.f, -1e-40f, -0.f, 0.f, 1e-45f, 1e-40f, 1e-30f, 0.5f, 1.f, 3.4e38f, INFINITY};
  for (size_t i = 0; i < sizeof(xs) / sizeof(xs[0]); ++i) {
    CHECK(key_value(order_key(xs[i])) == xs[i]);
    for (size_t j = 0; j < sizeof(xs) / sizeof(xs[0]); ++j) {
      CHECK((xs[i] < xs[j]) == (order_key(xs[i]) < order_key(xs[j])));
      CHECK((xs[i] == xs[j]) == (order_key(xs[i]) == order_key(xs[j])));
    }
  }
  CHECK(order_key(NAN) == kKeyNaN && order_key(-NAN) == kKeyNaN);
  CHECK(order_key(-INFINITY) == kKeyNegInf && order_key(INFINITY) == kKeyPosInf && order_key(-0.f) == kKeyZero);
  // The rejection pivots stay sorted and inside [x, high].
  uint32_t piv[kRejectPivots];
  reject_pivots(1e-30f, 0.75f, piv);
  for (int m = 1; m < kRejectPivots; ++m) CHECK(piv[m] >= piv[m - 1]);
  CHECK(piv[0] == order_key(1e-30f) && piv[kRejectPivots - 1] <= order_key(0.75f));
  // Select pivots lie strictly inside any unresolved bracket.
  for (uint32_t lo : {kKeyNegInf, kKeyZero, order_key(0.3f), 0x80000005u}) {
    for (uint32_t w : {2u, 3u, 7u, 1000u, 0x1000000u}) {
      Bracket b;
      b.lo = lo;
      b.hi = lo + w;
      b.cnt_lo = 10;
      b.cnt_hi = 1;
      uint32_t sp[kSelectPivots];
      select_pivots(b, sp);
      int inside = 0;
      for (uint32_t k : sp) {
        CHECK(k >= b.lo && k <= b.hi);
        inside += k > b.lo && k < b.hi;
      }
      CHECK(inside >= 1);
    }
  }
}

// The kernels' float test equals the key test: order_key(x) > piv <=> x >= key_floor(piv), for
// every special float (NaN, both zeros, denormals, FLT_MIN, FLT_MAX, infinities) and random
// ones against pivots that are their keys, +-1, around the zero and infinity keys, below
// key(-inf), and random keys. And the -inf padding is in no set of a pivot >= kKeyNegInf.
void check_key_floor() {
  std::mt19937 g(11);
  std::vector<float> xs = {0.f,          -0.f,       1e-45f,     -1e-45f,   FLT_MIN, -FLT_MIN, FLT_MAX, -FLT_MAX,
                           INFINITY,     -INFINITY,  NAN,        -NAN,      1.f,     -1.f,     0.5f,    3e-39f,
                           -3e-39f,      FLT_EPSILON, 1e-30f,     -1e30f};
  std::uniform_int_distribution<uint32_t> bits;
  for (int i = 0; i < 300; ++i) xs.push_back(bits_to_float(bits(g)));  // NaNs and denormals included
  std::vector<uint32_t> pivs = {0u,          1u,          kKeyNegInf - 1u, kKeyNegInf, kKeyNegInf + 1u,
                                0x7FFFFFFEu, 0x7FFFFFFFu, kKeyZero,        kKeyZero + 1u, kKeyPosInf - 1u,
                                kKeyPosInf,  kKeyPosInf + 1u, kKeyMax - 1u, kKeyMax};
  const size_t nx = xs.size();
  for (size_t i = 0; i < nx; ++i) {
    const uint32_t k = order_key(xs[i]);
    for (uint32_t d : {0u, 1u, 0xFFFFFFFFu}) pivs.push_back(k + d);
  }
  std::uniform_int_distribution<uint32_t> keys(kKeyNegInf, kKeyMax);
  for (int i = 0; i < 300; ++i) pivs.push_back(keys(g));
  int bad = 0;
  for (uint32_t piv : pivs) {
    const float t = key_floor(piv);
    for (float x : xs) bad += (order_key(x) > piv) != (x >= t);
    if (piv >= kKeyNegInf) CHECK(!(-INFINITY >= t));  // padding never counts
  }
  CHECK(bad == 0);
  CHECK(key_floor(kKeyZero) == 1e-45f && key_floor(0x7FFFFFFFu) == 0.f && key_floor(kKeyNegInf) == -FLT_MAX);
  CHECK(std::signbit(key_floor(0x7FFFFFFEu)) && key_floor(0x7FFFFFFEu) == 0.f);  // -0: x >= -0 keeps +0 and -0
  CHECK(key_floor(0u) == -INFINITY && key_floor(kKeyPosInf - 1u) == INFINITY && std::isnan(key_floor(kKeyPosInf)));
  // order_key is branch-free now: the same keys as the definition.
  for (float x : xs) {
    uint32_t b;
    std::memcpy(&b, &x, 4);
    const uint32_t want = x != x ? kKeyNaN : (x == 0.f ? kKeyZero : ((b & 0x80000000u) ? ~b : (b | 0x80000000u)));
    CHECK(order_key(x) == want);
  }
}

void check_layout() {
  for (int vocab : {1, 3, 8, 111, 128, 1000, 1024, 4096, 32000, 128256, 152064, 256000, 1 << 20, 3000001}) {
    for (int eb : {4, 2}) {
      for (bool list : {false, true}) {
        for (int64_t budget : {int64_t{0}, int64_t{48} * 1024, int64_t{227} * 1024 - kStaticSmemReserve}) {
          const ScanLayout l = scan_layout(vocab, eb, list, budget);
          CHECK(l.threads >= 32 && l.threads <= kMaxThreads && l.threads % 32 == 0);
          CHECK(l.vec * eb == 16 && l.tile == l.threads * l.vec);
          CHECK(int64_t{l.steps} * l.threads * kStepElems >= vocab);               // every element owned
          CHECK(int64_t{l.steps - 1} * l.threads * kStepElems < std::max(vocab, 1));  // no empty step
          CHECK(l.chunks * l.steps_per_chunk >= l.steps && (l.chunks - 1) * l.steps_per_chunk < l.steps);
          CHECK(l.chunks <= kMaxChunks);
          CHECK(l.cache_elems % l.tile == 0 && l.cache_elems <= vocab);
          CHECK(l.list_cap == (list ? std::min(vocab, kListCapacity) : 0));
          if (budget > 0 && l.cache_elems > 0) CHECK(l.smem_bytes <= budget);
          CHECK(l.off_table % 16 == 0 && l.off_csum % 16 == 0 && l.off_list_val % 16 == 0 && l.off_list_idx % 16 == 0);
        }
      }
    }
  }
  // The benchmark shape: 512 threads, 8 chunks of one step, over 200 KiB of the row cached.
  const ScanLayout l = scan_layout(128256, 4, false, int64_t{227} * 1024 - kStaticSmemReserve);
  CHECK(l.threads == 512 && l.steps == 8 && l.chunks == 8 && l.cache_elems >= 51200);
}

}  // namespace

// The cluster path's split and per-CTA layout: the automatic rule (fill the SMs at small
// batches, at least enough CTAs for the slice to fit), forced sizes, and a layout that caches
// every element of the slice with the exchange area inside the budget.
void check_cluster_split() {
  const int64_t budget = int64_t{227} * 1024 - kStaticSmemReserve;
  CHECK(cluster_split(1, 128256, 132, budget, 16, 0).size == 16);
  CHECK(cluster_split(8, 128256, 132, budget, 16, 0).size == 16);
  CHECK(cluster_split(9, 128256, 132, budget, 16, 0).size == 1);    // batch * 16 > #SMs: one block
  CHECK(cluster_split(32, 128256, 132, budget, 16, 0).size == 1);
  CHECK(cluster_split(64, 128256, 132, budget, 16, 0).size == 1);
  CHECK(cluster_split(256, 128256, 132, budget, 16, 0).size == 1);
  CHECK(cluster_split(256, 128256, 132, budget, 16, 8).size == 8);  // forced
  CHECK(cluster_split(256, 128256, 132, budget, 16, 2).size == 4);  // forced 2 does not fit: 4
  CHECK(cluster_split(256, 128256, 132, budget, 16, 5).size == 4);  // powers of two
  CHECK(cluster_split(1, 128256, 132, budget, 16, 1).size == 1);
  CHECK(cluster_split(1, 4000, 132, budget, 16, 0).size == 1);      // short rows: one block
  CHECK(cluster_split(1, 4000, 132, budget, 16, 4).size == 4);      // unless forced
  CHECK(cluster_split(1, 128256, 132, budget, 1, 0).size == 1);     // no clusters (below sm_90)
  CHECK(cluster_split(1, 128256, 132, budget, 8, 16).size == 8);
  CHECK(cluster_split(1, 1 << 22, 132, budget, 16, 0).size == 1);   // 16 MiB rows never fit
  for (int v : {1, 7, 111, 8192, 128256, 128257, 262144}) {
    for (int s : {2, 4, 8, 16}) {
      const int slice = cluster_slice(v, s);
      CHECK(slice % 4 == 0 && int64_t{slice} * s >= v && int64_t{slice} * (s - 1) < int64_t{v} + 4 * s);
      const ScanLayout L = slice_layout(slice);
      CHECK(L.cache_elems >= slice && L.cache_elems % L.tile == 0 && L.list_cap == 0);
      CHECK(int64_t{L.steps} * L.threads * kStepElems >= L.cache_elems);  // the first pass fills the cache
      CHECK(L.threads % 32 == 0 && L.threads <= kMaxThreads && L.chunks <= kMaxChunks);
      CHECK(L.off_cluster % 16 == 0 && L.smem_bytes >= L.off_cluster + kClusterBytes);
      CHECK(L.off_table >= kScratchBytes + int64_t{L.cache_elems} * 4);
    }
  }
  const ClusterSplit cs = cluster_split(1, 128256, 132, budget, 16, 0);
  CHECK(cs.slice == 8016 && slice_layout(cs.slice).smem_bytes <= budget && slice_layout(cs.slice).threads == 256);
}

int main() {
  check_keys();
  check_key_floor();
  check_layout();
  check_cluster_split();
  check_membership();
  check_large_vocab();
  check_select();
  check_select_rounds();
  check_distribution();
  return test::finish("test_sampling");
}
