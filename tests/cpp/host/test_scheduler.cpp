// plan_decode(): every (request, q-head unit, key) is covered exactly once, chunks respect the
// split length, partial slots are disjoint, and fixed/disabled splits are batch-invariant.
// decode_query(): multi-token columns map onto (real q head, token) one to one.
#include <algorithm>
#include <cstdint>
#include <functional>
#include <initializer_list>
#include <map>
#include <random>
#include <vector>
#include <cstdio>

#include "check.h"
#include "flashinfer/attention/decode.h"
#include "flashinfer/attention/scheduler.h"

using namespace flashinfer::attention;
using flashinfer::ceil_div;
using flashinfer::round_up;

static void check_plan(const std::vector<int64_t>& lens, const DecodePlanConfig& cfg) {
  // page-table starts as a page table of these lengths would have them (indptr[b])
  std::vector<int64_t> begins(lens.size());
  int64_t next = 0;
  for (size_t b = 0; b < lens.size(); ++b) begins[b] = next, next += ceil_div<int64_t>(lens[b], 16);
  const DecodePlan p = plan_decode(lens, cfg, begins);
  const int64_t units = int64_t{cfg.num_kv_heads} * p.sub_groups;
  CHECK(p.sub_groups * cfg.max_group_per_cta >= cfg.group_size);
  CHECK((p.sub_groups - 1) * cfg.max_group_per_cta < cfg.group_size);
  // per (request, unit): its key ranges, which must tile [0, len) exactly; empty requests
  // still get one (empty) item per unit
  std::map<std::pair<int64_t, int64_t>, std::vector<std::pair<int64_t, int64_t>>> ranges;
  std::vector<int> slot_uses(p.num_partial_states, 0);
  for (const DecodeWorkItem& it : p.items) {
    CHECK(it.request >= 0 && it.request < int64_t(lens.size()));
    CHECK(it.unit >= 0 && it.unit < units);
    CHECK(0 <= it.kv_begin && it.kv_begin <= it.kv_end && it.kv_end <= lens[it.request]);
    if (p.chunk_tokens > 0) CHECK(it.kv_end - it.kv_begin <= p.chunk_tokens);
    CHECK(it.kv_begin % kDecodeChunkAlign == 0);  // the tensor-core kernel's box copies start on a page
    CHECK(it.kv_len == lens[it.request] && it.page_begin == begins[it.request]);  // what the kernels read
    ranges[{it.request, it.unit}].push_back({it.kv_begin, it.kv_end});
    const DecodeMergeInfo& m = p.merge[it.request];
    if (m.num_chunks > 1) {
      CHECK(it.slot >= m.partial_begin && it.slot < m.partial_begin + m.num_chunks);
      if (it.unit == 0) slot_uses[it.slot]++;
    } else {
      CHECK(it.slot == -1);
    }
  }
  for (size_t b = 0; b < lens.size(); ++b) {
    for (int64_t u = 0; u < units; ++u) {
      auto r = ranges[{int64_t(b), u}];
      CHECK(int64_t(r.size()) == p.merge[b].num_chunks);
      std::sort(r.begin(), r.end());
      int64_t pos = 0;
      for (const auto& [lo, hi] : r) {
        CHECK(lo == pos);  // no gap, no overlap
        pos = hi;
      }
      CHECK(pos == lens[b]);
    }
  }
  for (int uses : slot_uses) CHECK(uses == 1);  // each slot is one chunk of one request
  for (size_t i = 1; i < p.items.size(); ++i)
    CHECK(p.items[i - 1].kv_end - p.items[i - 1].kv_begin >= p.items[i].kv_end - p.items[i].kv_begin);
}

// decode_makespan against a direct simulation: every item listed, sorted longest first, CTA 0
// taking items 0, slots, 2 slots, ...
static int64_t makespan_direct(const std::vector<int64_t>& lens, int64_t units, int64_t chunk, int64_t slots,
                               int64_t cost) {
  std::vector<int64_t> items;
  int64_t max_chunks = 1;
  for (int64_t len : lens) {
    int64_t n, step;
    decode_split(len, chunk, &n, &step);
    max_chunks = std::max(max_chunks, n);
    for (int64_t c = 0; c < n; ++c)
      for (int64_t u = 0; u < units; ++u) items.push_back(std::min(len, (c + 1) * step) - std::min(len, c * step));
  }
  std::sort(items.begin(), items.end(), std::greater<int64_t>());
  int64_t t = 0;
  for (size_t i = 0; i < items.size(); i += static_cast<size_t>(slots)) t += items[i] + cost;
  if (max_chunks > 1) t += ceil_div<int64_t>(max_chunks, 16) * (cost / 4);
  return t;
}

