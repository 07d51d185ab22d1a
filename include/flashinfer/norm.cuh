// RMSNorm, fused add + RMSNorm (plain and Gemma) and LayerNorm kernels and their launcher.
// Parameters, validation and launch arithmetic live in norm.h (paths: see NormPath).
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "bulk_copy.cuh"
#include "cp_async.cuh"
#include "dispatch.h"
#include "math.cuh"
#include "norm.h"
#include "utils.cuh"
#include "vec_dtypes.cuh"

namespace flashinfer {
namespace norm {
namespace detail {

// Loads kN weight (or bias) values as fp32, whatever their storage type.
template <int kN, typename WT>
FLASHINFER_DEVICE void load_weight_f32(const WT* p, float* f) {
  constexpr int kW = 16 / sizeof(WT) < kN ? 16 / sizeof(WT) : kN;
  FLASHINFER_UNROLL
  for (int i = 0; i < kN; i += kW) {
    Vec<WT, kW> w;
    w.load(p + i);
    w.to_float(f + i);
  }
}

// A 16-byte vector of a streamed row: plain, or ld.global.L1::no_allocate.L2::256B (skip L1,
// fetch 256-byte L2 blocks).
template <NormLoad kLoad, typename T, int N>
FLASHINFER_DEVICE void load_row_vec(Vec<T, N>& v, const T* p) {
  static_assert(Vec<T, N>::kIs16B, "row vectors are 16 bytes");
  if constexpr (kLoad == NormLoad::kPlain) {
    v.load128(p);
  } else {
    uint4 u;
    asm volatile("ld.global.L1::no_allocate.L2::256B.v4.u32 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(u.x), "=r"(u.y), "=r"(u.z), "=r"(u.w)
                 : "l"(p));
    v = *reinterpret_cast<const Vec<T, N>*>(&u);
  }
}

// Normalizes one row held in registers. Thread t owns vectors j = i * stride + t (i < kVecs,
// j < nvec): xv[i] from the input and, for kFusedAddRMS, rv[i] from the residual. Every
// thread of the reducing group (a warp, or the block) must call; row_ok = false threads add
// nothing and store nothing.
template <typename T, typename WT, int kVecs, NormKind kKind>
FLASHINFER_DEVICE void normalize_row(const NormParams<T, WT>& p, int64_t row, bool row_ok,
                                     const Vec<T, kVecElems<T>>* xv, const Vec<T, kVecElems<T>>* rv,
                                     int t, int stride, bool warp_reduce, float* red) {
  constexpr int kE = kVecElems<T>;
  constexpr bool kFused = kKind == NormKind::kFusedAddRMS;
  const int64_t nvec = p.hidden / kE;
  const float inv_h = 1.f / static_cast<float>(p.hidden);
  auto owns = [&](int i) { return row_ok && int64_t{i} * stride + t < nvec; };
  // x (or x + residual) in fp32, recomputed from the 16-bit registers where needed.
  auto value = [&](int i, float* f) {
    xv[i].to_float(f);
    if constexpr (kFused) {
      float g[kE];
      rv[i].to_float(g);
      FLASHINFER_UNROLL
      for (int e = 0; e < kE; ++e) f[e] += g[e];
    }
  };
  auto reduce = [&](float v) { return warp_reduce ? warp::reduce_sum(v) : block::reduce_sum(v, red); };

  float acc = 0.f;
  FLASHINFER_UNROLL
  for (int i = 0; i < kVecs; ++i) {
    if (!owns(i)) continue;
    float f[kE];
    value(i, f);
    FLASHINFER_UNROLL
    for (int e = 0; e < kE; ++e) acc += kKind == NormKind::kLayer ? f[e] : f[e] * f[e];
  }
  float mean = 0.f;
  float ms = reduce(acc) * inv_h;
  if constexpr (kKind == NormKind::kLayer) {
    // sum (x - mean)^2 over the registers: exact where E[x^2] - mean^2 would cancel.
    mean = ms;
    acc = 0.f;
    FLASHINFER_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      if (!owns(i)) continue;
      float f[kE];
      value(i, f);
      FLASHINFER_UNROLL
      for (int e = 0; e < kE; ++e) acc += (f[e] - mean) * (f[e] - mean);
    }
    ms = reduce(acc) * inv_h;
  }
  if (!row_ok) return;
  const float rstd = rsqrtf(ms + p.eps);
  T* out = p.out + p.out_rows.offset(row);
  T* res = kFused ? p.residual + p.res_rows.offset(row) : nullptr;
  FLASHINFER_UNROLL
  for (int i = 0; i < kVecs; ++i) {
    if (!owns(i)) continue;
    const int64_t j = int64_t{i} * stride + t;
    float f[kE], w[kE], y[kE];
    value(i, f);
    load_weight_f32<kE>(p.weight + j * kE, w);
    if constexpr (kKind == NormKind::kLayer) {
      float b[kE];
      load_weight_f32<kE>(p.bias + j * kE, b);
      FLASHINFER_UNROLL
      for (int e = 0; e < kE; ++e) y[e] = (f[e] - mean) * rstd * w[e] + b[e];
    } else {
      FLASHINFER_UNROLL
      for (int e = 0; e < kE; ++e) y[e] = f[e] * rstd * (w[e] + p.weight_offset);
    }
    if constexpr (kFused) {
      Vec<T, kE> r;
      r.from_float(f);
      r.store128(res + j * kE);
    }
    Vec<T, kE> o;
    o.from_float(y);
    o.store128(out + j * kE);
  }
}

}  // namespace detail

// kWarpRows: a warp per row, kWarpRowsPerBlock rows per block, the row in registers.
template <typename T, typename WT, int kVecs, NormKind kKind>
__global__ void NormWarpKernel(const NormParams<T, WT> p) {
  constexpr int kE = kVecElems<T>;
  constexpr bool kFused = kKind == NormKind::kFusedAddRMS;
  const int lane = threadIdx.x & 31;
  const int64_t nvec = p.hidden / kE;
  pdl_wait();
  for (int64_t base = int64_t{blockIdx.x} * kWarpRowsPerBlock; base < p.rows;
       base += int64_t{gridDim.x} * kWarpRowsPerBlock) {
    const int64_t row = base + (threadIdx.x >> 5);
    const bool row_ok = row < p.rows;
    Vec<T, kE> xv[kVecs], rv[kFused ? kVecs : 1];
    FLASHINFER_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      const int64_t j = int64_t{i} * 32 + lane;
      if (row_ok && j < nvec) {
        xv[i].load128(p.input + p.in_rows.offset(row) + j * kE);
        if constexpr (kFused) rv[i].load128(p.residual + p.res_rows.offset(row) + j * kE);
      }
    }
    detail::normalize_row<T, WT, kVecs, kKind>(p, row, row_ok, xv, rv, lane, 32, true, nullptr);
  }
  pdl_launch_dependents();
}

