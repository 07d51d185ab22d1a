// page.h, the append side: locate_checked (round trips for page sizes 1/5/16, empty requests,
// full and partial last pages, every kind of bad index), a CPU replay of the append kernel's
// addressing into partially filled pages (written slots read back through token_offset,
// every other slot keeps its sentinel), append_entry_position / get_batch_indices_positions,
// the append launch arithmetic, and the index-error record.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "check.h"
#include "flashinfer/index_check.h"
#include "flashinfer/page.h"

using namespace flashinfer;
using paged_kv::AppendLaunch;
using paged_kv::append_launch_config;

namespace {

struct Table {
  std::vector<int32_t> indptr{0}, indices, last;
  int64_t num_pages = 0;
};

// Pages for requests of `lens` tokens, in shuffled order, plus `spare` unused pages.
Table make_table(const std::vector<int64_t>& lens, int64_t page_size, std::mt19937& rng, int64_t spare = 3) {
  Table t;
  int64_t total = 0;
  for (int64_t len : lens) total += (len + page_size - 1) / page_size;
  t.num_pages = total + spare;
  std::vector<int32_t> ids(t.num_pages);
  for (int64_t i = 0; i < t.num_pages; ++i) ids[i] = static_cast<int32_t>(i);
  std::shuffle(ids.begin(), ids.end(), rng);
  int64_t next = 0;
  for (int64_t len : lens) {
    const int64_t np = (len + page_size - 1) / page_size;
    for (int64_t i = 0; i < np; ++i) t.indices.push_back(ids[next++]);
    t.indptr.push_back(static_cast<int32_t>(t.indices.size()));
    t.last.push_back(np == 0 ? 0 : static_cast<int32_t>(len - (np - 1) * page_size));
  }
  return t;
}

template <typename T>
PagedKV<T, int32_t> view(Table& t, T* k, T* v, int64_t page_size, int64_t heads, int64_t dim, QKVLayout layout) {
  const PageStrides s = dense_page_strides(layout, page_size, heads, dim);
  return PagedKV<T, int32_t>{k, v, t.indptr.data(), t.indices.data(), t.last.data(),
                             static_cast<int64_t>(t.last.size()), page_size, heads, dim, s.page, s.n, s.h};
}

void test_locate_round_trip() {
  std::mt19937 rng(5);
  for (int64_t ps : {1, 5, 16}) {
    for (QKVLayout layout : {QKVLayout::kNHD, QKVLayout::kHND}) {
      std::vector<int64_t> lens{0, ps, 1, 3 * ps, 2 * ps + ps / 2 + 1, 0, ps + 1};
      Table t = make_table(lens, ps, rng);
      auto kv = view<float>(t, nullptr, nullptr, ps, 2, 4, layout);
      const int64_t n_idx = static_cast<int64_t>(t.indices.size());
      for (size_t b = 0; b < lens.size(); ++b) {
        const int64_t cap = kv.num_pages(b) * ps;  // every slot of the request's pages
        for (int64_t pos = 0; pos < cap; ++pos) {
          int64_t page = -1, entry = -1;
          CHECK(locate_checked(kv, b, pos, n_idx, t.num_pages, &page, &entry) == 0);
          CHECK(page == kv.page_of(b, pos) && entry == pos % ps);
          // the kernel's decode-step path: request b's range read beforehand
          int64_t page2 = -1, entry2 = -1;
          CHECK(locate_in_range(kv, pos, t.indptr[b], t.indptr[b + 1], n_idx, t.num_pages, &page2, &entry2) == 0);
          CHECK(page2 == page && entry2 == entry);
          CHECK(kv.offset(page, entry, 1) == kv.token_offset(b, pos, 1));
        }
        int64_t page = -7, entry = -7;
        // one past the request's pages (a full last page has no room left; an empty request none)
        CHECK(locate_checked(kv, b, cap, n_idx, t.num_pages, &page, &entry) == kPageNotInTable);
        CHECK(locate_checked(kv, b, cap + 100 * ps, n_idx, t.num_pages, &page, &entry) == kPageNotInTable);
        CHECK(locate_checked(kv, b, -1, n_idx, t.num_pages, &page, &entry) == kBadPosition);
        CHECK(locate_in_range(kv, cap, t.indptr[b], t.indptr[b + 1], n_idx, t.num_pages, &page, &entry) ==
              kPageNotInTable);
        CHECK(locate_in_range(kv, -1, t.indptr[b], t.indptr[b + 1], n_idx, t.num_pages, &page, &entry) ==
              kBadPosition);
        CHECK(page == -7 && entry == -7);  // outputs untouched on failure
      }
      int64_t page = 0, entry = 0;
      const int64_t nb = static_cast<int64_t>(lens.size());
      CHECK(locate_checked(kv, -1, 0, n_idx, t.num_pages, &page, &entry) == kBadBatchIndex);
      CHECK(locate_checked(kv, nb, 0, n_idx, t.num_pages, &page, &entry) == kBadBatchIndex);
      // a page id outside the cache, either side
      const int64_t b3 = 3, slot = t.indptr[b3];
      const int32_t saved = t.indices[slot];
      t.indices[slot] = static_cast<int32_t>(t.num_pages);
      CHECK(locate_checked(kv, b3, 0, n_idx, t.num_pages, &page, &entry) == kBadPageId);
      t.indices[slot] = -1;
      CHECK(locate_checked(kv, b3, 0, n_idx, t.num_pages, &page, &entry) == kBadPageId);
      t.indices[slot] = saved;
      // kv_indices shorter than kv_indptr claims
      CHECK(locate_checked(kv, b3, 0, slot, t.num_pages, &page, &entry) == kPageNotInTable);
      // a corrupt (negative) indptr entry never indexes before `indices`
      const int32_t saved_ptr = t.indptr[b3];
      t.indptr[b3] = -5;
      CHECK(locate_checked(kv, b3, 0, n_idx, t.num_pages, &page, &entry) == kPageNotInTable);
      t.indptr[b3] = saved_ptr;
    }
  }
}

// The append kernel's addressing replayed on the CPU: requests hold `old` tokens, then `add`
// more are appended (the page table already covers old + add), each into its slot.
void test_append_replay() {
  std::mt19937 rng(7);
  for (int64_t ps : {1, 5, 16}) {
    for (QKVLayout layout : {QKVLayout::kNHD, QKVLayout::kHND}) {
      const int64_t heads = 3, dim = 4;
      const std::vector<int64_t> old_len{0, ps - 1, ps, 2 * ps + 3, 0, 7};
      const std::vector<int64_t> add_len{5, 1, 2 * ps, 1, 0, ps + 2};
      std::vector<int64_t> total(old_len.size());
      for (size_t b = 0; b < total.size(); ++b) total[b] = old_len[b] + add_len[b];
      Table t = make_table(total, ps, rng);
      const int64_t elems = t.num_pages * ps * heads * dim;
      const float kSentinel = -12345.f;
      std::vector<float> k(elems, kSentinel), v(elems, kSentinel);
      auto kv = view<float>(t, k.data(), v.data(), ps, heads, dim, layout);
      // the appended entries, in request order (what get_batch_indices_positions produces)
      std::vector<int32_t> bidx, pos;
      for (size_t b = 0; b < total.size(); ++b)
        for (int64_t i = 0; i < add_len[b]; ++i) {
          bidx.push_back(static_cast<int32_t>(b));
          pos.push_back(static_cast<int32_t>(old_len[b] + i));
        }
      auto value_of = [&](int64_t e, int64_t h, int64_t d, bool is_v) {
        return float(e * 1000 + h * 10 + d) + (is_v ? 0.5f : 0.f);
      };
      for (size_t e = 0; e < bidx.size(); ++e) {
        int64_t page = 0, entry = 0;
        const int64_t n_idx = static_cast<int64_t>(t.indices.size());
        CHECK(locate_checked(kv, bidx[e], pos[e], n_idx, t.num_pages, &page, &entry) == 0);
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < dim; ++d) {
            k[kv.offset(page, entry, h) + d] = value_of(e, h, d, false);
            v[kv.offset(page, entry, h) + d] = value_of(e, h, d, true);
          }
      }
      // every appended token reads back through token_offset; count what was written
      int64_t written = 0;
      for (size_t e = 0; e < bidx.size(); ++e)
        for (int64_t h = 0; h < heads; ++h)
          for (int64_t d = 0; d < dim; ++d) {
            CHECK(k[kv.token_offset(bidx[e], pos[e], h) + d] == value_of(e, h, d, false));
            CHECK(v[kv.token_offset(bidx[e], pos[e], h) + d] == value_of(e, h, d, true));
            ++written;
          }
      int64_t changed = 0;
      for (int64_t i = 0; i < elems; ++i) changed += (k[i] != kSentinel) + (v[i] != kSentinel);
      CHECK(changed == 2 * written);  // nothing else was touched
      // the old tokens' slots keep the sentinel
      for (size_t b = 0; b < total.size(); ++b)
        for (int64_t p = 0; p < old_len[b]; ++p) CHECK(k[kv.token_offset(b, p, 0)] == kSentinel);
      // lengths after the append
      for (size_t b = 0; b < total.size(); ++b) CHECK(kv.length(b) == total[b]);
    }
  }
}

