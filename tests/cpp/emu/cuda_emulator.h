// Runs CUDA kernels on the CPU, to check kernel logic without a GPU: blocks one at a time, each
// CUDA thread a cooperative fiber (ucontext) that runs to its next barrier (__syncthreads or a
// warp shuffle); a barrier opens when all its participants wait there, and a kernel whose
// threads wait at different barriers (divergent __syncthreads or shuffles) aborts as a
// DEADLOCK. Covers what the sampling and decode kernels use: threadIdx/blockIdx, dynamic shared
// memory (flashinfer::sampling::blk::sampling_smem; the decode test defines
// flashinfer::attention::smem), __shfl_xor_sync, __shfl_up_sync, __syncthreads, __syncwarp
// (a warp barrier), atomicAdd; cp_async_emulated.h adds cp.async. Static __shared__ variables
// are C++ statics: one copy, which is one per block because blocks run one at a time (a block
// must not rely on their initial contents, as on the GPU); FLASHINFER_EXTERN_SHARED (dynamic
// shared memory) is a plain extern array the test defines.
// Include before any flashinfer header; compile with g++ -std=c++17 -I<cuda>/include, link
// cudart_static (the launchers' host calls are compiled, never run).
#pragma once
#include <cuda_runtime.h>
#include <cuda_fp16.h>
#include <cuda_bf16.h>
#include <setjmp.h>
#include <ucontext.h>

#include <array>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <functional>
#include <vector>

#undef __global__
#undef __device__
#undef __host__
#undef __shared__
#undef __forceinline__
#undef __align__
#undef threadIdx
#undef blockIdx
#undef blockDim
#undef gridDim
#undef __syncthreads
#undef __shfl_xor_sync
#undef __shfl_up_sync
#undef __grid_constant__
#undef __launch_bounds__
#define __global__
#define __device__
#define __host__
#define __shared__ static
#define FLASHINFER_EXTERN_SHARED extern
#define __forceinline__ inline
#define __launch_bounds__(...)
#define __grid_constant__
#define __align__(n) __attribute__((aligned(n)))
#define __logf logf

inline uint3 threadIdx, blockIdx;  // set by the scheduler before it resumes a fiber
inline dim3 blockDim, gridDim;

namespace emu {
// Cooperative threads: each CUDA thread is a ucontext; it runs until it reaches a barrier
// (block-wide or its warp's), then yields to the scheduler, which releases a barrier once every
// participant waits there. If no barrier can be released, the kernel deadlocked: report it.
// The ucontext only starts a fiber; switches are _setjmp/_longjmp, which (unlike swapcontext)
// make no system call to save and restore the signal mask: half the run time otherwise.
struct Fiber {
  ucontext_t ctx;
  jmp_buf jb;
  bool started = false;
  int wait = 0;  // 0 running, 1 block barrier, 2 warp barrier, 3 done (the cluster test adds 4)
};
inline std::vector<Fiber> fibers;
// Fiber t's stack, allocated once and reused by every launch (untouched pages cost nothing).
constexpr size_t kStackBytes = 256 * 1024;
inline char* stack_of(size_t t) {
  static std::vector<char*> stacks;
  while (stacks.size() <= t) stacks.push_back(static_cast<char*>(std::malloc(kStackBytes)));
  return stacks[t];
}
inline jmp_buf sched_jb;
inline int current = -1;
inline std::vector<std::array<uint64_t, 32>> shfl;
inline void yield_at(int kind) {  // fiber -> scheduler
  fibers[current].wait = kind;
  if (!_setjmp(fibers[current].jb)) _longjmp(sched_jb, 1);
}
inline void resume(int t) {  // scheduler -> fiber t, until it yields or ends
  current = t;
  if (!_setjmp(sched_jb)) {
    Fiber& f = fibers[size_t(t)];
    if (f.started) _longjmp(f.jb, 1);
    f.started = true;
    setcontext(&f.ctx);
  }
}
}  // namespace emu

inline void __syncthreads() { emu::yield_at(1); }

template <class T>
T emu_shfl(T v, int src_of_lane_fn(int, int), int o) {
  const int w = threadIdx.x / 32, l = threadIdx.x % 32;
  uint64_t b = 0;
  std::memcpy(&b, &v, sizeof(T));
  emu::shfl[w][l] = b;
  emu::yield_at(2);
  const int s = src_of_lane_fn(l, o);
  uint64_t r = s >= 0 ? emu::shfl[w][s] : b;
  emu::yield_at(2);
  T out;
  std::memcpy(&out, &r, sizeof(T));
  return out;
}
inline int emu_xor(int l, int o) { return l ^ o; }
inline int emu_up(int l, int o) { return l >= o ? l - o : -1; }
template <class T>
T __shfl_xor_sync(unsigned, T v, int o) { return emu_shfl(v, emu_xor, o); }
template <class T>
T __shfl_up_sync(unsigned, T v, unsigned o) { return emu_shfl(v, emu_up, static_cast<int>(o)); }

