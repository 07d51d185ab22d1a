// Gated activation kernels (SiLU, GELU, GELU-tanh times the up projection) and launcher.
#pragma once

#include <cuda_runtime.h>

#include "activation.h"
#include "bulk_copy.cuh"
#include "cp_async.cuh"
#include "dispatch.h"
#include "math.cuh"
#include "occupancy.h"
#include "utils.cuh"
#include "vec_dtypes.cuh"

namespace flashinfer {
namespace activation {

template <ActKind kKind>
FLASHINFER_DEVICE float act(float x) {
  if constexpr (kKind == ActKind::kSilu) {
    // fast divide (2 ulp, far below the 16-bit output's rounding); x -> -inf gives -0
    return __fdividef(x, 1.f + __expf(-x));
  } else if constexpr (kKind == ActKind::kGelu) {
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
  } else {
    const float kAlpha = 0.79788456080286536f;  // sqrt(2 / pi)
    return 0.5f * x * (1.f + tanhf(kAlpha * (x + 0.044715f * x * x * x)));
  }
}

template <typename T, ActKind kKind, int kVec>
FLASHINFER_DEVICE void act_and_mul_store(const Vec<T, kVec>& a, const Vec<T, kVec>& b, T* out) {
  float fa[kVec], fb[kVec];
  a.to_float(fa);
  b.to_float(fb);
  FLASHINFER_UNROLL
  for (int e = 0; e < kVec; ++e) fa[e] = act<kKind>(fa[e]) * fb[e];
  Vec<T, kVec> o;
  o.from_float(fa);
  o.store128(out);
}

constexpr int kMaxActStages = 8;

// Vectorised rows: blocks loop over tiles (row, chunk) with stride gridDim.x; each thread
// streams its kActUnroll vectors of both halves of upcoming tiles into its own shared-memory
// slots, `stages - 1` tiles ahead. Dynamic shared memory: [stages][2][kActUnroll][blockDim.x].
template <typename T, ActKind kKind>
__global__ void ActAndMulPipelinedKernel(const ActParams<T> p, const int64_t chunks_per_row, const int stages) {
  constexpr int kVec = 16 / sizeof(T);
  FLASHINFER_EXTERN_SHARED uint4 slots[];
  const int t = threadIdx.x, nt = blockDim.x;
  const int64_t nvec = p.hidden / kVec;
  const int64_t tiles = p.rows * chunks_per_row;
  auto slot = [&](int s, int half, int u) { return slots + ((s * 2 + half) * kActUnroll + u) * nt + t; };
  auto col = [&](int64_t tile, int u) { return (tile % chunks_per_row) * nt * kActUnroll + int64_t{u} * nt + t; };
#ifdef FLASHINFER_HAS_BULK_COPY
  // sm_90+: thread 0 moves both halves of a tile with the TMA engine (one mbarrier per stage).
  __shared__ uint64_t bars[kMaxActStages];
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) bulk::mbarrier_init(&bars[s], 1);
    bulk::fence_init();
  }
  __syncthreads();
  auto issue = [&](int64_t tile, int s) {
    if (threadIdx.x == 0 && tile < tiles) {
      const int64_t j0 = col(tile, 0) - t;  // first vector of the tile
      const int64_t n = min(int64_t{nt} * kActUnroll, nvec - j0);
      const uint32_t bytes = static_cast<uint32_t>(n * 16);
      const T* x1 = p.input + p.in_rows.offset(tile / chunks_per_row) + j0 * kVec;
      bulk::fence_proxy_async();
      bulk::arrive_expect_tx(&bars[s], 2 * bytes);
      bulk::copy(slot(s, 0, 0) - t, x1, bytes, &bars[s]);
      bulk::copy(slot(s, 1, 0) - t, x1 + p.hidden, bytes, &bars[s]);
    }
  };
  auto landed = [&](int s, int64_t k) { bulk::wait_parity(&bars[s], static_cast<uint32_t>((k / stages) & 1)); };
#else
  auto issue = [&](int64_t tile, int s) {
    if (tile < tiles) {
      const T* x1 = p.input + p.in_rows.offset(tile / chunks_per_row);
      FLASHINFER_UNROLL
      for (int u = 0; u < kActUnroll; ++u) {
        const int64_t j = col(tile, u);
        if (j < nvec) {
          cp_async::copy16(slot(s, 0, u), x1 + j * kVec);
          cp_async::copy16(slot(s, 1, u), x1 + p.hidden + j * kVec);
        }
      }
    }
    cp_async::commit();
  };
  auto landed = [&](int, int64_t) { cp_async::wait(stages - 1); };
#endif
  pdl_wait();
  const int64_t first = blockIdx.x, step = gridDim.x;
  for (int s = 0; s + 1 < stages; ++s) issue(first + s * step, s);
  int s_cur = 0;
  int64_t k = 0;
  for (int64_t tile = first; tile < tiles; tile += step, ++k) {
    issue(tile + (stages - 1) * step, s_cur == 0 ? stages - 1 : s_cur - 1);
    landed(s_cur, k);
    T* out = p.out + p.out_rows.offset(tile / chunks_per_row);
    FLASHINFER_UNROLL
    for (int u = 0; u < kActUnroll; ++u) {
      const int64_t j = col(tile, u);
      if (j < nvec) {
        act_and_mul_store<T, kKind, kVec>(load16<T>(slot(s_cur, 0, u)), load16<T>(slot(s_cur, 1, u)), out + j * kVec);
      }
    }
    // every thread is done with this stage before thread 0 refills it
    bulk::fence_proxy_async();
    __syncthreads();
    s_cur = s_cur + 1 == stages ? 0 : s_cur + 1;
  }
#ifndef FLASHINFER_HAS_BULK_COPY
  cp_async::wait(0);
#endif
  pdl_launch_dependents();
}

