// The tensor-core prefill kernel PrefillKernel (prefill.cuh) run on the CPU by
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
// at the earliest: see Schedule), ~22 s. o must be within (2 eps_T + 1e-3) max|v| v_scale of
// the reference (P is rounded to T before the PV product), lse within 1e-3 (base 2), rows
// without keys exactly 0 / -inf, and the q / o padding untouched.
// Batch (BatchPrefill's launch: validate_batch, p.items of prefill_plan_batch with m_tiles 1 and
// 2 alternating where both are built, prefill_kernel<T, mode>, grid (num_items, KV
// heads); ~4 s): 1-4 requests of ragged lengths, with qo_len 0 and kv_len 0 requests; ragged K /
// V (NHD, HND) and paged caches (NHD [pages, page_size, H, D], HND [pages, H, page_size, D];
// page sizes 1, 5, 16; page ids shuffled; last pages partly filled; a page two requests share;
// an id outside the cache, read as zeros; NaN in every entry no request reads); causal
// (bottom-right per request), window, soft cap, ALiBi, custom masks in per-request byte-aligned
// segments at mask_indptr (random gap bytes between them); groups 1 and 3; the same head dims,
// types and checks, one reference for both (check_request), and after every CTA only its own o
// / lse elements (its request's rows of its tile, its KV head's q heads) may have changed; q /
// o padding, rows no request owns and the inputs stay untouched.
// Head dim 512 (PrefillVO::kParts: grid z = four 128-column V / O parts): 4 single and 3 batch
// cases. MLA (BatchMla's launch: PrefillVO::kMla, K = [ckv || kpe] from two paged caches with
// their own strides, V read from the K tile): 4 batches with 128- and 256-column parts (kpe 64
// and 0, page sizes 1 / 5 / 16, qo_len 0 / kv_len 0 / qo > kv requests, causal both, a request
// given a spare page, last_page_len <= 0, that must never be read).
// wgmma kernels (sm_90a's path for whole-column head dims; wgmma_emulated.h runs each product at
// the wait that retires it): every feature case at every head-dim pair and every batch case,
// three schedules, ~15 s. The overlapped loop: EMU_FLAGS=-DFLASHINFER_PREFILL_WG_OVERLAP=1.
// Single prefill's warp-specialized kernel (head_dim 128, two M tiles; barrier_emulated.h's
// mbarriers and named barriers) alternates with the plain one; its modes 2 / 3:
// EMU_FLAGS=-DFLASHINFER_PREFILL_WS=3.
// Run: ctest -L emu, or tests/cpp/emu/run_emulated.sh prefill.
#include "cuda_emulator.h"
// (the emulator first)
#include <algorithm>
#include <chrono>
#include <functional>
#include <limits>
#include <random>
#include <string>
using std::max;
using std::min;

#include "mma_emulated.h"
#include "barrier_emulated.h"
#include "wgmma_emulated.h"
// (cp.async, mma and wgmma emulated, before any header that uses them; the wgmma kernels are
// built as in an sm_90a build)
#define FLASHINFER_ENABLE_WGMMA 1
#include "flashinfer/attention/decode.cuh"
#include "flashinfer/attention/prefill.h"
#include "flashinfer/attention/state.h"
#include "flashinfer/math.cuh"
#include "flashinfer/utils.cuh"

#include "flashinfer/attention/prefill.cuh"
#include "flashinfer/attention/mla.cuh"

using namespace flashinfer;
using namespace flashinfer::attention;

