// Prefill attention (many query rows against one request's keys): parameters, validation and
// launch arithmetic. Pure C++17; the kernel is in prefill.cuh.
//
// The score of query row i (token i of qo_len) and key j (of kv_len) for q head h, in the
// kernel's log2 units (spec §1.0): x = q_i . k_j in fp32, s = sm_scale * x, or with a soft cap
// s = cap * tanh(sm_scale * x / cap); ALiBi adds slope_h * (j - i). With d = kv_len - qo_len
// (bottom-right alignment), causal drops keys j > i + d, a sliding window (window_left >= 0)
// keys j < i + d - window_left, a custom mask the keys whose bit (i * kv_len + j, packed
// little-endian within each byte) is 0 (it replaces causal; the window still applies).
// o_i = softmax(s) . v (times v_scale); lse_i = log2(sum exp(s)) (base 2, spec); a row with no
// key gives o = 0 and lse = -inf.
//
// Work: GQA packs the group: KV head kh serves q heads kh * g .. kh * g + g - 1, and the
// kernel sees qo_len * g "packed rows" pr = token * g + (q head - kh * g) per KV head, in tiles
// of kPrefillRows; a CTA runs one (row tile, KV head) pair over the keys its rows can see.
#pragma once

#include <algorithm>
#include <cstdint>
#include <vector>

#include "../config.h"
#include "../status.h"

