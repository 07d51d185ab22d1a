// SamplingClusterKernel (sampling_cluster.cuh) on the CPU: cuda_emulator.h's fibers, with a
// cluster scheduler on top: the CTAs of one cluster run together, one at a time until each of
// its threads waits at the cluster barrier (cl::sync) or is done; each CTA has its own shared
// memory (swapped in when it runs), and cl::peer maps a shared-memory pointer into another
// CTA's copy. A barrier reached by some CTAs but not others, or a CTA leaving while others wait,
// is a DEADLOCK. Checks: every draw lies in its set (cluster sizes 2..16, slices with and without
// elements, short last slice), the cluster path's draws are deterministic and follow the
// filtered distribution (chi-square), invalid rows give (0, false), per-row parameters, and
// cluster_split's automatic rule. Run: cmake -DFLASHINFER_BUILD_TESTS=ON
// -DFLASHINFER_BUILD_EMU_TESTS=ON, then `ctest -L emu`, or without CMake
// tests/cpp/emu/run_emulated.sh sampling_cluster; ~25 s on 2 cores.
#include "cuda_emulator.h"
// (the emulator first)

#include <cstdlib>

namespace emuc {
inline int ctas = 1;           // CTAs of the running cluster
inline int threads = 32;       // per CTA
inline int loaded = 0;         // the CTA whose shared memory is in sampling_smem
inline size_t smem_bytes = 0;
inline std::vector<std::vector<unsigned char>> saved;  // every CTA's shared memory

inline int cta_of_current() { return emu::current / threads; }
}  // namespace emuc

#define FLASHINFER_SAMPLING_EMULATED_CLUSTER 1
namespace flashinfer {
namespace sampling {
namespace cl {
inline void sync() { emu::yield_at(4); }
inline void sync_warp0() { sync(); }
template <typename T>
T* peer(T* p, int rank) {
  if (rank == emuc::cta_of_current()) return p;
  const auto off = reinterpret_cast<unsigned char*>(p) - blk::sampling_smem;
  return reinterpret_cast<T*>(emuc::saved[size_t(rank)].data() + off);
}
}  // namespace cl
}  // namespace sampling
}  // namespace flashinfer

#include "flashinfer/sampling.cuh"
#include "sampling_emulated.h"

using namespace sampling_replay;
using namespace sampling_emulated;

namespace emuc {

inline void swap_in(int c) {
  if (c == loaded) return;
  std::memcpy(saved[size_t(loaded)].data(), flashinfer::sampling::blk::sampling_smem, smem_bytes);
  std::memcpy(flashinfer::sampling::blk::sampling_smem, saved[size_t(c)].data(), smem_bytes);
  loaded = c;
}

// Runs grid / cluster clusters of `cluster` CTAs, one cluster after another.
template <class... KArgs, class... Args>
void launch(void (*kernel)(KArgs...), unsigned grid, unsigned cluster, unsigned nthreads, size_t smem,
            const Args&... args) {
  using emu::fibers;
  if (smem > sizeof(flashinfer::sampling::blk::sampling_smem) || grid % cluster != 0) std::abort();
  ctas = int(cluster);
  threads = int(nthreads);
  smem_bytes = smem;
  const int n = ctas * threads;
  for (unsigned first = 0; first < grid; first += cluster) {
    saved.assign(size_t(ctas), std::vector<unsigned char>(smem, 0xff));  // NaN-ish garbage
    std::memset(flashinfer::sampling::blk::sampling_smem, 0xff, smem);
    loaded = 0;
    emu::start_fibers(n);
    emu::shfl.assign(size_t(threads / 32), {});
    emu::fiber_body = [&] { kernel(args...); };
    blockDim = dim3(nthreads);
    gridDim = dim3(grid);
    for (;;) {
      // every CTA in turn runs until all its threads wait at the cluster barrier or are done
      for (int c = 0; c < ctas; ++c) {
        swap_in(c);
        for (;;) {
          for (int t = c * threads; t < (c + 1) * threads; ++t) {
            if (fibers[size_t(t)].wait != 0) continue;
            threadIdx = uint3{unsigned(t - c * threads), 0, 0};
            blockIdx = uint3{first + unsigned(c), 0, 0};
            emu::resume(t);
          }
          int block_wait = 0, parked = 0;
          bool released = false;
          for (int t = c * threads; t < (c + 1) * threads; ++t) {
            block_wait += fibers[size_t(t)].wait == 1;
            parked += fibers[size_t(t)].wait == 3 || fibers[size_t(t)].wait == 4;
          }
          if (parked == threads) break;
          for (int w = 0; w < threads / 32; ++w) {
            bool all = true;
            for (int l = 0; l < 32; ++l) all = all && fibers[size_t(c * threads + w * 32 + l)].wait == 2;
            if (all) {
              for (int l = 0; l < 32; ++l) fibers[size_t(c * threads + w * 32 + l)].wait = 0;
              released = true;
            }
          }
          if (!released && block_wait == threads) {
            for (int t = c * threads; t < (c + 1) * threads; ++t) fibers[size_t(t)].wait = 0;
            released = true;
          }
          if (!released) {
            std::printf("DEADLOCK in CTA %d of cluster %u\n", c, first / cluster);
            std::abort();
          }
        }
      }
      int at_cluster = 0, done = 0;
      for (auto& f : fibers) at_cluster += f.wait == 4, done += f.wait == 3;
      if (done == n) break;
      if (at_cluster != n) {
        std::printf("DEADLOCK: %d threads at the cluster barrier, %d done\n", at_cluster, done);
        std::abort();
      }
      for (auto& f : fibers) f.wait = 0;
    }
  }
}

}  // namespace emuc

