// page.h: lengths and (request, position) -> (page, entry) round trips for page sizes
// 1/5/16, empty requests, full and partial last pages, shared pages, both layouts.
#include <algorithm>
#include <cstdint>
#include <initializer_list>
#include <random>
#include <set>
#include <vector>

#include "check.h"
#include "flashinfer/page.h"

using namespace flashinfer;

int main() {
  std::mt19937 rng(11);
  // div_mod (config.h): the shift-and-mask path (powers of two) and the division path equal / and %.
  for (int32_t b : {1, 2, 3, 5, 16, 32, 48, 64, 128, 192, 1024}) {
    for (int32_t a : {0, 1, 15, 16, 17, 63, 64, 65, 1000, 123457, 0x7ffffff0}) {
      int32_t q = -1, r = -1;
      div_mod(a, b, &q, &r);
      CHECK(q == a / b);
      CHECK(r == a % b);
    }
  }
  // PageCursor: the incremental walk equals division at every step.
  for (int32_t page_size : {1, 2, 5, 7, 8, 16, 64, 192}) {
    for (int32_t step : {1, 3, 8, 16, 64}) {
      for (int32_t start : {0, 1, 4, 15, 1000}) {
        PageCursor c(start, page_size, step);
        for (int32_t i = 0; i < 200; ++i) {
          const int32_t pos = start + i * step;
          CHECK(c.slot == pos / page_size);
          CHECK(c.entry == pos % page_size);
          c.advance();
        }
      }
    }
  }
  for (int64_t page_size : {1, 5, 16}) {
    for (QKVLayout layout : {QKVLayout::kNHD, QKVLayout::kHND}) {
      const int64_t heads = 3, dim = 8;
      // lengths: empty, exactly one full page, partial, several full, long partial
      std::vector<int64_t> lens{0, page_size, 1, 3 * page_size, 7 * page_size + page_size / 2 + 1, 0, 2};
      std::vector<int32_t> indptr{0}, indices, last;
      int32_t next_page = 0;
      for (int64_t len : lens) {
        const int64_t np = (len + page_size - 1) / page_size;
        for (int64_t i = 0; i < np; ++i) indices.push_back(next_page++);
        indptr.push_back(static_cast<int32_t>(indices.size()));
        last.push_back(np == 0 ? 0 : static_cast<int32_t>(len - (np - 1) * page_size));
      }
      std::shuffle(indices.begin(), indices.end(), rng);  // pages in random order
      const PageStrides s = dense_page_strides(layout, page_size, heads, dim);
      PagedKV<float, int32_t> kv{nullptr, nullptr, indptr.data(), indices.data(), last.data(),
                                 static_cast<int64_t>(lens.size()), page_size, heads, dim, s.page, s.n, s.h};
      std::set<int64_t> seen;
      for (size_t b = 0; b < lens.size(); ++b) {
        CHECK(kv.length(b) == lens[b]);
        for (int64_t pos = 0; pos < lens[b]; ++pos) {
          const int64_t page = kv.page_of(b, pos);
          const int64_t entry = pos % page_size;
          CHECK(page == indices[indptr[b] + pos / page_size]);
          CHECK(entry < (pos / page_size == kv.num_pages(b) - 1 ? last[b] : page_size));
          for (int64_t h = 0; h < heads; ++h) {
            const int64_t off = kv.token_offset(b, pos, h);
            // the dense layout formula, written out independently
            const int64_t want = layout == QKVLayout::kNHD
                                     ? ((page * page_size + entry) * heads + h) * dim
                                     : ((page * heads + h) * page_size + entry) * dim;
            CHECK(off == want);
            CHECK(seen.insert(off).second);  // distinct tokens never alias
          }
        }
      }
      // every slot of every used page entry is covered exactly once
      int64_t total = 0;
      for (int64_t len : lens) total += len;
      CHECK(static_cast<int64_t>(seen.size()) == total * heads);
    }
  }
  // Shared pages: two requests pointing at the same first page see the same offsets.
  {
    std::vector<int32_t> indptr{0, 2, 4}, indices{7, 3, 7, 9}, last{4, 2};
    PagedKV<float, int32_t> kv{nullptr, nullptr, indptr.data(), indices.data(), last.data(), 2, 4, 1, 2, 8, 2, 2};
    for (int64_t pos = 0; pos < 4; ++pos) CHECK(kv.token_offset(0, pos, 0) == kv.token_offset(1, pos, 0));
    CHECK(kv.length(0) == 8 && kv.length(1) == 6);
  }
  return test::finish("test_page");
}
