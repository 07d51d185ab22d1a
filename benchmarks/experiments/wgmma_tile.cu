// Experiment (not built by CMake): one warp group's wgmma tiles against a CPU matmul, to check
// the shared-memory descriptors and layouts a wgmma prefill / MLA kernel would use (benchmarks/
// NOTES.md, session 20, "Next session"). Build and run on an sm_90 machine:
//   nvcc -std=c++17 -O2 -gencode arch=compute_90a,code=sm_90a -o /tmp/wgmma_tile
//     benchmarks/experiments/wgmma_tile.cu && /tmp/wgmma_tile   (one command line)
// Cases: S = A B^T with A [64 x K] and B [N x K] both K-major (K = 64, 128); O = P V with P
// [64 x 64] K-major and V [64 keys x N] stored key-major (MN-major B, transposed by the
// instruction; N = 64, 128). Every tile uses the 128-byte swizzle: 8 rows x 128 bytes per atom,
// 16-byte chunk c of row r at chunk c ^ (r % 8), atoms of one 64-element column block stacked by
// rows (1024 bytes per 8 rows), column blocks rows x 128 bytes apart. Exit 0: all match.
// Session 21 on the H200: every case passes with lbo = the column-block step and sbo = 1024 for
// the MN-major B (P from shared memory or from registers); the swapped order faults.
#include <cuda_bf16.h>
#include <cuda_runtime.h>

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <vector>

// Byte offset of element (r, c) of a [rows x cols] bf16 tile in the 128-byte-swizzled layout.
__host__ __device__ inline int sw128_offset(int r, int c, int rows) {
  const int block = c / 64, cc = (c % 64) * 2;
  return block * rows * 128 + (r / 8) * 1024 + (r % 8) * 128 + (((cc / 16) ^ (r % 8)) * 16) + cc % 16;
}

// Shared-memory matrix descriptor: start address, leading / stride byte offsets (16-byte
// units), 128-byte swizzle (layout type 1 in bits 62-63).
__device__ inline uint64_t smem_desc(const void* p, int lbo, int sbo) {
  const uint32_t a = static_cast<uint32_t>(__cvta_generic_to_shared(p));
  return static_cast<uint64_t>((a & 0x3FFFF) >> 4) | (static_cast<uint64_t>((lbo >> 4) & 0x3FFF) << 16) |
         (static_cast<uint64_t>((sbo >> 4) & 0x3FFF) << 32) | (uint64_t{1} << 62);
}

__device__ inline void wgmma_fence() { asm volatile("wgmma.fence.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_commit() { asm volatile("wgmma.commit_group.sync.aligned;\n" ::: "memory"); }
__device__ inline void wgmma_wait0() { asm volatile("wgmma.wait_group.sync.aligned 0;\n" ::: "memory"); }
__device__ inline void fence_proxy_async() { asm volatile("fence.proxy.async.shared::cta;\n" ::: "memory"); }

template <int kTnspB>
__device__ void wgmma_m64n64k16(float* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %34, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, %32, %33, p, 1, 1, 0, %35;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTnspB));
}
template <int kTnspB>
__device__ void wgmma_m64n128k16(float* d, uint64_t desc_a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %66, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n128k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31, %32, %33, %34, %35, %36, %37, %38, %39, %40, %41, %42, %43, %44, %45, %46, %47, %48, %49, %50, %51, %52, %53, %54, %55, %56, %57, %58, %59, %60, %61, %62, %63}, %64, %65, p, 1, 1, 0, %67;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31]), "+f"(d[32]), "+f"(d[33]), "+f"(d[34]), "+f"(d[35]), "+f"(d[36]), "+f"(d[37]), "+f"(d[38]), "+f"(d[39]), "+f"(d[40]), "+f"(d[41]), "+f"(d[42]), "+f"(d[43]), "+f"(d[44]), "+f"(d[45]), "+f"(d[46]), "+f"(d[47]), "+f"(d[48]), "+f"(d[49]), "+f"(d[50]), "+f"(d[51]), "+f"(d[52]), "+f"(d[53]), "+f"(d[54]), "+f"(d[55]), "+f"(d[56]), "+f"(d[57]), "+f"(d[58]), "+f"(d[59]), "+f"(d[60]), "+f"(d[61]), "+f"(d[62]), "+f"(d[63])
      : "l"(desc_a), "l"(desc_b), "r"(scale_d), "n"(kTnspB));
}

