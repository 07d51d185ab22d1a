// RMSNorm, fused-add RMSNorm and LayerNorm with an fp8 output (FlashInfer's rmsnorm_quant,
// fused_add_rmsnorm_quant, layernorm_quant): out = fp8(clamp(norm(x) / scale)), rounded to
// nearest and saturated to the format's largest finite value. `scale` is a float or a device
// scalar (read by the kernel: no host synchronisation). LayerNorm's result is rounded to the
// input dtype before the division, as FlashInfer's; the RMSNorms divide the fp32 value.
//
// One block per row (grid-stride over rows): a first pass over the row reduces its sums in
// fp32 (LayerNorm: a second one the squared deviations from the mean), the last pass recomputes
// each value from the inputs, normalises, quantises and stores it (and, for the fused add, the
// rounded sum into `residual`). The later passes re-read the row through L1/L2. 16-byte vectors
// where every row allows them, single elements otherwise.
#pragma once

#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <type_traits>

#include "layout.h"
#include "math.cuh"
#include "norm.h"
#include "utils.cuh"
#include "vec_dtypes.cuh"

namespace flashinfer {
namespace norm {

constexpr int kNormQuantThreads = 256;

namespace detail {

template <Fp8Kind kF>
FLASHINFER_DEVICE uint8_t to_fp8(float v) {
  return static_cast<uint8_t>(__nv_cvt_float_to_fp8(v, __NV_SATFINITE, kF == Fp8Kind::kE4M3 ? __NV_E4M3 : __NV_E5M2));
}

// kE consecutive values of a row (kE 8: one 16-byte vector) as floats.
template <int kE, typename T>
FLASHINFER_DEVICE void load_row(const T* p, float* v) {
  if constexpr (kE == 8) {
    Vec<T, 8> x;
    x.load(p);
    x.to_float(v);
  } else {
    v[0] = to_float(p[0]);
  }
}
template <int kE>
FLASHINFER_DEVICE void load_row(const float* p, float* v) {
  FLASHINFER_UNROLL
  for (int e = 0; e < kE; ++e) v[e] = p[e];
}

}  // namespace detail

template <typename T, typename WT, NormKind kKind, Fp8Kind kF, int kE>
__global__ void __launch_bounds__(kNormQuantThreads) NormQuantKernel(const NormQuantParams<T, WT> p) {
  __shared__ float red[32];
  pdl_wait();
  const float inv_scale = 1.f / (p.scale_ptr ? *p.scale_ptr : p.scale);  // as FlashInfer: x * (1 / scale)
  const int64_t n = p.hidden / kE;
  const float inv_h = 1.f / static_cast<float>(p.hidden);
  for (int64_t r = blockIdx.x; r < p.rows; r += gridDim.x) {
    const T* x = p.input + p.in_rows.offset(r);
    T* res = kKind == NormKind::kFusedAddRMS ? p.residual + p.res_rows.offset(r) : nullptr;
    uint8_t* o = p.out + p.out_rows.offset(r);
    // The row's values at vector i: input (+ residual for the fused add), in fp32.
    auto load = [&](int64_t i, float* v) {
      detail::load_row<kE>(x + i * kE, v);
      if constexpr (kKind == NormKind::kFusedAddRMS) {
        float rv[kE];
        detail::load_row<kE>(res + i * kE, rv);
        FLASHINFER_UNROLL
        for (int e = 0; e < kE; ++e) v[e] += rv[e];
      }
    };
    float s = 0.f;
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float v[kE];
      load(i, v);
      FLASHINFER_UNROLL
      for (int e = 0; e < kE; ++e) s += kKind == NormKind::kLayer ? v[e] : v[e] * v[e];
    }
    s = block::reduce_sum(s, red);
    float mean = 0.f, inv;
    if constexpr (kKind == NormKind::kLayer) {
      mean = s * inv_h;
      float q = 0.f;
      for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
        float v[kE];
        load(i, v);
        FLASHINFER_UNROLL
        for (int e = 0; e < kE; ++e) q += (v[e] - mean) * (v[e] - mean);
      }
      q = block::reduce_sum(q, red);
      inv = rsqrtf(q * inv_h + p.eps);
    } else {
      inv = rsqrtf(s * inv_h + p.eps);
    }
    for (int64_t i = threadIdx.x; i < n; i += blockDim.x) {
      float v[kE], w[kE];
      load(i, v);
      detail::load_row<kE>(p.weight + i * kE, w);
      if constexpr (kKind == NormKind::kFusedAddRMS) {
        if constexpr (kE == 8) {
          Vec<T, 8> rv;
          rv.from_float(v);
          rv.store(res + i * kE);
        } else {
          res[i] = from_float<T>(v[0]);
        }
      }
      float y[kE];
      if constexpr (kKind == NormKind::kLayer) {
        float b[kE];
        detail::load_row<kE>(p.bias + i * kE, b);
        FLASHINFER_UNROLL
        for (int e = 0; e < kE; ++e) y[e] = to_float(from_float<T>((v[e] - mean) * inv * w[e] + b[e])) * inv_scale;
      } else {
        FLASHINFER_UNROLL
        for (int e = 0; e < kE; ++e) y[e] = v[e] * inv * w[e] * inv_scale;
      }
      if constexpr (kE == 8) {
        uint32_t lo = 0, hi = 0;
        FLASHINFER_UNROLL
        for (int e = 0; e < 4; ++e) {
          lo |= uint32_t{detail::to_fp8<kF>(y[e])} << (8 * e);
          hi |= uint32_t{detail::to_fp8<kF>(y[4 + e])} << (8 * e);
        }
        *reinterpret_cast<uint2*>(o + i * kE) = make_uint2(lo, hi);
      } else {
        o[i] = detail::to_fp8<kF>(y[0]);
      }
    }
  }
  pdl_launch_dependents();
}

