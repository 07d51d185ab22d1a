// What the decode kernels (decode_cc.cuh on CUDA cores, decode_tc.cuh on tensor cores) share:
// the persistent work-item loop (request, kv head, q-head sub-group, key chunk), the end of an
// item (the final output, or a partial state that the last CTA of a split request or
// DecodeMergeKernel folds with state.h's merge), and DecodeMergeKernel.
#pragma once

#include <cuda_runtime.h>

#include "../cp_async.cuh"
#include "../math.cuh"
#include "../utils.cuh"
#include "../vec_dtypes.cuh"
#include "decode.h"
#include "state.h"

namespace flashinfer {
namespace attention {
namespace detail {

constexpr float kLog2e = 1.4426950408889634f;

// ALiBi slope of q head h of H (float32), as FlashInfer defines it.
FLASHINFER_DEVICE float alibi_slope(int h, int num_heads) {
  int n = 1;
  while (n * 2 <= num_heads) n *= 2;
  if (h < n) return exp2f(-8.f * float(h + 1) / float(n));
  return exp2f(-4.f * float(2 * (h - n) + 1) / float(n));
}

// Rotate-half RoPE on the kVec features [kVec*tx, kVec*tx + kVec) this thread holds; the
// partner half lives in lane tx ^ (tx_count / 2) of the same key group.
template <int kTx, int kVec = 8>
FLASHINFER_DEVICE void rope_rotate(float* x, const float* inv_freq, int tx, int64_t pos) {
  float partner[kVec];
  FLASHINFER_UNROLL
  for (int e = 0; e < kVec; ++e) partner[e] = __shfl_xor_sync(0xffffffffu, x[e], kTx / 2);
  const bool first_half = tx < kTx / 2;
  FLASHINFER_UNROLL
  for (int e = 0; e < kVec; ++e) {
    float s, c;
    sincosf(float(pos) * inv_freq[e], &s, &c);
    x[e] = first_half ? x[e] * c - partner[e] * s : x[e] * c + partner[e] * s;
  }
}

// One work item, resolved: the request, its q-head unit (kv head, first q head, heads
// used), the request's key count, and the key range [lo, hi) with the sliding window applied.
// Each query column may see less of it (key_visible).
struct Item {
  int64_t request, unit, lo, hi, slot;
  int kv_head, qh0, ng;
  int64_t kv_len;
  int64_t page_begin;  // the request's first page-table entry (paged caches)
};

// The query columns head0, head0 + 1, ... of one KV head in turn, as decode_query names them,
// with one division per item instead of one per column: (token, j) counts up.
struct QueryColumns {
  int g, token, j, head_base;  // g: real q heads per KV head; column = real head head_base + j of token
  int64_t row0, pos0;          // the request's first q / o / lse row; token 0's position
  template <typename T>
  FLASHINFER_DEVICE QueryColumns(const DecodeParams<T>& p, int64_t request, int head0, int64_t kv_len) {
    const int n = p.q_len > 1 ? p.q_len : 1;
    g = p.group_size / n;
    const int kh = head0 / p.group_size, l = head0 % p.group_size;
    token = l / g, j = l % g, head_base = kh * g;
    row0 = request * n, pos0 = kv_len - n;
  }
  FLASHINFER_DEVICE int64_t offset(int64_t sn, int64_t sh) const { return (row0 + token) * sn + (head_base + j) * sh; }
  FLASHINFER_DEVICE int64_t pos() const { return pos0 + token; }
  FLASHINFER_DEVICE void next() {
    if (++j == g) j = 0, ++token;
  }
};

// Which keys of an item (t in [lo, hi): the kernels read from lo and mask t >= hi) a query at
// position pos sees: 0 <= pos - t <= reach, reach = window_left or 2^31 - 1 without a window.
// One subtract and compare in uint32; pos -1 (a padded column) sees none. For one query per
// request pos is kv_len - 1 >= every key and the window is already in lo.
FLASHINFER_HOST_DEVICE uint32_t key_reach(int window_left) {
  return window_left >= 0 ? static_cast<uint32_t>(window_left) : 0x7fffffffu;
}
FLASHINFER_HOST_DEVICE bool key_visible(int32_t pos, int32_t t, uint32_t reach) {
  return static_cast<uint32_t>(pos) - static_cast<uint32_t>(t) <= reach;
}

// Work items of the launch: the host's count when it passed one (num_items_host > 0: no load
// before the first item's), else the plan's device scalar (CUDA graphs re-plan it).
template <typename T>
FLASHINFER_DEVICE int64_t num_items(const DecodeParams<T>& p) {
  if (!p.items) return int64_t{p.num_kv_heads} * p.sub_groups * p.implicit_chunks;
  return p.num_items_host > 0 ? p.num_items_host : int64_t{*p.num_items};
}

// Item i's descriptor as the plan wrote it (implicit items: none). A kernel that loads it
// ahead of its use (resolve_item later) hides the load behind other work.
template <typename T>
FLASHINFER_DEVICE DecodeWorkItem fetch_item(const DecodeParams<T>& p, int64_t i) {
  DecodeWorkItem w{};
  if (p.items) w = p.items[i];
  return w;
}

// kMaxGroup: the kernel's sub-group size, decode_max_group(head_dim); w: item i's descriptor
// (read only when the plan has items: p.items + i, or fetch_item's copy).
template <int kMaxGroup, typename T>
FLASHINFER_DEVICE Item resolve_item(const DecodeParams<T>& p, int64_t i, const DecodeWorkItem* wp) {
  Item it;
  if (p.items) {
    const DecodeWorkItem w = *wp;
    it.request = w.request, it.unit = w.unit, it.lo = w.kv_begin, it.hi = w.kv_end, it.slot = w.slot;
    it.kv_len = w.kv_len;
    it.page_begin = w.page_begin;
  } else {  // (item, unit and chunk counts fit int32: 32-bit divisions)
    const int32_t units = p.num_kv_heads * p.sub_groups, i32 = static_cast<int32_t>(i);
    const int32_t chunk = i32 / units;
    it.kv_len = p.kv_len(0);
    it.page_begin = p.contiguous_len < 0 ? p.kv.indptr[0] : 0;
    it.request = 0, it.unit = i32 - chunk * units, it.slot = p.implicit_chunks > 1 ? chunk : -1;
    it.lo = min(it.kv_len, int64_t{chunk} * p.implicit_chunk);
    it.hi = min(it.kv_len, int64_t{chunk + 1} * p.implicit_chunk);
  }
  const int32_t unit32 = static_cast<int32_t>(it.unit);
  int32_t kv_head, sub;  // (sub-group counts 1, 2, 4: no division on the way to the first copy)
  div_mod(unit32, p.sub_groups, &kv_head, &sub);
  it.kv_head = kv_head;
  it.qh0 = it.kv_head * p.group_size + sub * kMaxGroup;
  it.ng = min(kMaxGroup, p.group_size - sub * kMaxGroup);
  // keys left of the window of every query (the first token's, with q_len tokens per request)
  if (p.window_left >= 0) it.lo = max(it.lo, it.kv_len - (p.q_len > 1 ? p.q_len : 1) - p.window_left);
  return it;
}
template <int kMaxGroup, typename T>
FLASHINFER_DEVICE Item get_item(const DecodeParams<T>& p, int64_t i) {
  return resolve_item<kMaxGroup>(p, i, p.items + i);
}

// Merges the n partial states of one q-head row, kV consecutive dims from d0, into o[kV]
// (returns the merged lse). The partial states were written by other CTAs, so they are read
// through L2 (__ldcg). Chunks go in batches of kBatch whose loads are all independent: one
// L2 round trip per batch instead of one per chunk (a request split 98 ways used to pay
// ~98 sequential round trips in the CTA that merges it). Same math as state.h's merge: the
// weights are 2^(lse_c - max) and empty chunks (lse = -inf) weigh nothing. The result equals
// folding the states one by one with state.h's merge_state (the GPU tests check it against a
// float32 softmax over the whole row).
// step: the slots are begin, begin + step, ... (n of them).
template <int kHeadDim, int kV>
FLASHINFER_DEVICE float merge_partials(const float* partial_o, const float* partial_lse, int64_t num_qo_heads,
                                       int64_t begin, int64_t n, int64_t h, int d0, float* o, int64_t step = 1) {
  static_assert(kV % 4 == 0, "float4 loads");
  constexpr int kBatch = 64 / kV;  // 64 floats of o in flight per thread
  // Slot addresses by pointer steps. The merging CTA runs one warp per scheduler, so every
  // instruction before the loads is latency; 64-bit index products per slot took ~480
  // instructions to the first load, the steps ~210. H200, bf16, 32/8 x 128, us: 1 x 4096 16.55 ->
  // 16.1, 4 x 1024 15.9 -> 15.4, 16 x 4096 79.5 -> 78.8, 1 x 32768 47.5 -> 47.1 (merge kernel).
  const int64_t lse_step = step * num_qo_heads;
  const float* pl = partial_lse + begin * num_qo_heads + h;
  const float* po = partial_o + (begin * num_qo_heads + h) * kHeadDim + d0;
  float m = neg_inf(), den = 0.f;
  FLASHINFER_UNROLL
  for (int e = 0; e < kV; ++e) o[e] = 0.f;
  for (int64_t c0 = 0; c0 < n; c0 += kBatch) {
    float l[kBatch];
    float4 v[kBatch][kV / 4];
    FLASHINFER_UNROLL
    for (int j = 0; j < kBatch; ++j) {
      const bool ok = c0 + j < n;
      l[j] = ok ? __ldcg(pl) : neg_inf();
      FLASHINFER_UNROLL
      for (int q = 0; q < kV / 4; ++q)
        v[j][q] = ok ? __ldcg(reinterpret_cast<const float4*>(po) + q) : make_float4(0.f, 0.f, 0.f, 0.f);
      pl += lse_step;
      po += lse_step * kHeadDim;
    }
    float bm = m;
    FLASHINFER_UNROLL
    for (int j = 0; j < kBatch; ++j) bm = fmaxf(bm, l[j]);
    if (bm == neg_inf()) continue;  // every state so far is empty
    const float scale = fast_exp2(m - bm);  // 0 when m was -inf
    den *= scale;
    FLASHINFER_UNROLL
    for (int e = 0; e < kV; ++e) o[e] *= scale;
    FLASHINFER_UNROLL
    for (int j = 0; j < kBatch; ++j) {
      const float w = fast_exp2(l[j] - bm);  // 0 for empty or missing chunks
      den += w;
      FLASHINFER_UNROLL
      for (int q = 0; q < kV / 4; ++q) {
        o[4 * q + 0] += w * v[j][q].x;
        o[4 * q + 1] += w * v[j][q].y;
        o[4 * q + 2] += w * v[j][q].z;
        o[4 * q + 3] += w * v[j][q].w;
      }
    }
    m = bm;
  }
  const float inv = den > 0.f ? fast_rcp(den) : 0.f;
  FLASHINFER_UNROLL
  for (int e = 0; e < kV; ++e) o[e] *= inv;
  return den > 0.f ? m + fast_log2(den) : neg_inf();
}

#ifdef FLASHINFER_DECODE_TRACE
// Thread 0 stamps event e of its CTA once `dep` (a value the event waited for) is in a register.
constexpr int kDecodeTraceSlots = 16;
template <typename T>
FLASHINFER_DEVICE void trace_mark(const DecodeParams<T>& p, int e, uint32_t dep) {
  if (!p.trace || threadIdx.x != 0) return;
  unsigned long long t, c;
  asm volatile(
      "{\n.reg .pred q;\nsetp.eq.u32 q, %2, 0x7fffffff;\n@q mov.u64 %0, 0;\n@!q mov.u64 %0, %%globaltimer;\n"
      "@q mov.u64 %1, 0;\n@!q mov.u64 %1, %%clock64;\n}\n"
      : "=l"(t), "=l"(c)
      : "r"(dep)
      : "memory");
  p.trace[blockIdx.x * 2 * kDecodeTraceSlots + e] = t;
  p.trace[blockIdx.x * 2 * kDecodeTraceSlots + kDecodeTraceSlots + e] = c;
}
#define FLASHINFER_DECODE_MARK(p, e, dep) detail::trace_mark(p, e, static_cast<uint32_t>(dep))
#else
#define FLASHINFER_DECODE_MARK(p, e, dep)
#endif

// The merge record of an item's request when the item writes a partial state that a CTA of the
// decode kernel merges (merge_if_last), else {0, 0}. A kernel that loads it when the item starts
// keeps its latency off the way to the count.
template <typename T>
FLASHINFER_DEVICE DecodeMergeInfo merge_info(const DecodeParams<T>& p, const Item& it) {
  DecodeMergeInfo mi{0, 0};
  if (it.slot >= 0 && p.merge_counters && p.merge) mi = p.merge[it.request];
  return mi;
}

// Called by every thread of a CTA that just wrote a partial state: the CTA that completes a
// (request, unit) merges that request's partial states of heads qh0..qh0+ng into the output
// (a release / acquire count: the last one to count reads everyone's writes). Each
// thread merges 4 dims of one head: 4 heads x 128 dims give every one of the 128 threads work.
// mi: merge_info(p, it).
template <typename T, int kHeadDim>
FLASHINFER_DEVICE void merge_if_last(const DecodeParams<T>& p, const Item& it, int qh0, int ng,
                                     const DecodeMergeInfo mi) {
  constexpr int kV = 4;
  constexpr int kTx = kHeadDim / kV;
  __shared__ bool last;
  // The CTA's partial stores, then one acq_rel add by thread 0 (release: cumulative over the
  // barrier; acquire: the barrier after it orders every thread's loads of the other partials).
  // Every thread's fence.sc before the add, and again after it, cost 0.2-0.5 us on the H200 (bf16,
  // 32/8 x 128: 4 x 1024 16.2 -> 16.0, 1 x 8192 20.9 -> 20.6, 8 x 4096 47.2 -> 46.8).
  __syncthreads();
  int32_t* counter = p.merge_counters + it.request * int64_t{p.num_kv_heads} * p.sub_groups + it.unit;
  FLASHINFER_DECODE_MARK(p, 5, mi.num_chunks);
  if (threadIdx.x == 0) last = atomic_add_acq_rel_gpu(counter, 1) == mi.num_chunks - 1;
  __syncthreads();
  FLASHINFER_DECODE_MARK(p, 6, last);
  if (!last) return;
  for (int w = threadIdx.x; w < ng * kTx; w += blockDim.x) {
    const int h = qh0 + w / kTx, d0 = (w % kTx) * kV;
    float o[kV];
    const float lse =
        merge_partials<kHeadDim, kV>(p.partial_o, p.partial_lse, p.num_qo_heads, mi.partial_begin, mi.num_chunks, h, d0, o);
    Vec<T, kV> ov;
    ov.from_float(o);
    const DecodeQuery qr = decode_query(h, p.num_qo_heads, p.group_size, p.q_len, 0);
    ov.store(p.o + decode_row_offset(qr, it.request, p.q_len, p.o_stride_n, p.o_stride_h) + d0);
    if (p.lse && d0 == 0) p.lse[decode_lse_index(qr, it.request, p.q_len)] = lse;
  }
  if (threadIdx.x == 0) *counter = 0;  // ready for the next run (and CUDA-graph replays)
  FLASHINFER_DECODE_MARK(p, 7, 1);
}

// Epilogue shared by the decode kernels: kParts partial states per q head (from the CTA's
// thread groups) sit in shared memory -- so[part][g][kHeadDim] (normalised by nothing: o =
// sum 2^(s - m) v; rows 16-byte aligned), sm[part][g] (running max, log2 units), sd[part][g]
// (denominator) -- and are merged, then written as the final output (slot < 0) or as a partial
// state for DecodeMergeKernel or merge_if_last (mi: merge_info(p, it)). The caller synchronizes
// before and after. Each thread takes kV dims of one head: 8, or 4 where 8 would leave threads
// idle (4 heads x 128 dims: all 128 threads, and half the chain of shared loads and FMAs each;
// this runs on the way from a split item's last tile to its count). With the special-function
// unit's exp2 / log2 / reciprocal and merge_info, H200, bf16, 32/8 x 128, page 16, us: 1 x 4096
// 16.2 -> 15.5, 2 x 4096 20.5 -> 19.5, 1 x 16384 29.8 -> 28.9, 16 x 4096 79.3 -> 78.4.
template <typename T, int kHeadDim, int kParts, int kV>
FLASHINFER_DEVICE void write_merged_v(const DecodeParams<T>& p, const Item& it, int qh0, int ng, const float* so,
                                      const float* sm, const float* sd) {
  static_assert(kV % 4 == 0, "float4 rows");
  constexpr int kTx = kHeadDim / kV;
  for (int w = threadIdx.x; w < ng * kTx; w += blockDim.x) {
    const int g = w / kTx, d0 = (w % kTx) * kV;
    float m = neg_inf();
    FLASHINFER_UNROLL
    for (int r = 0; r < kParts; ++r) m = fmaxf(m, sm[r * kDecodeMaxGroup + g]);
    float den = 0.f, acc[kV] = {};
    if (m != neg_inf()) {
      FLASHINFER_UNROLL
      for (int r = 0; r < kParts; ++r) {
        const float wr = fast_exp2(sm[r * kDecodeMaxGroup + g] - m);  // 0 for empty parts
        den += wr * sd[r * kDecodeMaxGroup + g];
        const float4* row = reinterpret_cast<const float4*>(so + (r * kDecodeMaxGroup + g) * kHeadDim + d0);
        FLASHINFER_UNROLL
        for (int q = 0; q < kV / 4; ++q) {
          const float4 v = row[q];
          acc[4 * q + 0] += wr * v.x;
          acc[4 * q + 1] += wr * v.y;
          acc[4 * q + 2] += wr * v.z;
          acc[4 * q + 3] += wr * v.w;
        }
      }
    }
    const float inv = den > 0.f ? fast_rcp(den) : 0.f;
    const float lse = den > 0.f ? m + fast_log2(den) : neg_inf();
    const int h = qh0 + g;
    if (it.slot < 0) {
      Vec<T, kV> ov;
      FLASHINFER_UNROLL
      for (int e = 0; e < kV; ++e) ov.v[e] = from_float<T>(acc[e] * inv);
      const DecodeQuery qr = decode_query(h, p.num_qo_heads, p.group_size, p.q_len, 0);
      ov.store(p.o + decode_row_offset(qr, it.request, p.q_len, p.o_stride_n, p.o_stride_h) + d0);
      if (p.lse && d0 == 0) p.lse[decode_lse_index(qr, it.request, p.q_len)] = lse;
    } else {
      float4* po = reinterpret_cast<float4*>(p.partial_o + (it.slot * p.num_qo_heads + h) * int64_t{kHeadDim} + d0);
      FLASHINFER_UNROLL
      for (int q = 0; q < kV / 4; ++q)
        po[q] = make_float4(acc[4 * q] * inv, acc[4 * q + 1] * inv, acc[4 * q + 2] * inv, acc[4 * q + 3] * inv);
      if (d0 == 0) p.partial_lse[it.slot * p.num_qo_heads + h] = lse;
    }
  }
}
template <typename T, int kHeadDim, int kParts>
FLASHINFER_DEVICE void write_merged(const DecodeParams<T>& p, const Item& it, int qh0, int ng, const float* so,
                                    const float* sm, const float* sd, const DecodeMergeInfo mi) {
  if (ng * (kHeadDim / 8) < static_cast<int>(blockDim.x))
    write_merged_v<T, kHeadDim, kParts, 4>(p, it, qh0, ng, so, sm, sd);
  else
    write_merged_v<T, kHeadDim, kParts, 8>(p, it, qh0, ng, so, sm, sd);
  if (mi.num_chunks > 0) merge_if_last<T, kHeadDim>(p, it, qh0, ng, mi);
}

}  // namespace detail

// Folds the partial states of split requests, one (request, q head) row per CTA at a time
// (grid-stride; rows of requests with one chunk were written directly and are skipped). The
// row's n slots are spread over kLanes = 128 / (kHeadDim / 8) slot lanes: lane l merges slots l,
// l + kLanes, ... (merge_partials: 8 per L2 round trip), so up to 8 kLanes slots (64 at head_dim
// 128) take one round trip, where one 16-thread group per row took ceil(n / 8) dependent ones.
// The lanes' states then meet in shared memory and fold with state.h's weights. H200, bf16, 32/8
// heads x 128, us (16-thread groups -> slot lanes): single decode 32768 49.3 -> 47.3 (CUDA
// cores 58.1 -> 55.9), 16384 30.1 -> 29.7, 4096 17.0 -> 16.6.
template <typename T, int kHeadDim>
__global__ void __launch_bounds__(kDecodeThreads) DecodeMergeKernel(const DecodeParams<T> p) {
  constexpr int kTx = kHeadDim / 8;
  constexpr int kLanes = kDecodeThreads / kTx;
  static_assert(kLanes >= 1 && kDecodeThreads % kTx == 0, "slot lanes");
  __shared__ float so[kLanes][kHeadDim];
  __shared__ float sl[kLanes];
  const int tx = threadIdx.x % kTx, lane = threadIdx.x / kTx;
  pdl_wait();
  const int64_t rows = p.batch_size * p.num_qo_heads;
  for (int64_t r = blockIdx.x; r < rows; r += gridDim.x) {
    const int64_t b = r / p.num_qo_heads, h = r % p.num_qo_heads;
    int64_t begin, n;
    if (p.merge) {
      begin = p.merge[b].partial_begin;
      n = p.merge[b].num_chunks;
    } else {
      begin = 0;
      n = p.implicit_chunks;
    }
    if (n <= 1) continue;  // (the same for the whole CTA)
    const int64_t mine = n > lane ? (n - lane + kLanes - 1) / kLanes : 0;
    float o[8];
    const float lse = detail::merge_partials<kHeadDim, 8>(p.partial_o, p.partial_lse, p.num_qo_heads, begin + lane,
                                                          mine, h, tx * 8, o, kLanes);
    FLASHINFER_UNROLL
    for (int e = 0; e < 8; ++e) so[lane][tx * 8 + e] = o[e];
    if (tx == 0) sl[lane] = lse;
    __syncthreads();
    float m = neg_inf();
    FLASHINFER_UNROLL
    for (int l = 0; l < kLanes; ++l) m = fmaxf(m, sl[l]);
    float w[kLanes], den = 0.f;
    FLASHINFER_UNROLL
    for (int l = 0; l < kLanes; ++l) {
      w[l] = m == neg_inf() ? 0.f : fast_exp2(sl[l] - m);  // 0 for empty lanes
      den += w[l];
    }
    const float inv = den > 0.f ? fast_rcp(den) : 0.f;
    const DecodeQuery qr = decode_query(static_cast<int>(h), p.num_qo_heads, p.group_size, p.q_len, 0);
    T* orow = p.o + decode_row_offset(qr, b, p.q_len, p.o_stride_n, p.o_stride_h);
    for (int d = threadIdx.x; d < kHeadDim; d += kDecodeThreads) {
      float acc = 0.f;
      FLASHINFER_UNROLL
      for (int l = 0; l < kLanes; ++l) acc += w[l] * so[l][d];
      orow[d] = from_float<T>(acc * inv);
    }
    if (p.lse && threadIdx.x == 0) p.lse[decode_lse_index(qr, b, p.q_len)] = den > 0.f ? m + fast_log2(den) : neg_inf();
    __syncthreads();  // so / sl are rewritten by the next row
  }
  pdl_launch_dependents();
}
}  // namespace attention
}  // namespace flashinfer
