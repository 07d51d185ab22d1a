// DeepSeek MLA on the prefill kernel (PrefillVO::kMla): the launch shape and the split-KV plan.
// Pure C++17; the launch is in mla.cuh.
//
// Every query head attends one latent KV "head": K = [ckv || kpe] (512 + 64 or 512 columns),
// V = ckv. Packed rows are token * num_heads + head (prefill's GQA packing with one KV head),
// in 64-row work items (request, row tile) of prefill_plan_batch. A CTA is two warp groups
// over one item's rows, each computing mla_vo_cols of V / O's 512 columns.
//
// Split-KV: decode batches have few items (128 heads x 1 token = 2 items a request), far fewer
// CTAs than SMs. The plan then cuts every request's keys into `chunks` pieces of whole tiles
// (mla_chunk_keys, prefill.h); each (item, chunk) writes a partial state (o normalized, base-2
// lse) and a merge (cascade's MergeStates) combines the chunks of each (row, head).
#pragma once

#include <cstdint>
#include <vector>

#include "../config.h"
#include "prefill.h"

namespace flashinfer {
namespace attention {

// A chunk's keys, at least (256: 4 tiles, the pipeline fills). FLASHINFER_MLA_MIN_CHUNK_KEYS: an
// A/B knob (a multiple of kPrefillKeys).
#ifndef FLASHINFER_MLA_MIN_CHUNK_KEYS
#define FLASHINFER_MLA_MIN_CHUNK_KEYS 256
#endif
constexpr int kMlaMinChunkKeys = FLASHINFER_MLA_MIN_CHUNK_KEYS;
static_assert(kMlaMinChunkKeys % kPrefillKeys == 0, "MLA chunks are whole tiles");
constexpr int kMlaMaxChunks = 64;

// V / O columns per warp: 128 (two CTAs of two warp groups per work item) while those CTAs fit
// one wave on the SMs, else 256 (one CTA: every warp recomputes its rows' 576-wide scores, so
// fewer column groups do less MMA work in all, but a CTA takes longer).
FLASHINFER_HOST_DEVICE constexpr int mla_vo_cols(int64_t num_items, int num_sms) {
  return num_items * (kMlaHeadDimCkv / (2 * kPrefillVoPart)) > num_sms ? 2 * kPrefillVoPart : kPrefillVoPart;
}

// Chunks per request: as many as bring the items to one wave of CTAs, floor(num_sms / items), at
// most max_kv_len / kMlaMinChunkKeys and kMlaMaxChunks. One CTA per (item, chunk) at 256 columns
// a warp does 1.7x less MMA work than two at 128 (mla_vo_cols), so chunks fill the SMs with the
// wide CTAs; only where the keys run short do narrow ones remain. (Session 19's first rule,
// ceil(num_sms / (2 items)), overshot one wave of narrow CTAs into fewer wide ones: batch 16 x
// 128 heads got 3 chunks, 96 CTAs of 22 tiles, where 4 give 128 CTAs of 16.)
FLASHINFER_HOST_DEVICE constexpr int mla_num_chunks(int64_t num_items, int64_t max_kv_len, int num_sms) {
  if (num_items <= 0) return 1;
  const int64_t want = num_sms / num_items;
  const int64_t by_keys = max_kv_len / kMlaMinChunkKeys;
  int64_t c = want < by_keys ? want : by_keys;
  c = c < kMlaMaxChunks ? c : kMlaMaxChunks;
  return c > 1 ? static_cast<int>(c) : 1;
}

// Where split-KV's merge writes: o [total_q, num_heads, 512] and the lse (prefill.h).
template <typename T>
using MlaMergeOut = PrefillMergeOut<T>;

// The work items of prefill_plan_batch (one M tile) with each row tile t cut into `chunks`
// items of tile field t * chunks + c (PrefillParams::num_chunks).
inline std::vector<int32_t> mla_plan_items(const std::vector<int64_t>& qo_lens, const std::vector<int64_t>& kv_lens,
                                           int num_heads, int chunks) {
  return prefill_split_items(prefill_plan_batch(qo_lens, kv_lens, num_heads, 1), chunks);
}

}  // namespace attention
}  // namespace flashinfer