// Multi-token decode's columns (decode.h decode_query): KV head kh's q_len * g columns are each
// (real q head of kh's group, token) once, token t at position kv_len - q_len + t; q_len 1 is
// the identity with position kv_len - 1.
static void check_decode_query() {
  for (int kvh : {1, 3, 8})
    for (int g : {1, 2, 4, 7})
      for (int n : {1, 2, 5}) {
        const int group = g * n, cols = kvh * group;
        const int64_t kv_len = 1000;
        std::map<std::pair<int, int64_t>, int> seen;
        for (int c = 0; c < cols; ++c) {
          const DecodeQuery q = decode_query(c, cols, group, n, kv_len);
          CHECK(q.num_heads == kvh * g);
          CHECK(q.head / g == c / group);  // a head of the column's KV head
          CHECK(q.pos >= kv_len - n && q.pos <= kv_len - 1);
          CHECK(q.token == q.pos - (kv_len - n));
          // request 2's rows 2n .. 3n - 1 of [batch * n, real heads] (and of lse)
          const int64_t off = decode_row_offset(q, 2, n, int64_t{kvh} * g * 10, 10);
          CHECK(off == ((2 * n + q.token) * kvh * g + q.head) * 10);
          CHECK(decode_lse_index(q, 2, n) == (2 * n + q.token) * kvh * g + q.head);
          ++seen[{q.head, q.pos}];
        }
        CHECK(static_cast<int>(seen.size()) == cols);  // one to one
        if (n == 1)
          for (int c = 0; c < cols; ++c) CHECK(decode_query(c, cols, group, 1, kv_len).head == c);
      }
  CHECK(decode_query(5, 8, 8, 0, 7).pos == 6);  // q_len 0 (zero-initialised params) is one token
}

// The tensor-core kernel's shortest split: 256 KiB of K and V per chunk, whole tiles. A plan
// built with it balances a request's chunks, so a chunk (but a request's last) is longer than
// half of it.
static void check_tc_min_chunk() {
  CHECK(decode_tc_min_chunk(128, 2) == 512);
  CHECK(decode_tc_min_chunk(128, 1) == 1024);
  CHECK(decode_tc_min_chunk(64, 2) == 1024);
  CHECK(decode_tc_min_chunk(256, 2) == 256);
  CHECK(decode_tc_min_chunk(512, 2) == 128);
  CHECK(decode_tc_min_chunk(8192, 2) == kDecodeChunkAlign);  // never below a tile
  CHECK(decode_min_chunk(true, 128, 1, 128) == 1024);
  CHECK(decode_min_chunk(true, 512, 2, 256) == 256);  // never below the default
  CHECK(decode_min_chunk(false, 128, 2, 128) == kDecodeCcMinChunk);
  CHECK(decode_min_chunk(false, 256, 2, 128) == kDecodeCcMinChunk);
  CHECK(decode_min_chunk(false, 128, 1, 128) == 128);  // fp8 on CUDA cores keeps the default
  // The CUDA-core floor is capped at the keys of two items per SM (rounded up to the chunk
  // alignment), never below the default; tensor-core floors are not capped.
  CHECK(decode_min_chunk(false, 128, 2, 128, int64_t{4096} * 8, 132) == 128);     // 1 x 4096: 125 -> 128
  CHECK(decode_min_chunk(false, 128, 2, 128, int64_t{16384} * 8, 132) == 512);    // 1 x 16384: 497 -> 512
  CHECK(decode_min_chunk(false, 128, 2, 128, int64_t{32768} * 8, 132) == 1024);   // 1 x 32768: 993 -> 1024
  CHECK(decode_min_chunk(false, 128, 2, 128, int64_t{16384} * 8, 66) == 1024);    // 993 -> 1024
  CHECK(decode_min_chunk(false, 128, 2, 128, int64_t{65536} * 8, 132) == kDecodeCcMinChunk);
  CHECK(decode_min_chunk(false, 128, 2, 256, int64_t{4096} * 8, 132) == 256);
  CHECK(decode_min_chunk(true, 128, 1, 128, int64_t{4096} * 8, 132) == 1024);
  DecodePlanConfig cfg;
  cfg.num_sms = 132, cfg.ctas_per_sm = 4, cfg.num_kv_heads = 8, cfg.group_size = 4, cfg.page_size = 16;
  cfg.min_chunk = decode_tc_min_chunk(128, 1);
  std::mt19937 rng(11);
  std::vector<std::vector<int64_t>> cases{{32768}, std::vector<int64_t>(24, 4096), {5000, 70000, 3}, {1100}};
  for (int i = 0; i < 40; ++i) {
    std::vector<int64_t> lens(1 + rng() % 40);
    for (auto& l : lens) l = rng() % 40000;
    cases.push_back(lens);
  }
  for (const auto& lens : cases) {
    const DecodePlan p = plan_decode(lens, cfg);
    for (const DecodeWorkItem& it : p.items)
      if (it.kv_end < it.kv_len) CHECK(2 * (it.kv_end - it.kv_begin) > cfg.min_chunk);
    check_plan(lens, cfg);
  }
  CHECK(plan_decode({32768}, cfg).chunk_tokens == 1024);  // 256 items of 1024 keys, not 512 of 512
}

