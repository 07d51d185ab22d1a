// The state-merge kernels (cascade.cuh) run on the CPU by cuda_emulator.h: MergeStateFlatKernel
// on packed states (1, 2 or 4 vectors per thread, as the launcher picks it: the first, fifth and
// tenth cases below and the last three), MergeStateKernel in the passes merge_state_passes plans
// (16-byte vectors and single elements, 1-8 vectors per thread, 128-512 threads, heads of one
// and of several rounds), out of place and in place (the two-pass case included), with row
// masks, empty states and strided views; MergeStates' cp.async pipeline at 2-5 stages and its
// single-element kernel, 0-7 states. The reference is float64 math on the inputs; values must be
// within one rounding of T of it, LSEs within 1e-5, and bytes outside the outputs (view padding,
// masked rows) untouched.
// Run: ctest -L emu, or tests/cpp/emu/run_emulated.sh cascade.
#include "cuda_emulator.h"
// (the emulator first)
#include <algorithm>
#include <random>
using std::max;
using std::min;

#include "cp_async_emulated.h"
// (cp.async emulated, before any header that uses it)
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"  // (vectors past head_dim: neither loaded nor used)
#include "flashinfer/attention/cascade.cuh"
#pragma GCC diagnostic pop

using namespace flashinfer;
using namespace flashinfer::attention;

namespace flashinfer {
namespace attention {
alignas(16) int64_t lse_at[4096];       // MergeStateKernel's dynamic shared memory
alignas(16) float flat_lse[4096];       // MergeStateFlatKernel's
alignas(16) uint4 slots[256 * 1024 / 16];  // MergeStatesPipelinedKernel's
}  // namespace attention
}  // namespace flashinfer

