// Declarations of the sampling launchers that bindings/sampling_*.cu instantiate; the binding
// never parses a kernel. Sampling is fp32 (inputs are up-cast in Python); top-k renorm and the
// logit mask keep fp16/bf16/fp32; indices and outputs are int32 or int64.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/sampling_params.h"

namespace flashinfer {
namespace sampling {
template <typename IdT>
cudaError_t Sampling(const SamplingParams<IdT>& p, cudaStream_t stream);
template <typename T>
cudaError_t Renorm(const RenormParams<T>& p, cudaStream_t stream);
template <typename IdT>
cudaError_t LogitsSampling(const LogitsSamplingParams<IdT>& p, cudaStream_t stream);
template <typename T>
cudaError_t TopK(const TopKParams<T>& p, cudaStream_t stream);
}  // namespace sampling
}  // namespace flashinfer

// The header's inline (non-template) launchers, compiled once in sampling_logits.cu.
namespace flashinfer_bind {
cudaError_t softmax_launch(const flashinfer::sampling::SoftmaxParams& p, cudaStream_t stream);
cudaError_t chain_speculative_launch(const flashinfer::sampling::ChainSpeculativeParams& p, cudaStream_t stream);
}  // namespace flashinfer_bind
