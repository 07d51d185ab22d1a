// The tensor-core prefill kernel SinglePrefillKernel (prefill.cuh) run on the CPU by
// cuda_emulator.h, with cp.async from cp_async_emulated.h and ldmatrix / mma.sync from
// mma_emulated.h, against a float64 reference of the score definition (prefill.h, spec §1.0):
// f16 and bf16; head dims (64,64), (128,128), (256,256), (192,128); group sizes 1, 3, 4 (one and
// two KV heads); qo_len 1 / 5 / 70 against kv_len 1 / 37 / 130, qo_len > kv_len with causal
// (the first qo_len - kv_len rows see no key: o = 0, lse = -inf); causal on / off; sliding window
// 5 (with and without causal); soft cap 30; ALiBi (6 q heads: both slope formulas); a random
// packed custom mask (with and without a window; every 7th row masked out); NHD and HND K / V;
// padded q / o rows; lse null and not; v_scale 1 and 0.5; 11 key tiles. The test mirrors
// SinglePrefill's dispatch (validate, the grid of prefill_grid, prefill_smem_bytes, the kernel
// by head dims) and runs the grid's CTAs one at a time, every case under two schedules
// (round-robin with cp.async copies landing at the latest, and warp-eager with copies landing
// at the earliest: see Schedule), ~20 s. o must be within (2 eps_T + 1e-3) max|v| v_scale of
// the reference (P is rounded to T before the PV product), lse within 1e-3 (base 2), rows
// without keys exactly 0 / -inf, and the q / o padding untouched.
// Run: ctest -L emu, or tests/cpp/emu/run_emulated.sh prefill.
#include "cuda_emulator.h"
// (the emulator first)
#include <algorithm>
#include <chrono>
#include <random>
using std::max;
using std::min;

#include "mma_emulated.h"
// (cp.async and mma emulated, before any header that uses them)
#include "flashinfer/attention/decode.cuh"
#include "flashinfer/attention/prefill.h"
#include "flashinfer/attention/state.h"
#include "flashinfer/math.cuh"
#include "flashinfer/utils.cuh"

#include "flashinfer/attention/prefill.cuh"

using namespace flashinfer;
using namespace flashinfer::attention;

namespace flashinfer {
namespace attention {
alignas(16) uint4 prefill_smem[prefill_smem_bytes(256, 256, 1) / 16];  // SinglePrefillKernel's dynamic smem
}  // namespace attention
}  // namespace flashinfer

