// Self-check of mma_emulated.h (ldmatrix / mma.sync m16n8k16 / pack2 on the CPU) in the ways an
// attention kernel uses them, for f16 and bf16, by 1 and 3 warps (each warp its own tiles):
//   S = C + A B^T: A [16 rows][16 k] row-major via ldmatrix_x4; B given as a row-major [n][k]
//     array (K tile: keys x features) via non-trans ldmatrix, both x2 (lanes 16-31 give null
//     addresses: ignored) and x4 (two n-blocks at once);
//   O = P V: P = the S accumulators rounded to T by pack2, reused in registers as the A operand
//     (the C/D layout of two n-blocks is the A layout), V a row-major [k][n] array (V tile: keys x
//     features) via ldmatrix_x4_trans.
// Shared-memory rows are padded (strides 24 / 24 / 40 elements) so that a wrong row stride shows.
// The reference is a CPU matmul in double; results must agree to 1e-5 of the sum of |terms|
// (the emulator sums exactly in double and rounds once, the hardware in fp32).
// Run: ctest -L emu, or tests/cpp/emu/run_emulated.sh mma.
#include "cuda_emulator.h"
// (the emulator first)
#include <algorithm>
#include <random>
using std::max;
using std::min;

#include "mma_emulated.h"
// (cp.async and mma emulated, before any header that uses them)