// kRows: one block per group of kRows consecutive rows (grid-stride only past kMaxBlocks
// groups). Thread t owns vectors j = i * blockDim.x + t (i < kVecs) of each of the group's
// rows. Every load of the group (rows, residual rows, 16-bit weights) is issued before the
// first use, then one block reduction (one barrier) serves all kRows rows. fused-add writes
// the residual sum before the reduction, the normalized row after it: one pass, no re-read.
template <typename T, typename WT, int kVecs, int kRows, NormKind kKind>
__global__ void __launch_bounds__(rows_max_threads(kVecs * kRows))
    NormRowsKernel(const NormParams<T, WT> p, const NormLoad load) {
  constexpr int kE = kVecElems<T>;
  constexpr bool kFused = kKind == NormKind::kFusedAddRMS;
  constexpr bool kLayer = kKind == NormKind::kLayer;
  // 16-bit weights are loaded with the row; LayerNorm's fp32 weight and bias after the reduction.
  constexpr bool kEarlyW = sizeof(WT) == sizeof(T) && !kLayer;
  __shared__ float red[kLayer ? 2 : 1][kRows][32];
  const int t = threadIdx.x, nt = blockDim.x, lane = t & 31, warp = t >> 5, nwarps = nt >> 5;
  const int64_t nvec = p.hidden / kE;
  const int64_t groups = ceil_div<int64_t>(p.rows, kRows);
  const float inv_h = 1.f / static_cast<float>(p.hidden);
  auto block_sum = [&](float* a, float (*buf)[32]) {
    FLASHINFER_UNROLL
    for (int r = 0; r < kRows; ++r) a[r] = warp::reduce_sum(a[r]);
    if (nwarps > 1) {
      if (lane == 0) {
        FLASHINFER_UNROLL
        for (int r = 0; r < kRows; ++r) buf[r][warp] = a[r];
      }
      __syncthreads();
      FLASHINFER_UNROLL
      for (int r = 0; r < kRows; ++r) a[r] = warp::reduce_sum(lane < nwarps ? buf[r][lane] : 0.f);
    }
  };
  pdl_wait();
  for (int64_t g = blockIdx.x; g < groups; g += gridDim.x) {
    const int64_t row0 = g * kRows;
    auto row_ok = [&](int r) { return row0 + r < p.rows; };
    auto col_ok = [&](int i) { return int64_t{i} * nt + t < nvec; };
    // row starts, once per row (the division in RowLayout::offset only for 3-D views)
    auto row_off = [](const RowLayout& l, int64_t row) { return l.inner == 1 ? row * l.stride_outer : l.offset(row); };
    const T* xrow[kRows];
    T* rrow[kFused ? kRows : 1];
    FLASHINFER_UNROLL
    for (int r = 0; r < kRows; ++r) {
      xrow[r] = p.input + row_off(p.in_rows, row0 + r);
      if constexpr (kFused) rrow[r] = p.residual + row_off(p.res_rows, row0 + r);
    }
    Vec<T, kE> xv[kRows][kVecs];
    Vec<T, kE> rv[kFused ? kRows : 1][kFused ? kVecs : 1];
    Vec<WT, kE> wv[kEarlyW ? kVecs : 1];
    auto load_rows = [&](auto hint) {
      constexpr NormLoad kLoad = decltype(hint)::value;
      FLASHINFER_UNROLL
      for (int r = 0; r < kRows; ++r) {
        if (!row_ok(r)) continue;
        FLASHINFER_UNROLL
        for (int i = 0; i < kVecs; ++i) {
          if (!col_ok(i)) continue;
          const int64_t j = int64_t{i} * nt + t;
          detail::load_row_vec<kLoad>(xv[r][i], xrow[r] + j * kE);
          if constexpr (kFused) detail::load_row_vec<kLoad>(rv[r][i], rrow[r] + j * kE);
        }
      }
    };
    if (load == NormLoad::kNoAllocate) {
      load_rows(std::integral_constant<NormLoad, NormLoad::kNoAllocate>{});
    } else {
      load_rows(std::integral_constant<NormLoad, NormLoad::kPlain>{});
    }
    if constexpr (kEarlyW) {
      FLASHINFER_UNROLL
      for (int i = 0; i < kVecs; ++i)
        if (col_ok(i)) wv[i].load(p.weight + (int64_t{i} * nt + t) * kE);
    }
    // x (or x + residual) in fp32, recomputed from the 16-bit registers where needed
    auto value = [&](int r, int i, float* f) {
      xv[r][i].to_float(f);
      if constexpr (kFused) {
        float g2[kE];
        rv[r][i].to_float(g2);
        FLASHINFER_UNROLL
        for (int e = 0; e < kE; ++e) f[e] += g2[e];
      }
    };
    float acc[kRows];
    FLASHINFER_UNROLL
    for (int r = 0; r < kRows; ++r) {
      acc[r] = 0.f;
      if (!row_ok(r)) continue;
      FLASHINFER_UNROLL
      for (int i = 0; i < kVecs; ++i) {
        if (!col_ok(i)) continue;
        float f[kE];
        value(r, i, f);
        FLASHINFER_UNROLL
        for (int e = 0; e < kE; ++e) acc[r] += kLayer ? f[e] : f[e] * f[e];
        if constexpr (kFused) {  // residual <- x + residual, now: only this thread reads it
          Vec<T, kE> o;
          o.from_float(f);
          o.store128(rrow[r] + (int64_t{i} * nt + t) * kE);
        }
      }
    }
    FLASHINFER_UNROLL
    for (int r = 0; r < kRows; ++r) {
      FLASHINFER_UNROLL
      for (int i = 0; i < kVecs; ++i) {
        opaque(xv[r][i]);
        if constexpr (kFused) opaque(rv[r][i]);
      }
    }
    if constexpr (kEarlyW) {
      FLASHINFER_UNROLL
      for (int i = 0; i < kVecs; ++i) opaque(wv[i]);
    }
    block_sum(acc, red[0]);
    float mean[kRows], rstd[kRows];
    FLASHINFER_UNROLL
    for (int r = 0; r < kRows; ++r) mean[r] = kLayer ? acc[r] * inv_h : 0.f;
    if constexpr (kLayer) {  // sum (x - mean)^2 over the registers
      FLASHINFER_UNROLL
      for (int r = 0; r < kRows; ++r) {
        acc[r] = 0.f;
        if (!row_ok(r)) continue;
        FLASHINFER_UNROLL
        for (int i = 0; i < kVecs; ++i) {
          if (!col_ok(i)) continue;
          float f[kE];
          value(r, i, f);
          FLASHINFER_UNROLL
          for (int e = 0; e < kE; ++e) acc[r] += (f[e] - mean[r]) * (f[e] - mean[r]);
        }
      }
      block_sum(acc, red[1]);
    }
    FLASHINFER_UNROLL
    for (int r = 0; r < kRows; ++r) rstd[r] = rsqrtf(acc[r] * inv_h + p.eps);
    FLASHINFER_UNROLL
    for (int r = 0; r < kRows; ++r) {
      if (!row_ok(r)) continue;
      T* out = p.out + row_off(p.out_rows, row0 + r);
      FLASHINFER_UNROLL
      for (int i = 0; i < kVecs; ++i) {
        if (!col_ok(i)) continue;
        const int64_t j = int64_t{i} * nt + t;
        float f[kE], w[kE], y[kE];
        value(r, i, f);
        if constexpr (kEarlyW) {
          wv[i].to_float(w);
        } else {
          detail::load_weight_f32<kE>(p.weight + j * kE, w);
        }
        if constexpr (kLayer) {
          float b[kE];
          detail::load_weight_f32<kE>(p.bias + j * kE, b);
          FLASHINFER_UNROLL
          for (int e = 0; e < kE; ++e) y[e] = (f[e] - mean[r]) * rstd[r] * w[e] + b[e];
        } else {
          FLASHINFER_UNROLL
          for (int e = 0; e < kE; ++e) y[e] = f[e] * rstd[r] * (w[e] + p.weight_offset);
        }
        Vec<T, kE> o;
        o.from_float(y);
        o.store128(out + j * kE);
      }
    }
    if (g + gridDim.x < groups) __syncthreads();  // red is reused by the next group
  }
  pdl_launch_dependents();
}

