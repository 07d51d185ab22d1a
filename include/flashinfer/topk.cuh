// TopKKernel: the k largest values of each row and their indices (flashinfer.top_k), by the
// exact-threshold search of sampling.h (no sort), then one index-ordered compaction pass.
// NaN ranks below every number (torch.topk ranks it above).
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "sampling.cuh"

namespace flashinfer {
namespace sampling {

template <typename T>
__global__ void __launch_bounds__(kMaxThreads, 1) TopKKernel(const __grid_constant__ TopKParams<T> p,
                                                             const __grid_constant__ ScanLayout L) {
  pdl_wait();
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    RowReader<T> rd = row_reader(p.in + row * p.in_stride, p.vocab, L);
    rd.pad = NAN;  // pivots go below key(-inf): -inf counts, padding must not (has_nan unused)
    auto src = make_source(rd, L);
    const RowStats s = src.first_pass(kKeyNaN);  // every number is above NaN's key
    // Selected: every key > tau (c_gt of them) and `need` of the n_eq keys == tau.
    uint32_t tau = kKeyNaN;
    int c_gt = s.count, n_eq = p.vocab - s.count;
    if (p.k < s.count) {
      Criterion c;
      c.top_k = p.k;
      c.max_key = order_key(s.max);
      const Bracket b = select_threshold(src, c, full_bracket(s), false);  // count-exact: hi == lo + 1
      tau = b.hi;
      c_gt = b.cnt_hi;
      n_eq = b.cnt_lo - b.cnt_hi;
    }
    const int need = p.k - c_gt;
    const int skip = p.tie_break == TopKTieBreak::kLarge ? n_eq - need : 0;
    // Thread t owns elements [t * span, (t + 1) * span): one scan places them in index order.
    const int span = (p.vocab + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
    const int t0 = static_cast<int>(threadIdx.x) * span;
    const int b0 = t0 < p.vocab ? t0 : p.vocab, e0 = b0 + span < p.vocab ? b0 + span : p.vocab;
    unsigned long long mine = 0;  // (greater << 32) | equal
    for (int i = b0; i < e0; ++i) {
      const uint32_t key = order_key(to_float(rd.at(i)));
      mine += key > tau ? (1ull << 32) : (key == tau ? 1ull : 0ull);
    }
    const unsigned long long before =
        blk::exclusive_scan(mine, reinterpret_cast<unsigned long long*>(blk::scratch().f),
                            static_cast<unsigned long long*>(nullptr));
    int pos_gt = static_cast<int>(before >> 32), rank_eq = static_cast<int>(before & 0xffffffffull);
    T* values = p.values + row * p.k;
    int64_t* indices = p.indices + row * p.k;
    for (int i = b0; i < e0; ++i) {
      const T x = rd.at(i);
      const uint32_t key = order_key(to_float(x));
      int slot = -1;
      if (key > tau) {
        slot = pos_gt++;
      } else if (key == tau) {
        const int r = rank_eq++;
        if (r >= skip && r < skip + need) slot = c_gt + (r - skip);
      }
      if (slot >= 0 && slot < p.k) {
        values[slot] = x;
        indices[slot] = i;
      }
    }
    __syncthreads();
  }
  pdl_launch_dependents();
}

template <typename T>
cudaError_t TopK(const TopKParams<T>& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  DeviceInfo dev;
  FLASHINFER_CUDA_TRY(current_device_info(&dev));
  const ScanLayout L = scan_layout(p.vocab, static_cast<int>(sizeof(T)), true, smem_budget(dev));
  FLASHINFER_CUDA_TRY(ensure_dynamic_smem<TopKKernel<T>>(static_cast<size_t>(L.smem_bytes)));
  const int64_t grid = p.rows < 0x7fffffff ? p.rows : 0x7fffffff;
  return launch(TopKKernel<T>, dim3(static_cast<unsigned>(grid)), dim3(L.threads), static_cast<size_t>(L.smem_bytes),
                stream, p.pdl, p, L);
}

}  // namespace sampling
}  // namespace flashinfer
