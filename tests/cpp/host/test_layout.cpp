// fold_rows(): every row of a strided [.., H] tensor maps to the offset the strides give.
#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "check.h"
#include "flashinfer/layout.h"

using flashinfer::fold_rows;
using flashinfer::RowLayout;

// Row offset straight from shape/strides (odometer over the leading dims).
static int64_t direct_offset(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride, int64_t r) {
  int64_t off = 0;
  for (int i = static_cast<int>(shape.size()) - 2; i >= 0; --i) {
    off += (r % shape[i]) * stride[i];
    r /= shape[i];
  }
  return off;
}

static void expect_fold(const std::vector<int64_t>& shape, const std::vector<int64_t>& stride) {
  RowLayout l;
  int64_t rows = -1;
  CHECK(fold_rows(static_cast<int>(shape.size()), shape.data(), stride.data(), &l, &rows));
  int64_t n = 1;
  for (size_t i = 0; i + 1 < shape.size(); ++i) n *= shape[i];
  CHECK(rows == n);
  for (int64_t r = 0; r < rows; ++r) CHECK(l.offset(r) == direct_offset(shape, stride, r));
}

int main() {
  expect_fold({7, 64}, {64, 1});                  // contiguous 2-D
  expect_fold({7, 64}, {192, 1});                 // a slice of a wider buffer
  expect_fold({5, 4, 128}, {4 * 128, 128, 1});    // contiguous 3-D folds to one level
  expect_fold({5, 4, 128}, {3 * 4 * 128, 128, 1});  // q view of a fused QKV buffer: two levels
  expect_fold({2, 3, 4, 16}, {12 * 16, 4 * 16, 16, 1});  // 4-D contiguous
  expect_fold({2, 3, 4, 16}, {1000, 4 * 16, 16, 1});     // outer gap, inner two contiguous
  expect_fold({1, 6, 1, 32}, {999, 77, 5, 1});           // size-1 dims are ignored
  expect_fold({9, 32}, {0, 1});                          // broadcast rows (stride 0)
  expect_fold({64}, {1});                                // 1-D: one row

  // Three non-mergeable levels are refused.
  {
    std::vector<int64_t> shape{2, 3, 4, 16}, stride{10000, 1000, 100, 1};
    RowLayout l;
    int64_t rows;
    CHECK(!fold_rows(4, shape.data(), stride.data(), &l, &rows));
  }
  // Zero rows fold trivially.
  {
    std::vector<int64_t> shape{0, 3, 16}, stride{48, 16, 1};
    RowLayout l;
    int64_t rows = -1;
    CHECK(fold_rows(3, shape.data(), stride.data(), &l, &rows));
    CHECK(rows == 0);
  }
  // Random 3-D / 4-D views over a padded buffer.
  std::mt19937 rng(7);
  for (int it = 0; it < 200; ++it) {
    std::vector<int64_t> shape{1 + int64_t(rng() % 5), 1 + int64_t(rng() % 5), 8};
    int64_t s1 = 8 + 8 * int64_t(rng() % 3);
    int64_t s0 = s1 * shape[1] + 8 * int64_t(rng() % 2);
    expect_fold(shape, {s0, s1, 1});
  }
  CHECK(RowLayout{3, 100, 10}.strides_multiple_of(2));
  CHECK(!RowLayout{3, 100, 9}.strides_multiple_of(2));
  return test::finish("test_layout");
}
