// The sampling family's renormalization / mask kernel, per element type.
#include "flashinfer/sampling.cuh"

namespace flashinfer {
namespace sampling {
template cudaError_t Renorm<float>(const RenormParams<float>&, cudaStream_t);
template cudaError_t Renorm<__half>(const RenormParams<__half>&, cudaStream_t);
template cudaError_t Renorm<__nv_bfloat16>(const RenormParams<__nv_bfloat16>&, cudaStream_t);
}  // namespace sampling
}  // namespace flashinfer
