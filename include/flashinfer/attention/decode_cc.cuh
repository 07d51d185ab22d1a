// CUDA-core decode kernel (use_tensor_cores=False): several keys per thread group per stage. A CTA's 128 threads
// form kTy = 128 / kTx groups of kTx = min(32, D / 8) lanes (a lane owns kVec = D / kTx
// features of a key: 8, or 16 at head_dim 512); each group takes kKeys consecutive keys of
// every stage, so a stage holds kKeys * kTy keys (kKeys * kVec / 2 KiB of K and V) copied by
// 2 * kKeys * kVec / 8 cp.async per thread. Per stage a lane forms
// kKeys x kG partial dot products and reduces them across its group with a transpose-reduce
// (reduce-scatter butterfly: N values over L lanes cost ~N shuffles instead of N log2 L),
// finishes the scores it owns (soft cap, ALiBi, masks) and publishes them in a small per-stage
// scratch; every lane reads the group's kKeys x kG scores back for the online softmax's max per
// head (one max and at most one rescale of o per head and stage), the owners turn their scores
// into probabilities (one exp2 per score), publish them, and every lane accumulates
// o[g][8] += p * v. The end of an item (detail::write_merged, merge_if_last) is shared with the
// tensor-core kernel. H200 (bf16, 32/8 x 128, page 16; 1x32k / 16x4k / 64x2k / 256x1k / 128x8k):
// 75 / 113 / 196 / 383 / 1427 us, 2.5x the previous one-key-per-group kernel.
#pragma once

#include <cuda_runtime.h>

#include <type_traits>

#include "decode.cuh"