// d [64 x N] f32: warp w owns rows 16 w .. 16 w + 15; per 8-column block j, d[4 j + 0 / 1] is row
// grp, columns 8 j + 2 tig (+1), d[4 j + 2 / 3] row grp + 8.
template <int N>
__device__ void store_acc(const float* d, float* out) {
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
  for (int j = 0; j < N / 8; ++j)
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * w + grp + (e >= 2 ? 8 : 0), c = 8 * j + 2 * tig + (e & 1);
      out[r * N + c] = d[4 * j + e];
    }
}

// S = A B^T: A [64 x K], B [N x K], row-major in global memory.
template <int N, int K>
__global__ void qk_kernel(const __nv_bfloat16* A, const __nv_bfloat16* B, float* S) {
  __shared__ __align__(1024) char sA[64 * K * 2];
  __shared__ __align__(1024) char sB[N * K * 2];
  for (int i = threadIdx.x; i < 64 * K; i += 128)
    *reinterpret_cast<__nv_bfloat16*>(sA + sw128_offset(i / K, i % K, 64)) = A[i];
  for (int i = threadIdx.x; i < N * K; i += 128)
    *reinterpret_cast<__nv_bfloat16*>(sB + sw128_offset(i / K, i % K, N)) = B[i];
  fence_proxy_async();
  __syncthreads();
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  wgmma_fence();
  for (int s = 0; s < K / 16; ++s) {  // k-step s: column block s / 4, 32 bytes per step inside it
    const uint64_t da = smem_desc(sA + (s / 4) * 64 * 128 + (s % 4) * 32, 16, 1024);
    const uint64_t db = smem_desc(sB + (s / 4) * N * 128 + (s % 4) * 32, 16, 1024);
    if constexpr (N == 64) wgmma_m64n64k16<0>(d, da, db, s > 0);
    else wgmma_m64n128k16<0>(d, da, db, s > 0);
  }
  wgmma_commit();
  wgmma_wait0();
  store_acc<N>(d, S);
}

// O = P V: P [64 x 64], V [64 keys x N], row-major in global memory; V is stored key-major (its
// rows are keys: an MN-major B operand, transposed by the instruction).
// lbo / sbo: the descriptor's byte offsets for V (which of the two steps between column blocks
// (64 x 128 bytes) and between 8-key groups (1024 bytes) is which, for an MN-major operand, is
// what the cases below find out: both orders run).
template <int N>
__global__ void pv_kernel(const __nv_bfloat16* P, const __nv_bfloat16* V, float* O, int lbo, int sbo) {
  __shared__ __align__(1024) char sP[64 * 64 * 2];
  __shared__ __align__(1024) char sV[64 * N * 2];
  for (int i = threadIdx.x; i < 64 * 64; i += 128)
    *reinterpret_cast<__nv_bfloat16*>(sP + sw128_offset(i / 64, i % 64, 64)) = P[i];
  for (int i = threadIdx.x; i < 64 * N; i += 128)
    *reinterpret_cast<__nv_bfloat16*>(sV + sw128_offset(i / N, i % N, 64)) = V[i];
  fence_proxy_async();
  __syncthreads();
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  wgmma_fence();
  for (int s = 0; s < 4; ++s) {  // keys 16 s .. 16 s + 15: two 8-row groups of V's atoms
    const uint64_t da = smem_desc(sP + s * 32, 16, 1024);
    const uint64_t db = smem_desc(sV + s * 2 * 1024, lbo, sbo);
    if constexpr (N == 64) wgmma_m64n64k16<1>(d, da, db, s > 0);
    else wgmma_m64n128k16<1>(d, da, db, s > 0);
  }
  wgmma_commit();
  wgmma_wait0();
  store_acc<N>(d, O);
}


