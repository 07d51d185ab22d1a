// The norm and activation launchers against CPU loops on random data, over shapes that take
// the warp-per-row, block-per-row and scalar paths. Exit 77 when there is no device.
#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cmath>
#include <cstdio>
#include <random>
#include <vector>

#include "flashinfer/activation.cuh"
#include "flashinfer/norm.cuh"

using namespace flashinfer;

#define CUDA_OK(x)                                                                     \
  do {                                                                                 \
    cudaError_t e_ = (x);                                                              \
    if (e_ != cudaSuccess) {                                                           \
      std::printf("%s:%d: %s\n", __FILE__, __LINE__, cudaGetErrorString(e_));          \
      std::exit(1);                                                                    \
    }                                                                                  \
  } while (0)

static int g_fail = 0;

template <typename T>
static std::vector<float> round_trip(std::vector<float> v) {
  for (float& x : v) x = float(T(x));
  return v;
}

template <typename T>
struct DeviceBuf {
  T* p = nullptr;
  size_t n;
  explicit DeviceBuf(const std::vector<float>& host) : n(host.size()) {
    std::vector<T> h(n);
    for (size_t i = 0; i < n; ++i) h[i] = T(host[i]);
    CUDA_OK(cudaMalloc(&p, n * sizeof(T) + 16));
    CUDA_OK(cudaMemcpy(p, h.data(), n * sizeof(T), cudaMemcpyHostToDevice));
  }
  std::vector<float> get() const {
    std::vector<T> h(n);
    CUDA_OK(cudaMemcpy(h.data(), p, n * sizeof(T), cudaMemcpyDeviceToHost));
    std::vector<float> f(n);
    for (size_t i = 0; i < n; ++i) f[i] = float(h[i]);
    return f;
  }
  ~DeviceBuf() { cudaFree(p); }
};

static double rel_err(const std::vector<float>& a, const std::vector<double>& ref) {
  double num = 0, den = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (!std::isfinite(a[i])) return INFINITY;
    num += (a[i] - ref[i]) * (a[i] - ref[i]);
    den += ref[i] * ref[i];
  }
  return std::sqrt(num / (den + 1e-30));
}

static void expect(bool ok, const char* what, int64_t rows, int64_t h, double err) {
  std::printf("%-28s rows=%-5lld hidden=%-6lld rel_err=%.2e %s\n", what, (long long)rows, (long long)h, err,
              ok ? "ok" : "FAIL");
  if (!ok) ++g_fail;
}

// rows with a stride: row r of x starts at r * ld (ld >= hidden).
template <typename T>
static void test_rmsnorm(int64_t rows, int64_t hidden, int64_t ld, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> x(rows * ld), w(hidden), res(rows * ld);
  for (float& v : x) v = nd(rng);
  for (float& v : res) v = nd(rng);
  for (float& v : w) v = nd(rng);
  x = round_trip<T>(x), w = round_trip<T>(w), res = round_trip<T>(res);
  DeviceBuf<T> dx(x), dw(w), dres(res), dout(std::vector<float>(rows * ld, NAN));
  RowLayout l{1, ld, 0};
  const float eps = 1e-6f;
  norm::NormParams<T, T> p{dout.p, dx.p, nullptr, dw.p, nullptr, rows, hidden, l, l, l, eps, 0.f, false};
  CUDA_OK(norm::Norm(p, norm::NormKind::kRMS, 0));
  std::vector<float> out = dout.get();
  std::vector<float> got;
  std::vector<double> ref;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < hidden; ++j) ss += double(x[r * ld + j]) * x[r * ld + j];
    const double rstd = 1.0 / std::sqrt(ss / hidden + eps);
    for (int64_t j = 0; j < hidden; ++j) {
      ref.push_back(x[r * ld + j] * rstd * w[j]);
      got.push_back(out[r * ld + j]);
    }
  }
  double e = rel_err(got, ref);
  expect(e < 8e-3, "rmsnorm", rows, hidden, e);

  // fused add: residual <- x + res; x <- rmsnorm(x + res) in place
  p = norm::NormParams<T, T>{dx.p, dx.p, dres.p, dw.p, nullptr, rows, hidden, l, l, l, eps, 0.f, false};
  CUDA_OK(norm::Norm(p, norm::NormKind::kFusedAddRMS, 0));
  std::vector<float> xo = dx.get(), ro = dres.get();
  std::vector<float> got_x, got_r;
  std::vector<double> ref_x, ref_r;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < hidden; ++j) {
      const double s = double(x[r * ld + j]) + res[r * ld + j];
      ss += s * s;
    }
    const double rstd = 1.0 / std::sqrt(ss / hidden + eps);
    for (int64_t j = 0; j < hidden; ++j) {
      const double s = double(x[r * ld + j]) + res[r * ld + j];
      ref_x.push_back(s * rstd * w[j]);
      ref_r.push_back(s);
      got_x.push_back(xo[r * ld + j]);
      got_r.push_back(ro[r * ld + j]);
    }
  }
  e = std::max(rel_err(got_x, ref_x), rel_err(got_r, ref_r));
  expect(e < 8e-3, "fused_add_rmsnorm", rows, hidden, e);
}

