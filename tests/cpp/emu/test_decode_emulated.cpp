// The decode kernels run on the CPU by cuda_emulator.h against a float64 reference.
// - The CUDA-core kernel DecodeCCKernel (decode_cc.cuh):
//   - head_dim 64/128/256/512; group sizes 1/2/3/4/8/12 (padded buckets; sub-groups of 8, or 4
//     at head_dim 512);
//   - page sizes 1/5/7/16 and contiguous KV; NHD/HND strides; ragged and empty requests;
//   - split items (explicit and implicit), folded by DecodeMergeKernel or by the in-kernel
//     merge (merge_counters: the CTA that writes a request's last partial state merges them and
//     resets its counter);
//   - RoPE / ALiBi / soft cap / sliding window, LSE, 2, 3 and 4 stages, f16 and bf16;
//   - fp8 caches (e4m3 / e5m2, 8-byte copies; the reference reads the same fp8 values).
// - The tensor-core kernel DecodeTCKernel (decode_tc.cuh), every case without RoPE at
//   head_dim <= 128:
//   - with its cp.async engine (fp16, bf16 and, at head_dim 128, fp8 caches);
//   - with its bulk row copies (mbarriers with byte counts, barrier_emulated.h);
//   - ldmatrix / mma by mma_emulated.h.
//   The copies run across work items there, so each run goes under two schedules: copies land
//   at their waits (a slot read too early shows up), then at issue (emu_cp::eager: a slot
//   refilled, or used as scratch, while still needed shows up).
// cp.async is emulated by cp_async_emulated.h.
// Run: cmake -DFLASHINFER_BUILD_TESTS=ON -DFLASHINFER_BUILD_EMU_TESTS=ON, then `ctest -L emu`,
// or without CMake tests/cpp/emu/run_emulated.sh decode; ~2 s (its compile ~40 s).
#include "cuda_emulator.h"
// (the emulator first)
#include <algorithm>
#include <random>
using std::max;
using std::min;

#include "cp_async_emulated.h"
#include "mma_emulated.h"
#include "barrier_emulated.h"
// (cp.async, ldmatrix / mma and mbarriers emulated, before any header that uses them)

// What the tensor-core kernel uses beyond the CUDA-core one.
template <class T>
T __ldg(const T* p) {
  return *p;
}
template <class T>
T __shfl_sync(unsigned, T v, int src) {
  return emu_shfl(v, [](int, int o) { return o & 31; }, src);
}
inline bool __any_sync(unsigned, bool pred) {
  int v = pred ? 1 : 0;
  for (int o = 1; o < 32; o *= 2) v |= __shfl_xor_sync(0xffffffffu, v, o);
  return v != 0;
}
inline int __float_as_int(float x) {
  int i;
  std::memcpy(&i, &x, 4);
  return i;
}
inline float __int_as_float(int i) {
  float x;
  std::memcpy(&x, &i, 4);
  return x;
}
inline unsigned __byte_perm(unsigned x, unsigned y, unsigned s) {  // (the selectors' plain mode)
  const uint64_t v = (uint64_t{y} << 32) | x;
  unsigned r = 0;
  for (int i = 0; i < 4; ++i) r |= unsigned((v >> (8 * ((s >> (4 * i)) & 7))) & 0xffu) << (8 * i);
  return r;
}

#include "flashinfer/attention/decode_cc.cuh"
#include "flashinfer/attention/decode_tc.cuh"

using namespace flashinfer;
using namespace flashinfer::attention;

namespace flashinfer {
namespace attention {
alignas(16) uint4 smem[256 * 1024 / 16];
alignas(16) uint4 smem_u4[256 * 1024 / 16];  // (the tensor-core kernel's name for it)
}
}  // namespace flashinfer

