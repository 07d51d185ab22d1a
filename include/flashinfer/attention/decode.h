// Decode attention (one query row per request): parameters, validation and launch
// arithmetic. Pure C++17; kernels in decode.cuh, the work list from scheduler.h.
#pragma once

#include <cstdint>

#include "../config.h"
#include "../device_info.h"
#include "../occupancy.h"
#include "../page.h"
#include "../pos_enc.h"
#include "../status.h"
#include "scheduler.h"

namespace flashinfer {
namespace attention {

// What the K/V pointers of DecodeParams hold: T (the q / o type), or fp8 values that
// dequantize by a plain cast to float (per-tensor k_scale / v_scale fold into sm_scale and the
// output). fp8 caches take the tensor-core kernel at head_dim 128 (decode_tc_takes_fp8), else
// the CUDA-core kernel (decode_uses_tc).
enum class KVCache : int { kSameAsQ = 0, kFp8E4M3 = 1, kFp8E5M2 = 2 };

// Where a request's keys live: a paged cache (page table in `kv`), or one contiguous
// sequence (indices == nullptr: token t at t * stride_n, length contiguous_len).
// Multi-token decode (q_len > 1 query tokens per request, causal, bottom-right aligned) reads
// each request's pages once: its tokens are extra columns next to the q heads. The kernels
// then see q_len x the model's q heads ("columns"): KV head kh owns group_size = q_len * g of
// them, local index l = token * g + j for real q head kh * g + j. q, o and lse keep their
// layout, [batch * q_len rows, real heads]: row b * q_len + token (decode_row_offset). Token
// `token` sits at position kv_len - q_len + token and sees the keys up to it (and, with a
// sliding window, from its position - window_left on).
struct DecodeQuery {
  int head;       // the real q head (ALiBi slope, and with token where q / o / lse rows live)
  int num_heads;  // the real q heads
  int token;      // the request's query token (0 with one)
  int64_t pos;    // the query's position: keys <= pos are visible
};
FLASHINFER_HOST_DEVICE DecodeQuery decode_query(int head, int num_qo_heads, int group_size, int q_len,
                                                int64_t kv_len) {
  if (q_len <= 1) return {head, num_qo_heads, 0, kv_len - 1};
  const int g = group_size / q_len, kh = head / group_size, l = head % group_size;
  return {kh * g + l % g, num_qo_heads / q_len, l / g, kv_len - q_len + l / g};
}
// Where a query's row lives: in q / o (row stride sn, head stride sh) and in lse.
FLASHINFER_HOST_DEVICE int64_t decode_row_offset(const DecodeQuery& q, int64_t request, int q_len, int64_t sn,
                                                 int64_t sh) {
  return (request * (q_len > 1 ? q_len : 1) + q.token) * sn + int64_t{q.head} * sh;
}
FLASHINFER_HOST_DEVICE int64_t decode_lse_index(const DecodeQuery& q, int64_t request, int q_len) {
  return (request * (q_len > 1 ? q_len : 1) + q.token) * q.num_heads + q.head;
}

template <typename T>
struct DecodeParams {
  const T* q;  // [batch * q_len, num_qo_heads / q_len, head_dim] via q_stride_n / q_stride_h
  int64_t q_stride_n, q_stride_h;
  PagedKV<const T, int32_t> kv;  // k_data/v_data + page table; stride_* describe K (in cache elements)
  KVCache kv_cache;              // kSameAsQ: k_data / v_data hold T; fp8: they point at fp8 bytes
  int64_t v_stride_page, v_stride_n, v_stride_h;  // V may have its own strides
  int64_t num_pages;         // pages of the cache tensors (0: unknown; the box copies need it)
  int64_t contiguous_len;    // >= 0: single contiguous sequence of this length (indices unused)
  const int32_t* seq_lens;   // [batch] or null: overrides the page-table lengths
  T* o;                      // as q, via o_stride_n / o_stride_h
  int64_t o_stride_n, o_stride_h;
  float* lse;                // [batch * q_len, num_qo_heads / q_len] (contiguous) or null
  // Work: an explicit list (batch) or an implicit uniform split of request 0 (single decode).
  const DecodeWorkItem* items;  // [*num_items] or null
  const int32_t* num_items;     // device scalar (read by the persistent grid)
  int64_t num_items_host;       // > 0: the same count, known at launch (0: unknown, as under CUDA graphs)
  int64_t kv_keys_host;         // > 0: keys of all requests (the plan's), known at launch (0: unknown)
  int64_t implicit_chunk;       // items == null: keys per chunk of request 0
  int64_t implicit_chunks;      // items == null: number of chunks
  const DecodeMergeInfo* merge;  // [batch] (explicit) or null
  float* partial_o;    // [slots, num_qo_heads, head_dim], 16-byte aligned (float4 stores and loads)
  float* partial_lse;  // [slots, num_qo_heads]
  // [batch, num_kv_heads * sub_groups] zero-initialised counters, or null. When given, the
  // CTA that writes the last partial state of a (request, q-head unit) merges the request's
  // partial states itself (and resets the counter) instead of DecodeMergeKernel.
  int32_t* merge_counters;
  int64_t batch_size;
  int num_qo_heads, num_kv_heads, group_size, sub_groups;  // with q_len > 1: per token column (decode_query)
  int q_len;  // query tokens per request (0 or 1: one)
  int head_dim;
  float sm_scale;
  float soft_cap;       // <= 0: off
  int window_left;      // < 0: off
  PosEncodingMode pos_encoding;
  float rope_scale, rope_theta;
  bool pdl;
  int stages;  // > 0: the plan's pipeline depth (decode_prefers_deep); 0: the launch default
#ifdef FLASHINFER_DECODE_TRACE
  // A diagnostic build only (benchmarks/trace_decode.py): per CTA, kDecodeTraceSlots timestamps
  // (%globaltimer, then clock64) of the tensor-core kernel's stages, or null.
  unsigned long long* trace = nullptr;
#endif

