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

}  // namespace flashinfer
