// Declarations of the prefill launchers that bindings/prefill_inst.cu.in instantiates; the
// binding never parses a kernel.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include "flashinfer/attention/mla.h"
#include "flashinfer/attention/prefill.h"

namespace flashinfer {
namespace attention {
template <typename T>
cudaError_t SinglePrefill(const PrefillParams<T>& p, cudaStream_t stream);
template <typename T>
cudaError_t BatchPrefill(const PrefillParams<T>& p, int m_tiles, cudaStream_t stream, int64_t total_q,
                         const PrefillMergeOut<T>& out);
template <typename T>
cudaError_t BatchMla(const PrefillParams<T>& p, int64_t total_q, const MlaMergeOut<T>& out, cudaStream_t stream);
}  // namespace attention
}  // namespace flashinfer