constexpr int kMaxNormStages = 8;

// kPipelined: blocks loop over rows blockIdx.x, +gridDim.x, ...; each thread keeps
// `stages - 1` upcoming rows of its own vectors in flight (cp.async into its own shared
// memory slots), so the memory system always has work while the current row reduces.
// Dynamic shared memory: [stages][inputs][kVecs][blockDim.x] 16-byte slots.
template <typename T, typename WT, int kVecs, NormKind kKind>
__global__ void NormPipelinedKernel(const NormParams<T, WT> p, const int stages) {
  constexpr int kE = kVecElems<T>;
  constexpr bool kFused = kKind == NormKind::kFusedAddRMS;
  constexpr int kInputs = kFused ? 2 : 1;
  FLASHINFER_EXTERN_SHARED uint4 slots[];
  __shared__ float red[32];
  const int t = threadIdx.x, nt = blockDim.x;
  const int64_t nvec = p.hidden / kE;
  auto slot = [&](int s, int in, int i) { return slots + ((s * kInputs + in) * kVecs + i) * nt + t; };
#ifdef FLASHINFER_HAS_BULK_COPY
  // sm_90+: thread 0 moves whole rows with the TMA engine; an mbarrier per stage counts the
  // bytes in. The slots of a stage are exactly the row's layout (vector j at slot j).
  __shared__ uint64_t bars[kMaxNormStages];
  const uint32_t row_bytes = static_cast<uint32_t>(nvec * 16);
  if (threadIdx.x == 0) {
    for (int s = 0; s < stages; ++s) bulk::mbarrier_init(&bars[s], 1);
    bulk::fence_init();
  }
  __syncthreads();
  auto issue = [&](int64_t row, int s) {
    if (threadIdx.x == 0 && row < p.rows) {
      bulk::fence_proxy_async();  // the stage's previous reads come before the refill
      bulk::arrive_expect_tx(&bars[s], row_bytes * kInputs);
      bulk::copy(slot(s, 0, 0) - t, p.input + p.in_rows.offset(row), row_bytes, &bars[s]);
      if constexpr (kFused) bulk::copy(slot(s, 1, 0) - t, p.residual + p.res_rows.offset(row), row_bytes, &bars[s]);
    }
  };
  auto landed = [&](int s, int64_t k) { bulk::wait_parity(&bars[s], static_cast<uint32_t>((k / stages) & 1)); };
#else
  auto issue = [&](int64_t row, int s) {
    if (row < p.rows) {
      const T* x = p.input + p.in_rows.offset(row);
      const T* r = kFused ? p.residual + p.res_rows.offset(row) : nullptr;
      FLASHINFER_UNROLL
      for (int i = 0; i < kVecs; ++i) {
        const int64_t j = int64_t{i} * nt + t;
        if (j < nvec) {
          cp_async::copy16(slot(s, 0, i), x + j * kE);
          if constexpr (kFused) cp_async::copy16(slot(s, 1, i), r + j * kE);
        }
      }
    }
    cp_async::commit();  // one group per row, empty past the end, so the counting holds
  };
  auto landed = [&](int, int64_t) { cp_async::wait(stages - 1); };
#endif

  pdl_wait();
  FLASHINFER_UNROLL
  for (int i = 0; i < kVecs; ++i) {  // weights are re-read for every row: bring them to L1
    const int64_t j = int64_t{i} * nt + t;
    if (j < nvec) {
      prefetch_l1(p.weight + j * kE);
      if constexpr (kKind == NormKind::kLayer) prefetch_l1(p.bias + j * kE);
    }
  }
  const int64_t first = blockIdx.x, step = gridDim.x;
  for (int s = 0; s + 1 < stages; ++s) issue(first + s * step, s);
  int s_cur = 0;
  int64_t k = 0;
  for (int64_t row = first; row < p.rows; row += step, ++k) {
    const int s_next = s_cur == 0 ? stages - 1 : s_cur - 1;  // (s_cur + stages - 1) % stages
    issue(row + (stages - 1) * step, s_next);
    landed(s_cur, k);  // this row's data is in its stage
    Vec<T, kE> xv[kVecs], rv[kFused ? kVecs : 1];
    FLASHINFER_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      if (int64_t{i} * nt + t < nvec) {
        xv[i] = *reinterpret_cast<const Vec<T, kE>*>(slot(s_cur, 0, i));
        if constexpr (kFused) rv[i] = *reinterpret_cast<const Vec<T, kE>*>(slot(s_cur, 1, i));
      }
    }
    bulk::fence_proxy_async();  // these reads precede the stage's async refill (after the barriers below)
    detail::normalize_row<T, WT, kVecs, kKind>(p, row, true, xv, rv, t, nt, false, red);
    s_cur = s_cur + 1 == stages ? 0 : s_cur + 1;
  }
