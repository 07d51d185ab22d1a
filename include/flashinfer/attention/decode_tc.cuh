// Tensor-core decode kernel: the same work items and epilogue as decode.cuh's CUDA-core
// kernel, but each warp computes scores for all q heads of its group at once with m16n8k16
// MMAs (q heads are the M rows, 8 used of 16), keeps an FA2-style online softmax in
// registers, and multiplies P by V on the tensor cores. K/V tiles of kTcTile keys stream
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
  constexpr int kNTiles = kHeadDim / 8;  // output column tiles
  constexpr int64_t kStage = decode_tc_stage_bytes(kHeadDim);
  extern __shared__ uint4 smem_u4[];
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

    // q rows (heads) as MMA A fragments: row grp = head qh0 + grp; rows grp + 8 are zero.
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
    const float slope = alibi && grp < ng ? detail::alibi_slope(qh0 + grp, p.num_qo_heads) * detail::kLog2e : 0.f;

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

    float m = neg_inf(), d = 0.f;  // online softmax of row grp (log2 units); d is this thread's share
    float o[kNTiles][4];
    FLASHINFER_UNROLL
    for (int n = 0; n < kNTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;

    for (int s = 0; s + 1 < stages; ++s) issue(s, s);
    int s_cur = 0;
    for (int64_t tile = 0; tile < num_tiles; ++tile) {
      issue(tile + stages - 1, s_cur == 0 ? stages - 1 : s_cur - 1);
      cp_async::wait(stages - 1);
      __syncthreads();  // every thread's copies of this stage have landed
      const char* ks_ = smem + s_cur * kStage;
      const char* vs_ = ks_ + kStage / 2;
      const int row0 = warp * 16;  // this warp's 16 keys of the tile
      // S = q K^T for keys row0..row0+15: two n-tiles of 8 keys.
      float sc[2][4] = {};
      FLASHINFER_UNROLL
      for (int ks = 0; ks < kKSteps; ks += 2) {
        FLASHINFER_UNROLL
        for (int nt = 0; nt < 2; ++nt) {
          uint32_t kb[4];  // B fragments for k-steps ks and ks+1
          mma::ldmatrix_x4(kb, ks_ + detail::swz<kHeadDim>(row0 + nt * 8 + (lane & 7), ks * 2 + (lane >> 3)));
          const uint32_t a0[4] = {qa[ks][0], 0u, qa[ks][1], 0u};
          const uint32_t a1[4] = {qa[ks + 1][0], 0u, qa[ks + 1][1], 0u};
          mma::mma_16816<T>(sc[nt], a0, kb);
          mma::mma_16816<T>(sc[nt], a1, kb + 2);
        }
      }
      // Scores of row grp: keys row0 + nt*8 + tig*2 + {0, 1}.
      const int64_t t0 = lo + tile * kTcTile + row0;
      float tile_max = neg_inf();
      FLASHINFER_UNROLL
      for (int nt = 0; nt < 2; ++nt) {
        FLASHINFER_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int64_t t = t0 + nt * 8 + tig * 2 + e;
          float x = sc[nt][e];
          x = soft_cap ? cap_log2 * tanhf(x * s_scale) : x * s_scale;
          x += slope * float(t);
          if (t >= hi) x = neg_inf();
          sc[nt][e] = x;
          tile_max = fmaxf(tile_max, x);
        }
      }
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 1));
      tile_max = fmaxf(tile_max, __shfl_xor_sync(0xffffffffu, tile_max, 2));
      const float m_new = fmaxf(m, tile_max);
      const float scale = m_new == neg_inf() ? 1.f : exp2f(m - m_new);
      float pr[2][2];
      FLASHINFER_UNROLL
      for (int nt = 0; nt < 2; ++nt)
        FLASHINFER_UNROLL
        for (int e = 0; e < 2; ++e) pr[nt][e] = m_new == neg_inf() ? 0.f : exp2f(sc[nt][e] - m_new);
      d = d * scale + (pr[0][0] + pr[0][1] + pr[1][0] + pr[1][1]);
      m = m_new;
      FLASHINFER_UNROLL
      for (int n = 0; n < kNTiles; ++n) {
        o[n][0] *= scale;
        o[n][1] *= scale;
      }
      // O += P V: P (row grp, 16 keys) is the A operand; V^T fragments come from ldmatrix.trans.
      const uint32_t pa[4] = {mma::pack2<T>(pr[0][0], pr[0][1]), 0u, mma::pack2<T>(pr[1][0], pr[1][1]), 0u};
      FLASHINFER_UNROLL
      for (int n = 0; n < kNTiles; n += 2) {
        uint32_t vb[4];  // B fragments for column tiles n and n+1
        mma::ldmatrix_x4_trans(vb, vs_ + detail::swz<kHeadDim>(row0 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                                 n + (lane >> 4)));
        mma::mma_16816<T>(o[n], pa, vb);
        mma::mma_16816<T>(o[n + 1], pa, vb + 2);
      }
      __syncthreads();  // the stage is refilled by the next iteration's issue
      s_cur = s_cur + 1 == stages ? 0 : s_cur + 1;
    }
    cp_async::wait(0);
    __syncthreads();

    // Per-warp states of rows grp < ng to the scratch, then the shared epilogue.
    d += __shfl_xor_sync(0xffffffffu, d, 1);
    d += __shfl_xor_sync(0xffffffffu, d, 2);
    float* so = reinterpret_cast<float*>(smem);
    float* sm = so + kTcWarps * kDecodeMaxGroup * kHeadDim;
    float* sd = sm + kTcWarps * kDecodeMaxGroup;
    if (grp < kDecodeMaxGroup) {
      FLASHINFER_UNROLL
      for (int n = 0; n < kNTiles; ++n) {
        so[(warp * kDecodeMaxGroup + grp) * kHeadDim + n * 8 + tig * 2] = o[n][0];
        so[(warp * kDecodeMaxGroup + grp) * kHeadDim + n * 8 + tig * 2 + 1] = o[n][1];
      }
      if (tig == 0) {
        sm[warp * kDecodeMaxGroup + grp] = m;
        sd[warp * kDecodeMaxGroup + grp] = d;
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
