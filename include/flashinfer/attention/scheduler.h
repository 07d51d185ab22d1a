// Host planner for batch decode: splits each request's KV into chunks (split-KV /
// flash-decoding) so that the work fills the GPU, and lays out the work list and the
// partial-state slots the kernels read. Pure C++17: the device's SM count is an argument,
// so ctest checks the plan on the CPU.
#pragma once

#include <algorithm>
#include <cstdint>
#include <numeric>
#include <vector>

#include "../config.h"
#include "../status.h"

namespace flashinfer {
namespace attention {

// One CTA-sized piece of decode work: q heads [sub*kMaxGroup, ...) of kv head `kv_head` of
// `request`, over keys [kv_begin, kv_end). slot < 0: the CTA writes the final output;
// otherwise it writes a partial state to partial slot `slot` (see DecodePlan).
struct DecodeWorkItem {
  int32_t request;
  int32_t unit;  // kv_head * sub_groups + sub
  int32_t kv_begin;
  int32_t kv_end;
  int32_t slot;
};
static_assert(sizeof(DecodeWorkItem) == 5 * sizeof(int32_t), "DecodeWorkItem is packed int32s");

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
  int64_t min_chunk = 256;         // keys: below this the merge costs more than it saves
};

struct DecodePlan {
  std::vector<DecodeWorkItem> items;
  std::vector<DecodeMergeInfo> merge;  // [batch_size]
  int64_t chunk_tokens = 0;            // split length chosen (0 = no split)
  int64_t num_partial_states = 0;      // slots; each holds num_qo_heads rows of (o[head_dim], lse)
  bool any_split = false;
  int sub_groups = 1;
};

// kv_lens: keys of each request (0 allowed).
inline DecodePlan plan_decode(const std::vector<int64_t>& kv_lens, const DecodePlanConfig& cfg) {
  DecodePlan plan;
  const int64_t batch = static_cast<int64_t>(kv_lens.size());
  plan.sub_groups = ceil_div(cfg.group_size, cfg.max_group_per_cta);
  const int64_t units = int64_t{cfg.num_kv_heads} * plan.sub_groups;
  int64_t total = 0;
  for (int64_t len : kv_lens) total += len;

  int64_t chunk = 0;  // 0: no split
  if (cfg.fixed_split_tokens > 0) {
    chunk = cfg.fixed_split_tokens;
  } else if (!cfg.disable_split_kv) {
    // Aim at two waves of CTAs so a ragged tail balances; never split below min_chunk.
    const int64_t target = int64_t{2} * cfg.num_sms * cfg.ctas_per_sm;
    const int64_t by_work = ceil_div<int64_t>(total * units, std::max<int64_t>(target, 1));
    chunk = std::max(cfg.min_chunk, by_work);
    chunk = round_up<int64_t>(chunk, std::max<int64_t>(cfg.page_size, 1));
  }
  plan.chunk_tokens = chunk;
  plan.merge.resize(batch);
  int32_t next_slot = 0;
  for (int64_t b = 0; b < batch; ++b) {
    const int64_t len = kv_lens[b];
    const int64_t n = chunk > 0 && len > chunk ? ceil_div(len, chunk) : 1;
    const int64_t step = n > 1 ? ceil_div(len, n) : len;  // balanced chunks
    plan.merge[b] = {n > 1 ? next_slot : -1, static_cast<int32_t>(n)};
    for (int64_t c = 0; c < n; ++c) {
      const int64_t lo = std::min(len, c * step), hi = std::min(len, (c + 1) * step);
      for (int64_t u = 0; u < units; ++u) {
        plan.items.push_back({static_cast<int32_t>(b), static_cast<int32_t>(u), static_cast<int32_t>(lo),
                              static_cast<int32_t>(hi), n > 1 ? static_cast<int32_t>(next_slot + c) : -1});
      }
    }
    if (n > 1) {
      next_slot += static_cast<int32_t>(n);
      plan.any_split = true;
    }
  }
  plan.num_partial_states = next_slot;
  // Longest first: the persistent grid takes items round-robin, so big ones start early.
  std::stable_sort(plan.items.begin(), plan.items.end(), [](const DecodeWorkItem& a, const DecodeWorkItem& b) {
    return (a.kv_end - a.kv_begin) > (b.kv_end - b.kv_begin);
  });
  return plan;
}

}  // namespace attention
}  // namespace flashinfer
