// Tensor-core decode kernel: the same work items and epilogue as decode.cuh's CUDA-core
// kernel, but each warp computes scores for all q heads of its group at once with m16n8k16
// MMAs in the transposed form S^T = K q^T (16 keys as M, 8 heads as N: no padded rows),
// keeps an online softmax per head in registers, and accumulates O^T += V^T P^T. K/V tiles of kTcTile keys stream
// into shared memory read with ldmatrix. The copies run stages - 1 tiles ahead of the math through
// all of a CTA's work items, across item boundaries: the next item's first tiles (and its
// descriptor and q rows, asked into L1) are in flight while an item's last tiles and its epilogue
// run, so a CTA does not wait on an empty pipeline between items (H200, bf16: 256 x 1024 2%,
// 64 x 2048 1% faster; the epilogue's O scratch is the stage consumed last). One of three copy
// engines (kCopy) moves the tiles:
//  - cp.async: every thread moves 16-byte chunks into XOR-swizzled rows (any sm_80+ GPU);
//  - rows (sm_90+, the TMA engine): every thread moves one whole key row (K or V) with one
//    cp.async.bulk per tile, an mbarrier per stage counts the bytes in; rows are padded by 16
//    bytes so ldmatrix reads stay conflict-free without a swizzle. 16x fewer copy instructions,
//    but cp.async.bulk takes warp-uniform operands: each warp's 32 row copies run as a loop.
//  - boxes (sm_90+, tensor maps): one lane per warp moves its page's part of the tile (128-byte
//    box rows: 64 dims of fp16 / bf16 or 128 of fp8, x page_size keys per box, 128-byte
//    swizzled) with cp.async.bulk.tensor: 16 copies per tile at page size 16. A paged cache
//    needs tiles that start on a page (the planner aligns chunks to kTcTile keys; no sliding
//    window) and page sizes 16/32/64 or multiples of 64; a contiguous one is a single page (one
//    64-key box per tile and half, from any key). Boxes copy whole pages, so V rows past the
//    request's end are zeroed after they land.
// fp8 caches (TKV = __nv_fp8_e4m3 / __nv_fp8_e5m2; head_dim 128, boxes or cp.async): rows of 128
// bytes, read with the same b16 ldmatrix as 2-byte elements, so a register holds four fp8
// features (trans: two features of two keys). The features become T exactly (fp8 -> fp16 ->
// T) in an order that permutes the MMA's k (dims of q.k) and m (dims of O^T) indices: q's
// fragments follow the same order and the epilogue maps O^T's rows back. The MMAs of fp8 caches
// run in fp16 for either q type (one cvt per pair of features; for bf16 they took three more
// through f32): bf16 q is scaled per head by a power of two that puts its largest magnitude in
// [2^14, 2^15), so its values convert to fp16 exactly (fp16 keeps bf16's 8 significant bits),
// and the scores are scaled back in fp32. P in [0, 1] is staged in fp16.
#pragma once

#include <cuda_runtime.h>

#include <cstring>
#include <type_traits>

#include "../bulk_copy.cuh"
#include "../cp_async.cuh"
#include "../math.cuh"
#include "../mma.cuh"
#include "../page.h"
#include "../tensor_map.cuh"
#include "../vec_dtypes.cuh"
#include "decode.cuh"
#include "state.h"

