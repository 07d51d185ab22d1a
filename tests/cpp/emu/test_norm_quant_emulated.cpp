// The fp8-output norms' kernel NormQuantKernel (norm_quant.cuh) run on the CPU by
// cuda_emulator.h: RMSNorm, fused-add RMSNorm and LayerNorm into e4m3 and e5m2, 16-byte vectors
// and single elements, strided rows, a device-pointer scale and a by-value one, f16 and bf16.
// The reference is float64 math quantized by nearest search over all 256 codes of an
// independent fp8 decoder (ties to the even code, saturating at the largest finite value);
// every output must be within one code of it and equal to it on >= 99% of the elements (the
// kernel's fp32 differs from float64 only next to a rounding boundary).
// Run: ctest -L emu, or tests/cpp/emu/run_emulated.sh norm_quant.
#include "cuda_emulator.h"
// (the emulator first)
#include <algorithm>
#include <random>
using std::max;
using std::min;

#include "flashinfer/norm_quant.cuh"

using namespace flashinfer;
using namespace flashinfer::norm;

namespace {

using emu::ft;
using emu::tf;

int failures = 0;

// Value of an fp8 code (NaN for the NaN codes, +-inf for e5m2's infinities).
double fp8_value(uint8_t code, Fp8Kind kind) {
  const int sign = code >> 7;
  const int ebits = kind == Fp8Kind::kE4M3 ? 4 : 5, mbits = 7 - ebits, bias = kind == Fp8Kind::kE4M3 ? 7 : 15;
  const int e = (code >> mbits) & ((1 << ebits) - 1), m = code & ((1 << mbits) - 1);
  double v;
  if (kind == Fp8Kind::kE4M3 && e == 15 && m == 7) return NAN;
  if (kind == Fp8Kind::kE5M2 && e == 31) return m ? NAN : (sign ? -INFINITY : INFINITY);
  if (e == 0)
    v = std::ldexp(double(m), 1 - bias - mbits);
  else
    v = std::ldexp(double((1 << mbits) + m), e - bias - mbits);
  return sign ? -v : v;
}

// Nearest finite code to y, saturating; on an exact tie between two values, the code whose
// lowest bit (the mantissa's last) is 0.
uint8_t fp8_nearest(double y, Fp8Kind kind) {
  int best = -1;
  double bd = INFINITY;
  for (int c = 0; c < 256; ++c) {
    const double v = fp8_value(uint8_t(c), kind);
    if (!std::isfinite(v)) continue;
    const double d = std::fabs(v - y);
    if (d < bd || (d == bd && (c & 1) == 0 && fp8_value(uint8_t(best), kind) != v)) {
      bd = d;
      best = c;
    }
  }
  return uint8_t(best);
}

struct Case {
  NormKind kind;
  Fp8Kind fp8;
  int rows, hidden;
  bool strided;     // rows of a wider buffer (every row starts 8 elements in; out likewise)
  bool scale_ptr;   // the scale from device memory
  float scale;
};

template <typename T>
void run_case(const Case& c, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  const int H = c.hidden, R = c.rows;
  const int in_pitch = c.strided ? H + 24 : H, out_pitch = c.strided ? H + 16 : H;
  const int in_off = c.strided ? 8 : 0, out_off = c.strided ? 8 : 0;
  std::vector<T> x(size_t(R) * in_pitch + 8), res(size_t(R) * in_pitch + 8);
  for (auto& v : x) v = ft<T>(N(rng) * 2.f + 0.5f);
  for (auto& v : res) v = ft<T>(N(rng));
  const std::vector<T> res0 = res;
  std::vector<T> w(H);
  std::vector<float> g(H), b(H);
  for (auto& v : w) v = ft<T>(N(rng));
  for (auto& v : g) v = N(rng);
  for (auto& v : b) v = N(rng);
  std::vector<uint8_t> out(size_t(R) * out_pitch + 16, 0xAB);
  const float scale_dev = c.scale;
  const RowLayout in_l{1, in_pitch, 0}, out_l{1, out_pitch, 0};

  auto launch = [&](auto kind_tag, auto wt_tag) {
    constexpr NormKind kK = decltype(kind_tag)::value;
    using W = typename decltype(wt_tag)::type;
    NormQuantParams<T, W> p{};
    p.out = out.data() + out_off;
    p.input = x.data() + in_off;
    p.residual = kK == NormKind::kFusedAddRMS ? res.data() + in_off : nullptr;
    if constexpr (std::is_same<W, float>::value) {
      p.weight = g.data();
      p.bias = b.data();
    } else {
      p.weight = w.data();
    }
    p.scale_ptr = c.scale_ptr ? &scale_dev : nullptr;
    p.scale = c.scale_ptr ? 123.f : c.scale;
    p.rows = R, p.hidden = H;
    p.in_rows = in_l, p.out_rows = out_l, p.res_rows = in_l;
    p.eps = 1e-5f;
    p.fp8 = c.fp8;
    const bool vec = norm_quant_vectorizable(p);
    auto go = [&](auto fp8_tag) {
      constexpr Fp8Kind kF = decltype(fp8_tag)::value;
      if (vec)
        emu::launch(NormQuantKernel<T, W, kK, kF, 8>, unsigned(min(R, 3)), unsigned(kNormQuantThreads), size_t(0), p);
      else
        emu::launch(NormQuantKernel<T, W, kK, kF, 1>, unsigned(min(R, 3)), unsigned(kNormQuantThreads), size_t(0), p);
    };
    if (c.fp8 == Fp8Kind::kE4M3)
      go(std::integral_constant<Fp8Kind, Fp8Kind::kE4M3>{});
    else
      go(std::integral_constant<Fp8Kind, Fp8Kind::kE5M2>{});
    return vec;
  };
  struct TW {
    using type [[maybe_unused]] = T;
  };
  struct FW {
    using type [[maybe_unused]] = float;
  };
  bool vec = false;
  if (c.kind == NormKind::kRMS) vec = launch(std::integral_constant<NormKind, NormKind::kRMS>{}, TW{});
  if (c.kind == NormKind::kFusedAddRMS) vec = launch(std::integral_constant<NormKind, NormKind::kFusedAddRMS>{}, TW{});
  if (c.kind == NormKind::kLayer) vec = launch(std::integral_constant<NormKind, NormKind::kLayer>{}, FW{});

  long exact = 0, total = 0;
  bool bad = false;
  for (int r = 0; r < R; ++r) {
    std::vector<double> v(H);
    for (int i = 0; i < H; ++i) {
      v[i] = tf(x[size_t(r) * in_pitch + in_off + i]);
      if (c.kind == NormKind::kFusedAddRMS) v[i] += tf(res0[size_t(r) * in_pitch + in_off + i]);
    }
    double mean = 0, ss = 0;
    for (double a : v) mean += a;
    mean /= H;
    for (double a : v) ss += c.kind == NormKind::kLayer ? (a - mean) * (a - mean) : a * a;
    const double inv = 1.0 / std::sqrt(ss / H + 1e-5);
    const double inv_scale = double(1.f / c.scale);  // FlashInfer's formula: x * float32(1 / scale)
    for (int i = 0; i < H; ++i) {
      double y;
      if (c.kind == NormKind::kLayer)
        // rounded to T first; that value times float32(1 / scale) in float32, as FlashInfer's
        // reference computes it (this step has one exact input, so no float64 is closer)
        y = double(tf(ft<T>(float((v[i] - mean) * inv * g[i] + b[i]))) * (1.f / c.scale));
      else
        y = v[i] * inv * tf(w[i]) * inv_scale;
      const uint8_t want = fp8_nearest(y, c.fp8);
      const uint8_t got = out[size_t(r) * out_pitch + out_off + i];
      ++total;
      if (got == want) {
        ++exact;
        continue;
      }
      // one code apart: the neighbours of `want` in value
      const double gv = fp8_value(got, c.fp8), wv = fp8_value(want, c.fp8);
      const double step = std::max(std::fabs(fp8_value(uint8_t(want + 1), c.fp8) - wv),
                                   std::fabs(fp8_value(uint8_t(want - 1), c.fp8) - wv));
      if (!(std::fabs(gv - wv) <= step * 1.0001)) bad = true;
    }
    if (c.kind == NormKind::kFusedAddRMS)
      for (int i = 0; i < H; ++i) {
        const T want = ft<T>(float(v[i]));
        if (tf(res[size_t(r) * in_pitch + in_off + i]) != tf(want)) bad = true;
      }
    // bytes of out's rows outside the row are untouched
    if (c.strided)
      for (int i = 0; i < out_off; ++i)
        if (out[size_t(r) * out_pitch + i] != 0xAB) bad = true;
  }
  if (double(exact) < 0.99 * double(total)) bad = true;
  std::printf("%s kind=%d fp8=%s rows=%d hidden=%d strided=%d scale=%s%.3g vec=%d: exact %ld/%ld %s\n",
              std::is_same<T, __half>::value ? "f16" : "bf16", int(c.kind), c.fp8 == Fp8Kind::kE4M3 ? "e4m3" : "e5m2",
              R, H, c.strided, c.scale_ptr ? "*" : "", c.scale, vec, exact, total, bad ? "FAIL" : "ok");
  if (bad) ++failures;
}

}  // namespace