namespace {

using emu::ft;
using emu::tf;

struct Case {
  int head_dim, group, num_kv_heads, page_size;  // page_size 0: contiguous (one request)
  std::vector<int> lens;
  int chunk;  // > 0: split requests into chunks of this many keys (explicit items)
  PosEncodingMode pos;
  float soft_cap;
  int window_left;
  bool hnd;
  int stages;
  int grid;
  bool in_kernel_merge = false;  // explicit split items merged by their last CTA (merge_counters)
  int q_len = 1;  // query tokens per request (multi-token decode: token columns, decode_query)
};

int failures = 0;

// TKV: the cache element (T, or __nv_fp8_e4m3 / __nv_fp8_e5m2 with p.kv_cache saying so).
// tc: the tensor-core kernel instead of the CUDA-core one, with its cp.async engine or (rows)
// its bulk row copies (fp16 / bf16 caches).
template <typename T, typename TKV = T>
void run_case(const Case& c, uint64_t seed, bool tc = false, bool rows = false) {
  // H: the kernel's q-head columns, q_len per real q head (token-major per KV head, decode_query);
  // q / o / lse are [B * q_len rows, HR real heads]
  const int D = c.head_dim, KH = c.num_kv_heads, n = c.q_len, G = c.group * n, H = G * KH, HR = c.group * KH;
  const int B = static_cast<int>(c.lens.size());
  const bool contiguous = c.page_size == 0;
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<float> U(-1.f, 1.f);
  // q [B, H, D]
  std::vector<T> q(size_t(B) * H * D);
  for (auto& x : q) x = ft<T>(U(rng) * 2.f);
  // pages: request b has ceil(len / ps) pages, ids permuted
  const int ps = contiguous ? 1 : c.page_size;
  std::vector<int32_t> indptr(B + 1, 0), last(B, 0), indices;
  for (int b = 0; b < B; ++b) {
    const int np = contiguous ? 0 : (c.lens[b] + ps - 1) / ps;
    indptr[b + 1] = indptr[b] + np;
    last[b] = np == 0 ? 0 : c.lens[b] - (np - 1) * ps;
  }
  const int total_pages = contiguous ? 1 : indptr[B] + 3;
  std::vector<int32_t> perm(total_pages);
  for (int i = 0; i < total_pages; ++i) perm[i] = i;
  std::shuffle(perm.begin(), perm.end(), rng);
  for (int i = 0; i < indptr[B]; ++i) indices.push_back(perm[i]);
  if (indices.empty()) indices.push_back(0);
  const int entries = contiguous ? c.lens[0] : ps;
  // K and V: [pages, entries, KH, D] (NHD) or [pages, KH, entries, D] (HND); V in its own buffer
  const int64_t page_elems = int64_t{entries} * KH * D;
  std::vector<TKV> kbuf(size_t(total_pages) * page_elems + 16), vbuf(size_t(total_pages) * page_elems + 16);
  for (auto& x : kbuf) x = ft<TKV>(U(rng) * (sizeof(TKV) == 1 ? 4.f : 1.f));
  for (auto& x : vbuf) x = ft<TKV>(U(rng) * (sizeof(TKV) == 1 ? 4.f : 1.f));
  const int64_t s_page = page_elems, s_n = c.hnd ? D : int64_t{KH} * D, s_h = c.hnd ? int64_t{entries} * D : D;
  auto kat = [&](const std::vector<TKV>& buf, int b, int t, int kh, int d) -> double {
    const int64_t page = contiguous ? 0 : indices[indptr[b] + t / ps];
    const int64_t e = contiguous ? t : t % ps;
    return tf(buf[page * s_page + e * s_n + kh * s_h + d]);
  };

  // work items
  const int sub_groups = decode_sub_groups(G, D);
  const int units = KH * sub_groups;
  std::vector<DecodeWorkItem> items;
  std::vector<DecodeMergeInfo> merge(B);
  int slots = 0;
  for (int b = 0; b < B; ++b) {
    const int L = c.lens[b];
    const int nch = c.chunk > 0 && L > c.chunk ? (L + c.chunk - 1) / c.chunk : 1;
    merge[b] = {nch > 1 ? slots : 0, nch};
    for (int ch = 0; ch < nch; ++ch)
      for (int u = 0; u < units; ++u) {
        const int lo = nch > 1 ? ch * c.chunk : 0, hi = nch > 1 ? min(L, (ch + 1) * c.chunk) : L;
        items.push_back({b, u, lo, hi, nch > 1 ? slots + ch : -1, L, contiguous ? 0 : indptr[b], 0});
      }
    if (nch > 1) slots += nch;
  }
  const int32_t n_items = static_cast<int32_t>(items.size());

  std::vector<T> o(size_t(B) * H * D, ft<T>(123.f));
  std::vector<float> lse(size_t(B) * H, 123.f);
  std::vector<float> po(size_t(max(slots, 1)) * H * D, 7.f), plse(size_t(max(slots, 1)) * H, 7.f);

  DecodeParams<T> p{};
  p.q = q.data();
  p.q_stride_n = int64_t{HR} * D;
  p.q_stride_h = D;
  p.kv.k_data = reinterpret_cast<const T*>(kbuf.data());  // (fp8: kv_cache says what they hold)
  p.kv.v_data = reinterpret_cast<const T*>(vbuf.data());
  p.kv_cache = std::is_same<TKV, __nv_fp8_e4m3>::value   ? KVCache::kFp8E4M3
               : std::is_same<TKV, __nv_fp8_e5m2>::value ? KVCache::kFp8E5M2
                                                         : KVCache::kSameAsQ;
  p.kv.indptr = indptr.data();
  p.kv.indices = indices.data();
  p.kv.last_page_len = last.data();
  p.kv.batch_size = B;
  p.kv.page_size = ps;
  p.kv.num_heads = KH;
  p.kv.head_dim = D;
  p.kv.stride_page = s_page;
  p.kv.stride_n = s_n;
  p.kv.stride_h = s_h;
  p.v_stride_page = s_page;
  p.v_stride_n = s_n;
  p.v_stride_h = s_h;
  p.contiguous_len = contiguous ? c.lens[0] : -1;
  p.seq_lens = nullptr;
  p.o = o.data();
  p.o_stride_n = int64_t{HR} * D;
  p.o_stride_h = D;
  p.lse = lse.data();
  p.items = items.data();
  p.num_items = &n_items;
  p.implicit_chunk = 0;
  p.implicit_chunks = 0;
  p.merge = merge.data();
  if (contiguous && c.chunk > 0) {  // single decode: the implicit uniform split of request 0
    p.items = nullptr;
    p.num_items = nullptr;
    p.implicit_chunk = c.chunk;
    p.implicit_chunks = (c.lens[0] + c.chunk - 1) / c.chunk;
    p.merge = nullptr;
    po.assign(size_t(p.implicit_chunks) * H * D, 7.f);
    plse.assign(size_t(p.implicit_chunks) * H, 7.f);
  }
  p.partial_o = po.data();
  p.partial_lse = plse.data();
  std::vector<int32_t> counters(size_t(B) * units, 0);
  p.merge_counters = c.in_kernel_merge && p.items ? counters.data() : nullptr;
  p.batch_size = B;
  p.num_qo_heads = H;
  p.num_kv_heads = KH;
  p.group_size = G;
  p.q_len = n;
  p.sub_groups = sub_groups;
  p.head_dim = D;
  p.sm_scale = 1.f / std::sqrt(float(D));
  p.soft_cap = c.soft_cap;
  p.window_left = c.window_left;
  p.pos_encoding = c.pos;
  p.rope_scale = 1.f;
  p.rope_theta = 1e4f;
  p.pdl = false;
  if (validate(p) != Status::kSuccess) {
    std::printf("validate failed\n");
    ++failures;
    return;
  }

  const int bucket = tc ? decode_max_group(D) : decode_group_bucket(G, D);  // (one tensor-core kernel per head_dim)
  auto go = [&](auto hd, auto gb) {
    constexpr int kD = decltype(hd)::value, kG = decltype(gb)::value;
    const int64_t smem =
        max<int64_t>(c.stages * decode_cc_stage_bytes(kD, kG, sizeof(TKV)), decode_merge_smem(kD));
    std::memset(flashinfer::attention::smem, 0xff, sizeof(flashinfer::attention::smem));
    std::memset(flashinfer::attention::smem_u4, 0xff, sizeof(flashinfer::attention::smem_u4));
    const unsigned grid = unsigned(c.grid), threads = unsigned(kDecodeThreads);
    if constexpr (kD <= 128 && kG == decode_max_group(kD) && (sizeof(TKV) == 2 || decode_tc_takes_fp8(kD))) {
      if (tc) {
        if constexpr (sizeof(TKV) == 2) {
          if (rows) {
            emu::launch(DecodeTCKernel<T, kD, TcCopy::kRows, TKV>, grid, threads,
                        size_t(c.stages * decode_tc_stage_bytes(kD, TcCopy::kRows)), p, c.stages, DecodeTensorMaps{});
            if (!emu_bar::bulk_in_flight.empty()) {
              std::printf("%zu bulk copies never waited for\n", emu_bar::bulk_in_flight.size());
              ++failures;
              emu_bar::bulk_in_flight.clear();
            }
          }
        }
        const int64_t tc_smem = c.stages * decode_tc_stage_bytes(kD, TcCopy::kCpAsync, sizeof(TKV));
        if (!rows)
          emu::launch(DecodeTCKernel<T, kD, TcCopy::kCpAsync, TKV>, grid, threads, size_t(tc_smem), p, c.stages,
                      DecodeTensorMaps{});
        if (!p.merge_counters) emu::launch(DecodeMergeKernel<T, kD>, 3u, unsigned(kDecodeThreads), size_t(0), p);
        return;
      }
    }
    if (c.pos == PosEncodingMode::kRoPELlama) {
      emu::launch(DecodeCCKernel<T, kD, kG, true, TKV>, grid, threads, size_t(smem), p, c.stages);
    } else {
      emu::launch(DecodeCCKernel<T, kD, kG, false, TKV>, grid, threads, size_t(smem), p, c.stages);
    }
    if (!p.merge_counters) emu::launch(DecodeMergeKernel<T, kD>, 3u, unsigned(kDecodeThreads), size_t(0), p);
  };
  auto by_g = [&](auto hd) {
    switch (bucket) {
      case 1: go(hd, std::integral_constant<int, 1>{}); break;
      case 2: go(hd, std::integral_constant<int, 2>{}); break;
      case 4: go(hd, std::integral_constant<int, 4>{}); break;
      default:
        if constexpr (decode_max_group(decltype(hd)::value) >= 8) go(hd, std::integral_constant<int, 8>{});
        break;
    }
  };
  if (D == 64) by_g(std::integral_constant<int, 64>{});
  if (D == 128) by_g(std::integral_constant<int, 128>{});
  if (D == 256) by_g(std::integral_constant<int, 256>{});
  if (D == 512) by_g(std::integral_constant<int, 512>{});

  // float64 reference
  const RopeFreq rf{1e4, 1.0};
  auto rope = [&](std::vector<double>& x, int64_t pos) {
    std::vector<double> y(D);
    for (int i = 0; i < D; ++i) {
      const int fi = i % (D / 2);
      const double ang = double(float(pos) * rope_inv_freq(rf, fi, D));
      const double cs = std::cos(ang), sn = std::sin(ang);
      y[i] = i < D / 2 ? x[i] * cs - x[i + D / 2] * sn : x[i] * cs + x[i - D / 2] * sn;
    }
    x = y;
  };
  double max_err = 0, max_lse_err = 0;
  bool bad = false;
  for (int b = 0; b < B; ++b) {
    const int L = c.lens[b];
    for (int h = 0; h < H; ++h) {
      // column h: KV head kh, token tok (position L - n + tok), real q head hr of HR
      const int kh = h / G, tok = (h % G) / c.group, hr = kh * c.group + (h % G) % c.group;
      const size_t row = size_t(b) * n + tok;  // q / o / lse row
      const int qpos = L - n + tok;
      std::vector<double> qd(D);
      for (int d = 0; d < D; ++d) qd[d] = tf(q[(row * HR + hr) * D + d]);
      if (c.pos == PosEncodingMode::kRoPELlama) rope(qd, qpos);
      int nh = 1;
      while (nh * 2 <= HR) nh *= 2;
      const double slope = hr < nh ? std::exp2(-8.0 * (hr + 1) / nh) : std::exp2(-4.0 * (2 * (hr - nh) + 1) / nh);
      std::vector<double> s;
      std::vector<int> ts;
      const int lo = c.window_left >= 0 ? max(0, qpos - c.window_left) : 0;
      for (int t = lo; t <= qpos; ++t) {
        std::vector<double> kd(D);
        for (int d = 0; d < D; ++d) kd[d] = kat(kbuf, b, t, kh, d);
        if (c.pos == PosEncodingMode::kRoPELlama) rope(kd, t);
        double x = 0;
        for (int d = 0; d < D; ++d) x += qd[d] * kd[d];
        x *= p.sm_scale;
        if (c.soft_cap > 0) x = c.soft_cap * std::tanh(x / c.soft_cap);
        if (c.pos == PosEncodingMode::kALiBi) x += slope * t;  // absolute key position, as reference_attention.py
        s.push_back(x);
        ts.push_back(t);
      }
      double mx = -INFINITY;
      for (double x : s) mx = std::max(mx, x);
      double den = 0;
      std::vector<double> acc(D, 0.0);
      for (size_t i = 0; i < s.size(); ++i) {
        const double w = std::exp(s[i] - mx);
        den += w;
        for (int d = 0; d < D; ++d) acc[d] += w * kat(vbuf, b, ts[i], kh, d);
      }
      for (int d = 0; d < D; ++d) {
        const double ref = den > 0 ? acc[d] / den : 0.0;
        const double got = tf(o[(row * HR + hr) * D + d]);
        const double err = std::fabs(got - ref);
        max_err = std::max(max_err, err);
        if (!(err <= 4e-3 + 8e-3 * std::fabs(ref))) bad = true;
      }
      const double ref_lse = den > 0 ? (mx + std::log(den)) / std::log(2.0) : -INFINITY;
      const float got_lse = lse[row * HR + hr];
      if (den > 0) {
        const double e = std::fabs(got_lse - ref_lse);
        max_lse_err = std::max(max_lse_err, e);
        if (!(e <= 2e-3 + 1e-4 * std::fabs(ref_lse))) bad = true;
      } else if (!(std::isinf(got_lse) && got_lse < 0)) {
        bad = true;
      }
    }
  }
  for (int32_t v : counters)
    if (v != 0) bad = true;  // the merging CTA resets its counter (CUDA-graph replays reuse them)
  std::printf("%s%s%s D=%d group=%d kvh=%d ps=%d lens=%zu chunk=%d pos=%d cap=%.0f win=%d hnd=%d st=%d grid=%d q_len=%d: "
              "max|do|=%.2e max|dlse|=%.2e %s\n",
              rows ? "tc rows " : tc ? "tc " : "", std::is_same<T, __half>::value ? "f16" : "bf16",
              std::is_same<TKV, T>::value ? "" : std::is_same<TKV, __nv_fp8_e4m3>::value ? "/e4m3" : "/e5m2", D, c.group, KH,
              c.page_size, c.lens.size(), c.chunk, int(c.pos), c.soft_cap, c.window_left, c.hnd, c.stages, c.grid,
              c.q_len, max_err, max_lse_err, bad ? "FAIL" : "ok");
  std::fflush(stdout);
  if (bad) ++failures;
}

}  // namespace