namespace flashinfer {
namespace attention {

constexpr int kPrefillWarps = 4;
constexpr int kPrefillThreads = kPrefillWarps * 32;
constexpr int kPrefillKeys = 64;      // keys per pipeline stage
constexpr int kPrefillMaxRows = 128;  // packed rows per CTA, at most

// 16-row MMA tiles per warp. Two where the output accumulators fit the registers twice (head
// dims up to 128): every K / V fragment read from shared memory then feeds two MMAs. H200,
// bf16, 32 / 8 heads x 128, causal: 16384 tokens 8200 -> 6720 us, 4096 tokens 568 -> 548
// (benchmarks/NOTES.md, session 17). But CTAs of twice the rows are half as many: below two
// CTAs per SM the grid runs short of work (128 x 4096: 96 -> 146 us), so one tile there.
// FLASHINFER_PREFILL_MAX_M_TILES (1 or 2, default 2) caps it; the planner (binding) and the
// kernels must be built with the same value.
#ifndef FLASHINFER_PREFILL_MAX_M_TILES
#define FLASHINFER_PREFILL_MAX_M_TILES 2
#endif
FLASHINFER_HOST_DEVICE constexpr int prefill_max_m_tiles(int head_dim_qk, int head_dim_vo) {
  return head_dim_qk <= 128 && head_dim_vo <= 128 ? FLASHINFER_PREFILL_MAX_M_TILES : 1;
}
FLASHINFER_HOST_DEVICE constexpr int prefill_rows(int m_tiles) { return kPrefillWarps * 16 * m_tiles; }
FLASHINFER_HOST_DEVICE int prefill_m_tiles(int64_t qo_len, int num_qo_heads, int num_kv_heads, int head_dim_qk,
                                           int head_dim_vo, int num_sms) {
  if (prefill_max_m_tiles(head_dim_qk, head_dim_vo) < 2 || num_kv_heads <= 0) return 1;
  const int64_t rows = qo_len * (num_qo_heads / num_kv_heads);
  const int64_t ctas = ceil_div<int64_t>(rows, prefill_rows(2)) * num_kv_heads;
  return ctas >= int64_t{2} * num_sms ? 2 : 1;
}

// Whether single prefill runs on the warp-specialized kernel (prefill.cuh, FLASHINFER_PREFILL_WS):
// two M tiles at head_dim 128, causal without a custom mask, and a grid of at most
// kPrefillWsMaxCtasPerSm CTAs per SM. H200, bf16, 32 / 8 heads, us (benchmarks/NOTES.md, session
// 23), plain / warp-specialized: causal 2048 142 / 128, 4096 398 / 353 (1024 CTAs); 16384 (4096
// CTAs) 4822 / 4760 in one run but 5074 in another; non-causal 4096 620 / 627; batches slower
// (8 x 2048 ragged 789 / 866): one CTA per SM, whose prologue no other CTA hides.
constexpr int kPrefillWsMaxCtasPerSm = 8;
FLASHINFER_HOST_DEVICE constexpr bool prefill_single_ws(int head_dim_qk, int head_dim_vo, int m_tiles, bool causal,
                                                        bool has_mask, int64_t ctas, int num_sms) {
  return m_tiles == 2 && head_dim_qk == 128 && head_dim_vo == 128 && causal && !has_mask &&
         ctas <= int64_t{kPrefillWsMaxCtasPerSm} * num_sms;
}

// Where a prefill kernel's rows and keys come from: one request, or a batch of work items
// (request, row tile) with ragged or paged keys.
enum class PrefillMode { kSingle, kRagged, kPaged };

// Which V / O columns a CTA computes. kWhole: all head_dim_vo of them. kParts: head_dim_vo 512,
// whose O accumulators do not fit one warp's registers: blockIdx.z picks kPrefillVoPart columns
// of V and O (every part recomputes the scores; the parts of one row tile run side by side, so
// the K tiles they share mostly come from L2). kMla: DeepSeek MLA (paged only): the K row is
// [ckv || kpe] (k, then k_rope), V is K's first head_dim_vo columns (ckv), read from the K tile
// itself, in parts of kPrefillVoPart columns as for kParts.
enum class PrefillVO { kWhole, kParts, kMla };
constexpr int kPrefillVoPart = 128;
// Threads of a CTA: MLA's have two warp groups over the same rows (V / O columns side by side).
FLASHINFER_HOST_DEVICE constexpr int prefill_threads(PrefillVO vo) {
  return vo == PrefillVO::kMla ? 2 * kPrefillThreads : kPrefillThreads;
}
constexpr int kMlaHeadDimCkv = 512;
FLASHINFER_HOST_DEVICE constexpr int prefill_vo_parts(int head_dim_vo) {
  return head_dim_vo > 256 ? head_dim_vo / kPrefillVoPart : 1;
}

template <typename T>
struct PrefillParams {
  const T* q;  // [qo_len, num_qo_heads, head_dim_qk] via q_stride_n / q_stride_h (elements)
  const T* k;  // [kv_len, num_kv_heads, head_dim_qk] via k_stride_n / k_stride_h (NHD or HND)
  const T* v;  // [kv_len, num_kv_heads, head_dim_vo] via v_stride_n / v_stride_h
  T* o;        // [qo_len, num_qo_heads, head_dim_vo] via o_stride_n / o_stride_h
  float* lse;  // [qo_len, num_qo_heads] contiguous, or null
  const uint8_t* mask;  // custom mask bits (qo_len * kv_len, little-endian in each byte), or null
  int64_t q_stride_n, q_stride_h, k_stride_n, k_stride_h, v_stride_n, v_stride_h, o_stride_n, o_stride_h;
  int64_t qo_len, kv_len;
  int num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo;
  bool causal;
  int window_left;   // -1: no window
  float sm_scale;
  float soft_cap;    // 0: none
  bool alibi;
  float v_scale;     // multiplies o (not lse)
  bool pdl;
  // Batch (all null for one request): request b owns q / o / lse rows [qo_indptr[b],
  // qo_indptr[b + 1]) and its keys are either ragged (k / v rows [kv_indptr[b], kv_indptr[b + 1]),
  // page_indices null) or paged (pages page_indices[kv_indptr[b] .. kv_indptr[b + 1]), token t at
  // page t / page_size, entry t % page_size, k + page * k_stride_page + entry * k_stride_n;
  // kv_len = (pages - 1) * page_size + last_page_len[b], 0 without pages). The mask of request b
  // starts at byte mask_indptr[b] (its [qo_len_b, kv_len_b] bits, little-endian). The grid's x
  // runs over `items` (request, row tile) pairs of prefill_plan_batch.
  const int32_t* qo_indptr;
  const int32_t* kv_indptr;
  const int32_t* page_indices;
  const int32_t* last_page_len;
  const int32_t* mask_indptr;
  const int32_t* items;  // [num_items][2]: request, row tile
  int64_t num_items;
  int page_size;
  int64_t k_stride_page, v_stride_page;
  int64_t num_pages;  // pages of the cache tensors (page ids outside [0, num_pages) read as zeros)
  // MLA (PrefillVO::kMla; null otherwise): K row columns [kMlaHeadDimCkv, head_dim_qk) come from
  // k_rope (the kpe cache, one head: page stride kr_stride_page, entry stride kr_stride_n); k
  // holds the ckv cache, which is V too (v unused). Likewise q's: q holds q_nope, q_rope q_pe
  // (token stride qr_stride_n, head stride qr_stride_h).
  const T* k_rope;
  int64_t kr_stride_page, kr_stride_n;
  const T* q_rope;
  int64_t qr_stride_n, qr_stride_h;
  // Split-KV (batch kernels of one M tile; MLA: mla.h): with num_chunks > 1 a work item's row-tile
  // field is tile * num_chunks + chunk, the item sees its request's keys [chunk * c, chunk * c + c)
  // (c = mla_chunk_keys) and writes its partial state at o + chunk * o_stride_c and lse[row *
  // lse_stride_n + chunk * num_qo_heads + head]. Without: num_chunks 0 or 1 (lse rows of
  // num_qo_heads; o_stride_c and lse_stride_n unused).
  int num_chunks;
  int64_t o_stride_c, lse_stride_n;
};

// Split-KV (batch prefill and MLA): the keys of one chunk of a kv_len-key request cut into
// `chunks` (whole tiles).
FLASHINFER_HOST_DEVICE constexpr int64_t mla_chunk_keys(int64_t kv_len, int chunks) {
  return chunks <= 1 ? kv_len : ceil_div<int64_t>(ceil_div<int64_t>(kv_len, chunks), kPrefillKeys) * kPrefillKeys;
}

// Split-KV for batch prefill: a batch whose CTAs (work items x KV heads) leave SMs idle, e.g. a
// cascade's shared prefix (one request, a few query rows, many keys), cuts every request's keys
// into chunks; each (item, chunk) writes a partial state and a merge (cascade's MergeStates)
// combines them. Chunks: as many as bring the CTAs to ctas_per_sm per SM (default 2), with at
// least kPrefillMinChunkKeys keys each, at most kPrefillMaxChunks; 1 (no split) once the CTAs
// fill the SMs. Only kernels of one M tile split (prefill_m_tiles gives those to small grids).
constexpr int kPrefillMinChunkKeys = 512;
constexpr int kPrefillMaxChunks = 64;
FLASHINFER_HOST_DEVICE constexpr int prefill_num_chunks(int64_t ctas, int64_t max_kv_len, int num_sms,
                                                        int ctas_per_sm = 2) {
  if (ctas <= 0 || ctas >= num_sms) return 1;
  int64_t c = int64_t{ctas_per_sm} * num_sms / ctas;
  const int64_t by_keys = max_kv_len / kPrefillMinChunkKeys;
  c = c < by_keys ? c : by_keys;
  c = c < kPrefillMaxChunks ? c : kPrefillMaxChunks;
  return c > 1 ? static_cast<int>(c) : 1;
}

// Where a split launch's merge writes: o [total_q, num_qo_heads, head_dim_vo] (o_stride_n /
// o_stride_h elements) and the base-2 lse [total_q, num_qo_heads] (contiguous).
template <typename T>
struct PrefillMergeOut {
  T* o;
  int64_t o_stride_n, o_stride_h;
  float* lse;
};

// The head-dim pairs the kernels are built for.
FLASHINFER_HOST_DEVICE constexpr bool prefill_head_dims_supported(int head_dim_qk, int head_dim_vo) {
  return (head_dim_qk == head_dim_vo &&
          (head_dim_qk == 64 || head_dim_qk == 128 || head_dim_qk == 256 || head_dim_qk == 512)) ||
         (head_dim_qk == 192 && head_dim_vo == 128);
}
// MLA: [ckv || kpe] keys with head_dim_kpe 64 or 0.
FLASHINFER_HOST_DEVICE constexpr bool mla_head_dims_supported(int head_dim_qk, int head_dim_vo) {
  return head_dim_vo == kMlaHeadDimCkv && (head_dim_qk == kMlaHeadDimCkv + 64 || head_dim_qk == kMlaHeadDimCkv);
}

// Dynamic shared memory of one CTA: the Q tile and two stages of K and V tiles (V's columns: one
// part of head_dim_vo; none for MLA, whose V is read from the K tile).
FLASHINFER_HOST_DEVICE constexpr int64_t prefill_smem_bytes(int head_dim_qk, int head_dim_vo, int m_tiles,
                                                            int elem_bytes = 2, bool mla = false) {
  const int64_t v_cols = mla ? 0 : head_dim_vo / prefill_vo_parts(head_dim_vo);
  return int64_t{elem_bytes} *
         (int64_t{prefill_rows(m_tiles)} * head_dim_qk + 2 * int64_t{kPrefillKeys} * (head_dim_qk + v_cols));
}

// Keys [begin, end) that packed rows [pr_begin, pr_end) can see (end <= begin: none).
struct KeyRange {
  int64_t begin, end;
};
FLASHINFER_HOST_DEVICE KeyRange prefill_key_range(int64_t pr_begin, int64_t pr_end, int group, int64_t qo_len,
                                                        int64_t kv_len, bool causal, int window_left, bool has_mask) {
  const int64_t t_lo = pr_begin / group, t_hi = (pr_end - 1) / group;  // tokens of the rows
  const int64_t delta = kv_len - qo_len;
  int64_t end = kv_len, begin = 0;
  if (causal && !has_mask) end = t_hi + delta + 1 < kv_len ? t_hi + delta + 1 : kv_len;
  if (window_left >= 0) {
    const int64_t lo = t_lo + delta - window_left;
    begin = lo > 0 ? lo : 0;
  }
  if (end < 0) end = 0;
  return {begin, end};
}

// The key tiles (kPrefillKeys keys from kv_first + i * kPrefillKeys, i in [0, n_tiles)) that
// every row of packed rows [pr_begin, pr_end) sees whole: inside kv_len, at or below the first
// row's causal diagonal, at or past the last row's window edge. They form one run [begin, end)
// (empty: end == begin), which the kernel runs without per-key masking. A custom mask leaves no
// such tile (has_mask).
struct TileRange {
  int64_t begin, end;
};
FLASHINFER_HOST_DEVICE TileRange prefill_plain_tiles(int64_t pr_begin, int64_t pr_end, int group, int64_t qo_len,
                                                     int64_t kv_len, bool causal, int window_left, bool has_mask,
                                                     int64_t kv_first, int64_t n_tiles) {
  if (has_mask || n_tiles <= 0 || pr_end <= pr_begin) return {0, 0};
  auto floor_div = [](int64_t a, int64_t b) { return a / b - (a % b != 0 && a < 0 ? 1 : 0); };  // b > 0
  const int64_t t_lo = pr_begin / group, t_hi = (pr_end - 1) / group, delta = kv_len - qo_len;
  int64_t last = kv_len - 1;  // the last key every row sees
  if (causal && t_lo + delta < last) last = t_lo + delta;
  int64_t end = floor_div(last + 1 - kv_first, kPrefillKeys), begin = 0;
  if (window_left >= 0) begin = -floor_div(kv_first - (t_hi + delta - window_left), kPrefillKeys);  // (ceil)
  if (begin < 0) begin = 0;
  if (begin > n_tiles) begin = n_tiles;
  if (end > n_tiles) end = n_tiles;
  if (end < begin) end = begin;
  return {begin, end};
}

// Grid: row tiles of prefill_rows packed rows (x) x KV heads (y).
struct PrefillGrid {
  int64_t row_tiles;
  int kv_heads;
};
FLASHINFER_HOST_DEVICE PrefillGrid prefill_grid(int64_t qo_len, int num_qo_heads, int num_kv_heads, int m_tiles) {
  const int64_t group = num_kv_heads > 0 ? num_qo_heads / num_kv_heads : 0;
  return {ceil_div<int64_t>(qo_len * group, prefill_rows(m_tiles)), num_kv_heads};
}

// Work items with each row tile t cut into `chunks` items of tile field t * chunks + c
// (PrefillParams::num_chunks).
inline std::vector<int32_t> prefill_split_items(const std::vector<int32_t>& base, int chunks) {
  if (chunks <= 1) return base;
  std::vector<int32_t> items;
  items.reserve(base.size() * static_cast<size_t>(chunks));
  for (size_t i = 0; i + 1 < base.size(); i += 2)
    for (int c = 0; c < chunks; ++c) {
      items.push_back(base[i]);
      items.push_back(base[i + 1] * chunks + c);
    }
  return items;
}

// The batch's work items (request, row tile) for packed rows of prefill_rows(m_tiles): every
// row tile of every request once, the requests with the most keys first (their CTAs run
// longest). qo_lens / kv_lens: per request (host copies, as plan() has them).
inline std::vector<int32_t> prefill_plan_batch(const std::vector<int64_t>& qo_lens, const std::vector<int64_t>& kv_lens,
                                               int group, int m_tiles) {
  std::vector<int32_t> order(qo_lens.size());
  for (size_t b = 0; b < order.size(); ++b) order[b] = static_cast<int32_t>(b);
  std::stable_sort(order.begin(), order.end(), [&](int32_t a, int32_t b) { return kv_lens[a] > kv_lens[b]; });
  std::vector<int32_t> items;
  for (int32_t b : order) {
    const int64_t tiles = ceil_div<int64_t>(qo_lens[b] * group, prefill_rows(m_tiles));
    for (int64_t t = tiles - 1; t >= 0; --t) {  // (causal: later rows see more keys)
      items.push_back(b);
      items.push_back(static_cast<int32_t>(t));
    }
  }
  return items;
}

template <typename T>
Status validate(const PrefillParams<T>& p) {
  if (p.qo_len < 0 || p.kv_len < 0 || p.num_qo_heads < 0 || p.num_kv_heads <= 0) return Status::kInvalidArgument;
  if (p.num_qo_heads % p.num_kv_heads != 0) return Status::kInvalidArgument;
  if (!prefill_head_dims_supported(p.head_dim_qk, p.head_dim_vo)) return Status::kUnsupported;
  if (p.window_left < -1) return Status::kInvalidArgument;
  if (!(p.sm_scale == p.sm_scale) || p.soft_cap < 0.f) return Status::kInvalidArgument;
  if (p.qo_len == 0 || p.num_qo_heads == 0) return Status::kSuccess;
  if (!p.q || !p.o || (p.kv_len > 0 && (!p.k || !p.v))) return Status::kInvalidArgument;
  // packed rows and keys are 32-bit in the kernel; the grid's x dimension is < 2^31
  const int64_t group = p.num_qo_heads / p.num_kv_heads;
  if (p.qo_len * group > (int64_t{1} << 31) - 1 - kPrefillMaxRows || p.kv_len > (int64_t{1} << 31) - 1 - kPrefillKeys)
    return Status::kUnsupported;
  if (p.num_kv_heads > 65535) return Status::kUnsupported;
  return Status::kSuccess;
}

// What the batch launch assumes; the binding has already produced friendlier messages. mla:
// the MLA launch (paged, one KV head, mla_head_dims_supported).
template <typename T>
Status validate_batch(const PrefillParams<T>& p, bool mla = false) {
  if (p.num_qo_heads < 0 || p.num_kv_heads <= 0 || p.num_qo_heads % p.num_kv_heads != 0) return Status::kInvalidArgument;
  // (MLA's page_indices may be null: no request has a page)
  if (mla ? !mla_head_dims_supported(p.head_dim_qk, p.head_dim_vo) || p.num_kv_heads != 1 ||
                (p.head_dim_qk > kMlaHeadDimCkv && p.num_items > 0 && (!p.k_rope || !p.q_rope))
          : !prefill_head_dims_supported(p.head_dim_qk, p.head_dim_vo))
    return Status::kUnsupported;
  if (p.window_left < -1 || !(p.sm_scale == p.sm_scale) || p.soft_cap < 0.f) return Status::kInvalidArgument;
  if ((p.num_items < 0) || (p.num_items > (int64_t{1} << 31) - 1) || (p.num_kv_heads > 65535)) return Status::kUnsupported;
  if (p.num_items == 0) return Status::kSuccess;
  if (!p.items || !p.qo_indptr || !p.kv_indptr || !p.q || !p.o || !p.k || !p.v) return Status::kInvalidArgument;
  if (p.mask && !p.mask_indptr) return Status::kInvalidArgument;
  if ((p.page_indices || mla) && (!p.last_page_len || p.page_size <= 0 || p.num_pages < 0)) return Status::kInvalidArgument;
  return Status::kSuccess;
}

}  // namespace attention
}  // namespace flashinfer
