// An empty kernel launched through flashinfer::launch(): the host cost of one launch, the
// floor under every binding's enqueue time (benchmarks/host_overhead.py reports it).
#include <cuda_runtime.h>

#include "flashinfer/math.cuh"
#include "flashinfer/utils.cuh"

namespace flashinfer_bind {

__global__ void EmptyKernel() { flashinfer::pdl_wait(); }

cudaError_t launch_empty(cudaStream_t stream, bool pdl) {
  return flashinfer::launch(EmptyKernel, dim3(1), dim3(32), 0, stream, pdl);
}

}  // namespace flashinfer_bind