// Who merges: the plan's requests of more than kDecodeInKernelMergeChunks chunks send the whole
// launch to DecodeMergeKernel; unsplit and lightly split plans merge in the decode kernel.
static void check_merge_choice() {
  DecodePlanConfig cfg;
  cfg.num_kv_heads = 8, cfg.group_size = 4, cfg.ctas_per_sm = 3, cfg.min_chunk = 512;
  for (int64_t fixed : {int64_t{64}, int64_t{256}, int64_t{1024}, int64_t{4096}}) {
    cfg.fixed_split_tokens = fixed;
    for (const std::vector<int64_t>& lens : {std::vector<int64_t>{32768}, std::vector<int64_t>{4096, 0, 17},
                                             std::vector<int64_t>{1024, 1024}, std::vector<int64_t>{}}) {
      const DecodePlan p = plan_decode(lens, cfg);
      int32_t most = 1;
      for (const DecodeMergeInfo& m : p.merge) most = std::max(most, m.num_chunks);
      CHECK(decode_merges_in_kernel(p) == (most <= kDecodeInKernelMergeChunks));
      // more than kDecodeMergeKernelMaxBatch requests: in-kernel whatever the chunk counts
      std::vector<int64_t> many(kDecodeMergeKernelMaxBatch + 1, 5);
      many.insert(many.end(), lens.begin(), lens.end());
      CHECK(decode_merges_in_kernel(plan_decode(many, cfg)));
    }
  }
  cfg.fixed_split_tokens = 0;
  CHECK(decode_merges_in_kernel(plan_decode({4096}, cfg)));                // 8 chunks of 512 keys
  CHECK(decode_merges_in_kernel(plan_decode(std::vector<int64_t>(64, 2048), cfg)));
  cfg.fixed_split_tokens = 1024;
  CHECK(!decode_merges_in_kernel(plan_decode({32768}, cfg)));              // 32 chunks
  std::vector<int64_t> sixteen(kDecodeMergeKernelMaxBatch, 5);
  sixteen[3] = 32768;
  CHECK(!decode_merges_in_kernel(plan_decode(sixteen, cfg)));              // 16 requests, one of 32 chunks
  sixteen.push_back(5);
  CHECK(decode_merges_in_kernel(plan_decode(sixteen, cfg)));               // 17 requests
  cfg.fixed_split_tokens = 2048;
  CHECK(decode_merges_in_kernel(plan_decode({32768}, cfg)));               // 16 chunks
}

// The capped CUDA-core floor never leaves SMs idle that the default floor would have used: a
// plan with it has at least min(num_sms, items at the default) work items, at any CTAs per SM.
// (Uncapped, 1 x 4096 got 32 items for 132 SMs and ran 2.3x slower.)
static void check_cc_floor_reaches_sms() {
  const std::vector<std::vector<int64_t>> batches = {
      {4096}, {16384}, {32768}, {8192, 8192}, {4096, 4096, 4096, 4096}, std::vector<int64_t>(16, 1024),
      std::vector<int64_t>(8, 4096), {100000}, {777, 5000, 12000}, std::vector<int64_t>(64, 2048)};
  for (int num_sms : {132, 78, 16})
    for (int ctas : {2, 3, 4})
      for (int kv_heads : {1, 8})
        for (const auto& lens : batches) {
          DecodePlanConfig c;
          c.num_sms = num_sms, c.ctas_per_sm = ctas, c.num_kv_heads = kv_heads, c.group_size = 4, c.page_size = 16;
          const int64_t dflt_items = static_cast<int64_t>(plan_decode(lens, c, {}).items.size());
          int64_t keys = 0;
          for (int64_t len : lens) keys += len;
          c.min_chunk = decode_min_chunk(false, 128, 2, c.min_chunk, keys * kv_heads, num_sms);
          CHECK(c.min_chunk >= 128 && c.min_chunk <= kDecodeCcMinChunk);
          const int64_t items = static_cast<int64_t>(plan_decode(lens, c, {}).items.size());
          CHECK(items >= std::min<int64_t>(num_sms, dflt_items));
        }
}

