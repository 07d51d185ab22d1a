// The prefill family's kernels (single, batch, MLA with its split-KV merge) for __half; one
// unit per type so the two build in parallel.
#include "flashinfer/attention/mla.cuh"

namespace flashinfer {
namespace attention {
template cudaError_t SinglePrefill<__half>(const PrefillParams<__half>&, cudaStream_t);
template cudaError_t BatchPrefill<__half>(const PrefillParams<__half>&, int, cudaStream_t);
template cudaError_t BatchMla<__half>(const PrefillParams<__half>&, int64_t, const MlaMergeOut<__half>&,
                                   cudaStream_t);
}  // namespace attention
}  // namespace flashinfer
