// What the emulated sampling tests (test_sampling_emulated.cpp: the one-block kernel,
// test_sampling_cluster_emulated.cpp: the cluster kernel) share: a launch's outputs, the filter
// bits the binding sets, SamplingParams over a row-major buffer, long test rows, the invalid-row
// check, and the per-part timing.
#pragma once
#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <random>
#include <vector>

#include "flashinfer/sampling_params.h"
#include "sampling_replay.h"

namespace sampling_emulated {

using flashinfer::sampling::SamplingParams;
using sampling_replay::Mode;
using sampling_replay::RowFilter;

// Runs part() and prints how long it took.
template <class F>
void timed(const char* name, F part) {
  const auto t0 = std::chrono::steady_clock::now();
  part();
  std::printf("  %-40s %7.1f s\n", name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::fflush(stdout);
}

// One launch's outputs, pre-filled with values no kernel writes.
struct Out {
  explicit Out(int64_t batch) : idx(size_t(batch), -7), valid(size_t(batch), 2), stats(2 * size_t(batch), -1) {}
  std::vector<int> idx;
  std::vector<char> valid;
  std::vector<int> stats;
};

// The binding's filter bits: 1 top-k, 2 top-p, 4 min-p, 8 top-k first (then top-p).
inline int filters_of(const RowFilter& f, Mode m) {
  if (m == Mode::kTopKFirst) return 8;
  return (f.top_k != 0 ? 1 : 0) | (f.top_p < 1.f ? 2 : 0) | (f.min_p != 0.f ? 4 : 0);
}

// Rows [R, V] of buf (row stride V), `batch` outputs into o (rows picked by indices, or the
// identity), scalar filter f or the per-row arrays karr / parr.
inline SamplingParams<int> sampling_params(const std::vector<float>& buf, int R, int V, int64_t batch,
                                           const int* indices, const RowFilter& f, int filters, uint64_t seed,
                                           Out& o, const int* karr = nullptr, const float* parr = nullptr) {
  SamplingParams<int> sp;
  sp.probs = buf.data();
  sp.row_stride = V;
  sp.rows = R;
  sp.vocab = V;
  sp.batch = batch;
  sp.indices = indices;
  sp.out = o.idx.data();
  sp.valid = reinterpret_cast<bool*>(o.valid.data());
  sp.stats = o.stats.data();
  sp.top_k = f.top_k;
  sp.top_p = f.top_p;
  sp.min_p = f.min_p;
  sp.top_k_arr = karr;
  sp.top_p_arr = parr;
  sp.use_top_k = (filters & 9) != 0;
  sp.use_top_p = (filters & 10) != 0;
  sp.use_min_p = (filters & 4) != 0;
  sp.top_k_first = (filters & 8) != 0;
  sp.rng.seed = seed;
  return sp;
}

// R rows of V lognormal weights (unnormalized), every 21st element 0: rows of several chunks.
inline std::vector<float> long_rows(int R, int V) {
  std::mt19937 g(5);
  std::normal_distribution<float> nd;
  std::vector<float> buf(size_t(R) * V);
  for (auto& x : buf) x = std::exp(2 * nd(g));
  for (int i = 0; i < V; i += 21) buf[size_t(i)] = 0.f;
  return buf;
}

// Invalid rows (NaN, no mass, infinite mass) and indices (past the end, negative) give
// (0, false) under every filter; per-row k = 1 gives the row's argmax (top-k alone, and top-k first with per-row p). run(buf, R, V, batch,
// indices, f, filters, seed, karr, parr) launches the kernel under test and returns its Out.
template <class Run>
void check_invalid_rows_and_per_row_params(Run run) {
  const int V = 111, R = 4;
  std::vector<float> buf(size_t(R) * V);
  std::mt19937 g(3);
  for (auto& x : buf) x = std::uniform_real_distribution<float>(0, 1)(g);
  buf[5] = NAN;                                              // row 0: NaN
  for (int i = 0; i < V; ++i) buf[size_t(2) * V + i] = 0.f;  // row 2: no mass
  buf[size_t(3) * V + 7] = INFINITY;                         // row 3: infinite mass
  const int idx[6] = {0, 1, 2, 3, 4, -1};
  for (int filters : {0, 3, 4, 8}) {
    const Out o = run(buf, R, V, 6, idx, RowFilter{5, 0.5f, 0.2f}, filters, 1, nullptr, nullptr);
    const char want[6] = {0, 1, 0, 0, 0, 0};
    for (int b = 0; b < 6; ++b) CHECK(o.valid[size_t(b)] == want[b] && (want[b] || o.idx[size_t(b)] == 0));
  }
  const int karr[4] = {3, 1, 3, 3};  // k = 1 on row 1: its argmax
  const float parr[4] = {0.9f, 0.9f, 0.9f, 0.9f};
  const int one[1] = {1};
  const int argmax = static_cast<int>(std::max_element(buf.begin() + V, buf.begin() + 2 * V) - (buf.begin() + V));
  for (int filters : {1, 8}) CHECK(run(buf, R, V, 1, one, RowFilter{}, filters, 1, karr, parr).idx[0] == argmax);
}

}  // namespace sampling_emulated
