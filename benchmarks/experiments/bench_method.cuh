// The bench's timing method for the standalone experiments of this folder (read_floor.cu,
// code_fetch.cu; benchmarks/NOTES.md, sessions 25 and 31): a GPU sleep first (the host's enqueue
// hides behind it), then per rep [256 MiB memset flush (or, as a diagnostic, a read flush),
// start event, the op, end event]; the median.
#pragma once

#include <cuda_runtime.h>

#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#define CK(x)                                                                           \
  do {                                                                                  \
    cudaError_t e_ = (x);                                                               \
    if (e_ != cudaSuccess) {                                                            \
      std::printf("%s:%d %s: %s\n", __FILE__, __LINE__, #x, cudaGetErrorString(e_)); \
      return 1;                                                                         \
    }                                                                                   \
  } while (0)

__global__ void empty_kernel() {}

__global__ void sleep_kernel(long long cycles) {
  const long long t0 = clock64();
  while (clock64() - t0 < cycles) {
  }
}

__global__ void read_flush(const uint4* p, size_t n, unsigned* sink) {
  unsigned acc = 0;
  for (size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x; i < n; i += size_t{gridDim.x} * blockDim.x) {
    const uint4 v = p[i];
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

struct Timer {
  char* flush;
  size_t flush_bytes;
  bool read;
  unsigned* sink;
  int sms;
  template <typename F>
  float median_us(F&& op, int reps = 40) {
    std::vector<cudaEvent_t> e0(reps), e1(reps);
    for (int r = 0; r < reps; ++r) cudaEventCreate(&e0[r]), cudaEventCreate(&e1[r]);
    for (int w = 0; w < 3; ++w) {
      do_flush();
      op();
    }
    sleep_kernel<<<1, 1>>>(4000000);
    for (int r = 0; r < reps; ++r) {
      do_flush();
      cudaEventRecord(e0[r]);
      op();
      cudaEventRecord(e1[r]);
    }
    cudaDeviceSynchronize();
    std::vector<float> t(reps);
    for (int r = 0; r < reps; ++r) {
      cudaEventElapsedTime(&t[r], e0[r], e1[r]);
      t[r] *= 1000.f;
      cudaEventDestroy(e0[r]), cudaEventDestroy(e1[r]);
    }
    std::sort(t.begin(), t.end());
    return t[reps / 2];
  }
  void do_flush() {
    if (read)
      read_flush<<<sms * 8, 256>>>(reinterpret_cast<const uint4*>(flush), flush_bytes / 16, sink);
    else
      cudaMemsetAsync(flush, 0, flush_bytes);
  }
};
