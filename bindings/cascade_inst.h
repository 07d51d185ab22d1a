// Declarations of the cascade (state merge) launchers that the generated cascade_<dtype>.cu
// files instantiate; the binding never parses a kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "flashinfer/attention/cascade.h"

namespace flashinfer {
namespace attention {
template <typename T>
cudaError_t MergeState(const MergeStateParams<T>& p, cudaStream_t stream);
template <typename T>
cudaError_t MergeStates(const MergeStatesParams<T>& p, cudaStream_t stream);
}  // namespace attention
}  // namespace flashinfer
