// Sorting-free sampling kernels and launchers: SamplingKernel (plain, top-k, top-p, min-p,
// joint top-k/top-p and top-k-first, one block per output) and RenormKernel (top-k / top-p
// renormalization and the top-k logit mask, one block per row). The loops and their logic
// live in sampling.h; the block-wide source in sampling_source.cuh; the layout in
// sampling_params.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "math.cuh"
#include "philox.h"
#include "sampling.h"
#include "sampling_block.cuh"
#include "sampling_params.h"
#include "sampling_source.cuh"
#include "utils.cuh"
#include "vec_dtypes.cuh"

namespace flashinfer {
namespace sampling {

template <typename T>
FLASHINFER_DEVICE RowReader<T> row_reader(const T* row, int vocab, const ScanLayout& L) {
  RowReader<T> rd;
  rd.row = row;
  rd.n = vocab;
  rd.cache_elems = L.cache_elems;
  rd.aligned = reinterpret_cast<uintptr_t>(row) % 16 == 0;
  return rd;
}

// One draw per output: pass 0 (mass, max, validity), then, for top-k-first with an active k,
// the exact top-k threshold, then the rejection loop of sampling.h. A row with NaN or without
// positive finite mass, or an out-of-range index, yields 0 and valid = false.
template <typename IdT>
__global__ void __launch_bounds__(kMaxThreads, 1) SamplingKernel(const __grid_constant__ SamplingParams<IdT> p,
                                                                const __grid_constant__ ScanLayout L) {
  pdl_wait();
  for (int64_t b = blockIdx.x; b < p.batch; b += gridDim.x) {
    const int64_t row = p.indices ? static_cast<int64_t>(p.indices[b]) : b;
    SampleResult r;
    int passes = 0;
    bool ok = row >= 0 && row < p.rows;
    if (ok) {
      auto src = make_source(row_reader(p.probs + row * p.row_stride, p.vocab, L), L);
      const RowStats s = src.first_pass(kKeyZero);
      ok = probs_valid(s);
      if (ok) {
        RowFilter f;
        if (p.use_top_k) f.top_k = p.top_k_arr ? p.top_k_arr[row] : p.top_k;
        if (p.use_top_p) f.top_p = p.top_p_arr ? p.top_p_arr[row] : p.top_p;
        if (p.use_min_p) f.min_p = p.min_p_arr ? p.min_p_arr[row] : p.min_p;
        SamplingStart st;
        if (p.top_k_first && top_k_active(f.top_k, s.count)) {
          Criterion ck;
          ck.top_k = f.top_k;
          ck.max_key = order_key(s.max);
          const Bracket bk = select_threshold(src, ck, full_bracket(s), true);
          st = top_k_first_start(ck.max_key, f.top_p, bk);
          if (!src.list_has_all()) src.unlist();
        } else {
          st = joint_start(s, f);  // (top-k-first without an active k: top-p of the row)
        }
        // The stream is rebuilt per draw (a few loads) rather than held in registers.
        auto uniform = [&](int d) { return uniform_co(p.rng.stream(b).word(static_cast<uint32_t>(d))); };
        r = rejection_sample(src, st.crit, st.state, uniform, st.crit.filters() ? kMaxDraws : 1);
        passes = src.passes;
        ok = r.index >= 0;
      }
    }
    if (threadIdx.x == 0) {
      p.out[b] = static_cast<IdT>(ok ? r.index : 0);
      if (p.valid) p.valid[b] = ok;
      if (p.stats) {
        p.stats[2 * b] = r.draws;
        p.stats[2 * b + 1] = passes;
      }
    }
    __syncthreads();  // the next row refills the shared-memory cache
  }
  pdl_launch_dependents();
}

// Finds the kept set {key > lo} (exact threshold search) and writes the row once.
template <typename T>
__global__ void __launch_bounds__(kMaxThreads, 1) RenormKernel(const __grid_constant__ RenormParams<T> p,
                                                              const __grid_constant__ ScanLayout L) {
  constexpr int kVec = RowReader<T>::kVec;
  constexpr int kSV = kStepVecs<kVec>;
  using Raw = typename RowReader<T>::Raw;
  const bool mask = p.kind == RenormKind::kTopKMask;
  pdl_wait();
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const RowReader<T> rd = row_reader(p.in + row * p.in_stride, p.vocab, L);
    auto src = make_source(rd, L);
    const RowStats s = src.first_pass(mask ? kKeyNegInf : kKeyZero);
    Criterion c;
    c.max_key = order_key(s.max);
    if (p.kind == RenormKind::kTopPRenorm) {
      const float top_p = p.top_p_arr ? p.top_p_arr[row] : p.top_p;
      if (top_p_active(top_p) && s.count > 0) {
        c.use_top_p = true;
        c.top_p_mass = top_p * s.total;
      }
    } else {
      const int k = p.top_k_arr ? p.top_k_arr[row] : p.top_k;
      if (top_k_active(k, s.count)) c.top_k = k;
    }
    const bool keep_all = !c.filters();
    uint32_t lo = mask ? kKeyNegInf : kKeyZero;
    float div = s.total;
    if (!keep_all) {
      const Bracket bk = select_threshold(src, c, full_bracket(s), false);
      lo = bk.lo;
      div = bk.sum_lo;
    }
    T* out = p.out + row * p.out_stride;
    const bool out_aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0;
    for (int step = 0; step < L.steps; ++step) {
      Raw raw[kSV];
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) raw[k] = rd.template fetch<false>(src.elem(step, k));
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        const int i = src.elem(step, k);
        if (i >= p.vocab) continue;
        Raw o = raw[k];
        if (!(mask && keep_all)) {  // the mask keeps values bit for bit
          float f[kVec];
          raw[k].to_float(f);
          FLASHINFER_UNROLL
          for (int e = 0; e < kVec; ++e) {
            const bool keep = order_key(f[e]) > lo;
            if (mask) {
              if (!keep) o.v[e] = from_float<T>(-INFINITY);
            } else {
              o.v[e] = from_float<T>(keep ? f[e] / div : 0.f);
            }
          }
        }
        if (out_aligned && i + kVec <= p.vocab) {
          o.store(out + i);
        } else {
          FLASHINFER_UNROLL
          for (int e = 0; e < kVec; ++e)
            if (i + e < p.vocab) out[i + e] = o.v[e];
        }
      }
    }
    __syncthreads();
  }
  pdl_launch_dependents();
}

