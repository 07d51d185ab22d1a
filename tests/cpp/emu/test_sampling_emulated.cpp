// The sampling kernels themselves, run on the CPU by cuda_emulator.h (no GPU): every draw of
// SamplingKernel lies in its top-k / top-p / min-p set, its frequencies pass a chi-square test,
// results are bit-identical whatever the shared-memory cache size or the row alignment, invalid
// rows and indices give (0, false); RenormKernel keeps exactly the reference set; TopKKernel
// returns the exact top-k with each tie break; softmax, Gumbel sampling and chain speculative
// sampling match their definitions. Run: cmake -DFLASHINFER_BUILD_TESTS=ON
// -DFLASHINFER_BUILD_EMU_TESTS=ON, then `ctest -L emu`, or without CMake
// tests/cpp/emu/run_emulated.sh sampling; ~20 s on 2 cores.
#include "cuda_emulator.h"
// (the emulator first)
#include "flashinfer/sampling.cuh"
#include "flashinfer/sampling_logits.cuh"
#include "flashinfer/topk.cuh"
#include "sampling_emulated.h"

using namespace sampling_replay;
using namespace sampling_emulated;

namespace {

using emu::ft;
using emu::tf;

constexpr int64_t kBudget = 200 << 10;
int g_early = 2;  // ScanLayout::early (the default) of run_sampling's launches

// SamplingKernel over rows [R, V] (row stride V), `batch` outputs; filters as the binding sets them.
Out run_sampling(const std::vector<float>& buf, int R, int V, int64_t batch, const int* indices, RowFilter f,
                 int filters, uint64_t seed, int64_t budget, const int* karr = nullptr, const float* parr = nullptr) {
  Out o(batch);
  const SamplingParams<int> sp = sampling_params(buf, R, V, batch, indices, f, filters, seed, o, karr, parr);
  ScanLayout L = scan_layout(V, 4, sp.top_k_first, budget);
  L.early = g_early;
  emu::launch(SamplingKernel<int>, unsigned(batch), unsigned(L.threads), size_t(L.smem_bytes), sp, L);
  return o;
}

void check_membership() {
  const RowFilter filters[] = {{0, 1.f, 0.f}, {1, 1.f, 0.f}, {5, 1.f, 0.f}, {100000, 1.f, 0.f}, {0, 0.1f, 0.f},
                               {0, 0.9f, 0.f}, {0, 0.f, 0.f},  {0, 1.f, 0.05f}, {0, 1.f, 1.f},     {3, 0.5f, 0.f}};
  for (const Case& c : distributions()) {
    const int V = static_cast<int>(c.p.size());
    const std::vector<int> zeros(4, 0);
    for (const RowFilter& f : filters) {
      for (Mode mode : {Mode::kJoint, Mode::kTopKFirst}) {
        if (mode == Mode::kTopKFirst && f.min_p != 0.f) continue;  // min-p is not a top-k-first filter
        const std::vector<bool> in = exact_set(c.p, f, mode, 1e-5);
        const Out o = run_sampling(c.p, 1, V, 4, zeros.data(), f, filters_of(f, mode), 11, kBudget);
        for (int b = 0; b < 4; ++b) {
          const int i = o.idx[b];
          const bool ok = o.valid[b] == 1 && i >= 0 && i < V && c.p[i] > 0 && in[i];
          if (!ok) std::printf("%s k=%d p=%g min_p=%g mode=%d -> %d\n", c.name, f.top_k, f.top_p, f.min_p, int(mode), i);
          CHECK(ok);
          CHECK(o.stats[2 * b] >= 1 && o.stats[2 * b] <= kMaxDraws);
        }
      }
    }
  }
}

// Multi-chunk rows: the draw must not depend on the cache size or the row alignment.
void check_cache_and_alignment() {
  const int V = 20001, R = 2;
  const std::vector<float> buf = long_rows(R, V);
  // (pure top-p and top-p with min-p: the first draw's check may stop after a chunk)
  const RowFilter fs[] = {{0, 1.f, 0.f},  {50, 0.9f, 0.f},   {0, 1.f, 0.1f},
                          {9000, 0.8f, 0.f}, {0, 0.9f, 0.f}, {0, 0.5f, 0.001f}};
  for (const RowFilter& f : fs) {
    for (Mode mode : {Mode::kJoint, Mode::kTopKFirst}) {
      if (mode == Mode::kTopKFirst && (f.top_k == 0 || f.min_p != 0.f)) continue;
      const int fl = filters_of(f, mode);
      const Out a = run_sampling(buf, R, V, 3, nullptr, f, fl, 3, kBudget);
      const Out b = run_sampling(buf, R, V, 3, nullptr, f, fl, 3, 0);
      const Out c = run_sampling(buf, R, V, 3, nullptr, f, fl, 3, 90 << 10);
      CHECK(a.idx == b.idx && a.idx == c.idx);
      // The top-p early accept only settles a draw sooner (these rows have no draw at the set's
      // boundary): with it off (0), after every chunk (1) or after cached chunks only (2), the
      // same tokens after the same number of draws.
      for (int mode : {0, 1}) {
        g_early = mode;
        const Out e = run_sampling(buf, R, V, 3, nullptr, f, fl, 3, 90 << 10);
        g_early = 2;
        CHECK(e.idx == c.idx);
        for (int r = 0; r < R; ++r) CHECK(e.stats[2 * r] == c.stats[2 * r]);
      }
      for (int r = 0; r < R; ++r) {
        const std::vector<float> row(buf.begin() + size_t(r) * V, buf.begin() + size_t(r + 1) * V);
        CHECK(a.valid[r] == 1 && exact_set(row, f, mode, 1e-5)[a.idx[r]]);
      }
      CHECK(a.valid[2] == 0 && a.idx[2] == 0);  // row 2 is out of range
    }
  }
  // The rows of a buffer offset by one float are misaligned: the scalar path must agree.
  std::vector<float> odd(size_t(R) * V + 1);
  std::copy(buf.begin(), buf.end(), odd.begin() + 1);
  SamplingParams<int> sp;
  std::vector<int> o1(R), o2(R);
  for (int pass = 0; pass < 2; ++pass) {
    sp.probs = pass == 0 ? buf.data() : odd.data() + 1;
    sp.row_stride = V;
    sp.rows = R;
    sp.vocab = V;
    sp.batch = R;
    sp.out = pass == 0 ? o1.data() : o2.data();
    sp.use_top_k = sp.use_top_p = true;
    sp.top_k = 50;
    sp.top_p = 0.9f;
    const ScanLayout L = scan_layout(V, 4, false, kBudget);
    emu::launch(SamplingKernel<int>, unsigned(R), unsigned(L.threads), size_t(L.smem_bytes), sp, L);
  }
  CHECK(o1 == o2);
}

void check_statistics() {
  const std::vector<float> p =
      normalized({0.20f, 0.02f, 0.15f, 0.15f, 0.08f, 0.30f, 0.01f, 0.0f, 0.05f, 0.04f, 0.10f, 0.03f, 0.09f});
  const int V = static_cast<int>(p.size()), n = 3000;
  const std::vector<int> idx(n, 0);
  const double bound = V + 6 * std::sqrt(2.0 * V);
  struct F {
    RowFilter f;
    Mode m;
  };
  for (const F& x : {F{{5, 0.7f, 0.f}, Mode::kJoint}, F{{6, 0.8f, 0.f}, Mode::kTopKFirst}, F{{0, 1.f, 0.25f}, Mode::kJoint}}) {
    const Out o = run_sampling(p, 1, V, n, idx.data(), x.f, filters_of(x.f, x.m), 99, kBudget);
    std::vector<int> counts(V, 0);
    for (int i : o.idx) ++counts[i];
    bool zero_hit = false;
    CHECK(chi_square(counts, filtered_dist(p, exact_set(p, x.f, x.m)), n, &zero_hit) < bound);
    CHECK(!zero_hit);
  }
}

template <typename T>
std::vector<T> run_renorm(const std::vector<T>& in, int R, int V, RenormKind kind, int k, float top_p) {
  std::vector<T> out(size_t(R) * V, ft<T>(12345.f));
  RenormParams<T> rp;
  rp.in = in.data();
  rp.out = out.data();
  rp.in_stride = rp.out_stride = V;
  rp.rows = R;
  rp.vocab = V;
  rp.kind = kind;
  rp.top_k = k;
  rp.top_p = top_p;
  const ScanLayout L = scan_layout(V, static_cast<int>(sizeof(T)), true, kBudget);
  emu::launch(RenormKernel<T>, unsigned(R), unsigned(L.threads), size_t(L.smem_bytes), rp, L);
  return out;
}

template <typename T>
void check_renorm() {
  std::mt19937 g(1);
  std::normal_distribution<float> nd;
  for (int V : {111, 20001}) {
    const int R = 2;
    std::vector<T> in(size_t(R) * V);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < V; ++i)
        in[size_t(r) * V + i] = ft<T>(i % 13 == 0 ? 0.f : (r == 0 ? std::exp(nd(g)) : float(1 + (i * 7) % 5)));
    for (int k : {1, 10, 500, 9000, V + 1}) {
      const std::vector<T> o = run_renorm(in, R, V, RenormKind::kTopKRenorm, k, 1.f);
      std::vector<T> logits(in);
      for (auto& x : logits)
        if (tf(x) == 0.f) x = ft<T>(-INFINITY);
      const std::vector<T> m = run_renorm(logits, R, V, RenormKind::kTopKMask, k, 1.f);
      for (int r = 0; r < R; ++r) {
        std::vector<float> row(V);
        for (int i = 0; i < V; ++i) row[i] = tf(in[size_t(r) * V + i]);
        const std::vector<bool> keep = exact_set(row, RowFilter{k, 1.f, 0.f}, Mode::kJoint);
        double z = 0;
        for (int i = 0; i < V; ++i) z += keep[i] ? row[i] : 0.0;
        for (int i = 0; i < V; ++i) {
          const double want = keep[i] ? row[i] / z : 0.0;
          const float got = tf(o[size_t(r) * V + i]);
          CHECK((got != 0) == (want != 0 && tf(ft<T>(float(want))) != 0));
          CHECK(std::fabs(got - want) <= (sizeof(T) == 4 ? 1e-5 : 1e-2) * std::max(want, 6.2e-5));
          const float lg = tf(logits[size_t(r) * V + i]);
          CHECK(tf(m[size_t(r) * V + i]) == (keep[i] ? lg : -INFINITY));
        }
      }
    }
    if (sizeof(T) != 4) continue;
    for (float top_p : {0.1f, 0.9f, 1.f}) {
      const std::vector<T> o = run_renorm(in, R, V, RenormKind::kTopPRenorm, 0, top_p);
      for (int r = 0; r < R; ++r) {
        std::vector<float> row(V);
        for (int i = 0; i < V; ++i) row[i] = tf(in[size_t(r) * V + i]);
        const std::vector<bool> loose = exact_set(row, RowFilter{0, top_p, 0.f}, Mode::kJoint, 1e-5);
        const std::vector<bool> tight = exact_set(row, RowFilter{0, top_p, 0.f}, Mode::kJoint, -1e-5);
        for (int i = 0; i < V; ++i) {
          const float got = tf(o[size_t(r) * V + i]);
          if (tight[i]) CHECK(got > 0);
          if (!loose[i]) CHECK(got == 0);
        }
      }
    }
  }
}

