// Parameters, validation and launch arithmetic of the sampling kernels (sampling.cuh,
// sampling_logits.cuh): one block per output row walking the row in 16-byte vectors, with
// the row's leading tiles kept in shared memory between passes. Pure C++17.
#pragma once

#include <cstdint>

#include "config.h"
#include "philox.h"
#include "status.h"

namespace flashinfer {
namespace sampling {

// Seeds and offsets of the outputs' Philox streams: scalars, or int64/uint64 arrays of
// length 1 (broadcast) or batch. Output row b is the stream's subsequence.
struct RandomSeeds {
  const uint64_t* seed_arr = nullptr;    // [seed_len] or nullptr -> seed
  const uint64_t* offset_arr = nullptr;  // [offset_len] or nullptr -> offset
  uint64_t seed = 0, offset = 0;
  int64_t seed_len = 1, offset_len = 1;

  // Device-side: reads the arrays (after the kernel's pdl_wait()).
  FLASHINFER_HOST_DEVICE PhiloxStream stream(int64_t b) const {
    PhiloxStream s;
    s.seed = seed_arr ? seed_arr[seed_len == 1 ? 0 : b] : seed;
    s.offset = offset_arr ? offset_arr[offset_len == 1 ? 0 : b] : offset;
    s.subsequence = static_cast<uint32_t>(b);
    return s;
  }
};

// Sampling from probabilities (fp32), one output per block. Filters are per distribution row
// when their array is given. top_k_first: top-p applies to the top-k-renormalized row.
template <typename IdT>
struct SamplingParams {
  const float* probs = nullptr;  // [rows, vocab], row r at probs + r * row_stride
  int64_t row_stride = 0;
  int64_t rows = 0;
  int vocab = 0;
  int64_t batch = 0;
  const IdT* indices = nullptr;  // [batch] distribution row of output b; nullptr: row b
  IdT* out = nullptr;            // [batch]
  bool* valid = nullptr;         // [batch] or nullptr
  const int* top_k_arr = nullptr;    // [rows] or nullptr -> top_k
  const float* top_p_arr = nullptr;  // [rows] or nullptr -> top_p
  const float* min_p_arr = nullptr;  // [rows] or nullptr -> min_p
  int top_k = 0;
  float top_p = 1.f;
  float min_p = 0.f;
  bool use_top_k = false, use_top_p = false, use_min_p = false;
  bool top_k_first = false;
  RandomSeeds rng;
  int* stats = nullptr;  // [batch, 2] (draws, passes over the row) or nullptr
  // CTAs per row: -1 the launcher decides (FLASHINFER_SAMPLING_CLUSTER, then cluster_split's
  // heuristic); 0 or 1 the one-block kernel; >= 2 a cluster of that many (sm_90, else 1).
  int cluster = -1;
  bool pdl = false;
};

enum class RenormKind : int {
  kTopKRenorm = 0,  // keep the k largest (ties kept), divide by their sum; else 0
  kTopPRenorm = 1,  // keep {i : mass above p_i < top_p}, divide by their sum; else 0
  kTopKMask = 2,    // keep the k largest logits (ties kept); else -inf
};

template <typename T>
struct RenormParams {
  const T* in = nullptr;  // [rows, vocab], row r at in + r * in_stride
  T* out = nullptr;       // [rows, vocab], row r at out + r * out_stride
  int64_t in_stride = 0, out_stride = 0;
  int64_t rows = 0;
  int vocab = 0;
  RenormKind kind = RenormKind::kTopKRenorm;
  const int* top_k_arr = nullptr;    // [rows] or nullptr -> top_k
  const float* top_p_arr = nullptr;  // [rows] or nullptr -> top_p
  int top_k = 0;
  float top_p = 1.f;
  bool pdl = false;
};

// probs = softmax(logits * inv_temperature) row-wise, fp32.
struct SoftmaxParams {
  const float* logits = nullptr;  // [rows, vocab], row r at logits + r * in_stride
  float* out = nullptr;           // [rows, vocab], row r at out + r * out_stride
  int64_t in_stride = 0, out_stride = 0;
  int64_t rows = 0;
  int vocab = 0;
  const float* temperature_arr = nullptr;  // [rows] or nullptr -> temperature
  float temperature = 1.f;                 // T == 0 means inverse temperature 0
  bool pdl = false;
};

// Gumbel-max sampling from logits: argmax(logit + Gumbel), one Philox word per element.
template <typename IdT>
struct LogitsSamplingParams {
  const float* logits = nullptr;  // [rows, vocab], row r at logits + r * row_stride
  int64_t row_stride = 0;
  int64_t rows = 0;
  int vocab = 0;
  int64_t batch = 0;
  const IdT* indices = nullptr;  // [batch] or nullptr
  IdT* out = nullptr;            // [batch]
  RandomSeeds rng;
  bool pdl = false;
};

// Chain speculative sampling: n draft tokens per request verified against n + 1 targets.
struct ChainSpeculativeParams {
  const float* draft_probs = nullptr;   // [batch, n, vocab] via draft_stride_b/_n
  const int* draft_ids = nullptr;       // [batch, n] via ids_stride_b (last dim contiguous)
  const float* target_probs = nullptr;  // [batch, n + 1, vocab] via target_stride_b/_n
  int* out = nullptr;                   // [batch, n + 1] contiguous
  int* accepted = nullptr;              // [batch], incremented
  int* emitted = nullptr;               // [batch], incremented
  int64_t draft_stride_b = 0, draft_stride_n = 0, ids_stride_b = 0;
  int64_t target_stride_b = 0, target_stride_n = 0;
  int64_t batch = 0;
  int n = 0;
  int vocab = 0;
  RandomSeeds rng;
  bool pdl = false;
};

// The k largest of each row (flashinfer.top_k): every element above the k-th largest, then
// k - (their count) of the ties at it, by index (the smallest, or the largest for kLarge).
enum class TopKTieBreak : int { kNone = 0, kSmall = 1, kLarge = 2 };

template <typename T>
struct TopKParams {
  const T* in = nullptr;        // [rows, vocab], row r at in + r * in_stride
  T* values = nullptr;          // [rows, k] contiguous
  int64_t* indices = nullptr;   // [rows, k] contiguous
  int64_t in_stride = 0;
  int64_t rows = 0;
  int vocab = 0;
  int k = 0;
  TopKTieBreak tie_break = TopKTieBreak::kNone;
  bool pdl = false;
};

// ---- launch arithmetic ------------------------------------------------------------------------

// 512 threads with up to 128 registers each: 32 elements (128 bytes of fp32) per thread in
// flight per step is 64 KiB per SM, what ~1 us of HBM latency needs at 1/132 of 4.8 TB/s, and
// leaves room for 8 pivots' counters beside the loop state (1024 threads cap at 64 registers).
constexpr int kMaxThreads = 512;
constexpr int kStepElems = 32;       // elements per thread per step
constexpr int kMaxChunks = 32;       // rows of the per-chunk mass table
constexpr int kTableCols = 8;        // pivots per aggregate pass at most
constexpr int kListCapacity = 8192;  // gathered candidates (value + index: 64 KiB)

// 16-byte vectors per thread per step.
template <int kVec>
constexpr int kStepVecs = kStepElems / kVec;

// Block-reduction scratch at the start of the dynamic shared memory (sampling_block.cuh).
constexpr int64_t kScratchBytes = 2 * 32 * kTableCols * 4 + 16;

// Element i of a row is owned by thread (i / vec) % threads in tile i / (threads * vec); a
// step is kStepElems / vec consecutive tiles, a chunk steps_per_chunk consecutive steps.
struct ScanLayout {
  int vec = 4;        // elements per 16-byte vector
  int threads = 32;   // block size, multiple of 32
  int tile = 128;     // threads * vec elements
  int steps = 1;      // steps per row
  int steps_per_chunk = 1;
  int chunks = 1;
  int cache_elems = 0;  // leading elements kept in shared memory (whole tiles, <= vocab)
  int list_cap = 0;     // gathered-candidate capacity
  int early = 2;        // top-p early accept: 0 off, 1 checked after every chunk, 2 after cached chunks only
  // dynamic shared memory, bytes from its start: scratch, row cache (at kScratchBytes), mass
  // table, chunk masses, list values, list indices, cluster exchange (cluster path only);
  // every part 16-byte aligned
  int64_t off_table = 0, off_csum = 0, off_list_val = 0, off_list_idx = 0, off_cluster = 0, smem_bytes = 0;
};

FLASHINFER_HOST_DEVICE int64_t align16(int64_t x) { return (x + 15) / 16 * 16; }

// Block size (kStepElems per thread for `spread` elements, 32..kMaxThreads), tile, steps and
// chunks of a scan over n elements (l->vec set).
inline void scan_shape(ScanLayout* l, int64_t spread, int64_t n) {
  const int64_t t = round_up<int64_t>(ceil_div<int64_t>(spread, kStepElems), 32);
  l->threads = static_cast<int>(t < 32 ? 32 : (t > kMaxThreads ? kMaxThreads : t));
  l->tile = l->threads * l->vec;
  l->steps = static_cast<int>(ceil_div<int64_t>(n, int64_t{l->threads} * kStepElems));
  l->steps_per_chunk = ceil_div(l->steps, kMaxChunks);
  l->chunks = ceil_div(l->steps, l->steps_per_chunk);
}

// elem_bytes: 4 (fp32) or 2 (fp16/bf16). want_list: the kernel may gather candidates.
// smem_budget: dynamic shared memory one block may use.
inline ScanLayout scan_layout(int vocab, int elem_bytes, bool want_list, int64_t smem_budget) {
  ScanLayout l;
  l.vec = 16 / elem_bytes;
  const int64_t vecs = ceil_div<int64_t>(vocab > 0 ? vocab : 1, l.vec);
  scan_shape(&l, vecs * l.vec, vocab > 0 ? vocab : 1);
  l.list_cap = want_list ? (vocab < kListCapacity ? vocab : kListCapacity) : 0;
  const int warps = l.threads / 32;
  const int64_t table = int64_t{l.chunks} * warps * kTableCols * 4;
  const int64_t csum = int64_t{l.chunks} * kTableCols * 4;
  const int64_t list = int64_t{l.list_cap} * 4;
  const int64_t fixed = kScratchBytes + align16(table) + align16(csum) + 2 * align16(list);
  int64_t cache_tiles = vocab / l.tile;
  const int64_t tile_bytes = int64_t{l.tile} * elem_bytes;
  const int64_t fit = smem_budget > fixed ? (smem_budget - fixed) / tile_bytes : 0;
  if (cache_tiles > fit) cache_tiles = fit;
  l.cache_elems = static_cast<int>(cache_tiles * l.tile);
  l.off_table = kScratchBytes + align16(int64_t{l.cache_elems} * elem_bytes);
  l.off_csum = l.off_table + align16(table);
  l.off_list_val = l.off_csum + align16(csum);
  l.off_list_idx = l.off_list_val + align16(list);
  l.smem_bytes = l.off_list_idx + align16(list);
  l.off_cluster = l.smem_bytes;
  return l;
}

// ---- the cluster path (sm_90): one thread-block cluster per output row ---------------------
//
// CTA r of a cluster of `size` owns the row's elements [r * slice, min(vocab, (r + 1) * slice))
// and keeps all of them in its shared memory after the first pass, so later rounds read shared
// memory only; the per-round counts and masses are exchanged through distributed shared memory
// (sampling_cluster.cuh). The pivot logic (sampling.h) is the same as the one-block kernel's.

constexpr int kMaxCluster = 16;        // CTAs per cluster at most (16 needs the non-portable opt-in)
constexpr int kClusterMinVocab = 8192;  // auto mode keeps shorter rows on the one-block kernel

// What one CTA publishes per exchange (double-buffered), read by every CTA of the cluster.
struct ClusterSlot {
  float sum[kTableCols];
  int cnt[kTableCols];
  float max, min;
  int nan;
  int pad[5];
};
static_assert(sizeof(ClusterSlot) % 16 == 0, "ClusterSlot is copied in 16-byte words");

// The element the owning CTA picked, broadcast to the cluster.
struct ClusterPick {
  long long index;
  float value;
  int pad;
};

// Exchange area at ScanLayout::off_cluster: two published slots, the pick, every rank's last
// slot copied locally (the folds read them in rank order), and their fold.
constexpr int64_t kClusterBytes = 2 * int64_t{sizeof(ClusterSlot)} + int64_t{sizeof(ClusterPick)} +
                                  (kMaxCluster + 1) * int64_t{sizeof(ClusterSlot)};

struct ClusterSplit {
  int size = 1;   // CTAs per row; 1: the one-block kernel
  int slice = 0;  // elements per CTA (a multiple of 4, so 16-byte aligned rows stay aligned)
};

inline int cluster_slice(int vocab, int size) {
  const int64_t per = ceil_div<int64_t>(vocab > 0 ? vocab : 1, size);
  return static_cast<int>(round_up<int64_t>(per, 4));
}

// One CTA's layout on the cluster path: the whole slice cached, no candidate list, the
// exchange area last. fp32 only.
inline ScanLayout slice_layout(int slice) {
  ScanLayout l;
  l.vec = 4;
  scan_shape(&l, slice, slice > 0 ? slice : 1);
  l.list_cap = 0;
  // Whole tiles: the first pass fills every cached position (padding past the slice is -inf).
  l.cache_elems = static_cast<int>(round_up<int64_t>(slice > 0 ? slice : 1, l.tile));
  const int warps = l.threads / 32;
  const int64_t table = int64_t{l.chunks} * warps * kTableCols * 4;
  const int64_t csum = int64_t{l.chunks} * kTableCols * 4;
  l.off_table = kScratchBytes + align16(int64_t{l.cache_elems} * 4);
  l.off_csum = l.off_table + align16(table);
  l.off_list_val = l.off_csum + align16(csum);
  l.off_list_idx = l.off_list_val;
  l.off_cluster = l.off_list_idx;
  l.smem_bytes = l.off_cluster + align16(kClusterBytes);
  return l;
}

inline bool slice_fits(int vocab, int size, int64_t smem_budget) {
  return slice_layout(cluster_slice(vocab, size)).smem_bytes <= smem_budget;
}

// CTAs per row. forced: 0 = auto, 1 = the one-block kernel, >= 2 = that many (rounded down to
// a power of two <= max_cluster, then up until the slice fits shared memory). Auto: clusters
// only for rows of at least kClusterMinVocab when every row can have a full cluster of
// kMaxCluster CTAs in one wave (batch * kMaxCluster <= num_sms): enough CTAs to fill the SMs,
// and at least enough for every slice to fit. max_cluster < 2 (no sm_90): always 1.
inline ClusterSplit cluster_split(int64_t batch, int vocab, int num_sms, int64_t smem_budget, int max_cluster,
                                  int forced) {
  ClusterSplit s;
  if (max_cluster > kMaxCluster) max_cluster = kMaxCluster;
  if (max_cluster < 2 || forced == 1 || batch <= 0 || vocab <= 0) return s;
  int size = 1;
  if (forced >= 2) {
    const int want = forced < max_cluster ? forced : max_cluster;
    size = 2;
    while (size * 2 <= want) size *= 2;
  } else {
    // H200: clusters of 4 per row at batch 32-64 were slower than one block per row
    // (top-k-first top-k/top-p 423-610 us vs ~195, min-p at 64: 90 vs 71 us); at batch <= 8
    // with 16 CTAs per row they win (min-p at batch 1: 31 vs 71 us, top-k: 47 vs 104 us).
    if (vocab < kClusterMinVocab || batch * kMaxCluster > num_sms) return s;
    const int64_t fill = num_sms / batch;
    size = 2;
    while (size * 2 <= fill && size * 2 <= max_cluster) size *= 2;
  }
  while (!slice_fits(vocab, size, smem_budget) && size * 2 <= max_cluster) size *= 2;
  if (!slice_fits(vocab, size, smem_budget)) return s;
  s.size = size;
  s.slice = cluster_slice(vocab, size);
  return s;
}

// Kept out of the dynamic shared memory budget (the kernels use no static shared memory).
constexpr int64_t kStaticSmemReserve = 1024;

inline Status check_rows(int64_t rows, int vocab, int64_t batch) {
  if (rows < 0 || batch < 0 || vocab <= 0 || vocab > (1 << 30)) return Status::kInvalidArgument;
  if (batch > 0x7fffffff || rows > (int64_t{1} << 40)) return Status::kInvalidArgument;
  return Status::kSuccess;
}

template <typename IdT>
Status validate(const SamplingParams<IdT>& p) {
  if (check_rows(p.rows, p.vocab, p.batch) != Status::kSuccess) return Status::kInvalidArgument;
  if (p.batch > 0 && (!p.out || (p.rows > 0 && !p.probs))) return Status::kInvalidArgument;
  if (p.rows > 1 && p.row_stride < p.vocab) return Status::kInvalidArgument;
  return Status::kSuccess;
}

template <typename T>
Status validate(const RenormParams<T>& p) {
  if (check_rows(p.rows, p.vocab, 0) != Status::kSuccess) return Status::kInvalidArgument;
  if (p.rows > 0 && (!p.in || !p.out)) return Status::kInvalidArgument;
  if (p.rows > 1 && (p.in_stride < p.vocab || p.out_stride < p.vocab)) return Status::kInvalidArgument;
  return Status::kSuccess;
}

inline Status validate(const SoftmaxParams& p) {
  if (check_rows(p.rows, p.vocab, 0) != Status::kSuccess) return Status::kInvalidArgument;
  if (p.rows > 0 && (!p.logits || !p.out)) return Status::kInvalidArgument;
  if (p.rows > 1 && (p.in_stride < p.vocab || p.out_stride < p.vocab)) return Status::kInvalidArgument;
  return Status::kSuccess;
}

template <typename IdT>
Status validate(const LogitsSamplingParams<IdT>& p) {
  if (check_rows(p.rows, p.vocab, p.batch) != Status::kSuccess) return Status::kInvalidArgument;
  if (p.batch > 0 && (!p.out || (p.rows > 0 && !p.logits))) return Status::kInvalidArgument;
  if (p.rows > 1 && p.row_stride < p.vocab) return Status::kInvalidArgument;
  return Status::kSuccess;
}

template <typename T>
Status validate(const TopKParams<T>& p) {
  if (check_rows(p.rows, p.vocab, 0) != Status::kSuccess) return Status::kInvalidArgument;
  if (p.k < 1 || p.k > p.vocab) return Status::kInvalidArgument;
  if (p.rows > 0 && (!p.in || !p.values || !p.indices)) return Status::kInvalidArgument;
  return Status::kSuccess;
}

inline Status validate(const ChainSpeculativeParams& p) {
  if (check_rows(p.batch, p.vocab, p.batch) != Status::kSuccess || p.n < 0) return Status::kInvalidArgument;
  if (p.batch > 0 && (!p.target_probs || !p.out || !p.accepted || !p.emitted)) return Status::kInvalidArgument;
  if (p.batch > 0 && p.n > 0 && (!p.draft_probs || !p.draft_ids)) return Status::kInvalidArgument;
  return Status::kSuccess;
}

}  // namespace sampling
}  // namespace flashinfer
