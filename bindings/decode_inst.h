// Declarations of the decode launchers instantiated in decode_<dtype>.cu.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "flashinfer/attention/decode.h"

namespace flashinfer {
namespace attention {
template <typename T>
cudaError_t Decode(const DecodeParams<T>& p, bool use_tc, bool launch_merge, int64_t max_grid, cudaStream_t stream);
// CTAs of the decode kernel resident per SM on the current device (for the planner).
template <typename T>
cudaError_t DecodeCtasPerSM(int head_dim, int group_size, bool use_tc, PosEncodingMode pos, int* ctas, int* num_sms,
                            int stages, KVCache kv);
}  // namespace attention
}  // namespace flashinfer
