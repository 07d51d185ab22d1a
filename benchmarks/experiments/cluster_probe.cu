// Session 26 probe: how many thread-block clusters of 8-16 CTAs (128 threads, one decode CTA's
// shared memory) the device co-schedules, and what a cluster launch and its barriers cost under
// the bench's method (GPU sleep, 256 MiB memset flush, events, median).
// nvcc -O3 -arch=sm_90a -o cluster_probe cluster_probe.cu && ./cluster_probe
// H200 (session 26): at one CTA per SM (> 114 KiB of shared memory) 66 clusters of 2, 30 of 4,
// 15 of 8, 7 of 12 or 16 co-reside, so the 128 CTAs of a 1 x 4096 decode in clusters of 16 (one
// per KV head) do not; at two per SM 14 clusters of 16. A cluster barrier costs ~0.35-0.5 us
// over an empty launch of 128 CTAs; mode 2 (16 dependent DSMEM reads) 3.3 us at clusters of 16.
#include <cooperative_groups.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <cstdio>
#include <vector>

namespace cg = cooperative_groups;

__global__ void sleep_kernel(long long ns) {
  long long t0 = clock64();
  while (clock64() - t0 < ns * 2) {
  }
}

// mode 0: nothing; 1: one cluster barrier; 2: write 4 KiB of shared memory, barrier, every CTA
// reads 16 floats x 8 threads from every rank (a decode-merge-sized DSMEM read), barrier.
__global__ void __launch_bounds__(128) probe(int mode, float* out) {
  extern __shared__ float4 sm4[];
  float* sm = reinterpret_cast<float*>(sm4);
  if (mode == 0) return;
  cg::cluster_group cl = cg::this_cluster();
  if (mode == 2)
    for (int i = threadIdx.x; i < 1024; i += 128) sm[i] = float(i + blockIdx.x);
  cl.sync();
  if (mode == 2) {
    const int n = cl.num_blocks();
    float acc = 0.f;
    if (threadIdx.x < 32) {
      for (int r = 0; r < n; ++r) {
        const float4* rp = reinterpret_cast<const float4*>(cl.map_shared_rank(sm, r));
        const float4 v = rp[threadIdx.x];
        acc += v.x + v.y + v.z + v.w;
      }
      out[blockIdx.x * 32 + threadIdx.x] = acc;
    }
    cl.sync();
  }
}

// A launch configuration of `grid` CTAs of 128 threads in clusters of `size` (attr: its storage).
static cudaLaunchConfig_t cluster_config(int grid, int size, int smem, cudaLaunchAttribute* attr) {
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(grid);
  cfg.blockDim = dim3(128);
  cfg.dynamicSmemBytes = smem;
  attr->id = cudaLaunchAttributeClusterDimension;
  attr->val.clusterDim.x = size;
  attr->val.clusterDim.y = 1;
  attr->val.clusterDim.z = 1;
  cfg.attrs = attr;
  cfg.numAttrs = 1;
  return cfg;
}

int main() {
  cudaDeviceProp prop;
  cudaGetDeviceProperties(&prop, 0);
  printf("%s, %d SMs, smem optin %zu\n", prop.name, prop.multiProcessorCount, prop.sharedMemPerBlockOptin);
  cudaFuncSetAttribute(probe, cudaFuncAttributeNonPortableClusterSizeAllowed, 1);
  cudaFuncSetAttribute(probe, cudaFuncAttributeMaxDynamicSharedMemorySize, 200 * 1024);
  const int smems[] = {40 * 1024, 97 * 1024 + 1024, 129 * 1024 + 1024, 161 * 1024 + 1024};
  for (int smem : smems) {
    printf("smem %6d:", smem);
    for (int size : {1, 2, 4, 8, 12, 16}) {
      cudaLaunchAttribute attr;
      cudaLaunchConfig_t cfg = cluster_config(size, size, smem, &attr);
      int clusters = -1;
      cudaError_t e = cudaOccupancyMaxActiveClusters(&clusters, probe, &cfg);
      if (e != cudaSuccess) cudaGetLastError();
      printf("  c%d:%d", size, clusters);
    }
    printf("\n");
  }
  // timing: 128 CTAs (and 132), 129 KiB smem, cluster sizes 1/8/16, modes 0/1/2
  float* out;
  cudaMalloc(&out, 1 << 20);
  void* flush;
  cudaMalloc(&flush, 256 << 20);
  cudaEvent_t a, b;
  cudaEventCreate(&a);
  cudaEventCreate(&b);
  for (int grid : {128, 132}) {
    for (int size : {1, 4, 8, 16}) {
      if (grid % size) continue;
      for (int mode : {0, 1, 2}) {
        if (size == 1 && mode) continue;
        std::vector<float> ts;
        for (int rep = 0; rep < 60; ++rep) {
          sleep_kernel<<<1, 1>>>(20000);
          cudaMemsetAsync(flush, rep & 0xff, 256 << 20);
          cudaLaunchAttribute attr;
          cudaLaunchConfig_t cfg = cluster_config(grid, size, 130 * 1024, &attr);
          cudaEventRecord(a);
          cudaError_t e = cudaLaunchKernelEx(&cfg, probe, mode, out);
          cudaEventRecord(b);
          if (e != cudaSuccess) {
            printf("launch grid %d size %d: %s\n", grid, size, cudaGetErrorString(e));
            cudaGetLastError();
            break;
          }
          cudaEventSynchronize(b);
          float ms;
          cudaEventElapsedTime(&ms, a, b);
          if (rep >= 10) ts.push_back(ms * 1000.f);
        }
        if (ts.empty()) continue;
        std::sort(ts.begin(), ts.end());
        printf("grid %d cluster %2d mode %d: median %.2f us (min %.2f)\n", grid, size, mode, ts[ts.size() / 2], ts[0]);
      }
    }
  }
  cudaError_t e = cudaDeviceSynchronize();
  printf("final: %s\n", cudaGetErrorString(e));
  return 0;
}
