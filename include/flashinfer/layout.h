// Row addressing for row-wise ops (norm, activation): a tensor [..., H] whose leading dims
// collapse to at most two levels, so a view such as q = qkv[:, :heads*d].view(N, heads, d)
// needs no copy. Pure C++17.
#pragma once

#include <cstdint>

#include "config.h"

namespace flashinfer {

// Row r starts at (r / inner) * stride_outer + (r % inner) * stride_inner elements.
// A 2-D tensor [N, H] is {inner = 1, stride_outer = stride(0), stride_inner = 0}.
struct RowLayout {
  int64_t inner = 1;
  int64_t stride_outer = 0;
  int64_t stride_inner = 0;

  FLASHINFER_HOST_DEVICE int64_t offset(int64_t r) const {
    return (r / inner) * stride_outer + (r % inner) * stride_inner;
  }
  // True when every row start is a multiple of `elems` elements (given an aligned base).
  FLASHINFER_HOST_DEVICE bool strides_multiple_of(int64_t elems) const {
    return stride_outer % elems == 0 && stride_inner % elems == 0;
  }
  // True when every row of a tensor based at `base` starts on a `bytes`-byte boundary, `elems`
  // elements being `bytes` bytes (the vectorised kernels' condition: 16-byte vectors).
  bool rows_aligned(const void* base, int64_t elems, uintptr_t bytes) const {
    return reinterpret_cast<uintptr_t>(base) % bytes == 0 && strides_multiple_of(elems);
  }
};

// Collapses leading dims (all but the last) of a tensor with `ndim` dims into a RowLayout.
// Returns false when they do not fold into two levels. Zero-size tensors fold trivially.
inline bool fold_rows(int ndim, const int64_t* shape, const int64_t* stride, RowLayout* out,
                      int64_t* rows) {
  int64_t n = 1;
  for (int i = 0; i + 1 < ndim; ++i) n *= shape[i];
  *rows = n;
  *out = RowLayout{};
  if (ndim <= 1 || n == 0) return true;
  // Walk leading dims from innermost outward, merging a dim into the current level when its
  // stride equals (size * stride) of the level below; size-1 dims never matter.
  int64_t lvl_size[2] = {1, 1}, lvl_stride[2] = {0, 0};
  int levels = 0;
  for (int i = ndim - 2; i >= 0; --i) {
    if (shape[i] == 1) continue;
    if (levels > 0 && stride[i] == lvl_size[levels - 1] * lvl_stride[levels - 1]) {
      lvl_size[levels - 1] *= shape[i];
      continue;
    }
    if (levels == 2) return false;
    lvl_size[levels] = shape[i];
    lvl_stride[levels] = stride[i];
    ++levels;
  }
  if (levels == 2) {
    *out = RowLayout{lvl_size[0], lvl_stride[1], lvl_stride[0]};
  } else if (levels == 1) {
    *out = RowLayout{1, lvl_stride[0], 0};
  }
  return true;
}

namespace detail {
inline int64_t mag(int64_t v) { return v < 0 ? -v : v; }
inline int64_t floor_div(int64_t a, int64_t b) {  // b > 0
  const int64_t q = a / b;
  return (a % b != 0 && a < 0) ? q - 1 : q;
}
inline int64_t clamp64(int64_t v, int64_t lo, int64_t hi) { return v < lo ? lo : (v > hi ? hi : v); }

// The bytes [*lo, *hi) that `rows` rows of `width` bytes laid out by l (strides in bytes) cover,
// the first row at `base`.
inline void byte_span(const RowLayout& l, int64_t rows, int64_t width, int64_t base, int64_t* lo, int64_t* hi) {
  const int64_t n_in = l.inner > 1 ? l.inner : 1, n_out = rows / n_in;
  const int64_t e_in = (n_in - 1) * l.stride_inner, e_out = (n_out - 1) * l.stride_outer;
  *lo = base + (e_in < 0 ? e_in : 0) + (e_out < 0 ? e_out : 0);
  *hi = base + (e_in > 0 ? e_in : 0) + (e_out > 0 ? e_out : 0) + width;
}

// Whether a row of a_bytes and a row of b_bytes meet when b's starts c + k * s after a's for
// some k in [-(n - 1), n - 1] (the row pairs of two tensors of n rows at one stride s; a
// negative s only swaps the sign of k): -b_bytes < c + k * s < a_bytes.
inline bool shifts_meet(int64_t c, int64_t s, int64_t n, int64_t a_bytes, int64_t b_bytes) {
  s = mag(s);
  if (n <= 1 || s == 0) return -b_bytes < c && c < a_bytes;
  const int64_t k_lo = floor_div(-b_bytes - c, s) + 1, k_hi = floor_div(a_bytes - c - 1, s);
  return (k_lo > -(n - 1) ? k_lo : -(n - 1)) <= (k_hi < n - 1 ? k_hi : n - 1);
}
}  // namespace detail

// True when no two of the `rows` rows (`hidden` elements each) that `l` addresses share an
// element: a kernel may then write every row. Exact. Along each level, consecutive rows must be
// at least `hidden` apart. Across the two levels, every difference dx * x + dy * y of row
// offsets is checked, walking the level with fewer rows. For each dx, only the dy nearest to
// -dx * x / y matter, so the cost is O(min(level counts)).
inline bool rows_disjoint(const RowLayout& l, int64_t rows, int64_t hidden) {
  if (rows <= 1 || hidden <= 0) return true;
  const int64_t n_in = l.inner > 1 ? l.inner : 1, n_out = rows / n_in;
  int64_t cnt[2], str[2];
  int levels = 0;
  if (n_in > 1) cnt[levels] = n_in, str[levels++] = detail::mag(l.stride_inner);
  if (n_out > 1) cnt[levels] = n_out, str[levels++] = detail::mag(l.stride_outer);
  for (int i = 0; i < levels; ++i)
    if (str[i] < hidden) return false;
  if (levels < 2) return true;
  const int xi = cnt[0] <= cnt[1] ? 0 : 1;
  const int64_t nx = cnt[xi], x = str[xi], ny = cnt[1 - xi], y = str[1 - xi];
  for (int64_t dx = -(nx - 1); dx <= nx - 1; ++dx) {  // differences with dy >= 1 (dy = 0: above)
    const int64_t t = dx * x, q = detail::floor_div(-t, y);
    const int64_t dys[2] = {detail::clamp64(q, 1, ny - 1), detail::clamp64(q + 1, 1, ny - 1)};
    for (int64_t dy : dys)
      if (detail::mag(t + dy * y) < hidden) return false;
  }
  return true;
}

// True when some row of tensor a (`a_bytes` wide) and some row of tensor b (`b_bytes` wide)
// share a byte: `rows` rows laid out by a and b (strides in bytes), b's first row `delta` bytes
// after a's. Exact when both are single-level with equal strides: the case of two 2-D tensors
// with one row stride (e.g. an activation's input and an out carved from the same buffer).
// Otherwise it is conservative: it compares the byte spans the two tensors cover.
inline bool rows_intersect(const RowLayout& a, const RowLayout& b, int64_t delta, int64_t rows, int64_t a_bytes,
                           int64_t b_bytes) {
  if (rows <= 0 || a_bytes <= 0 || b_bytes <= 0) return false;
  if (a.inner <= 1 && b.inner <= 1 && a.stride_outer == b.stride_outer)
    return detail::shifts_meet(delta, a.stride_outer, rows, a_bytes, b_bytes);
  int64_t alo, ahi, blo, bhi;
  detail::byte_span(a, rows, a_bytes, 0, &alo, &ahi);
  detail::byte_span(b, rows, b_bytes, delta, &blo, &bhi);
  return alo < bhi && blo < ahi;
}

// The same for rows of one width (two tensors of one shape).
inline bool rows_intersect(const RowLayout& a, const RowLayout& b, int64_t delta, int64_t rows,
                           int64_t row_bytes) {
  return rows_intersect(a, b, delta, rows, row_bytes, row_bytes);
}

// True when tensor a (a_rows rows of a_bytes, laid out by la) and tensor b (b_rows rows of
// b_bytes by lb, its first row `delta` bytes after a's) share a byte. A level whose rows lie
// back to back (stride_inner == row bytes: one token's heads) merges into one wider row. Exact
// when both have the same number of outer rows (tokens) at one outer stride: every pair of
// inner rows (heads) is tested for a token shift that makes them meet (O(1) each, up to
// kExactHeadPairs pairs), which covers views of one fused QKV buffer, packed ([N, (Hq + 2 Hk) d])
// or per head ([N, H, 3 d]). Otherwise the byte spans are compared (conservative).
constexpr int64_t kExactHeadPairs = int64_t{1} << 14;
inline bool tensors_intersect(const RowLayout& la, int64_t a_rows, int64_t a_bytes, const RowLayout& lb,
                              int64_t b_rows, int64_t b_bytes, int64_t delta) {
  if (a_rows <= 0 || b_rows <= 0 || a_bytes <= 0 || b_bytes <= 0) return false;
  auto merge = [](const RowLayout& l, int64_t* rows, int64_t* bytes) {
    if (l.inner <= 1 || l.stride_inner != *bytes) return l;
    *rows /= l.inner;
    *bytes *= l.inner;
    return RowLayout{1, l.stride_outer, 0};
  };
  const RowLayout ma = merge(la, &a_rows, &a_bytes), mb = merge(lb, &b_rows, &b_bytes);
  int64_t alo, ahi, blo, bhi;
  detail::byte_span(ma, a_rows, a_bytes, 0, &alo, &ahi);
  detail::byte_span(mb, b_rows, b_bytes, delta, &blo, &bhi);
  if (!(alo < bhi && blo < ahi)) return false;  // apart: the usual answer, in O(1)
  const int64_t na = ma.inner > 1 ? ma.inner : 1, nb = mb.inner > 1 ? mb.inner : 1, n = a_rows / na;
  if (n != b_rows / nb || (n > 1 && ma.stride_outer != mb.stride_outer) || na * nb > kExactHeadPairs)
    return true;  // no exact test for these layouts: the spans meet
  // b's row (t', j) starts c + (t' - t) * stride_outer after a's row (t, i)
  for (int64_t i = 0; i < na; ++i)
    for (int64_t j = 0; j < nb; ++j) {
      const int64_t c = delta + j * (nb > 1 ? mb.stride_inner : 0) - i * (na > 1 ? ma.stride_inner : 0);
      if (detail::shifts_meet(c, ma.stride_outer, n, a_bytes, b_bytes)) return true;
    }
  return false;
}

// True when a view of n dims (sizes, strides in bytes) over rows of `width` bytes addresses no
// byte twice: with its dims sorted by |stride|, each stride covers at least a row plus the span
// of the dims below it. Sufficient, not necessary: dims that interleave without meeting are
// refused; no layout a cache is allocated or sliced in does that. Dims of size 1 never
// matter; an empty view addresses nothing. n <= 8.
inline bool strides_nest(int n, const int64_t* size, const int64_t* stride, int64_t width) {
  int64_t s[8];
  int64_t c[8];
  int m = 0;
  for (int i = 0; i < n && i < 8; ++i) {
    if (size[i] == 0) return true;
    if (size[i] == 1) continue;
    int j = m++;
    for (; j > 0 && s[j - 1] > detail::mag(stride[i]); --j) s[j] = s[j - 1], c[j] = c[j - 1];
    s[j] = detail::mag(stride[i]), c[j] = size[i];
  }
  int64_t span = width;  // bytes from the first byte of the lowest row to the end of the highest
  for (int i = 0; i < m; ++i) {
    if (s[i] < span) return false;
    span += (c[i] - 1) * s[i];
  }
  return true;
}

}  // namespace flashinfer