namespace {

using emu::ft;
using emu::tf;

// Two schedules of a CTA's fibers, both legal on the GPU, so that a missing barrier shows:
//  kRoundRobin, emu::launch's: every ready fiber runs to its next barrier before any barrier
//    opens; cp.async copies land at the latest legal time, the wait that retires their group
//    (a read before the wait sees the 0xff fill);
//  kWarpEager: the highest warp runs as far as it can (through its warp barriers, up to a
//    __syncthreads) before the next warp runs at all, and copies land at the earliest: as soon as
//    the issuing thread yields. A warp that reads shared memory other warps copy without a
//    __syncthreads after the wait, or refills a stage other warps may still read, sees the wrong
//    data. (Round-robin alone hides both: every thread has passed its wait, and no copy lands
//    before one.)
enum class Schedule { kRoundRobin, kWarpEager };
Schedule schedule = Schedule::kRoundRobin;

inline void land_copies(unsigned t) {  // thread t's copies in flight complete now
  for (auto& grp : emu_cp::groups[t])
    for (const auto& c : grp) std::memcpy(c.dst, c.data, size_t(c.bytes));
  for (const auto& c : emu_cp::open[t]) std::memcpy(c.dst, c.data, size_t(c.bytes));
  for (auto& grp : emu_cp::groups[t]) grp.clear();  // (empty groups: wait() retires them)
  emu_cp::open[t].clear();
}

// emu::launch over a 2-D grid (x: row tiles, y: KV heads) under `schedule`, with the prefill
// kernel's dynamic shared memory filled with 0xff (NaN in f16 / bf16) before each CTA.
template <class... KArgs, class... Args>
void launch_2d(void (*kernel)(KArgs...), dim3 grid, unsigned threads, size_t smem, const Args&... args) {
  if (smem > sizeof(prefill_smem)) { std::printf("smem too big %zu\n", smem); std::abort(); }
  const bool eager = schedule == Schedule::kWarpEager;
  const unsigned warps = threads / 32;
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      std::memset(prefill_smem, 0xff, smem);
      emu::start_fibers(int(threads));
      emu::shfl.assign(warps, {});
      emu::fiber_body = [&] { kernel(args...); };
      blockIdx = uint3{bx, by, 0};
      blockDim = dim3(threads);
      gridDim = dim3(grid.x, grid.y);
      auto run_warp = [&](unsigned w) {  // runs warp w's ready fibers; false: none was ready
        bool ran = false;
        for (unsigned t = w * 32; t < w * 32 + 32; ++t) {
          if (emu::fibers[t].wait != 0) continue;
          threadIdx = uint3{t, 0, 0};
          emu::resume(int(t));
          ran = true;
          if (eager) land_copies(t);
        }
        return ran;
      };
      auto open_warp = [&](unsigned w) {  // opens warp w's barrier if all its lanes wait there
        for (unsigned l = 0; l < 32; ++l)
          if (emu::fibers[w * 32 + l].wait != 2) return false;
        for (unsigned l = 0; l < 32; ++l) emu::fibers[w * 32 + l].wait = 0;
        return true;
      };
      for (;;) {
        bool progressed = false;
        if (eager) {  // the highest warp that can move, moves
          for (unsigned w = warps; w-- > 0 && !progressed;) progressed = run_warp(w) || open_warp(w);
        } else {  // every ready fiber runs; then the warp barriers open
          for (unsigned w = 0; w < warps; ++w) progressed = run_warp(w) || progressed;
          if (!progressed)
            for (unsigned w = 0; w < warps; ++w) progressed = open_warp(w) || progressed;
        }
        if (progressed) continue;
        int done = 0, block_wait = 0;
        for (unsigned t = 0; t < threads; ++t)
          done += emu::fibers[t].wait == 3, block_wait += emu::fibers[t].wait == 1;
        if (done == int(threads)) break;
        if (block_wait == int(threads)) {  // __syncthreads opens
          for (auto& f : emu::fibers) f.wait = 0;
        } else {
          std::printf("DEADLOCK in block (%u, %u): states", bx, by);
          for (unsigned t = 0; t < threads; ++t) std::printf(" %d", emu::fibers[t].wait);
          std::printf("\n");
          std::abort();
        }
      }
      for (unsigned t = 0; t < threads; ++t) {  // every cp.async retired by the end of the CTA
        bool pending = !emu_cp::open[t].empty();
        for (const auto& grp : emu_cp::groups[t]) pending = pending || !grp.empty();
        if (pending) {
          std::printf("block (%u, %u) thread %u ends with cp.async copies in flight\n", bx, by, t);
          std::abort();
        }
        emu_cp::groups[t].clear();
      }
    }
}

struct Case {
  int dqk, dvo, group, num_kv_heads;
  int64_t qo_len, kv_len;
  bool causal;
  int window_left;
  float soft_cap;
  bool alibi, mask, hnd, lse;
  float v_scale;
  int pad = 0;  // extra elements per q / o token row (a multiple of 8)
};

template <typename T>
double eps_of() {
  return std::is_same<T, __half>::value ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
}

int failures = 0;
double worst_o = 0, worst_lse = 0;  // max |do| / tolerance and max |dlse| over all cases

