// Declarations of the norm launchers that the generated norm_<dtype>.cu files instantiate;
// the binding never parses a kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "flashinfer/norm.h"

namespace flashinfer {
namespace norm {
template <typename T, typename WT>
cudaError_t Norm(const NormParams<T, WT>& p, NormKind kind, cudaStream_t stream);
template <typename T, typename WT>
cudaError_t NormQuant(const NormQuantParams<T, WT>& p, NormKind kind, cudaStream_t stream);
}  // namespace norm
}  // namespace flashinfer
