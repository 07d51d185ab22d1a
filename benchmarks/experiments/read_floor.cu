// What streaming N bytes costs under the bench's method (benchmarks/NOTES.md, session 25): a
// GPU sleep first, then per rep [256 MiB memset flush (or a read flush), start event, kernel, end
// event], median of the reps. Kernels: an empty one (the floor), a pure reader (16-byte loads,
// 4 per thread in flight, xor-reduced so nothing is dead) under three L2 policies, a bulk-copy
// reader shaped like the decode kernel's pipeline (a chunk per CTA, contiguous or in random 4 KiB
// pages), a copy (read N, write N), and a 2:1 "add" (read 2N, write N, merge_state's streams).
// The readers bound what a decode kernel of the same bytes can reach: no math, no merge.
//   nvcc -O3 -std=c++17 -arch=sm_90 -Iinclude -o read_floor benchmarks/experiments/read_floor.cu && ./read_floor
#include <cuda_runtime.h>

#include <algorithm>
#include <random>

#include "bench_method.cuh"
#include "flashinfer/bulk_copy.cuh"
#include <cstdio>
#include <cstdint>
#include <vector>

template <int kPol>
__device__ __forceinline__ uint4 ld16(const uint4* p, uint64_t pol) {
  uint4 v;
  if constexpr (kPol == 0) {
    asm volatile("ld.global.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  } else if constexpr (kPol == 1) {
    asm volatile("ld.global.L2::cache_hint.v4.u32 {%0,%1,%2,%3}, [%4], %5;"
                 : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w)
                 : "l"(p), "l"(pol));
  } else {
    asm volatile("ld.global.cs.v4.u32 {%0,%1,%2,%3}, [%4];" : "=r"(v.x), "=r"(v.y), "=r"(v.z), "=r"(v.w) : "l"(p));
  }
  return v;
}

// kPol 0: plain, 1: L2::evict_first cache hint (the decode box copies' policy), 2: .cs
template <int kPol>
__global__ void __launch_bounds__(256) reader(const uint4* p, size_t n, unsigned* sink) {
  uint64_t pol = 0;
  if constexpr (kPol == 1) asm volatile("createpolicy.fractional.L2::evict_first.b64 %0, 1.0;" : "=l"(pol));
  unsigned acc = 0;
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 v[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) v[u] = ld16<kPol>(p + i + u * stride, pol);
#pragma unroll
    for (int u = 0; u < 4; ++u) acc ^= v[u].x ^ v[u].y ^ v[u].z ^ v[u].w;
  }
  for (; i < n; i += stride) {
    const uint4 v = ld16<kPol>(p + i, pol);
    acc ^= v.x ^ v.y ^ v.z ^ v.w;
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

// out[i] = a[i] ^ b[i] (kB) or a[i] (copy); 4 vectors per thread in flight.
template <bool kB>
__global__ void __launch_bounds__(256) streamer(const uint4* a, const uint4* b, uint4* o, size_t n) {
  const size_t stride = size_t{gridDim.x} * blockDim.x;
  size_t i = blockIdx.x * size_t{blockDim.x} + threadIdx.x;
  for (; i + 3 * stride < n; i += 4 * stride) {
    uint4 va[4], vb[4];
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      va[u] = a[i + u * stride];
      if (kB) vb[u] = b[i + u * stride];
    }
#pragma unroll
    for (int u = 0; u < 4; ++u) {
      uint4 r = va[u];
      if (kB) r = make_uint4(r.x ^ vb[u].x, r.y ^ vb[u].y, r.z ^ vb[u].z, r.w ^ vb[u].w);
      o[i + u * stride] = r;
    }
  }
  for (; i < n; i += stride) {
    uint4 r = a[i];
    if (kB) r = make_uint4(r.x ^ b[i].x, r.y ^ b[i].y, r.z ^ b[i].z, r.w ^ b[i].w);
    o[i] = r;
  }
}