void test_entry_positions() {
  // the documented example
  {
    const int32_t indptr[] = {0, 1, 3, 6, 10};
    const int64_t seq[] = {5, 5, 5, 5};
    const int32_t want_b[] = {0, 1, 1, 2, 2, 2, 3, 3, 3, 3};
    const int32_t want_p[] = {4, 3, 4, 2, 3, 4, 1, 2, 3, 4};
    std::vector<int32_t> bi(12, 99), po(12, 99);
    paged_kv::BatchIndicesPositionsParams<int32_t, int64_t> p{indptr, seq, bi.data(), po.data(), 4, 12, false};
    paged_kv::batch_indices_positions_host(p);
    for (int e = 0; e < 10; ++e) CHECK(bi[e] == want_b[e] && po[e] == want_p[e]);
    CHECK(bi[10] == -1 && bi[11] == -1 && po[10] == 99 && po[11] == 99);  // unheld: position kept
    p.zero_unheld = true;
    paged_kv::batch_indices_positions_host(p);
    CHECK(po[10] == 0 && po[11] == 0);
  }
  // empty requests anywhere, including first and last
  {
    const int64_t indptr[] = {0, 0, 2, 2, 2, 5, 5};
    const int32_t seq[] = {3, 9, 4, 0, 8, 1};
    int64_t b = 0, pos = 0;
    const int64_t want_b[] = {1, 1, 4, 4, 4};
    const int64_t want_p[] = {7, 8, 5, 6, 7};
    for (int64_t e = 0; e < 5; ++e) {
      CHECK(append_entry_position(indptr, seq, 6, e, &b, &pos));
      CHECK(b == want_b[e] && pos == want_p[e]);
    }
    CHECK(!append_entry_position(indptr, seq, 6, 5, &b, &pos));
    CHECK(!append_entry_position(indptr, seq, 0, 0, &b, &pos));  // no requests
  }
  // a corrupt (non-monotone) indptr: never claims an entry its segment does not hold
  {
    std::mt19937 rng(3);
    std::uniform_int_distribution<int32_t> u(-3, 20);
    for (int trial = 0; trial < 200; ++trial) {
      std::vector<int32_t> indptr(6), seq(5, 10);
      for (auto& x : indptr) x = u(rng);
      for (int64_t e = 0; e < 25; ++e) {
        int64_t b = -1, pos = 0;
        if (append_entry_position(indptr.data(), seq.data(), 5, e, &b, &pos)) {
          CHECK(b >= 0 && b < 5 && indptr[b] <= e && e < indptr[b + 1]);
        }
      }
    }
  }
}