namespace {

Out run_cluster(const std::vector<float>& buf, int R, int V, int64_t batch, const int* indices, RowFilter f,
                int filters, uint64_t seed, int cluster, const int* karr = nullptr, const float* parr = nullptr) {
  Out o(batch);
  const SamplingParams<int> sp = sampling_params(buf, R, V, batch, indices, f, filters, seed, o, karr, parr);
  const ClusterSplit cs = cluster_split(batch, V, 132, 200 << 10, kMaxCluster, cluster);
  CHECK(cs.size == cluster);
  const ScanLayout L = slice_layout(cs.slice);
  CHECK(int64_t{L.cache_elems} >= cs.slice && L.smem_bytes <= (200 << 10));
  emuc::launch(SamplingClusterKernel<int>, unsigned(batch * cs.size), unsigned(cs.size), unsigned(L.threads),
               size_t(L.smem_bytes), sp, L, cs);
  return o;
}

void check_membership() {
  const RowFilter filters[] = {{0, 1.f, 0.f}, {1, 1.f, 0.f},  {5, 1.f, 0.f},   {100000, 1.f, 0.f}, {0, 0.1f, 0.f},
                               {0, 0.9f, 0.f}, {0, 0.f, 0.f}, {0, 1.f, 0.05f}, {0, 1.f, 1.f},      {3, 0.5f, 0.f}};
  int runs = 0;
  for (const Case& c : distributions()) {
    const int V = static_cast<int>(c.p.size());
    const std::vector<int> zeros(2, 0);
    for (const RowFilter& f : filters) {
      for (Mode mode : {Mode::kJoint, Mode::kTopKFirst}) {
        if (mode == Mode::kTopKFirst && f.min_p != 0.f) continue;
        const std::vector<bool> in = exact_set(c.p, f, mode, 1e-5);
        for (int cluster : {2, 16}) {  // 16: slices of 4 (most empty on short rows)
          const Out o = run_cluster(c.p, 1, V, 2, zeros.data(), f, filters_of(f, mode), 11 + runs, cluster);
          ++runs;
          for (int b = 0; b < 2; ++b) {
            const int i = o.idx[size_t(b)];
            const bool ok = o.valid[size_t(b)] == 1 && i >= 0 && i < V && c.p[size_t(i)] > 0 && in[size_t(i)];
            if (!ok)
              std::printf("%s k=%d p=%g min_p=%g mode=%d cluster=%d -> %d\n", c.name, f.top_k, f.top_p, f.min_p,
                          int(mode), cluster, i);
            CHECK(ok);
            CHECK(o.stats[2 * size_t(b)] >= 1 && o.stats[2 * size_t(b)] <= kMaxDraws);
          }
        }
      }
    }
  }
}

// Longer rows over 4 and 8 CTAs (multi-step slices, short last slice): in the set, deterministic.
void check_long_rows() {
  const int V = 20001, R = 2;
  const std::vector<float> buf = long_rows(R, V);
  const RowFilter fs[] = {{0, 1.f, 0.f}, {50, 0.9f, 0.f}, {0, 1.f, 0.1f}, {9000, 0.8f, 0.f}, {1, 1.f, 0.f}};
  for (const RowFilter& f : fs) {
    for (Mode mode : {Mode::kJoint, Mode::kTopKFirst}) {
      if (mode == Mode::kTopKFirst && (f.top_k == 0 || f.min_p != 0.f)) continue;
      const int fl = filters_of(f, mode);
      for (int cluster : {4, 8}) {
        const Out a = run_cluster(buf, R, V, 3, nullptr, f, fl, 3, cluster);
        const Out b = run_cluster(buf, R, V, 3, nullptr, f, fl, 3, cluster);
        CHECK(a.idx == b.idx && a.stats == b.stats);
        for (int r = 0; r < R; ++r) {
          const std::vector<float> row(buf.begin() + size_t(r) * V, buf.begin() + size_t(r + 1) * V);
          const bool ok = a.valid[size_t(r)] == 1 && exact_set(row, f, mode, 1e-5)[size_t(a.idx[size_t(r)])];
          if (!ok) std::printf("long row %d k=%d p=%g mode=%d cluster=%d -> %d\n", r, f.top_k, f.top_p, int(mode), cluster, a.idx[size_t(r)]);
          CHECK(ok);
        }
        CHECK(a.valid[2] == 0 && a.idx[2] == 0);  // row 2 is out of range
      }
    }
  }
}

// Slices of several steps (more than 512 threads x 32 elements): 70001 over 2 CTAs.
void check_multistep_slices() {
  std::mt19937 g(9);
  std::normal_distribution<float> nd;
  const int V = 70001;
  std::vector<float> buf(static_cast<size_t>(V));
  for (auto& x : buf) x = std::exp(3 * nd(g));
  CHECK(slice_layout(cluster_slice(V, 2)).steps == 3);
  const RowFilter fs[] = {{0, 1.f, 0.f}, {20, 0.9f, 0.f}, {0, 0.7f, 0.f}};
  for (const RowFilter& f : fs) {
    for (Mode mode : {Mode::kJoint, Mode::kTopKFirst}) {
      if (mode == Mode::kTopKFirst && f.top_k == 0) continue;
      const Out a = run_cluster(buf, 1, V, 1, nullptr, f, filters_of(f, mode), 5, 2);
      const bool ok = a.valid[0] == 1 && exact_set(buf, f, mode, 1e-5)[size_t(a.idx[0])];
      if (!ok) std::printf("multistep k=%d p=%g mode=%d -> %d\n", f.top_k, f.top_p, int(mode), a.idx[0]);
      CHECK(ok);
    }
  }
}

void check_statistics() {
  const std::vector<float> p =
      normalized({0.20f, 0.02f, 0.15f, 0.15f, 0.08f, 0.30f, 0.01f, 0.0f, 0.05f, 0.04f, 0.10f, 0.03f, 0.09f});
  const int V = static_cast<int>(p.size()), n = 1500;
  const std::vector<int> idx(size_t(n), 0);
  const double bound = V + 6 * std::sqrt(2.0 * V);
  struct F {
    RowFilter f;
    Mode m;
  };
  for (const F& x : {F{{5, 0.7f, 0.f}, Mode::kJoint}, F{{6, 0.8f, 0.f}, Mode::kTopKFirst}, F{{0, 1.f, 0.25f}, Mode::kJoint},
                     F{{0, 1.f, 0.f}, Mode::kJoint}}) {
    const Out o = run_cluster(p, 1, V, n, idx.data(), x.f, filters_of(x.f, x.m), 99, 4);
    std::vector<int> counts(size_t(V), 0);
    for (int i : o.idx) ++counts[size_t(i)];
    bool zero_hit = false;
    CHECK(chi_square(counts, filtered_dist(p, exact_set(p, x.f, x.m)), n, &zero_hit) < bound);
    CHECK(!zero_hit);
  }
}

// cluster_split's automatic rule (sampling_params.h; the layouts and forced sizes are checked
// by tests/cpp/host/test_sampling.cpp): clusters only for rows of at least kClusterMinVocab when
// batch * kMaxCluster <= #SMs, then as many CTAs as fill the SMs (a power of two), more when
// the slice does not fit (run_cluster checks that the forced sizes it launches are granted).
void check_split() {
  const int64_t budget = 227 * 1024 - kStaticSmemReserve;
  CHECK(cluster_split(1, 128256, 132, budget, 16, 0).size == 16);
  CHECK(cluster_split(8, 128256, 132, budget, 16, 0).size == 16);
  CHECK(cluster_split(9, 128256, 132, budget, 16, 0).size == 1);   // batch * 16 > #SMs: one block
  CHECK(cluster_split(64, 128256, 132, budget, 16, 0).size == 1);  // (H200: clusters of 4 were slower)
  CHECK(cluster_split(1, 4000, 132, budget, 16, 0).size == 1);     // short rows
  CHECK(cluster_split(1, 128256, 132, budget, 1, 0).size == 1);    // no clusters (below sm_90)
  for (int sms : {16, 78, 132}) {
    for (int64_t batch : {1, 2, 3, 5, 8, 9, 16, 64}) {
      for (int v : {kClusterMinVocab - 1, kClusterMinVocab, 128256}) {
        const ClusterSplit cs = cluster_split(batch, v, sms, budget, kMaxCluster, 0);
        const bool clusters = v >= kClusterMinVocab && batch * kMaxCluster <= sms;
        int fill = 1;
        while (fill * 2 <= std::min<int64_t>(sms / batch, kMaxCluster)) fill *= 2;
        CHECK(cs.size == (clusters ? std::max(fill, 2) : 1));
        CHECK(cs.size == 1 ? cs.slice == 0 : cs.slice == cluster_slice(v, cs.size) && slice_fits(v, cs.size, budget));
      }
    }
  }
}

}  // namespace

int main() {
  timed("cluster_split rule", check_split);
  timed("invalid rows, per-row parameters", [] {
    check_invalid_rows_and_per_row_params([](const std::vector<float>& buf, int R, int V, int64_t n, const int* idx,
                                             RowFilter f, int fl, uint64_t seed, const int* karr, const float* parr) {
      return run_cluster(buf, R, V, n, idx, f, fl, seed, 8, karr, parr);
    });
  });
  timed("membership", check_membership);
  timed("long rows", check_long_rows);
  timed("statistics", check_statistics);
  timed("multistep slices", check_multistep_slices);
  return test::finish("test_sampling_cluster_emulated");
}
