// The prefill family's kernels, for fp16 and bf16.
#include "flashinfer/attention/prefill.cuh"

namespace flashinfer {
namespace attention {
template cudaError_t SinglePrefill<__half>(const PrefillParams<__half>&, cudaStream_t);
template cudaError_t SinglePrefill<__nv_bfloat16>(const PrefillParams<__nv_bfloat16>&, cudaStream_t);
template cudaError_t BatchPrefill<__half>(const PrefillParams<__half>&, int, cudaStream_t);
template cudaError_t BatchPrefill<__nv_bfloat16>(const PrefillParams<__nv_bfloat16>&, int, cudaStream_t);
}  // namespace attention
}  // namespace flashinfer