int main() {
  const PosEncodingMode N = PosEncodingMode::kNone, R = PosEncodingMode::kRoPELlama, A = PosEncodingMode::kALiBi;
  const std::vector<Case> cases = {
      // D, group, kvh, page, lens, chunk, pos, cap, window, hnd, stages, grid
      {128, 4, 2, 16, {37, 1, 100, 0, 64}, 0, N, 0.f, -1, false, 2, 5},
      {128, 4, 1, 5, {77, 3}, 16, N, 0.f, -1, true, 3, 4},
      {128, 1, 2, 1, {19, 40}, 0, N, 0.f, -1, false, 2, 3},
      {128, 8, 1, 16, {130}, 0, N, 0.f, -1, false, 2, 2},
      {128, 3, 2, 16, {50, 9}, 0, A, 0.f, -1, false, 2, 7},
      {128, 12, 1, 5, {45}, 20, N, 30.f, -1, false, 3, 3},
      {128, 4, 1, 16, {90, 33}, 0, R, 0.f, -1, false, 2, 2},
      {128, 2, 2, 7, {61}, 0, N, 0.f, 20, false, 2, 2},
      {128, 4, 1, 0, {150}, 40, N, 0.f, -1, false, 2, 4},
      {128, 4, 1, 0, {150}, 0, R, 0.f, 70, true, 3, 1},
      {64, 4, 2, 16, {70, 5}, 0, N, 0.f, -1, false, 2, 3},
      {64, 8, 1, 1, {33}, 10, A, 0.f, -1, true, 2, 2},
      {64, 1, 1, 5, {66}, 0, R, 0.f, -1, false, 3, 1},
      {256, 4, 1, 16, {41, 17}, 0, N, 0.f, -1, false, 2, 2},
      {256, 1, 2, 5, {29}, 12, R, 20.f, -1, false, 2, 3},
      {256, 8, 1, 16, {35}, 0, N, 0.f, 10, true, 2, 1},
      {128, 8, 1, 0, {1000}, 96, A, 0.f, -1, false, 3, 5},   // implicit split, ALiBi
      {64, 2, 1, 0, {333}, 100, R, 0.f, 150, true, 2, 3},    // implicit split, RoPE + window
      {128, 4, 2, 16, {700, 1, 2, 31}, 0, N, 10.f, -1, false, 4, 3},  // long rows, many stages
      // head_dim 512: 16 features per lane, sub-groups of 4 q heads
      {512, 4, 2, 16, {37, 1, 100, 0}, 0, N, 0.f, -1, false, 2, 5},
      {512, 8, 1, 5, {77, 3}, 16, A, 0.f, -1, true, 3, 4},       // 2 sub-groups, split
      {512, 1, 2, 16, {50}, 0, R, 20.f, -1, false, 2, 3},          // RoPE, soft cap
      {512, 2, 1, 7, {61}, 0, R, 0.f, 20, true, 2, 2},             // RoPE, window, HND
      {512, 12, 1, 0, {150}, 40, N, 0.f, -1, false, 2, 4},         // implicit split, 3 sub-groups
      {512, 3, 1, 1, {45, 9}, 0, N, 0.f, -1, false, 3, 2},
      // the in-kernel merge of split requests (merge_counters), one, two and three sub-groups
      {128, 4, 2, 16, {300, 1, 0, 129}, 64, N, 0.f, -1, false, 2, 5, true},
      {128, 12, 1, 5, {200, 70}, 32, A, 20.f, -1, true, 3, 3, true},
      {512, 8, 1, 16, {150, 20}, 64, R, 0.f, -1, false, 2, 4, true},
      {64, 1, 2, 7, {90}, 16, N, 0.f, 40, false, 2, 7, true},
      // multi-token decode (q_len tokens per request as columns): causal per token, RoPE at each
      // token's position, ALiBi of the real head, per-token windows, splits, sub-groups
      {128, 4, 2, 16, {37, 4, 100, 64}, 0, N, 0.f, -1, false, 2, 5, false, 2},
      {128, 2, 1, 5, {77, 3}, 16, A, 0.f, -1, true, 3, 4, false, 3},
      {128, 4, 1, 16, {90, 33}, 0, R, 0.f, -1, false, 2, 2, false, 4},   // 16 columns: 2 sub-groups
      {128, 1, 2, 7, {61, 9}, 0, N, 0.f, 20, false, 2, 2, false, 5},     // windows per token
      {64, 8, 1, 1, {33}, 10, A, 20.f, -1, true, 2, 2, true, 2},        // split, in-kernel merge
      {512, 2, 1, 16, {150, 20}, 64, R, 0.f, 30, false, 2, 4, true, 3},  // head_dim 512, RoPE + window
  };
  uint64_t seed = 1;
  for (const Case& c : cases) run_case<__half>(c, seed++);
  // bf16 once per head_dim
  run_case<__nv_bfloat16>(cases[0], 99);
  run_case<__nv_bfloat16>(cases[10], 98);
  run_case<__nv_bfloat16>(cases[13], 97);
  run_case<__nv_bfloat16>(cases[19], 96);
  run_case<__nv_bfloat16>(cases[21], 95);
  // fp8 caches: every head_dim, paged / contiguous, split and in-kernel merge, RoPE, HND
  run_case<__half, __nv_fp8_e4m3>(cases[0], 201);
  run_case<__nv_bfloat16, __nv_fp8_e5m2>(cases[1], 202);
  run_case<__half, __nv_fp8_e5m2>(cases[6], 203);
  run_case<__nv_bfloat16, __nv_fp8_e4m3>(cases[9], 204);
  run_case<__half, __nv_fp8_e4m3>(cases[12], 205);
  run_case<__nv_bfloat16, __nv_fp8_e4m3>(cases[14], 206);
  run_case<__half, __nv_fp8_e5m2>(cases[20], 207);
  run_case<__nv_bfloat16, __nv_fp8_e4m3>(cases[25], 208);
  run_case<__nv_bfloat16, __nv_fp8_e4m3>(cases[29], 209);  // multi-token, fp8
  run_case<__nv_bfloat16>(cases[31], 210);
  // the tensor-core kernel: every case it takes (head_dim <= 128, no RoPE), with the cp.async
  // engine (fp8 caches too, at head_dim 128) and the bulk row copies; copies landing late (at
  // their waits), then early (at issue)
  for (const bool eager : {false, true}) {
    emu_cp::eager = eager;
    std::printf("tensor-core kernel, copies land %s\n", eager ? "at issue" : "at their waits");
    for (size_t i = 0; i < cases.size(); ++i) {
      const Case& c = cases[i];
      if (c.head_dim > 128 || c.pos == R) continue;
      run_case<__half>(c, 300 + i, true);
      if (i % 2 == 0) run_case<__nv_bfloat16>(c, 400 + i, true);
      if (c.head_dim == 128 && i % 3 == 0) run_case<__nv_bfloat16, __nv_fp8_e4m3>(c, 500 + i, true);
      run_case<__nv_bfloat16>(c, 600 + i, true, true);
    }
  }
  emu_cp::eager = false;
  std::printf(failures ? "FAILED: %d\n" : "all ok\n", failures);
  return failures ? 1 : 0;
}
