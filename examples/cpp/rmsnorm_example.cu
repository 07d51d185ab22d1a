// Minimal C++ use of flashinfer: RMSNorm over a [rows, hidden] bf16 buffer in device memory,
// checked against a CPU loop. Exits 77 (skip) when there is no CUDA device.
#include <cuda_bf16.h>

#include <cmath>
#include <cstdio>
#include <vector>

#include <flashinfer/norm.cuh>

int main() {
  int devices = 0;
  if (cudaGetDeviceCount(&devices) != cudaSuccess || devices == 0) {
    std::printf("rmsnorm_example: no CUDA device, skipped\n");
    return 77;
  }
  using T = __nv_bfloat16;
  const int64_t rows = 64, hidden = 4096;
  std::vector<T> x(rows * hidden), w(hidden);
  for (int64_t i = 0; i < rows * hidden; ++i) x[i] = T(std::sin(0.37f * float(i)));
  for (int64_t j = 0; j < hidden; ++j) w[j] = T(1.f + 0.001f * float(j % 97));

  T *d_x, *d_w, *d_out;
  cudaMalloc(&d_x, x.size() * sizeof(T));
  cudaMalloc(&d_w, w.size() * sizeof(T));
  cudaMalloc(&d_out, x.size() * sizeof(T));
  cudaMemcpy(d_x, x.data(), x.size() * sizeof(T), cudaMemcpyHostToDevice);
  cudaMemcpy(d_w, w.data(), w.size() * sizeof(T), cudaMemcpyHostToDevice);

  namespace fn = flashinfer::norm;
  const flashinfer::RowLayout rows_layout{1, hidden, 0};  // contiguous [rows, hidden]
  fn::NormParams<T, T> p{d_out, d_x, /*residual=*/nullptr, d_w, /*bias=*/nullptr, rows, hidden,
                         rows_layout, rows_layout, rows_layout, /*eps=*/1e-6f, /*weight_offset=*/0.f,
                         /*pdl=*/false};
  cudaError_t err = fn::Norm(p, fn::NormKind::kRMS, /*stream=*/0);
  if (err == cudaSuccess) err = cudaDeviceSynchronize();
  if (err != cudaSuccess) {
    std::printf("rmsnorm_example: %s\n", cudaGetErrorString(err));
    return 1;
  }
  std::vector<T> out(x.size());
  cudaMemcpy(out.data(), d_out, out.size() * sizeof(T), cudaMemcpyDeviceToHost);

  double max_err = 0;
  for (int64_t r = 0; r < rows; ++r) {
    double ss = 0;
    for (int64_t j = 0; j < hidden; ++j) ss += double(float(x[r * hidden + j])) * float(x[r * hidden + j]);
    const double rstd = 1.0 / std::sqrt(ss / hidden + 1e-6);
    for (int64_t j = 0; j < hidden; ++j) {
      const double ref = float(x[r * hidden + j]) * rstd * float(w[j]);
      max_err = std::fmax(max_err, std::fabs(ref - float(out[r * hidden + j])) / (1.0 + std::fabs(ref)));
    }
  }
  cudaFree(d_x);
  cudaFree(d_w);
  cudaFree(d_out);
  const bool ok = max_err < 1e-2;
  std::printf("rmsnorm_example: %lld x %lld bf16, max scaled error %.2e: %s\n", (long long)rows,
              (long long)hidden, max_err, ok ? "PASS" : "FAIL");
  return ok ? 0 : 1;
}
