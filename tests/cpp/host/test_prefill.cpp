// attention/prefill.h: the key range a tile of packed rows can see (against a direct scan of
// the mask rules), the grid, shared-memory sizes and validate().
#include <algorithm>
#include <cstdint>
#include <cstdio>
#include <vector>

#include "check.h"
#include "flashinfer/attention/mla.h"
#include "flashinfer/attention/prefill.h"

using namespace flashinfer::attention;

namespace {

// Does token `t` see key j? (spec §1.0 rule 5, with no custom mask)
bool visible(int64_t t, int64_t j, int64_t qo_len, int64_t kv_len, bool causal, int window_left) {
  const int64_t diag = t + kv_len - qo_len;
  if (j < 0 || j >= kv_len) return false;
  if (causal && j > diag) return false;
  if (window_left >= 0 && j < diag - window_left) return false;
  return true;
}

void test_key_range() {
  for (int64_t qo_len : {1, 5, 64, 70, 130}) {
    for (int64_t kv_len : {0, 1, 37, 64, 130, 300}) {
      for (int group : {1, 3, 4}) {
        for (bool causal : {false, true}) {
          for (int wl : {-1, 0, 5, 100}) {
            for (bool mask : {false, true}) {
              const int64_t rows = qo_len * group;
              for (int64_t pr0 = 0; pr0 < rows; pr0 += prefill_rows(1)) {
                const int64_t pr1 = std::min(rows, pr0 + prefill_rows(1 + (pr0 / prefill_rows(1)) % 2));
                const KeyRange r = prefill_key_range(pr0, pr1, group, qo_len, kv_len, causal, wl, mask);
                CHECK(r.begin >= 0 && r.end <= kv_len);
                // every key some row of the tile sees lies in [begin, end)
                for (int64_t pr = pr0; pr < pr1; ++pr) {
                  const int64_t t = pr / group;
                  for (int64_t j = 0; j < kv_len; ++j) {
                    // a custom mask replaces causal: any key may be visible
                    const bool vis = visible(t, j, qo_len, kv_len, causal && !mask, wl);
                    if (vis) CHECK(j >= r.begin && j < r.end);
                  }
                }
                // and the range is tight: its first and last keys are seen by some row
                if (r.end > r.begin) {
                  bool first = false, last = false;
                  for (int64_t pr = pr0; pr < pr1; ++pr) {
                    const int64_t t = pr / group;
                    first = first || visible(t, r.begin, qo_len, kv_len, causal && !mask, wl);
                    last = last || visible(t, r.end - 1, qo_len, kv_len, causal && !mask, wl);
                  }
                  CHECK(first && last);
                }
              }
            }
          }
        }
      }
    }
  }
}

// prefill_plain_tiles: exactly the key tiles of the row range's [begin, end) range (from
// prefill_key_range, as the kernel forms it) that every one of its rows sees whole.
void test_plain_tiles() {
  for (int64_t qo_len : {1, 5, 64, 70, 130, 300}) {
    for (int64_t kv_len : {0, 1, 37, 64, 130, 300, 500}) {
      for (int group : {1, 3, 4}) {
        for (bool causal : {false, true}) {
          for (int wl : {-1, 0, 5, 63, 64, 100}) {
            for (bool mask : {false, true}) {
              const int64_t rows = qo_len * group;
              for (int64_t pr0 = 0; pr0 < rows; pr0 += prefill_rows(1)) {
                const int64_t pr1 = std::min(rows, pr0 + prefill_rows(1 + (pr0 / prefill_rows(1)) % 2));
                const KeyRange r = prefill_key_range(pr0, pr1, group, qo_len, kv_len, causal, wl, mask);
                const int64_t kv_first = r.begin / kPrefillKeys * kPrefillKeys;
                const int64_t n_tiles = r.end > kv_first ? (r.end - kv_first + kPrefillKeys - 1) / kPrefillKeys : 0;
                const TileRange pl =
                    prefill_plain_tiles(pr0, pr1, group, qo_len, kv_len, causal, wl, mask, kv_first, n_tiles);
                CHECK(pl.begin >= 0 && pl.begin <= pl.end && pl.end <= std::max<int64_t>(n_tiles, 0));
                for (int64_t i = 0; i < n_tiles; ++i) {
                  bool whole = !mask;
                  for (int64_t pr = pr0; pr < pr1 && whole; ++pr)
                    for (int64_t j = kv_first + i * kPrefillKeys; j < kv_first + (i + 1) * kPrefillKeys && whole; ++j)
                      whole = j < kv_len && visible(pr / group, j, qo_len, kv_len, causal, wl);
                  CHECK(whole == (i >= pl.begin && i < pl.end));
                }
              }
            }
          }
        }
      }
    }
  }
}

void test_grid_and_smem() {
  CHECK(prefill_rows(1) == 64 && prefill_rows(2) == 128 && prefill_rows(2) == kPrefillMaxRows);
  CHECK(prefill_grid(1, 32, 8, 1).row_tiles == 1 && prefill_grid(1, 32, 8, 1).kv_heads == 8);
  CHECK(prefill_grid(16, 32, 8, 1).row_tiles == 1);  // 16 tokens x 4 heads = 64 packed rows
  CHECK(prefill_grid(17, 32, 8, 1).row_tiles == 2);
  CHECK(prefill_grid(17, 32, 8, 2).row_tiles == 1);
  CHECK(prefill_grid(4096, 28, 4, 1).row_tiles == 4096 * 7 / 64);
  CHECK(prefill_grid(4096, 28, 4, 2).row_tiles == 4096 * 7 / 128);
  // Q tile + two stages of K and V tiles, 2-byte elements
  CHECK(prefill_smem_bytes(128, 128, 1) == 2 * (64 * 128 + 2 * 64 * 256));
  CHECK(prefill_smem_bytes(128, 128, 2) == 2 * (128 * 128 + 2 * 64 * 256));
  CHECK(prefill_smem_bytes(256, 256, 1) <= 227 * 1024);  // fits an sm_90 CTA
  CHECK(prefill_smem_bytes(192, 128, 1) == 2 * (64 * 192 + 2 * 64 * 320));
  for (int dqk : {32, 64, 96, 128, 192, 256, 512, 576})
    for (int dvo : {64, 128, 256, 512}) {
      CHECK(prefill_head_dims_supported(dqk, dvo) ==
            ((dqk == dvo && (dqk == 64 || dqk == 128 || dqk == 256 || dqk == 512)) || (dqk == 192 && dvo == 128)));
      CHECK(mla_head_dims_supported(dqk, dvo) == (dvo == 512 && (dqk == 576 || dqk == 512)));
    }
  // head_dim_vo 512 runs in four parts of 128 V / O columns: V stages of one part
  CHECK(prefill_vo_parts(512) == 4 && prefill_vo_parts(256) == 1 && prefill_vo_parts(128) == 1);
  CHECK(prefill_smem_bytes(512, 512, 1) == 2 * (64 * 512 + 2 * 64 * (512 + 128)));
  // MLA: Q [64, 576] and two [64, 576] K stages; V is read from the K tile
  CHECK(prefill_smem_bytes(576, 512, 1, 2, true) == 2 * (64 * 576 + 2 * 64 * 576));
  // both fit an sm_90 CTA's 227 KB with the paged kernels' 2 KB table of row addresses, and MLA
  // with split scores' 8 KB P tile and two groups' row maxima (64 floats each) too
  CHECK(prefill_smem_bytes(512, 512, 1) + 2048 <= 227 * 1024);
  CHECK(prefill_smem_bytes(576, 512, 1, 2, true) + 2048 + 64 * 64 * 2 + 2 * 64 * 4 <= 227 * 1024);
  // wgmma kernels: 1024 bytes of alignment slack (whole columns); MLA's static arrays padded to
  // 11 KB instead (sP 8 KB, sMax 1 KB, page table 2 KB), no slack
  CHECK(prefill_smem_bytes(256, 256, 1) + 1024 <= 227 * 1024);
  CHECK(prefill_smem_bytes(128, 128, 2) + 1024 <= 227 * 1024 / 2);  // (two CTAs per SM)
  CHECK(prefill_smem_bytes(576, 512, 1, 2, true) + 8192 + 1024 + 2048 <= 227 * 1024);
  // FLASHINFER_PREFILL_WG_OVERLAP=2 adds a third K buffer at one M tile
  CHECK(prefill_smem_bytes(256, 256, 1) + 1024 + 64 * 256 * 2 <= 227 * 1024);
  CHECK(prefill_smem_bytes(128, 128, 1) + 1024 + 64 * 128 * 2 <= 227 * 1024 / 2);
  // two M tiles: head dims <= 128, and only where the grid of 128-row CTAs fills 2 per SM
  CHECK(prefill_max_m_tiles(64, 64) == 2 && prefill_max_m_tiles(128, 128) == 2);
  CHECK(prefill_max_m_tiles(256, 256) == 1 && prefill_max_m_tiles(192, 128) == 1);
  CHECK(prefill_max_m_tiles(512, 512) == 1 && prefill_max_m_tiles(576, 512) == 1);
  // MLA: 128-column parts while they fit one wave of CTAs, 256 beyond (mla.h)
  CHECK(mla_vo_cols(1, 132) == 128 && mla_vo_cols(66, 132) == 128 && mla_vo_cols(67, 132) == 256);
  CHECK(prefill_threads(PrefillVO::kMla) == 2 * kPrefillThreads && prefill_threads(PrefillVO::kParts) == kPrefillThreads);
  // the warp-specialized single-prefill kernel: two M tiles at head_dim 128, causal, no mask, at
  // most kPrefillWsMaxCtasPerSm CTAs per SM
  CHECK(prefill_single_ws(128, 128, 2, true, false, 1024, 132));
  CHECK(prefill_single_ws(128, 128, 2, true, false, int64_t{kPrefillWsMaxCtasPerSm} * 132, 132));
  CHECK(!prefill_single_ws(128, 128, 2, true, false, int64_t{kPrefillWsMaxCtasPerSm} * 132 + 1, 132));
  CHECK(!prefill_single_ws(128, 128, 1, true, false, 64, 132) && !prefill_single_ws(64, 64, 2, true, false, 64, 132));
  CHECK(!prefill_single_ws(128, 128, 2, false, false, 64, 132) && !prefill_single_ws(128, 128, 2, true, true, 64, 132));
  CHECK(!prefill_single_ws(192, 128, 2, true, false, 64, 132));
  CHECK(prefill_m_tiles(4096, 32, 8, 128, 128, 132) == 2);   // 1024 CTAs
  CHECK(prefill_m_tiles(1024, 32, 8, 128, 128, 132) == 1);   // 256 < 264
  CHECK(prefill_m_tiles(1056, 32, 8, 128, 128, 132) == 2);   // 33 x 8 = 264
  CHECK(prefill_m_tiles(128, 32, 8, 128, 128, 132) == 1);
  CHECK(prefill_m_tiles(16384, 32, 8, 256, 256, 132) == 1);
  CHECK(prefill_m_tiles(16384, 32, 8, 192, 128, 132) == 1);
}

// prefill_plan_batch: every row tile of every request once, requests with more keys first.
void test_plan_batch() {
  const std::vector<int64_t> qo{3, 100, 0, 64, 65}, kv{10, 200, 5, 64, 300};
  for (int group : {1, 4, 7}) {
    for (int mt : {1, 2}) {
      const std::vector<int32_t> items = prefill_plan_batch(qo, kv, group, mt);
      CHECK(items.size() % 2 == 0);
      std::vector<std::vector<int>> seen(qo.size());
      int64_t prev_kv = INT64_MAX;
      for (size_t i = 0; i < items.size(); i += 2) {
        const int b = items[i], t = items[i + 1];
        CHECK(b >= 0 && b < static_cast<int>(qo.size()));
        CHECK(t >= 0 && int64_t{t} * prefill_rows(mt) < qo[b] * group);
        CHECK(kv[b] <= prev_kv);
        prev_kv = kv[b];
        seen[b].push_back(t);
      }
      for (size_t b = 0; b < qo.size(); ++b) {
        const int64_t tiles = (qo[b] * group + prefill_rows(mt) - 1) / prefill_rows(mt);
        std::sort(seen[b].begin(), seen[b].end());
        CHECK(static_cast<int64_t>(seen[b].size()) == tiles);
        for (int64_t t = 0; t < static_cast<int64_t>(seen[b].size()); ++t) CHECK(seen[b][t] == t);
      }
    }
  }
  CHECK(prefill_plan_batch({}, {}, 4, 1).empty());
}

void test_validate() {
  using flashinfer::Status;
  PrefillParams<uint16_t> p{};
  static uint16_t buf[16];
  p.q = p.k = p.v = buf;
  p.o = buf;
  p.qo_len = 4, p.kv_len = 9, p.num_qo_heads = 8, p.num_kv_heads = 2, p.head_dim_qk = p.head_dim_vo = 128;
  p.window_left = -1, p.sm_scale = 0.1f, p.v_scale = 1.f;
  CHECK(validate(p) == Status::kSuccess);
  PrefillParams<uint16_t> b = p;
  b.num_qo_heads = 7;  // not a multiple of the KV heads
  CHECK(validate(b) == Status::kInvalidArgument);
  b = p, b.head_dim_qk = b.head_dim_vo = 96;
  CHECK(validate(b) == Status::kUnsupported);
  b = p, b.window_left = -2;
  CHECK(validate(b) == Status::kInvalidArgument);
  b = p, b.soft_cap = -1.f;
  CHECK(validate(b) == Status::kInvalidArgument);
  b = p, b.k = nullptr;
  CHECK(validate(b) == Status::kInvalidArgument);
  b = p, b.k = b.v = nullptr, b.kv_len = 0;  // no keys: nothing is read
  CHECK(validate(b) == Status::kSuccess);
  b = p, b.qo_len = int64_t{1} << 31;
  CHECK(validate(b) == Status::kUnsupported);
  // the batch launch's checks
  static int32_t idx[4] = {0, 1, 0, 0};
  b = p, b.num_items = 1, b.items = idx, b.qo_indptr = idx, b.kv_indptr = idx;
  CHECK(validate_batch(b) == Status::kSuccess);
  PrefillParams<uint16_t> c = b;
  c.items = nullptr;
  CHECK(validate_batch(c) == Status::kInvalidArgument);
  c = b, c.mask = reinterpret_cast<const uint8_t*>(idx);  // a mask without its segment offsets
  CHECK(validate_batch(c) == Status::kInvalidArgument);
  c = b, c.page_indices = idx;  // paged without last_page_len / page_size
  CHECK(validate_batch(c) == Status::kInvalidArgument);
  c.last_page_len = idx, c.page_size = 16;
  CHECK(validate_batch(c) == Status::kSuccess);
  c = b, c.num_items = 0, c.items = nullptr;
  CHECK(validate_batch(c) == Status::kSuccess);
  // the MLA launch: paged, one KV head, [ckv || kpe] head dims, the kpe cache when kpe is 64 wide
  PrefillParams<uint16_t> m = b;
  m.num_qo_heads = 16, m.num_kv_heads = 1, m.head_dim_qk = 576, m.head_dim_vo = 512;
  m.page_indices = idx, m.last_page_len = idx, m.page_size = 16, m.k_rope = buf, m.q_rope = buf;
  CHECK(validate_batch(m, true) == Status::kSuccess);
  CHECK(validate_batch(m) == Status::kUnsupported);  // not a prefill head-dim pair
  c = m, c.q_rope = nullptr;  // q_pe missing
  CHECK(validate_batch(c, true) == Status::kUnsupported);
  c = m, c.k_rope = nullptr;
  CHECK(validate_batch(c, true) == Status::kUnsupported);
  c.q_rope = nullptr, c.head_dim_qk = 512;  // no kpe
  CHECK(validate_batch(c, true) == Status::kSuccess);
  c = m, c.num_kv_heads = 2, c.num_qo_heads = 16;
  CHECK(validate_batch(c, true) == Status::kUnsupported);
  c = m, c.head_dim_vo = 256;
  CHECK(validate_batch(c, true) == Status::kUnsupported);
}

// MLA split-KV: the chunk count rule, chunk key ranges covering [0, kv_len) once in whole
// tiles, and every (row tile, chunk) item once.
void test_mla_split() {
  CHECK(mla_num_chunks(0, 4096, 132) == 1 && mla_num_chunks(67, 1 << 20, 132) == 1);  // a wave of items
  CHECK(mla_num_chunks(66, 1 << 20, 132) == 2 && mla_num_chunks(32, 4096, 132) == 4);  // 132 / 128 CTAs
  CHECK(mla_num_chunks(2, 4096, 132) == 16);                                          // keys: 4096 / 256
  CHECK(mla_num_chunks(2, int64_t{1} << 40, 132) == kMlaMaxChunks);                   // 66 capped at 64
  CHECK(mla_num_chunks(4, 300, 132) == 1);  // (one chunk's worth of keys)
  for (int64_t items : {1, 2, 5, 16, 21, 32, 66, 67, 200})  // never past one wave of CTAs
    CHECK(items * mla_num_chunks(items, int64_t{1} << 40, 132) <= (items > 132 ? items : 132));
  for (int64_t kv : {0, 1, 63, 64, 65, 300, 4096, 8736})
    for (int c : {1, 2, 3, 16, 33}) {
      const int64_t ck = mla_chunk_keys(kv, c);
      if (c > 1) CHECK(ck % kPrefillKeys == 0);
      CHECK(ck * c >= kv);  // the chunks [i * ck, i * ck + ck) cover every key, disjointly
    }
  const std::vector<int64_t> qo{1, 2, 0, 17}, kv{4096, 300, 9, 0};
  for (int chunks : {1, 3}) {
    const std::vector<int32_t> base = prefill_plan_batch(qo, kv, 16, 1), items = mla_plan_items(qo, kv, 16, chunks);
    CHECK(items.size() == base.size() * static_cast<size_t>(chunks));
    // each base item (b, t) with every chunk c exactly once, encoded t * chunks + c
    std::vector<int> seen(base.size() / 2 * static_cast<size_t>(chunks), 0);
    for (size_t i = 0; i < items.size(); i += 2) {
      const int32_t b = items[i], t = items[i + 1] / chunks, c = items[i + 1] % chunks;
      for (size_t j = 0; j < base.size(); j += 2)
        if (base[j] == b && base[j + 1] == t) ++seen[j / 2 * static_cast<size_t>(chunks) + static_cast<size_t>(c)];
    }
    for (int n : seen) CHECK(n == 1);
  }
}

// Batch prefill's split-KV rule (prefill_num_chunks): only grids under one CTA per SM split, into
// about two CTAs per SM, chunks of >= kPrefillMinChunkKeys keys, at most kPrefillMaxChunks.
void test_prefill_split() {
  CHECK(prefill_num_chunks(32, 32768, 132) == 8);     // a cascade's shared prefix: 264 / 32
  CHECK(prefill_num_chunks(4, 32768, 132) == 64);     // 66, capped
  CHECK(prefill_num_chunks(16, 2048, 132) == 4);      // keys: 2048 / 512
  CHECK(prefill_num_chunks(16, 1023, 132) == 1);      // under two chunks' worth of keys
  CHECK(prefill_num_chunks(132, 1 << 20, 132) == 1);  // one CTA per SM already
  CHECK(prefill_num_chunks(0, 4096, 132) == 1 && prefill_num_chunks(1, 0, 132) == 1);
  for (int64_t ctas : {1, 2, 7, 33, 66, 67, 131})
    CHECK(ctas * prefill_num_chunks(ctas, int64_t{1} << 40, 132) <= 2 * 132);
  CHECK(prefill_split_items({0, 0, 1, 2}, 1) == (std::vector<int32_t>{0, 0, 1, 2}));
  CHECK(prefill_split_items({0, 0, 1, 2}, 3) == (std::vector<int32_t>{0, 0, 0, 1, 0, 2, 1, 6, 1, 7, 1, 8}));
}

}  // namespace

int main() {
  test_key_range();
  test_plain_tiles();
  test_grid_and_smem();
  test_plan_batch();
  test_validate();
  test_mla_split();
  test_prefill_split();
  return test::finish("test_prefill");
}
