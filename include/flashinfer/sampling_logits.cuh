// Kernels around the samplers: SoftmaxKernel (temperature softmax, two passes with the row
// cached), LogitsSamplingKernel (Gumbel-max over logits, one pass, one Philox word per
// element) and ChainSpeculativeKernel (draft verification plus one resampled or bonus token).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sampling.cuh"

namespace flashinfer {
namespace sampling {

__global__ void __launch_bounds__(kMaxThreads, 1) SoftmaxKernel(const __grid_constant__ SoftmaxParams p,
                                                               const __grid_constant__ ScanLayout L) {
  using Raw = RowReader<float>::Raw;
  constexpr int kSV = kStepVecs<4>;
  pdl_wait();
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const float t = p.temperature_arr ? p.temperature_arr[row] : p.temperature;
    // logits / T as torch computes it; T == 0: inverse temperature 0; -inf stays -inf.
    auto scaled = [t](float x) { return x == -INFINITY ? x : (t == 0.f ? x * 0.f : x / t); };
    const RowReader<float> rd = row_reader(p.logits + row * p.in_stride, p.vocab, L);
    auto elem = [&](int step, int k) { return ((step * kSV + k) * L.threads + static_cast<int>(threadIdx.x)) * 4; };
    float m = -INFINITY, s = 0.f;  // this thread's running max and sum of exp(y - m)
    for (int step = 0; step < L.steps; ++step) {
      Raw raw[kSV];
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) raw[k] = rd.fetch<true>(elem(step, k));
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        rd.fill(elem(step, k), raw[k]);
        float y[4];
        float vm = -INFINITY;
        const int i = elem(step, k);
        FLASHINFER_UNROLL
        for (int e = 0; e < 4; ++e) {
          y[e] = i + e < p.vocab ? scaled(raw[k].v[e]) : -INFINITY;
          vm = fmaxf(vm, y[e]);
        }
        if (vm > m) {
          s *= expf(m - vm);
          m = vm;
        }
        if (m > -INFINITY) {
          FLASHINFER_UNROLL
          for (int e = 0; e < 4; ++e) s += expf(y[e] - m);
        }
      }
    }
    const float mx = blk::max(m);
    float part[1] = {m > -INFINITY ? s * expf(m - mx) : 0.f};
    blk::sum<1>(part, blk::scratch().f);
    const float denom = part[0];
    float* out = p.out + row * p.out_stride;
    const bool out_aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0;
    for (int step = 0; step < L.steps; ++step) {
      Raw raw[kSV];
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) raw[k] = rd.fetch<false>(elem(step, k));
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        const int i = elem(step, k);
        if (i >= p.vocab) continue;
        Raw o;
        FLASHINFER_UNROLL
        for (int e = 0; e < 4; ++e) o.v[e] = expf(scaled(raw[k].v[e]) - mx) / denom;
        if (out_aligned && i + 4 <= p.vocab) {
          o.store(out + i);
        } else {
          FLASHINFER_UNROLL
          for (int e = 0; e < 4; ++e)
            if (i + e < p.vocab) out[i + e] = o.v[e];
        }
      }
    }
    __syncthreads();
  }
  pdl_launch_dependents();
}

// -log(u) for u uniform in (0, 1) given by 32 random bits, accurate to a few ulp everywhere
// (near u = 1 through log1p of the small complement, never 0 or infinite).
FLASHINFER_DEVICE float exponential(uint32_t x) {
  if (x < 0x80000000u) return -logf((static_cast<float>(x) + 0.5f) * 0x1p-32f);
  return -log1pf(-(static_cast<float>(~x) + 0.5f) * 0x1p-32f);
}

// The larger (score, smaller index on ties) of two candidates.
FLASHINFER_DEVICE void better(float& s, int& i, float s2, int i2) {
  if (s2 > s || (s2 == s && i2 < i)) {
    s = s2;
    i = i2;
  }
}

