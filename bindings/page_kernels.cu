// The page family's kernels. Not per compute dtype: the append is a copy, instantiated per
// element size (uint16_t: fp16/bf16, uint8_t: fp8), and the index kernel per index dtype.
#include "flashinfer/page.cuh"

namespace flashinfer {
namespace paged_kv {
template cudaError_t AppendPagedKV<uint16_t, int32_t>(const AppendPagedKVParams<uint16_t, int32_t>&, cudaStream_t);
template cudaError_t AppendPagedKV<uint8_t, int32_t>(const AppendPagedKVParams<uint8_t, int32_t>&, cudaStream_t);
template cudaError_t BatchIndicesPositions<int32_t, int32_t>(const BatchIndicesPositionsParams<int32_t, int32_t>&,
                                                             cudaStream_t);
template cudaError_t BatchIndicesPositions<int32_t, int64_t>(const BatchIndicesPositionsParams<int32_t, int64_t>&,
                                                             cudaStream_t);
template cudaError_t BatchIndicesPositions<int64_t, int32_t>(const BatchIndicesPositionsParams<int64_t, int32_t>&,
                                                             cudaStream_t);
template cudaError_t BatchIndicesPositions<int64_t, int64_t>(const BatchIndicesPositionsParams<int64_t, int64_t>&,
                                                             cudaStream_t);
}  // namespace paged_kv
}  // namespace flashinfer