#ifndef FLASHINFER_HAS_BULK_COPY
  cp_async::wait(0);
#endif
  pdl_launch_dependents();
}

// kScalar: any hidden size or alignment: one block per row, passes over global memory (the
// re-reads of a row mostly hit L1/L2). For kFusedAddRMS the residual is only overwritten in
// the last pass, after every thread has read its own elements.
template <typename T, typename WT, NormKind kKind>
__global__ void NormScalarKernel(const NormParams<T, WT> p) {
  __shared__ float red[32];
  const float inv_h = 1.f / static_cast<float>(p.hidden);
  pdl_wait();
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* in = p.input + p.in_rows.offset(row);
    T* res = kKind == NormKind::kFusedAddRMS ? p.residual + p.res_rows.offset(row) : nullptr;
    auto value = [&](int64_t j) {
      float v = to_float(in[j]);
      if constexpr (kKind == NormKind::kFusedAddRMS) v += to_float(res[j]);
      return v;
    };
    float acc = 0.f;
    for (int64_t j = threadIdx.x; j < p.hidden; j += blockDim.x) {
      const float v = value(j);
      acc += kKind == NormKind::kLayer ? v : v * v;
    }
    float mean = 0.f;
    float ms = block::reduce_sum(acc, red) * inv_h;
    if constexpr (kKind == NormKind::kLayer) {
      mean = ms;
      acc = 0.f;
      for (int64_t j = threadIdx.x; j < p.hidden; j += blockDim.x) {
        const float d = value(j) - mean;
        acc += d * d;
      }
      ms = block::reduce_sum(acc, red) * inv_h;
    }
    const float rstd = rsqrtf(ms + p.eps);
    T* out = p.out + p.out_rows.offset(row);
    for (int64_t j = threadIdx.x; j < p.hidden; j += blockDim.x) {
      const float v = value(j);
      const float w = to_float(p.weight[j]);
      float y;
      if constexpr (kKind == NormKind::kLayer) {
        y = (v - mean) * rstd * w + to_float(p.bias[j]);
      } else {
        y = v * rstd * (w + p.weight_offset);
      }
      if constexpr (kKind == NormKind::kFusedAddRMS) res[j] = from_float<T>(v);
      out[j] = from_float<T>(y);
    }
  }
  pdl_launch_dependents();
}

