// What a kernel's code size costs under the bench's method (benchmarks/NOTES.md, session 31):
// the 256 MiB memset flush evicts the kernel's SASS from L2 too, so every timed launch fetches
// its instructions from DRAM. Kernels run the same dynamic instruction count (N FFMAs in 8
// independent chains) either as straight-line code (N * 16 bytes of SASS) or as a loop over 64
// of them (~1.1 KiB); the difference is the fetch of the straight-line code. Variants: no memory
// access, or a cold global load first (the code after it is fetched while the load waits?); one
// CTA, or one CTA per SM (every SM's instruction caches miss; L2 serves all but the first).
//   nvcc -O3 -std=c++17 -arch=sm_90 -o code_fetch benchmarks/experiments/code_fetch.cu && ./code_fetch
#include "bench_method.cuh"

template <int N, bool kLoop, bool kLoad>
__global__ void __launch_bounds__(128) code_kernel(const float* in, float a, float b, float* sink) {
  float base = a;
  if constexpr (kLoad) base = in[blockIdx.x * 128 + threadIdx.x];
  float x[8];
#pragma unroll
  for (int c = 0; c < 8; ++c) x[c] = base + static_cast<float>(c);
  if constexpr (kLoop) {
#pragma unroll 1
    for (int it = 0; it < N / 64; ++it) {
#pragma unroll
      for (int j = 0; j < 8; ++j)
#pragma unroll
        for (int c = 0; c < 8; ++c) x[c] = fmaf(x[c], a, b);
    }
  } else {
#pragma unroll
    for (int j = 0; j < N / 8; ++j)
#pragma unroll
      for (int c = 0; c < 8; ++c) x[c] = fmaf(x[c], a, b);
  }
  float s = 0.f;
#pragma unroll
  for (int c = 0; c < 8; ++c) s += x[c];
  if (s == 1234.5f) sink[0] = s;
}

template <int N>
void row(Timer& tm, int sms, const float* in, float* sink) {
  float t[2][2][2];  // [load][grid][loop]
  for (int ld = 0; ld < 2; ++ld)
    for (int g = 0; g < 2; ++g) {
      const int grid = g ? sms : 1;
      if (ld) {
        t[ld][g][0] = tm.median_us([&] { code_kernel<N, false, true><<<grid, 128>>>(in, 1.0001f, 0.5f, sink); });
        t[ld][g][1] = tm.median_us([&] { code_kernel<N, true, true><<<grid, 128>>>(in, 1.0001f, 0.5f, sink); });
      } else {
        t[ld][g][0] = tm.median_us([&] { code_kernel<N, false, false><<<grid, 128>>>(in, 1.0001f, 0.5f, sink); });
        t[ld][g][1] = tm.median_us([&] { code_kernel<N, true, false><<<grid, 128>>>(in, 1.0001f, 0.5f, sink); });
      }
    }
  std::printf("%6d FFMA (%6.1f KiB straight) | no load: 1 CTA %6.2f / %6.2f, %d CTAs %6.2f / %6.2f"
              " | cold load first: 1 CTA %6.2f / %6.2f, %d CTAs %6.2f / %6.2f\n",
              N, N * 16 / 1024.0, t[0][0][0], t[0][0][1], sms, t[0][1][0], t[0][1][1], t[1][0][0], t[1][0][1], sms,
              t[1][1][0], t[1][1][1]);
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs; us, median of 40; each pair: straight-line / loop\n", prop.name, sms);
  char* flush;
  float *in, *sink;
  CK(cudaMalloc(&flush, size_t{256} << 20));
  CK(cudaMalloc(&in, sms * 128 * sizeof(float)));
  CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(in, 0, sms * 128 * sizeof(float)));
  unsigned* usink;
  CK(cudaMalloc(&usink, 64));
  Timer tm{flush, size_t{256} << 20, false, usink, sms};
  for (int round = 0; round < 2; ++round) {
    std::printf("round %d: empty kernel %.2f us\n", round, tm.median_us([&] { empty_kernel<<<1, 32>>>(); }));
    row<64>(tm, sms, in, sink);
    row<256>(tm, sms, in, sink);
    row<1024>(tm, sms, in, sink);
    row<2048>(tm, sms, in, sink);
    row<4096>(tm, sms, in, sink);
    row<8192>(tm, sms, in, sink);
  }
  CK(cudaGetLastError());
  return 0;
}
