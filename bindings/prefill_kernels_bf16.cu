// The prefill family's kernels (single, batch, MLA with its split-KV merge) for __nv_bfloat16; one
// unit per type so the two build in parallel.
#include "flashinfer/attention/mla.cuh"

namespace flashinfer {
namespace attention {
template cudaError_t SinglePrefill<__nv_bfloat16>(const PrefillParams<__nv_bfloat16>&, cudaStream_t);
template cudaError_t BatchPrefill<__nv_bfloat16>(const PrefillParams<__nv_bfloat16>&, int, cudaStream_t);
template cudaError_t BatchMla<__nv_bfloat16>(const PrefillParams<__nv_bfloat16>&, int64_t, const MlaMergeOut<__nv_bfloat16>&,
                                   cudaStream_t);
}  // namespace attention
}  // namespace flashinfer
