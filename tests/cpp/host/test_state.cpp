// attention/state.h: identity, commutativity, associativity, empty + empty, and equality with
// a float64 log-sum-exp over random partitions of a row of scores.
#include <algorithm>
#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "check.h"
#include "flashinfer/attention/state.h"

using namespace flashinfer::attention;

namespace {

constexpr int kD = 8;

struct S {
  float o[kD];
  float lse;
};

// The exact state of a set of (score, value) pairs in float64, scores in log2 units.
S exact(const std::vector<double>& s, const std::vector<std::vector<double>>& v, size_t lo, size_t hi) {
  S r{};
  if (lo == hi) {
    r.lse = neg_inf();
    return r;
  }
  double m = -INFINITY;
  for (size_t j = lo; j < hi; ++j) m = std::fmax(m, s[j]);
  double den = 0, num[kD] = {};
  for (size_t j = lo; j < hi; ++j) {
    const double w = std::exp2(s[j] - m);
    den += w;
    for (int d = 0; d < kD; ++d) num[d] += w * v[j][d];
  }
  for (int d = 0; d < kD; ++d) r.o[d] = float(num[d] / den);
  r.lse = float(m + std::log2(den));
  return r;
}

S merged(S a, const S& b) {
  merge_state(a.o, &a.lse, b.o, b.lse, kD);
  return a;
}

bool close(const S& a, const S& b, double tol = 2e-5) {
  if (std::isinf(a.lse) || std::isinf(b.lse)) {
    if (a.lse != b.lse) return false;
  } else if (std::fabs(a.lse - b.lse) > tol * (1 + std::fabs(b.lse))) {
    return false;
  }
  for (int d = 0; d < kD; ++d) {
    if (std::isnan(a.o[d]) || std::fabs(a.o[d] - b.o[d]) > tol * (1 + std::fabs(b.o[d]))) return false;
  }
  return true;
}

}  // namespace

int main() {
  std::mt19937 rng(3);
  std::normal_distribution<double> nd;
  const S empty = {{0, 0, 0, 0, 0, 0, 0, 0}, neg_inf()};

  // empty + empty = empty, with o = 0 and no NaN
  {
    S e = merged(empty, empty);
    CHECK(e.lse == neg_inf());
    for (int d = 0; d < kD; ++d) CHECK(e.o[d] == 0.f);
  }
  for (int trial = 0; trial < 300; ++trial) {
    const size_t n = 1 + rng() % 200;
    const double spread = trial % 3 == 0 ? 60.0 : 4.0;  // include extreme score ranges
    std::vector<double> s(n);
    std::vector<std::vector<double>> v(n, std::vector<double>(kD));
    for (size_t j = 0; j < n; ++j) {
      s[j] = spread * nd(rng) + (trial % 5 == 0 ? -700.0 : 0.0);
      for (int d = 0; d < kD; ++d) v[j][d] = nd(rng);
    }
    const S whole = exact(s, v, 0, n);
    // identity, both sides, exactly
    const S a = exact(s, v, 0, n / 2), b = exact(s, v, n / 2, n);
    const S ia = merged(a, empty), ai = merged(empty, a);
    for (int d = 0; d < kD; ++d) CHECK(ia.o[d] == a.o[d] && ai.o[d] == a.o[d]);
    CHECK(ia.lse == a.lse && ai.lse == a.lse);
    // commutativity (bitwise: the weights are computed symmetrically)
    const S ab = merged(a, b), ba = merged(b, a);
    CHECK(close(ab, ba, 1e-6));
    CHECK(close(ab, whole));
    // a random partition into k parts, merged left to right and as a tree
    const size_t k = 1 + rng() % 8;
    std::vector<size_t> cuts{0, n};
    for (size_t i = 1; i < k; ++i) cuts.push_back(rng() % (n + 1));  // empty parts allowed
    std::sort(cuts.begin(), cuts.end());
    std::vector<S> parts;
    for (size_t i = 0; i + 1 < cuts.size(); ++i) parts.push_back(exact(s, v, cuts[i], cuts[i + 1]));
    S left = empty;
    for (const S& p : parts) left = merged(left, p);
    CHECK(close(left, whole));
    while (parts.size() > 1) {  // associativity: pairwise tree
      std::vector<S> next;
      for (size_t i = 0; i < parts.size(); i += 2)
        next.push_back(i + 1 < parts.size() ? merged(parts[i], parts[i + 1]) : parts[i]);
      parts = next;
    }
    CHECK(close(parts[0], whole));
  }
  // OnlineSoftmax streaming equals the exact state.
  for (int trial = 0; trial < 100; ++trial) {
    const size_t n = 1 + rng() % 300;
    std::vector<double> s(n);
    std::vector<std::vector<double>> v(n, std::vector<double>(kD));
    for (size_t j = 0; j < n; ++j) {
      s[j] = 10 * nd(rng);
      for (int d = 0; d < kD; ++d) v[j][d] = nd(rng);
    }
    OnlineSoftmax os;
    float o[kD] = {};
    for (size_t j = 0; j < n; ++j) {
      float scale, p;
      os.update(float(s[j]), &scale, &p);
      for (int d = 0; d < kD; ++d) o[d] = o[d] * scale + p * float(v[j][d]);
    }
    S got;
    for (int d = 0; d < kD; ++d) got.o[d] = o[d] * os.inv_d();
    got.lse = os.lse();
    CHECK(close(got, exact(s, v, 0, n), 1e-4));
  }
  // masked keys (-inf) contribute nothing; all masked = empty
  {
    OnlineSoftmax os;
    float scale, p;
    os.update(neg_inf(), &scale, &p);
    CHECK(p == 0.f && os.lse() == neg_inf() && os.inv_d() == 0.f);
    os.update(1.f, &scale, &p);
    os.update(neg_inf(), &scale, &p);
    CHECK(p == 0.f && std::fabs(os.lse() - 1.f) < 1e-6f);
  }
  return test::finish("test_state");
}