// Bulk copies (the TMA engine, as the decode kernel's row engine uses them) into a ring of
// kStages 32 KiB stages (one decode tile: 64 keys x 2 x 256 bytes), 128 threads, thread 0
// issuing. Block b reads stages [b * per_block, (b + 1) * per_block) of the whole range, the way
// a split decode gives each CTA a chunk of keys. A stage is 8 pieces of 4 KiB (one page of one
// KV head at page size 16, HND): piece g comes from piece perm[g] of the buffer (random pages),
// or from piece g (perm null: contiguous). The piece ids of a stage are loaded an iteration
// before it is issued, as the decode kernel loads page ids.
constexpr int kStageBytes = 32768, kPiece = 4096, kPieces = kStageBytes / kPiece;
template <int kStages>
__global__ void __launch_bounds__(128) bulk_reader(const char* base, const int* perm, int per_block, unsigned* sink) {
  extern __shared__ __align__(128) char sm[];
  __shared__ uint64_t bars[kStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < kStages; ++s) flashinfer::bulk::mbarrier_init(&bars[s], 1);
    flashinfer::bulk::fence_init();
  }
  __syncthreads();
  const int64_t k0 = int64_t{blockIdx.x} * per_block;
  int next[kPieces];
  auto load_ids = [&](int k) {
    for (int c = 0; c < kPieces; ++c) {
      const int64_t g = (k0 + k) * kPieces + c;
      next[c] = k < per_block ? (perm ? perm[g] : static_cast<int>(g)) : 0;
    }
  };
  auto issue = [&](int k) {
    if (k >= per_block) return;
    const int s = k % kStages;
    flashinfer::bulk::arrive_expect_tx(&bars[s], kStageBytes);
    for (int c = 0; c < kPieces; ++c)
      flashinfer::bulk::copy(sm + s * kStageBytes + c * kPiece, base + int64_t{next[c]} * kPiece, kPiece, &bars[s]);
  };
  if (threadIdx.x == 0) {
    for (int k = 0; k + 1 < kStages; ++k) {
      load_ids(k);
      issue(k);
    }
    load_ids(kStages - 1);
  }
  unsigned acc = 0;
  for (int k = 0; k < per_block; ++k) {
    if (threadIdx.x == 0) {
      issue(k + kStages - 1);
      load_ids(k + kStages);
    }
    const int s = k % kStages;
    flashinfer::bulk::wait_parity(&bars[s], static_cast<uint32_t>((k / kStages) & 1));
    acc ^= reinterpret_cast<const unsigned*>(sm + s * kStageBytes)[threadIdx.x * 64];
    __syncthreads();  // stage s is consumed before it is refilled
  }
  if (acc == 0x9e3779b9u) sink[0] = acc;
}

