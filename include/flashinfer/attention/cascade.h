// Merging attention states (cascade): parameters, validation and the launch arithmetic that
// maps threads to (row, head, vector). Pure C++17: the binding fills the Params, ctest checks
// that every vector of every state has exactly one owner. Kernels: cascade.cuh.
#pragma once

#include <cstdint>

#include "../config.h"
#include "../status.h"

namespace flashinfer {
namespace attention {

// Element strides of one set of states: v[n, h, :] starts at v + n * v_n + h * v_h (the last
// dimension is contiguous), s[n, h] is at s + n * s_n + h * s_h.
struct StateStrides {
  int64_t v_n = 0, v_h = 0;
  int64_t s_n = 0, s_h = 0;
};

// out = merge(a, b) row by row (state.h's merge_weights). Outputs may alias inputs with the
// same strides (in place: v_out == v_a, s_out == s_a): every value is read and written by the
// same thread, and each s is written only after every thread of its block has read it.
template <typename T>
struct MergeStateParams {
  const T* v_a;         // [seq_len, num_heads, head_dim] via a
  const float* s_a;     // [seq_len, num_heads] via a, base-2 LSE
  const T* v_b;         // [seq_len, num_heads, head_dim] via b
  const float* s_b;     // [seq_len, num_heads] via b
  T* v_out;             // [seq_len, num_heads, head_dim] via out; may equal v_a
  float* s_out;         // [seq_len, num_heads] via out; may equal s_a
  const uint8_t* mask;  // [seq_len] at mask + n * mask_stride, or null: rows with mask 0 are
                        // neither read nor written
  int64_t mask_stride;
  int64_t seq_len, num_heads, head_dim;
  StateStrides a, b, out;
  bool pdl;
};

// Merges num_states states per (row, head): out = the state of the union of their key sets.
template <typename T>
struct MergeStatesParams {
  const T* v;      // [seq_len, num_states, num_heads, head_dim] via in and v_stride_k
  const float* s;  // [seq_len, num_states, num_heads] via in and s_stride_k
  T* v_out;        // [seq_len, num_heads, head_dim] via out
  float* s_out;    // [seq_len, num_heads] via out
  int64_t seq_len, num_states, num_heads, head_dim;
  StateStrides in, out;
  int64_t v_stride_k, s_stride_k;  // state-index strides of v and s
  bool pdl;
};

// Vectors (16 bytes, or single elements on the fallback path) a thread owns. MergeState:
// 2 x 2 x 16 B in flight per thread at <= 40 registers (1536 threads per SM: 96 KiB in flight;
// Little's law on an H200 asks for ~50 KiB). MergeStates streams each thread's vectors of
// upcoming states into shared memory with cp.async (depth from occupancy.h's stream_config),
// so its bytes in flight do not depend on registers; its scalar fallback loads
// kMergeStatesUnroll states at a time into registers.
constexpr int kMergeVecs = 2;
constexpr int kMergeStatesVecs = 2;
constexpr int kMergeStatesUnroll = 4;
constexpr int kMergeStatesMaxStages = 8;
constexpr int kMergeThreads = 256;  // block size for problems large enough to fill it
constexpr int kMergeStateThreads = 128;     // MergeState's block size (see MergeState)
constexpr int kMergeStateMaxThreads = 512;  // MergeStateKernel's bound (FLASHINFER_MERGE_THREADS)
constexpr int64_t kMergeMaxBlocks = 2147483647;  // gridDim.x limit
constexpr int64_t kMergeMaxHeadDim = int64_t{1} << 24;  // keeps vector indices in 32 bits

// Shared memory of one MergeStates pipeline stage: per thread, kMergeStatesVecs 16-byte slots
// and one float (the state's LSE).
inline int64_t merge_states_stage_bytes(int threads) { return int64_t{threads} * (kMergeStatesVecs * 16 + 4); }

// How threads cover the states: one tile per group of threads, no loops. Tile t is (row-head
// rh = t / rounds, round r = t % rounds), rh = n * num_heads + h. A group of `group` threads (a
// power of two <= 32, so a group never straddles a warp) owns a tile; its lane l owns vectors
// j = (r * vecs + i) * group + l for i < vecs, j < head_vecs. Block b runs tiles
// b * groups_per_block + g for its groups g. Heads wider than 32 * vecs vectors take several
// rounds (tiles); the LSE of a row-head is written by lane 0 of its round 0.
struct MergeShape {
  int vec_elems = 1;  // elements per vector: 16 / sizeof(T) when vectorised, else 1
  int vecs = 1;       // vectors per thread (the kernel's compile-time kVecs)
  int head_vecs = 0;  // head_dim / vec_elems
  int group = 1;      // threads per tile
  int group_log2 = 0;
  int rounds = 1;  // tiles per row-head
  int threads = 32;  // block size, a multiple of 32 (and of group)
  int groups_per_block = 32;
  int64_t tiles = 0;   // row_heads * rounds
  int64_t blocks = 1;  // grid size
  bool write_s = true;  // false in the first pass of a two-pass in-place merge (see MergeState)
};

// row_heads = seq_len * num_heads (> 0); vec_elems divides head_dim (>= 0; 0 gives an
// LSE-only shape: one thread per row-head, no vectors).
// max_threads: block size for problems that fill it (a multiple of 32).
inline MergeShape merge_shape(int64_t row_heads, int64_t head_dim, int vec_elems, int vecs,
                              int max_threads = kMergeThreads) {
  MergeShape l;
  l.vec_elems = vec_elems;
  l.vecs = vecs;
  l.head_vecs = static_cast<int>(head_dim / vec_elems);
  const int64_t want = ceil_div<int64_t>(l.head_vecs, vecs);  // threads that would own a head in one round
  while (l.group < 32 && l.group < want) {
    l.group *= 2;
    ++l.group_log2;
  }
  const int64_t rounds = ceil_div<int64_t>(l.head_vecs, int64_t{l.group} * vecs);
  l.rounds = static_cast<int>(rounds > 1 ? rounds : 1);
  l.tiles = row_heads * l.rounds;
  const int64_t needed = round_up<int64_t>(l.tiles * l.group, 32);
  l.threads = static_cast<int>(needed < max_threads ? needed : max_threads);
  l.groups_per_block = l.threads / l.group;
  l.blocks = ceil_div<int64_t>(l.tiles, l.groups_per_block);
  return l;
}

// Dynamic shared memory of MergeStateKernel: an s_out offset (int64) and an LSE per group.
inline int64_t merge_state_smem(const MergeShape& l) { return int64_t{l.groups_per_block} * (8 + 4); }

// The vector that lane `lane` owns in round `round`, slot `i` (>= head_vecs: not owned).
FLASHINFER_HOST_DEVICE int merge_vec_index(const MergeShape& l, int lane, int round, int i) {
  return (round * l.vecs + i) * l.group + lane;
}

// q = x / d, r = x % d for x >= 0, d > 0; 32-bit division whenever the values fit (the usual case).
FLASHINFER_HOST_DEVICE void div_mod(int64_t x, int64_t d, int64_t* q, int64_t* r) {
  if (x <= INT32_MAX && d <= INT32_MAX) {
    const uint32_t a = static_cast<uint32_t>(x), b = static_cast<uint32_t>(d);
    const uint32_t c = a / b;
    *q = c;
    *r = a - c * b;
  } else {
    *q = x / d;
    *r = x % d;
  }
}

// (n, h, round) of tile t.
FLASHINFER_HOST_DEVICE void merge_tile(const MergeShape& l, int64_t t, int64_t num_heads, int64_t* n, int64_t* h,
                                       int* round) {
  int64_t rh = t, r = 0;
  if (l.rounds > 1) div_mod(t, l.rounds, &rh, &r);
  div_mod(rh, num_heads, n, h);
  *round = static_cast<int>(r);
}

// True when every vector access of a state set is 16-byte aligned given `elems` elements per
// vector: base pointer and both v strides (strides of size-1 dimensions are passed as 0).
inline bool vec_aligned(const void* p, int64_t stride_n, int64_t stride_h, int64_t elems, int64_t elem_bytes) {
  return reinterpret_cast<uintptr_t>(p) % static_cast<uintptr_t>(elems * elem_bytes) == 0 &&
         stride_n % elems == 0 && stride_h % elems == 0;
}

// MergeState's launches: one pass, or, for an in-place merge whose heads take several rounds
// (tiles), two: the values with write_s off, then the LSEs alone, so that no tile overwrites an
// LSE another tile has yet to read. vec: 16-byte vectors (head_dim and every v pointer and
// stride allow them), `vecs` per thread; otherwise single elements, kMergeVecs per thread.
// threads: the block size of the first pass (the LSE pass takes the default).
struct MergeStatePasses {
  bool vec = false;
  int count = 0;  // 0: nothing to merge
  MergeShape pass[2];
};
template <typename T>
MergeStatePasses merge_state_passes(const MergeStateParams<T>& p, int vecs, int threads) {
  MergeStatePasses r;
  const int64_t row_heads = p.seq_len * p.num_heads;
  if (row_heads == 0) return r;
  constexpr int kE = 16 / static_cast<int>(sizeof(T));
  r.vec = p.head_dim % kE == 0 && vec_aligned(p.v_a, p.a.v_n, p.a.v_h, kE, sizeof(T)) &&
          vec_aligned(p.v_b, p.b.v_n, p.b.v_h, kE, sizeof(T)) && vec_aligned(p.v_out, p.out.v_n, p.out.v_h, kE, sizeof(T));
  MergeShape l = merge_shape(row_heads, p.head_dim, r.vec ? kE : 1, r.vec ? vecs : kMergeVecs, threads);
  r.pass[0] = l;
  r.count = 1;
  if (l.rounds > 1 && (p.s_out == p.s_a || p.s_out == p.s_b)) {
    r.pass[0].write_s = false;
    r.pass[1] = merge_shape(row_heads, 0, 1, kMergeVecs);  // LSEs only
    r.count = 2;
  }
  return r;
}

// MergeState on packed states: every v is [seq_len, num_heads, head_dim] and every s [seq_len,
// num_heads] with no gaps (strides of size-1 dimensions aside), 16-byte vectors, no mask, and
// head_vecs a power of two <= threads. Then the vectors of all row-heads form one flat range:
// block b owns vectors [b * threads * unroll, (b + 1) * threads * unroll), whole row-heads, and
// its thread t vectors b * threads * unroll + u * threads + t (u < unroll), so every load
// instruction of a warp reads 512 contiguous bytes.
struct MergeFlatShape {
  int64_t vecs = 0;       // row_heads * head_vecs
  int64_t row_heads = 0;
  int hv_log2 = 0;        // log2(head_vecs)
  int threads = 256, unroll = 1;
  int64_t blocks = 0;
  int rows_per_block = 0;  // threads * unroll / head_vecs
};

inline bool packed_states(const StateStrides& s, int64_t seq_len, int64_t num_heads, int64_t head_dim) {
  return (num_heads == 1 || s.v_h == head_dim) && (seq_len == 1 || s.v_n == num_heads * head_dim) &&
         (num_heads == 1 || s.s_h == 1) && (seq_len == 1 || s.s_n == num_heads);
}

// False when the states do not qualify (see MergeFlatShape); vec: merge_state_passes' 16-byte test.
template <typename T>
bool merge_flat_shape(const MergeStateParams<T>& p, bool vec, int unroll, int threads, MergeFlatShape* l) {
  constexpr int kE = 16 / static_cast<int>(sizeof(T));
  if (!vec || p.mask || p.head_dim % kE != 0) return false;
  const int64_t hv = p.head_dim / kE;
  if (hv <= 0 || hv > threads || (hv & (hv - 1)) != 0) return false;
  if (!packed_states(p.a, p.seq_len, p.num_heads, p.head_dim) || !packed_states(p.b, p.seq_len, p.num_heads, p.head_dim) ||
      !packed_states(p.out, p.seq_len, p.num_heads, p.head_dim))
    return false;
  l->row_heads = p.seq_len * p.num_heads;
  l->vecs = l->row_heads * hv;
  l->hv_log2 = 0;
  while ((int64_t{1} << l->hv_log2) < hv) ++l->hv_log2;
  l->threads = threads;
  l->unroll = unroll;
  l->blocks = ceil_div<int64_t>(l->vecs, int64_t{threads} * unroll);
  l->rows_per_block = static_cast<int>(int64_t{threads} * unroll / hv);
  return true;
}

// What the kernels assume; the binding has already produced friendlier messages.
template <typename T>
Status validate(const MergeStateParams<T>& p) {
  if (p.seq_len < 0 || p.num_heads < 0 || p.head_dim <= 0) return Status::kInvalidArgument;
  if (p.head_dim > kMergeMaxHeadDim) return Status::kUnsupported;
  if (p.seq_len == 0 || p.num_heads == 0) return Status::kSuccess;
  if (!p.v_a || !p.s_a || !p.v_b || !p.s_b || !p.v_out || !p.s_out) return Status::kInvalidArgument;
  return Status::kSuccess;
}

template <typename T>
Status validate(const MergeStatesParams<T>& p) {
  if (p.seq_len < 0 || p.num_heads < 0 || p.num_states < 0 || p.head_dim <= 0) return Status::kInvalidArgument;
  if (p.head_dim > kMergeMaxHeadDim) return Status::kUnsupported;
  if (p.seq_len == 0 || p.num_heads == 0) return Status::kSuccess;
  if (!p.v_out || !p.s_out) return Status::kInvalidArgument;
  if (p.num_states > 0 && (!p.v || !p.s)) return Status::kInvalidArgument;
  return Status::kSuccess;
}

}  // namespace attention
}  // namespace flashinfer
