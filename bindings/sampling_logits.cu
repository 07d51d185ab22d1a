// The sampling family's logit kernels: softmax, Gumbel-max sampling, chain speculative sampling.
#include "flashinfer/sampling_logits.cuh"
#include "sampling_inst.h"

namespace flashinfer {
namespace sampling {
template cudaError_t LogitsSampling<int32_t>(const LogitsSamplingParams<int32_t>&, cudaStream_t);
template cudaError_t LogitsSampling<int64_t>(const LogitsSamplingParams<int64_t>&, cudaStream_t);
}  // namespace sampling
}  // namespace flashinfer

namespace flashinfer_bind {
cudaError_t softmax_launch(const flashinfer::sampling::SoftmaxParams& p, cudaStream_t stream) {
  return flashinfer::sampling::Softmax(p, stream);
}
cudaError_t chain_speculative_launch(const flashinfer::sampling::ChainSpeculativeParams& p, cudaStream_t stream) {
  return flashinfer::sampling::ChainSpeculative(p, stream);
}
}  // namespace flashinfer_bind