// flat (vectorised rows): grid = (row blocks, column chunks); thread t of chunk c owns
// vectors j = (c * blockDim.x * kU) + u * blockDim.x + t (u < kU) of both halves; all 2 * kU
// loads are issued before the first activation.
// Blocks of <= 256 threads with this many resident per SM: registers <= 32 / 40 / 64 / 128 for
// kU = 1 / 2 / 4 / 8, so that occupancy, not the fp32 copies of the loads, bounds bytes in flight.
constexpr int act_flat_min_blocks(int unroll) { return unroll <= 1 ? 8 : unroll == 2 ? 6 : unroll == 4 ? 4 : 2; }

template <typename T, ActKind kKind, int kU>
__global__ void __launch_bounds__(kActFlatMaxThreads, act_flat_min_blocks(kU))
    ActAndMulFlatKernel(const ActParams<T> p) {
  constexpr int kVec = 16 / sizeof(T);
  const int t = threadIdx.x, nt = blockDim.x;
  const int64_t nvec = p.hidden / kVec;
  const int64_t j0 = int64_t{blockIdx.y} * nt * kU + t;
  pdl_wait();
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x1 = p.input + p.in_rows.offset(row);
    T* out = p.out + p.out_rows.offset(row);
    Vec<T, kVec> a[kU], b[kU];
    FLASHINFER_UNROLL
    for (int u = 0; u < kU; ++u) {
      const int64_t j = j0 + int64_t{u} * nt;
      if (j < nvec) {
        a[u].load128(x1 + j * kVec);
        b[u].load128(x1 + p.hidden + j * kVec);
      }
    }
    FLASHINFER_UNROLL
    for (int u = 0; u < kU; ++u) {
      const int64_t j = j0 + int64_t{u} * nt;
      // convert vector u only after vector u - 1 is stored: fp32 copies of one pair live at a time
      opaque(a[u]);
      opaque(b[u]);
      if (j < nvec) act_and_mul_store<T, kKind, kVec>(a[u], b[u], out + j * kVec);
    }
  }
  pdl_launch_dependents();
}