int main() {
  cudaDeviceProp prop;
  CK(cudaGetDeviceProperties(&prop, 0));
  const int sms = prop.multiProcessorCount;
  std::printf("%s, %d SMs, L2 %d MiB\n", prop.name, sms, prop.l2CacheSize >> 20);
  const size_t max_bytes = size_t{1} << 30;
  char *buf, *buf2, *out, *flush;
  unsigned* sink;
  CK(cudaMalloc(&buf, max_bytes));
  CK(cudaMalloc(&buf2, max_bytes / 2));
  CK(cudaMalloc(&out, max_bytes / 2));
  CK(cudaMalloc(&flush, size_t{256} << 20));
  CK(cudaMalloc(&sink, 64));
  CK(cudaMemset(buf, 1, max_bytes));
  CK(cudaMemset(buf2, 2, max_bytes / 2));
  // random piece order over the whole buffer
  const int total_pieces = static_cast<int>(max_bytes / kPiece);
  std::vector<int> h_perm(total_pieces);
  for (int i = 0; i < total_pieces; ++i) h_perm[i] = i;
  std::shuffle(h_perm.begin(), h_perm.end(), std::mt19937(7));
  int* perm;
  CK(cudaMalloc(&perm, total_pieces * sizeof(int)));
  CK(cudaMemcpy(perm, h_perm.data(), total_pieces * sizeof(int), cudaMemcpyHostToDevice));
  CK(cudaFuncSetAttribute(bulk_reader<2>, cudaFuncAttributeMaxDynamicSharedMemorySize, 2 * kStageBytes));
  CK(cudaFuncSetAttribute(bulk_reader<3>, cudaFuncAttributeMaxDynamicSharedMemorySize, 3 * kStageBytes));
  CK(cudaFuncSetAttribute(bulk_reader<4>, cudaFuncAttributeMaxDynamicSharedMemorySize, 4 * kStageBytes));
  CK(cudaFuncSetAttribute(bulk_reader<6>, cudaFuncAttributeMaxDynamicSharedMemorySize, 6 * kStageBytes));
  for (int mode = 0; mode < 2; ++mode) {
    Timer tm{flush, size_t{256} << 20, mode == 1, sink, sms};
    std::printf("\n== %s flush\n", mode ? "read (diagnostic)" : "memset (the method)");
    std::printf("empty kernel: %.2f us\n", tm.median_us([&] { empty_kernel<<<1, 32>>>(); }));
    // decode goal cases' K+V bytes: 1 x 4096, 1 x 32768, 16 x 4096, 64 x 2048, 128 x 8192 (bf16, 8 x 128)
    const double mb[] = {16.777216, 134.217728, 268.435456, 536.870912, 1073.741824};
    for (double m : mb) {
      const size_t bytes = static_cast<size_t>(m * 1e6);
      const size_t n = bytes / 16;
      for (int blocks_per_sm : {4, 8}) {
        const int grid = sms * blocks_per_sm;
        const float t0 = tm.median_us([&] { reader<0><<<grid, 256>>>(reinterpret_cast<const uint4*>(buf), n, sink); });
        const float t1 = tm.median_us([&] { reader<1><<<grid, 256>>>(reinterpret_cast<const uint4*>(buf), n, sink); });
        const float t2 = tm.median_us([&] { reader<2><<<grid, 256>>>(reinterpret_cast<const uint4*>(buf), n, sink); });
        std::printf("read %8.1f MB, %d blocks/SM: plain %8.2f us (%.2f TB/s)  evict_first %8.2f (%.2f)  .cs %8.2f (%.2f)\n",
                    m, blocks_per_sm, t0, bytes / t0 / 1e6, t1, bytes / t1 / 1e6, t2, bytes / t2 / 1e6);
      }
    }
    for (double m : {16.777216, 134.217728, 536.870912}) {
      const int64_t stages_total = static_cast<int64_t>(m * 1e6) / kStageBytes;
      float t[2][3];
      int64_t bytes[3];
      for (int pr = 0; pr < 2; ++pr) {
        const int* pp = pr ? perm : nullptr;
        int cfg = 0;
        for (int grid_per_sm : {2, 1, 3}) {
          const int grid = sms * grid_per_sm;
          const int per_block = static_cast<int>(stages_total / grid);
          bytes[cfg] = int64_t{per_block} * grid * kStageBytes;
          if (grid_per_sm == 2)
            t[pr][cfg] = tm.median_us([&] { bulk_reader<3><<<grid, 128, 3 * kStageBytes>>>(buf, pp, per_block, sink); });
          else if (grid_per_sm == 1)
            t[pr][cfg] = tm.median_us([&] { bulk_reader<6><<<grid, 128, 6 * kStageBytes>>>(buf, pp, per_block, sink); });
          else
            t[pr][cfg] = tm.median_us([&] { bulk_reader<2><<<grid, 128, 2 * kStageBytes>>>(buf, pp, per_block, sink); });
          ++cfg;
        }
      }
      std::printf("bulk %6.1f MB: 2 CTA x 3 stages contiguous %8.2f us (%.2f TB/s) random 4K %8.2f (%.2f); "
                  "1 x 6 %8.2f (%.2f) / %8.2f (%.2f); 3 x 2 %8.2f (%.2f) / %8.2f (%.2f)\n",
                  m, t[0][0], bytes[0] / t[0][0] / 1e6, t[1][0], bytes[0] / t[1][0] / 1e6, t[0][1], bytes[1] / t[0][1] / 1e6,
                  t[1][1], bytes[1] / t[1][1] / 1e6, t[0][2], bytes[2] / t[0][2] / 1e6, t[1][2], bytes[2] / t[1][2] / 1e6);
    }
    for (double m : {67.108864, 134.217728, 536.870912}) {  // bytes of each input
      const size_t bytes = static_cast<size_t>(m * 1e6), n = bytes / 16;
      const int grid = sms * 8;
      const float tc = tm.median_us([&] {
        streamer<false><<<grid, 256>>>(reinterpret_cast<const uint4*>(buf), nullptr, reinterpret_cast<uint4*>(out), n);
      });
      const float ta = tm.median_us([&] {
        streamer<true><<<grid, 256>>>(reinterpret_cast<const uint4*>(buf), reinterpret_cast<const uint4*>(buf2),
                                     reinterpret_cast<uint4*>(out), n);
      });
      const float tm_ = tm.median_us([&] { cudaMemcpyAsync(out, buf, bytes, cudaMemcpyDeviceToDevice); });
      std::printf("copy %6.1f MB: kernel %8.2f us (%.2f TB/s r+w), cudaMemcpy %8.2f (%.2f); 2:1 add %8.2f (%.2f TB/s)\n", m,
                  tc, 2 * bytes / tc / 1e6, tm_, 2 * bytes / tm_ / 1e6, ta, 3 * bytes / ta / 1e6);
    }
  }
  CK(cudaGetLastError());
  return 0;
}