// Grids that loop over rows are capped well under gridDim.x's limit.
constexpr int64_t kMaxBlocks = int64_t{1} << 30;

template <NormKind kKind, int kVecs, typename T, typename WT>
cudaError_t NormPipelined(const NormParams<T, WT>& p, const NormShape& l, cudaStream_t stream) {
  constexpr auto kernel = NormPipelinedKernel<T, WT, kVecs, kKind>;
  int device = 0;
  FLASHINFER_CUDA_TRY(current_device(&device));
  DeviceInfo dev;
  FLASHINFER_CUDA_TRY(current_device_info(&dev, device));
  const StreamConfig c =
      stream_config(dev, p.rows, l.threads, kernel_regs<kernel>(), norm_stage_bytes(l, kKind), kMaxNormStages);
  if (c.stages == 0) {  // rows too wide for two stages in shared memory: scalar passes
    const dim3 grid(static_cast<unsigned>(p.rows < kMaxBlocks ? p.rows : kMaxBlocks));
    return launch(NormScalarKernel<T, WT, kKind>, grid, dim3(1024), 0, stream, p.pdl, p);
  }
  FLASHINFER_CUDA_TRY(ensure_dynamic_smem<kernel>(c.smem, device));
  return launch(kernel, dim3(static_cast<unsigned>(c.grid)), dim3(l.threads), c.smem, stream, p.pdl, p,
                c.stages);
}