void test_launch_config() {
  paged_kv::AppendTuning tunings[6];
  tunings[1].vecs_per_thread = 2;
  tunings[2].vecs_per_thread = 8;
  tunings[2].threads = 128;
  tunings[3].vecs_per_thread = 4;
  tunings[3].threads = 1024;
  tunings[4].vecs_per_thread = 3;  // invalid: auto
  tunings[4].threads = 96;         // invalid: auto
  tunings[5] = paged_kv::append_tuning_from("8", "512");
  for (const paged_kv::AppendTuning& t : tunings) {
    for (int64_t nnz : {1, 7, 64, 4096, 65536}) {
      for (int64_t heads : {1, 8, 32}) {
        for (int64_t dim : {64, 128, 256, 100, 3}) {
          for (bool aligned : {false, true}) {
            const AppendLaunch l = append_launch_config(nnz, heads, dim, 8, aligned, t);
            const int v = l.vecs_per_thread;
            CHECK(l.vectorized == (aligned && dim % 8 == 0));
            CHECK(v == 1 || v == 2 || v == 4 || v == 8);
            if (!l.vectorized) CHECK(v == paged_kv::kAppendScalarVecsPerThread);
            const int64_t at_default = nnz * ((l.vecs_per_token + 3) / 4);
            const int auto_v = at_default < paged_kv::kAppendSmallThreads ? 1 : paged_kv::kAppendDefaultVecsPerThread;
            if (l.vectorized) CHECK(v == (t.vecs_per_thread == 0 || t.vecs_per_thread == 3 ? auto_v
                                                                                          : t.vecs_per_thread));
            const int want_threads = t.threads == 0 || t.threads == 96 ? paged_kv::kAppendThreads : t.threads;
            CHECK(l.threads == (want_threads < paged_kv::append_max_threads(v) ? want_threads
                                                                               : paged_kv::append_max_threads(v)));
            CHECK(l.vecs_per_head * l.vec_elems == dim);
            CHECK(l.vecs_per_token == heads * l.vecs_per_head);
            CHECK(l.slots_per_token * v >= l.vecs_per_token);
            CHECK((l.slots_per_token - 1) * v < l.vecs_per_token);
            CHECK(l.blocks * l.threads >= nnz * l.slots_per_token);
            CHECK((l.blocks - 1) * l.threads < nnz * l.slots_per_token);
          }
        }
      }
    }
  }
  // the default: 8 heads x 128 in 16-byte vectors is one warp per token
  {
    const AppendLaunch l = append_launch_config(4096, 8, 128, 8, true);
    CHECK(l.vecs_per_thread == 4 && l.slots_per_token == 32 && l.threads == 256 && l.blocks == 512);
  }
  // env parsing: invalid values mean auto
  {
    const paged_kv::AppendTuning a = paged_kv::append_tuning_from(nullptr, nullptr);
    CHECK(a.vecs_per_thread == 0 && a.threads == 0);
    const paged_kv::AppendTuning b = paged_kv::append_tuning_from("16", "64");
    CHECK(b.vecs_per_thread == 0 && b.threads == 0);
    const paged_kv::AppendTuning c = paged_kv::append_tuning_from("2", "1024");
    CHECK(c.vecs_per_thread == 2 && c.threads == 1024);
    CHECK(append_launch_config(4096, 8, 128, 8, true, c).threads == 1024);
    const paged_kv::AppendTuning d = paged_kv::append_tuning_from("8", "1024");  // V = 8: 512 at most
    CHECK(append_launch_config(4096, 8, 128, 8, true, d).threads == 512);
  }
  // small launches (decode steps) take one vector per thread; large ones the default
  CHECK(append_launch_config(1, 8, 128, 8, true).vecs_per_thread == 1);
  CHECK(append_launch_config(64, 8, 128, 8, true).vecs_per_thread == 1);
  CHECK(append_launch_config(4096, 8, 128, 8, true).vecs_per_thread == paged_kv::kAppendDefaultVecsPerThread);
  CHECK(append_launch_config(1, 8, 128, 8, false).vecs_per_thread == paged_kv::kAppendScalarVecsPerThread);
  // slot s moves vectors s, s + slots, ...: every vector of a token exactly once
  for (int v : {1, 2, 4, 8}) {
    paged_kv::AppendTuning t;
    t.vecs_per_thread = v;
    for (int64_t heads : {1, 3, 8}) {
      for (int64_t dim : {40, 64, 128, 256}) {
        const AppendLaunch l = append_launch_config(1, heads, dim, 8, true, t);  // e.g. 3 x 40: 15 vectors
        std::vector<int> hits(l.vecs_per_token, 0);
        for (int64_t s = 0; s < l.slots_per_token; ++s)
          for (int m = 0; m < l.vecs_per_thread; ++m) {
            const int64_t j = s + m * l.slots_per_token;
            if (j < l.vecs_per_token) ++hits[j];
          }
        for (int h : hits) CHECK(h == 1);
      }
    }
  }
}

