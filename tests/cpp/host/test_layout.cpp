// fold_rows(): every row of a strided [.., H] tensor maps to the offset the strides give.
#include <cstdint>
#include <cstdio>
#include <initializer_list>
#include <random>
#include <vector>

#include "check.h"
#include "flashinfer/layout.h"

using flashinfer::fold_rows;
using flashinfer::RowLayout;
using flashinfer::rows_disjoint;
using flashinfer::rows_intersect;
using flashinfer::tensors_intersect;

// Brute force: do two of the rows (each [off, off + h)) share an element?
static bool overlap_brute(const std::vector<int64_t>& offs_a, const std::vector<int64_t>& offs_b, int64_t h,
                          bool same) {
  for (size_t i = 0; i < offs_a.size(); ++i)
    for (size_t j = same ? i + 1 : 0; j < offs_b.size(); ++j) {
      const int64_t d = offs_a[i] - offs_b[j];
      if ((d < 0 ? -d : d) < h) return true;
    }
  return false;
}

static std::vector<int64_t> offsets(const RowLayout& l, int64_t rows, int64_t base = 0) {
  std::vector<int64_t> o;
  for (int64_t r = 0; r < rows; ++r) o.push_back(base + l.offset(r));
  return o;
}

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
  // rows_disjoint: exact, against brute force, on random one- and two-level layouts (strides of
  // either sign, some nesting, some interleaving, some overlapping).
  for (int it = 0; it < 20000; ++it) {
    const int64_t h = 1 + int64_t(rng() % 6);
    const int64_t inner = 1 + int64_t(rng() % 5), outer = 1 + int64_t(rng() % 6);
    auto stride = [&] { return (int64_t(rng() % 25) - 4) * (rng() % 3 == 0 ? -1 : 1); };
    const RowLayout l{inner, stride(), inner > 1 ? stride() : 0};
    const int64_t rows = inner * outer;
    const bool brute = !overlap_brute(offsets(l, rows), offsets(l, rows), h, true);
    if (rows_disjoint(l, rows, h) != brute) {
      std::printf("rows_disjoint(inner %lld, outer stride %lld, inner stride %lld, rows %lld, h %lld) != %d\n",
                  (long long)inner, (long long)l.stride_outer, (long long)l.stride_inner, (long long)rows,
                  (long long)h, int(brute));
      CHECK(false);
    }
  }
  CHECK(rows_disjoint(RowLayout{1, 4096, 0}, 32768, 4096));   // contiguous 2-D
  CHECK(!rows_disjoint(RowLayout{1, 0, 0}, 4, 64));           // expand(): every row the same
  CHECK(!rows_disjoint(RowLayout{1, 32, 0}, 4, 64));          // rows half a row apart
  CHECK(rows_disjoint(RowLayout{32, 3 * 32 * 128, 128}, 32 * 1000, 128));  // q view of fused QKV
  CHECK(rows_disjoint(RowLayout{1, 7, 0}, 1, 64));            // one row: nothing to overlap
  // rows_intersect: exact for two single-level layouts with one stride; never misses an overlap
  // otherwise (it may report one that is not there).
  for (int it = 0; it < 20000; ++it) {
    const int64_t h = 1 + int64_t(rng() % 6), rows = 1 + int64_t(rng() % 6);
    const bool same_stride = rng() % 2 == 0;
    const int64_t sa = int64_t(rng() % 20), sb = same_stride ? sa : int64_t(rng() % 20);
    const int64_t inner_b = same_stride ? 1 : (rows % 2 == 0 ? 2 : 1);
    const RowLayout a{1, sa, 0}, b{inner_b, sb, inner_b > 1 ? int64_t(rng() % 9) : 0};
    const int64_t delta = int64_t(rng() % 61) - 30;
    const bool brute = overlap_brute(offsets(a, rows), offsets(b, rows, delta), h, false);
    const bool got = rows_intersect(a, b, delta, rows, h);
    if (same_stride ? got != brute : (brute && !got)) {
      std::printf("rows_intersect(stride %lld / %lld, delta %lld, rows %lld, h %lld) = %d, brute %d\n",
                  (long long)sa, (long long)sb, (long long)delta, (long long)rows, (long long)h, int(got),
                  int(brute));
      CHECK(false);
    }
  }
  // rows of two widths (an activation's out against its input): exact with one stride
  for (int it = 0; it < 20000; ++it) {
    const int64_t wa = 1 + int64_t(rng() % 8), wb = 1 + int64_t(rng() % 8), rows = 1 + int64_t(rng() % 6);
    const int64_t s = int64_t(rng() % 20) * (rng() % 4 == 0 ? -1 : 1);
    const RowLayout a{1, s, 0}, b{1, s, 0};
    const int64_t delta = int64_t(rng() % 81) - 40;
    bool brute = false;
    for (int64_t i = 0; i < rows && !brute; ++i)
      for (int64_t j = 0; j < rows && !brute; ++j) {
        const int64_t oa = a.offset(i), ob = delta + b.offset(j);
        brute = oa < ob + wb && ob < oa + wa;
      }
    if (rows_intersect(a, b, delta, rows, wa, wb) != brute) {
      std::printf("rows_intersect(stride %lld, delta %lld, rows %lld, widths %lld / %lld) = %d, brute %d\n",
                  (long long)s, (long long)delta, (long long)rows, (long long)wa, (long long)wb, int(!brute),
                  int(brute));
      CHECK(false);
    }
  }
  CHECK(!rows_intersect(RowLayout{1, 384, 0}, RowLayout{1, 384, 0}, 256, 4, 256, 128));  // [x | y | out] rows
  CHECK(rows_intersect(RowLayout{1, 384, 0}, RowLayout{1, 384, 0}, 128, 4, 256, 128));   // out over y
  // tensors_intersect ([tokens, heads] rows of two tensors): exact at one token stride (packed or
  // per-head views of one buffer, negative strides too); never misses an overlap otherwise
  for (int it = 0; it < 40000; ++it) {
    const int64_t wa = 1 + int64_t(rng() % 4), wb = 1 + int64_t(rng() % 4), tokens = 1 + int64_t(rng() % 5);
    const int64_t ha = 1 + int64_t(rng() % 3), hb = 1 + int64_t(rng() % 3);
    const int kind = int(rng() % 3);  // 0: packed heads, 1: any heads at one token stride, 2: anything
    const int64_t sn = int64_t(rng() % 30) - (kind == 0 ? 0 : 8);
    const RowLayout a{ha, sn, kind == 0 ? wa : int64_t(rng() % 13) - 3};
    const RowLayout b{hb, kind == 2 ? int64_t(rng() % 30) - 8 : sn, kind == 0 ? wb : int64_t(rng() % 13) - 3};
    const int64_t delta = int64_t(rng() % 61) - 30;
    bool brute = false;
    for (int64_t i = 0; i < tokens * ha && !brute; ++i)
      for (int64_t j = 0; j < tokens * hb && !brute; ++j) {
        const int64_t oa = a.offset(i), ob = delta + b.offset(j);
        brute = oa < ob + wb && ob < oa + wa;
      }
    const bool got = tensors_intersect(a, tokens * ha, wa, b, tokens * hb, wb, delta);
    if (kind < 2 ? got != brute : (brute && !got)) {
      std::printf("tensors_intersect(kind %d, sn %lld / %lld, heads %lld / %lld, inner strides %lld / %lld, delta "
                  "%lld, tokens %lld, w %lld / %lld) = %d, brute %d\n",
                  kind, (long long)a.stride_outer, (long long)b.stride_outer, (long long)ha, (long long)hb,
                  (long long)a.stride_inner, (long long)b.stride_inner, (long long)delta, (long long)tokens,
                  (long long)wa, (long long)wb, int(got), int(brute));
      CHECK(false);
    }
  }
  // q [N, 16, 64] and k [N, 16, 64] of one per-head [N, 16, 3 * 64] buffer: disjoint
  CHECK(!tensors_intersect(RowLayout{16, 16 * 192, 192}, 5 * 16, 64, RowLayout{16, 16 * 192, 192}, 5 * 16, 64, 64));
  // q [N, 32, 128] and k [N, 8, 128] of one fused [N, 48 * 128] row: disjoint; k shifted into q: not
  CHECK(!tensors_intersect(RowLayout{32, 48 * 128, 128}, 7 * 32, 128, RowLayout{8, 48 * 128, 128}, 7 * 8, 128,
                           32 * 128));
  CHECK(tensors_intersect(RowLayout{32, 48 * 128, 128}, 7 * 32, 128, RowLayout{8, 48 * 128, 128}, 7 * 8, 128,
                          31 * 128));
  CHECK(rows_intersect(RowLayout{1, 128, 0}, RowLayout{1, 128, 0}, 0, 4, 128));    // the same tensor
  CHECK(!rows_intersect(RowLayout{1, 256, 0}, RowLayout{1, 256, 0}, 128, 4, 128));  // two column halves
  CHECK(rows_intersect(RowLayout{1, 256, 0}, RowLayout{1, 256, 0}, 64, 4, 128));    // shifted by half a row
  CHECK(!rows_intersect(RowLayout{1, 128, 0}, RowLayout{1, 128, 0}, 512, 4, 128));  // adjacent buffers

  // strides_nest: never true where two addressed rows share a byte (brute force over random
  // small views), and true for the paged-cache layouts the append writes.
  {
    std::mt19937 rng(7);
    int agreed_disjoint = 0;
    for (int trial = 0; trial < 20000; ++trial) {
      const int n = 1 + static_cast<int>(rng() % 4);
      int64_t size[4], stride[4];
      for (int i = 0; i < n; ++i) size[i] = 1 + rng() % 4, stride[i] = static_cast<int64_t>(rng() % 40) - 8;
      const int64_t width = 1 + rng() % 8;
      std::vector<int64_t> offs{0};
      for (int i = 0; i < n; ++i) {
        std::vector<int64_t> next;
        for (int64_t o : offs)
          for (int64_t k = 0; k < size[i]; ++k) next.push_back(o + k * stride[i]);
        offs = next;
      }
      const bool brute_apart = !overlap_brute(offs, offs, width, true);
      if (flashinfer::strides_nest(n, size, stride, width)) {
        CHECK(brute_apart);
        ++agreed_disjoint;
      }
    }
    CHECK(agreed_disjoint > 1000);  // (the random views do reach the true branch)
    // bf16 caches of 6 pages x 16 slots x 2 heads x 64 dims (bytes): NHD, HND, the 5-D form's K
    // and V (the K/V dim as a size-2 dim), a tuple carved from one buffer, a padded page stride
    const int64_t kNhd[4] = {6, 16, 2, 2}, sNhd[4] = {4096, 256, 128, 8192 * 3};
    CHECK(flashinfer::strides_nest(4, kNhd, sNhd, 128));
    const int64_t sHnd[4] = {4096, 128, 2048, 8192 * 3};
    CHECK(flashinfer::strides_nest(4, kNhd, sHnd, 128));
    const int64_t s5d[4] = {8192, 256, 128, 4096};  // [P, 2, ps, H, D]: V 4096 bytes after K
    CHECK(flashinfer::strides_nest(4, kNhd, s5d, 128));
    const int64_t sPad[4] = {5000, 256, 128, 30000};
    CHECK(flashinfer::strides_nest(4, kNhd, sPad, 128));
    // refused: K and V one page apart inside one buffer ((b[:6], b[1:7])), an expanded K/V dim
    // (V over K), slots expanded (stride 0), heads half a row apart, an empty view accepted
    const int64_t sShift[4] = {4096, 256, 128, 4096};
    CHECK(!flashinfer::strides_nest(4, kNhd, sShift, 128));
    const int64_t sExpKV[4] = {4096, 256, 128, 0};
    CHECK(!flashinfer::strides_nest(4, kNhd, sExpKV, 128));
    const int64_t sExpSlot[4] = {4096, 0, 128, 8192 * 3};
    CHECK(!flashinfer::strides_nest(4, kNhd, sExpSlot, 128));
    const int64_t sHalf[4] = {4096, 256, 64, 8192 * 3};
    CHECK(!flashinfer::strides_nest(4, kNhd, sHalf, 128));
    const int64_t kEmpty[4] = {0, 16, 2, 2};
    CHECK(flashinfer::strides_nest(4, kEmpty, sExpSlot, 128));
  }

  CHECK(RowLayout{3, 100, 10}.strides_multiple_of(2));
  CHECK(!RowLayout{3, 100, 9}.strides_multiple_of(2));
  return test::finish("test_layout");
}
