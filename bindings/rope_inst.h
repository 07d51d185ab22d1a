// Declarations of the RoPE launchers that the generated rope_<dtype>.cu files instantiate
// (positions int32 and int64); the binding never parses a kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "flashinfer/pos_enc.h"

namespace flashinfer {
namespace rope {
template <typename T, typename IdType>
cudaError_t Rope(const RopeParams<T, IdType>& p, cudaStream_t stream);
}  // namespace rope
}  // namespace flashinfer