void test_validate() {
  std::vector<int32_t> indptr{0, 1}, indices{0}, last{1}, bi{0}, pos{0};
  uint16_t k[64], v[64];
  paged_kv::AppendPagedKVParams<uint16_t, int32_t> p{};
  p.kv = PagedKV<uint16_t, int32_t>{k, v, indptr.data(), indices.data(), last.data(), 1, 1, 1, 64, 64, 0, 64};
  p.key = p.value = k;
  p.batch_indices = bi.data();
  p.positions = pos.data();
  p.nnz = 1;
  p.num_indices = 1;
  p.max_num_pages = 1;
  CHECK(paged_kv::validate(p) == Status::kSuccess);
  p.kv.page_size = 0;
  CHECK(paged_kv::validate(p) == Status::kInvalidArgument);
  p.kv.page_size = 1;
  p.key = nullptr;
  CHECK(paged_kv::validate(p) == Status::kInvalidArgument);
  p.nnz = 0;  // nothing to do: null pointers are fine
  CHECK(paged_kv::validate(p) == Status::kSuccess);
}

// locate_checked's 32-bit division fast path and its 64-bit fallback agree with plain math.
void test_locate_wide_positions() {
  std::vector<int32_t> indptr{0, 6}, indices{9, 8, 7, 6, 5, 4}, last{1};
  uint16_t k[1], v[1];
  for (int64_t ps : {int64_t{1} << 30, int64_t{3} << 30, int64_t{1} << 33}) {
    PagedKV<uint16_t, int32_t> kv{k, v, indptr.data(), indices.data(), last.data(), 1, ps, 1, 1, 1, 1, 1};
    for (int64_t pos : {int64_t{0}, int64_t{5}, (int64_t{1} << 32) - 1, (int64_t{1} << 32) + 5, int64_t{5} << 32}) {
      int64_t page = -1, entry = -1;
      const int32_t bad = locate_checked(kv, 0, pos, 6, 10, &page, &entry);
      if (pos / ps < 6) {
        CHECK(bad == 0 && page == indices[pos / ps] && entry == pos % ps);
      } else {
        CHECK(bad == kPageNotInTable);
      }
    }
  }
}

void test_error_record() {
  int32_t err[kIndexErrorWords] = {0, 0};
  record_index_error(err, 4, 17);
  record_index_error(err, 1, 5);
  record_index_error(err, 4, 900);
  record_index_error(nullptr, 2, 1);  // no record: a no-op
  CHECK(err[0] == 5 && first_error_row(err) == 5);
}

}  // namespace

int main() {
  test_locate_round_trip();
  test_append_replay();
  test_entry_positions();
  test_launch_config();
  test_locate_wide_positions();
  test_validate();
  test_error_record();
  return test::finish("test_page_append");
}
