// DeepSeek MLA: the prefill kernel's PrefillVO::kMla instantiations (prefill.cuh), their launch
// (mla.h's shape) and, with split-KV, the merge of the chunks' partial states (prefill.cuh's
// prefill_merge_params, cascade.cuh's MergeStates).
#pragma once

#include <cuda_runtime.h>

#include "cascade.cuh"
#include "mla.h"
#include "prefill.cuh"

// MLA on wgmma (sm_90a builds, 9.0 devices; prefill.cuh's kWg: S = Q K^T of each group's 32
// keys and P V with P from shared memory as warpgroup products): 1 (default) on, 0 off. H200,
// bf16, 128 heads, 4096 keys, page 16, mma.sync -> wgmma (benchmarks/NOTES.md, session 22): batch
// 1 41.4 -> 32.3 us, 16 108.4 -> 77.7, 64 345.4 -> 218.0, 16 x 17 causal 1679 -> 1043.
#ifndef FLASHINFER_MLA_WGMMA
#define FLASHINFER_MLA_WGMMA 1
#endif

namespace flashinfer {
namespace attention {

// The MLA kernel of (head_dim_qk, head_dim_vo) computing vo_cols V / O columns per warp
// (mla_vo_cols; grid z: head_dim_vo / (2 vo_cols)), null: not built; wg: the wgmma one
// (FLASHINFER_ENABLE_WGMMA builds).
template <typename T>
PrefillKernelPtr<T> mla_kernel(int head_dim_qk, int head_dim_vo, int vo_cols, bool wg = false) {
  constexpr int kD = kMlaHeadDimCkv, kP = kPrefillVoPart;
  constexpr PrefillMode kPaged = PrefillMode::kPaged;
  constexpr PrefillVO kMla = PrefillVO::kMla;
  if (head_dim_vo != kD || (vo_cols != kP && vo_cols != 2 * kP)) return nullptr;
  const bool wide = vo_cols == 2 * kP;
#if defined(FLASHINFER_ENABLE_WGMMA)
  if (wg && head_dim_qk == kD + 64)
    return wide ? PrefillKernel<T, kD + 64, 2 * kP, 1, kPaged, kMla, true>
                : PrefillKernel<T, kD + 64, kP, 1, kPaged, kMla, true>;
  if (wg && head_dim_qk == kD)
    return wide ? PrefillKernel<T, kD, 2 * kP, 1, kPaged, kMla, true> : PrefillKernel<T, kD, kP, 1, kPaged, kMla, true>;
#endif
  if (wg) return nullptr;
  if (head_dim_qk == kD + 64)
    return wide ? PrefillKernel<T, kD + 64, 2 * kP, 1, kPaged, kMla> : PrefillKernel<T, kD + 64, kP, 1, kPaged, kMla>;
  if (head_dim_qk == kD)
    return wide ? PrefillKernel<T, kD, 2 * kP, 1, kPaged, kMla> : PrefillKernel<T, kD, kP, 1, kPaged, kMla>;
  return nullptr;
}

namespace detail {
// One MLA kernel's launch: the wgmma one where usable (wg) and on (FLASHINFER_MLA_WGMMA).
template <typename T, int kDQK, int kDVO>
cudaError_t launch_mla(const PrefillParams<T>& p, bool wg, cudaStream_t stream) {
#if defined(FLASHINFER_ENABLE_WGMMA) && FLASHINFER_MLA_WGMMA
  if (wg) return launch_prefill<T, kDQK, kDVO, 1, PrefillMode::kPaged, PrefillVO::kMla, true>(p, p.num_items, stream);
#endif
  (void)wg;
  return launch_prefill<T, kDQK, kDVO, 1, PrefillMode::kPaged, PrefillVO::kMla>(p, p.num_items, stream);
}
}  // namespace detail

// Launches MLA attention (p.items of mla_plan_items for p.num_chunks, one KV head, the ckv cache
// in p.k and the kpe cache in p.k_rope) on `stream`. With p.num_chunks > 1, p.o / p.lse are the
// partial states' buffers and a second launch merges them into `out` (total_q rows).
template <typename T>
cudaError_t BatchMla(const PrefillParams<T>& p, int64_t total_q, const MlaMergeOut<T>& out, cudaStream_t stream) {
  if (validate_batch(p, true) != Status::kSuccess) return cudaErrorInvalidValue;
  const bool split = p.num_chunks > 1;
  if (split && (!p.lse || !out.o || !out.lse)) return cudaErrorInvalidValue;
  if (p.num_items == 0 || p.num_qo_heads == 0) return cudaSuccess;
  DeviceInfo info;
  FLASHINFER_CUDA_TRY(current_device_info(&info));
  constexpr int kD = kMlaHeadDimCkv, kP = kPrefillVoPart;
  const bool wide = mla_vo_cols(p.num_items, info.num_sms) == 2 * kP, wg = detail::prefill_wgmma_usable(info);
  cudaError_t err;
  if (p.head_dim_qk == kD + 64)
    err = wide ? detail::launch_mla<T, kD + 64, 2 * kP>(p, wg, stream) : detail::launch_mla<T, kD + 64, kP>(p, wg, stream);
  else
    err = wide ? detail::launch_mla<T, kD, 2 * kP>(p, wg, stream) : detail::launch_mla<T, kD, kP>(p, wg, stream);
  if (err != cudaSuccess || !split) return err;
  return MergeStates(prefill_merge_params(p, total_q, out), stream);
}

}  // namespace attention
}  // namespace flashinfer