namespace flashinfer {
namespace attention {

// Keys per thread group and stage: 8 for one q head (little work per key), else 4; 4 at
// head_dim 512, whose lanes copy two vectors per key (the same bytes per thread).
FLASHINFER_HOST_DEVICE constexpr int decode_cc_keys(int kG, int head_dim) { return kG == 1 && head_dim <= 256 ? 8 : 4; }

// Per-stage bytes: K and V slots (kKeys * kVec / 8 vectors of 8 cache elements each per
// thread: 16 bytes of fp16 / bf16, 8 of fp8 -- kv_bytes per element) plus the group scratch for
// scores and probabilities (kTy groups x 2 x kKeys * kG floats).
FLASHINFER_HOST_DEVICE constexpr int64_t decode_cc_stage_bytes(int head_dim, int kG, int kv_bytes = 2) {
  return int64_t{2} * decode_cc_keys(kG, head_dim) * kDecodeThreads * 8 * kv_bytes *
             (head_dim / 8 / decode_cc_lanes(head_dim)) +
         int64_t{kDecodeThreads / decode_cc_lanes(head_dim)} * decode_cc_keys(kG, head_dim) * kG * 8;
}

// CTAs per SM the kernel's registers are bounded for (ptxas, sm_90): 8 features per lane: 4
// up to 4 q heads, else 2; 16 features (head_dim 512, 3 CTAs fit in shared memory): 4 for one
// head, 3 for two (at 4 CTAs it spilled), 2 for four.
FLASHINFER_HOST_DEVICE constexpr int decode_cc_min_blocks(int head_dim, int kG) {
  return head_dim / decode_cc_lanes(head_dim) == 8 ? (kG <= 4 ? 4 : 2) : (kG == 1 ? 4 : kG == 2 ? 3 : 2);
}

// Pipeline depth (FLASHINFER_DECODE_STAGES overrides it). Stages are 16-33 KiB; two beat three
// (and four for kG 8) by 1-6% in every H200 case measured (more CTAs resident per SM).
constexpr int decode_cc_stages(int) { return 2; }

namespace detail {

// Transpose-reduce of v[kN] across the kOff * 2 lanes of a group: after it, v[0 .. R) with
// R = max(1, kN / kL) hold complete sums; lane x owns indices x * R + r when kN >= kL, else
// index x / (kL / kN) (several lanes then hold the same sum). At each step the lane whose
// offset bit is set keeps the upper half and receives its partner's upper half.
template <int kN, int kOff>
FLASHINFER_DEVICE void xreduce(float* v, int tx) {
  if constexpr (kOff > 0) {
    if constexpr (kN > 1) {
      constexpr int kH = kN / 2;
      const bool upper = (tx & kOff) != 0;
      FLASHINFER_UNROLL
      for (int i = 0; i < kH; ++i) {
        const float send = upper ? v[i] : v[i + kH];
        const float keep = upper ? v[i + kH] : v[i];
        v[i] = keep + __shfl_xor_sync(0xffffffffu, send, kOff);
      }
      xreduce<kH, kOff / 2>(v, tx);
    } else {
      v[0] += __shfl_xor_sync(0xffffffffu, v[0], kOff);
      xreduce<1, kOff / 2>(v, tx);
    }
  }
}

// The group's kN published floats (scores or probabilities) of a stage, 16 bytes at a time.
template <int kN>
FLASHINFER_DEVICE void read_group(const float* src, float (&dst)[kN]) {
  static_assert(kN % 4 == 0, "whole float4s");
  FLASHINFER_UNROLL
  for (int i = 0; i < kN; i += 4) {
    const float4 v4 = *reinterpret_cast<const float4*>(src + i);
    dst[i] = v4.x, dst[i + 1] = v4.y, dst[i + 2] = v4.z, dst[i + 3] = v4.w;
  }
}

}  // namespace detail

// Dynamic shared memory: max(stages * decode_cc_stage_bytes(kHeadDim, kG),
// decode_merge_smem(kHeadDim)); stages >= 2. Registers: <= 128 for kG <= 4 (4 CTAs per SM);
// kG 8 holds 128 floats of q and o alone (2 CTAs per SM). kG 4 spills ~250 bytes at 128
// registers, yet 4 CTAs beat 3 without spills (164 registers) on the H200 (bf16, 32/8 x 128,
// page 16, us): 64 x 2048 196.0 vs 218.5, head_dim 256 64 x 2048 204.7 vs 209.8; 1 x 32768
// 70.3 vs 69.6, 1 x 4096 25.4 vs 24.7.
// kRope: p.pos_encoding is RoPE (the launcher picks the instantiation). Without RoPE as a
// compile-time choice, the 32 sincosf of the main loop of kG 4 (inlined, slow paths too) sat in
// every kernel's loop: 173 KB of SASS, a 4300-instruction loop, and instruction-fetch stalls
// as the main stall (ncu, 1 x 4096: "no_instruction" 4.6 cycles per issue). Without them the
// loop is 950 instructions; H200 (bf16, 32/8 x 128, page 16, us, before -> after): 1 x 4096
// 25.8 -> 20.6, 1 x 32768 70.4 -> 66.0, 16 x 4096 110.9 -> 105.6, 64 x 2048 195.6 -> 187.4,
// 128 x 8192 1429 -> 1359, 64/8 heads at 16 x 4096 161.1 -> 147.0; RoPE kernels unchanged.
// TKV: the cache element, T or fp8 (__nv_fp8_e4m3 / __nv_fp8_e5m2; p.kv_cache says which, the
// launcher picks the instantiation): a lane's 8 features of a key are 16 or 8 bytes, copied and
// converted as such; everything after the conversion is the same code.
template <typename T, int kHeadDim, int kG, bool kRope, typename TKV = T>
__global__ void __launch_bounds__(kDecodeThreads, decode_cc_min_blocks(kHeadDim, kG))
    DecodeCCKernel(const DecodeParams<T> p, const int stages) {
  constexpr int kTx = decode_cc_lanes(kHeadDim);
  constexpr int kVec = kHeadDim / kTx;  // features per lane: 8 or 16
  constexpr int kVecs = kVec / 8;       // its 16-byte vectors per key
  constexpr int kTy = kDecodeThreads / kTx;
  constexpr int kKeys = decode_cc_keys(kG, kHeadDim);
  constexpr int kStageKeys = kKeys * kTy;
  constexpr int kN = kKeys * kG;                 // scores per group and stage
  constexpr int kR = kN >= kTx ? kN / kTx : 1;   // scores a lane owns after the reduce
  constexpr int kShare = kN >= kTx ? 1 : kTx / kN;  // lanes holding the same score
  constexpr int kVB = 8 * static_cast<int>(sizeof(TKV));  // bytes of a lane's 8-feature vector
  using Slot = std::conditional_t<kVB == 16, uint4, uint2>;  // one such vector in shared memory
  // K (or V) part of a stage, in slots: key j, vector v of thread t at (j * kVecs + v) * 128 + t.
  constexpr int kSlots = kKeys * kVecs * kDecodeThreads;
  constexpr int kStageSlots = 2 * kSlots + kTy * kN * 8 / kVB;
  static_assert(kN % 4 == 0, "scores are read back as float4");
  static_assert(decode_cc_stage_bytes(kHeadDim, kG, sizeof(TKV)) == int64_t{kStageSlots} * kVB, "stage layout");
  FLASHINFER_EXTERN_SHARED uint4 smem[];
  Slot* const slots = reinterpret_cast<Slot*>(smem);
  const int tx = threadIdx.x % kTx, ty = threadIdx.x / kTx;
  constexpr bool rope = kRope;
  const bool alibi = p.pos_encoding == PosEncodingMode::kALiBi;
  const bool soft_cap = p.soft_cap > 0.f;
  const float q_scale = soft_cap ? p.sm_scale / p.soft_cap : p.sm_scale * detail::kLog2e;
  const float cap_log2 = p.soft_cap * detail::kLog2e;
  float inv_freq[kVec];
  if (rope) {
    const RopeFreq f{double(p.rope_theta), double(p.rope_scale)};
    FLASHINFER_UNROLL
    for (int e = 0; e < kVec; ++e) inv_freq[e] = rope_inv_freq(f, (tx % (kTx / 2)) * kVec + e, kHeadDim);
  }
  // The scores this lane owns: index i = j * kG + g (key j of the group's kKeys, head g).
  const int own0 = kN >= kTx ? tx * kR : tx / kShare;
  const bool paged = p.contiguous_len < 0;
  // Contiguous keys: one "page" holding every position (the cursor then never wraps).
  const int32_t page_size = paged ? static_cast<int32_t>(p.kv.page_size) : 0x7fffffff;

  pdl_wait();
  const int64_t n_items = detail::num_items(p);
  for (int64_t item = blockIdx.x; item < n_items; item += gridDim.x) {
    const detail::Item it = detail::get_item<decode_max_group(kHeadDim)>(p, item);
    const int64_t b = it.request, kv_len = it.kv_len, lo = it.lo, hi = it.hi;
    const int kv_head = it.kv_head, qh0 = it.qh0, ng = min(kG, it.ng);
    const int64_t num_tiles = hi > lo ? ceil_div<int64_t>(hi - lo, kStageKeys) : 0;

    float q[kG][kVec];
    detail::QueryColumns col(p, b, qh0, kv_len);  // (multi-token decode: a column is a token's head)
    FLASHINFER_UNROLL
    for (int g = 0; g < kG; ++g) {
      const T* qrow = p.q + col.offset(p.q_stride_n, p.q_stride_h) + tx * kVec;
      FLASHINFER_UNROLL
      for (int v = 0; v < kVecs; ++v) {
        Vec<T, 8> qv;
        if (g < ng) {
          qv.load(qrow + v * 8);
          qv.to_float(q[g] + v * 8);
        } else {
          FLASHINFER_UNROLL
          for (int e = 0; e < 8; ++e) q[g][v * 8 + e] = 0.f;
        }
      }
      if (rope) detail::rope_rotate<kTx, kVec>(q[g], inv_freq, tx, col.pos());
      FLASHINFER_UNROLL
      for (int e = 0; e < kVec; ++e) q[g][e] *= q_scale;
      col.next();
    }
    // Per owned score: its head, its query's position (keys it may see; padded heads see none),
    // and its ALiBi slope (log2 units).
    float own_slope[kR];
    int32_t own_pos[kR];  // the query's position (multi-token decode: its token's; padded: -1)
    int own_g[kR];
    FLASHINFER_UNROLL
    for (int r = 0; r < kR; ++r) {
      const int g = (own0 + r) % kG;
      own_g[r] = g;
      const DecodeQuery qr = decode_query(qh0 + g, p.num_qo_heads, p.group_size, p.q_len, kv_len);
      own_pos[r] = g < ng ? static_cast<int32_t>(qr.pos) : -1;
      own_slope[r] = alibi ? detail::alibi_slope(qr.head, qr.num_heads) * detail::kLog2e : 0.f;
    }

    const TKV* kbase = reinterpret_cast<const TKV*>(p.kv.k_data) + int64_t{kv_head} * p.kv.stride_h + tx * kVec;
    const TKV* vbase = reinterpret_cast<const TKV*>(p.kv.v_data) + int64_t{kv_head} * p.v_stride_h + tx * kVec;
    const int64_t page_base = paged ? it.page_begin : 0;
    // Walks this group's first key of each stage, lo + ty * kKeys + tile * kStageKeys; the
    // fetch of a tile (its page ids and first entry) is taken one iteration before its copy.
    PageCursor cur(static_cast<int32_t>(lo + ty * kKeys), page_size, kStageKeys);
    struct Fetch {
      int32_t page[kKeys];
      int32_t entry0;
    };
    int64_t fetched = 0;  // the tile the cursor stands on
    auto fetch = [&]() -> Fetch {
      Fetch f;
      const int64_t t0 = lo + fetched * kStageKeys + ty * kKeys;
      f.entry0 = cur.entry;
      int32_t slot = cur.slot, entry = cur.entry;
      const bool live = paged && fetched < num_tiles;
      // one page-table load per page the group's keys touch (usually one per stage)
      int32_t pg = live && t0 < hi ? p.kv.indices[page_base + slot] : 0;
      FLASHINFER_UNROLL
      for (int j = 0; j < kKeys; ++j) {
        if (j > 0 && ++entry >= page_size) {
          entry = 0, ++slot;
          pg = live && t0 + j < hi ? p.kv.indices[page_base + slot] : 0;
        }
        f.page[j] = pg;
      }
      cur.advance();
      ++fetched;
      return f;
    };
    auto issue = [&](int64_t tile, int s, const Fetch& f) {
      if (tile < num_tiles) {
        const int64_t t0 = lo + tile * kStageKeys + ty * kKeys;
        Slot* ks = slots + s * kStageSlots + threadIdx.x;
        Slot* vs = ks + kSlots;
        if (!kRope && int64_t{f.entry0} + kKeys <= page_size && t0 + kKeys <= hi) {
          // The usual case (chunks start at multiples of 64 keys, pages hold a multiple of
          // kKeys): the group's keys are consecutive entries of one page, all below hi. One
          // address per tensor, then a stride per key: ~60 fewer instructions per stage (the
          // loop's 936). H200, bf16, 32/8 x 128, page 16, two runs each, us: 1 x 32768 62.4 ->
          // 61.3, 16 x 4096 95.7 -> 94.9, 64 x 2048 163.3 -> 161.9, 256 x 1024 311.7 -> 308.7,
          // 128 x 8192 1188.7 -> 1173.0; 1 x 4096 20.7 -> 21.1 (within its spread). Not in the
          // RoPE kernels, which already spill and spilled ~100 bytes more with it.
          const TKV* kp = kbase + (int64_t{f.page[0]} * p.kv.stride_page + int64_t{f.entry0} * p.kv.stride_n);
          const TKV* vp = vbase + (int64_t{f.page[0]} * p.v_stride_page + int64_t{f.entry0} * p.v_stride_n);
          FLASHINFER_UNROLL
          for (int j = 0; j < kKeys; ++j)
            FLASHINFER_UNROLL
            for (int v = 0; v < kVecs; ++v) {
              cp_async::copy<kVB>(ks + (j * kVecs + v) * kDecodeThreads, kp + j * p.kv.stride_n + v * 8);
              cp_async::copy<kVB>(vs + (j * kVecs + v) * kDecodeThreads, vp + j * p.v_stride_n + v * 8);
            }
          cp_async::commit();
          return;
        }
        int32_t entry = f.entry0;
        int64_t koff = int64_t{f.page[0]} * p.kv.stride_page + int64_t{entry} * p.kv.stride_n;
        int64_t voff = int64_t{f.page[0]} * p.v_stride_page + int64_t{entry} * p.v_stride_n;
        FLASHINFER_UNROLL
        for (int j = 0; j < kKeys; ++j) {
          if (j > 0) {  // next entry of the page, or entry 0 of the next page
            if (++entry >= page_size) {
              entry = 0;
              koff = int64_t{f.page[j]} * p.kv.stride_page;
              voff = int64_t{f.page[j]} * p.v_stride_page;
            } else {
              koff += p.kv.stride_n;
              voff += p.v_stride_n;
            }
          }
          const bool ok = t0 + j < hi;
          FLASHINFER_UNROLL
          for (int v = 0; v < kVecs; ++v) {  // zeros past hi
            cp_async::copy_or_zero<kVB>(ks + (j * kVecs + v) * kDecodeThreads, (ok ? kbase + koff : kbase) + v * 8, ok);
            cp_async::copy_or_zero<kVB>(vs + (j * kVecs + v) * kDecodeThreads, (ok ? vbase + voff : vbase) + v * 8, ok);
          }
        }
      }
      cp_async::commit();
    };

    float m[kG], den[kG], o[kG][kVec];
    FLASHINFER_UNROLL
    for (int g = 0; g < kG; ++g) {
      m[g] = neg_inf();
      den[g] = 0.f;
      FLASHINFER_UNROLL
      for (int e = 0; e < kVec; ++e) o[g][e] = 0.f;
    }

    for (int s = 0; s + 1 < stages; ++s) {
      const Fetch f = fetch();
      issue(s, s, f);
    }
    Fetch next = fetch();  // tile stages - 1
    int s_cur = 0;
    for (int64_t tile = 0; tile < num_tiles; ++tile) {
      issue(tile + stages - 1, s_cur == 0 ? stages - 1 : s_cur - 1, next);
      next = fetch();  // tile + stages, copied by the next iteration
      cp_async::wait(stages - 1);
      const Slot* ks = slots + s_cur * kStageSlots + threadIdx.x;
      const Slot* vs = ks + kSlots;
      float* xs = reinterpret_cast<float*>(slots + s_cur * kStageSlots + 2 * kSlots) + ty * kN;  // scores
      float* xp = xs + kTy * kN;  // probabilities
      const int64_t t0 = lo + tile * kStageKeys + ty * kKeys;

      // Partial scores x[j * kG + g] over this lane's kVec features.
      float x[kN];
      FLASHINFER_UNROLL
      for (int j = 0; j < kKeys; ++j) {
        float kf[kVec];
        FLASHINFER_UNROLL
        for (int v = 0; v < kVecs; ++v)
          load8_to_float<TKV>(ks + (j * kVecs + v) * kDecodeThreads, kf + v * 8);  // one LDS (vec_dtypes.cuh)
        if (rope) detail::rope_rotate<kTx, kVec>(kf, inv_freq, tx, t0 + j);
        FLASHINFER_UNROLL
        for (int g = 0; g < kG; ++g) {
          float acc = 0.f;
          FLASHINFER_UNROLL
          for (int e = 0; e < kVec; ++e) acc += q[g][e] * kf[e];
          x[j * kG + g] = acc;
        }
      }
      detail::xreduce<kN, kTx / 2>(x, tx);
      // Finish the owned scores and publish them (lanes sharing one write the same value).
      const bool writer = kShare == 1 || tx % kShare == 0;
      FLASHINFER_UNROLL
      for (int r = 0; r < kR; ++r) {
        const int i = own0 + r;
        const int64_t t = t0 + i / kG;
        float sc = x[r];
        if (soft_cap) sc = cap_log2 * tanhf(sc);
        sc += own_slope[r] * float(t);  // as the reference: slope * key position
        if (t >= hi || !detail::key_visible(own_pos[r], static_cast<int32_t>(t), detail::key_reach(p.window_left)))
          sc = neg_inf();
        x[r] = sc;
        if (writer) xs[i] = sc;
      }
      __syncwarp();
      // Every lane of the group: the stage's max per head, and one rescale of o and the
      // denominator per head when the running max moved (the state is the same in all lanes).
      {
        float sa[kN];
        detail::read_group(xs, sa);
        FLASHINFER_UNROLL
        for (int g = 0; g < kG; ++g) {
          float mx = sa[g];
          FLASHINFER_UNROLL
          for (int j = 1; j < kKeys; ++j) mx = fmaxf(mx, sa[j * kG + g]);
          if (mx > m[g]) {
            const float scale = fast_exp2(m[g] - mx);  // 0 on the first finite score
            den[g] *= scale;
            FLASHINFER_UNROLL
            for (int e = 0; e < kVec; ++e) o[g][e] *= scale;
            m[g] = mx;
          }
        }
      }
      // The probabilities of the owned scores only (one exp2 per score and group, not per
      // lane), published and read back by every lane for the denominator and o += p v.
      FLASHINFER_UNROLL
      for (int r = 0; r < kR; ++r) {
        float mr = m[0];
        FLASHINFER_UNROLL
        for (int g = 1; g < kG; ++g) mr = own_g[r] == g ? m[g] : mr;
        const float pw = x[r] == neg_inf() ? 0.f : fast_exp2(x[r] - mr);
        if (writer) xp[own0 + r] = pw;
      }
      __syncwarp();
      float pa[kN];
      detail::read_group(xp, pa);
      FLASHINFER_UNROLL
      for (int g = 0; g < kG; ++g)
        FLASHINFER_UNROLL
        for (int j = 0; j < kKeys; ++j) den[g] += pa[j * kG + g];
      FLASHINFER_UNROLL
      for (int j = 0; j < kKeys; ++j) {
        float vf[kVec];
        FLASHINFER_UNROLL
        for (int v = 0; v < kVecs; ++v) load8_to_float<TKV>(vs + (j * kVecs + v) * kDecodeThreads, vf + v * 8);  // zeros past hi
        FLASHINFER_UNROLL
        for (int g = 0; g < kG; ++g)
          FLASHINFER_UNROLL
          for (int e = 0; e < kVec; ++e) o[g][e] += pa[j * kG + g] * vf[e];
      }
      s_cur = s_cur + 1 == stages ? 0 : s_cur + 1;
    }
    const DecodeMergeInfo mi = detail::merge_info(p, it);  // (lands while the scratch is written)
    cp_async::wait(0);
    __syncthreads();  // the stage slots become the merge scratch

    float* so = reinterpret_cast<float*>(smem);
    float* sm = so + kTy * kDecodeMaxGroup * kHeadDim;
    float* sd = sm + kTy * kDecodeMaxGroup;
    FLASHINFER_UNROLL
    for (int g = 0; g < kG; ++g) {
      FLASHINFER_UNROLL
      for (int e = 0; e < kVec; ++e) so[(ty * kDecodeMaxGroup + g) * kHeadDim + tx * kVec + e] = o[g][e];
      if (tx == 0) {
        sm[ty * kDecodeMaxGroup + g] = m[g];
        sd[ty * kDecodeMaxGroup + g] = den[g];
      }
    }
    __syncthreads();
    detail::write_merged<T, kHeadDim, kTy>(p, it, qh0, ng, so, sm, sd, mi);
    __syncthreads();  // scratch is the next item's stage memory
  }
  pdl_launch_dependents();
}

}  // namespace attention
}  // namespace flashinfer