// (kVecs, kRows) shapes compiled for kRows: all with vecs x rows <= kRowsMaxPerThread for
// RMSNorm / fused-add with 16-bit weights; one row and 1 or 2 vectors otherwise (what
// norm_plan picks for them: see Norm()).
template <NormKind kKind, typename T, typename WT>
constexpr bool kRowsFullSet = kKind != NormKind::kLayer && std::is_same_v<T, WT>;

template <NormKind kKind, typename T, typename WT>
cudaError_t NormRows(const NormParams<T, WT>& p, const NormShape& l, NormLoad load, cudaStream_t stream) {
  const int64_t groups = ceil_div<int64_t>(p.rows, l.rows_per_block);
  const dim3 grid(static_cast<unsigned>(groups < kMaxBlocks ? groups : kMaxBlocks));
  cudaError_t err = cudaErrorInvalidValue;
  with_int<1, 2, 4, 8>(l.vecs_per_thread, [&](auto v) {
    return with_int<1, 2, 4>(l.rows_per_block, [&](auto r) {
      constexpr int kV = decltype(v)::value, kR = decltype(r)::value;
      constexpr bool kCompiled = kRowsFullSet<kKind, T, WT> ? kV * kR <= kRowsMaxPerThread : kR == 1 && kV <= 2;
      if constexpr (kCompiled) {
        err = launch(NormRowsKernel<T, WT, kV, kR, kKind>, grid, dim3(l.threads), 0, stream, p.pdl, p, load);
      }
      return Status::kSuccess;
    });
  });
  return err;
}