namespace flashinfer {
namespace attention {

constexpr int kTcTile = 64;  // keys per pipeline stage (16 per warp)
static_assert(kTcTile == kDecodeChunkAlign, "box copies need tiles that start on a page");
constexpr int kTcWarps = kDecodeThreads / 32;
constexpr int kTcMaxStages = 16;  // mbarriers of the bulk-copy pipeline
constexpr int kTcBoxAlign = 1024;  // 128-byte-swizzled boxes land on 1024-byte boundaries

// The tensor-core kernel's copy engines (see above).
enum class TcCopy : int { kCpAsync = 0, kRows = 1, kBoxes = 2 };

// Shared-memory bytes of one key row (kv_bytes per element): row copies land whole rows,
// padded by 16 bytes.
FLASHINFER_HOST_DEVICE constexpr int64_t decode_tc_row_bytes(int head_dim, TcCopy copy, int kv_bytes = 2) {
  return int64_t{head_dim} * kv_bytes + (copy == TcCopy::kRows ? 16 : 0);
}
// Shared memory of one stage (K and V tiles) and of the epilogue scratch.
FLASHINFER_HOST_DEVICE constexpr int64_t decode_tc_stage_bytes(int head_dim, TcCopy copy, int kv_bytes = 2) {
  return int64_t{2} * kTcTile * decode_tc_row_bytes(head_dim, copy, kv_bytes);
}

// The K and V caches as 4-D tensor maps for the box engine, dims (dim, entry, head, page)
// (entry_dim 1) or (dim, head, entry, page) (entry_dim 2): whichever order has increasing
// strides. Boxes are 128-byte rows (64 dims of fp16 / bf16, 128 of fp8) x min(page_size, 64)
// entries of one head and page.
struct DecodeTensorMaps {
  CUtensorMap k, v;
  int entry_dim;
  int l2_evict_first;  // nonzero: the boxes' lines are L2 evict-first (see decode_tc_l2_evict_first)
};

namespace detail {

// Two fp8 values (bits 0-7 and 8-15 of v) as a packed fp16 pair (the MMA operand), exactly.
template <typename TKV>
FLASHINFER_DEVICE uint32_t fp8x2_to_f16x2(uint32_t v) {
  const __half2 h = fp8x2_to_half2<TKV>(v);
  uint32_t w;
  memcpy(&w, &h, 4);
  return w;
}

}  // namespace detail

// kCopy: the copy engine (rows and boxes: sm_90+, stages <= kTcMaxStages, K/V rows 16-byte
// aligned; boxes: `maps` describe the cache, see TcCopy).
// Registers: held to 128, i.e. 4 CTAs per SM where shared memory allows, for the cp.async
// engine (sm_80's; unbounded, its head_dim 64 build took 164), the fp8 box engine (left alone
// ptxas gave it 250 registers, 2 CTAs per SM instead of 4: H200, e4m3, 256 x 1024 156 -> 188 us)
// and head_dim 64 (at 168 registers, 3 CTAs per SM: 64 x 2048 17% slower). The fp16 / bf16
// engines at head_dim 128 keep ptxas's choice (145-161; their stages allow 2 CTAs per SM, or 3
// at two stages).
// TKV: the cache element, T, or fp8 with kCopy kCpAsync or kBoxes at decode_tc_takes_fp8 head_dims.
template <typename T, int kHeadDim, TcCopy kCopy, typename TKV = T>
__global__ void __launch_bounds__(kDecodeThreads,
                                  kCopy == TcCopy::kCpAsync || sizeof(TKV) == 1 || kHeadDim <= 64 ? 4 : 0)
    DecodeTCKernel(const DecodeParams<T> p, const int stages, const __grid_constant__ DecodeTensorMaps maps) {
  constexpr bool kFp8 = sizeof(TKV) == 1;
  using TM = std::conditional_t<kFp8, __half, T>;  // the MMAs' operand type (see the top)
  constexpr bool kQScale = kFp8 && !std::is_same_v<T, __half>;  // bf16 q scaled into fp16
  static_assert(!kFp8 || (kCopy != TcCopy::kRows && decode_tc_takes_fp8(kHeadDim)), "fp8: cp.async or boxes, head_dim 128");
  static_assert(kHeadDim * sizeof(TKV) >= 128, "the swizzle needs >= 8 chunks per row");
  static_assert(kDecodeThreads == 2 * kTcTile, "bulk copies: one K or V row per thread per tile");
  constexpr bool kBulk = kCopy != TcCopy::kCpAsync;  // an mbarrier per stage counts the bytes in
  constexpr bool kBoxes = kCopy == TcCopy::kBoxes;
  constexpr int kChunks = kHeadDim * static_cast<int>(sizeof(TKV)) / 16;  // 16-byte chunks per key row
  constexpr int kKSteps = kHeadDim / 16;
  constexpr int kMTiles = kHeadDim / 16;  // 16-dim tiles of O^T
  constexpr int64_t kStage = decode_tc_stage_bytes(kHeadDim, kCopy, sizeof(TKV));
  constexpr int kPitch = static_cast<int>(decode_tc_row_bytes(kHeadDim, kCopy, sizeof(TKV)));
  constexpr uint32_t kRowBytes = kHeadDim * sizeof(TKV);
  constexpr int kBoxDims = 128 / static_cast<int>(sizeof(TKV));  // a box row is one 128-byte line
  constexpr int kBoxRows = static_cast<int>(kRowBytes) / 128;     // boxes per key row
  FLASHINFER_EXTERN_SHARED uint4 smem_u4[];
  __shared__ __align__(16) TM sP[kTcWarps * kDecodeMaxGroup * 16];
  __shared__ __align__(8) uint64_t bars[kBulk ? kTcMaxStages : 1];
  // Byte offset of 16-byte chunk `c` of key row `r` in a K or V tile. Boxes: the tile is two
  // (head_dim 128) halves of 64 dims, each [kTcTile rows][128 bytes] 128-byte swizzled.
  auto at = [](int r, int c) -> uint32_t {
    if constexpr (kBoxes) return static_cast<uint32_t>((c >> 3) * (kTcTile * 128)) + tma::swizzle128(r, c & 7);
    if constexpr (kBulk) return static_cast<uint32_t>(r * kPitch + c * 16);
    return mma::swizzle_offset<kRowBytes>(r, c);
  };
  // (an offset from smem_u4, not an integer turned back into a pointer: the compiler then knows
  // the scratch is shared memory and uses STS / LDS, not generic stores and loads)
  char* smem = reinterpret_cast<char*>(smem_u4);
  if constexpr (kBoxes) {  // (the launch adds kTcBoxAlign bytes of slack)
    const uint32_t base = static_cast<uint32_t>(__cvta_generic_to_shared(smem_u4));
    smem += (kTcBoxAlign - base % kTcBoxAlign) % kTcBoxAlign;
  }
  const int lane = threadIdx.x & 31, warp = threadIdx.x >> 5;
  const int grp = lane >> 2, tig = lane & 3;  // MMA fragment coordinates
  constexpr int kRowStep = kDecodeThreads / kChunks;  // rows between a thread's copies
  constexpr int kIters = kTcTile / kRowStep;          // rows a thread copies per tile
  static_assert(kRowStep % 8 == 0 && kTcTile % kRowStep == 0, "copy mapping");
  const int chunk = threadIdx.x % kChunks, row_base = threadIdx.x / kChunks;
  const uint32_t sw0 = mma::swizzle_offset<kRowBytes>(row_base, chunk);  // + kRowStep * i rows
  const bool alibi = p.pos_encoding == PosEncodingMode::kALiBi;
  const bool soft_cap = p.soft_cap > 0.f;
  const float s_scale = soft_cap ? p.sm_scale / p.soft_cap : p.sm_scale * detail::kLog2e;
  const float cap_log2 = p.soft_cap * detail::kLog2e;
  // Bulk copies: thread t moves key row t % kTcTile of the K (t < kTcTile) or V tile.
  const int brow = static_cast<int>(threadIdx.x) % kTcTile;
  const bool bv = static_cast<int>(threadIdx.x) >= kTcTile;
  uint32_t phase = 0;  // bit s: parity of stage s's next completion
  if constexpr (kBoxes) {  // the descriptors' fetch overlaps the barrier setup and the first item's load
    if (threadIdx.x == 32) {
      tma::prefetch_map(&maps.k);
      tma::prefetch_map(&maps.v);
    }
  }
  if constexpr (kBulk) {
    if (threadIdx.x == 0) {
      for (int s = 0; s < stages; ++s) bulk::mbarrier_init(&bars[s], 1);
      bulk::fence_init();
    }
    __syncthreads();
  }

  pdl_wait();
  FLASHINFER_DECODE_MARK(p, 0, 1);
  const int32_t n_items = static_cast<int32_t>(detail::num_items(p));  // (plans hold int32 counts)
  const int32_t stride = gridDim.x;
  const bool paged = p.contiguous_len < 0;
  const int page_size = static_cast<int>(paged ? p.kv.page_size : 1);
  // Boxes: warp w moves keys [w * box_e, +box_e) of each tile, one page (or a 64-key part of one).
  const int box_e = paged && page_size < kTcTile ? page_size : kTcTile;
  const int box_pages = kBoxes ? kTcTile / box_e : 0;
  const uint32_t reach = detail::key_reach(p.window_left);
  constexpr int kChunkElems = 16 / static_cast<int>(sizeof(TKV));
  constexpr int kG = decode_max_group(kHeadDim);
  auto fetch = [&](int32_t i) { return i < n_items ? detail::fetch_item(p, i) : DecodeWorkItem{}; };

  // The copies run ahead of the math through the tiles of all of this CTA's items (items i,
  // i + grid, ...), stages - 1 tiles ahead, across item boundaries: the next item's first tiles
  // are in flight while this item's last tiles and its epilogue run, and a CTA never waits on an
  // empty pipeline between items. `src` is the item whose tile from key src.k has its page ids
  // loaded next; `pend` is the tile loaded last, issued next.
  struct Src {
    int32_t item;  // >= n_items: no tiles left
    int32_t k, hi;  // the next tile's first key; the item's end
    int kv_head;
    const int32_t* page_ids;
    PageCursor bcur;  // rows engine: this thread's key row (no division per tile); rows past
    int32_t bkey, last_page, last_entry;  // the end copy the last key's row (probability 0)
  };
  struct Tile {
    int32_t k, hi;  // k >= hi: nothing to issue
    int kv_head;
  };
  auto make_src = [&](int32_t i, const detail::Item& it) {
    const int32_t lo32 = static_cast<int32_t>(it.lo), hi32 = static_cast<int32_t>(it.hi);
    Src s{i, lo32, hi32, it.kv_head, paged ? p.kv.indices + it.page_begin : nullptr,
          PageCursor(paged ? lo32 + brow : 0, page_size, kTcTile),
          lo32 + brow, 0, hi32 - 1};
    if (kCopy == TcCopy::kRows && paged && hi32 > lo32) {
      const int32_t last_slot = (hi32 - 1) / page_size;
      s.last_page = __ldg(s.page_ids + last_slot);
      s.last_entry = hi32 - 1 - last_slot * page_size;
    }
    return s;
  };
  // (each item's descriptor is asked into L1 an item ahead: it is loaded when src reaches the
  // item, and again when the math does)
  auto prefetch_item = [&](int32_t i) {
    if (p.items && i < n_items) prefetch_l1(p.items + i);
  };
  // q rows of an item the math reaches later, asked into L1 when src reaches it
  auto prefetch_q = [&](const detail::Item& it) {
    constexpr int kLines = kHeadDim * static_cast<int>(sizeof(T)) / 128;  // 128-byte lines per q row
    if (static_cast<int>(threadIdx.x) < it.ng * kLines) {
      const int h = threadIdx.x / kLines, l = threadIdx.x % kLines;
      const DecodeQuery qr = decode_query(it.qh0 + h, p.num_qo_heads, p.group_size, p.q_len, 0);
      prefetch_l1(p.q + decode_row_offset(qr, it.request, p.q_len, p.q_stride_n, p.q_stride_h) + l * (128 / sizeof(T)));
    }
  };
  prefetch_item(blockIdx.x + stride);  // (before the first item's read: short items cross in the prologue)
  Src src = [&] {
    const int32_t first = blockIdx.x;
    const DecodeWorkItem w = fetch(first);
    detail::Item it = detail::resolve_item<kG>(p, first, &w);
    if (first >= n_items) it.lo = it.hi = 0;
    return make_src(first, it);
  }();
  auto next_src_item = [&]() {  // the next item with a tile
    do {
      const int32_t i = src.item + stride;
      if (i >= n_items) {
        src.item = n_items;
        return;
      }
      const DecodeWorkItem w = fetch(i);
      const detail::Item it = detail::resolve_item<kG>(p, i, &w);
      src = make_src(i, it);
      prefetch_q(it);
      prefetch_item(i + stride);
    } while (src.k >= src.hi);
  };
  FLASHINFER_DECODE_MARK(p, 1, src.hi);
  if (src.item < n_items && src.k >= src.hi) next_src_item();
  Tile pend;
  // The page ids of src's next tile (pg), then src moves on. They are loaded an iteration before
  // their tile is issued, so their latency hides behind a tile of math. cp.async: thread
  // (row_base, chunk) copies chunk `chunk` of key rows row_base + kRowStep * i; its swizzle term
  // is the same for all its rows (kRowStep is a multiple of 8) and its page slots advance by a
  // PageCursor, so the address loop has no division. Rows: pg is the page id and entry of this
  // thread's key row.
  auto load_next = [&](int32_t* pg) {
    if (src.item >= n_items) {
      pend.k = pend.hi = 0;
      return;
    }
    pend.k = src.k, pend.hi = src.hi, pend.kv_head = src.kv_head;
    if constexpr (kBoxes) {  // lane 0: page id and first entry of the warp's box
      const int32_t k0 = src.k + warp * box_e;
      if (lane == 0 && warp < box_pages && k0 < src.hi) {
        int32_t slot = 0, entry = k0;
        if (paged) div_mod(k0, page_size, &slot, &entry);  // (a shift: no division per tile)
        pg[0] = paged ? __ldg(src.page_ids + slot) : 0;
        pg[1] = entry;
      }
    } else if constexpr (kCopy == TcCopy::kRows) {
      if (src.bkey < src.hi) {
        pg[0] = paged ? __ldg(src.page_ids + src.bcur.slot) : 0;
        pg[1] = paged ? src.bcur.entry : src.bkey;
      } else {
        pg[0] = src.last_page;
        pg[1] = src.last_entry;
      }
      src.bkey += kTcTile;
      src.bcur.advance();
    } else if (paged) {
      const int32_t t0 = src.k + row_base;
      PageCursor cur(t0, page_size, kRowStep);
      FLASHINFER_UNROLL
      for (int i = 0; i < kIters; ++i) {
        pg[i] = t0 + kRowStep * i < src.hi ? __ldg(src.page_ids + cur.slot) : 0;
        cur.advance();
      }
    }
    src.k += kTcTile;
    if (src.k >= src.hi) next_src_item();
  };
  // Issues tile `pend` into stage s (cp.async: commits a group, empty or not).
  auto issue = [&](int s, const int32_t* pg) {
    if constexpr (kBoxes) {
      const int32_t t_lo = pend.k;
      if (t_lo >= pend.hi) return;
      if (threadIdx.x == 0) {  // the bytes of the boxes that hold a key of the request
        const int32_t left = pend.hi - t_lo;  // (a whole tile: no division)
        const int32_t boxes = left >= kTcTile ? box_pages : min(box_pages, (left + box_e - 1) / box_e);
        bulk::arrive_expect_tx(&bars[s], static_cast<uint32_t>(boxes * box_e * kRowBytes * 2));
      }
      if (lane == 0 && warp < box_pages && t_lo + warp * box_e < pend.hi) {
        char* kdst = smem + s * kStage + warp * box_e * 128;
        const int c1 = maps.entry_dim == 1 ? pg[1] : pend.kv_head, c2 = maps.entry_dim == 1 ? pend.kv_head : pg[1];
        if (maps.l2_evict_first) {
          const uint64_t pol = tma::l2_evict_first_policy();
          FLASHINFER_UNROLL
          for (int h = 0; h < kBoxRows; ++h) {
            tma::copy_4d_hint(kdst + h * (kTcTile * 128), &maps.k, h * kBoxDims, c1, c2, pg[0], &bars[s], pol);
            tma::copy_4d_hint(kdst + kStage / 2 + h * (kTcTile * 128), &maps.v, h * kBoxDims, c1, c2, pg[0], &bars[s],
                              pol);
          }
        } else {
          FLASHINFER_UNROLL
          for (int h = 0; h < kBoxRows; ++h) {
            tma::copy_4d(kdst + h * (kTcTile * 128), &maps.k, h * kBoxDims, c1, c2, pg[0], &bars[s]);
            tma::copy_4d(kdst + kStage / 2 + h * (kTcTile * 128), &maps.v, h * kBoxDims, c1, c2, pg[0], &bars[s]);
          }
        }
      }
    } else if constexpr (kCopy == TcCopy::kRows) {
      if (pend.k >= pend.hi) return;
      const int64_t page = pg[0], entry = pg[1];
      const T* src_row = bv ? p.kv.v_data + int64_t{pend.kv_head} * p.v_stride_h + page * p.v_stride_page +
                                  entry * p.v_stride_n
                            : p.kv.k_data + int64_t{pend.kv_head} * p.kv.stride_h + page * p.kv.stride_page +
                                  entry * p.kv.stride_n;
      if (threadIdx.x == 0) bulk::arrive_expect_tx(&bars[s], 2 * kTcTile * kRowBytes);
      bulk::copy(smem + s * kStage + (bv ? kStage / 2 : 0) + brow * kPitch, src_row, kRowBytes, &bars[s]);
    } else {
      if (pend.k < pend.hi) {
        const TKV* kbase =
            reinterpret_cast<const TKV*>(p.kv.k_data) + int64_t{pend.kv_head} * p.kv.stride_h + chunk * kChunkElems;
        const TKV* vbase =
            reinterpret_cast<const TKV*>(p.kv.v_data) + int64_t{pend.kv_head} * p.v_stride_h + chunk * kChunkElems;
        char* ks_ = smem + s * kStage + sw0;
        char* vs_ = ks_ + kStage / 2;
        const int32_t t0 = pend.k + row_base;
        PageCursor cur(t0, page_size, kRowStep);
        FLASHINFER_UNROLL
        for (int i = 0; i < kIters; ++i) {
          const bool valid = t0 + kRowStep * i < pend.hi;
          int64_t off_k = 0, off_v = 0;
          if (valid) {
            const int64_t page = paged ? int64_t{pg[i]} : 0;
            const int64_t entry = paged ? int64_t{cur.entry} : t0 + kRowStep * i;
            off_k = page * p.kv.stride_page + entry * p.kv.stride_n;
            off_v = page * p.v_stride_page + entry * p.v_stride_n;
          }
          cur.advance();
          const uint32_t so = static_cast<uint32_t>(kRowStep * i * kRowBytes);
          cp_async::copy16_or_zero(ks_ + so, kbase + off_k, valid);
          cp_async::copy16_or_zero(vs_ + so, vbase + off_v, valid);
        }
      }
      cp_async::commit();
    }
  };

  // The epilogue's scratch: O in the stage consumed last (free until the next issue), the
  // running maxima and denominators in sP.
  static_assert(int64_t{kTcWarps} * kDecodeMaxGroup * kHeadDim * 4 <= kStage, "O scratch fits a stage");
  static_assert(2 * kTcWarps * kDecodeMaxGroup * 4 <= sizeof(sP), "m / d scratch fits sP");
  float* const sm = reinterpret_cast<float*>(sP);
  float* const sd = sm + kTcWarps * kDecodeMaxGroup;
  int32_t pg[kIters > 2 ? kIters : 2];
  for (int s = 0; s + 1 < stages; ++s) {
    load_next(pg);
#ifdef FLASHINFER_DECODE_TRACE
    if (s < 3) FLASHINFER_DECODE_MARK(p, 10 + 2 * s, pg[0]);
#endif
    issue(s, pg);
#ifdef FLASHINFER_DECODE_TRACE
    if (s < 3) FLASHINFER_DECODE_MARK(p, 11 + 2 * s, 1);
#endif
  }
  load_next(pg);
  FLASHINFER_DECODE_MARK(p, 2, pg[0]);
  int s_cur = 0;
#ifdef FLASHINFER_DECODE_TRACE
  bool traced_first = false;
  uint32_t traced_items = 0;
#endif
  for (int32_t item = blockIdx.x; item < n_items; item += stride) {
    // (the item is read again for the epilogue, from L1: its fields stay out of the loop's registers)
    const detail::Item it = detail::get_item<kG>(p, item);
    const int64_t b = it.request, lo = it.lo, hi = it.hi;
    const int qh0 = it.qh0, ng = it.ng;
    const DecodeMergeInfo mi = detail::merge_info(p, it);  // (a split item's, loaded now: it lands during the tiles)
    const int32_t num_tiles = hi > lo ? static_cast<int32_t>(ceil_div<int64_t>(hi - lo, kTcTile)) : 0;
    // q as the MMA B operand (k = dims, n = heads): lane (grp, tig) holds head qh0 + grp.
    uint32_t qa[kKSteps][2];
    {
      const bool row_ok = grp < ng;
      const DecodeQuery qr = decode_query(qh0 + (row_ok ? grp : 0), p.num_qo_heads, p.group_size, p.q_len, 0);
      const T* qrow = p.q + decode_row_offset(qr, b, p.q_len, p.q_stride_n, p.q_stride_h);
      FLASHINFER_UNROLL
      for (int ks = 0; ks < kKSteps; ++ks) {
        // fp8 (see the top): k 2 tig + e is dim 16 ks + 4 tig + e, k 2 tig + 8 + e dim 16 ks + 4 tig + 2 + e.
        const int d_lo = kFp8 ? ks * 16 + tig * 4 : ks * 16 + tig * 2;
        const int d_hi = kFp8 ? ks * 16 + tig * 4 + 2 : ks * 16 + 8 + tig * 2;
        const uint32_t lo2 = *reinterpret_cast<const uint32_t*>(qrow + d_lo);
        const uint32_t hi2 = *reinterpret_cast<const uint32_t*>(qrow + d_hi);
        qa[ks][0] = row_ok ? lo2 : 0u;
        qa[ks][1] = row_ok ? hi2 : 0u;
      }
    }
    // Score scale per column of S^T (head tig * 2 + e); bf16 q with fp8 caches: q scaled into
    // fp16 (see the top), the inverse power of two folded in here.
    float sc_scale[2] = {s_scale, s_scale};
    if constexpr (kQScale) {
      float mx = 0.f;
      FLASHINFER_UNROLL
      for (int ks = 0; ks < kKSteps; ++ks) {
        FLASHINFER_UNROLL
        for (int j = 0; j < 2; ++j) {
          const float2 f = unpack2(qa[ks][j], static_cast<const T*>(nullptr));
          mx = fmaxf(mx, fmaxf(fabsf(f.x), fabsf(f.y)));
        }
      }
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));  // the 4 lanes of head grp
      mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2));
      const int ex = (__float_as_int(mx) >> 23) & 0xff;  // mx in [2^(ex-127), 2^(ex-126))
      // 2^k puts mx in [2^14, 2^15); inf / NaN (ex 255) stay as they are; k <= 126 keeps 2^-k normal.
      const int k = ex == 255 ? 0 : min(141 - ex, 126);
      const float qs = __int_as_float((k + 127) << 23);
      FLASHINFER_UNROLL
      for (int ks = 0; ks < kKSteps; ++ks) {
        FLASHINFER_UNROLL
        for (int j = 0; j < 2; ++j) {
          const float2 f = unpack2(qa[ks][j], static_cast<const T*>(nullptr));
          const __half2 h = __floats2half2_rn(f.x * qs, f.y * qs);
          memcpy(&qa[ks][j], &h, 4);
        }
      }
      FLASHINFER_UNROLL
      for (int e = 0; e < 2; ++e) {
        const int kh = __shfl_sync(0xffffffffu, k, (tig * 2 + e) * 4);  // lane of head tig * 2 + e
        sc_scale[e] = s_scale * __int_as_float((127 - kh) << 23);
      }
    }
    // This thread's heads: h = tig * 2 + e (columns of S^T = K q^T and of O^T): their ALiBi
    // slopes and the keys they see (multi-token decode: each token's).
    float slope[2];
    int32_t qpos[2];  // the query's position (multi-token decode: its token's)
    FLASHINFER_UNROLL
    for (int e = 0; e < 2; ++e) {
      const int h = tig * 2 + e;
      const DecodeQuery qr = decode_query(qh0 + h, p.num_qo_heads, p.group_size, p.q_len, it.kv_len);
      qpos[e] = static_cast<int32_t>(qr.pos);  // (padded columns are never written)
      slope[e] = alibi && h < ng ? detail::alibi_slope(qr.head, qr.num_heads) * detail::kLog2e : 0.f;
    }
    const int32_t lo32 = static_cast<int32_t>(lo), hi32 = static_cast<int32_t>(hi);
    // Online softmax per head (log2 units); d is this thread's share of its 2 keys per tile.
    float m[2] = {neg_inf(), neg_inf()}, d[2] = {0.f, 0.f};
    float o[kMTiles][4];  // O^T: dims mt*16 + grp (+8) x heads tig*2 + {0, 1}
    FLASHINFER_UNROLL
    for (int n = 0; n < kMTiles; ++n) o[n][0] = o[n][1] = o[n][2] = o[n][3] = 0.f;
    TM* sp = sP + warp * kDecodeMaxGroup * 16;  // this warp's P^T staging [head][16 keys]

    for (int32_t tile = 0; tile < num_tiles; ++tile) {
      issue(s_cur == 0 ? stages - 1 : s_cur - 1, pg);
      load_next(pg);  // issued by the next iteration
      if constexpr (kBulk) {
        bulk::wait_parity(&bars[s_cur], (phase >> s_cur) & 1u);  // the stage's bytes have landed
        phase ^= 1u << s_cur;
      } else {
        cp_async::wait(stages - 1);
        __syncthreads();  // every thread's copies of this stage have landed
      }
#ifdef FLASHINFER_DECODE_TRACE
      if (!traced_first) FLASHINFER_DECODE_MARK(p, 3, 1);
      traced_first = true;
#endif
      const char* ks_ = smem + s_cur * kStage;
      const char* vs_ = ks_ + kStage / 2;
      const int row0 = warp * 16;  // this warp's 16 keys of the tile
      if constexpr (kBoxes) {
        // Boxes copy whole pages: V rows past the request's end (stale or never-written cache
        // slots, possibly NaN) would turn P = 0 into NaN in the MMA. Zero this warp's.
        const int32_t valid = hi32 - (lo32 + tile * kTcTile);
        if (valid < row0 + 16) {
          char* vw = smem + s_cur * kStage + kStage / 2;
          for (int i = lane; i < 16 * kChunks; i += 32) {
            const int r = row0 + i / kChunks;
            if (r >= valid) *reinterpret_cast<uint4*>(vw + at(r, i % kChunks)) = make_uint4(0u, 0u, 0u, 0u);
          }
          __syncwarp();
        }
      }
      // S^T = K q^T (16 keys x 8 heads): K rows are the A operand, q the B operand; even and
      // odd k-steps accumulate separately to halve the dependent MMA chain.
      float sc[2][4] = {};
      if constexpr (kFp8) {
        // One x4 covers 16 keys x two 16-dim chunks (two k-steps): ka[0] / ka[1] keys grp / grp + 8
        // of chunk 2 kp, ka[2] / ka[3] of chunk 2 kp + 1, four features 4 tig.. each.
        FLASHINFER_UNROLL
        for (int kp = 0; kp < kKSteps / 2; ++kp) {
          uint32_t ka[4];
          mma::ldmatrix_x4(ka, ks_ + at(row0 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * kp + (lane >> 4)));
          FLASHINFER_UNROLL
          for (int h = 0; h < 2; ++h) {
            const uint32_t a[4] = {detail::fp8x2_to_f16x2<TKV>(ka[2 * h]), detail::fp8x2_to_f16x2<TKV>(ka[2 * h + 1]),
                                   detail::fp8x2_to_f16x2<TKV>(ka[2 * h] >> 16),
                                   detail::fp8x2_to_f16x2<TKV>(ka[2 * h + 1] >> 16)};
            mma::mma_16816<TM>(sc[h], a, qa[2 * kp + h]);
          }
        }
      } else {
        FLASHINFER_UNROLL
        for (int ks = 0; ks < kKSteps; ++ks) {
          uint32_t ka[4];
          mma::ldmatrix_x4(ka, ks_ + at(row0 + (lane & 7) + ((lane >> 3) & 1) * 8, 2 * ks + (lane >> 4)));
          mma::mma_16816<T>(sc[ks & 1], ka, qa[ks]);
        }
      }
      // x[r][e]: key row0 + grp + 8r, head tig*2 + e (keys fit int32: page tables are int32).
      const int32_t t0 = lo32 + tile * kTcTile + row0 + grp;
      float x[2][2];
      FLASHINFER_UNROLL
      for (int r = 0; r < 2; ++r) {
        FLASHINFER_UNROLL
        for (int e = 0; e < 2; ++e) {
          const int32_t t = t0 + 8 * r;
          float v = sc[0][2 * r + e] + sc[1][2 * r + e];
          v = soft_cap ? cap_log2 * tanhf(v * sc_scale[e]) : v * sc_scale[e];
          if (alibi) v += slope[e] * float(t);
          x[r][e] = t < hi32 && detail::key_visible(qpos[e], t, reach) ? v : neg_inf();
        }
      }
      float scale[2], pr[2][2];
      FLASHINFER_UNROLL
      for (int e = 0; e < 2; ++e) {
        float tmax = fmaxf(x[0][e], x[1][e]);
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 4));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 8));
        tmax = fmaxf(tmax, __shfl_xor_sync(0xffffffffu, tmax, 16));
        const float m_new = fmaxf(m[e], tmax);
        scale[e] = m_new == neg_inf() ? 1.f : fast_exp2(m[e] - m_new);
        FLASHINFER_UNROLL
        for (int r = 0; r < 2; ++r) pr[r][e] = m_new == neg_inf() ? 0.f : fast_exp2(x[r][e] - m_new);
        d[e] = d[e] * scale[e] + pr[0][e] + pr[1][e];
        m[e] = m_new;
      }
      // The running max settles after the first tiles: skip the rescale when no lane moved.
      if (__any_sync(0xffffffffu, scale[0] != 1.f || scale[1] != 1.f)) {
        FLASHINFER_UNROLL
        for (int n = 0; n < kMTiles; ++n) {
          o[n][0] *= scale[0];
          o[n][1] *= scale[1];
          o[n][2] *= scale[0];
          o[n][3] *= scale[1];
        }
      }
      // P^T as the B operand of O^T += V^T P^T: stage it as [head][key] and ldmatrix it back.
      FLASHINFER_UNROLL
      for (int r = 0; r < 2; ++r)
        FLASHINFER_UNROLL
        for (int e = 0; e < 2; ++e) sp[(tig * 2 + e) * 16 + grp + 8 * r] = from_float<TM>(pr[r][e]);
      __syncwarp();
      uint32_t pb[2];
      mma::ldmatrix_x2(pb, sp + (lane & 7) * 16 + ((lane >> 3) & 1) * 8);
      if constexpr (kFp8) {
        // One x4.trans covers 16 keys x two 16-dim chunks (m-tiles n, n + 1): va[2 j] / va[2 j + 1]
        // keys 0-7 / 8-15 of chunk n + j, each register dims (2 grp, 2 grp + 1) of keys (2 tig,
        // 2 tig + 1) as bytes (d0 k0, d1 k0, d0 k1, d1 k1). O^T row grp is dim 16 n + 2 grp, row
        // grp + 8 dim 16 n + 2 grp + 1.
        FLASHINFER_UNROLL
        for (int n = 0; n < kMTiles; n += 2) {
          uint32_t va[4];
          mma::ldmatrix_x4_trans(va, vs_ + at(row0 + (lane & 7) + ((lane >> 3) & 1) * 8, n + (lane >> 4)));
          FLASHINFER_UNROLL
          for (int j = 0; j < 2; ++j) {
            const uint32_t lo = va[2 * j], hi = va[2 * j + 1];
            const uint32_t a[4] = {detail::fp8x2_to_f16x2<TKV>(__byte_perm(lo, 0, 0x0020)),
                                   detail::fp8x2_to_f16x2<TKV>(__byte_perm(lo, 0, 0x0031)),
                                   detail::fp8x2_to_f16x2<TKV>(__byte_perm(hi, 0, 0x0020)),
                                   detail::fp8x2_to_f16x2<TKV>(__byte_perm(hi, 0, 0x0031))};
            mma::mma_16816<TM>(o[n + j], a, pb);
          }
        }
      } else {
        FLASHINFER_UNROLL
        for (int n = 0; n < kMTiles; ++n) {
          uint32_t va[4];  // V^T (dims n*16.. x 16 keys) from V rows via ldmatrix.trans
          mma::ldmatrix_x4_trans(va, vs_ + at(row0 + (lane & 7) + (lane >> 4) * 8, 2 * n + ((lane >> 3) & 1)));
          mma::mma_16816<T>(o[n], va, pb);
        }
      }
      // The stage (and sp) are rewritten by the next iteration. The barrier alone orders this
      // tile's ldmatrix reads before the stage's refill by the copy engine, as an mbarrier
      // arrive does for CUTLASS's TMA pipelines whose consumers read with ldmatrix; a
      // fence.proxy.async here (MEMBAR.ALL.CTA + FENCE.VIEW.ASYNC per tile) cost H200, bf16, 32/8
      // x 128, us: 64 x 2048 140.3 -> 138.1, 256 x 1024 263.3 -> 261.5, 128 x 8192 978.0 -> 975.6.
      __syncthreads();
      s_cur = s_cur + 1 == stages ? 0 : s_cur + 1;
    }