namespace {

using emu::ft;
using emu::tf;

int failures = 0;

template <typename T>
double eps_of() {
  return std::is_same<T, __half>::value ? std::ldexp(1.0, -10) : std::ldexp(1.0, -7);
}

// The merge of states (v_i, s_i) in float64: o = sum 2^(s_i - m) v_i / sum 2^(s_i - m), lse =
// m + log2(sum); no finite s: o = 0, lse = -inf.
void merge_ref(const std::vector<const double*>& v, const std::vector<double>& s, int d, double* o, double* lse) {
  double m = -INFINITY;
  for (double x : s) m = max(m, x);
  for (int i = 0; i < d; ++i) o[i] = 0;
  if (m == -INFINITY) {
    *lse = -INFINITY;
    return;
  }
  double sum = 0;
  for (size_t k = 0; k < s.size(); ++k) {
    const double w = std::exp2(s[k] - m);
    sum += w;
    for (int i = 0; i < d; ++i) o[i] += w * v[k][i];
  }
  for (int i = 0; i < d; ++i) o[i] /= sum;
  *lse = m + std::log2(sum);
}

bool close_value(double got, double want, double eps) { return std::fabs(got - want) <= eps * std::fabs(want) + 1e-5; }
bool close_lse(double got, double want) {
  if (std::isinf(want)) return got == want;
  return std::fabs(got - want) <= 1e-5 * max(1.0, std::fabs(want));
}

// A [seq, heads, d] view inside a padded buffer: element (n, h, i) at n * vn + h * vh + i.
struct View {
  int64_t vn, vh;
  size_t size;
};
View view_of(int seq, int heads, int d, int pad) {
  const int64_t vh = d + pad, vn = int64_t{heads} * vh + pad;
  return {vn, vh, size_t(seq * vn + 16)};
}

struct StateCase {
  int seq, heads, d;
  int pad;  // elements between heads and rows (0: contiguous; 8: 16-byte aligned; 3: not)
  int vecs, threads;
  bool in_place, mask, empty;  // empty: some LSEs are -inf
};

template <typename T>
void run_merge_state(const StateCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  const View w = view_of(c.seq, c.heads, c.d, c.pad);
  const T sentinel = ft<T>(-777.f);
  std::vector<T> va(w.size, sentinel), vb(w.size, sentinel), vo(w.size, sentinel);
  std::vector<float> sa(size_t(c.seq) * c.heads), sb(sa.size()), so(sa.size(), -555.f);
  std::vector<uint8_t> mask(size_t(c.seq) * 3, 0);
  for (int n = 0; n < c.seq; ++n)
    for (int h = 0; h < c.heads; ++h) {
      for (int i = 0; i < c.d; ++i) {
        va[n * w.vn + h * w.vh + i] = ft<T>(N(rng));
        vb[n * w.vn + h * w.vh + i] = ft<T>(N(rng));
      }
      const size_t j = size_t(n) * c.heads + h;
      sa[j] = N(rng) * 4.f;
      sb[j] = N(rng) * 4.f;
      if (c.empty && (n + h) % 3 == 0) sa[j] = -INFINITY;
      if (c.empty && (n + 2 * h) % 4 == 0) sb[j] = -INFINITY;
    }
  for (int n = 0; n < c.seq; ++n) mask[size_t(n) * 3] = c.mask ? uint8_t(rng() % 2) : 1;
  const std::vector<T> va0 = va;
  const std::vector<float> sa0 = sa;

  MergeStateParams<T> p{};
  p.v_a = va.data(), p.s_a = sa.data(), p.v_b = vb.data(), p.s_b = sb.data();
  p.v_out = c.in_place ? va.data() : vo.data();
  p.s_out = c.in_place ? sa.data() : so.data();
  p.mask = c.mask ? mask.data() : nullptr;
  p.mask_stride = 3;
  p.seq_len = c.seq, p.num_heads = c.heads, p.head_dim = c.d;
  p.a = p.b = p.out = StateStrides{w.vn, w.vh, c.heads, 1};
  const MergeStatePasses passes = merge_state_passes(p, c.vecs, c.threads);
  // as MergeState launches them: packed states take the flat kernel (here with c.vecs vectors per
  // thread, where it has that many), the others the tile kernel's passes
  MergeFlatShape fl;
  const bool flat = passes.count > 0 && c.vecs <= 4 && merge_flat_shape(p, passes.vec, c.vecs, c.threads, &fl);
  if (flat) {
    auto kernel = c.vecs == 1   ? MergeStateFlatKernel<T, 1>
                  : c.vecs == 2 ? MergeStateFlatKernel<T, 2>
                                : MergeStateFlatKernel<T, 4>;
    emu::launch(kernel, unsigned(fl.blocks), unsigned(fl.threads), size_t(fl.rows_per_block) * 4, p, fl);
  } else {
    for (int i = 0; i < passes.count; ++i) {
      const MergeShape& l = passes.pass[i];
      emu::launch(merge_state_kernel<T>(passes.vec, l), unsigned(l.blocks), unsigned(l.threads),
                  size_t(merge_state_smem(l)), p, l);
    }
  }

  bool bad = false;
  const std::vector<T>& out = c.in_place ? va : vo;
  const std::vector<float>& sout = c.in_place ? sa : so;
  std::vector<double> a(c.d), b(c.d), ref(c.d);
  for (int n = 0; n < c.seq; ++n)
    for (int h = 0; h < c.heads; ++h) {
      const int64_t off = n * w.vn + h * w.vh;
      const size_t j = size_t(n) * c.heads + h;
      if (!mask[size_t(n) * 3]) {  // neither read nor written
        for (int i = 0; i < c.d; ++i)
          if (tf(out[off + i]) != tf(c.in_place ? va0[off + i] : sentinel)) bad = true;
        if (sout[j] != (c.in_place ? sa0[j] : -555.f)) bad = true;
        continue;
      }
      for (int i = 0; i < c.d; ++i) a[i] = tf(va0[off + i]), b[i] = tf(vb[off + i]);
      double lse;
      merge_ref({a.data(), b.data()}, {double(sa0[j]), double(sb[j])}, c.d, ref.data(), &lse);
      for (int i = 0; i < c.d; ++i)
        if (!close_value(tf(out[off + i]), ref[i], eps_of<T>())) bad = true;
      if (!close_lse(sout[j], lse)) bad = true;
    }
  // padding between heads and rows (and past the end) untouched
  std::vector<bool> inside(w.size, false);
  for (int n = 0; n < c.seq; ++n)
    for (int h = 0; h < c.heads; ++h)
      for (int i = 0; i < c.d; ++i) inside[n * w.vn + h * w.vh + i] = true;
  for (size_t e = 0; e < w.size; ++e)
    if (!inside[e] && tf(out[e]) != tf(sentinel)) bad = true;
  std::printf("merge_state %s seq=%d heads=%d d=%d pad=%d vecs=%d threads=%d in_place=%d mask=%d empty=%d: vec=%d "
              "%s passes=%d rounds=%d %s\n",
              std::is_same<T, __half>::value ? "f16" : "bf16", c.seq, c.heads, c.d, c.pad, c.vecs, c.threads,
              c.in_place, c.mask, c.empty, passes.vec, flat ? "flat" : "tiles", passes.count,
              passes.count ? passes.pass[0].rounds : 0, bad ? "FAIL" : "ok");
  if (bad) ++failures;
}

struct StatesCase {
  int seq, k, heads, d;
  int stages;  // > 0: the cp.async pipeline at this depth; 0: the single-element kernel
};

template <typename T>
void run_merge_states(const StatesCase& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  const T sentinel = ft<T>(-777.f);
  // v [seq, k, heads, d], s [seq, k, heads], contiguous; out [seq, heads, d] + 8 spare elements
  std::vector<T> v(size_t(c.seq) * c.k * c.heads * c.d + 8);
  std::vector<float> s(size_t(c.seq) * c.k * c.heads + 1);
  for (auto& x : v) x = ft<T>(N(rng));
  for (size_t j = 0; j < s.size(); ++j) s[j] = j % 5 == 2 ? -INFINITY : N(rng) * 4.f;
  std::vector<T> vo(size_t(c.seq) * c.heads * c.d + 8, sentinel);
  std::vector<float> so(size_t(c.seq) * c.heads + 1, -555.f);
  MergeStatesParams<T> p{};
  p.v = v.data(), p.s = s.data(), p.v_out = vo.data(), p.s_out = so.data();
  p.seq_len = c.seq, p.num_states = c.k, p.num_heads = c.heads, p.head_dim = c.d;
  p.in = StateStrides{int64_t{c.k} * c.heads * c.d, c.d, int64_t{c.k} * c.heads, 1};
  p.out = StateStrides{int64_t{c.heads} * c.d, c.d, c.heads, 1};
  p.v_stride_k = int64_t{c.heads} * c.d;
  p.s_stride_k = c.heads;
  const int64_t row_heads = int64_t{c.seq} * c.heads;
  constexpr int kE = 16 / int(sizeof(T));
  if (c.stages > 0) {
    const MergeShape l = merge_shape(row_heads, c.d, kE, kMergeStatesVecs);
    const size_t smem = size_t(c.stages * merge_states_stage_bytes(l.threads));
    emu::launch(MergeStatesPipelinedKernel<T, kMergeStatesVecs>, unsigned(l.blocks), unsigned(l.threads), smem, p, l,
                c.stages);
  } else {
    const MergeShape l = merge_shape(row_heads, c.d, 1, kMergeStatesVecs);
    emu::launch(MergeStatesKernel<T, 1, kMergeStatesVecs, kMergeStatesUnroll>, unsigned(l.blocks), unsigned(l.threads),
                size_t(0), p, l);
  }
  bool bad = false;
  std::vector<std::vector<double>> st(size_t(c.k), std::vector<double>(c.d));
  std::vector<double> ref(c.d);
  for (int n = 0; n < c.seq; ++n)
    for (int h = 0; h < c.heads; ++h) {
      std::vector<const double*> vs;
      std::vector<double> ss;
      for (int k = 0; k < c.k; ++k) {
        for (int i = 0; i < c.d; ++i) st[k][i] = tf(v[((size_t(n) * c.k + k) * c.heads + h) * c.d + i]);
        vs.push_back(st[k].data());
        ss.push_back(s[(size_t(n) * c.k + k) * c.heads + h]);
      }
      double lse;
      merge_ref(vs, ss, c.d, ref.data(), &lse);
      for (int i = 0; i < c.d; ++i)
        if (!close_value(tf(vo[(size_t(n) * c.heads + h) * c.d + i]), ref[i], eps_of<T>())) bad = true;
      if (!close_lse(so[size_t(n) * c.heads + h], lse)) bad = true;
    }
  for (size_t e = size_t(c.seq) * c.heads * c.d; e < vo.size(); ++e)
    if (tf(vo[e]) != tf(sentinel)) bad = true;
  if (so.back() != -555.f) bad = true;
  std::printf("merge_states %s seq=%d k=%d heads=%d d=%d stages=%d: %s\n",
              std::is_same<T, __half>::value ? "f16" : "bf16", c.seq, c.k, c.heads, c.d, c.stages,
              bad ? "FAIL" : "ok");
  if (bad) ++failures;
}

}  // namespace