template <NormKind kKind, typename T, typename WT>
cudaError_t NormDispatched(const NormParams<T, WT>& p, const NormShape& l, NormLoad load, cudaStream_t stream) {
  if (l.path == NormPath::kRows) return NormRows<kKind>(p, l, load, stream);
  if (l.path == NormPath::kScalar) {
    const dim3 grid(static_cast<unsigned>(p.rows < kMaxBlocks ? p.rows : kMaxBlocks));
    return launch(NormScalarKernel<T, WT, kKind>, grid, dim3(l.threads), 0, stream, p.pdl, p);
  }
  cudaError_t err = cudaErrorInvalidValue;
  if (l.path == NormPath::kWarpRows) {
    const int64_t blocks = ceil_div<int64_t>(p.rows, kWarpRowsPerBlock);
    const dim3 grid(static_cast<unsigned>(blocks < kMaxBlocks ? blocks : kMaxBlocks));
    with_int<1, 2, 4>(l.vecs_per_thread, [&](auto v) {
      err = launch(NormWarpKernel<T, WT, decltype(v)::value, kKind>, grid, dim3(l.threads), 0, stream, p.pdl, p);
      return Status::kSuccess;
    });
    return err;
  }
  with_int<1, 2, 4, 8>(l.vecs_per_thread, [&](auto v) {
    err = NormPipelined<kKind, decltype(v)::value>(p, l, stream);
    return Status::kSuccess;
  });
  return err;
}

// Launches `kind` on `stream` (on the current device). Rows with a stride are read in place
// (see RowLayout).
template <typename T, typename WT>
cudaError_t Norm(const NormParams<T, WT>& p, NormKind kind, cudaStream_t stream) {
  if (validate(p, kind) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  constexpr int kE = kVecElems<T>;
  bool aligned16 = p.in_rows.rows_aligned(p.input, kE, 16) && p.out_rows.rows_aligned(p.out, kE, 16) &&
                   aligned(p.weight);
  if (kind == NormKind::kFusedAddRMS) aligned16 = aligned16 && p.res_rows.rows_aligned(p.residual, kE, 16);
  if (kind == NormKind::kLayer) aligned16 = aligned16 && aligned(p.bias);
  NormTuning tuning = norm_tuning();
  const bool full_set = kind == NormKind::kRMS ? kRowsFullSet<NormKind::kRMS, T, WT>
                        : kind == NormKind::kFusedAddRMS ? kRowsFullSet<NormKind::kFusedAddRMS, T, WT>
                                                         : kRowsFullSet<NormKind::kLayer, T, WT>;
  if (!full_set) {  // only (1 or 2 vectors, 1 row) is compiled: the default vectors, one row
    tuning.vecs_per_thread = 0;
    tuning.rows_per_block = 1;
  }
  const NormShape l = norm_plan(p.rows, p.hidden, kE, aligned16, kind, tuning);
  switch (kind) {
    case NormKind::kRMS: return NormDispatched<NormKind::kRMS>(p, l, tuning.load, stream);
    case NormKind::kFusedAddRMS: return NormDispatched<NormKind::kFusedAddRMS>(p, l, tuning.load, stream);
    case NormKind::kLayer: return NormDispatched<NormKind::kLayer>(p, l, tuning.load, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace norm
}  // namespace flashinfer
