// Gated activation kernels (SiLU, GELU, GELU-tanh times the up projection) and launcher.
#pragma once

#include <cuda_runtime.h>

#include "activation.h"
#include "math.cuh"
#include "utils.cuh"
#include "vec_dtypes.cuh"

namespace flashinfer {
namespace activation {

template <ActKind kKind>
FLASHINFER_DEVICE float act(float x) {
  if constexpr (kKind == ActKind::kSilu) {
    return x / (1.f + __expf(-x));
  } else if constexpr (kKind == ActKind::kGelu) {
    return 0.5f * x * (1.f + erff(x * 0.70710678118654752f));
  } else {
    const float kAlpha = 0.79788456080286536f;  // sqrt(2 / pi)
    return 0.5f * x * (1.f + tanhf(kAlpha * (x + 0.044715f * x * x * x)));
  }
}

// grid = (rows, column blocks); each thread handles kActUnroll vectors of kVec elements,
// issuing all loads before the first use so several 16-byte reads are in flight.
template <typename T, ActKind kKind, int kVec>
__global__ void ActAndMulKernel(const ActParams<T> p) {
  const int64_t nvec = p.hidden / kVec;
  const int64_t col0 = int64_t{blockIdx.y} * blockDim.x * kActUnroll + threadIdx.x;
  pdl_wait();
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const T* x1 = p.input + p.in_rows.offset(row);
    const T* x2 = x1 + p.hidden;
    T* out = p.out + p.out_rows.offset(row);
    Vec<T, kVec> a[kActUnroll], b[kActUnroll];
    FLASHINFER_UNROLL
    for (int u = 0; u < kActUnroll; ++u) {
      const int64_t j = col0 + int64_t{u} * blockDim.x;
      if (j < nvec) {
        a[u].load_stream(x1 + j * kVec);
        b[u].load_stream(x2 + j * kVec);
      }
    }
    FLASHINFER_UNROLL
    for (int u = 0; u < kActUnroll; ++u) {
      const int64_t j = col0 + int64_t{u} * blockDim.x;
      if (j >= nvec) continue;
      float fa[kVec], fb[kVec];
      a[u].to_float(fa);
      b[u].to_float(fb);
      FLASHINFER_UNROLL
      for (int e = 0; e < kVec; ++e) fa[e] = act<kKind>(fa[e]) * fb[e];
      Vec<T, kVec> o;
      o.from_float(fa);
      o.store_stream(out + j * kVec);
    }
  }
  pdl_launch_dependents();
}

template <ActKind kKind, typename T>
cudaError_t ActAndMulDispatched(const ActParams<T>& p, const ActLaunch& l, cudaStream_t stream) {
  constexpr int64_t kMaxRowBlocks = int64_t{1} << 30;
  const dim3 grid(static_cast<unsigned>(l.row_blocks < kMaxRowBlocks ? l.row_blocks : kMaxRowBlocks),
                  static_cast<unsigned>(l.col_blocks));
  if (l.vec_elems == 1) return launch(ActAndMulKernel<T, kKind, 1>, grid, dim3(l.threads), 0, stream, p.pdl, p);
  return launch(ActAndMulKernel<T, kKind, 16 / sizeof(T)>, grid, dim3(l.threads), 0, stream, p.pdl, p);
}

template <typename T>
cudaError_t ActAndMul(const ActParams<T>& p, ActKind kind, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  constexpr int kE = 16 / sizeof(T);
  auto aligned = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  const bool aligned16 = aligned(p.input) && aligned(p.out) && p.in_rows.strides_multiple_of(kE) &&
                         p.out_rows.strides_multiple_of(kE);
  const ActLaunch l = act_launch_config(p.rows, p.hidden, kE, aligned16);
  switch (kind) {
    case ActKind::kSilu: return ActAndMulDispatched<ActKind::kSilu>(p, l, stream);
    case ActKind::kGelu: return ActAndMulDispatched<ActKind::kGelu>(p, l, stream);
    case ActKind::kGeluTanh: return ActAndMulDispatched<ActKind::kGeluTanh>(p, l, stream);
  }
  return cudaErrorInvalidValue;
}

}  // namespace activation
}  // namespace flashinfer