template <typename T>
void check_top_k() {
  std::mt19937 g(9);
  std::normal_distribution<float> nd;
  for (int V : {111, 1000}) {
    const int R = 4;  // row 3: a third -inf (counted, tied) and NaNs, past-the-end padding never selected
    std::vector<T> in(size_t(R) * V);
    for (int r = 0; r < R; ++r)
      for (int i = 0; i < V; ++i) {
        const float x = r == 0 ? nd(g)
                        : r == 1 ? std::floor(4 * nd(g)) / 4
                        : r == 2 ? (i % 17 == 0 ? NAN : 100 * nd(g))
                                 : (i % 3 == 0 ? -INFINITY : (i % 11 == 0 ? NAN : nd(g)));
        in[size_t(r) * V + i] = ft<T>(x);
      }
    for (int k : {1, 5, 100, V - 1, V}) {
      for (int tb : {0, 2}) {
        std::vector<T> vals(size_t(R) * k);
        std::vector<int64_t> idx(size_t(R) * k, -1);
        TopKParams<T> tp;
        tp.in = in.data();
        tp.values = vals.data();
        tp.indices = idx.data();
        tp.in_stride = V;
        tp.rows = R;
        tp.vocab = V;
        tp.k = k;
        tp.tie_break = TopKTieBreak(tb);
        const ScanLayout L = scan_layout(V, static_cast<int>(sizeof(T)), true, kBudget);
        emu::launch(TopKKernel<T>, unsigned(R), unsigned(L.threads), size_t(L.smem_bytes), tp, L);
        for (int r = 0; r < R; ++r) {
          auto x = [&](int i) { return tf(in[size_t(r) * V + i]); };
          std::vector<int> order(V);
          std::iota(order.begin(), order.end(), 0);
          std::stable_sort(order.begin(), order.end(), [&](int a, int b) {  // NaN last, ties by index
            const bool na = x(a) != x(a), nb = x(b) != x(b);
            if (na != nb) return nb;
            if (!na && x(a) != x(b)) return x(a) > x(b);
            return tb == 2 ? a > b : a < b;
          });
          std::vector<int64_t> want(order.begin(), order.begin() + k), got(idx.begin() + size_t(r) * k,
                                                                             idx.begin() + size_t(r + 1) * k);
          std::sort(want.begin(), want.end());
          std::sort(got.begin(), got.end());
          CHECK(want == got);
          for (int j = 0; j < k; ++j) {
            const int64_t i = idx[size_t(r) * k + j];
            const float v = tf(vals[size_t(r) * k + j]);
            CHECK(i >= 0 && i < V && (v == x(static_cast<int>(i)) || (v != v && x(static_cast<int>(i)) != x(static_cast<int>(i)))));
          }
        }
      }
    }
  }
}