int main() {
  // fp8 decoder sanity: the formats' largest finite values and smallest subnormals
  if (fp8_value(0x7E, Fp8Kind::kE4M3) != 448.0 || fp8_value(0x7B, Fp8Kind::kE5M2) != 57344.0 ||
      fp8_value(0x01, Fp8Kind::kE4M3) != std::ldexp(1.0, -9) || fp8_value(0x01, Fp8Kind::kE5M2) != std::ldexp(1.0, -16)) {
    std::printf("fp8 decoder wrong\n");
    return 1;
  }
  const NormKind RMS = NormKind::kRMS, ADD = NormKind::kFusedAddRMS, LN = NormKind::kLayer;
  const Fp8Kind E4 = Fp8Kind::kE4M3, E5 = Fp8Kind::kE5M2;
  const std::vector<Case> cases = {
      {RMS, E4, 5, 512, false, true, 0.5f},    {RMS, E5, 3, 111, false, false, 1.f},
      {RMS, E4, 4, 1024, true, false, 0.01f},  // saturates
      {ADD, E4, 5, 256, false, false, 2.f},    {ADD, E5, 3, 100, true, true, 0.25f},
      {ADD, E4, 2, 2048, true, true, 0.05f},   {LN, E4, 4, 384, false, true, 0.5f},
      {LN, E5, 3, 129, false, false, 3.f},     {LN, E4, 2, 1024, true, false, 0.02f},
  };
  uint64_t seed = 1;
  for (const Case& c : cases) run_case<__half>(c, seed++);
  for (const Case& c : cases) run_case<__nv_bfloat16>(c, seed++);
  std::printf(failures ? "FAILED: %d\n" : "all ok\n", failures);
  return failures ? 1 : 0;
}