int main() {
  const std::vector<StateCase> state_cases = {
      // seq, heads, d, pad, vecs, threads, in_place, mask, empty
      {5, 4, 128, 0, 1, 128, false, false, false},  // the bench shape's layout: 16 lanes per head
      {3, 5, 128, 8, 1, 256, true, true, true},     // strided, in place, masked, empty states
      {4, 3, 64, 0, 2, 128, false, true, true},
      {2, 3, 256, 8, 4, 512, true, false, false},
      {3, 2, 1024, 0, 1, 128, true, false, true},   // 4 rounds per head, in place: two passes
      {2, 3, 1024, 8, 8, 256, false, true, false},  // 1 round of 8 vectors per lane
      {3, 4, 111, 0, 1, 128, false, true, true},    // single elements (111 % 8 != 0), 2 rounds
      {2, 3, 202, 0, 1, 128, true, false, true},    // single elements, 4 rounds, in place: two passes
      {3, 3, 128, 3, 1, 128, true, true, false},    // unaligned strides: single elements, two passes
      {6, 5, 8, 0, 1, 128, false, false, true},     // one lane per head
      {7, 3, 128, 0, 4, 128, true, false, true},    // packed, in place: the flat kernel, 4 vectors per thread
      {9, 5, 64, 0, 2, 256, false, false, true},    // packed: flat, 2 vectors, a partial last block
      {1, 1, 256, 0, 1, 512, true, false, false},   // one row-head
  };
  uint64_t seed = 1;
  for (const StateCase& c : state_cases) run_merge_state<__half>(c, seed++);
  for (const StateCase& c : state_cases) run_merge_state<__nv_bfloat16>(c, seed++);
  const std::vector<StatesCase> states_cases = {
      {3, 7, 3, 128, 3}, {2, 3, 4, 64, 2}, {2, 5, 2, 256, 5}, {3, 1, 3, 128, 2},
      {2, 0, 3, 128, 2}, {3, 4, 3, 40, 0}, {2, 7, 2, 120, 0}, {2, 0, 2, 24, 0},
  };
  for (const StatesCase& c : states_cases) run_merge_states<__half>(c, seed++);
  for (const StatesCase& c : states_cases) run_merge_states<__nv_bfloat16>(c, seed++);
  std::printf(failures ? "FAILED: %d\n" : "all ok\n", failures);
  return failures ? 1 : 0;
}