// Whether every row of the call can take 16-byte input vectors (and 8-byte fp8 stores).
template <typename T, typename WT>
bool norm_quant_vectorizable(const NormQuantParams<T, WT>& p) {
  auto al16 = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  constexpr int64_t kE = 8;  // 16 bytes of input, 8 of fp8 output
  bool ok = p.hidden % kE == 0 && p.in_rows.rows_aligned(p.input, kE, 16) && p.out_rows.rows_aligned(p.out, kE, 8) &&
            al16(p.weight) && (p.bias == nullptr || al16(p.bias));
  if (p.residual) ok = ok && p.res_rows.rows_aligned(p.residual, kE, 16);
  return ok;
}

// kind: kRMS or kFusedAddRMS with WT == T, kLayer with WT == float.
template <typename T, typename WT>
cudaError_t NormQuant(const NormQuantParams<T, WT>& p, NormKind kind, cudaStream_t stream) {
  constexpr bool kLayerTypes = std::is_same<WT, float>::value;
  if ((kind == NormKind::kLayer) != kLayerTypes || p.hidden <= 0 || p.rows < 0) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  const dim3 grid(static_cast<unsigned>(p.rows < 65536 ? p.rows : 65536)), block(kNormQuantThreads);
  const bool vec = norm_quant_vectorizable(p);
  auto go = [&](auto kind_tag, auto fp8_tag) {
    constexpr NormKind kK = decltype(kind_tag)::value;
    constexpr Fp8Kind kF = decltype(fp8_tag)::value;
    return vec ? launch(NormQuantKernel<T, WT, kK, kF, 8>, grid, block, 0, stream, p.pdl, p)
               : launch(NormQuantKernel<T, WT, kK, kF, 1>, grid, block, 0, stream, p.pdl, p);
  };
  auto by_fp8 = [&](auto kind_tag) {
    return p.fp8 == Fp8Kind::kE5M2 ? go(kind_tag, std::integral_constant<Fp8Kind, Fp8Kind::kE5M2>{})
                                   : go(kind_tag, std::integral_constant<Fp8Kind, Fp8Kind::kE4M3>{});
  };
  if constexpr (kLayerTypes) {
    return by_fp8(std::integral_constant<NormKind, NormKind::kLayer>{});
  } else {
    return kind == NormKind::kFusedAddRMS ? by_fp8(std::integral_constant<NormKind, NormKind::kFusedAddRMS>{})
                                          : by_fp8(std::integral_constant<NormKind, NormKind::kRMS>{});
  }
}

}  // namespace norm
}  // namespace flashinfer
