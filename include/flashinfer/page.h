// Paged KV-cache view and its index math: request lengths, (request, position) -> (page,
// entry), element offsets for both layouts. Pure C++17 (FLASHINFER_HOST_DEVICE): decode,
// prefill and the append kernel use it on the device, ctest checks it on the CPU.
#pragma once

#include <cstdint>

#include "config.h"

namespace flashinfer {

// NHD: [num_pages, page_size, num_heads, head_dim]; HND: [num_pages, num_heads, page_size, head_dim].
enum class QKVLayout : int { kNHD = 0, kHND = 1 };

template <typename DType, typename IdType>
struct PagedKV {
  DType* k_data;  // page p, entry e, head h, feature d at p*stride_page + e*stride_n + h*stride_h + d
  DType* v_data;  // same strides as k_data (k and v may live in one [num_pages, 2, ...] tensor)
  const IdType* indptr;         // [batch_size + 1]: pages of request b are indices[indptr[b]:indptr[b+1]]
  const IdType* indices;        // [indptr[batch_size]]: page ids, in order; pages may be shared
  const IdType* last_page_len;  // [batch_size]: entries used in the last page, 1..page_size
  int64_t batch_size;
  int64_t page_size;
  int64_t num_heads;
  int64_t head_dim;
  int64_t stride_page;  // elements between pages
  int64_t stride_n;     // elements between entries of a page
  int64_t stride_h;     // elements between heads

  FLASHINFER_HOST_DEVICE int64_t num_pages(int64_t b) const { return int64_t(indptr[b + 1]) - int64_t(indptr[b]); }

  // Tokens held by request b: (pages - 1) * page_size + last_page_len; 0 for no pages.
  FLASHINFER_HOST_DEVICE int64_t length(int64_t b) const {
    const int64_t n = num_pages(b);
    return n == 0 ? 0 : (n - 1) * page_size + int64_t(last_page_len[b]);
  }

  // Page id holding token `pos` of request b, and the entry within that page.
  FLASHINFER_HOST_DEVICE int64_t page_of(int64_t b, int64_t pos) const {
    return int64_t(indices[int64_t(indptr[b]) + pos / page_size]);
  }
  FLASHINFER_HOST_DEVICE static int64_t entry_of(int64_t pos, int64_t page_size) { return pos % page_size; }

  // Element offset of (page, entry, head, 0).
  FLASHINFER_HOST_DEVICE int64_t offset(int64_t page, int64_t entry, int64_t head) const {
    return page * stride_page + entry * stride_n + head * stride_h;
  }
  // Element offset of token `pos` of request b, head `head`, feature 0.
  FLASHINFER_HOST_DEVICE int64_t token_offset(int64_t b, int64_t pos, int64_t head) const {
    return offset(page_of(b, pos), pos % page_size, head);
  }
};

// Strides of a contiguous-per-page cache tensor in `layout` (the binding passes the real
// strides of whatever tensor it got; this is the dense case).
struct PageStrides {
  int64_t page, n, h;
};
FLASHINFER_HOST_DEVICE PageStrides dense_page_strides(QKVLayout layout, int64_t page_size, int64_t num_heads,
                                                      int64_t head_dim) {
  if (layout == QKVLayout::kNHD) return {page_size * num_heads * head_dim, num_heads * head_dim, head_dim};
  return {page_size * num_heads * head_dim, head_dim, page_size * head_dim};
}

}  // namespace flashinfer