// argmax_i (logit_i + Gumbel_i): exact categorical sampling from softmax(logits). Element i
// uses word i of the output's Philox stream. NaN and -inf logits never win; a row with none
// finite yields 0.
template <typename IdT>
__global__ void __launch_bounds__(kMaxThreads, 1) LogitsSamplingKernel(const __grid_constant__ LogitsSamplingParams<IdT> p,
                                                                        const __grid_constant__ ScanLayout L) {
  float* best_s = blk::scratch().f;
  int* best_i = blk::scratch().i;
  using Raw = RowReader<float>::Raw;
  constexpr int kSV = kStepVecs<4>;
  pdl_wait();
  for (int64_t b = blockIdx.x; b < p.batch; b += gridDim.x) {
    const int64_t row = p.indices ? static_cast<int64_t>(p.indices[b]) : b;
    float bs = -INFINITY;
    int bi = 0x7fffffff;
    if (row >= 0 && row < p.rows) {
      RowReader<float> rd = row_reader(p.logits + row * p.row_stride, p.vocab, L);
      rd.cache_elems = 0;
      const PhiloxStream stream = p.rng.stream(b);
      for (int step = 0; step < L.steps; ++step) {
        Raw raw[kSV];
        FLASHINFER_UNROLL
        for (int k = 0; k < kSV; ++k)
          raw[k] = rd.fetch<true>(((step * kSV + k) * L.threads + static_cast<int>(threadIdx.x)) * 4);
        FLASHINFER_UNROLL
        for (int k = 0; k < kSV; ++k) {
          const int i = ((step * kSV + k) * L.threads + static_cast<int>(threadIdx.x)) * 4;
          if (i >= p.vocab) continue;
          const Philox4x32 w = stream.block(static_cast<uint32_t>(i) >> 2);
          FLASHINFER_UNROLL
          for (int e = 0; e < 4; ++e) {
            const float x = raw[k].v[e];
            if (!(x > -INFINITY)) continue;  // -inf, NaN, past the end
            better(bs, bi, x - __logf(exponential(w.v[e])), i + e);
          }
        }
      }
    }
    FLASHINFER_UNROLL
    for (int o = 16; o > 0; o >>= 1) {
      const float s2 = __shfl_xor_sync(0xffffffffu, bs, o);
      const int i2 = __shfl_xor_sync(0xffffffffu, bi, o);
      better(bs, bi, s2, i2);
    }
    if (blk::lane() == 0) {
      best_s[blk::warp()] = bs;
      best_i[blk::warp()] = bi;
    }
    __syncthreads();
    if (threadIdx.x == 0) {
      float s = best_s[0];
      int i = best_i[0];
      for (int j = 1; j < blk::warps(); ++j) better(s, i, best_s[j], best_i[j]);
      p.out[b] = static_cast<IdT>(i == 0x7fffffff ? 0 : i);
    }
    __syncthreads();
  }
  pdl_launch_dependents();
}

// A plain inverse-transform draw (word `draw` of the stream) from a row read by `rd`.
template <class Reader>
FLASHINFER_DEVICE int64_t plain_draw(const Reader& rd, const ScanLayout& L, const PhiloxStream& stream, uint32_t draw) {
  auto src = make_source(rd, L);
  const RowStats s = src.first_pass(kKeyZero);
  if (!probs_valid(s)) return -1;
  const SamplingStart st = joint_start(s, RowFilter{});
  auto uniform = [&](int d) { return uniform_co(stream.word(draw + static_cast<uint32_t>(d))); };
  return rejection_sample(src, st.crit, st.state, uniform, 1).index;
}