namespace flashinfer {
namespace attention {
// PrefillKernel's dynamic smem: the largest kernel's (head_dim 512 in parts, MLA)
constexpr int64_t kEmuSmem = prefill_smem_bytes(512, 512, 1) > prefill_smem_bytes(576, 512, 1, 2, true)
                                 ? prefill_smem_bytes(512, 512, 1)
                                 : prefill_smem_bytes(576, 512, 1, 2, true);
alignas(16) uint4 prefill_smem[kEmuSmem / 16];
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
//  kLowEager (the wgmma pass): kWarpEager from the lowest warp up, so a warp-specialized CTA's
//    producer (warpgroup 0) runs ahead of its consumers whenever it can (a fiber spinning on an
//    mbarrier wakes as soon as a phase completes), and its copies land at once: a stage released
//    before its last product has read it shows.
enum class Schedule { kRoundRobin, kWarpEager, kLowEager };
Schedule schedule = Schedule::kRoundRobin;
// The wgmma kernels (PrefillKernel's kWg, wgmma_emulated.h) instead of the mma.sync ones.
bool g_wg = false;

// Called after each CTA of launch_2d with its block index, where set (the batch test's check
// that a CTA writes only its own rows).
std::function<void(unsigned, unsigned)> after_cta;

// emu::launch over a grid (x: row tiles, y: KV heads, z: V / O column parts) under `schedule`,
// with the prefill kernel's dynamic shared memory filled with 0xff (NaN in f16 / bf16) before
// each CTA.
template <class... KArgs, class... Args>
void launch_2d(void (*kernel)(KArgs...), dim3 grid, unsigned threads, size_t smem, const Args&... args) {
  if (smem > sizeof(prefill_smem)) { std::printf("smem too big %zu\n", smem); std::abort(); }
  const bool eager = schedule != Schedule::kRoundRobin, low = schedule == Schedule::kLowEager;
  const unsigned warps = threads / 32;
  for (unsigned bz = 0; bz < grid.z; ++bz)
  for (unsigned by = 0; by < grid.y; ++by)
    for (unsigned bx = 0; bx < grid.x; ++bx) {
      std::memset(prefill_smem, 0xff, smem);
      emu::start_fibers(int(threads));
      emu::shfl.assign(warps, {});
      emu::fiber_body = [&] { kernel(args...); };
      blockIdx = uint3{bx, by, bz};
      blockDim = dim3(threads);
      gridDim = dim3(grid.x, grid.y, grid.z);
      auto run_warp = [&](unsigned w) {  // runs warp w's ready fibers; false: none was ready
        bool ran = false;
        for (unsigned t = w * 32; t < w * 32 + 32; ++t) {
          if (emu::fibers[t].wait != 0) continue;
          threadIdx = uint3{t, 0, 0};
          emu::resume(int(t));
          ran = true;
          if (eager) emu_cp::land(t);
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
        if (low) {  // the lowest warp that can move, moves (mbarrier spinners wake at once)
          emu_bar::release(int(threads));
          for (unsigned w = 0; w < warps && !progressed; ++w) progressed = run_warp(w) || open_warp(w);
        } else if (eager) {  // the highest warp that can move, moves
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
        } else if (!emu_bar::release(int(threads))) {  // (a named barrier, or mbarrier spinners)
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
      emu_bar::end_cta();
      if (after_cta) after_cta(bx, by);
    }
}

// What the reference needs of a case (single or batch): the shapes and the score options.
struct Attn {
  int dqk, dvo, group, num_kv_heads;
  bool causal;
  int window_left;
  float soft_cap;
  bool alibi, mask, lse;
  float v_scale;
  float sm_scale() const { return 1.f / std::sqrt(float(dqk)); }
};

// A case's verdict, accumulated over its requests.
struct Result {
  double tol = 0, max_err = 0, max_lse_err = 0;
  int bad_o = 0, bad_lse = 0, bad_empty = 0, bad_pad = 0, bad_stray = 0;
  int first_bad_req = -1, first_bad_head = -1;
  int64_t first_bad_row = -1;
  bool bad() const { return bad_o || bad_lse || bad_empty || bad_pad || bad_stray; }
};

template <typename T>
double eps_of() {
  return std::is_same<T, __half>::value ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
}
template <typename T>
const char* type_name() {
  return std::is_same<T, __half>::value ? "f16 " : "bf16";
}
const char* sched_name() {
  if (g_wg) return schedule == Schedule::kWarpEager ? "wg eager" : schedule == Schedule::kLowEager ? "wg low  " : "wg rr   ";
  return schedule == Schedule::kWarpEager ? "eager" : "rr   ";
}

// The float64 reference of request `req` (query rows 0 .. QL-1, keys 0 .. KL-1, its own
// indices) against the kernel's o and lse, through accessors of the request's elements:
// q(i, h, d), k(j, kh, d), v(j, kh, d) and o(i, h, d) as doubles, lse(i, h) as float, and
// mask_bit(i, j). o must be within r.tol of the reference, lse within 1e-3 (base 2), rows
// without keys exactly 0 / -inf.
template <class QF, class KF, class VF, class OF, class LF, class MF>
void check_request(const Attn& a, int req, int64_t QL, int64_t KL, const QF& q, const KF& k, const VF& v,
                   const OF& o, const LF& lse, const MF& mask_bit, Result& r) {
  const int G = a.group, H = G * a.num_kv_heads, DQ = a.dqk, DV = a.dvo;
  const double sm_scale = a.sm_scale();
  int nh = 1;
  while (nh * 2 <= H) nh *= 2;
  auto slope_of = [&](int h) {  // float32, as the spec
    return double(h < nh ? std::exp2(-8.f * float(h + 1) / float(nh)) : std::exp2(-4.f * float(2 * (h - nh) + 1) / float(nh)));
  };
  const int64_t delta = KL - QL;
  std::vector<double> s(static_cast<size_t>(KL)), acc(DV);
  std::vector<char> vis(static_cast<size_t>(KL));
  for (int64_t i = 0; i < QL; ++i)
    for (int h = 0; h < H; ++h) {
      const int kh = h / G;
      double mx = -INFINITY;
      for (int64_t j = 0; j < KL; ++j) {
        bool ok = true;
        if (a.mask) {
          ok = mask_bit(i, j);
        } else if (a.causal) {
          ok = j <= i + delta;
        }
        if (a.window_left >= 0) ok = ok && j >= i + delta - a.window_left;
        vis[size_t(j)] = ok;
        if (!ok) continue;
        double x = 0;
        for (int d = 0; d < DQ; ++d) x += q(i, h, d) * k(j, kh, d);
        double sc = sm_scale * x;
        if (a.soft_cap > 0) sc = a.soft_cap * std::tanh(sc / a.soft_cap);
        if (a.alibi) sc += slope_of(h) * double(j - i);
        s[size_t(j)] = sc;
        mx = std::max(mx, sc);
      }
      double den = 0;
      std::fill(acc.begin(), acc.end(), 0.0);
      for (int64_t j = 0; j < KL; ++j) {
        if (!vis[size_t(j)]) continue;
        const double w = std::exp(s[size_t(j)] - mx);
        den += w;
        for (int d = 0; d < DV; ++d) acc[d] += w * v(j, kh, d);
      }
      bool row_bad = false;
      for (int d = 0; d < DV; ++d) {
        const double got = o(i, h, d);
        if (den == 0) {
          if (got != 0.0) ++r.bad_empty, row_bad = true;
          continue;
        }
        const double ref = acc[d] / den * a.v_scale;
        const double err = std::fabs(got - ref);
        if (!(err <= r.tol)) ++r.bad_o, row_bad = true;
        if (!(err <= r.max_err)) r.max_err = err;  // (NaN sticks)
      }
      if (a.lse) {
        const float got = lse(i, h);
        if (den == 0) {
          if (!(std::isinf(got) && got < 0)) ++r.bad_empty, row_bad = true;
        } else {
          const double ref = (mx + std::log(den)) / std::log(2.0);
          const double e = std::fabs(got - ref);
          if (!(e <= r.max_lse_err)) r.max_lse_err = e;
          if (!(e <= 1e-3)) ++r.bad_lse, row_bad = true;
        }
      }
      if (row_bad && r.first_bad_row < 0) r.first_bad_req = req, r.first_bad_row = i, r.first_bad_head = h;
    }
}

int failures = 0;
double worst_o = 0, worst_lse = 0;  // max |do| / tolerance and max |dlse| over all cases

// Prints a case's line (`what` describes it) and counts it.
void report(const std::string& what, const Result& r, double secs, int64_t copies, int64_t mmas) {
  if (r.tol > 0) worst_o = std::max(worst_o, r.max_err / r.tol);  // (tol 0: no finite v, every row empty)
  worst_lse = std::max(worst_lse, r.max_lse_err);
  std::printf("%s: max|do|=%.2e (tol %.2e) max|dlse|=%.2e [%.1fs, %ld cp.async, %ld warp mma/ldmatrix] %s", what.c_str(),
              r.max_err, r.tol, r.max_lse_err, secs, long(copies), long(mmas), r.bad() ? "FAIL" : "ok");
  if (r.bad())
    std::printf(" (bad o %d, bad lse %d, bad empty rows %d, bad padding %d, stray writes %d; first bad request %d row %ld head %d)",
                r.bad_o, r.bad_lse, r.bad_empty, r.bad_pad, r.bad_stray, r.first_bad_req, long(r.first_bad_row),
                r.first_bad_head);
  std::printf("\n");
  std::fflush(stdout);
  if (r.bad()) ++failures;
}

template <class... A>
std::string fmt(const char* f, A... a) {
  char buf[512];
  std::snprintf(buf, sizeof buf, f, a...);
  return buf;
}

double max_abs(const std::vector<double>& xs) {
  double m = 0;
  for (double x : xs)
    if (std::isfinite(x)) m = std::max(m, std::fabs(x));
  return m;
}

// Fills params' options (not the tensors) from a.
template <typename T>
void set_options(PrefillParams<T>& p, const Attn& a) {
  p.num_qo_heads = a.group * a.num_kv_heads, p.num_kv_heads = a.num_kv_heads;
  p.head_dim_qk = a.dqk, p.head_dim_vo = a.dvo;
  p.causal = a.causal;
  p.window_left = a.window_left;
  p.sm_scale = a.sm_scale();
  p.soft_cap = a.soft_cap;
  p.alibi = a.alibi;
  p.v_scale = a.v_scale;
  p.pdl = false;
}

// ---- single request (SinglePrefill) ----

struct Case {
  Attn a;
  int64_t qo_len, kv_len;
  bool hnd;
  int pad = 0;  // extra elements per q / o token row (a multiple of 8)
};

template <typename T>
void run_case(const Case& c, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  const Attn& a = c.a;
  const int KH = a.num_kv_heads, G = a.group, H = G * KH, DQ = a.dqk, DV = a.dvo;
  const int64_t QL = c.qo_len, KL = c.kv_len;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  const float q_amp = a.soft_cap > 0 ? 8.f : 1.f;  // scores well into the cap's curve
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

  PrefillParams<T> p{};
  set_options(p, a);
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.o = o.data();
  p.lse = a.lse ? lse.data() : nullptr;
  p.mask = a.mask ? mask.data() : nullptr;
  p.q_stride_n = q_sn, p.q_stride_h = DQ;
  p.k_stride_n = k_sn, p.k_stride_h = k_sh;
  p.v_stride_n = v_sn, p.v_stride_h = v_sh;
  p.o_stride_n = o_sn, p.o_stride_h = DV;
  p.qo_len = QL, p.kv_len = KL;

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
  // wgmma, two M tiles at head_dim 128: the warp-specialized kernel and the plain one, alternating
  // (SinglePrefill picks by prefill_single_ws)
  static int ws_turn = 0;
  const bool ws = g_wg && mt == 2 && p.head_dim_qk == 128 && p.head_dim_vo == 128 && (ws_turn++ & 1);
  const PrefillGrid g = prefill_grid(p.qo_len, p.num_qo_heads, p.num_kv_heads, mt);
  const size_t smem = static_cast<size_t>(prefill_kernel_smem_bytes(
      p.head_dim_qk, p.head_dim_vo, mt, prefill_vo_parts(p.head_dim_vo) > 1 ? PrefillVO::kParts : PrefillVO::kWhole, g_wg,
      ws));
  const dim3 grid(static_cast<unsigned>(g.row_tiles), static_cast<unsigned>(g.kv_heads),
                  static_cast<unsigned>(prefill_vo_parts(p.head_dim_vo)));
  const int64_t copies0 = emu_cp::copies, mmas0 = emu_mma::ops;
  launch_2d(prefill_kernel<T>(p.head_dim_qk, p.head_dim_vo, mt, g_wg, ws), grid,
            prefill_kernel_threads(PrefillVO::kWhole, g_wg, mt, ws), smem, p);

  Result r;
  double max_v = 0;
  for (size_t i = 0; i < size_t(KL * KH * DV); ++i) max_v = std::max(max_v, double(std::fabs(tf(v[i]))));
  r.tol = (2 * eps_of<T>() + 1e-3) * max_v * a.v_scale;  // (P is rounded to T before the PV product)
  check_request(
      a, 0, QL, KL, [&](int64_t i, int h, int d) { return double(tf(q[size_t(i * q_sn + h * DQ + d)])); },
      [&](int64_t j, int kh, int d) { return double(tf(k[size_t(j * k_sn + kh * k_sh + d)])); },
      [&](int64_t j, int kh, int d) { return double(tf(v[size_t(j * v_sn + kh * v_sh + d)])); },
      [&](int64_t i, int h, int d) { return double(tf(o[size_t(i * o_sn + h * DV + d)])); },
      [&](int64_t i, int h) { return lse[size_t(i * H + h)]; },
      [&](int64_t i, int64_t j) {
        const int64_t bit = i * KL + j;
        return bool((mask[size_t(bit >> 3)] >> (bit & 7)) & 1);
      },
      r);
  for (int64_t i = 0; i < QL; ++i)  // padding untouched
    for (int e = 0; e < c.pad; ++e)
      if (tf(o[size_t(i * o_sn + int64_t{H} * DV + e)]) != tf(ft<T>(-777.f))) ++r.bad_pad;
  if (a.lse && lse[size_t(QL * H)] != 555.f) ++r.bad_pad;
  if (!a.lse)
    for (float x : lse)
      if (x != 555.f) ++r.bad_pad;
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report(fmt("%s %s d=%d/%d g=%d kvh=%d qo=%3ld kv=%3ld causal=%d win=%2d cap=%2.0f alibi=%d mask=%d %s lse=%d "
             "vs=%.1f pad=%d grid=%ux%u",
             sched_name(), type_name<T>(), DQ, DV, G, KH, long(QL), long(KL), a.causal, a.window_left, a.soft_cap,
             a.alibi, a.mask, c.hnd ? "HND" : "NHD", a.lse, a.v_scale, c.pad, grid.x, grid.y),
         r, secs, emu_cp::copies - copies0, emu_mma::ops - mmas0);
}

// ---- batch (BatchPrefill) ----

struct BatchCase {
  Attn a;
  std::vector<int64_t> qo_lens, kv_lens;  // per request
  bool hnd;
  int pad;        // extra elements per q / o token row (a multiple of 8)
  int page_size;  // 0: ragged keys
  bool share;     // paged: request 1's first page is request 0's (a shared prefix)
  bool oob;       // paged: a page id of the last request with 2+ pages is num_pages (reads as zeros)
};

// One batch launched as BatchPrefill launches it: validate_batch, p.items of prefill_plan_batch
// for m_tiles `mt`, the kernel of prefill_kernel<T, mode>, grid (num_items, KV heads).
// Split-KV's partial states o_part [rows, C, H, D] / lse_part [rows, C, H] merged in float64
// (state.h's rule, as BatchPrefill's MergeStates launch does) into o (rows o_sn apart, heads D)
// and, with want_lse, lse [rows, H]; a row no chunk saw gives o = 0, lse = -inf.
template <typename T>
void merge_chunks(int64_t rows, int C, int H, int D, const std::vector<T>& o_part, const std::vector<float>& lse_part,
                  std::vector<T>& o, int64_t o_sn, std::vector<float>& lse, bool want_lse) {
  for (int64_t row = 0; row < rows; ++row)
    for (int h = 0; h < H; ++h) {
      auto at = [&](int ch) { return size_t((row * C + ch) * H + h); };
      double m = -INFINITY;
      for (int ch = 0; ch < C; ++ch) m = std::max(m, double(lse_part[at(ch)]));
      std::vector<double> acc(size_t(D), 0.0);
      double den = 0;
      for (int ch = 0; ch < C && m > -INFINITY; ++ch) {
        const double w = std::exp2(double(lse_part[at(ch)]) - m);
        den += w;
        for (int d = 0; d < D; ++d) acc[size_t(d)] += w * tf(o_part[at(ch) * size_t(D) + size_t(d)]);
      }
      for (int d = 0; d < D; ++d) o[size_t(row * o_sn + h * D + d)] = ft<T>(den > 0 ? float(acc[size_t(d)] / den) : 0.f);
      if (want_lse) lse[size_t(row * H + h)] = den > 0 ? float(m + std::log2(den)) : -INFINITY;
    }
}

// q / o / lse: the requests' rows back to back, then 3 rows no request owns; o starts as -777,
// lse as 555. Ragged K / V: [total keys, KH, D] (NHD) or [KH, total keys, D] (HND); paged:
// caches [num_pages, page_size, KH, D] (NHD) or [num_pages, KH, page_size, D] (HND), the pages
// of the requests in random order among 3 spare pages, the entries no request reads (spare
// pages, past a last page's fill) NaN. The custom mask: per request a byte-aligned segment at
// mask_indptr[b] (bit i * kv_len_b + j), random gap bytes between segments. After every CTA,
// the o and lse elements that changed must be the CTA's own (its request's rows of its row tile,
// its KV head's q heads); after the launch q, K, V and the mask must be unchanged. Split-KV
// (chunks > 1, one M tile): items of prefill_split_items, partial states [rows, chunks, H, DV] /
// [rows, chunks, H] (NaN where no item writes) merged here in float64 as BatchPrefill's merge
// does (no per-CTA write check then).
template <typename T>
void run_batch(const BatchCase& c, int mt, uint64_t seed, int chunks = 1) {
  const auto t0 = std::chrono::steady_clock::now();
  const Attn& a = c.a;
  const int KH = a.num_kv_heads, G = a.group, H = G * KH, DQ = a.dqk, DV = a.dvo;
  const int B = static_cast<int>(c.qo_lens.size());
  const bool paged = c.page_size > 0;
  const int PS = c.page_size;
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  const float q_amp = a.soft_cap > 0 ? 8.f : 1.f;
  const float nan = std::numeric_limits<float>::quiet_NaN();

  std::vector<int32_t> qo_indptr(B + 1, 0), kv_indptr(B + 1, 0), last_page_len(B, 0), mask_indptr(B, 0);
  for (int b = 0; b < B; ++b) qo_indptr[b + 1] = qo_indptr[b] + int32_t(c.qo_lens[b]);
  const int64_t q_rows = qo_indptr[B] + 3;
  const int64_t q_sn = int64_t{H} * DQ + c.pad, o_sn = int64_t{H} * DV + c.pad;
  std::vector<T> q(size_t(q_rows * q_sn)), o(size_t(q_rows * o_sn), ft<T>(-777.f));
  for (auto& x : q) x = ft<T>(N(rng) * q_amp);
  std::vector<float> lse(size_t(q_rows * H) + 1, 555.f);

  // keys
  std::vector<int32_t> page_indices;
  int64_t num_pages = 0, kv_rows = 0;  // kv_rows: token rows of K / V (ragged) or entries of all pages
  if (!paged) {
    for (int b = 0; b < B; ++b) kv_indptr[b + 1] = kv_indptr[b] + int32_t(c.kv_lens[b]);
    kv_rows = kv_indptr[B];
  } else {
    for (int b = 0; b < B; ++b) {
      const int64_t n = (c.kv_lens[b] + PS - 1) / PS;
      kv_indptr[b + 1] = kv_indptr[b] + int32_t(n);
      last_page_len[b] = n > 0 ? int32_t(c.kv_lens[b] - (n - 1) * PS) : 7;  // (no pages: ignored)
    }
    num_pages = kv_indptr[B] + 3;
    std::vector<int32_t> perm(static_cast<size_t>(num_pages));
    for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
    std::shuffle(perm.begin(), perm.end(), rng);
    page_indices.assign(perm.begin(), perm.begin() + kv_indptr[B]);
    if (c.share && B >= 2 && kv_indptr[1] > 0 && kv_indptr[2] > kv_indptr[1])
      page_indices[size_t(kv_indptr[1])] = page_indices[0];
    if (c.oob)
      for (int b = B - 1; b >= 0; --b)
        if (kv_indptr[b + 1] - kv_indptr[b] >= 2) {
          page_indices[size_t(kv_indptr[b] + 1)] = int32_t(num_pages);
          break;
        }
    kv_rows = num_pages * PS;
  }
  std::vector<T> k(size_t(kv_rows * KH * DQ) + 8), v(size_t(kv_rows * KH * DV) + 8);
  for (auto& x : k) x = ft<T>(N(rng));
  for (auto& x : v) x = ft<T>(N(rng));
  int64_t k_sn, k_sh, v_sn, v_sh, k_sp = 0, v_sp = 0;
  if (!paged) {
    k_sn = c.hnd ? DQ : int64_t{KH} * DQ, k_sh = c.hnd ? kv_rows * DQ : DQ;
    v_sn = c.hnd ? DV : int64_t{KH} * DV, v_sh = c.hnd ? kv_rows * DV : DV;
  } else {
    k_sp = int64_t{PS} * KH * DQ, v_sp = int64_t{PS} * KH * DV;
    k_sn = c.hnd ? DQ : int64_t{KH} * DQ, k_sh = c.hnd ? int64_t{PS} * DQ : DQ;
    v_sn = c.hnd ? DV : int64_t{KH} * DV, v_sh = c.hnd ? int64_t{PS} * DV : DV;
    // entries no request reads: NaN
    std::vector<int> used(static_cast<size_t>(num_pages), 0);
    for (int b = 0; b < B; ++b)
      for (int32_t s = kv_indptr[b]; s < kv_indptr[b + 1]; ++s) {
        const int32_t pg = page_indices[size_t(s)];
        if (pg < 0 || pg >= num_pages) continue;
        used[size_t(pg)] = std::max(used[size_t(pg)], s + 1 < kv_indptr[b + 1] ? PS : last_page_len[b]);
      }
    for (int64_t pg = 0; pg < num_pages; ++pg)
      for (int e = used[size_t(pg)]; e < PS; ++e)
        for (int kh = 0; kh < KH; ++kh) {
          for (int d = 0; d < DQ; ++d) k[size_t(pg * k_sp + e * k_sn + kh * k_sh + d)] = ft<T>(nan);
          for (int d = 0; d < DV; ++d) v[size_t(pg * v_sp + e * v_sn + kh * v_sh + d)] = ft<T>(nan);
        }
  }
  for (size_t i = k.size() - 8; i < k.size(); ++i) k[i] = ft<T>(nan);
  for (size_t i = v.size() - 8; i < v.size(); ++i) v[i] = ft<T>(nan);
  auto k_off = [&](int b, int64_t j, int kh) -> int64_t {  // offset of K[key j of b, kh, 0], -1: zeros
    if (!paged) return (kv_indptr[b] + j) * k_sn + kh * k_sh;
    const int64_t pg = page_indices[size_t(kv_indptr[b] + j / PS)];
    return pg < 0 || pg >= num_pages ? -1 : pg * k_sp + (j % PS) * k_sn + kh * k_sh;
  };
  auto v_off = [&](int b, int64_t j, int kh) -> int64_t {
    if (!paged) return (kv_indptr[b] + j) * v_sn + kh * v_sh;
    const int64_t pg = page_indices[size_t(kv_indptr[b] + j / PS)];
    return pg < 0 || pg >= num_pages ? -1 : pg * v_sp + (j % PS) * v_sn + kh * v_sh;
  };

  // custom mask: byte-aligned segments, random gaps, every 7th row of a request (from row 3) empty
  std::vector<uint8_t> mask;
  for (int b = 0; b < B; ++b) {
    mask.resize(mask.size() + rng() % 3);
    mask_indptr[b] = int32_t(mask.size());
    mask.resize(mask.size() + size_t((c.qo_lens[b] * c.kv_lens[b] + 7) / 8));
  }
  mask.resize(mask.size() + 2);
  for (auto& x : mask) x = uint8_t(rng());
  for (int b = 0; b < B; ++b)
    for (int64_t i = 3; i < c.qo_lens[b]; i += 7)
      for (int64_t j = 0; j < c.kv_lens[b]; ++j) {
        const int64_t bit = int64_t{mask_indptr[b]} * 8 + i * c.kv_lens[b] + j;
        mask[size_t(bit >> 3)] &= uint8_t(~(1u << (bit & 7)));
      }

  const int C = chunks > 1 ? chunks : 1;
  const std::vector<int32_t> items = prefill_split_items(prefill_plan_batch(c.qo_lens, c.kv_lens, G, mt), C);
  std::vector<T> o_part(size_t(qo_indptr[B] * C * H * DV), ft<T>(nan));
  std::vector<float> lse_part(size_t(qo_indptr[B] * C * H), nan);
  PrefillParams<T> p{};
  set_options(p, a);
  p.q = q.data(), p.k = k.data(), p.v = v.data(), p.o = o.data();
  p.lse = a.lse ? lse.data() : nullptr;
  p.mask = a.mask ? mask.data() : nullptr;
  p.q_stride_n = q_sn, p.q_stride_h = DQ;
  p.k_stride_n = k_sn, p.k_stride_h = k_sh;
  p.v_stride_n = v_sn, p.v_stride_h = v_sh;
  p.o_stride_n = o_sn, p.o_stride_h = DV;
  p.qo_indptr = qo_indptr.data(), p.kv_indptr = kv_indptr.data();
  p.page_indices = paged ? page_indices.data() : nullptr;
  p.last_page_len = paged ? last_page_len.data() : nullptr;
  p.mask_indptr = a.mask ? mask_indptr.data() : nullptr;
  p.items = items.data(), p.num_items = int64_t(items.size() / 2);
  p.page_size = PS, p.k_stride_page = k_sp, p.v_stride_page = v_sp, p.num_pages = num_pages;
  if (C > 1) {
    p.num_chunks = C;
    p.o = o_part.data(), p.lse = lse_part.data();
    p.o_stride_n = int64_t{C} * H * DV, p.o_stride_h = DV, p.o_stride_c = int64_t{H} * DV;
    p.lse_stride_n = int64_t{C} * H;
  }

  // as BatchPrefill launches it
  if (validate_batch(p) != Status::kSuccess) {
    std::printf("validate_batch failed\n");
    ++failures;
    return;
  }
  const std::vector<T> q0 = q, k0 = k, v0 = v;
  const std::vector<uint8_t> mask0 = mask;
  const std::vector<int32_t> pages0 = page_indices;
  Result r;
  const dim3 grid(static_cast<unsigned>(p.num_items), static_cast<unsigned>(KH),
                  static_cast<unsigned>(prefill_vo_parts(DV)));
  const size_t smem = static_cast<size_t>(
      prefill_kernel_smem_bytes(DQ, DV, mt, prefill_vo_parts(DV) > 1 ? PrefillVO::kParts : PrefillVO::kWhole, g_wg));
  const int64_t copies0 = emu_cp::copies, mmas0 = emu_mma::ops;
  if (p.num_items > 0 && H > 0) {
    // each CTA writes only its own rows
    std::vector<uint16_t> o_prev(o.size());
    std::vector<float> lse_prev = lse;
    std::memcpy(o_prev.data(), o.data(), o.size() * sizeof(T));
    const int64_t kRows = prefill_rows(mt);
    after_cta = [&](unsigned bx, unsigned by) {
      const int b = items[2 * bx];
      const int64_t tile = items[2 * bx + 1], qb = qo_indptr[b], ql = c.qo_lens[b];
      auto own = [&](int64_t row, int h) {  // (q / o row, q head) of this CTA?
        if (row < qb || row >= qb + ql || h < int(by) * G || h >= int(by + 1) * G) return false;
        const int64_t pr = (row - qb) * G + (h - int(by) * G);
        return pr >= tile * kRows && pr < (tile + 1) * kRows;
      };
      const uint16_t* now = reinterpret_cast<const uint16_t*>(o.data());
      for (size_t e = 0; e < o.size(); ++e) {
        if (now[e] == o_prev[e]) continue;
        const int64_t row = int64_t(e) / o_sn, col = int64_t(e) % o_sn;
        if (col >= int64_t{H} * DV || !own(row, int(col / DV))) {
          if (!r.bad_stray)
            std::printf("  CTA (%u, %u) (request %d, tile %ld) wrote o row %ld column %ld\n", bx, by, b, long(tile),
                        long(row), long(col));
          ++r.bad_stray;
        }
        o_prev[e] = now[e];
      }
      for (size_t e = 0; e < lse.size(); ++e) {
        if (std::memcmp(&lse[e], &lse_prev[e], sizeof(float)) == 0) continue;
        if (!a.lse || int64_t(e) >= q_rows * H || !own(int64_t(e) / H, int(e % H))) {
          if (!r.bad_stray)
            std::printf("  CTA (%u, %u) (request %d, tile %ld) wrote lse element %zu\n", bx, by, b, long(tile), e);
          ++r.bad_stray;
        }
        lse_prev[e] = lse[e];
      }
    };
    if (paged)
      launch_2d(prefill_kernel<T, PrefillMode::kPaged>(DQ, DV, mt, g_wg), grid,
                prefill_kernel_threads(PrefillVO::kWhole, g_wg, mt), smem, p);
    else
      launch_2d(prefill_kernel<T, PrefillMode::kRagged>(DQ, DV, mt, g_wg), grid,
                prefill_kernel_threads(PrefillVO::kWhole, g_wg, mt), smem, p);
    after_cta = nullptr;
  }
  if (C > 1) merge_chunks(qo_indptr[B], C, H, DV, o_part, lse_part, o, o_sn, lse, a.lse);

  std::vector<double> vs;
  for (const auto& x : v) vs.push_back(tf(x));
  r.tol = ((C > 1 ? 4 : 2) * eps_of<T>() + 1e-3) * max_abs(vs) * a.v_scale;  // (partials rounded to T)
  for (int b = 0; b < B; ++b) {
    const int64_t qb = qo_indptr[b], KL = c.kv_lens[b];
    check_request(
        a, b, c.qo_lens[b], KL, [&](int64_t i, int h, int d) { return double(tf(q[size_t((qb + i) * q_sn + h * DQ + d)])); },
        [&](int64_t j, int kh, int d) {
          const int64_t off = k_off(b, j, kh);
          return off < 0 ? 0.0 : double(tf(k[size_t(off + d)]));
        },
        [&](int64_t j, int kh, int d) {
          const int64_t off = v_off(b, j, kh);
          return off < 0 ? 0.0 : double(tf(v[size_t(off + d)]));
        },
        [&](int64_t i, int h, int d) { return double(tf(o[size_t((qb + i) * o_sn + h * DV + d)])); },
        [&](int64_t i, int h) { return lse[size_t((qb + i) * H + h)]; },
        [&](int64_t i, int64_t j) {
          const int64_t bit = int64_t{mask_indptr[b]} * 8 + i * KL + j;
          return bool((mask[size_t(bit >> 3)] >> (bit & 7)) & 1);
        },
        r);
  }
  // untouched: o padding and rows no request owns, lse past the rows (all of it when null),
  // the inputs
  const float sentinel = tf(ft<T>(-777.f));
  for (int64_t row = 0; row < q_rows; ++row)
    for (int64_t col = row < qo_indptr[B] ? int64_t{H} * DV : 0; col < o_sn; ++col)
      if (tf(o[size_t(row * o_sn + col)]) != sentinel) ++r.bad_pad;
  for (size_t e = a.lse ? size_t(qo_indptr[B] * H) : 0; e < lse.size(); ++e)
    if (lse[e] != 555.f) ++r.bad_pad;
  auto same = [](const auto& x, const auto& y) {
    return x.size() == y.size() && std::memcmp(x.data(), y.data(), x.size() * sizeof(x[0])) == 0;
  };
  if (!same(q, q0) || !same(k, k0) || !same(v, v0) || !same(mask, mask0) || !same(page_indices, pages0)) ++r.bad_stray;

  std::string lens;
  for (int b = 0; b < B; ++b) lens += fmt("%s%ld/%ld", b ? "," : "", long(c.qo_lens[b]), long(c.kv_lens[b]));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report(fmt("%s %s batch d=%d/%d g=%d kvh=%d mt=%d %s %s qo/kv=[%s] causal=%d win=%2d cap=%2.0f alibi=%d mask=%d lse=%d "
             "vs=%.1f pad=%d%s%s chunks=%d grid=%ux%u",
             sched_name(), type_name<T>(), DQ, DV, G, KH, mt, paged ? fmt("paged%-2d", PS).c_str() : "ragged ",
             c.hnd ? "HND" : "NHD", lens.c_str(), a.causal, a.window_left, a.soft_cap, a.alibi, a.mask, a.lse,
             a.v_scale, c.pad, c.share && paged ? " shared-page" : "", c.oob && paged ? " oob-page" : "", C, grid.x,
             grid.y),
         r, secs, emu_cp::copies - copies0, emu_mma::ops - mmas0);
}

// ---- MLA (BatchMla) ----

// DeepSeek MLA as BatchMla launches it: q [rows, H, 512 + dkpe] (token rows padded by `pad`),
// the ckv cache [pages, PS, 512] and the kpe cache [pages, PS, dkpe] (its own page stride, one
// spare entry per page), K = [ckv || kpe], V = ckv; last_page_len = kv_len - (pages - 1) * PS,
// with a request given one page more than it needs where `extra` (last_page_len <= 0: the
// spare page is never read); entries no request reads are NaN; grid (items, 1, 512 / (2 vo_cols)),
// 256 threads.
template <typename T>
void run_mla(int H, int dkpe, const std::vector<int64_t>& qo_lens, const std::vector<int64_t>& kv_lens, int PS,
             bool causal, bool extra, bool want_lse, int vo_cols, int chunks, uint64_t seed) {
  const auto t0 = std::chrono::steady_clock::now();
  const int DC = kMlaHeadDimCkv, DQ = DC + dkpe, B = static_cast<int>(qo_lens.size()), pad = 8;
  const Attn a{DQ, DC, H, 1, causal, -1, 0.f, false, false, want_lse, 1.f};
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  const float nan = std::numeric_limits<float>::quiet_NaN();
  std::vector<int32_t> qo_indptr(B + 1, 0), kv_indptr(B + 1, 0), last(B, 0);
  for (int b = 0; b < B; ++b) {
    qo_indptr[b + 1] = qo_indptr[b] + int32_t(qo_lens[b]);
    const int64_t n = (kv_lens[b] + PS - 1) / PS + (extra && b == 0 ? 1 : 0);
    kv_indptr[b + 1] = kv_indptr[b] + int32_t(n);
    last[b] = int32_t(kv_lens[b] - (n - 1) * PS);
  }
  const int64_t rows = qo_indptr[B] + 2, q_sn = int64_t{H} * DQ + pad, o_sn = int64_t{H} * DC + pad;
  std::vector<T> q(size_t(rows * q_sn)), o(size_t(rows * o_sn), ft<T>(-777.f));
  for (auto& x : q) x = ft<T>(N(rng));
  std::vector<float> lse(size_t(rows * H), 555.f);
  const int64_t num_pages = kv_indptr[B] + 2;
  std::vector<int32_t> perm(static_cast<size_t>(num_pages));
  for (size_t i = 0; i < perm.size(); ++i) perm[i] = int32_t(i);
  std::shuffle(perm.begin(), perm.end(), rng);
  const std::vector<int32_t> pages(perm.begin(), perm.begin() + kv_indptr[B]);
  const int64_t kr_sp = int64_t{PS + 1} * dkpe;  // (a spare entry per page)
  std::vector<T> ckv(size_t(num_pages * PS * DC), ft<T>(nan)), kpe(size_t(num_pages * kr_sp + 8), ft<T>(nan));
  auto ckv_at = [&](int b, int64_t j) { return int64_t{pages[size_t(kv_indptr[b] + j / PS)]} * PS * DC + (j % PS) * DC; };
  auto kpe_at = [&](int b, int64_t j) { return int64_t{pages[size_t(kv_indptr[b] + j / PS)]} * kr_sp + (j % PS) * dkpe; };
  for (int b = 0; b < B; ++b)
    for (int64_t j = 0; j < kv_lens[b]; ++j) {
      for (int d = 0; d < DC; ++d) ckv[size_t(ckv_at(b, j) + d)] = ft<T>(N(rng));
      for (int d = 0; d < dkpe; ++d) kpe[size_t(kpe_at(b, j) + d)] = ft<T>(N(rng));
    }
  const std::vector<int32_t> items = mla_plan_items(qo_lens, kv_lens, H, chunks);
  // split-KV: partial states [rows, chunks, H, DC] / [rows, chunks, H], NaN where no item writes
  const int C = chunks > 1 ? chunks : 1;
  std::vector<T> o_part(size_t(rows * C * H * DC), ft<T>(nan));
  std::vector<float> lse_part(size_t(rows * C * H), nan);
  PrefillParams<T> p{};
  set_options(p, a);
  p.q = q.data(), p.k = ckv.data(), p.v = ckv.data(), p.o = o.data();
  p.k_rope = dkpe ? kpe.data() : nullptr;
  p.q_rope = dkpe ? q.data() + DC : nullptr;  // (q_pe: the last dkpe columns of q's rows)
  p.qr_stride_n = q_sn, p.qr_stride_h = DQ;
  p.lse = want_lse ? lse.data() : nullptr;
  p.q_stride_n = q_sn, p.q_stride_h = DQ;
  p.k_stride_n = DC, p.k_stride_page = int64_t{PS} * DC, p.v_stride_n = DC, p.v_stride_page = int64_t{PS} * DC;
  p.kr_stride_n = dkpe, p.kr_stride_page = kr_sp;
  p.o_stride_n = o_sn, p.o_stride_h = DC;
  p.num_chunks = chunks, p.lse_stride_n = H;
  if (chunks > 1) {
    p.o = o_part.data(), p.lse = lse_part.data();
    p.o_stride_n = int64_t{C} * H * DC, p.o_stride_c = int64_t{H} * DC, p.lse_stride_n = int64_t{C} * H;
  }
  p.qo_indptr = qo_indptr.data(), p.kv_indptr = kv_indptr.data(), p.page_indices = pages.data();
  p.last_page_len = last.data();
  p.items = items.data(), p.num_items = int64_t(items.size() / 2);
  p.page_size = PS, p.num_pages = num_pages;
  if (validate_batch(p, true) != Status::kSuccess) {
    std::printf("validate_batch (mla) failed\n");
    ++failures;
    return;
  }
  const int64_t copies0 = emu_cp::copies, mmas0 = emu_mma::ops;
  const int threads = prefill_threads(PrefillVO::kMla);  // (two warp groups of V / O columns)
  const dim3 grid(static_cast<unsigned>(p.num_items), 1, static_cast<unsigned>(DC / vo_cols / (threads / kPrefillThreads)));
  if (p.num_items > 0)
    launch_2d(mla_kernel<T>(DQ, DC, vo_cols, g_wg), grid, unsigned(threads),
              static_cast<size_t>(prefill_smem_bytes(DQ, DC, 1, 2, true)) + (g_wg ? 1024 : 0), p);
  if (chunks > 1) merge_chunks(qo_indptr[B], C, H, DC, o_part, lse_part, o, o_sn, lse, want_lse);
  Result r;
  std::vector<double> vs;
  for (int b = 0; b < B; ++b)
    for (int64_t j = 0; j < kv_lens[b]; ++j)
      for (int d = 0; d < DC; ++d) vs.push_back(tf(ckv[size_t(ckv_at(b, j) + d)]));
  r.tol = ((chunks > 1 ? 4 : 2) * eps_of<T>() + 1e-3) * max_abs(vs);  // (partials rounded to T)
  for (int b = 0; b < B; ++b) {
    const int64_t qb = qo_indptr[b];
    check_request(
        a, b, qo_lens[b], kv_lens[b], [&](int64_t i, int h, int d) { return double(tf(q[size_t((qb + i) * q_sn + h * DQ + d)])); },
        [&](int64_t j, int, int d) {
          return double(tf(d < DC ? ckv[size_t(ckv_at(b, j) + d)] : kpe[size_t(kpe_at(b, j) + d - DC)]));
        },
        [&](int64_t j, int, int d) { return double(tf(ckv[size_t(ckv_at(b, j) + d)])); },
        [&](int64_t i, int h, int d) { return double(tf(o[size_t((qb + i) * o_sn + h * DC + d)])); },
        [&](int64_t i, int h) { return lse[size_t((qb + i) * H + h)]; }, [](int64_t, int64_t) { return true; }, r);
  }
  const float sentinel = tf(ft<T>(-777.f));  // padding and rows no request owns untouched
  for (int64_t row = 0; row < rows; ++row)
    for (int64_t col = row < qo_indptr[B] ? int64_t{H} * DC : 0; col < o_sn; ++col)
      if (tf(o[size_t(row * o_sn + col)]) != sentinel) ++r.bad_pad;
  for (size_t e = want_lse ? size_t(qo_indptr[B] * H) : 0; e < lse.size(); ++e)
    if (lse[e] != 555.f) ++r.bad_pad;
  std::string lens;
  for (int b = 0; b < B; ++b) lens += fmt("%s%ld/%ld", b ? "," : "", long(qo_lens[b]), long(kv_lens[b]));
  const double secs = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  report(fmt("%s %s mla H=%d kpe=%d page%-2d qo/kv=[%s] causal=%d lse=%d%s cols=%d chunks=%d grid=%ux%ux%u",
             sched_name(), type_name<T>(), H, dkpe, PS, lens.c_str(), causal, want_lse, extra ? " extra-page" : "",
             vo_cols, chunks, grid.x, grid.y, grid.z),
         r, secs, emu_cp::copies - copies0, emu_mma::ops - mmas0);
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
  // Batch cases (BatchPrefill), each at every head-dim pair, the layout (NHD / HND) flipped at
  // (256,256) and (192,128); f16 / bf16 and m_tiles 1 / 2 (where built) rotate so each case meets
  // both types, each of (64,64) and (128,128) meets both with both M-tile shapes, and every such
  // case runs with the other M-tile shape under the other schedule.
  struct BF {
    int group, kvh;
    std::vector<int64_t> qo, kv;
    bool causal;
    int win;
    float cap;
    bool alibi, mask, hnd, lse;
    float vs;
    int pad, page_size;
    bool share, oob;
  };
  const std::vector<BF> batch = {
      // g, kvh, qo lens, kv lens, causal, win, cap, alibi, mask, hnd, lse, v_scale, pad, page size, share, oob
      {1, 2, {5, 0, 17}, {37, 20, 70}, false, -1, 0.f, false, false, false, true, 1.f, 8, 0, false, false},  // ragged NHD, qo 0
      {3, 1, {7, 20, 1, 13}, {7, 9, 0, 100}, true, -1, 0.f, false, false, true, true, 0.5f, 0, 0, false, false},  // ragged HND causal, qo > kv, kv 0
      {1, 1, {9, 30, 4}, {70, 33, 16}, true, 5, 0.f, false, false, false, true, 1.f, 0, 16, true, false},  // paged 16 NHD causal + window, shared page
      {3, 2, {3, 11}, {23, 130}, false, -1, 30.f, false, false, true, false, 1.f, 8, 5, false, false},     // paged 5 HND soft cap, lse null
      {3, 2, {6, 0, 10}, {19, 5, 0}, true, -1, 0.f, true, false, false, true, 1.f, 0, 1, false, false},     // paged 1 NHD ALiBi (6 q heads), qo 0, kv 0
      {3, 1, {10, 4, 16}, {20, 67, 3}, false, -1, 0.f, false, true, false, true, 0.5f, 0, 0, false, false}, // ragged NHD custom mask
      {1, 2, {12, 5, 1}, {31, 9, 44}, true, 7, 0.f, false, true, true, true, 1.f, 0, 5, false, true},       // paged 5 HND mask + window, page id out of range
      {1, 1, {20, 3}, {130, 70}, false, 10, 0.f, false, false, true, false, 1.f, 0, 0, false, false},       // ragged HND window skips tiles
      {3, 1, {25}, {100}, true, -1, 0.f, false, false, true, true, 1.f, 0, 16, false, false},                // one request, paged 16 HND, 2 row tiles
      {3, 1, {0, 0}, {5, 0}, true, -1, 0.f, false, false, false, true, 1.f, 0, 0, false, false},            // no rows: no launch
      {1, 2, {3, 5}, {0, 0}, false, -1, 0.f, false, false, false, true, 1.f, 0, 16, false, false},          // paged, no keys: o 0, lse -inf
      {3, 1, {50, 2, 9}, {200, 64, 65}, true, -1, 30.f, true, false, false, true, 1.f, 0, 16, true, false}, // 3 row tiles, 4 key tiles, cap + ALiBi
      {1, 1, {40, 3}, {600, 9}, true, -1, 0.f, false, false, true, true, 1.f, 0, 16, false, false},        // paged 16 HND, 10 key tiles (stages reused)
  };
  const int dims[4][2] = {{64, 64}, {128, 128}, {256, 256}, {192, 128}};
  uint64_t seed = 1;
  auto run = [&](bool bf16, int di, const F& f) {
    const Case c{{dims[di][0], dims[di][1], f.group, f.kvh, f.causal, f.win, f.cap, f.alibi, f.mask, f.lse, f.vs},
                 f.qo, f.kv, f.hnd, f.pad};
    if (bf16)
      run_case<__nv_bfloat16>(c, seed++);
    else
      run_case<__half>(c, seed++);
  };
  // Every batch case at every head-dim pair under the current schedule (seeds from seed_base).
  auto run_batches = [&](uint64_t seed_base) {
    const bool eager = schedule == Schedule::kWarpEager;
    for (int fi = 0; fi < int(batch.size()); ++fi)
      for (int di = 0; di < 4; ++di) {
        const BF& f = batch[fi];
        const BatchCase c{{dims[di][0], dims[di][1], f.group, f.kvh, f.causal, f.win, f.cap, f.alibi, f.mask, f.lse, f.vs},
                          f.qo, f.kv, f.hnd != (di >= 2), f.pad, f.page_size, f.share, f.oob};
        const int mt = prefill_max_m_tiles(dims[di][0], dims[di][1]) == 2 ? 1 + ((fi / 2 + di + eager) & 1) : 1;
        if ((fi + di) & 1)
          run_batch<__nv_bfloat16>(c, mt, seed_base + seed++);
        else
          run_batch<__half>(c, mt, seed_base + seed++);
      }
  };
  // Split-KV (batch kernels of one M tile): the batch cases with keys enough for chunks (a window,
  // a custom mask, causal rows that see none of a chunk, kv 0, a page id out of range), 2-4 chunks
  // per request, at every head-dim pair and 512.
  auto run_split_batches = [&](uint64_t seed_base) {
    int n = 0;
    for (int fi : {2, 3, 6, 7, 8, 11})
      for (int di = 0; di < 5; ++di) {
        if (di == 4 && (n % 3 != 0 || g_wg)) {  // (512: a few, mma.sync only)
          ++n;
          continue;
        }
        const BF& f = batch[size_t(fi)];
        const int dqk = di < 4 ? dims[di][0] : 512, dvo = di < 4 ? dims[di][1] : 512;
        const BatchCase c{{dqk, dvo, f.group, f.kvh, f.causal, f.win, f.cap, f.alibi, f.mask, f.lse, f.vs},
                          f.qo, f.kv, f.hnd, f.pad, f.page_size, f.share, f.oob};
        if (n & 1)
          run_batch<__nv_bfloat16>(c, 1, seed_base + seed++, 2 + n % 3);
        else
          run_batch<__half>(c, 1, seed_base + seed++, 2 + n % 3);
        ++n;
      }
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
    // head_dim 512 (four V / O parts): a few feature and batch cases (each CTA costs ~5x a
    // (256, 256) one here)
    for (int fi : {1, 2, 7, 12}) {
      const F& f = features[size_t(fi)];
      const Case c{{512, 512, f.group, f.kvh, f.causal, f.win, f.cap, f.alibi, f.mask, f.lse, f.vs}, f.qo, f.kv, f.hnd,
                   f.pad};
      if (fi & 1)
        run_case<__nv_bfloat16>(c, seed++);
      else
        run_case<__half>(c, seed++);
    }
    for (int fi : {1, 3, 6}) {
      const BF& f = batch[size_t(fi)];
      const BatchCase c{{512, 512, f.group, f.kvh, f.causal, f.win, f.cap, f.alibi, f.mask, f.lse, f.vs},
                        f.qo, f.kv, f.hnd, f.pad, f.page_size, f.share, f.oob};
      if (fi & 1)
        run_batch<__nv_bfloat16>(c, 1, 1000 + seed++);
      else
        run_batch<__half>(c, 1, 1000 + seed++);
    }
    // MLA: heads, kpe 64 / 0, ragged requests (qo 0, kv 0, qo > kv), page sizes 1 / 16 / 5,
    // causal both, a spare page past a request's keys; V / O in parts of 128 and 256 columns
    for (int cols : {kPrefillVoPart, 2 * kPrefillVoPart}) {
      run_mla<__half>(16, 64, {1, 3, 0, 2}, {70, 5, 9, 0}, 16, true, false, true, cols, 1, 2000 + seed++);
      run_mla<__nv_bfloat16>(16, 64, {5}, {130}, 5, false, true, true, cols, 1, 2000 + seed++);
      run_mla<__nv_bfloat16>(8, 0, {2, 1}, {33, 1}, 1, true, false, false, cols, 1, 2000 + seed++);
      run_mla<__half>(4, 64, {17}, {9}, 16, true, true, true, cols, 1, 2000 + seed++);  // qo > kv: empty rows, 2 row tiles
    }
    // split-KV (mla_plan_items' chunks; chunks past a request's keys are empty: o 0, lse -inf)
    run_mla<__nv_bfloat16>(16, 64, {1, 2, 1}, {300, 70, 0}, 16, true, false, true, kPrefillVoPart, 3, 3000 + seed++);
    run_mla<__half>(8, 0, {3}, {200}, 5, false, true, true, 2 * kPrefillVoPart, 4, 3000 + seed++);
    run_mla<__half>(4, 64, {17, 1}, {9, 129}, 1, true, false, false, kPrefillVoPart, 2, 3000 + seed++);
    run_batches(1000);
    run_split_batches(6000);
  }
  // The wgmma kernels (sm_90a's path for whole-column head dims): the feature cases (type
  // alternating) and the batch cases at every head-dim pair, under both schedules.
  g_wg = true;
  const int64_t products0 = emu_wgmma::products;
  for (Schedule sched : {Schedule::kRoundRobin, Schedule::kWarpEager, Schedule::kLowEager}) {
    schedule = sched;
    for (int di = 0; di < 4; ++di)
      for (size_t fi = 0; fi < features.size(); ++fi) run((fi + di + (sched == Schedule::kWarpEager)) & 1, di, features[fi]);
    run_batches(4000);
    run_split_batches(7000);
  }
  // MLA's wgmma kernels (FLASHINFER_MLA_WGMMA): the batches above, both column widths, and a
  // split-KV one, round-robin only
  schedule = Schedule::kRoundRobin;
  for (int cols : {kPrefillVoPart, 2 * kPrefillVoPart}) {
    run_mla<__half>(16, 64, {1, 3, 0, 2}, {70, 5, 9, 0}, 16, true, false, true, cols, 1, 5000 + seed++);
    run_mla<__nv_bfloat16>(16, 64, {5}, {130}, 5, false, true, true, cols, 1, 5000 + seed++);
    run_mla<__nv_bfloat16>(8, 0, {2, 1}, {33, 1}, 1, true, false, false, cols, 1, 5000 + seed++);
    run_mla<__half>(4, 64, {17}, {9}, 16, true, true, true, cols, 1, 5000 + seed++);
  }
  run_mla<__nv_bfloat16>(16, 64, {1, 2, 1}, {300, 70, 0}, 16, true, false, true, kPrefillVoPart, 3, 5000 + seed++);
  g_wg = false;
  if (emu_wgmma::products == products0) {
    std::printf("FAILED: the wgmma pass ran no warpgroup product\n");
    ++failures;
  }
  std::printf("worst max|do| / tol %.3f, worst max|dlse| %.2e, %.1f s\n", worst_o, worst_lse,
              std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count());
  std::printf(failures ? "FAILED: %d\n" : "all ok\n", failures);
  return failures ? 1 : 0;
}