int main() {
  check_decode_query();
  check_tc_min_chunk();
  check_cc_floor_reaches_sms();
  check_merge_choice();
  std::mt19937 rng(5);
  // The run sort (radix for long lists, std::sort for short): a permutation, longest first.
  for (int it = 0; it < 300; ++it) {
    const size_t n = rng() % 3 == 0 ? rng() % 64 : 256 + rng() % 3000;
    const int kind = rng() % 3;  // uniform, two lengths, spread
    std::vector<uint64_t> runs(n), tmp;
    for (auto& r : runs) {
      const uint64_t len = kind == 0 ? 1024 : kind == 1 ? (rng() % 2 ? 512 : 4096) : rng() % (1u << 31);
      r = len << 32 | (1 + rng() % 1000);
    }
    std::vector<uint64_t> sorted = runs;
    sort_runs_longest_first(&sorted, &tmp);
    for (size_t i = 1; i < n; ++i) CHECK((sorted[i - 1] >> 32) >= (sorted[i] >> 32));
    std::vector<uint64_t> a = runs, b = sorted;
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    CHECK(a == b);
  }
  for (int it = 0; it < 200; ++it) {
    std::vector<int64_t> lens(1 + rng() % 400);
    for (auto& l : lens) l = rng() % 2 ? 4096 : int64_t(rng() % 9000);
    const int64_t units = 1 + rng() % 8, slots = 1 + rng() % 500, chunk = (rng() % 4) * 640, cost = 96;
    CHECK(decode_makespan(lens, units, chunk, slots, cost) == makespan_direct(lens, units, chunk, slots, cost));
  }
  DecodePlanConfig cfg;
  for (int group : {1, 4, 8, 12, 32}) {
    for (int heads : {1, 8}) {
      cfg.group_size = group;
      cfg.num_kv_heads = heads;
      check_plan({32768}, cfg);                    // one long request: must split
      check_plan({0, 0, 0}, cfg);                  // all empty
      check_plan({1, 15, 511, 2048, 16384, 0}, cfg);  // ragged with an empty request
      std::vector<int64_t> lens(64);
      for (auto& l : lens) l = rng() % 5000;
      check_plan(lens, cfg);
    }
  }
  // Small work takes the deep pipeline; a decode step of 16 x 4096 does not.
  CHECK(decode_prefers_deep({4096}, 8, 132));
  CHECK(decode_prefers_deep({1024, 1024, 1024, 1024}, 8, 132));
  CHECK(!decode_prefers_deep(std::vector<int64_t>(16, 4096), 8, 132));
  CHECK(!decode_prefers_deep({32768}, 8, 132));
  // ... planned at 4 stages (one CTA per SM), launched at 2 where measured (head_dim 128, 2-byte caches)
  CHECK(decode_deep_launch_stages(128, 2) == 2);
  CHECK(decode_deep_launch_stages(128, 1) == kDecodeDeepStages && decode_deep_launch_stages(64, 2) == kDecodeDeepStages);
  CHECK(decode_deep_launch_stages(256, 2) == kDecodeDeepStages);
  // The wide launch shape (3 CTAs x 2 stages per SM instead of 2 x 3) where its plan gives a CTA
  // no more split items: the measured winners of benchmarks/NOTES.md (Llama-3-8B heads, page 16).
  {
    DecodePlanConfig d;
    d.num_sms = 132, d.num_kv_heads = 8, d.group_size = 4, d.page_size = 16;
    auto wide_wins = [&](int64_t batch, int64_t len) {
      DecodePlanConfig n = d, w = d;
      n.ctas_per_sm = 2, w.ctas_per_sm = 3;
      const std::vector<int64_t> lens(batch, len);
      return decode_prefers_wide(plan_decode(lens, n), 264, plan_decode(lens, w), 396);
    };
    CHECK(wide_wins(24, 4096) && wide_wins(48, 2048) && wide_wins(16, 4096) && wide_wins(128, 1024));
    CHECK(!wide_wins(64, 2048) && !wide_wins(256, 1024) && !wide_wins(128, 8192) && !wide_wins(32, 1024));
    DecodePlan unsplit, split;
    unsplit.items.assign(10, DecodeWorkItem{0, 0, 0, 64, -1, 64, 0, 0});
    split.items.assign(10, DecodeWorkItem{0, 0, 0, 64, 3, 128, 0, 0});
    CHECK(decode_split_items_per_slot(unsplit, 4) == 0 && decode_split_items_per_slot(split, 4) == 3);
    CHECK(decode_prefers_wide(split, 4, split, 5) && !decode_prefers_wide(split, 5, split, 3));
  }
  // One long request fills the GPU.
  cfg.group_size = 4;
  cfg.num_kv_heads = 8;
  {
    const DecodePlan p = plan_decode({32768}, cfg);
    CHECK(p.any_split);
    CHECK(int64_t(p.items.size()) * 10 >= int64_t{cfg.num_sms} * cfg.ctas_per_sm * 9);  // ~ one full wave
  }
  // The chosen split is never modelled slower than no split or than any chunking of the
  // longest request into 1..16 pieces; a uniform batch that quantizes badly into waves
  // (128 x 8192 on 132 x 3 slots: 2.6 waves unsplit) gets split.
  cfg.ctas_per_sm = 3;
  for (const auto& lens : std::vector<std::vector<int64_t>>{std::vector<int64_t>(128, 8192), {32768}, {4096},
                                                          std::vector<int64_t>(16, 4096), std::vector<int64_t>(64, 2048),
                                                          std::vector<int64_t>(256, 1024), {1, 15, 511, 2048, 16384, 0}}) {
    for (int64_t ps : {1, 16}) {
      cfg.page_size = ps;
      const int64_t units = cfg.num_kv_heads, slots = int64_t{cfg.num_sms} * cfg.ctas_per_sm;
      const DecodePlan p = plan_decode(lens, cfg);
      const int64_t t = decode_makespan(lens, units, p.chunk_tokens, slots, cfg.item_cost);
      CHECK(t <= decode_makespan(lens, units, 0, slots, cfg.item_cost));
      int64_t longest = *std::max_element(lens.begin(), lens.end());
      for (int64_t n = 1; n <= 16; ++n) {
        const int64_t c = round_up<int64_t>(std::max<int64_t>(cfg.min_chunk, ceil_div<int64_t>(longest, n)), ps);
        if (!(t <= decode_makespan(lens, units, c, slots, cfg.item_cost) * 105 / 100)) printf("lens %zu x %ld ps %ld n %ld c %ld: %ld vs chosen %ld (chunk %ld)\n", lens.size(), lens[0], ps, n, c, decode_makespan(lens, units, c, slots, cfg.item_cost), t, p.chunk_tokens);
        CHECK(t <= decode_makespan(lens, units, c, slots, cfg.item_cost) * 105 / 100);
      }
      check_plan(lens, cfg);
    }
  }
  cfg.page_size = 1;
  {
    const DecodePlan p = plan_decode(std::vector<int64_t>(128, 8192), cfg);
    CHECK(p.any_split);
  }
  // makespan model: 396 equal items on 396 slots take one item's time; 397 take two.
  CHECK(decode_makespan(std::vector<int64_t>(396, 100), 1, 0, 396, 10) == 110);
  CHECK(decode_makespan(std::vector<int64_t>(397, 100), 1, 0, 396, 10) == 220);
  // 1000 keys at chunk 128: 8 chunks of 128 keys (the last 104), one merge round
  CHECK(decode_makespan({1000}, 1, 128, 396, 8) == 128 + 8 + 2);
  // chunk starts are tile-aligned: 1000 keys in 3 balanced chunks are 384 + 384 + 232
  {
    int64_t n = 0, step = 0;
    decode_split(1000, 384, &n, &step);
    CHECK(n == 3 && step == 384);
    decode_split(1000, 448, &n, &step);  // ceil(1000 / 3) = 334 -> 384
    CHECK(n == 3 && step == 384);
    decode_split(100, 0, &n, &step);
    CHECK(n == 1 && step == 100);
  }
  // disable_split_kv / fixed split: a request's items do not depend on the rest of the batch.
  for (bool fixed : {false, true}) {
    DecodePlanConfig c = cfg;
    c.disable_split_kv = !fixed;
    c.fixed_split_tokens = fixed ? 2048 : 0;
    const DecodePlan alone = plan_decode({9000}, c);
    const DecodePlan with_others = plan_decode({5, 9000, 70000, 0}, c);
    std::vector<std::pair<int, int>> a, b;
    for (const auto& it : alone.items) a.push_back({it.kv_begin, it.kv_end});
    for (const auto& it : with_others.items)
      if (it.request == 1) b.push_back({it.kv_begin, it.kv_end});
    std::sort(a.begin(), a.end());
    std::sort(b.begin(), b.end());
    CHECK(a == b);
    check_plan({5, 9000, 70000, 0}, c);
  }
  return test::finish("test_scheduler");
}