inline void __syncwarp(unsigned = 0xffffffffu) { emu::yield_at(2); }
template <class T>
T __ldcs(const T* p) { return *p; }
template <class T>
T __ldcg(const T* p) { return *p; }
template <class T>
void __stcs(T* p, T v) { *p = v; }
inline void __threadfence() {}
inline float rsqrtf(float x) { return 1.f / std::sqrt(x); }  // (the GPU's is within 2 ulp of this)
inline int atomicAdd(int* p, int v) { const int o = *p; *p += v; return o; }  // (blocks run one at a time)
template <class T>
cudaError_t cudaFuncSetAttribute(T*, cudaFuncAttribute, int) { return cudaSuccess; }

namespace flashinfer {
namespace sampling {
namespace blk {
alignas(16) unsigned char sampling_smem[256 * 1024];
}  // namespace blk
}  // namespace sampling
}  // namespace flashinfer

namespace emu {
// Element conversions for the tests' inputs and references: tf to float, ft<T> from float.
template <typename T>
float tf(T x) { return static_cast<float>(x); }
template <>
inline float tf(__half x) { return __half2float(x); }
template <>
inline float tf(__nv_bfloat16 x) { return __bfloat162float(x); }
template <typename T>
T ft(float x) { return static_cast<T>(x); }
template <>
inline __half ft<__half>(float x) { return __float2half_rn(x); }
template <>
inline __nv_bfloat16 ft<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

inline std::function<void()> fiber_body;
inline void fiber_entry() {
  fiber_body();
  fibers[current].wait = 3;
  _longjmp(sched_jb, 1);  // never resumed
}
// Fresh fibers 0 .. n-1 at fiber_entry.
inline void start_fibers(int n) {
  fibers.assign(size_t(n), Fiber{});
  for (int t = 0; t < n; ++t) {
    Fiber& f = fibers[size_t(t)];
    getcontext(&f.ctx);
    f.ctx.uc_stack.ss_sp = stack_of(size_t(t));
    f.ctx.uc_stack.ss_size = kStackBytes;
    f.ctx.uc_link = nullptr;
    makecontext(&f.ctx, fiber_entry, 0);
  }
}
// Releases fibers parked at other waits than block and warp barriers (barrier_emulated.h sets it:
// mbarrier spinners, named barriers); false when it released none.
inline bool (*extra_release)(int threads) = nullptr;
template <class... KArgs, class... Args>
void launch(void (*kernel)(KArgs...), unsigned grid, unsigned threads, size_t smem, const Args&... args) {
  if (smem > sizeof(flashinfer::sampling::blk::sampling_smem)) { std::printf("smem too big %zu\n", smem); std::abort(); }
  for (unsigned bx = 0; bx < grid; ++bx) {
    std::memset(flashinfer::sampling::blk::sampling_smem, 0xff, smem);  // NaN-ish garbage
    start_fibers(int(threads));
    shfl.assign(threads / 32, {});
    fiber_body = [&] { kernel(args...); };
    blockIdx = uint3{bx, 0, 0};
    blockDim = dim3(threads);
    gridDim = dim3(grid);
    // first run: every fiber to its first barrier
    for (;;) {
      for (unsigned t = 0; t < threads; ++t) {
        if (fibers[t].wait != 0) continue;
        threadIdx = uint3{t, 0, 0};
        resume(int(t));
      }
      // all fibers wait or are done: release what can be released
      int done = 0, block_wait = 0;
      bool released = false;
      for (unsigned t = 0; t < threads; ++t) done += fibers[t].wait == 3, block_wait += fibers[t].wait == 1;
      if (done == int(threads)) break;
      for (unsigned w = 0; w < threads / 32; ++w) {
        bool all = true;
        for (unsigned l = 0; l < 32; ++l) all = all && fibers[w * 32 + l].wait == 2;
        if (all) {
          for (unsigned l = 0; l < 32; ++l) fibers[w * 32 + l].wait = 0;
          released = true;
        }
      }
      if (!released && block_wait == int(threads)) {
        for (auto& f : fibers) f.wait = 0;
        released = true;
      }
      if (!released && extra_release) released = extra_release(int(threads));
      if (!released) {
        std::printf("DEADLOCK in block %u: states", bx);
        for (unsigned t = 0; t < threads; ++t) std::printf(" %d", fibers[t].wait);
        std::printf("\n");
        std::abort();
      }
    }
  }
}
}  // namespace emu
