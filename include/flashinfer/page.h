// Paged KV-cache view and its index math: request lengths, (request, position) -> (page,
// entry), element offsets for both layouts. Pure C++17 (FLASHINFER_HOST_DEVICE): decode,
// prefill and the append kernel use it on the device, ctest checks it on the CPU.
#pragma once

#include <cstdint>
#include <cstdlib>

#include "config.h"
#include "status.h"

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

// Walks the positions pos, pos + step, pos + 2 step, ... of one request as (page slot, entry)
// pairs -- slot indexes the request's page list, indices[indptr[b] + slot] -- with one split
// (div_mod) at the start and none per step. Positions and page sizes fit in 32 bits (the
// decode kernels' key ranges do).
struct PageCursor {
  int32_t slot, entry, page_size, step_slots, step_entry;
  FLASHINFER_HOST_DEVICE PageCursor(int32_t pos, int32_t page_size_, int32_t step) : page_size(page_size_) {
    div_mod(pos, page_size_, &slot, &entry);
    div_mod(step, page_size_, &step_slots, &step_entry);
  }
  FLASHINFER_HOST_DEVICE void advance() {
    slot += step_slots;
    entry += step_entry;
    if (entry >= page_size) {
      entry -= page_size;
      ++slot;
    }
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

// ---- Bounds-checked index math: the append kernel and get_batch_indices_positions -------

// Why a (request, position) has no slot in the cache; bits, 0 = located.
enum PageIndexError : int32_t {
  kBadBatchIndex = 1,   // b outside [0, batch_size)
  kBadPosition = 2,     // pos < 0
  kPageNotInTable = 4,  // pos / page_size is not one of request b's pages (indptr too small, or corrupt)
  kBadPageId = 8,       // the page id in `indices` is outside [0, max_num_pages)
};

// locate() for kernels that must never touch memory outside the cache, whatever the page table
// holds, given request b's page-table range [begin, end) = [indptr[b], indptr[b + 1]) (b already
// checked against batch_size). num_indices: elements of `indices`; max_num_pages: pages of the
// cache tensor. On success returns 0 and the page id and entry of token `pos`.
template <typename DType, typename IdType>
FLASHINFER_HOST_DEVICE int32_t locate_in_range(const PagedKV<DType, IdType>& kv, int64_t pos, int64_t begin,
                                               int64_t end, int64_t num_indices, int64_t max_num_pages,
                                               int64_t* page, int64_t* entry) {
  if (pos < 0) return kBadPosition;
  // pos / page_size and pos % page_size in 32 bits when they fit (a 64-bit division is a
  // ~60-instruction subroutine on the device)
  int64_t quot, rem;
  if (pos <= 0xffffffffLL && kv.page_size <= 0xffffffffLL) {
    const uint32_t p32 = static_cast<uint32_t>(pos), ps32 = static_cast<uint32_t>(kv.page_size);
    const uint32_t q32 = p32 / ps32;
    quot = q32;
    rem = p32 - q32 * ps32;
  } else {
    quot = pos / kv.page_size;
    rem = pos % kv.page_size;
  }
  const int64_t slot = begin + quot;
  if (begin < 0 || slot >= end || slot >= num_indices) return kPageNotInTable;
  const int64_t id = int64_t(kv.indices[slot]);
  if (id < 0 || id >= max_num_pages) return kBadPageId;
  *page = id;
  *entry = rem;
  return 0;
}

// The same for token `pos` of request `b`, reading b's range from indptr.
template <typename DType, typename IdType>
FLASHINFER_HOST_DEVICE int32_t locate_checked(const PagedKV<DType, IdType>& kv, int64_t b, int64_t pos,
                                              int64_t num_indices, int64_t max_num_pages, int64_t* page,
                                              int64_t* entry) {
  if (b < 0 || b >= kv.batch_size) return kBadBatchIndex;
  if (pos < 0) return kBadPosition;
  return locate_in_range(kv, pos, int64_t(kv.indptr[b]), int64_t(kv.indptr[b + 1]), num_indices, max_num_pages,
                         page, entry);
}

// get_batch_indices_positions for entry e of an append: the request b whose range
// [append_indptr[b], append_indptr[b+1]) holds e (the last b with append_indptr[b] <= e, so empty
// requests are skipped), and its position seq_lens[b] - (its append length) + (e - append_indptr[b]).
// Returns false when no request holds e (e beyond append_indptr[batch_size], or a corrupt indptr).
template <typename IdType, typename SeqT>
FLASHINFER_HOST_DEVICE bool append_entry_position(const IdType* append_indptr, const SeqT* seq_lens,
                                                  int64_t batch_size, int64_t e, int64_t* b, int64_t* pos) {
  if (batch_size <= 0) return false;
  int64_t lo = 0, hi = batch_size;
  while (hi - lo > 1) {
    const int64_t mid = (lo + hi) / 2;
    if (int64_t(append_indptr[mid]) <= e) lo = mid; else hi = mid;
  }
  const int64_t begin = int64_t(append_indptr[lo]), end = int64_t(append_indptr[lo + 1]);
  if (e < begin || e >= end) return false;
  *b = lo;
  *pos = int64_t(seq_lens[lo]) - (end - begin) + (e - begin);
  return true;
}

namespace paged_kv {

// append_paged_kv_cache: key[i] -> K and value[i] -> V at (page, entry) of token positions[i]
// of request batch_indices[i], all heads. A pure copy, so T is a storage type of the element
// size (uint16_t for fp16/bf16, uint8_t for fp8): no conversion, two instantiations.
template <typename T, typename IdType>
struct AppendPagedKVParams {
  PagedKV<T, IdType> kv;        // the cache (k_data/v_data, strides) and its page table
  const T* key;                 // [nnz, num_heads, head_dim] via key_stride_n/h
  const T* value;               // [nnz, num_heads, head_dim] via value_stride_n/h
  const IdType* batch_indices;  // [nnz]
  const IdType* positions;      // [nnz]
  int64_t nnz;
  int64_t key_stride_n, key_stride_h, value_stride_n, value_stride_h;
  int64_t num_indices;    // elements of kv.indices
  int64_t max_num_pages;  // pages of the cache tensor
  int32_t* err;           // [2] or null: index errors recorded by index_check.h (opt-in)
  bool pdl;               // launch with programmatic dependent launch (the kernel waits first)
};

// Thread = (token, slot): a slot moves vectors j, j + slots, ..., j + (V - 1) slots of the
// token's K row and the same of its V row (2 V loads in flight, all issued before the page
// lookup), j over [0, heads * head_dim / E). V = vecs_per_thread (1, 2, 4 or 8). With E = 8,
// 8 heads x 128 and V = 4 a token is one warp, and 4096 tokens fit one wave of the H200
// (32 warps per SM at <= 64 registers): every load of the call is in flight at once.
// Launches smaller than kAppendSmallThreads threads at V = 4 (decode steps) are latency-bound:
// they take V = 1, four times the threads, each with a quarter of the instructions.
constexpr int kAppendMaxVecsPerThread = 8;
constexpr int kAppendDefaultVecsPerThread = 4;
constexpr int64_t kAppendSmallThreads = int64_t{132} * 4 * 32;  // a warp per H200 scheduler
constexpr int kAppendScalarVecsPerThread = 2;  // the unaligned (element-wise) kernel's V
constexpr int kAppendThreads = 256;

// Benchmark knobs, read once from the environment (tests may overwrite append_tuning()):
//   FLASHINFER_APPEND_VPT     = 0 (auto: 4, small launches 1) | 1 | 2 | 4 | 8   16-byte vectors of K (and V) per thread
//   FLASHINFER_APPEND_THREADS = 0 (auto: 256) | 128 | 256 | 512 | 1024   block size
// Invalid values mean auto.
struct AppendTuning {
  int vecs_per_thread = 0;
  int threads = 0;
};

// The kernel's __launch_bounds__: 1024 threads (64 registers) up to V = 4, 512 for V = 8
// (its 16 vectors in flight need more than 64 registers).
FLASHINFER_HOST_DEVICE constexpr int append_max_threads(int vecs_per_thread) { return vecs_per_thread <= 4 ? 1024 : 512; }

inline bool valid_append_vpt(int v) { return v == 0 || v == 1 || v == 2 || v == 4 || v == 8; }
inline bool valid_append_threads(int t) { return t == 0 || t == 128 || t == 256 || t == 512 || t == 1024; }

inline AppendTuning append_tuning_from(const char* vpt, const char* threads) {
  AppendTuning t;
  const int v = vpt ? std::atoi(vpt) : 0, n = threads ? std::atoi(threads) : 0;
  t.vecs_per_thread = valid_append_vpt(v) ? v : 0;
  t.threads = valid_append_threads(n) ? n : 0;
  return t;
}

// The process-wide knobs (one instance per module: an inline function's static).
inline AppendTuning& append_tuning() {
  static AppendTuning t =
      append_tuning_from(std::getenv("FLASHINFER_APPEND_VPT"), std::getenv("FLASHINFER_APPEND_THREADS"));
  return t;
}

struct AppendLaunch {
  bool vectorized = false;
  int vec_elems = 1;
  int vecs_per_thread = kAppendScalarVecsPerThread;
  int64_t vecs_per_head = 0;
  int64_t vecs_per_token = 0;
  int64_t slots_per_token = 0;
  int threads = kAppendThreads;
  int64_t blocks = 0;
};

// vec_elems: elements of a 16-byte vector. aligned16: key/value/cache bases 16-byte aligned
// and all their strides multiples of vec_elems. The element-wise kernel (not vectorized)
// always moves kAppendScalarVecsPerThread elements per thread.
inline AppendLaunch append_launch_config(int64_t nnz, int64_t num_heads, int64_t head_dim, int vec_elems,
                                         bool aligned16, const AppendTuning& t = AppendTuning{}) {
  AppendLaunch l;
  l.vectorized = aligned16 && vec_elems > 1 && head_dim % vec_elems == 0;
  l.vec_elems = l.vectorized ? vec_elems : 1;
  l.vecs_per_head = head_dim / l.vec_elems;
  l.vecs_per_token = num_heads * l.vecs_per_head;
  if (!l.vectorized) {
    l.vecs_per_thread = kAppendScalarVecsPerThread;
  } else if (valid_append_vpt(t.vecs_per_thread) && t.vecs_per_thread > 0) {
    l.vecs_per_thread = t.vecs_per_thread;
  } else {
    const int64_t threads = nnz * ceil_div<int64_t>(l.vecs_per_token, kAppendDefaultVecsPerThread);
    l.vecs_per_thread = threads < kAppendSmallThreads ? 1 : kAppendDefaultVecsPerThread;
  }
  l.threads = valid_append_threads(t.threads) && t.threads > 0 ? t.threads : kAppendThreads;
  if (l.threads > append_max_threads(l.vecs_per_thread)) l.threads = append_max_threads(l.vecs_per_thread);
  l.slots_per_token = ceil_div<int64_t>(l.vecs_per_token, l.vecs_per_thread);
  l.blocks = ceil_div<int64_t>(nnz * l.slots_per_token, l.threads);
  return l;
}

template <typename T, typename IdType>
Status validate(const AppendPagedKVParams<T, IdType>& p) {
  const PagedKV<T, IdType>& kv = p.kv;
  if (p.nnz < 0 || kv.batch_size < 0 || kv.page_size <= 0 || kv.num_heads < 0 || kv.head_dim < 0)
    return Status::kInvalidArgument;
  if (p.num_indices < 0 || p.max_num_pages < 0) return Status::kInvalidArgument;
  if (p.nnz == 0 || kv.num_heads == 0 || kv.head_dim == 0) return Status::kSuccess;
  if (!kv.k_data || !kv.v_data || !kv.indptr || (p.num_indices > 0 && !kv.indices)) return Status::kInvalidArgument;
  if (!p.key || !p.value || !p.batch_indices || !p.positions) return Status::kInvalidArgument;
  // the most blocks any tuning launches: element-wise, 128-thread blocks
  AppendTuning most;
  most.threads = 128;
  const AppendLaunch l = append_launch_config(p.nnz, kv.num_heads, kv.head_dim, 1, false, most);
  if (l.blocks > (int64_t{1} << 31) - 1) return Status::kUnsupported;
  // the kernel indexes a token's vectors in 32 bits
  if (l.vecs_per_token * kAppendMaxVecsPerThread >= (int64_t{1} << 32)) return Status::kUnsupported;
  return Status::kSuccess;
}

// get_batch_indices_positions: batch_indices[e] = b (or -1 when no request holds e) and
// positions[e] for every e < nnz; positions of unheld entries are zeroed when zero_unheld.
template <typename IdType, typename SeqT>
struct BatchIndicesPositionsParams {
  const IdType* append_indptr;  // [batch_size + 1]
  const SeqT* seq_lens;         // [batch_size]
  int32_t* batch_indices;       // [nnz]
  int32_t* positions;           // [nnz]
  int64_t batch_size;
  int64_t nnz;
  bool zero_unheld;
};

// Writes entry e's (batch index, position); -1 (and position 0 with zero_unheld) for an
// entry no request holds. The kernel runs it per thread, the host path per entry.
template <typename IdType, typename SeqT>
FLASHINFER_HOST_DEVICE void batch_index_position(const BatchIndicesPositionsParams<IdType, SeqT>& p, int64_t e) {
  int64_t b = 0, pos = 0;
  if (append_entry_position(p.append_indptr, p.seq_lens, p.batch_size, e, &b, &pos)) {
    p.batch_indices[e] = static_cast<int32_t>(b);
    p.positions[e] = static_cast<int32_t>(pos);
  } else {
    p.batch_indices[e] = -1;
    if (p.zero_unheld) p.positions[e] = 0;
  }
}

// The same on the host (CPU tensors), entry by entry.
template <typename IdType, typename SeqT>
void batch_indices_positions_host(const BatchIndicesPositionsParams<IdType, SeqT>& p) {
  for (int64_t e = 0; e < p.nnz; ++e) batch_index_position(p, e);
}

}  // namespace paged_kv

}  // namespace flashinfer