template <typename T>
void run_case(const Case& c, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  const int KH = c.num_kv_heads, G = c.group, H = G * KH, DQ = c.dqk, DV = c.dvo;
  const int64_t QL = c.qo_len, KL = c.kv_len;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  const float q_amp = c.soft_cap > 0 ? 8.f : 1.f;  // scores well into the cap's curve
  // q [QL, H, DQ] and o [QL, H, DV], token rows padded by c.pad elements
  const int64_t q_sn = int64_t{H} * DQ + c.pad, o_sn = int64_t{H} * DV + c.pad;
  std::vector<T> q(size_t(QL * q_sn)), o(size_t(QL * o_sn), ft<T>(-777.f));
  for (auto& x : q) x = ft<T>(N(rng) * q_amp);
  // K [KL, KH, DQ] (NHD) or [KH, KL, DQ] (HND); V likewise with DV
  std::vector<T> k(size_t(KL * KH * DQ) + 8), v(size_t(KL * KH * DV) + 8);
  for (auto& x : k) x = ft<T>(N(rng));
  for (auto& x : v) x = ft<T>(N(rng));
  const int64_t k_sn = c.hnd ? DQ : int64_t{KH} * DQ, k_sh = c.hnd ? KL * DQ : DQ;
  const int64_t v_sn = c.hnd ? DV : int64_t{KH} * DV, v_sh = c.hnd ? KL * DV : DV;
  // mask bits i * KL + j, little-endian in each byte
  std::vector<uint8_t> mask(size_t((QL * KL + 7) / 8) + 1);
  for (auto& b : mask) b = uint8_t(rng());
  for (int64_t i = 3; i < QL; i += 7)  // rows the mask empties (among rows that see keys)
    for (int64_t j = 0; j < KL; ++j) mask[size_t((i * KL + j) >> 3)] &= uint8_t(~(1u << ((i * KL + j) & 7)));
  std::vector<float> lse(size_t(QL * H) + 1, 555.f);

  SinglePrefillParams<T> p{};
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.o = o.data();
  p.lse = c.lse ? lse.data() : nullptr;
  p.mask = c.mask ? mask.data() : nullptr;
  p.q_stride_n = q_sn, p.q_stride_h = DQ;
  p.k_stride_n = k_sn, p.k_stride_h = k_sh;
  p.v_stride_n = v_sn, p.v_stride_h = v_sh;
  p.o_stride_n = o_sn, p.o_stride_h = DV;
  p.qo_len = QL, p.kv_len = KL;
  p.num_qo_heads = H, p.num_kv_heads = KH, p.head_dim_qk = DQ, p.head_dim_vo = DV;
  p.causal = c.causal;
  p.window_left = c.window_left;
  p.sm_scale = 1.f / std::sqrt(float(DQ));
  p.soft_cap = c.soft_cap;
  p.alibi = c.alibi;
  p.v_scale = c.v_scale;
  p.pdl = false;

  // as SinglePrefill launches it
  if (validate(p) != Status::kSuccess) {
    std::printf("validate failed\n");
    ++failures;
    return;
  }
  // both M-tile shapes where two are built, alternating over the cases (SinglePrefill picks by
  // grid size, prefill_m_tiles: the emulator's small grids would always take one)
  static int turn = 0;
  const int mt = prefill_max_m_tiles(p.head_dim_qk, p.head_dim_vo) == 2 && (turn++ & 1) ? 2 : 1;
  const PrefillGrid g = prefill_grid(p.qo_len, p.num_qo_heads, p.num_kv_heads, mt);
  const size_t smem = static_cast<size_t>(prefill_smem_bytes(p.head_dim_qk, p.head_dim_vo, mt));
  const dim3 grid(static_cast<unsigned>(g.row_tiles), static_cast<unsigned>(g.kv_heads));
  const int64_t copies0 = emu_cp::copies, mmas0 = emu_mma::ops;
  launch_2d(single_prefill_kernel<T>(p.head_dim_qk, p.head_dim_vo, mt), grid, kPrefillThreads, smem, p);

  // float64 reference
  int nh = 1;
  while (nh * 2 <= H) nh *= 2;
  auto slope_of = [&](int h) {  // float32, as the spec
    return double(h < nh ? std::exp2(-8.f * float(h + 1) / float(nh)) : std::exp2(-4.f * float(2 * (h - nh) + 1) / float(nh)));
  };
  double max_v = 0;
  for (size_t i = 0; i < size_t(KL * KH * DV); ++i) max_v = std::max(max_v, double(std::fabs(tf(v[i]))));
  const double tol = (2 * eps_of<T>() + 1e-3) * max_v * c.v_scale;
  const int64_t delta = KL - QL;
  double max_err = 0, max_lse_err = 0;
  int bad_o = 0, bad_lse = 0, bad_empty = 0, bad_pad = 0;
  int64_t first_bad_row = -1;
  int first_bad_head = -1;
  std::vector<double> s(static_cast<size_t>(KL)), acc(DV);
  std::vector<char> vis(static_cast<size_t>(KL));
  for (int64_t i = 0; i < QL; ++i)
    for (int h = 0; h < H; ++h) {
      const int kh = h / G;
      double mx = -INFINITY;
      for (int64_t j = 0; j < KL; ++j) {
        bool ok = true;
        if (c.mask) {
          const int64_t bit = i * KL + j;
          ok = (mask[size_t(bit >> 3)] >> (bit & 7)) & 1;
        } else if (c.causal) {
          ok = j <= i + delta;
        }
        if (c.window_left >= 0) ok = ok && j >= i + delta - c.window_left;
        vis[size_t(j)] = ok;
        if (!ok) continue;
        double x = 0;
        for (int d = 0; d < DQ; ++d) x += double(tf(q[size_t(i * q_sn + h * DQ + d)])) * tf(k[size_t(j * k_sn + kh * k_sh + d)]);
        double sc = p.sm_scale * x;
        if (c.soft_cap > 0) sc = c.soft_cap * std::tanh(sc / c.soft_cap);
        if (c.alibi) sc += slope_of(h) * double(j - i);
        s[size_t(j)] = sc;
        mx = std::max(mx, sc);
      }
      double den = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < KL; ++j) {
        if (!vis[size_t(j)]) continue;
        const double w = std::exp(s[size_t(j)] - mx);
        den += w;
        for (int d = 0; d < DV; ++d) acc[d] += w * tf(v[size_t(j * v_sn + kh * v_sh + d)]);
      }
      bool row_bad = false;
      for (int d = 0; d < DV; ++d) {
        const double got = tf(o[size_t(i * o_sn + h * DV + d)]);
        if (den == 0) {
          if (got != 0.0) ++bad_empty, row_bad = true;
          continue;
        }
        const double ref = acc[d] / den * c.v_scale;
        const double err = std::fabs(got - ref);
        if (!(err <= tol)) ++bad_o, row_bad = true;
        if (!(err <= max_err)) max_err = err;  // (NaN sticks)
      }
      if (c.lse) {
        const float got = lse[size_t(i * H + h)];
        if (den == 0) {
          if (!(std::isinf(got) && got < 0)) ++bad_empty, row_bad = true;
        } else {
          const double ref = (mx + std::log(den)) / std::log(2.0);
          const double e = std::fabs(got - ref);
          if (!(e <= max_lse_err)) max_lse_err = e;
          if (!(e <= 1e-3)) ++bad_lse, row_bad = true;
        }
      }
      if (row_bad && first_bad_row < 0) first_bad_row = i, first_bad_head = h;
    }
  for (int64_t i = 0; i < QL; ++i)  // padding untouched
    for (int e = 0; e < c.pad; ++e)
      if (tf(o[size_t(i * o_sn + int64_t{H} * DV + e)]) != tf(ft<T>(-777.f))) ++bad_pad;
  if (c.lse && lse[size_t(QL * H)] != 555.f) ++bad_pad;
  if (!c.lse)
    for (float x : lse)
      if (x != 555.f) ++bad_pad;
  const bool bad = bad_o || bad_lse || bad_empty || bad_pad;
  worst_o = std::max(worst_o, max_err / tol);
  worst_lse = std::max(worst_lse, max_lse_err);
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::printf("%s %-4s d=%d/%d g=%d kvh=%d qo=%3ld kv=%3ld causal=%d win=%2d cap=%2.0f alibi=%d mask=%d %s lse=%d "
              "vs=%.1f pad=%d grid=%ux%u: max|do|=%.2e (tol %.2e) max|dlse|=%.2e [%.1fs, %ld cp.async, %ld warp mma/ldmatrix] %s",
              schedule == Schedule::kWarpEager ? "eager" : "rr   ", std::is_same<T, __half>::value ? "f16" : "bf16", DQ, DV, G, KH, long(QL), long(KL), c.causal,
              c.window_left, c.soft_cap, c.alibi, c.mask, c.hnd ? "HND" : "NHD", c.lse, c.v_scale, c.pad, grid.x,
              grid.y, max_err, tol, max_lse_err, secs, long(emu_cp::copies - copies0), long(emu_mma::ops - mmas0),
              bad ? "FAIL" : "ok");
  if (bad)
    std::printf(" (bad o %d, bad lse %d, bad empty rows %d, bad padding %d; first bad row %ld head %d)", bad_o, bad_lse,
                bad_empty, bad_pad, long(first_bad_row), first_bad_head);
  std::printf("\n");
  std::fflush(stdout);
  if (bad) ++failures;
}

}  // namespace

