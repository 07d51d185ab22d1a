// The sampling family's top-k selection (flashinfer.top_k), per element type.
#include "flashinfer/topk.cuh"

namespace flashinfer {
namespace sampling {
template cudaError_t TopK<float>(const TopKParams<float>&, cudaStream_t);
template cudaError_t TopK<__half>(const TopKParams<__half>&, cudaStream_t);
template cudaError_t TopK<__nv_bfloat16>(const TopKParams<__nv_bfloat16>&, cudaStream_t);
}  // namespace sampling
}  // namespace flashinfer
