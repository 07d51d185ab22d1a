// Declarations of the activation launchers instantiated in activation_<dtype>.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "flashinfer/activation.h"

namespace flashinfer {
namespace activation {
template <typename T>
cudaError_t ActAndMul(const ActParams<T>& p, ActKind kind, cudaStream_t stream);
}  // namespace activation
}  // namespace flashinfer