#ifdef FLASHINFER_DECODE_TRACE
    FLASHINFER_DECODE_MARK(p, 4, 1);
    if (p.trace && threadIdx.x == 0) p.trace[blockIdx.x * 2 * detail::kDecodeTraceSlots + 9] = ++traced_items;
#endif
    // Per-warp states of the heads to the scratch, then the shared epilogue.
    FLASHINFER_UNROLL
    for (int e = 0; e < 2; ++e) {
      d[e] += __shfl_xor_sync(0xffffffffu, d[e], 4);
      d[e] += __shfl_xor_sync(0xffffffffu, d[e], 8);
      d[e] += __shfl_xor_sync(0xffffffffu, d[e], 16);
    }
    float* so = reinterpret_cast<float*>(smem + (s_cur == 0 ? stages - 1 : s_cur - 1) * kStage);
    FLASHINFER_UNROLL
    for (int n = 0; n < kMTiles; ++n) {
      FLASHINFER_UNROLL
      for (int e = 0; e < 2; ++e) {
        float* row = so + (warp * kDecodeMaxGroup + tig * 2 + e) * kHeadDim + n * 16 + (kFp8 ? 2 * grp : grp);
        row[0] = o[n][e];
        row[kFp8 ? 1 : 8] = o[n][2 + e];
      }
    }
    if (grp == 0) {
      FLASHINFER_UNROLL
      for (int e = 0; e < 2; ++e) {
        sm[warp * kDecodeMaxGroup + tig * 2 + e] = m[e];
        sd[warp * kDecodeMaxGroup + tig * 2 + e] = d[e];
      }
    }
    __syncthreads();
    const detail::Item ite = detail::get_item<kG>(p, item);
    detail::write_merged<T, kHeadDim, kTcWarps>(p, ite, ite.qh0, ite.ng, so, sm, sd, mi);
    if constexpr (kBulk) bulk::fence_proxy_async();  // the scratch writes precede the stage's refill
    __syncthreads();
  }
  if constexpr (!kBulk) cp_async::wait(0);  // (empty groups by now)
  FLASHINFER_DECODE_MARK(p, 8, 1);
  pdl_launch_dependents();
}

}  // namespace attention
}  // namespace flashinfer