namespace {

using emu::ft;
using emu::tf;
namespace mma = flashinfer::mma;

constexpr int kSA = 24, kSB = 24, kSV = 40;  // shared-memory row strides (elements)
constexpr int kMaxW = 4;

// Per warp w: a [16][16], bnk [16][16] (n, k), vkn [16][16] (k, n), c0 [16][16]; outputs
// s_x2, s_x4, o [16][16] (row-major, fp32).
template <typename T>
void MmaKernel(const T* a, const T* bnk, const T* vkn, const float* c0, float* s_x2, float* s_x4, float* o) {
  __shared__ __align__(16) T a_s[kMaxW][16 * kSA];
  __shared__ __align__(16) T b_s[kMaxW][16 * kSB];
  __shared__ __align__(16) T v_s[kMaxW][16 * kSV];
  const int w = threadIdx.x / 32, L = threadIdx.x % 32, g = L / 4, t = L % 4;
  const int base = w * 256;
  for (int e = L; e < 256; e += 32) {
    const int r = e / 16, c = e % 16;
    a_s[w][r * kSA + c] = a[base + e];
    b_s[w][r * kSB + c] = bnk[base + e];
    v_s[w][r * kSV + c] = vkn[base + e];
  }
  __syncwarp();
  // A: matrix i = L / 8 is rows 8 (i % 2) .. +7, columns 8 (i / 2) .. +7
  uint32_t fa[4];
  mma::ldmatrix_x4(fa, &a_s[w][(L % 16) * kSA + 8 * (L / 16)]);
  auto c_at = [&](int e, int nb) { return c0[base + (g + 8 * (e / 2)) * 16 + nb * 8 + 2 * t + e % 2]; };
  auto store = [&](float* out, const float* d, int nb) {
    for (int e = 0; e < 4; ++e) out[base + (g + 8 * (e / 2)) * 16 + nb * 8 + 2 * t + e % 2] = d[e];
  };
  // S via x2: per n-block nb, matrix 0 = [n 8nb..+7][k 0..7], matrix 1 = [n 8nb..+7][k 8..15]
  for (int nb = 0; nb < 2; ++nb) {
    uint32_t fb[2];
    mma::ldmatrix_x2(fb, L < 16 ? &b_s[w][(nb * 8 + L % 8) * kSB + 8 * (L / 8)] : nullptr);
    float d[4];
    for (int e = 0; e < 4; ++e) d[e] = c_at(e, nb);
    mma::mma_16816<T>(d, fa, fb);
    store(s_x2, d, nb);
  }
  // S via x4: matrices [n 0-7][k 0-7], [n 0-7][k 8-15], [n 8-15][k 0-7], [n 8-15][k 8-15]
  uint32_t fb4[4];
  mma::ldmatrix_x4(fb4, &b_s[w][(8 * (L / 16) + L % 8) * kSB + 8 * ((L / 8) % 2)]);
  float s[2][4];
  for (int nb = 0; nb < 2; ++nb) {
    for (int e = 0; e < 4; ++e) s[nb][e] = c_at(e, nb);
    mma::mma_16816<T>(s[nb], fa, fb4 + 2 * nb);
    store(s_x4, s[nb], nb);
  }
  // P (16 x 16 k) from the accumulators: a[0] = P[g][2t..] = s[0][0..1], a[1] = P[g+8][2t..] = s[0][2..3],
  // a[2] = P[g][8+2t..] = s[1][0..1], a[3] = P[g+8][8+2t..] = s[1][2..3]
  uint32_t fp[4] = {mma::pack2<T>(s[0][0], s[0][1]), mma::pack2<T>(s[0][2], s[0][3]), mma::pack2<T>(s[1][0], s[1][1]),
                    mma::pack2<T>(s[1][2], s[1][3])};
  // V via x4.trans: matrices [k 0-7][n 0-7], [k 8-15][n 0-7], [k 0-7][n 8-15], [k 8-15][n 8-15]
  uint32_t fv[4];
  mma::ldmatrix_x4_trans(fv, &v_s[w][(L % 16) * kSV + 8 * (L / 16)]);
  for (int nb = 0; nb < 2; ++nb) {
    float d[4] = {0.f, 0.f, 0.f, 0.f};
    mma::mma_16816<T>(d, fp, fv + 2 * nb);
    store(o, d, nb);
  }
}

int failures = 0;

template <typename T>
void run(int warps, uint64_t seed, float scale) {
  std::mt19937_64 rng(seed);
  std::normal_distribution<float> N(0.f, 1.f);
  const size_t n = size_t(warps) * 256;
  std::vector<T> a(n), bnk(n), vkn(n);
  std::vector<float> c0(n), s_x2(n, -1e30f), s_x4(n, -1e30f), o(n, -1e30f);
  for (auto& x : a) x = ft<T>(N(rng) * scale);
  for (auto& x : bnk) x = ft<T>(N(rng));
  for (auto& x : vkn) x = ft<T>(N(rng));
  for (auto& x : c0) x = N(rng) * 3.f;
  emu::launch(MmaKernel<T>, 1u, unsigned(32 * warps), size_t(0), a.data(), bnk.data(), vkn.data(), c0.data(),
              s_x2.data(), s_x4.data(), o.data());
  double max_rel = 0;
  bool bad = false;
  auto check = [&](double got, double ref, double mag) {
    const double rel = std::fabs(got - ref) / std::max(mag, 1e-30);
    max_rel = std::max(max_rel, rel);
    if (!(rel <= 1e-5)) bad = true;
  };
  for (int w = 0; w < warps; ++w) {
    const size_t base = size_t(w) * 256;
    for (int m = 0; m < 16; ++m)
      for (int j = 0; j < 16; ++j) {
        double ref = c0[base + m * 16 + j], mag = std::fabs(ref);
        for (int k = 0; k < 16; ++k) {
          const double p = double(tf(a[base + m * 16 + k])) * tf(bnk[base + j * 16 + k]);
          ref += p, mag += std::fabs(p);
        }
        check(s_x2[base + m * 16 + j], ref, mag);
        check(s_x4[base + m * 16 + j], ref, mag);
        // O = round_T(S) V, with the kernel's own S
        double oref = 0, omag = 0;
        for (int k = 0; k < 16; ++k) {
          const double p = double(tf(ft<T>(s_x4[base + m * 16 + k]))) * tf(vkn[base + k * 16 + j]);
          oref += p, omag += std::fabs(p);
        }
        check(o[base + m * 16 + j], oref, omag);
      }
  }
  // pack2: round to nearest, lo in the low half
  for (int i = 0; i < 1000; ++i) {
    const float lo = N(rng) * 100.f, hi = N(rng) * 1e-3f;
    const uint32_t r = mma::pack2<T>(lo, hi);
    const T tl = ft<T>(lo), th = ft<T>(hi);
    uint16_t bl, bh;
    std::memcpy(&bl, &tl, 2);
    std::memcpy(&bh, &th, 2);
    if (r != (uint32_t(bl) | uint32_t(bh) << 16)) bad = true;
  }
  std::printf("mma %s warps=%d scale=%g: max rel err %.2e %s\n", std::is_same<T, __half>::value ? "f16" : "bf16",
              warps, scale, max_rel, bad ? "FAIL" : "ok");
  if (bad) ++failures;
}

// A known case by hand: A = identity-like, B = ramp: checks the layouts independently of the
// random test (which shares its index algebra with the kernel above).
template <typename T>
void run_by_hand() {
  std::vector<T> a(256), bnk(256), vkn(256);
  std::vector<float> c0(256, 0.f), s_x2(256), s_x4(256), o(256);
  for (int m = 0; m < 16; ++m)
    for (int k = 0; k < 16; ++k) {
      a[m * 16 + k] = ft<T>(m == k ? 1.f : 0.f);  // A = I
      bnk[m * 16 + k] = ft<T>(float(m * 16 + k) / 8.f);  // B[k][n] = (16 n + k) / 8
      vkn[m * 16 + k] = ft<T>(m == (k + 3) % 16 ? 1.f : 0.f);  // V[k][n] = [k == n + 3 mod 16]
    }
  emu::launch(MmaKernel<T>, 1u, 32u, size_t(0), a.data(), bnk.data(), vkn.data(), c0.data(), s_x2.data(),
              s_x4.data(), o.data());
  bool bad = false;
  for (int m = 0; m < 16; ++m)
    for (int n = 0; n < 16; ++n) {
      const float s = float(16 * n + m) / 8.f;  // S = I B = B, S[m][n] = B[m][n]
      if (s_x2[m * 16 + n] != s || s_x4[m * 16 + n] != s) bad = true;
      // O[m][n] = sum_k round(S[m][k]) V[k][n] = round(S[m][n + 3 mod 16])
      if (o[m * 16 + n] != tf(ft<T>(float(16 * ((n + 3) % 16) + m) / 8.f))) bad = true;
    }
  std::printf("mma %s by hand (A = I, B = ramp, V = shift): %s\n", std::is_same<T, __half>::value ? "f16" : "bf16",
              bad ? "FAIL" : "ok");
  if (bad) ++failures;
}

}  // namespace

int main() {
  run_by_hand<__half>();
  run_by_hand<__nv_bfloat16>();
  uint64_t seed = 1;
  for (int warps : {1, 3}) {
    for (float scale : {1.f, 100.f}) {
      run<__half>(warps, seed++, scale);
      run<__nv_bfloat16>(warps, seed++, scale);
    }
  }
  std::printf(failures ? "FAILED: %d\n" : "all ok\n", failures);
  return failures ? 1 : 0;
}
