// Tensor-core decode kernel: the same work items and epilogue as decode.cuh's CUDA-core
// kernel, but each warp computes scores for all q heads of its group at once with m16n8k16
// MMAs in the transposed form S^T = K q^T (16 keys as M, 8 heads as N: no padded rows),
// keeps an online softmax per head in registers, and accumulates O^T += V^T P^T. K/V tiles of kTcTile keys stream
// through a cp.async pipeline into XOR-swizzled shared memory read with ldmatrix.
#pragma once

#include <cuda_runtime.h>

#include "../cp_async.cuh"
#include "../math.cuh"
#include "../mma.cuh"
#include "../vec_dtypes.cuh"
#include "decode.cuh"
#include "state.h"

namespace flashinfer {
namespace attention {

constexpr int kTcTile = 64;  // keys per pipeline stage (16 per warp)
constexpr int kTcWarps = kDecodeThreads / 32;

// Shared memory of one stage (K and V tiles) and of the epilogue scratch.
FLASHINFER_HOST_DEVICE constexpr int64_t decode_tc_stage_bytes(int head_dim) { return int64_t{2} * kTcTile * head_dim * 2; }
FLASHINFER_HOST_DEVICE constexpr int64_t decode_tc_merge_smem(int head_dim) {
  return int64_t{kTcWarps} * kDecodeMaxGroup * (head_dim + 2) * 4;
}

namespace detail {

// Byte offset of 16-byte chunk `chunk` of row `row` in a [rows][kHeadDim] tile whose chunks
// are XOR-swizzled by row % 8, so the 8 rows an ldmatrix phase reads hit 8 different banks.
template <int kHeadDim>
FLASHINFER_DEVICE uint32_t swz(int row, int chunk) {
  return static_cast<uint32_t>(row * kHeadDim * 2 + ((chunk ^ (row & 7)) << 4));
}

}  // namespace detail

template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kDecodeThreads) DecodeTCKernel(const DecodeParams<T> p, const int stages) {
  static_assert(kHeadDim % 64 == 0, "the swizzle needs >= 8 chunks per row");
  constexpr int kChunks = kHeadDim / 8;  // 16-byte chunks per key row
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kMTiles = kHeadDim / 16;  // 16-dim tiles of O^T
  constexpr int64_t kStage = decode_tc_stage_bytes(kHeadDim);
  extern __shared__ uint4 smem_u4[];
  __shared__ __align__(16) T sP[kTcWarps * kDecodeMaxGroup * 16];
  char* smem = reinterpret_cast<char*>(smem_u4);
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = lane >> 2, tig = lane & 3;  // MMA fragment coordinates
  const bool alibi = p.pos_encoding == PosEncodingMode::kALiBi;
  const bool soft_cap = p.soft_cap > 0.f;
  const float s_scale = soft_cap ? p.sm_scale / p.soft_cap : p.sm_scale * detail::kLog2e;
  const float cap_log2 = p.soft_cap * detail::kLog2e;

  pdl_wait();
  const int64_t n_items = detail::num_items(p);
  for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
    const detail::Item it = detail::get_item(p, item);
    const int64_t b = it.request, lo = it.lo, hi = it.hi;
    const int kv_head = it.kv_head, qh0 = it.qh0, ng = it.ng;
    const int64_t num_tiles = hi > lo ? ceil_div<int64_t>(hi - lo, kTcTile) : 0;

    // q as the MMA B operand (k = dims, n = heads): lane (grp, tig) holds head qh0 + grp.
    uint32_t qa[kKSteps][2];
    {
      const bool row_ok = grp < ng;
      const T* qrow = p.q + b * p.q_stride_n + int64_t{qh0 + (row_ok ? grp : 0)} * p.q_stride_h;
      FLASHINFER_UNROLL
      for (int ks = 0; ks < kKSteps; ++ks) {
        const uint32_t lo2 = *reinterpret_cast<const uint32_t*>(qrow + ks * 16 + tig * 2);
        const uint32_t hi2 = *reinterpret_cast<const uint32_t*>(qrow + ks * 16 + 8 + tig * 2);
        qa[ks][0] = row_ok ? lo2 : 0u;
        qa[ks][1] = row_ok ? hi2 : 0u;
      }
    }
    // This thread's heads: h = tig * 2 + e (columns of S^T = K q^T and of O^T).
    float slope[2];
    FLASHINFER_UNROLL
    for (int e = 0; e < 2; ++e) {
      const int h = tig * 2 + e;
      slope[e] = alibi && h < ng ? detail::alibi_slope(qh0 + h, p.num_qo_heads) * detail::kLog2e : 0.f;
    }

    const T* kbase = p.kv.k_data + int64_t{kv_head} * p.kv.stride_h;
    const T* vbase = p.kv.v_data + int64_t{kv_head} * p.v_stride_h;
    const bool paged = p.contiguous_len < 0;
    const int64_t page_base = paged ? int64_t{p.kv.indptr[b]} : 0;
    const int page_size = static_cast<int>(paged ? p.kv.page_size : 1);
    auto issue = [&](int64_t tile, int s) {
      if (tile < num_tiles) {
        char* ks_ = smem + s * kStage;
        char* vs_ = ks_ + kStage / 2;
        FLASHINFER_UNROLL
        for (int i = 0; i < kTcTile * kChunks / kDecodeThreads; ++i) {
          const int idx = i * kDecodeThreads + threadIdx.x;
          const int row = idx / kChunks, chunk = idx % kChunks;
          const int64_t t = lo + tile * kTcTile + row;
          const bool valid = t < hi;
          int64_t off_k = 0, off_v = 0;
          if (valid) {
            int64_t page, entry;
            if (paged) {
              const int tt = static_cast<int>(t);
              page = p.kv.indices[page_base + tt / page_size];
              entry = tt % page_size;
            } else {
              page = 0;
              entry = t;
            }
            off_k = page * p.kv.stride_page + entry * p.kv.stride_n + chunk * 8;
            off_v = page * p.v_stride_page + entry * p.v_stride_n + chunk * 8;
          }
          const uint32_t so = detail::swz<kHeadDim>(row, chunk);
          cp_async::copy16_or_zero(ks_ + so, kbase + off_k, valid);
          cp_async::copy16_or_zero(vs_ + so, vbase + off_v, valid);
        }
      }
      cp_async::commit();
    };

    // Online softmax per head (log2 units); d is this thread's share of its 2 keys per tile.
    float m[2] = {neg_inf(), neg_inf()}, d[2] = {0.f, 0.f};
    float o[kMTiles][4];  // O^T: dims mt*16 + grp (+8) x heads tig*2 + {0, 1}
    FLASHINFER_UNROLL
    for (int n = 0; n < kMTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    T* sp = sP + warp * kDecodeMaxGroup * 16;  // this warp's P^T staging [head][16 keys]

    for (int s = 0; s + 1 < stages; ++s) issue(s, s);
    int s_cur = 0;
    for (int64_t tile = 0; tile < num_tiles; ++tile) {
      issue(tile + stages - 1, s_cur == 0 ? stages - 1 : s_cur - 1);
      cp_async::wait(stages - 1);
      __syncthreads();  // every thread's copies of this stage have landed
      const char* ks_ = smem + s_cur * kStage;
      const char* vs_ = ks_ + kStage / 2;
      const int row0 = warp * 16;  // this warp's 16 keys of the tile
      // S^T = K q^T (16 keys x 8 heads): K rows are the A operand, q the B operand; even and
      // odd k-steps accumulate separately to halve the dependent MMA chain.
      float sc[2][4] = {};
      FLASHINFER_UNROLL
      for (int ks = 0; ks < kKSteps; ++ks) {
        uint32_t ka[4];
        mma::ldmatrix_x4(ka, ks_ + detail::swz<kHeadDim>(row0 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * ks + (lane >> 4)));
        mma::mma_16816<T>(sc[ks & 1], ka, qa[ks]);
      }
      // x[r][e]: key row0 + grp + 8r, head tig*2 + e.
      const int64_t t0 = lo + tile * kTcTile + row0 + grp;
      float x[2][2];
      FLASHINFER_UNROLL
      for (int r = 0; r < 2; ++r) {
        FLASHINFER_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int64_t t = t0 + 8 * r;
          float v = sc[0][2 * r + e] + sc[1][2 * r + e];
          v = soft_cap ? cap_log2 * tanhf(v * s_scale) : v * s_scale;
          v += slope[e] * float(t);
          x[r][e] = t < hi ? v : neg_inf();
        }
      }
      float scale[2], pr[2][2];
      FLASHINFER_UNROLL
      for (int e = 0; e < 2; ++e) {
        float tmax = fmaxf(x[0][e], x[1][e]);
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 4));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 8));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 16));
        const float m_new = fmaxf(m[e], tmax);
        scale[e] = m_new == neg_inf() ? 1.f : exp2f(m[e] - m_new);
        FLASHINFER_UNROLL
        for (int r = 0; r < 2; ++r) pr[r][e] = m_new == neg_inf() ? 0.f : exp2f(x[r][e] - m_new);
        d[e] = d[e] * scale[e] + pr[0][e] + pr[1][e];
        m[e] = m_new;
      }
      FLASHINFER_UNROLL
      for (int n = 0; n < kMTiles; ++n) {
        o[n][0] *= scale[0];
        o[n][1] *= scale[1];
        o[n][2] *= scale[0];
        o[n][3] *= scale[1];
      }
      // P^T as the B operand of O^T += V^T P^T: stage it as [head][key] and ldmatrix it back.
      FLASHINFER_UNROLL
      for (int r = 0; r < 2; ++r)
        FLASHINFER_UNROLL
        for (int e = 0; e < 2; ++e) sp[(tig * 2 + e) * 16 + grp + 8 * r] = from_float<T>(pr[r][e]);
      __syncwarp();
      uint32_t pb[2];
      mma::ldmatrix_x2(pb, sp + (lane & 7) * 16 + ((lane >> 3) & 1) * 8);
      FLASHINFER_UNROLL
      for (int n = 0; n < kMTiles; ++n) {
        uint32_t va[4];  // V^T (dims n*16.. x 16 keys) from V rows via ldmatrix.trans
        mma::ldmatrix_x4_trans(va, vs_ + detail::swz<kHeadDim>(row0 + (lane & 7) + (lane >> 4) * 8,
                                                                 2 * n + ((lane >> 3) & 1)));
        mma::mma_16816<T>(o[n], va, pb);
      }
      __syncthreads();  // the stage (and sp) are rewritten by the next iteration
      s_cur = s_cur + 1 == stages ? 0 : s_cur + 1;
    }
    cp_async::wait(0);
    __syncthreads();

    // Per-warp states of the heads to the scratch, then the shared epilogue.
    FLASHINFER_UNROLL
    for (int e = 0; e < 2; ++e) {
      d[e] += __shfl_xor_sync(0xffffffffu, d[e], 4);
      d[e] += __shfl_xor_sync(0xffffffffu, d[e], 8);
      d[e] += __shfl_xor_sync(0xffffffffu, d[e], 16);
    }
    float* so = reinterpret_cast<float*>(smem);
    float* sm = so + kTcWarps * kDecodeMaxGroup * kHeadDim;
    float* sd = sm + kTcWarps * kDecodeMaxGroup;
    FLASHINFER_UNROLL
    for (int n = 0; n < kMTiles; ++n) {
      FLASHINFER_UNROLL
      for (int e = 0; e < 2; ++e) {
        float* row = so + (warp * kDecodeMaxGroup + tig * 2 + e) * kHeadDim + n * 16 + grp;
        row[0] = o[n][e];
        row[8] = o[n][2 + e];
      }
    }
    if (grp == 0) {
      FLASHINFER_UNROLL
      for (int e = 0; e < 2; ++e) {
        sm[warp * kDecodeMaxGroup + tig * 2 + e] = m[e];
        sd[warp * kDecodeMaxGroup + tig * 2 + e] = d[e];
      }
    }
    __syncthreads();
    detail::write_merged<T, kHeadDim, kTcWarps>(p, it, qh0, ng, so, sm, sd);
    __syncthreads();
  }
  pdl_launch_dependents();
}

}  // namespace attention
}  // namespace flashinfer