inline int64_t smem_budget(const DeviceInfo& dev) { return int64_t{dev.smem_optin} - kStaticSmemReserve; }

template <typename IdT>
cudaError_t Sampling(const SamplingParams<IdT>& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  DeviceInfo dev;
  FLASHINFER_CUDA_TRY(current_device_info(&dev));
  const ScanLayout L = scan_layout(p.vocab, 4, p.top_k_first, smem_budget(dev));
  FLASHINFER_CUDA_TRY(ensure_dynamic_smem<SamplingKernel<IdT>>(static_cast<size_t>(L.smem_bytes)));
  return launch(SamplingKernel<IdT>, dim3(static_cast<unsigned>(p.batch)), dim3(L.threads),
                static_cast<size_t>(L.smem_bytes), stream, p.pdl, p, L);
}

template <typename T>
cudaError_t Renorm(const RenormParams<T>& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  DeviceInfo dev;
  FLASHINFER_CUDA_TRY(current_device_info(&dev));
  const ScanLayout L = scan_layout(p.vocab, static_cast<int>(sizeof(T)), true, smem_budget(dev));
  FLASHINFER_CUDA_TRY(ensure_dynamic_smem<RenormKernel<T>>(static_cast<size_t>(L.smem_bytes)));
  const int64_t grid = p.rows < 0x7fffffff ? p.rows : 0x7fffffff;
  return launch(RenormKernel<T>, dim3(static_cast<unsigned>(grid)), dim3(L.threads), static_cast<size_t>(L.smem_bytes),
                stream, p.pdl, p, L);
}

}  // namespace sampling
}  // namespace flashinfer