// Any alignment: grid = (rows, column blocks), kActUnroll elements per thread.
template <typename T, ActKind kKind>
__global__ void ActAndMulScalarKernel(const ActParams<T> p) {
  const int64_t col0 = int64_t{blockIdx.y} * blockDim.x * kActUnroll + threadIdx.x;
  pdl_wait();
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x1 = p.input + p.in_rows.offset(row);
    T* out = p.out + p.out_rows.offset(row);
    FLASHINFER_UNROLL
    for (int u = 0; u < kActUnroll; ++u) {
      const int64_t j = col0 + int64_t{u} * blockDim.x;
      if (j < p.hidden) {
        out[j] = from_float<T>(act<kKind>(to_float(x1[j])) * to_float(x1[p.hidden + j]));
      }
    }
  }
  pdl_launch_dependents();
}

template <ActKind kKind, typename T>
cudaError_t ActAndMulDispatched(const ActParams<T>& p, const ActShape& l, cudaStream_t stream) {
  constexpr int64_t kMaxRowBlocks = int64_t{1} << 30;
  const ActTuning tuning = act_tuning();
  if (l.vec_elems > 1 && tuning.variant != ActVariant::kPipe) {
    const ActFlatShape f = act_flat_shape(p.hidden / l.vec_elems, tuning.unroll ? tuning.unroll : kActFlatDefaultUnroll);
    const dim3 grid(static_cast<unsigned>(p.rows < kMaxRowBlocks ? p.rows : kMaxRowBlocks),
                    static_cast<unsigned>(f.chunks_per_row));
    cudaError_t err = cudaErrorInvalidValue;
    with_int<1, 2, 4, 8>(f.unroll, [&](auto u) {
      err = launch(ActAndMulFlatKernel<T, kKind, decltype(u)::value>, grid, dim3(f.threads), 0, stream, p.pdl, p);
      return Status::kSuccess;
    });
    return err;
  }
  if (l.vec_elems > 1) {
    constexpr auto kernel = ActAndMulPipelinedKernel<T, kKind>;
    int device = 0;
    FLASHINFER_CUDA_TRY(current_device(&device));
    DeviceInfo dev;
    FLASHINFER_CUDA_TRY(current_device_info(&dev, device));
    const StreamConfig c =
        stream_config(dev, p.rows * l.chunks_per_row, l.threads, kernel_regs<kernel>(), act_stage_bytes(l), kMaxActStages);
    if (c.stages > 0) {
      FLASHINFER_CUDA_TRY(ensure_dynamic_smem<kernel>(c.smem, device));
      return launch(kernel, dim3(static_cast<unsigned>(c.grid)), dim3(l.threads), c.smem, stream, p.pdl, p,
                    l.chunks_per_row, c.stages);
    }
  }
  const int64_t col_blocks = ceil_div<int64_t>(p.hidden, int64_t{l.threads} * kActUnroll);
  const dim3 grid(static_cast<unsigned>(p.rows < kMaxRowBlocks ? p.rows : kMaxRowBlocks),
                  static_cast<unsigned>(col_blocks));
  return launch(ActAndMulScalarKernel<T, kKind>, grid, dim3(l.threads), 0, stream, p.pdl, p);
}

template <typename T>
cudaError_t ActAndMul(const ActParams<T>& p, ActKind kind, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  constexpr int kE = 16 / sizeof(T);
  const bool aligned16 = p.in_rows.rows_aligned(p.input, kE, 16) && p.out_rows.rows_aligned(p.out, kE, 16);
  const ActShape l = act_shape(p.hidden, kE, aligned16);
  switch (kind) {
    case ActKind::kSilu: return ActAndMulDispatched<ActKind::kSilu>(p, l, stream);
    case ActKind::kGelu: return ActAndMulDispatched<ActKind::kGelu>(p, l, stream);
    case ActKind::kGeluTanh: return ActAndMulDispatched<ActKind::kGeluTanh>(p, l, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace activation
}  // namespace flashinfer