// Per request: accept draft t while u_t * draft(d_t) < target(d_t) (word t); at the first
// rejection t* resample from relu(target[t*] - draft[t*]) (word n; target[t*] itself when that
// has no mass), else the bonus token from target[n]. accepted counts every passing test.
__global__ void __launch_bounds__(kMaxThreads, 1) ChainSpeculativeKernel(const __grid_constant__ ChainSpeculativeParams p,
                                                                          const __grid_constant__ ScanLayout L) {
  pdl_wait();
  for (int64_t b = blockIdx.x; b < p.batch; b += gridDim.x) {
    const PhiloxStream stream = p.rng.stream(b);
    const int* ids = p.draft_ids + b * p.ids_stride_b;
    const float* draft = p.draft_probs + b * p.draft_stride_b;
    const float* target = p.target_probs + b * p.target_stride_b;
    int t_star = p.n, accepted = 0;
    for (int t = 0; t < p.n; ++t) {
      const int d = ids[t];
      const bool in_range = d >= 0 && d < p.vocab;
      const float q = in_range ? draft[t * p.draft_stride_n + d] : 0.f;
      const float pt = in_range ? target[t * p.target_stride_n + d] : 0.f;
      const bool pass = in_range && uniform_co(stream.word(static_cast<uint32_t>(t))) * q < pt;
      if (pass) {
        ++accepted;
      } else if (t_star == p.n) {
        t_star = t;
      }
    }
    const float* trow = target + t_star * p.target_stride_n;
    int64_t token = -1;
    if (t_star < p.n) {
      DiffReader rd;
      rd.target = trow;
      rd.draft = draft + t_star * p.draft_stride_n;
      rd.n = p.vocab;
      rd.aligned = reinterpret_cast<uintptr_t>(rd.target) % 16 == 0 && reinterpret_cast<uintptr_t>(rd.draft) % 16 == 0;
      token = plain_draw(rd, L, stream, static_cast<uint32_t>(p.n));
    }
    if (token < 0) {
      RowReader<float> rd = row_reader(trow, p.vocab, L);
      rd.cache_elems = 0;
      token = plain_draw(rd, L, stream, static_cast<uint32_t>(p.n));
    }
    if (threadIdx.x == 0) {
      int* out = p.out + b * (p.n + 1);
      for (int t = 0; t <= p.n; ++t) out[t] = t < t_star ? ids[t] : (t == t_star ? static_cast<int>(token < 0 ? 0 : token) : -1);
      p.accepted[b] += accepted;
      p.emitted[b] += t_star;
    }
    __syncthreads();
  }
  pdl_launch_dependents();
}

inline cudaError_t Softmax(const SoftmaxParams& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  DeviceInfo dev;
  FLASHINFER_CUDA_TRY(current_device_info(&dev));
  const ScanLayout L = scan_layout(p.vocab, 4, false, smem_budget(dev));
  FLASHINFER_CUDA_TRY(ensure_dynamic_smem<SoftmaxKernel>(static_cast<size_t>(L.smem_bytes)));
  const int64_t grid = p.rows < 0x7fffffff ? p.rows : 0x7fffffff;
  return launch(SoftmaxKernel, dim3(static_cast<unsigned>(grid)), dim3(L.threads), static_cast<size_t>(L.smem_bytes),
                stream, p.pdl, p, L);
}

template <typename IdT>
cudaError_t LogitsSampling(const LogitsSamplingParams<IdT>& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  const ScanLayout L = scan_layout(p.vocab, 4, false, 0);
  const size_t smem = static_cast<size_t>(kScratchBytes);
  FLASHINFER_CUDA_TRY(ensure_dynamic_smem<LogitsSamplingKernel<IdT>>(smem));
  return launch(LogitsSamplingKernel<IdT>, dim3(static_cast<unsigned>(p.batch)), dim3(L.threads), smem, stream, p.pdl,
                p, L);
}

inline cudaError_t ChainSpeculative(const ChainSpeculativeParams& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  const ScanLayout L = scan_layout(p.vocab, 4, false, 0);
  FLASHINFER_CUDA_TRY(ensure_dynamic_smem<ChainSpeculativeKernel>(static_cast<size_t>(L.smem_bytes)));
  return launch(ChainSpeculativeKernel, dim3(static_cast<unsigned>(p.batch)), dim3(L.threads),
                static_cast<size_t>(L.smem_bytes), stream, p.pdl, p, L);
}

}  // namespace sampling
}  // namespace flashinfer