int main() {
  const auto t0 = std::chrono::steady_clock::now();
  struct F {
    int group, kvh;
    int64_t qo, kv;
    bool causal;
    int win;
    float cap;
    bool alibi, mask, hnd, lse;
    float vs;
    int pad;
  };
  // Feature cases, each at every head-dim pair, in f16 and in bf16.
  const std::vector<F> features = {
      // g, kvh, qo, kv, causal, win, cap, alibi, mask, hnd, lse, v_scale, pad
      {1, 2, 5, 37, false, -1, 0.f, false, false, false, true, 1.f, 0},     // plain, 2 KV heads
      {4, 1, 70, 130, true, -1, 0.f, false, false, true, true, 1.f, 8},     // causal, 5 row tiles, HND, padded rows
      {3, 2, 70, 37, true, -1, 0.f, false, false, false, true, 0.5f, 0},    // causal, qo > kv: empty rows
      {1, 1, 70, 130, true, 5, 0.f, false, false, false, true, 1.f, 0},     // causal + window
      {4, 1, 5, 130, false, 5, 0.f, false, false, true, false, 1.f, 0},     // window only, lse null
      {3, 1, 5, 130, false, -1, 30.f, false, false, false, true, 1.f, 0},   // soft cap
      {3, 2, 70, 37, false, -1, 0.f, true, false, true, true, 1.f, 0},      // ALiBi, 6 q heads
      {4, 1, 70, 130, false, -1, 0.f, false, true, false, true, 0.5f, 8},   // custom mask
      {1, 1, 70, 37, true, 5, 0.f, false, true, true, true, 1.f, 0},        // mask (replaces causal) + window
      {1, 1, 1, 1, false, -1, 0.f, false, false, false, true, 1.f, 0},      // one row, one key
      {3, 1, 1, 130, true, -1, 0.f, false, false, true, false, 1.f, 0},     // one token, causal
      {4, 1, 70, 1, true, -1, 0.f, false, false, false, true, 1.f, 0},      // one key: only the last row sees it
      {4, 1, 70, 700, true, -1, 0.f, true, false, true, true, 1.f, 0},      // 11 key tiles (stages reused), ALiBi
      {1, 2, 70, 700, false, 100, 30.f, false, false, false, true, 1.f, 0}, // window skips leading tiles, cap
  };
  const int dims[4][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}};
  uint64_t seed = 1;
  auto run = [&](bool bf16, int di, const F& f) {
    const Case c{dims[di][0], dims[di][1], f.group, f.kvh, f.qo, f.kv, f.causal, f.win, f.cap, f.alibi, f.mask,
                 f.hnd, f.lse, f.vs, f.pad};
    if (bf16)
      run_case<__nv_bfloat16>(c, seed++);
    else
      run_case<__half>(c, seed++);
  };
  for (Schedule sched : {Schedule::kRoundRobin, Schedule::kWarpEager}) {
    schedule = sched;
    seed = 1;
    for (int bf16 = 0; bf16 < 2; ++bf16)
      for (int di = 0; di < 4; ++di)
        for (const F& f : features) run(bf16, di, f);
    // Sweep: group x qo_len x kv_len x causal, rotating head dims, type, KV heads, layout, window,
    // ALiBi, lse and v_scale.
    int n = 0;
    for (int group : {1, 3, 4})
      for (int64_t qo : {1, 5, 70})
        for (int64_t kv : {1, 37, 130})
          for (bool causal : {false, true}) {
            const F f{group, 1 + n % 2, qo, kv, causal, n % 3 == 1 ? 5 : -1, 0.f, n % 4 == 2, false, n % 2 == 0,
                      n % 5 != 3, n % 2 ? 0.5f : 1.f, 0};
            run(n % 3 == 0, n % 4, f);
            ++n;
          }
  }
  std::printf("worst max|do| / tol %.3f, worst max|dlse| %.2e, %.1f s\n", worst_o, worst_lse,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::printf(failures ? "FAILED: %d\n" : "all ok\n", failures);
  return failures ? 1 : 0;
}
