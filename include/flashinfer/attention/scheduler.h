// Host planner for batch decode: splits each request's KV into chunks (split-KV /
// flash-decoding) so that the work fills the GPU, and lays out the work list and the
// partial-state slots the kernels read. Pure C++17: the device's SM count is an argument,
// so ctest checks the plan on the CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <functional>
#include <numeric>
#include <vector>

#include "../config.h"
#include "../status.h"

namespace flashinfer {
namespace attention {

// One CTA-sized piece of decode work: q heads [sub*kMaxGroup, ...) of kv head `kv_head` of
// `request`, over keys [kv_begin, kv_end). slot < 0: the CTA writes the final output;
// otherwise it writes a partial state to partial slot `slot` (see DecodePlan). The request's
// key count and first page-table entry ride along: a CTA loads the item, then its page ids,
// then copies (no separate loads of the lengths and indptr in between).
struct DecodeWorkItem {
  int32_t request;
  int32_t unit;  // kv_head * sub_groups + sub
  int32_t kv_begin;
  int32_t kv_end;
  int32_t slot;
  int32_t kv_len;      // keys of the request
  int32_t page_begin;  // indptr[request]: the request's first entry of the page table
  int32_t reserved;    // (32 bytes: one sector per item)
};
static_assert(sizeof(DecodeWorkItem) == 8 * sizeof(int32_t), "DecodeWorkItem is packed int32s");
constexpr int kDecodeWorkItemInts = 8;

// Per request: its chunks own partial slots [partial_begin, partial_begin + num_chunks)
// (times num_qo_heads rows each) when num_chunks > 1.
struct DecodeMergeInfo {
  int32_t partial_begin;
  int32_t num_chunks;
};

struct DecodePlanConfig {
  int num_sms = 132;
  int ctas_per_sm = 4;      // decode CTAs resident per SM (occupancy of the decode kernel)
  int num_kv_heads = 1;
  int group_size = 1;       // q heads per kv head
  int max_group_per_cta = 8;
  int64_t page_size = 1;
  bool disable_split_kv = false;
  int64_t fixed_split_tokens = 0;  // > 0: every request splits at this many keys (batch-invariant)
  int64_t min_chunk = 128;         // keys: below this the merge costs more than it saves
  int waves = 0;                   // > 0: aim at this many CTA waves instead of searching
  int64_t item_cost = 96;          // fixed cost of one work item (fill, epilogue), in keys
};

struct DecodePlan {
  std::vector<DecodeWorkItem> items;
  std::vector<DecodeMergeInfo> merge;  // [batch_size]
  int64_t chunk_tokens = 0;            // split length chosen (0 = no split)
  int64_t num_partial_states = 0;      // slots; each holds num_qo_heads rows of (o[head_dim], lse)
  bool any_split = false;
  int sub_groups = 1;
};

// Chunks a request of len keys splits into at chunk length `chunk` (0: no split), before
// alignment (decode_split).
inline int64_t decode_num_chunks(int64_t len, int64_t chunk) { return chunk > 0 && len > chunk ? ceil_div(len, chunk) : 1; }

// Chunk starts are multiples of this many keys: a tile of the tensor-core kernel, so that its
// box copies (whole pages) start on a page.
constexpr int64_t kDecodeChunkAlign = 64;

// How a request of len keys splits at chunk length `chunk` (a multiple of kDecodeChunkAlign):
// n chunks of `step` keys (the last one shorter), step the balanced length rounded up to
// kDecodeChunkAlign (so still <= chunk).
inline void decode_split(int64_t len, int64_t chunk, int64_t* n, int64_t* step) {
  const int64_t c = decode_num_chunks(len, chunk);
  if (c <= 1) {
    *n = 1, *step = len;
    return;
  }
  *step = round_up<int64_t>(ceil_div(len, c), kDecodeChunkAlign);
  *n = ceil_div(len, *step);
}

// Sorts packed (length << 32 | count) run keys by length, longest first (equal lengths in any
// order). Long lists take an LSD radix sort over the length bits: 4 passes of 8 bits (lengths
// are < 2^31), each skipped when all keys share its digit, as in uniform batches. Short lists
// take std::sort. plan() runs this for every split candidate; with a thousand requests the
// sort was most of the planner's time.
inline void sort_runs_longest_first(std::vector<uint64_t>* runs, std::vector<uint64_t>* tmp) {
  const size_t n = runs->size();
  if (n < 256) {
    std::sort(runs->begin(), runs->end(), std::greater<uint64_t>());
    return;
  }
  tmp->resize(n);
  uint64_t* src = runs->data();
  uint64_t* dst = tmp->data();
  for (int shift = 32; shift < 64; shift += 8) {
    uint32_t start[256] = {};
    for (size_t i = 0; i < n; ++i) ++start[(src[i] >> shift) & 255];
    if (start[(src[0] >> shift) & 255] == n) continue;  // one digit: nothing moves
    uint32_t sum = 0;  // descending digits: bucket 255 first
    for (int b = 255; b >= 0; --b) {
      const uint32_t c = start[b];
      start[b] = sum;
      sum += c;
    }
    for (size_t i = 0; i < n; ++i) dst[start[(src[i] >> shift) & 255]++] = src[i];
    std::swap(src, dst);
  }
  if (src != runs->data()) std::copy(src, src + n, runs->data());
}

// Modelled run time, in keys, of the work items a split produces: the kernels walk the
// items longest first with a static stride of `slots` (the persistent grid), so CTA 0 is
// the last to finish and runs items 0, slots, 2 slots, ... of the sorted list; each item
// costs its keys plus item_cost. A split request also waits for its merge, which reads
// 16 chunks per L2 round trip (~ item_cost / 4 each).
inline int64_t decode_makespan(const std::vector<int64_t>& kv_lens, int64_t units, int64_t chunk, int64_t slots,
                               int64_t item_cost, std::vector<uint64_t>* scratch = nullptr,
                               std::vector<uint64_t>* scratch2 = nullptr) {
  // Runs of equal-length items as (length << 32 | count): ordering the packed keys by length
  // is all the walk below needs. Lengths are < 2^31 (int32 items); counts are at most
  // (len / min_chunk) x units, far below 2^32 for any real cache.
  std::vector<uint64_t> local, local2;
  std::vector<uint64_t>& runs = scratch ? *scratch : local;
  runs.clear();
  int64_t max_chunks = 1;
  for (int64_t len : kv_lens) {
    int64_t n, step;
    decode_split(len, chunk, &n, &step);
    max_chunks = std::max(max_chunks, n);
    if (n > 1) runs.push_back(static_cast<uint64_t>(step) << 32 | static_cast<uint64_t>((n - 1) * units));
    runs.push_back(static_cast<uint64_t>(len - (n - 1) * step) << 32 | static_cast<uint64_t>(units));
  }
  sort_runs_longest_first(&runs, scratch2 ? scratch2 : &local2);
  int64_t t = 0, pos = 0, next = 0;  // next: index of CTA 0's next item in the sorted list
  const int64_t stride = std::max<int64_t>(slots, 1);
  for (const uint64_t r : runs) {
    const int64_t len = static_cast<int64_t>(r >> 32), count = static_cast<int64_t>(r & 0xffffffffu);
    if (next < pos + count) {  // CTA 0's items in this run: next, next + stride, ... < pos + count
      const int64_t k = ceil_div<int64_t>(pos + count - next, stride);
      t += k * (len + item_cost);
      next += k * stride;
    }
    pos += count;
  }
  if (max_chunks > 1) t += ceil_div<int64_t>(max_chunks, 16) * (item_cost / 4);
  return t;
}

// Picks the split length: the candidate with the smallest modelled run time among no split,
// the lengths that fill 1..8 waves of CTAs, and the lengths that cut the longest request
// into 2..16 chunks (never below min_chunk; page- and tile-aligned). Ties go to the longer chunk
// (fewer items and merges).
inline int64_t choose_decode_chunk(const std::vector<int64_t>& kv_lens, int64_t units, const DecodePlanConfig& cfg) {
  const int64_t slots = std::max<int64_t>(int64_t{cfg.num_sms} * cfg.ctas_per_sm, 1);
  const int64_t ps = std::max<int64_t>(cfg.page_size, 1);
  int64_t total = 0, longest = 0;
  for (int64_t len : kv_lens) total += len, longest = std::max(longest, len);
  auto legal = [&](int64_t c) {
    return round_up<int64_t>(round_up<int64_t>(std::max(cfg.min_chunk, c), ps), kDecodeChunkAlign);
  };
  if (cfg.waves > 0) return legal(ceil_div<int64_t>(total * units, int64_t{cfg.waves} * slots));
  std::vector<int64_t> cands{0};
  const int64_t work_items = units * static_cast<int64_t>(kv_lens.size());
  for (int64_t w = 1; w <= 8; ++w) {
    cands.push_back(legal(ceil_div<int64_t>(total * units, w * slots)));
    // as many chunks per request as w waves hold (uniform batches fill the waves exactly)
    const int64_t n = w * slots / std::max<int64_t>(work_items, 1);
    if (n >= 2) cands.push_back(legal(ceil_div<int64_t>(longest, n)));
  }
  for (int64_t n = 2; n <= 16; ++n) cands.push_back(legal(ceil_div<int64_t>(longest, n)));
  for (int64_t& c : cands)
    if (c >= longest) c = 0;  // no request splits: the same plan as no split
  std::sort(cands.begin(), cands.end());
  cands.erase(std::unique(cands.begin(), cands.end()), cands.end());
  int64_t best = 0, best_t = -1;
  std::vector<uint64_t> scratch, scratch2;
  scratch.reserve(2 * kv_lens.size());
  for (int64_t c : cands) {
    const int64_t t = decode_makespan(kv_lens, units, c, slots, cfg.item_cost, &scratch, &scratch2);
    if (best_t < 0 || t < best_t || (t == best_t && (c == 0 || (best != 0 && c > best)))) best = c, best_t = t;
  }
  return best;
}

// Small work (at most kDecodeDeepKeysPerSM keys x kv heads per SM) is latency-bound: one CTA
// per SM with a deeper pipeline (all of an item's tiles in flight at once) beats two CTAs of
// three stages. H200, bf16, 32/8 heads x 128, page 16 (us, deep vs not): 1 x 4096 (248 keys
// per SM) 16.8 vs 19.2, single decode 4096 17.3 vs 19.7; at 993 per SM 1 x 16384 31.8 vs
// 32.9, single 16384 30.5 vs 32.9, 16 x 1024 31.2 vs 32.5, but 8 x 2048 34.3 vs 33.2 and
// 4 x 4096 31.4 vs 30.8; at 1986 per SM (8 x 4096, 32 x 1024) deep loses 5-12%.
// The deep plans are planned at kDecodeDeepStages (4 stages of a head_dim 128 fp16 / bf16 CTA
// leave room for one CTA per SM: its chunks are one SM's share) and launched at
// decode_deep_launch_stages. At head_dim 128 with fp16 / bf16 caches two stages beat four on the
// same chunks: the first wave asks for a third of the bytes, so a CTA's first tile lands sooner,
// and deeper pipelines measured slower here each time (sessions 25-26: 5, 6, 7 stages; 64 CTAs
// of 512 keys at 4-7 stages 20.5-21.4 us at 1 x 4096). H200, bf16, 32/8 heads x 128, page 16, us
// (4 / 3 / 2 stages): 1 x 4096 17.6-17.8 / 17.6-17.8 / 16.8, 4 x 1024 17.8-18.0 / 17.2-17.3 /
// 16.3-17.0, 1 x 8192 22.4-22.6 / 21.4-21.5 / 21.7, 1 x 16384 31.2 / 31.0 / 30.7, 2 x 4096 21.7-22.0
// / 21.5-21.9 / 21.8; single decode 4096 16.8-17.0 / 17.0-17.2 / 17.1. Other head_dims and fp8
// caches (not measured) keep 4.
constexpr int64_t kDecodeDeepKeysPerSM = 1024;
constexpr int kDecodeDeepStages = 4;
constexpr int kDecodeDeepLaunchStages = 2;
inline int decode_deep_launch_stages(int head_dim, int kv_elem_bytes) {
  return head_dim == 128 && kv_elem_bytes == 2 ? kDecodeDeepLaunchStages : kDecodeDeepStages;
}
inline bool decode_prefers_deep(const std::vector<int64_t>& kv_lens, int num_kv_heads, int num_sms,
                                int64_t keys_per_sm = kDecodeDeepKeysPerSM) {
  int64_t total = 0;
  for (int64_t len : kv_lens) total += len;
  return total * num_kv_heads <= keys_per_sm * std::max(num_sms, 1);
}

// The tensor-core kernel's min_chunk outside the deep plans, as K and V bytes of one KV head:
// kDecodeTcMinChunkBytes, i.e. 512 keys of fp16 / bf16 at head_dim 128 and 1024 keys of fp8 at
// 128 or of fp16 / bf16 at 64 (balanced chunks are longer than half of it). The makespan model
// gives every CTA slot bandwidth of its own, so where 4 CTAs fit per SM (fp8 caches, head_dim
// 64) it cut requests into chunks half as long as at 2 CTAs: more partial states and more
// per-item cost while each SM moves the same bytes. H200, 32/8 heads, page 16, one run, us
// (min_chunk 128 -> this): e4m3 1 x 32768 37.4 -> 33.4, single decode 32768 38.9 -> 34.5,
// 2 x 16384 34.9 -> 32.5, 24 x 4096 82.3 -> 69.0, 48 x 2048 82.4 -> 66.9; bf16 head_dim 64
// 1 x 32768 34.6 -> 31.1, 24 x 4096 76.3 -> 66.5. Unchanged: e4m3 64 x 2048 and 256 x 1024 (no
// split) and the bf16 head_dim 128 goal cases (their chunks were already this long).
constexpr int64_t kDecodeTcMinChunkBytes = int64_t{256} << 10;
inline int64_t decode_tc_min_chunk(int head_dim, int kv_elem_bytes) {
  const int64_t key_bytes = int64_t{2} * std::max(head_dim, 1) * std::max(kv_elem_bytes, 1);  // K + V
  return std::max<int64_t>(kDecodeChunkAlign, kDecodeTcMinChunkBytes / key_bytes);
}

// The CUDA-core kernel's min_chunk: kDecodeCcMinChunk keys for fp16 / bf16 caches at every
// head_dim; fp8 caches keep the default. H200, 32/8 heads, page 16, one run, us (128 -> 1024
// keys): bf16 head_dim 128 1 x 32768 61.1 -> 58.5, single decode 32768 61.9 -> 57.8, 24 x 4096
// 144.5 -> 128.9, 8 x 4096 58.0 -> 57.2; head_dim 256 1 x 32768 105.2 -> 100.8; head_dim 64
// 42.3 -> 40.8; 16 x 4096, 64 x 2048 and 4 x 16384 within 1%. At 512 keys no plan moved. An e4m3
// cache lost at 1024 (1 x 32768 47.4 -> 52.1). The floor is capped at the keys of two items per
// SM (decode_min_chunk). Uncapped, small work left SMs idle: bf16 at 4 CTAs per SM (528 slots),
// us, uncapped -> capped: 1 x 4096 43.8 -> 19.2, single decode 4096 39.2 -> 20.2, 4 x 4096 45.7
// -> 37.5, 1 x 16384 46.1 -> 39.2, 16 x 1024 43.3 -> 37.9. A cap at four items per SM (every
// slot; chunks half as long) measured 1-2 us slower at 1 x 16384, 2 x 8192, 4 x 4096 and 1 x
// 32768, and one item per SM (the 1024-key floor at 1 x 16384) 7 us slower (session 15).
constexpr int64_t kDecodeCcMinChunk = 1024;

// The planner's min_chunk for a decode launch (beyond the tensor-core deep plans, which keep
// the default): the kernel's floor above, never below `dflt`. work_keys (sum of kv_lens x KV
// heads) and num_sms, when given, cap the CUDA-core floor at the keys of two items per SM
// (rounded up to kDecodeChunkAlign), so small work still reaches every SM.
inline int64_t decode_min_chunk(bool tensor_cores, int head_dim, int kv_elem_bytes, int64_t dflt,
                                int64_t work_keys = 0, int num_sms = 0) {
  int64_t floor = tensor_cores ? decode_tc_min_chunk(head_dim, kv_elem_bytes)
                               : (kv_elem_bytes >= 2 ? kDecodeCcMinChunk : dflt);
  if (!tensor_cores && work_keys > 0 && num_sms > 0)
    floor = std::min(floor, round_up<int64_t>(ceil_div<int64_t>(work_keys, int64_t{2} * num_sms), kDecodeChunkAlign));
  return std::max(floor, dflt);
}

// Work items that write a partial state (split requests' chunks), per CTA of `slots`, rounded up.
inline int64_t decode_split_items_per_slot(const DecodePlan& plan, int64_t slots) {
  int64_t split = 0;
  for (const DecodeWorkItem& it : plan.items) split += it.slot >= 0;
  return ceil_div<int64_t>(split, std::max<int64_t>(slots, 1));
}

// The tensor-core kernel's plan-time launch shape for work too large for the deep pipeline:
// the default (kDecodeTCStages = 3 stages, 2 CTAs per SM on the H200 at head_dim 128) or a
// wide one (kDecodeWideStages = 2 stages, 3 CTAs per SM). The planner plans for both; the wide
// one is taken when its plan gives a CTA no more split items than the default's does. Measured
// on the H200 (bf16, 32/8 heads x 128, page 16, us, default vs wide; benchmarks/NOTES.md,
// sessions 8-9): where the wide plan splits no more it wins (24 x 4096 126.4 vs 109.8, 48 x
// 2048 127.0 vs 106.5, 16 x 4096 82.1 vs 79.8, 128 x 1024 145.4 vs 141.9); where it needs more
// split items it loses 2-7 us per extra split item per CTA (64 x 2048 144.6 vs 155.5, 256 x
// 1024 271 vs 301, 128 x 8192 1000 vs 1026): a split item's partial state, merge and shorter
// chunk cost more than the planner's item_cost charges.
constexpr int kDecodeWideStages = 2;
inline bool decode_prefers_wide(const DecodePlan& dflt, int64_t dflt_slots, const DecodePlan& wide,
                                int64_t wide_slots) {
  return decode_split_items_per_slot(wide, wide_slots) <= decode_split_items_per_slot(dflt, dflt_slots);
}

// Who merges the partial states of split requests: the CTA that writes a (request, unit)'s last
// one (merge_if_last, decode.cuh: no second launch) or DecodeMergeKernel. The in-kernel merge has
// one CTA's 128 threads for all heads of a unit and reads 16 slots per L2 round trip, so a
// request of more chunks waits for several dependent round trips; DecodeMergeKernel spreads a
// row's slots over a CTA (64 per round trip at head_dim 128). Plans whose requests have more
// than kDecodeInKernelMergeChunks chunks take the kernel. H200, bf16, 32/8 heads x 128, page 16,
// us (in-kernel -> kernel): 1 x 32768 (47 chunks) 50.7 -> 47.8, 2 x 16384 49.3 -> 47.7; where
// requests have at most 16 chunks the kernel loses (1 x 4096 17.2 -> 17.7, 16 x 4096 80.7 ->
// 83.6). FLASHINFER_DECODE_MERGE=last|kernel (bindings) overrides. Batches of more than
// kDecodeMergeKernelMaxBatch requests keep the in-kernel merge: the kernel's CTAs walk the
// batch's rows one at a time, each step a dependent load of the row's merge record, which a
// long request among hundreds of unsplit ones would pay a few dozen times per CTA (not measured).
constexpr int32_t kDecodeInKernelMergeChunks = 16;
constexpr size_t kDecodeMergeKernelMaxBatch = 16;
inline bool decode_merges_in_kernel(const DecodePlan& plan) {
  if (plan.merge.size() > kDecodeMergeKernelMaxBatch) return true;
  for (const DecodeMergeInfo& m : plan.merge)
    if (m.num_chunks > kDecodeInKernelMergeChunks) return false;
  return true;
}

// kv_lens: keys of each request (0 allowed); page_begins: each request's first page-table
// entry (indptr[b]), or empty (items then carry 0: a contiguous cache).
inline DecodePlan plan_decode(const std::vector<int64_t>& kv_lens, const DecodePlanConfig& cfg,
                              const std::vector<int64_t>& page_begins = {}) {
  DecodePlan plan;
  const int64_t batch = static_cast<int64_t>(kv_lens.size());
  plan.sub_groups = ceil_div(cfg.group_size, cfg.max_group_per_cta);
  const int64_t units = int64_t{cfg.num_kv_heads} * plan.sub_groups;

  int64_t chunk = 0;  // 0: no split
  if (cfg.fixed_split_tokens > 0) {
    chunk = round_up<int64_t>(cfg.fixed_split_tokens, kDecodeChunkAlign);
  } else if (!cfg.disable_split_kv) {
    chunk = choose_decode_chunk(kv_lens, units, cfg);
  }
  plan.chunk_tokens = chunk;
  plan.merge.resize(batch);
  // One record per (request, chunk), its units expanded after the sort: all units of a chunk
  // have its length, so sorting chunks (stably, longest first) and then listing each chunk's
  // units in order gives the item order a stable sort of the items would.
  std::vector<DecodeWorkItem> chunks;
  chunks.reserve(static_cast<size_t>(batch));
  int32_t next_slot = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = kv_lens[b];
    int64_t n, step;  // balanced, aligned chunks
    decode_split(len, chunk, &n, &step);
    plan.merge[b] = {n > 1 ? next_slot : -1, static_cast<int32_t>(n)};
    const int32_t page_begin = page_begins.empty() ? 0 : static_cast<int32_t>(page_begins[b]);
    for (int64_t c = 0; c < n; ++c) {
      const int64_t lo = std::min(len, c * step), hi = std::min(len, (c + 1) * step);
      chunks.push_back({static_cast<int32_t>(b), 0, static_cast<int32_t>(lo), static_cast<int32_t>(hi),
                        n > 1 ? static_cast<int32_t>(next_slot + c) : -1, static_cast<int32_t>(len), page_begin, 0});
    }
    if (n > 1) {
      next_slot += static_cast<int32_t>(n);
      plan.any_split = true;
    }
  }
  plan.num_partial_states = next_slot;
  // Longest first: the persistent grid takes items round-robin, so big ones start early.
  std::stable_sort(chunks.begin(), chunks.end(), [](const DecodeWorkItem& a, const DecodeWorkItem& b) {
    return (a.kv_end - a.kv_begin) > (b.kv_end - b.kv_begin);
  });
  plan.items.reserve(chunks.size() * static_cast<size_t>(units));
  for (const DecodeWorkItem& ch : chunks) {
    for (int64_t u = 0; u < units; ++u) {
      plan.items.push_back(ch);
      plan.items.back().unit = static_cast<int32_t>(u);
    }
  }
  return plan;
}

}  // namespace attention
}  // namespace flashinfer
