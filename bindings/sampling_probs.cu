// The sampling family's probability samplers (one kernel for every filter), per index dtype.
#include "flashinfer/sampling.cuh"

namespace flashinfer {
namespace sampling {
template cudaError_t Sampling<int32_t>(const SamplingParams<int32_t>&, cudaStream_t);
template cudaError_t Sampling<int64_t>(const SamplingParams<int64_t>&, cudaStream_t);
}  // namespace sampling
}  // namespace flashinfer
