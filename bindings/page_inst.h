// Declarations of the page launchers that bindings/page_kernels.cu instantiates; the binding
// never parses a kernel.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "flashinfer/page.h"

namespace flashinfer {
namespace paged_kv {
template <typename T, typename IdType>
cudaError_t AppendPagedKV(const AppendPagedKVParams<T, IdType>& p, cudaStream_t stream);
template <typename IdType, typename SeqT>
cudaError_t BatchIndicesPositions(const BatchIndicesPositionsParams<IdType, SeqT>& p, cudaStream_t stream);
}  // namespace paged_kv
}  // namespace flashinfer