// O = P V with P from registers (the RS form, as a prefill kernel feeds P after its softmax):
// warp w's fragment of k-step s is rows 16 w + grp (+8), columns 16 s + 2 tig (+1) (+8), the
// mma.sync m16n8k16 A layout.
template <int N>
__device__ void wgmma_m64nNk16_rs(float* d, const uint32_t* a, uint64_t desc_b, int scale_d);
template <>
__device__ void wgmma_m64nNk16_rs<64>(float* d, const uint32_t* a, uint64_t desc_b, int scale_d) {
  asm volatile(
      "{\n.reg .pred p;\nsetp.ne.b32 p, %37, 0;\n"
      "wgmma.mma_async.sync.aligned.m64n64k16.f32.bf16.bf16 {%0, %1, %2, %3, %4, %5, %6, %7, %8, %9, %10, %11, %12, %13, %14, %15, %16, %17, %18, %19, %20, %21, %22, %23, %24, %25, %26, %27, %28, %29, %30, %31}, {%32, %33, %34, %35}, %36, p, 1, 1, 1;\n}\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3]), "+f"(d[4]), "+f"(d[5]), "+f"(d[6]), "+f"(d[7]), "+f"(d[8]), "+f"(d[9]), "+f"(d[10]), "+f"(d[11]), "+f"(d[12]), "+f"(d[13]), "+f"(d[14]), "+f"(d[15]), "+f"(d[16]), "+f"(d[17]), "+f"(d[18]), "+f"(d[19]), "+f"(d[20]), "+f"(d[21]), "+f"(d[22]), "+f"(d[23]), "+f"(d[24]), "+f"(d[25]), "+f"(d[26]), "+f"(d[27]), "+f"(d[28]), "+f"(d[29]), "+f"(d[30]), "+f"(d[31])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "l"(desc_b), "r"(scale_d));
}

template <int N>
__global__ void pv_rs_kernel(const __nv_bfloat16* P, const __nv_bfloat16* V, float* O, int lbo, int sbo) {
  __shared__ __align__(1024) char sV[64 * N * 2];
  for (int i = threadIdx.x; i < 64 * N; i += 128)
    *reinterpret_cast<__nv_bfloat16*>(sV + sw128_offset(i / N, i % N, 64)) = V[i];
  fence_proxy_async();
  __syncthreads();
  const int w = threadIdx.x / 32, lane = threadIdx.x % 32, grp = lane / 4, tig = lane % 4;
  uint32_t a[4][4];
  for (int s = 0; s < 4; ++s)
    for (int e = 0; e < 4; ++e) {
      const int r = 16 * w + grp + (e & 1) * 8, c = 16 * s + 2 * tig + (e >> 1) * 8;
      __nv_bfloat162 v;
      v.x = P[r * 64 + c];
      v.y = P[r * 64 + c + 1];
      a[s][e] = *reinterpret_cast<uint32_t*>(&v);
    }
  float d[N / 2];
  for (int i = 0; i < N / 2; ++i) d[i] = 0.f;
  wgmma_fence();
  for (int s = 0; s < 4; ++s) wgmma_m64nNk16_rs<N>(d, a[s], smem_desc(sV + s * 2 * 1024, lbo, sbo), s > 0);
  wgmma_commit();
  wgmma_wait0();
  store_acc<N>(d, O);
}

static std::vector<__nv_bfloat16> random_bf16(int n, std::vector<float>* f) {
  std::vector<__nv_bfloat16> v(n);
  f->resize(n);
  for (int i = 0; i < n; ++i) {
    v[i] = __float2bfloat16(static_cast<float>(std::rand()) / RAND_MAX * 2.f - 1.f);
    (*f)[i] = __bfloat162float(v[i]);
  }
  return v;
}

template <typename Launch>
static bool run_case(const char* name, int M, int N, int K, bool b_is_nk, Launch launch) {
  std::vector<float> fa, fb;
  auto a = random_bf16(M * K, &fa);
  auto b = random_bf16(N * K, &fb);  // [N x K] (b_is_nk) or [K x N]
  __nv_bfloat16 *da, *db;
  float* dc;
  cudaMalloc(&da, a.size() * 2);
  cudaMalloc(&db, b.size() * 2);
  cudaMalloc(&dc, M * N * 4);
  cudaMemcpy(da, a.data(), a.size() * 2, cudaMemcpyHostToDevice);
  cudaMemcpy(db, b.data(), b.size() * 2, cudaMemcpyHostToDevice);
  cudaMemset(dc, 0, M * N * 4);
  launch(da, db, dc);
  const cudaError_t err = cudaDeviceSynchronize();
  std::vector<float> c(M * N);
  cudaMemcpy(c.data(), dc, M * N * 4, cudaMemcpyDeviceToHost);
  double worst = 0;
  for (int i = 0; i < M; ++i)
    for (int j = 0; j < N; ++j) {
      double ref = 0;
      for (int k = 0; k < K; ++k) ref += double(fa[i * K + k]) * (b_is_nk ? fb[j * K + k] : fb[k * N + j]);
      worst = std::fmax(worst, std::fabs(ref - c[i * N + j]));
    }
  const bool ok = err == cudaSuccess && worst < 1e-3 * K;
  std::printf("%-28s %s  max|err| %.3g%s%s\n", name, ok ? "PASS" : "FAIL", worst, err ? "  " : "",
              err ? cudaGetErrorString(err) : "");
  cudaFree(da);
  cudaFree(db);
  cudaFree(dc);
  return ok;
}

int main() {
  int dev_count = 0;
  if (cudaGetDeviceCount(&dev_count) != cudaSuccess || dev_count == 0) {
    std::printf("no CUDA device\n");
    return 77;
  }
  bool ok = true;
  ok &= run_case("S = A B^T, N 64, K 64", 64, 64, 64, true,
                 [](auto a, auto b, auto c) { qk_kernel<64, 64><<<1, 128>>>(a, b, c); });
  ok &= run_case("S = A B^T, N 64, K 128", 64, 64, 128, true,
                 [](auto a, auto b, auto c) { qk_kernel<64, 128><<<1, 128>>>(a, b, c); });
  ok &= run_case("S = A B^T, N 128, K 64", 64, 128, 64, true,
                 [](auto a, auto b, auto c) { qk_kernel<128, 64><<<1, 128>>>(a, b, c); });
  // P V: expected to pass with lbo = the column-block step, sbo = the 8-key step; the swapped
  // order is printed for information (at N 64 the column-block step is never taken).
  bool pv = false;
  for (int swap = 0; swap < 2; ++swap) {
    const int lbo = swap ? 1024 : 64 * 128, sbo = swap ? 64 * 128 : 1024;
    char name[64];
    std::snprintf(name, sizeof(name), "O = P V, N 64, lbo %d sbo %d", lbo, sbo);
    const bool a = run_case(name, 64, 64, 64, false,
                            [=](auto p, auto v, auto o) { pv_kernel<64><<<1, 128>>>(p, v, o, lbo, sbo); });
    std::snprintf(name, sizeof(name), "O = P V, N 128, lbo %d sbo %d", lbo, sbo);
    const bool b = run_case(name, 64, 128, 64, false,
                            [=](auto p, auto v, auto o) { pv_kernel<128><<<1, 128>>>(p, v, o, lbo, sbo); });
    pv = pv || (a && b);
    std::snprintf(name, sizeof(name), "O = P(regs) V, N 64, lbo %d sbo %d", lbo, sbo);
    run_case(name, 64, 64, 64, false,
             [=](auto p, auto v, auto o) { pv_rs_kernel<64><<<1, 128>>>(p, v, o, lbo, sbo); });
  }
  return ok && pv ? 0 : 1;
}