void check_softmax_gumbel_speculative() {
  // softmax with per-row temperatures 1, 0.5 and 0 (uniform over the finite logits)
  std::mt19937 g(2);
  std::normal_distribution<float> nd;
  const int V = 5000, R = 3;
  std::vector<float> x(size_t(R) * V), out(size_t(R) * V, -1.f);
  for (auto& v : x) v = 5 * nd(g);
  for (size_t i = 0; i < x.size(); i += 3) x[i] = -INFINITY;
  const float temps[3] = {1.f, 0.5f, 0.f};
  SoftmaxParams sp;
  sp.logits = x.data();
  sp.out = out.data();
  sp.in_stride = sp.out_stride = V;
  sp.rows = R;
  sp.vocab = V;
  sp.temperature_arr = temps;
  const ScanLayout L = scan_layout(V, 4, false, kBudget);
  emu::launch(SoftmaxKernel, unsigned(R), unsigned(L.threads), size_t(L.smem_bytes), sp, L);
  for (int r = 0; r < R; ++r) {
    auto y = [&](int i) { return temps[r] == 0 ? 0.0 : double(x[size_t(r) * V + i]) / temps[r]; };
    double mx = -INFINITY, z = 0;
    for (int i = 0; i < V; ++i)
      if (x[size_t(r) * V + i] > -INFINITY) mx = std::max(mx, y(i));
    for (int i = 0; i < V; ++i)
      if (x[size_t(r) * V + i] > -INFINITY) z += std::exp(y(i) - mx);
    for (int i = 0; i < V; ++i) {
      const double want = x[size_t(r) * V + i] > -INFINITY ? std::exp(y(i) - mx) / z : 0.0;
      CHECK(std::fabs(out[size_t(r) * V + i] - want) < 1e-6);
    }
  }
  // Gumbel-max sampling from logits: the softmax distribution, never a -inf logit
  const std::vector<float> p = normalized({0.20f, 0.02f, 0.15f, 0.15f, 0.08f, 0.30f, 0.01f, 0.0f, 0.05f, 0.04f});
  const int n = 4000, W = static_cast<int>(p.size());
  std::vector<float> logits(W);
  for (int i = 0; i < W; ++i) logits[i] = p[i] > 0 ? std::log(p[i]) + 1.5f : -INFINITY;
  std::vector<int> zeros(n, 0), samples(n, -7);
  LogitsSamplingParams<int> lp;
  lp.logits = logits.data();
  lp.row_stride = W;
  lp.rows = 1;
  lp.vocab = W;
  lp.batch = n;
  lp.indices = zeros.data();
  lp.out = samples.data();
  lp.rng.seed = 5;
  const ScanLayout LL = scan_layout(W, 4, false, 0);
  emu::launch(LogitsSamplingKernel<int>, unsigned(n), unsigned(LL.threads), size_t(kScratchBytes), lp, LL);
  std::vector<int> counts(W, 0);
  for (int s : samples) ++counts[s];
  bool zero_hit = false;
  CHECK(chi_square(counts, std::vector<double>(p.begin(), p.end()), n, &zero_hit) < W + 6 * std::sqrt(2.0 * W));
  CHECK(!zero_hit);
  // chain speculative sampling, one draft: the first token follows the target; accept rate sum min(p, q)
  const int K = 8, B = 4000;
  const std::vector<float> q = normalized({0.3f, 0.1f, 0.05f, 0.2f, 0.1f, 0.1f, 0.1f, 0.05f});
  const std::vector<float> t = normalized({0.05f, 0.3f, 0.1f, 0.1f, 0.2f, 0.05f, 0.1f, 0.1f});
  std::vector<float> draft(size_t(B) * K), target(size_t(B) * 2 * K);
  std::vector<int> ids(B), sout(size_t(B) * 2, -9), acc(B, 3), emi(B, 1);
  std::discrete_distribution<int> dq(q.begin(), q.end());
  for (int b = 0; b < B; ++b) {
    std::copy(q.begin(), q.end(), draft.begin() + size_t(b) * K);
    std::copy(t.begin(), t.end(), target.begin() + size_t(b) * 2 * K);
    std::copy(t.begin(), t.end(), target.begin() + size_t(b) * 2 * K + K);
    ids[b] = dq(g);
  }
  ChainSpeculativeParams cp;
  cp.draft_probs = draft.data();
  cp.draft_ids = ids.data();
  cp.target_probs = target.data();
  cp.out = sout.data();
  cp.accepted = acc.data();
  cp.emitted = emi.data();
  cp.draft_stride_b = cp.draft_stride_n = K;
  cp.ids_stride_b = 1;
  cp.target_stride_b = 2 * K;
  cp.target_stride_n = K;
  cp.batch = B;
  cp.n = 1;
  cp.vocab = K;
  cp.rng.seed = 3;
  const ScanLayout LS = scan_layout(K, 4, false, 0);
  emu::launch(ChainSpeculativeKernel, unsigned(B), unsigned(LS.threads), size_t(LS.smem_bytes), cp, LS);
  std::vector<int> first(K, 0);
  int accepted = 0;
  for (int b = 0; b < B; ++b) {
    const int e = emi[b] - 1;
    accepted += acc[b] - 3;
    CHECK(acc[b] - 3 == e && (e == 1 ? sout[2 * b] == ids[b] : sout[2 * b + 1] == -1));
    ++first[sout[2 * b]];
  }
  double rate = 0;
  for (int i = 0; i < K; ++i) rate += std::min(q[i], t[i]);
  CHECK(chi_square(first, std::vector<double>(t.begin(), t.end()), B, &zero_hit) < K + 6 * std::sqrt(2.0 * K));
  CHECK(std::fabs(double(accepted) / B - rate) < 0.03);
}

}  // namespace

int main() {
  timed("membership", check_membership);
  timed("cache size and alignment", check_cache_and_alignment);
  timed("statistics", check_statistics);
  timed("invalid rows, per-row parameters", [] {
    check_invalid_rows_and_per_row_params([](const std::vector<float>& buf, int R, int V, int64_t n, const int* idx,
                                             RowFilter f, int fl, uint64_t seed, const int* karr, const float* parr) {
      return run_sampling(buf, R, V, n, idx, f, fl, seed, kBudget, karr, parr);
    });
  });
  timed("renorm f32", check_renorm<float>);
  timed("renorm f16", check_renorm<__half>);
  timed("top-k f32", check_top_k<float>);
  timed("top-k bf16", check_top_k<__nv_bfloat16>);
  timed("softmax, Gumbel, speculative", check_softmax_gumbel_speculative);
  return test::finish("test_sampling_emulated");
}