template <typename T>
static void test_silu(int64_t rows, int64_t hidden, std::mt19937& rng) {
  std::normal_distribution<float> nd;
  std::vector<float> x(rows * 2 * hidden);
  for (float& v : x) v = nd(rng);
  x = round_trip<T>(x);
  DeviceBuf<T> dx(x), dout(std::vector<float>(rows * hidden, NAN));
  activation::ActParams<T> p{dout.p, dx.p, rows, hidden, RowLayout{1, 2 * hidden, 0}, RowLayout{1, hidden, 0}, false};
  CUDA_OK(activation::ActAndMul(p, activation::ActKind::kSilu, 0));
  std::vector<float> out = dout.get();
  std::vector<double> ref;
  for (int64_t r = 0; r < rows; ++r)
    for (int64_t j = 0; j < hidden; ++j) {
      const double a = x[r * 2 * hidden + j], b = x[r * 2 * hidden + hidden + j];
      ref.push_back(a / (1 + std::exp(-a)) * b);
    }
  const double e = rel_err(out, ref);
  expect(e < 8e-3, "silu_and_mul", rows, hidden, e);
}

int main() {
  int n = 0;
  if (cudaGetDeviceCount(&n) != cudaSuccess || n == 0) {
    std::printf("no CUDA device: skipped\n");
    return 77;
  }
  std::mt19937 rng(2024);
  for (int64_t h : {64, 111, 128, 4096, 8192, 16384}) {
    for (int64_t rows : {1, 7, 130}) {
      test_rmsnorm<__nv_bfloat16>(rows, h, h, rng);
      test_rmsnorm<__half>(rows, h, h + 8, rng);  // strided rows
    }
  }
  test_rmsnorm<__half>(3, 4096, 4096 + 3, rng);  // misaligned rows take the scalar path
  for (int64_t h : {1, 64, 111, 14336}) test_silu<__nv_bfloat16>(9, h, rng);
  // Every run-time variant of the register-resident norm kernel and of the activation kernels.
  const norm::NormTuning saved = norm::norm_tuning();
  for (int v : {1, 2, 4, 8}) {
    for (int r : {1, 2, 4}) {
      if (v * r > norm::kRowsMaxPerThread) continue;
      norm::norm_tuning() = norm::NormTuning{norm::NormVariant::kRows, v, r,
                                             v == 1 ? norm::NormLoad::kNoAllocate : norm::NormLoad::kPlain};
      std::printf("-- norm variant rows v=%d r=%d\n", v, r);
      for (int64_t h : {1032, 4096, 8192}) {
        for (int64_t rows : {1, 7, 130}) {
          test_rmsnorm<__nv_bfloat16>(rows, h, h, rng);
          test_rmsnorm<__half>(rows, h, h + 8, rng);
        }
      }
    }
  }
  norm::norm_tuning() = norm::NormTuning{norm::NormVariant::kPipe, 0, 0, norm::NormLoad::kPlain};
  std::printf("-- norm variant pipe\n");
  for (int64_t h : {1032, 4096, 8192}) test_rmsnorm<__nv_bfloat16>(130, h, h, rng);
  norm::norm_tuning() = saved;
  const activation::ActTuning act_saved = activation::act_tuning();
  for (activation::ActTuning t : {activation::ActTuning{activation::ActVariant::kPipe, 0},
                                  activation::ActTuning{activation::ActVariant::kFlat, 1},
                                  activation::ActTuning{activation::ActVariant::kFlat, 2},
                                  activation::ActTuning{activation::ActVariant::kFlat, 8}}) {
    activation::act_tuning() = t;
    std::printf("-- activation variant %d unroll %d\n", static_cast<int>(t.variant), t.unroll);
    for (int64_t h : {8, 111, 4096, 14336}) test_silu<__nv_bfloat16>(9, h, rng);
  }
  activation::act_tuning() = act_saved;
  CUDA_OK(cudaDeviceSynchronize());
  std::printf(g_fail ? "%d case(s) FAILED\n" : "all cases passed\n", g_fail);
  return g_fail ? 1 : 0;
}