  FLASHINFER_HOST_DEVICE int64_t kv_len(int64_t b) const {
    if (contiguous_len >= 0) return contiguous_len;
    if (seq_lens) return seq_lens[b];
    return kv.length(b);
  }
};

// CTA shape of the decode kernels: 128 threads; on CUDA cores tx = min(32, D / 8) lanes own a
// key's features (8 each, 16 at head_dim 512) and ty = 128 / tx key groups work side by side
// (decode_cc.cuh).
constexpr int kDecodeThreads = 128;
constexpr int kDecodeMaxGroup = 8;  // q heads per CTA (larger groups split into sub-groups)

// Lanes of a CUDA-core key group at head_dim D: one warp at most.
FLASHINFER_HOST_DEVICE constexpr int decode_cc_lanes(int head_dim) { return head_dim / 8 < 32 ? head_dim / 8 : 32; }

// q heads one CTA takes (the sub-group size): 8, or 4 at head_dim 512, where 8 heads' q and o
// (16 floats each per lane) would not fit in registers.
FLASHINFER_HOST_DEVICE constexpr int decode_max_group(int head_dim) { return head_dim > 256 ? 4 : kDecodeMaxGroup; }

// Sub-groups a group of q heads splits into.
FLASHINFER_HOST_DEVICE constexpr int decode_sub_groups(int group_size, int head_dim) {
  return (group_size + decode_max_group(head_dim) - 1) / decode_max_group(head_dim);
}

// fp8 caches on tensor cores: head_dim 128 (rows of 8 swizzled 16-byte chunks), box or cp.async copies.
FLASHINFER_HOST_DEVICE constexpr bool decode_tc_takes_fp8(int head_dim) { return head_dim == 128; }

// Which kernel a call takes: the tensor-core kernel when asked for, except for in-kernel RoPE
// (ROPE_LLAMA), head_dims 256 and 512, and fp8 caches at other head_dims than
// decode_tc_takes_fp8's, which stay on the CUDA-core kernel (the tensor-core kernel is built for
// 64 and 128: its O^T accumulators and q fragments would take 96 / 192 registers per thread at
// 256 / 512).
inline bool decode_uses_tc(bool use_tensor_cores, PosEncodingMode pos, int head_dim,
                           KVCache kv = KVCache::kSameAsQ) {
  return use_tensor_cores && pos != PosEncodingMode::kRoPELlama && head_dim <= 128 &&
         (kv == KVCache::kSameAsQ || decode_tc_takes_fp8(head_dim));
}

// The per-CTA q-head bucket a group size compiles to at head_dim D: 1, 2, 4 or 8 (at most
// decode_max_group(D)).
inline int decode_group_bucket(int group_size, int head_dim) {
  const int g = group_size < decode_max_group(head_dim) ? group_size : decode_max_group(head_dim);
  return g <= 1 ? 1 : g <= 2 ? 2 : g <= 4 ? 4 : 8;
}

// Shared memory for the end-of-item merge across the ty rows (aliases the stages).
inline int64_t decode_merge_smem(int head_dim) {
  const int ty = kDecodeThreads / decode_cc_lanes(head_dim);
  return int64_t{ty} * kDecodeMaxGroup * (head_dim + 2) * 4;
}

template <typename T>
Status validate(const DecodeParams<T>& p) {
  if (p.head_dim != 64 && p.head_dim != 128 && p.head_dim != 256 && p.head_dim != 512) return Status::kUnsupported;
  if (p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) return Status::kInvalidArgument;
  if (p.group_size != p.num_qo_heads / p.num_kv_heads) return Status::kInvalidArgument;
  if (p.sub_groups != decode_sub_groups(p.group_size, p.head_dim)) return Status::kInvalidArgument;
  if (p.q_len > 1 && p.group_size % p.q_len != 0) return Status::kInvalidArgument;
  if (!p.items && (p.implicit_chunk <= 0 || p.implicit_chunks <= 0)) return Status::kInvalidArgument;
  if (p.contiguous_len < 0 && (!p.kv.indptr || !p.kv.indices || !p.kv.last_page_len)) return Status::kInvalidArgument;
  return Status::kSuccess;
}

}  // namespace attention
}  // namespace flashinfer
