// Prefill attention on tensor cores (sm_80+), FlashAttention-2 style: a CTA of kPrefillWarps
// warps owns prefill_rows(m_tiles) packed query rows of one KV head (prefill.h), 16 x m_tiles
// per warp. The Q tile and double-buffered K / V tiles of kPrefillKeys keys stream into
// XOR-swizzled shared memory by cp.async; each warp computes its scores with m16n8k16 MMAs (Q
// rows as A, K rows as the col-major B), keeps an online softmax per row in registers (log2
// units), turns the probabilities into A fragments in place and accumulates O += P V (V through
// ldmatrix.trans). On sm_90a (kWg, wgmma.cuh) the four warps act as one warpgroup and both
// products are warpgroup MMAs over 128-byte-swizzled tiles (S from shared memory, P from
// registers, or for MLA from shared memory); masking, softmax, the paged tables and the
// epilogue are shared. A warp-specialized variant of the two-M-tile wgmma kernel (kWs, below
// FLASHINFER_PREFILL_WS) splits the CTA into a copying warpgroup and two computing ones.
#pragma once

#include <cuda_runtime.h>

#include "../barrier.cuh"
#include "../bulk_copy.cuh"
#include "../cp_async.cuh"
#include "../math.cuh"
#include "../mma.cuh"
#include "../utils.cuh"
#include "../wgmma.cuh"
#include "cascade.cuh"
#include "decode.cuh"
#include "prefill.h"
#include "state.h"

// Plain tiles' softmax scale inside exp2's FFMA (see PrefillKernel): -1 (default) batch kernels
// and head_dim 64, 0 never, 1 always.
#ifndef FLASHINFER_PREFILL_FUSED_SCALE
#define FLASHINFER_PREFILL_FUSED_SCALE -1
#endif

// Tiles that every row of a CTA sees whole in a loop of their own, compiled without per-key
// masking (prefill_plain_tiles): -1 (default) single-request kernels, 1 all, 0 none (one loop
// over all tiles). H200 A/B (benchmarks/NOTES.md, session 20): single prefill head_dim 64 4096
// causal 320 -> 306 us, head_dim 128 16384 causal 6615 -> 6569; batch kernels slower with it
// (paged 32 x 512 558 -> 678, ragged 8 x 2048 1028 -> 1057: two loop bodies of code).
#ifndef FLASHINFER_PREFILL_PLAIN_LOOP
#define FLASHINFER_PREFILL_PLAIN_LOOP -1
#endif
// MLA CTAs' two warp groups split each tile's scores by keys (1, default) instead of both
// computing all of them (0): each group computes 32 keys' scores of the 64 rows, the row maxima
// meet in shared memory, and P goes through shared memory (a [64 x 64] tile) to both groups'
// P V. H200, bf16, 128 heads, 4096 keys, us (NOTES, session 20): batch 1 45.2 -> 41.6, 16
// 134.0 -> 123.7, 64 452.8 -> 411.6, 132 885 -> 806, 16 x 17 causal 2179 -> 1971.
#ifndef FLASHINFER_MLA_SPLIT_S
#define FLASHINFER_MLA_SPLIT_S 1
#endif
#ifndef FLASHINFER_MLA_SPLIT_S_UNROLL
#define FLASHINFER_MLA_SPLIT_S_UNROLL 4
#endif

// sm_90a builds (FLASHINFER_ENABLE_WGMMA, set by CMake when 9.0 is among the targets): the
// kernels with whole V / O columns at head dims that are multiples of 64 run their two products
// as warpgroup MMAs (wgmma.cuh) on 9.0 devices: 1 (default) on, 0 off.
#ifndef FLASHINFER_PREFILL_WGMMA
#define FLASHINFER_PREFILL_WGMMA 1
#endif
// wgmma kernels of one M tile overlap each tile's softmax with the previous tile's P V (K runs a
// tile ahead of V): 1 on, 0 off (products issued and waited on in turn), 2 on with a third K
// buffer (K copies two iterations ahead), -1 (default) 2 at head_dim_qk 256 and off elsewhere.
// H200 A/B (benchmarks/NOTES.md, sessions 21 and 22; test_prefill.py passed with 1 and with 2),
// off / 1 / 2, us: head_dim 256 4096 causal 906 / 883 / 848 (836 in a second run); but 128 x 4096
// 71 / 90 / 83 and 1024 causal 54 / 55 / 56 (small grids: K copies two tiles ahead land late).
#ifndef FLASHINFER_PREFILL_WG_OVERLAP
#define FLASHINFER_PREFILL_WG_OVERLAP -1
#endif

// Warp-specialized wgmma kernels (FLASHINFER_PREFILL_WS, 1 on, 0 off): the kernels of two M tiles
// (128 rows, whole columns) run as CTAs of three warpgroups. Warpgroup 0 copies K and V tiles of
// kPrefillWsKeys keys into kPrefillWsStages stages each (cp.async; per stage a full mbarrier says
// a tile landed, an empty one that both consumers are done with it; K runs a tile ahead of V);
// warpgroups 1 and 2 each own one 64-row M tile, and neither waits for the other: no
// __syncthreads in the loop. 2: each consumer issues S of tile it + 1 with P V of tile it and
// runs the softmax of it + 1 under P V; 3: that, and the two consumers take turns issuing their
// products (named barriers), so one's softmax runs under the other's products.
// Default 1 (with 208 registers per consumer thread and 128-key tiles), built for single-request
// prefill at head_dim 128 and launched where prefill_single_ws (prefill.h) says: causal, small
// grids. The kernel instance is a template switch (kWsReq), so other kernels can be built with it
// for measurements.
#ifndef FLASHINFER_PREFILL_WS
#define FLASHINFER_PREFILL_WS 1
#endif
// Warp-specialized CTAs: registers per consumer thread after setmaxnreg (the producer gets what
// is left of 3 x 168); 0: no setmaxnreg (every thread keeps the launch's 168).
#ifndef FLASHINFER_PREFILL_WS_REGS
#define FLASHINFER_PREFILL_WS_REGS 208
#endif
// Keys per K / V tile of a warp-specialized CTA (64 or 128), and stages of each.
#ifndef FLASHINFER_PREFILL_WS_KEYS
#define FLASHINFER_PREFILL_WS_KEYS 128
#endif
#ifndef FLASHINFER_PREFILL_WS_STAGES
#define FLASHINFER_PREFILL_WS_STAGES 2
#endif

namespace flashinfer {
namespace attention {

constexpr int kPrefillWsStages = FLASHINFER_PREFILL_WS_STAGES, kPrefillWsKeys = FLASHINFER_PREFILL_WS_KEYS;
static_assert(kPrefillWsStages >= 2 && (kPrefillWsKeys == 64 || kPrefillWsKeys == 128), "warp-specialized prefill");
// Whether a kernel is the warp-specialized one (above).
// (ws: the instance asks for it; FLASHINFER_PREFILL_WS 0 builds the plain kernel instead)
FLASHINFER_HOST_DEVICE constexpr bool prefill_ws(bool wg, int m_tiles, PrefillVO vo, bool ws) {
  return FLASHINFER_PREFILL_WS != 0 && ws && wg && m_tiles == 2 && vo == PrefillVO::kWhole;
}
// A kernel's threads: prefill_threads, or a warp-specialized CTA's three warpgroups.
FLASHINFER_HOST_DEVICE constexpr int prefill_kernel_threads(PrefillVO vo, bool wg, int m_tiles, bool ws = false) {
  return prefill_ws(wg, m_tiles, vo, ws) ? 3 * kPrefillThreads : prefill_threads(vo);
}

// The overlapped wgmma loop's mode of a kernel (FLASHINFER_PREFILL_WG_OVERLAP; one M tile, whole
// columns): 0 off, 1, 2.
FLASHINFER_HOST_DEVICE constexpr int prefill_wg_overlap(bool wg, int m_tiles, PrefillVO vo, int head_dim_qk) {
  return !(wg && m_tiles == 1 && vo == PrefillVO::kWhole) ? 0
         : FLASHINFER_PREFILL_WG_OVERLAP >= 0      ? FLASHINFER_PREFILL_WG_OVERLAP
         : head_dim_qk == 256                      ? 2
                                                   : 0;
}
// K tile buffers of a kernel: three in the overlapped loop's mode 2, else two.
FLASHINFER_HOST_DEVICE constexpr int prefill_k_bufs(bool wg, int m_tiles, PrefillVO vo, int head_dim_qk) {
  return prefill_wg_overlap(wg, m_tiles, vo, head_dim_qk) == 2 ? 3 : 2;
}
// A kernel's dynamic shared memory: prefill_smem_bytes' tiles, and for a wgmma kernel 1024 bytes
// of alignment slack (MLA's CTA has no room for it: see PrefillKernel) and its extra K buffer;
// a warp-specialized one's: Q, kPrefillWsStages K and V tiles of kPrefillWsKeys keys, the slack.
FLASHINFER_HOST_DEVICE constexpr int64_t prefill_kernel_smem_bytes(int head_dim_qk, int head_dim_vo, int m_tiles,
                                                                   PrefillVO vo, bool wg, bool ws = false) {
  if (prefill_ws(wg, m_tiles, vo, ws))
    return int64_t{2} * (int64_t{prefill_rows(m_tiles)} * head_dim_qk +
                         int64_t{kPrefillWsStages} * kPrefillWsKeys * (head_dim_qk + head_dim_vo)) + 1024;
  return prefill_smem_bytes(head_dim_qk, head_dim_vo, m_tiles, 2, vo == PrefillVO::kMla) +
         (wg && vo != PrefillVO::kMla ? 1024 : 0) +
         int64_t{prefill_k_bufs(wg, m_tiles, vo, head_dim_qk) - 2} * kPrefillKeys * head_dim_qk * 2;
}
// (the warp-specialized CTAs built, with their static paged table of 4 x kPrefillWsKeys x 16
// bytes, fit the 227 KB a CTA may have: FLASHINFER_PREFILL_WS_STAGES / _KEYS must keep them so)
static_assert(FLASHINFER_PREFILL_WS == 0 ||
                  prefill_kernel_smem_bytes(128, 128, 2, PrefillVO::kWhole, true, true) + 4 * kPrefillWsKeys * 16 + 256 <=
                      227 * 1024,
              "warp-specialized prefill: shared memory over 227 KB");

namespace detail {

// Byte offset of 16-byte chunk c of row r in a tile of kRows rows of kRowBytes bytes: the
// mma.sync kernels' row-major XOR swizzle, or (kSw128) wgmma's 128-byte-swizzled column blocks.
template <int kRowBytes, int kRows, bool kSw128>
FLASHINFER_DEVICE uint32_t tile_offset(int r, int c) {
  if constexpr (kSw128) return wgmma::sw128_offset<kRows>(r, c);
  else return mma::swizzle_offset<kRowBytes>(r, c);
}

// Copies kKeys rows of kRowBytes bytes (row r at src + r * stride_n elements) into a
// swizzled tile; rows >= valid become zeros. Thread t moves 16-byte chunk t % kChunks of rows
// t / kChunks + k * (threads / kChunks), its source pointer stepping by a precomputed stride.
template <int kRowBytes, int kKeys, bool kSw128 = false, typename T>
FLASHINFER_DEVICE void prefill_load_rows(char* dst, const T* src, int64_t stride_n, int valid) {
  constexpr int kChunks = kRowBytes / 16;
  const int tid = threadIdx.x;
  if constexpr (kPrefillThreads % kChunks == 0) {
    constexpr int kStep = kPrefillThreads / kChunks;  // rows per pass
    const int c = tid % kChunks, r0 = tid / kChunks;
    const T* s = src + r0 * stride_n + c * 8;
    const int64_t step = kStep * stride_n;
    FLASHINFER_UNROLL
    for (int i = 0; i < kKeys / kStep; ++i) {
      const int r = r0 + i * kStep;
      cp_async::copy16_or_zero(dst + tile_offset<kRowBytes, kKeys, kSw128>(r, c), r < valid ? s : src, r < valid);
      s += step;
    }
  } else {
    FLASHINFER_UNROLL
    for (int i = tid; i < kKeys * kChunks; i += kPrefillThreads) {
      const int r = i / kChunks, c = i % kChunks;
      cp_async::copy16_or_zero(dst + tile_offset<kRowBytes, kKeys, kSw128>(r, c), src + (r < valid ? r : 0) * stride_n + c * 8,
                               r < valid);
    }
  }
}

// The same for a paged cache, from a table of row byte addresses: chunks [kCol0, kCol0 + kCols)
// of row r come from the row at addr[2 r] (from its first byte), bit 0 set: a zero row (the
// address itself stays a valid one). byte_off is added to every address (a part's columns).
// Where the threads divide into whole rows, each thread keeps one chunk and steps through rows: a
// copy is a shared load, two logic ops, an add and the copy. (H200, bf16, 32 / 8 heads x 128,
// causal, page 16, 8 x 2048 tokens: a (page, entry) table 1389 us, signed element offsets 1295 /
// 1271, whose copies ncu counted 17% more instructions than ragged keys', this table 1193; 32 x
// 512: 578, 557 / 559, 511. Ragged keys: 1030 / 485.)
template <int kRowBytes, int kKeys, int kCol0 = 0, int kCols = kRowBytes / 16, int kThreads = kPrefillThreads,
          bool kSw128 = false>
FLASHINFER_DEVICE void prefill_load_addr_rows(char* dst, const uint64_t* addr, int64_t byte_off = 0) {
  static_assert(kCol0 + kCols <= kRowBytes / 16, "chunks of the row");
  if constexpr (kThreads % kCols == 0 && kKeys % (kThreads / kCols) == 0) {
    constexpr int kStep = kThreads / kCols;  // rows per pass
    const int c = threadIdx.x % kCols, r0 = threadIdx.x / kCols;
    const uint64_t add = static_cast<uint64_t>(byte_off + c * 16);
    FLASHINFER_UNROLL
    for (int i = 0; i < kKeys / kStep; ++i) {
      const int r = r0 + i * kStep;
      const uint64_t a = addr[2 * r];
      cp_async::copy16_or_zero(dst + tile_offset<kRowBytes, kKeys, kSw128>(r, kCol0 + c),
                               reinterpret_cast<const void*>((a & ~uint64_t{1}) + add), (a & 1) == 0);
    }
  } else {
    FLASHINFER_UNROLL
    for (int i = threadIdx.x; i < kKeys * kCols; i += kThreads) {
      const int r = i / kCols, c = i % kCols;
      const uint64_t a = addr[2 * r], src = (a & ~uint64_t{1}) + static_cast<uint64_t>(byte_off + c * 16);
      cp_async::copy16_or_zero(dst + tile_offset<kRowBytes, kKeys, kSw128>(r, kCol0 + c),
                               reinterpret_cast<const void*>(src), (a & 1) == 0);
    }
  }
}

// K and V rows of one size from the same table: one 16-byte shared load gives a row's two addresses.
template <int kRowBytes, int kKeys, bool kSw128 = false>
FLASHINFER_DEVICE void prefill_load_kv_addr_rows(char* dst_k, char* dst_v, const uint64_t* addr) {
  constexpr int kChunks = kRowBytes / 16, kStep = kPrefillThreads / kChunks;
  static_assert(kPrefillThreads % kChunks == 0 && kKeys % kStep == 0, "whole rows per pass");
  const int c = threadIdx.x % kChunks, r0 = threadIdx.x / kChunks;
  FLASHINFER_UNROLL
  for (int i = 0; i < kKeys / kStep; ++i) {
    const int r = r0 + i * kStep;
    const ulonglong2 a = *reinterpret_cast<const ulonglong2*>(addr + 2 * r);
    const int off = tile_offset<kRowBytes, kKeys, kSw128>(r, c);
    cp_async::copy16_or_zero(dst_k + off, reinterpret_cast<const void*>((a.x & ~uint64_t{1}) + c * 16), (a.x & 1) == 0);
    cp_async::copy16_or_zero(dst_v + off, reinterpret_cast<const void*>((a.y & ~uint64_t{1}) + c * 16), (a.y & 1) == 0);
  }
}

}  // namespace detail

// A compile-time bool as a value (a generic lambda's template argument).
template <bool B>
struct BoolTag {
  static constexpr bool value = B;
};

// kMT: 16-row M tiles per warp (prefill_m_tiles): each K / V fragment read from shared memory
// feeds kMT MMAs.
// kMode: one request (p.items null; its offsets compile to zeros), or a batch of work items
// with ragged or paged keys.
// kVO: which V / O columns (prefill.h); kDVO is the CTA's column count (one part of
// p.head_dim_vo for kParts and kMla, blockIdx.z the part).
// MLA CTAs have two warp groups (prefill_threads): the same rows, V / O columns side by side;
// both compute the rows' scores, and the K tile they share is loaded once.
// kWg (sm_90a): the CTA's four warps are one warpgroup; M tile mt is rows 64 mt .. 64 mt + 63
// (warp w: 16 w .. 16 w + 15 of it), and S = Q K^T (both from shared memory) and O += P V (P
// from registers, V from shared memory) are wgmma products over 128-byte-swizzled tiles.
template <typename T, int kDQK, int kDVO, int kMT, PrefillMode kMode = PrefillMode::kSingle,
          PrefillVO kVO = PrefillVO::kWhole, bool kWg = false, bool kWsReq = false>
__global__ void __launch_bounds__(prefill_kernel_threads(kVO, kWg, kMT, kWsReq)) PrefillKernel(const PrefillParams<T> p) {
  constexpr bool kPaged = kMode == PrefillMode::kPaged;
  constexpr bool kMla = kVO == PrefillVO::kMla;
  static_assert(kDQK % 16 == 0 && kDVO % 16 == 0 && kDQK >= 64 && kDVO >= 64, "head dims: multiples of 16, >= 64");
  static_assert(!kMla || (kPaged && kDQK >= kMlaHeadDimCkv), "MLA: paged, K = [ckv || kpe]");
  constexpr int kRowQK = kDQK * 2, kRowVO = kDVO * 2;  // bytes per row
  // V's tile: its own stages, or (MLA) the K tile, whose rows are kRowQK bytes
  constexpr int kRowV = kMla ? kRowQK : kRowVO;
  // (kWs: warp-specialized, see FLASHINFER_PREFILL_WS; a thread's accumulators then hold one M tile)
  constexpr bool kWs = prefill_ws(kWg, kMT, kVO, kWsReq);
  constexpr int kVoGroups = prefill_threads(kVO) / kPrefillThreads;
  constexpr int kThreads = prefill_kernel_threads(kVO, kWg, kMT, kWsReq);
  constexpr int kTM = kWs ? 1 : kMT;
  constexpr int kChunksQK = kDQK / 8;                    // 16-byte chunks per Q row
  constexpr int kKeys = kWs ? kPrefillWsKeys : kPrefillKeys;  // keys per stage
  constexpr int kWarpRows = 16 * kMT, kRows = kPrefillWarps * kWarpRows;
  static_assert(!kWg || (kVO != PrefillVO::kParts && kDQK % 64 == 0 && kDVO % 64 == 0 && kDVO <= 256),
                "wgmma: whole V / O columns or MLA, head dims multiples of 64, V / O columns <= 256");
  FLASHINFER_EXTERN_SHARED uint4 prefill_smem[];
  char* sQ = reinterpret_cast<char*>(prefill_smem);
  // (kWg: swizzle atoms are 1024-byte aligned. MLA's CTA has no room for the slack: its static
  // arrays total a multiple of 1024 bytes, and the tiles must then start aligned)
  if constexpr (kWg) sQ += (1024 - (wgmma::smem_u32(sQ) & 1023)) & 1023;
#if defined(__CUDA_ARCH__)
  if constexpr (kWg && kMla) {
    if (sQ != reinterpret_cast<char*>(prefill_smem)) __trap();
  }
#endif
  char* sK = sQ + kRows * kRowQK;
  // (the overlapped wgmma loop's mode 2: three K buffers)
  constexpr int kKBufs = kWs ? kPrefillWsStages : prefill_k_bufs(kWg, kMT, kVO, kDQK);
  char* sV = sK + kKBufs * kKeys * kRowQK;
  const int tid = threadIdx.x, lane = tid & 31;
  const int warp = kVoGroups > 1 || kWs ? (tid >> 5) % kPrefillWarps : tid >> 5;  // (of the rows)
  // kWs: this thread's consumer warpgroup, whose M tile (rows 64 cw ..) it computes; -1: the producer
  const int cw = kWs ? (tid >> 7) - 1 : 0;
  // This warp's V / O columns: [part * kDVO, part * kDVO + kDVO); V's first 16-byte chunk in its tile.
  const int part = kVO == PrefillVO::kWhole
                       ? 0
                       : static_cast<int>(blockIdx.z) * kVoGroups + (kVoGroups > 1 ? (tid >> 5) / kPrefillWarps : 0);
  const int v_chunk0 = kMla ? part * (kDVO / 8) : 0;
  // MLA split scores: warp group vg computes keys [kSKeys * vg, kSKeys * vg + kSKeys) of each
  // tile (kSNT 8-key score tiles); sP holds the tile's P (64 rows x 64 keys, swizzled like a
  // 128-byte-row tile) and sMax each group's row maxima, then (epilogue) its row sums.
  constexpr bool kSplitS = kMla && FLASHINFER_MLA_SPLIT_S != 0;
  constexpr int kSKeys = kSplitS ? kPrefillKeys / kVoGroups : kKeys, kSNT = kSKeys / 8;
  const int vg = kSplitS ? (tid >> 5) / kPrefillWarps : 0;
  [[maybe_unused]] constexpr int kSUnroll = FLASHINFER_MLA_SPLIT_S_UNROLL;
  // (kWg: sP is the A operand of P V, a 128-byte-swizzled tile: 1024-byte aligned)
  alignas(kWg && kSplitS ? 1024 : 16) __shared__ char sP[kSplitS ? kPrefillMaxRows / 2 * kPrefillKeys * 2 : 16];
  __shared__ float sMax[kSplitS ? kVoGroups : 1][kSplitS ? kPrefillMaxRows / 2 * (kWg ? 2 : 1) : 1];
  const int grp = lane >> 2, tig = lane & 3;
  const int group = p.num_qo_heads / p.num_kv_heads, kv_head = blockIdx.y;
  pdl_wait();  // (the batch's index arrays may come from the previous kernel)
  // This CTA's request and row tile; single prefill: request 0, causal tiles of later rows (they
  // see more keys) first.
  int64_t b = 0, tile = p.causal && !p.mask ? int64_t{gridDim.x} - 1 - blockIdx.x : int64_t{blockIdx.x};
  int64_t q0 = 0, qo_len = p.qo_len, kv_len = p.kv_len, kv_base = 0, mask_bit0 = 0;
  if constexpr (kMode != PrefillMode::kSingle) {
    b = p.items[2 * blockIdx.x];
    tile = p.items[2 * blockIdx.x + 1];
    q0 = p.qo_indptr[b];
    qo_len = p.qo_indptr[b + 1] - q0;
    kv_base = p.kv_indptr[b];
    const int64_t n = p.kv_indptr[b + 1] - kv_base;  // keys (ragged) or pages (paged)
    kv_len = !kPaged ? n : n > 0 ? (n - 1) * p.page_size + p.last_page_len[b] : 0;
    if (p.mask) mask_bit0 = int64_t{p.mask_indptr[b]} * 8;
  }
  // Split-KV (batch kernels of one M tile, MLA; prefill.h): the item's key chunk.
  constexpr bool kSplitKv = kMla || (kMode != PrefillMode::kSingle && kMT == 1);
  [[maybe_unused]] int chunk = 0;
  if constexpr (kSplitKv) {
    if (p.num_chunks > 1) chunk = static_cast<int>(tile % p.num_chunks), tile /= p.num_chunks;
  }
  const int64_t rows = qo_len * group, delta = kv_len - qo_len;
  const int64_t pr0 = tile * kRows;
  if (pr0 >= rows) return;
  const int64_t pr_end = pr0 + kRows < rows ? pr0 + kRows : rows;
  KeyRange kr = prefill_key_range(pr0, pr_end, group, qo_len, kv_len, p.causal, p.window_left, p.mask != nullptr);
  if constexpr (kSplitKv) {  // (chunks start on tile boundaries: their tiles need no extra masking)
    if (p.num_chunks > 1) {
      const int64_t ck = mla_chunk_keys(kv_len, p.num_chunks), lo = chunk * ck;
      kr.begin = kr.begin > lo ? kr.begin : lo;
      kr.end = kr.end < lo + ck ? kr.end : lo + ck;
    }
  }
  const int64_t kv_first = kr.begin / kKeys * kKeys;
  const int64_t n_tiles = kr.end > kv_first ? ceil_div<int64_t>(kr.end - kv_first, kKeys) : 0;

  // This thread's rows: grp and grp + 8 of each of its warp's M tiles. Their tokens and q heads
  // are recomputed where needed (masked tiles, the epilogue) rather than kept in registers.
  constexpr int kMtStride = kWg ? 64 : 16;  // rows between a warp's M tiles
  const int64_t my_pr0 = pr0 + (kWs ? cw * 64 : 0) + warp * (kWg ? 16 : kWarpRows) + grp;
  auto row_of = [&](int mt, int h) { return my_pr0 + mt * kMtStride + 8 * h; };
  auto token_of = [&](int64_t pr) { return static_cast<int>((pr < rows ? pr : rows - 1) / group); };
  const int delta32 = static_cast<int>(delta), kv_len32 = static_cast<int>(kv_len);
  const bool soft_cap = p.soft_cap > 0.f;
  const bool plain = !soft_cap && !p.alibi;
  const float s_scale = soft_cap ? p.sm_scale / p.soft_cap : p.sm_scale * detail::kLog2e;
  const float cap_log2 = p.soft_cap * detail::kLog2e;

  // Q tile: packed row r = token * group + (q head - kv_head * group); rows past the end are zero.
  // (kWs: each consumer warpgroup copies its own M tile's rows, the producer none)
  const int q_begin = !kWs ? tid : cw < 0 ? kRows * kChunksQK : cw * 64 * kChunksQK + (tid & (kPrefillThreads - 1));
  const int q_end = kWs ? (cw + 1) * 64 * kChunksQK : kRows * kChunksQK;
  for (int i = q_begin; i < q_end; i += kWs ? kPrefillThreads : kThreads) {
    const int r = i / kChunksQK, c = i % kChunksQK;
    const int64_t pr = pr0 + r;
    const bool ok = pr < rows;
    const int64_t t = ok ? pr / group : 0;
    const int64_t head = kv_head * group + (ok ? pr - t * group : 0);
    if constexpr (kMla) {  // [q_nope || q_pe]: chunks from kMlaHeadDimCkv / 8 on from q_rope
      if (c >= kMlaHeadDimCkv / 8) {
        cp_async::copy16_or_zero(
            sQ + detail::tile_offset<kRowQK, kRows, kWg>(r, c),
            p.q_rope + (q0 + t) * p.qr_stride_n + head * p.qr_stride_h + (c - kMlaHeadDimCkv / 8) * 8, ok);
        continue;
      }
    }
    cp_async::copy16_or_zero(sQ + detail::tile_offset<kRowQK, kRows, kWg>(r, c),
                             p.q + (q0 + t) * p.q_stride_n + head * p.q_stride_h + c * 8, ok);
  }
  // Paged: the byte addresses of every key row of a stage's tile in K and V (MLA: in the ckv and
  // kpe caches), written a tile ahead, so the copies issue without a dependent index load; bit 0
  // set: a zero row (past kv_len, or a page id outside the cache). page_id / set_row: the id load
  // (early) and the table entry (late); threads 0 .. 2 kKeys - 1 fill entry tid / kKeys of row
  // tid % kKeys.
  // kWgOverlap: K tiles are loaded a tile ahead of V (see the loop), and the table has four
  // slots, tile t in slot t % 4.
  constexpr bool kWgOverlap = prefill_wg_overlap(kWg, kMT, kVO, kDQK) != 0;
  constexpr int kAddrSlots = kWgOverlap || kWs ? 4 : 2;
  __shared__ __align__(16) uint64_t page_addr[kPaged ? kAddrSlots : 1][kPaged ? kKeys : 1][2];
  auto page_id = [&](int64_t kv0, int r) -> int {
    if (kv0 + r >= kv_len) return -1;
    const int64_t id = p.page_indices[kv_base + static_cast<int>(kv0 + r) / p.page_size];  // (keys < 2^31)
    return id >= 0 && id < p.num_pages ? static_cast<int>(id) : -1;
  };
  const int row_r = tid % kKeys, row_which = tid / kKeys;  // (the table entry this thread fills)
  // (kWs: the producer's threads, one per row, fill both entries)
  auto set_row = [&](int stage, int64_t kv0, int id) {
    const int64_t e = static_cast<int>(kv0 + row_r) % p.page_size;
    FLASHINFER_UNROLL
    for (int w = kWs ? 0 : 1; w < 2; ++w) {
      const int which = kWs ? w : row_which;
      const T* base = which == 0 ? p.k + int64_t{kv_head} * p.k_stride_h
                      : kMla     ? p.k_rope
                                 : p.v + int64_t{kv_head} * p.v_stride_h;
      const int64_t sp = which == 0 ? p.k_stride_page : kMla ? p.kr_stride_page : p.v_stride_page;
      const int64_t sn = which == 0 ? p.k_stride_n : kMla ? p.kr_stride_n : p.v_stride_n;
      page_addr[stage][row_r][which] = id < 0 ? reinterpret_cast<uint64_t>(base) | 1
                                             : reinterpret_cast<uint64_t>(base + id * sp + e * sn);
    }
  };
  if constexpr (kPaged) {
    if (tid < (kWs ? kKeys : 2 * kKeys)) {
      for (int s = 0; s < (kWgOverlap ? kKBufs + 1 : 2) && s < n_tiles; ++s) {  // (tiles the prologue and first iteration copy)
        const int64_t kv0 = kv_first + s * kKeys;
        set_row(s, kv0, page_id(kv0, row_r));
      }
    }
    __syncthreads();
  }
  // The K tile / this CTA's V columns from key kv0 into buffer `buf` (paged: from table slot
  // `slot`); the copies are issued, not committed.
  auto load_k = [&](int buf, int slot, int64_t kv0) {
    if constexpr (kPaged) {
      detail::prefill_load_addr_rows<kRowQK, kKeys, 0, kRowQK / 16, kPrefillThreads, kWg>(sK + buf * kKeys * kRowQK,
                                                                                     &page_addr[slot][0][0]);
    } else {
      const int valid = static_cast<int>(kv_len - kv0 < kKeys ? kv_len - kv0 : kKeys);
      detail::prefill_load_rows<kRowQK, kKeys, kWg>(sK + buf * kKeys * kRowQK,
                                                    p.k + (kv_base + kv0) * p.k_stride_n + int64_t{kv_head} * p.k_stride_h,
                                                    p.k_stride_n, valid);
    }
  };
  auto load_v = [&](int buf, int slot, int64_t kv0) {
    if constexpr (kPaged) {
      detail::prefill_load_addr_rows<kRowVO, kKeys, 0, kRowVO / 16, kPrefillThreads, kWg>(
          sV + buf * kKeys * kRowVO, &page_addr[slot][0][1], int64_t{part} * kDVO * 2);
    } else {
      const int valid = static_cast<int>(kv_len - kv0 < kKeys ? kv_len - kv0 : kKeys);
      detail::prefill_load_rows<kRowVO, kKeys, kWg>(
          sV + buf * kKeys * kRowVO,
          p.v + (kv_base + kv0) * p.v_stride_n + int64_t{kv_head} * p.v_stride_h + part * kDVO, p.v_stride_n, valid);
    }
  };
  // K and V tiles of `stage` from key kv0 (their copies are issued, not committed).
  auto load_kv = [&](int stage, int64_t kv0) {
    if constexpr (kMla) {  // [ckv || kpe] rows; V is the K tile
      constexpr int kCkv = kMlaHeadDimCkv / 8;  // (16-byte chunks)
      detail::prefill_load_addr_rows<kRowQK, kKeys, 0, kCkv, kThreads, kWg>(sK + stage * kKeys * kRowQK,
                                                                       &page_addr[stage][0][0]);
      if constexpr (kDQK > kMlaHeadDimCkv)
        detail::prefill_load_addr_rows<kRowQK, kKeys, kCkv, kDQK / 8 - kCkv, kThreads, kWg>(sK + stage * kKeys * kRowQK,
                                                                                     &page_addr[stage][0][1]);
    } else if constexpr (kPaged && kRowQK == kRowVO && kVO == PrefillVO::kWhole) {
      detail::prefill_load_kv_addr_rows<kRowQK, kKeys, kWg>(sK + stage * kKeys * kRowQK, sV + stage * kKeys * kRowVO,
                                                            &page_addr[stage][0][0]);
    } else {
      load_k(stage, stage, kv0);
      load_v(stage, stage, kv0);
    }
  };
  // kFusedScale: H200 A/B (NOTES, session 18): 2-3% faster for batch and head_dim 64, 1.5%
  // slower for single-request head_dim 128.
  constexpr bool kFusedScale = FLASHINFER_PREFILL_FUSED_SCALE < 0
                                   ? kMode != PrefillMode::kSingle || kDQK == 64
                                   : FLASHINFER_PREFILL_FUSED_SCALE != 0;
  // kWs: [0] K, [1] V. Stage s's full barrier completes a phase when tile s + k kPrefillWsStages
  // has landed (every producer thread arrives once its own copies have), its empty barrier when
  // both consumers are done with it (lane 0 of each consumer warp arrives).
  __shared__ uint64_t ws_full[kWs ? 2 : 1][kWs ? kPrefillWsStages : 1], ws_empty[kWs ? 2 : 1][kWs ? kPrefillWsStages : 1];
  if constexpr (kWs) {  // (the copies of Q wait in the consumers' loop prologue)
    if (tid == 0) {
      for (int kv = 0; kv < 2; ++kv) {
        for (int s = 0; s < kPrefillWsStages; ++s) {
          bulk::mbarrier_init(&ws_full[kv][s], kPrefillThreads);
          bulk::mbarrier_init(&ws_empty[kv][s], 2 * kPrefillWarps);
        }
      }
      bulk::fence_init();
    }
    __syncthreads();  // (the barriers' init; no CTA-wide barrier after this one)
  } else if constexpr (kWgOverlap) {  // groups: (Q, K 0), then (V 0, K 1) (, then (K 2) with three K buffers)
    if (n_tiles > 0) load_k(0, 0, kv_first);
    cp_async::commit();
    if (n_tiles > 0) load_v(0, 0, kv_first);
    if (n_tiles > 1) load_k(1, 1, kv_first + kKeys);
    cp_async::commit();
    if constexpr (kKBufs == 3) {
      if (n_tiles > 2) load_k(2, 2, kv_first + 2 * kKeys);
      cp_async::commit();
    }
  } else {
    if (n_tiles > 0) load_kv(0, kv_first);
    cp_async::commit();
  }

  float o[kTM][kDVO / 8][4];
  float m[kTM][2], d[kTM][2];
  FLASHINFER_UNROLL
  for (int mt = 0; mt < kTM; ++mt) {
    FLASHINFER_UNROLL
    for (int n = 0; n < kDVO / 8; ++n) o[mt][n][0] = o[mt][n][1] = o[mt][n][2] = o[mt][n][3] = 0.f;
    m[mt][0] = m[mt][1] = neg_inf();
    d[mt][0] = d[mt][1] = 0.f;
  }
  // The warp's tokens, for deciding whether a tile needs per-key masking.
  // (kWg: the warp's first and last rows over its M tiles; the range between covers them)
  const int64_t w_pr0 = pr0 + (kWs ? cw * 64 : 0) + warp * (kWg ? 16 : kWarpRows);
  const int64_t w_end = kWg ? w_pr0 + (kTM - 1) * 64 + 16 : w_pr0 + kWarpRows;
  const int64_t w_last = w_end - 1 < rows ? w_end - 1 : rows - 1;
  const int64_t w_tok_lo = (w_pr0 < rows ? w_pr0 : rows - 1) / group, w_tok_hi = w_last / group;

  // One tile's scores -> probabilities in place (kMasked: a BoolTag, as tile_step's), m and d
  // updated; alpha_out: the factor O's rows must be rescaled by (rescale_o) before P V adds in.
  auto softmax_tile = [&](auto masked_tag, int64_t kv0, auto& sc, auto& alpha_out) {
    constexpr bool kMasked = decltype(masked_tag)::value;
    // Scores in log2 units, masked keys -inf. Tiles inside every row's visible range with no
    // soft cap or ALiBi take the plain scale; the rest (diagonal, window edge, last tile,
    // custom mask) the general path, key indices in 32 bits (validate()).
    const bool full = !kMasked || (kv0 + kKeys <= kv_len && !p.mask &&
                                   !(p.causal && kv0 + kKeys - 1 > w_tok_lo + delta) &&
                                   !(p.window_left >= 0 && kv0 < w_tok_hi + delta - p.window_left));
    // mul: with kFusedScale a plain tile keeps its raw scores and the scale goes into the max and
    // into exp2's argument (one FFMA); 1 where the scores are scaled here.
    float mul = 1.f;
    if (full && plain && kFusedScale && s_scale > 0.f) {
      mul = s_scale;
    } else if (full && plain) {
      FLASHINFER_UNROLL
      for (int mt = 0; mt < kTM; ++mt) {
        FLASHINFER_UNROLL
        for (int n = 0; n < kSNT; ++n) {
          FLASHINFER_UNROLL
          for (int e = 0; e < 4; ++e) sc[mt][n][e] *= s_scale;
        }
      }
    } else if constexpr (kMasked) {
      // Per row: the visible keys [lo, hi) (window, causal, kv_len), its ALiBi slope, and
      // with a custom mask the row's first bit; then one select per score.
      const int j0 = static_cast<int>(kv0) + kSKeys * vg + tig * 2;
      FLASHINFER_UNROLL
      for (int mt = 0; mt < kTM; ++mt) {
        FLASHINFER_UNROLL
        for (int h = 0; h < 2; ++h) {
          const int64_t pr = row_of(mt, h);
          const int t = token_of(pr);
          const int diag = t + delta32;
          const int lo = p.window_left >= 0 ? diag - p.window_left : 0;
          const int hi = p.causal && !p.mask && diag + 1 < kv_len32 ? diag + 1 : kv_len32;  // (a mask replaces causal)
          const int head = kv_head * group + static_cast<int>((pr < rows ? pr : rows - 1) - int64_t{t} * group);
          const float slope = p.alibi ? detail::alibi_slope(head, p.num_qo_heads) * detail::kLog2e : 0.f;
          const int64_t mbase = mask_bit0 + int64_t{t} * kv_len32;
          FLASHINFER_UNROLL
          for (int n = 0; n < kSNT; ++n) {
            FLASHINFER_UNROLL
            for (int e = 0; e < 2; ++e) {
              const int j = j0 + n * 8 + e;
              float x = sc[mt][n][2 * h + e] * s_scale;
              if (soft_cap) x = cap_log2 * tanhf(x);
              x += slope * static_cast<float>(j - t);
              bool ok = j >= lo && j < hi;
              if (p.mask) ok = ok && ((p.mask[(mbase + j) >> 3] >> ((mbase + j) & 7)) & 1);
              sc[mt][n][2 * h + e] = ok ? x : neg_inf();
            }
          }
        }
      }
    }

    // Online softmax per row; the row's 4 lanes (one quad) share its max (split scores: and the
    // other warp group's, through sMax).
    float mxs[kTM][2];
    FLASHINFER_UNROLL
    for (int mt = 0; mt < kTM; ++mt) {
      FLASHINFER_UNROLL
      for (int h = 0; h < 2; ++h) {
        float mx = neg_inf();
        FLASHINFER_UNROLL
        for (int n = 0; n < kSNT; ++n) mx = fmaxf(mx, fmaxf(sc[mt][n][2 * h], sc[mt][n][2 * h + 1]));
        mx = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 1));
        mxs[mt][h] = fmaxf(mx, __shfl_xor_sync(0xffffffffu, mx, 2)) * mul;
      }
    }
    if constexpr (kSplitS) {
      const int r = warp * 16 + grp;
      if (tig == 0) sMax[vg][r] = mxs[0][0], sMax[vg][r + 8] = mxs[0][1];
      __syncthreads();
      mxs[0][0] = fmaxf(mxs[0][0], sMax[1 - vg][r]);
      mxs[0][1] = fmaxf(mxs[0][1], sMax[1 - vg][r + 8]);
    }
    FLASHINFER_UNROLL
    for (int mt = 0; mt < kTM; ++mt) {
      FLASHINFER_UNROLL
      for (int h = 0; h < 2; ++h) {
        const float m_new = fmaxf(m[mt][h], mxs[mt][h]);
        const float base = m_new == neg_inf() ? 0.f : m_new;  // nothing seen yet: every p is 0
        const float alpha = fast_exp2(m[mt][h] - base);
        m[mt][h] = m_new;
        float sum = 0.f;
        FLASHINFER_UNROLL
        for (int n = 0; n < kSNT; ++n) {
          FLASHINFER_UNROLL
          for (int e = 0; e < 2; ++e) {
            const float pv = fast_exp2(fmaf(sc[mt][n][2 * h + e], mul, -base));
            sc[mt][n][2 * h + e] = pv;
            sum += pv;
          }
        }
        d[mt][h] = d[mt][h] * alpha + sum;
        alpha_out[mt][h] = alpha;
      }
    }
  };
  auto rescale_o = [&](const auto& alpha) {
    FLASHINFER_UNROLL
    for (int mt = 0; mt < kTM; ++mt) {
      FLASHINFER_UNROLL
      for (int n = 0; n < kDVO / 8; ++n) {
        o[mt][n][0] *= alpha[mt][0];
        o[mt][n][1] *= alpha[mt][0];
        o[mt][n][2] *= alpha[mt][1];
        o[mt][n][3] *= alpha[mt][1];
      }
    }
  };

  // wgmma products, issued and not committed: S(mt) (+)= Q K^T of M tile mt against the K tile at
  // ks (split scores: this group's kSKeys keys, rows kSKeys vg .. of the tile), and O(mt) += P V
  // with P's A fragments pa (keys 16 kk .. 16 kk + 15: two 8-key atom rows) and this group's V
  // columns at vb (column blocks kKeys x 128 bytes apart).
  [[maybe_unused]] auto wg_qk = [&](float* s, int mt, const char* ks) {
    FLASHINFER_UNROLL
    for (int ks_ = 0; ks_ < kDQK / 16; ++ks_) {
      const int col = (ks_ & 3) * 32;  // (32 bytes per k-step inside a column block)
      wgmma::Wgmma<T, kSKeys>::ss(s, wgmma::desc_sw128(sQ + (ks_ >> 2) * kRows * 128 + mt * 64 * 128 + col, 16, 1024),
                                  wgmma::desc_sw128(ks + (ks_ >> 2) * kKeys * 128 + kSKeys * vg * 128 + col, 16, 1024),
                                  1);
    }
  };
  [[maybe_unused]] auto wg_pv = [&](float* out, const uint32_t(&pa)[kKeys / 16][4], const char* vb) {
    FLASHINFER_UNROLL
    for (int kk = 0; kk < kKeys / 16; ++kk)
      wgmma::Wgmma<T, kDVO>::rs_tn(out, pa[kk], wgmma::desc_sw128(vb + kk * 2048, kKeys * 128, 1024), 1);
  };
  // P (all kKeys keys of the scores s) as those A fragments.
  [[maybe_unused]] auto pack_p = [&](const float(&s)[kSNT][4], uint32_t(&pa)[kKeys / 16][4]) {
    FLASHINFER_UNROLL
    for (int kk = 0; kk < kSNT / 2; ++kk) {
      pa[kk][0] = mma::pack2<T>(s[2 * kk][0], s[2 * kk][1]);
      pa[kk][1] = mma::pack2<T>(s[2 * kk][2], s[2 * kk][3]);
      pa[kk][2] = mma::pack2<T>(s[2 * kk + 1][0], s[2 * kk + 1][1]);
      pa[kk][3] = mma::pack2<T>(s[2 * kk + 1][2], s[2 * kk + 1][3]);
    }
  };
  // One M tile's products, each issued and committed as one group: S = Q K^T into s (zeroed
  // first; M tile mt, the K tile at ks) and O += P V (P's fragments a, the V tile at vs).
  [[maybe_unused]] auto issue_s_group = [&](auto& s, int mt, const char* ks) {
    FLASHINFER_UNROLL
    for (int n = 0; n < kSNT; ++n) s[0][n][0] = s[0][n][1] = s[0][n][2] = s[0][n][3] = 0.f;
    wgmma::fence_operands<kSNT * 4>(&s[0][0][0]);
    wgmma::fence();
    wg_qk(&s[0][0][0], mt, ks);
    wgmma::commit();
  };
  [[maybe_unused]] auto issue_pv_group = [&](auto& a, const char* vs) {
    wgmma::fence_operands<kDVO / 2>(&o[0][0][0]);
    wgmma::fence_operands<kKeys / 4>(&a[0][0]);
    wgmma::fence();
    wg_pv(&o[0][0][0], a, vs);
    wgmma::commit();
  };

  // One key tile: kMasked (a BoolTag) compiles the per-key masking path in; tiles that every
  // row sees whole (prefill_plain_tiles) run without it, so the main loop needs fewer registers.
  auto tile_step = [&](auto masked_tag, int64_t it) {
    const int64_t kv0 = kv_first + it * kKeys;
    if (it + 1 < n_tiles) load_kv(static_cast<int>((it + 1) & 1), kv0 + kKeys);
    cp_async::commit();
    cp_async::wait(1);  // this tile's K and V have landed
    if constexpr (kWg) wgmma::fence_proxy_async();  // (wgmma reads them through the async proxy)
    __syncthreads();
    const char* ks = sK + (it & 1) * kKeys * kRowQK;
    const char* vs = kMla ? ks : sV + (it & 1) * kKeys * kRowVO;
    // Paged: tile it + 2's page ids, loaded now and written to this stage's table at the end
    // (its copies have been issued; the loop's last barrier publishes the table).
    [[maybe_unused]] int next_id = -1;
    if constexpr (kPaged) {
      if (tid < 2 * kKeys && it + 2 < n_tiles) next_id = page_id(kv0 + 2 * kKeys, row_r);
    }

    // S = Q K^T: kMT x 16 rows x kSKeys keys per warp (from key kSKeys * vg of the tile).
    float sc[kTM][kSNT][4];
    FLASHINFER_UNROLL
    for (int mt = 0; mt < kTM; ++mt) {
      FLASHINFER_UNROLL
      for (int n = 0; n < kSNT; ++n) sc[mt][n][0] = sc[mt][n][1] = sc[mt][n][2] = sc[mt][n][3] = 0.f;
    }
    auto qk_step = [&](int kstep) {
      uint32_t a[kTM][4];
      FLASHINFER_UNROLL
      for (int mt = 0; mt < kTM; ++mt)
        mma::ldmatrix_x4(a[mt], sQ + mma::swizzle_offset<kRowQK>(warp * kWarpRows + mt * 16 + (lane & 7) +
                                                                     ((lane >> 3) & 1) * 8,
                                                                 2 * kstep + (lane >> 4)));
      FLASHINFER_UNROLL
      for (int np = 0; np < kSNT / 2; ++np) {
        uint32_t b[4];
        mma::ldmatrix_x4(b, ks + mma::swizzle_offset<kRowQK>(kSKeys * vg + np * 16 + (lane & 7) + (lane >> 4) * 8,
                                                             2 * kstep + ((lane >> 3) & 1)));
        FLASHINFER_UNROLL
        for (int mt = 0; mt < kTM; ++mt) {
          mma::mma_16816<T>(sc[mt][2 * np], a[mt], b);
          mma::mma_16816<T>(sc[mt][2 * np + 1], a[mt], b + 2);
        }
      }
    };
    if constexpr (kWg) {
      FLASHINFER_UNROLL
      for (int mt = 0; mt < kTM; ++mt) wgmma::fence_operands<kSNT * 4>(&sc[mt][0][0]);
      wgmma::fence();
      FLASHINFER_UNROLL
      for (int mt = 0; mt < kTM; ++mt) wg_qk(&sc[mt][0][0], mt, ks);
      wgmma::commit();
      wgmma::wait<0>();
      FLASHINFER_UNROLL
      for (int mt = 0; mt < kTM; ++mt) wgmma::fence_operands<kSNT * 4>(&sc[mt][0][0]);
    } else if constexpr (kSplitS) {  // (unrolled by kSUnroll: fully unrolled, Q's fragments ran ahead into spills)
#if defined(__CUDA_ARCH__)
#pragma unroll(kSUnroll)
#endif
      for (int kstep = 0; kstep < kDQK / 16; ++kstep) qk_step(kstep);
    } else {
      FLASHINFER_UNROLL
      for (int kstep = 0; kstep < kDQK / 16; ++kstep) qk_step(kstep);
    }

    float alpha[kTM][2];
    softmax_tile(masked_tag, kv0, sc, alpha);
    rescale_o(alpha);

    // Split scores: this group's P into sP (row r, key kSKeys * vg + 8 n + 2 tig), read back by
    // both groups as A fragments.
    if constexpr (kSplitS) {
      static_assert(kMT == 1, "split scores: one M tile");
      FLASHINFER_UNROLL
      for (int n = 0; n < kSNT; ++n) {
        FLASHINFER_UNROLL
        for (int h = 0; h < 2; ++h)
          *reinterpret_cast<uint32_t*>(sP + mma::swizzle_offset<kKeys * 2>(warp * 16 + grp + 8 * h, kSNT * vg + n) +
                                       4 * tig) = mma::pack2<T>(sc[0][n][2 * h], sc[0][n][2 * h + 1]);
      }
      if constexpr (kWg) wgmma::fence_proxy_async();  // (P V reads sP through the async proxy)
      __syncthreads();
    }
    // O += P V: the score accumulators of keys 16 kk .. 16 kk + 15 are the A fragment of k-step kk.
    // (kWg: this group's V columns start at column block v_chunk0 / 8 of the V tile)
    [[maybe_unused]] const char* vb = vs + (v_chunk0 / 8) * kKeys * 128;
    if constexpr (kWg && kSplitS) {  // P from sP
      wgmma::fence_operands<kDVO / 2>(&o[0][0][0]);
      wgmma::fence();
      FLASHINFER_UNROLL
      for (int kk = 0; kk < kKeys / 16; ++kk)
        wgmma::Wgmma<T, kDVO>::ss_tn(&o[0][0][0], wgmma::desc_sw128(sP + kk * 32, 16, 1024),
                                     wgmma::desc_sw128(vb + kk * 2048, kKeys * 128, 1024), 1);
      wgmma::commit();
      wgmma::wait<0>();
      wgmma::fence_operands<kDVO / 2>(&o[0][0][0]);
    } else if constexpr (kWg) {
      uint32_t a[kTM][kKeys / 16][4];
      FLASHINFER_UNROLL
      for (int mt = 0; mt < kTM; ++mt) pack_p(sc[mt], a[mt]);
      FLASHINFER_UNROLL
      for (int mt = 0; mt < kTM; ++mt) {
        wgmma::fence_operands<kDVO / 2>(&o[mt][0][0]);
        wgmma::fence_operands<kKeys / 4>(&a[mt][0][0]);
      }
      wgmma::fence();
      FLASHINFER_UNROLL
      for (int mt = 0; mt < kTM; ++mt) wg_pv(&o[mt][0][0], a[mt], vb);
      wgmma::commit();
      wgmma::wait<0>();
      FLASHINFER_UNROLL
      for (int mt = 0; mt < kTM; ++mt) wgmma::fence_operands<kDVO / 2>(&o[mt][0][0]);
    }
    FLASHINFER_UNROLL
    for (int kk = 0; kk < (kWg ? 0 : kKeys / 16); ++kk) {
      uint32_t a[kTM][4];
      if constexpr (kSplitS) {
        mma::ldmatrix_x4(a[0], sP + mma::swizzle_offset<kKeys * 2>(warp * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                                   2 * kk + (lane >> 4)));
      } else {
        FLASHINFER_UNROLL
        for (int mt = 0; mt < kTM; ++mt) {
          a[mt][0] = mma::pack2<T>(sc[mt][2 * kk][0], sc[mt][2 * kk][1]);
          a[mt][1] = mma::pack2<T>(sc[mt][2 * kk][2], sc[mt][2 * kk][3]);
          a[mt][2] = mma::pack2<T>(sc[mt][2 * kk + 1][0], sc[mt][2 * kk + 1][1]);
          a[mt][3] = mma::pack2<T>(sc[mt][2 * kk + 1][2], sc[mt][2 * kk + 1][3]);
        }
      }
      FLASHINFER_UNROLL
      for (int dp = 0; dp < kDVO / 16; ++dp) {
        uint32_t b[4];
        mma::ldmatrix_x4_trans(b, vs + mma::swizzle_offset<kRowV>(kk * 16 + (lane & 7) + ((lane >> 3) & 1) * 8,
                                                                  v_chunk0 + 2 * dp + (lane >> 4)));
        FLASHINFER_UNROLL
        for (int mt = 0; mt < kTM; ++mt) {
          mma::mma_16816<T>(o[mt][2 * dp], a[mt], b);
          mma::mma_16816<T>(o[mt][2 * dp + 1], a[mt], b + 2);
        }
      }
    }
    if constexpr (kPaged) {
      if (tid < 2 * kKeys && it + 2 < n_tiles) set_row(static_cast<int>(it & 1), kv0 + 2 * kKeys, next_id);
    }
    __syncthreads();  // the stage is refilled by the next iteration's copies
  };
  constexpr bool kPlainLoop =
      FLASHINFER_PREFILL_PLAIN_LOOP < 0 ? kMode == PrefillMode::kSingle : FLASHINFER_PREFILL_PLAIN_LOOP != 0;
  if constexpr (kWs) {
    constexpr int kS = kPrefillWsStages;
    // (tile it of K (kv 0) or V (1): stage it % kS, phase it / kS)
    auto wait_phase = [&](uint64_t(&bars)[2][kPrefillWsStages], int kv, int64_t it, int flip) {
      bulk::wait_parity(&bars[kv][it % kS], static_cast<uint32_t>(((it / kS) & 1) ^ flip));
    };
    if (cw < 0) {
      if constexpr (FLASHINFER_PREFILL_WS_REGS > 0) barrier::set_max_regs<3 * 168 - 2 * FLASHINFER_PREFILL_WS_REGS, false>();
      // The producer. Iteration it copies K(it), then V(it - 1), each into its stage once the
      // consumers have released the stage's previous tile; a stage's full barrier counts each
      // thread in once its copies land (arrive_noinc: the producer never waits for a copy).
      // Paged: tile t's table (slot t % 4) serves K(t) in iteration t and V(t) in t + 1.
      // Iteration it writes tile it + 2's, after the barrier of the producer's threads that
      // publishes it to iteration it + 2 (tile it - 2, the slot's previous tile, was last read in
      // iteration it - 1), from page ids loaded an iteration earlier; tiles 0 and 1: the prologue.
      [[maybe_unused]] int next_id = -1;
      if constexpr (kPaged) {
        if (n_tiles > 2) next_id = page_id(kv_first + 2 * kKeys, row_r);
      }
      auto copy_v = [&](int64_t t) {
        if (t >= kS) wait_phase(ws_empty, 1, t, 1);
        load_v(static_cast<int>(t % kS), static_cast<int>(t % kAddrSlots), kv_first + t * kKeys);
        cp_async::arrive_noinc(&ws_full[1][t % kS]);
      };
      for (int64_t it = 0; it < n_tiles; ++it) {
        if (it >= kS) wait_phase(ws_empty, 0, it, 1);
        if constexpr (kPaged) {
          barrier::sync(1, kPrefillThreads);
          if (it + 2 < n_tiles) set_row(static_cast<int>((it + 2) % kAddrSlots), kv_first + (it + 2) * kKeys, next_id);
          if (it + 3 < n_tiles) next_id = page_id(kv_first + (it + 3) * kKeys, row_r);
        }
        load_k(static_cast<int>(it % kS), static_cast<int>(it % kAddrSlots), kv_first + it * kKeys);
        cp_async::arrive_noinc(&ws_full[0][it % kS]);
        if (it > 0) copy_v(it - 1);
      }
      if (n_tiles > 0) copy_v(n_tiles - 1);
      cp_async::commit();
      cp_async::wait(0);
      return;
    }
    // Consumers: this M tile's Q rows
    cp_async::commit();
    cp_async::wait(0);
    wgmma::fence_proxy_async();
    barrier::sync(2 + cw, kPrefillThreads);
    if constexpr (FLASHINFER_PREFILL_WS_REGS > 0) barrier::set_max_regs<FLASHINFER_PREFILL_WS_REGS, true>();
    auto wait_full = [&](int kv, int64_t it) {  // (then the copies' generic-proxy writes before the products' reads)
      wait_phase(ws_full, kv, it, 0);
      wgmma::fence_proxy_async();
    };
    auto release = [&](int kv, int64_t it) {  // (lane 0 of each warp: this warp's products have read the tile)
      if (lane == 0) bulk::arrive(&ws_empty[kv][it % kS]);
    };
    float sc[1][kSNT][4];
    uint32_t pa[kKeys / 16][4];
    float alpha[1][2];
    auto issue_s = [&](int64_t it) { issue_s_group(sc, cw, sK + (it % kS) * kKeys * kRowQK); };
    auto issue_pv = [&](int64_t it) { issue_pv_group(pa, sV + (it % kS) * kKeys * kRowVO); };
    if constexpr (FLASHINFER_PREFILL_WS >= 2) {
      // S of tile it + 1 and P V of tile it are issued together (with FLASHINFER_PREFILL_WS 3 in
      // this consumer's turn: it waits at barrier 4 + cw, which the other consumer's arrival
      // opens, and arrives at the other's once its products are issued; consumer 1 opens the
      // first turn for consumer 0, and skips its last arrival so that none is left over).
      constexpr bool kPingPong = FLASHINFER_PREFILL_WS == 3;
      auto turn_begin = [&]() {
        if constexpr (kPingPong) barrier::sync(4 + cw, 2 * kPrefillThreads);
      };
      auto turn_end = [&](bool last) {
        if constexpr (kPingPong) {
          if (!(last && cw == 1)) barrier::arrive(5 - cw, 2 * kPrefillThreads);
        }
      };
      if (n_tiles > 0) {
        if constexpr (kPingPong) {
          if (cw == 1) barrier::arrive(4, 2 * kPrefillThreads);
        }
        wait_full(0, 0);
        issue_s(0);
        wgmma::wait<0>();
        wgmma::fence_operands<kSNT * 4>(&sc[0][0][0]);
        release(0, 0);
        softmax_tile(BoolTag<true>{}, kv_first, sc, alpha);  // (O is zero: no rescale)
        pack_p(sc[0], pa);
      }
      for (int64_t it = 0; it + 1 < n_tiles; ++it) {
        wait_full(0, it + 1);
        wait_full(1, it);
        turn_begin();
        issue_s(it + 1);
        issue_pv(it);
        turn_end(false);
        wgmma::wait<1>();  // S(it + 1); P V (it) may still run
        wgmma::fence_operands<kSNT * 4>(&sc[0][0][0]);
        release(0, it + 1);
        softmax_tile(BoolTag<true>{}, kv_first + (it + 1) * kKeys, sc, alpha);
        wgmma::wait<0>();
        wgmma::fence_operands<kDVO / 2>(&o[0][0][0]);
        release(1, it);
        rescale_o(alpha);
        pack_p(sc[0], pa);
      }
      if (n_tiles > 0) {
        wait_full(1, n_tiles - 1);
        turn_begin();
        issue_pv(n_tiles - 1);
        turn_end(true);
        wgmma::wait<0>();
        wgmma::fence_operands<kDVO / 2>(&o[0][0][0]);
        release(1, n_tiles - 1);
      }
    } else {
      // Each tile in turn: S = Q K^T, softmax, O += P V.
      for (int64_t it = 0; it < n_tiles; ++it) {
        wait_full(0, it);
        issue_s(it);
        wgmma::wait<0>();
        wgmma::fence_operands<kSNT * 4>(&sc[0][0][0]);
        release(0, it);
        softmax_tile(BoolTag<true>{}, kv_first + it * kKeys, sc, alpha);
        rescale_o(alpha);
        pack_p(sc[0], pa);
        wait_full(1, it);
        issue_pv(it);
        wgmma::wait<0>();
        wgmma::fence_operands<kDVO / 2>(&o[0][0][0]);
        release(1, it);
      }
    }
  } else if constexpr (kWgOverlap) {
    // S of tile it + 1 (sc) is computed and turned into probabilities while P V of tile it (P in
    // pa) runs: K(t) sits in K buffer t % kKBufs and V(t) in V buffer t % 2; iteration it waits
    // for K(it + 1) and V(it), then loads K(it + kKBufs) and V(it + 1) into the buffers K(it) and
    // V(it - 1) left (with three K buffers as two groups, V's first, so the wait leaves the newest
    // K copies in flight). Paged: tile it + kKBufs + 1's table slot (t % 4) is written at the end of
    // iteration it (its last readers, the copies of tile it + kKBufs - 3, were issued before this
    // iteration's first barrier).
    float sc[kTM][kSNT][4];
    uint32_t pa[kKeys / 16][4];
    float alpha[kTM][2];
    auto issue_s = [&](int buf) { issue_s_group(sc, 0, sK + buf * kKeys * kRowQK); };  // S = Q K(buf)
    if (n_tiles > 0) {
      cp_async::wait(kKBufs - 1);  // Q, K 0
      wgmma::fence_proxy_async();
      __syncthreads();
      issue_s(0);
      wgmma::wait<0>();
      wgmma::fence_operands<kSNT * 4>(&sc[0][0][0]);
      softmax_tile(BoolTag<true>{}, kv_first, sc, alpha);  // (O is zero: no rescale)
      pack_p(sc[0], pa);
    }
    // (every iteration but the last issues S: ptxas serializes the products when the groups
    // in flight differ between paths; the last tile's P V runs after the loop)
    auto issue_pv = [&](int64_t it) { issue_pv_group(pa, sV + (it & 1) * kKeys * kRowVO); };
    auto wait_loads = [&]() {  // (three K buffers: the newest group, K(it + 2), may stay in flight)
      cp_async::wait(kKBufs - 2);
      wgmma::fence_proxy_async();
      __syncthreads();
    };
    for (int64_t it = 0; it + 1 < n_tiles; ++it) {
      const int64_t kv1 = kv_first + (it + 1) * kKeys;
      wait_loads();  // K(it + 1), V(it)
      const int64_t ahead = it + kKBufs + 1;  // (the tile whose table entries this iteration writes)
      [[maybe_unused]] int next_id = -1;
      if constexpr (kPaged) {
        if (tid < 2 * kKeys && ahead < n_tiles) next_id = page_id(kv_first + ahead * kKeys, row_r);
      }
      issue_s(static_cast<int>((it + 1) % kKBufs));
      issue_pv(it);
      load_v(static_cast<int>((it + 1) & 1), static_cast<int>((it + 1) % kAddrSlots), kv1);
      if constexpr (kKBufs == 3) cp_async::commit();
      if (it + kKBufs < n_tiles)
        load_k(static_cast<int>(it % kKBufs), static_cast<int>((it + kKBufs) % kAddrSlots), kv_first + (it + kKBufs) * kKeys);
      cp_async::commit();
      wgmma::wait<1>();  // S(it + 1); P V (it) may still run
      wgmma::fence_operands<kSNT * 4>(&sc[0][0][0]);
      softmax_tile(BoolTag<true>{}, kv1, sc, alpha);
      wgmma::wait<0>();
      wgmma::fence_operands<kDVO / 2>(&o[0][0][0]);
      rescale_o(alpha);
      pack_p(sc[0], pa);
      if constexpr (kPaged) {
        if (tid < 2 * kKeys && ahead < n_tiles) set_row(static_cast<int>(ahead % kAddrSlots), kv_first + ahead * kKeys, next_id);
      }
    }
    if (n_tiles > 0) {
      cp_async::wait(0);  // V(n_tiles - 1)
      wgmma::fence_proxy_async();
      __syncthreads();
      issue_pv(n_tiles - 1);
      wgmma::wait<0>();
      wgmma::fence_operands<kDVO / 2>(&o[0][0][0]);
    }
  } else if constexpr (kPlainLoop) {
    const TileRange pl = plain ? prefill_plain_tiles(pr0, pr_end, group, qo_len, kv_len, p.causal, p.window_left,
                                                     p.mask != nullptr, kv_first, n_tiles)
                               : TileRange{0, 0};
    for (int64_t it = 0; it < n_tiles;) {
      if (it == pl.begin && pl.end > pl.begin) {
        for (; it < pl.end; ++it) tile_step(BoolTag<false>{}, it);
      } else {
        tile_step(BoolTag<true>{}, it);
        ++it;
      }
    }
  } else {
    for (int64_t it = 0; it < n_tiles; ++it) tile_step(BoolTag<true>{}, it);
  }
  cp_async::wait(0);

  // Split scores: each group's d sums its own keys' p; the other group's row sums via sMax.
  [[maybe_unused]] float d_other[2] = {0.f, 0.f};
  if constexpr (kSplitS) {
    FLASHINFER_UNROLL
    for (int h = 0; h < 2; ++h) {
      float q = d[0][h];
      q += __shfl_xor_sync(0xffffffffu, q, 1);
      q += __shfl_xor_sync(0xffffffffu, q, 2);
      if (tig == 0) sMax[vg][warp * 16 + grp + 8 * h] = q;
    }
    __syncthreads();
    d_other[0] = sMax[1 - vg][warp * 16 + grp];
    d_other[1] = sMax[1 - vg][warp * 16 + grp + 8];
  }
  // Epilogue: o / d (times v_scale), lse = m + log2(d); a row with no key: o = 0, lse = -inf.
  FLASHINFER_UNROLL
  for (int mt = 0; mt < kTM; ++mt) {
    FLASHINFER_UNROLL
    for (int h = 0; h < 2; ++h) {
      float den = d[mt][h];
      den += __shfl_xor_sync(0xffffffffu, den, 1);
      den += __shfl_xor_sync(0xffffffffu, den, 2);
      if constexpr (kSplitS) den += d_other[h];
      const int64_t pr = row_of(mt, h);
      if (pr >= rows) continue;
      const int64_t t = pr / group;
      const int qh = kv_head * group + static_cast<int>(pr - t * group);
      const float inv = den > 0.f ? p.v_scale / den : 0.f;
      T* orow = p.o + (q0 + t) * p.o_stride_n + int64_t{qh} * p.o_stride_h + part * kDVO;
      if constexpr (kSplitKv) orow += chunk * p.o_stride_c;
      FLASHINFER_UNROLL
      for (int n = 0; n < kDVO / 8; ++n) {
        const uint32_t w = mma::pack2<T>(o[mt][n][2 * h] * inv, o[mt][n][2 * h + 1] * inv);
        *reinterpret_cast<uint32_t*>(orow + n * 8 + tig * 2) = w;
      }
      if (p.lse && tig == 0 && part == 0) {
        const int64_t at = kSplitKv && p.num_chunks > 1
                               ? (q0 + t) * p.lse_stride_n + int64_t{chunk} * p.num_qo_heads + qh
                               : (q0 + t) * p.num_qo_heads + qh;
        p.lse[at] = den > 0.f ? m[mt][h] + log2f(den) : neg_inf();
      }
    }
  }
  pdl_launch_dependents();
}

// The kernel of one (head_dim_qk, head_dim_vo, m_tiles, mode) choice (null: not built); wg: the
// wgmma one (whole-column head dims, FLASHINFER_ENABLE_WGMMA builds; the emulator test's entry);
// ws: the warp-specialized one where built (single prefill, two M tiles at head_dim 128).
template <typename T>
using PrefillKernelPtr = void (*)(const PrefillParams<T>);
template <typename T, PrefillMode kMode = PrefillMode::kSingle>
PrefillKernelPtr<T> prefill_kernel(int head_dim_qk, int head_dim_vo, int m_tiles, bool wg = false, bool ws = false) {
  const bool two = m_tiles == 2;
  if (m_tiles != 1 && !(two && prefill_max_m_tiles(head_dim_qk, head_dim_vo) == 2)) return nullptr;
#if defined(FLASHINFER_ENABLE_WGMMA)
  if constexpr (kMode == PrefillMode::kSingle) {
    if (wg && ws && two && head_dim_qk == 128 && head_dim_vo == 128)
      return PrefillKernel<T, 128, 128, 2, kMode, PrefillVO::kWhole, true, true>;
  }
  if (wg) {
    if (head_dim_qk == 64 && head_dim_vo == 64)
      return two ? PrefillKernel<T, 64, 64, 2, kMode, PrefillVO::kWhole, true>
                 : PrefillKernel<T, 64, 64, 1, kMode, PrefillVO::kWhole, true>;
    if (head_dim_qk == 128 && head_dim_vo == 128)
      return two ? PrefillKernel<T, 128, 128, 2, kMode, PrefillVO::kWhole, true>
                 : PrefillKernel<T, 128, 128, 1, kMode, PrefillVO::kWhole, true>;
    if (head_dim_qk == 256 && head_dim_vo == 256) return PrefillKernel<T, 256, 256, 1, kMode, PrefillVO::kWhole, true>;
    if (head_dim_qk == 192 && head_dim_vo == 128) return PrefillKernel<T, 192, 128, 1, kMode, PrefillVO::kWhole, true>;
    return nullptr;
  }
#else
  if (wg) return nullptr;
#endif
  if (head_dim_qk == 64 && head_dim_vo == 64)
    return two ? PrefillKernel<T, 64, 64, 2, kMode> : PrefillKernel<T, 64, 64, 1, kMode>;
  if (head_dim_qk == 128 && head_dim_vo == 128)
    return two ? PrefillKernel<T, 128, 128, 2, kMode> : PrefillKernel<T, 128, 128, 1, kMode>;
  if (head_dim_qk == 256 && head_dim_vo == 256) return PrefillKernel<T, 256, 256, 1, kMode>;
  if (head_dim_qk == 192 && head_dim_vo == 128) return PrefillKernel<T, 192, 128, 1, kMode>;
  if (head_dim_qk == 512 && head_dim_vo == 512)
    return PrefillKernel<T, 512, kPrefillVoPart, 1, kMode, PrefillVO::kParts>;
  return nullptr;
}

namespace detail {
template <typename T, int kDQK, int kDVO, int kMT, PrefillMode kMode, PrefillVO kVO = PrefillVO::kWhole,
          bool kWg = false, bool kWs = false>
cudaError_t launch_prefill(const PrefillParams<T>& p, int64_t grid_x, cudaStream_t stream) {
  constexpr PrefillKernelPtr<T> kKernel = PrefillKernel<T, kDQK, kDVO, kMT, kMode, kVO, kWg, kWs>;
  const int parts = kVO == PrefillVO::kWhole ? 1 : p.head_dim_vo / kDVO / (prefill_threads(kVO) / kPrefillThreads);
  const size_t smem = static_cast<size_t>(prefill_kernel_smem_bytes(kDQK, p.head_dim_vo, kMT, kVO, kWg, kWs));
  FLASHINFER_CUDA_TRY(ensure_dynamic_smem<kKernel>(smem));
  return launch(kKernel,
                dim3(static_cast<unsigned>(grid_x), static_cast<unsigned>(p.num_kv_heads), static_cast<unsigned>(parts)),
                dim3(prefill_kernel_threads(kVO, kWg, kMT, kWs)), smem, stream, p.pdl, p);
}
// Whether wgmma kernels can run on `info`'s device: this build has sm_90a code
// (FLASHINFER_ENABLE_WGMMA) and the device is a 9.0 one.
inline bool prefill_wgmma_usable(const DeviceInfo& info) {
#if defined(FLASHINFER_ENABLE_WGMMA)
  return info.cc_major == 9 && info.cc_minor == 0;
#else
  (void)info;
  return false;
#endif
}
// A whole-columns kernel: the wgmma one where usable (wg) and on (FLASHINFER_PREFILL_WGMMA;
// instantiated only in sm_90a builds); with ws the warp-specialized one where built (single
// prefill, two M tiles at head_dim 128).
template <typename T, int kDQK, int kDVO, int kMT, PrefillMode kMode>
cudaError_t launch_prefill_whole(const PrefillParams<T>& p, int64_t grid_x, bool wg, bool ws, cudaStream_t stream) {
#if defined(FLASHINFER_ENABLE_WGMMA) && FLASHINFER_PREFILL_WGMMA
  if constexpr (kMode == PrefillMode::kSingle && kDQK == 128 && kDVO == 128 && kMT == 2) {
    if (wg && ws) return launch_prefill<T, kDQK, kDVO, kMT, kMode, PrefillVO::kWhole, true, true>(p, grid_x, stream);
  }
  if (wg) return launch_prefill<T, kDQK, kDVO, kMT, kMode, PrefillVO::kWhole, true>(p, grid_x, stream);
#endif
  (void)wg, (void)ws;
  return launch_prefill<T, kDQK, kDVO, kMT, kMode>(p, grid_x, stream);
}
// ws: single prefill's choice of the warp-specialized kernel (prefill_single_ws).
template <typename T, PrefillMode kMode>
cudaError_t dispatch_prefill(const PrefillParams<T>& p, int m_tiles, int64_t grid_x, const DeviceInfo& info,
                             cudaStream_t stream, bool ws = false) {
  const int dqk = p.head_dim_qk, dvo = p.head_dim_vo;
  const bool two = m_tiles == 2 && prefill_max_m_tiles(dqk, dvo) == 2;
  const bool wg = prefill_wgmma_usable(info);
  if (dqk == 64 && dvo == 64)
    return two ? launch_prefill_whole<T, 64, 64, 2, kMode>(p, grid_x, wg, false, stream)
               : launch_prefill_whole<T, 64, 64, 1, kMode>(p, grid_x, wg, false, stream);
  if (dqk == 128 && dvo == 128)
    return two ? launch_prefill_whole<T, 128, 128, 2, kMode>(p, grid_x, wg, ws, stream)
               : launch_prefill_whole<T, 128, 128, 1, kMode>(p, grid_x, wg, false, stream);
  if (dqk == 256 && dvo == 256) return launch_prefill_whole<T, 256, 256, 1, kMode>(p, grid_x, wg, false, stream);
  if (dqk == 192 && dvo == 128) return launch_prefill_whole<T, 192, 128, 1, kMode>(p, grid_x, wg, false, stream);
  if (dqk == 512 && dvo == 512) return launch_prefill<T, 512, kPrefillVoPart, 1, kMode, PrefillVO::kParts>(p, grid_x, stream);
  return cudaErrorInvalidValue;
}
}  // namespace detail

// Launches single-request prefill on `stream` (T: __half or __nv_bfloat16).
template <typename T>
cudaError_t SinglePrefill(const PrefillParams<T>& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess || p.items) return cudaErrorInvalidValue;
  if (p.qo_len == 0 || p.num_qo_heads == 0) return cudaSuccess;
  DeviceInfo info;
  FLASHINFER_CUDA_TRY(current_device_info(&info));
  const int mt = prefill_m_tiles(p.qo_len, p.num_qo_heads, p.num_kv_heads, p.head_dim_qk, p.head_dim_vo, info.num_sms);
  const PrefillGrid g = prefill_grid(p.qo_len, p.num_qo_heads, p.num_kv_heads, mt);
  const bool ws = prefill_single_ws(p.head_dim_qk, p.head_dim_vo, mt, p.causal, p.mask != nullptr,
                                    g.row_tiles * g.kv_heads, info.num_sms);
  return detail::dispatch_prefill<T, PrefillMode::kSingle>(p, mt, g.row_tiles, info, stream, ws);
}

// The merge of a split launch's partial states: p.o [total_q, num_chunks, num_heads, head_dim_vo]
// (p.o_stride_n, p.o_stride_c, p.o_stride_h) and p.lse [total_q, num_chunks, num_heads]
// (p.lse_stride_n) into `out`.
template <typename T>
MergeStatesParams<T> prefill_merge_params(const PrefillParams<T>& p, int64_t total_q, const PrefillMergeOut<T>& out) {
  MergeStatesParams<T> m{};
  m.v = p.o, m.s = p.lse;
  m.v_out = out.o, m.s_out = out.lse;
  m.seq_len = total_q, m.num_states = p.num_chunks, m.num_heads = p.num_qo_heads, m.head_dim = p.head_dim_vo;
  m.in.v_n = p.o_stride_n, m.in.v_h = p.o_stride_h, m.v_stride_k = p.o_stride_c;
  m.in.s_n = p.lse_stride_n, m.in.s_h = 1, m.s_stride_k = p.num_qo_heads;
  m.out.v_n = out.o_stride_n, m.out.v_h = out.o_stride_h;
  m.out.s_n = p.num_qo_heads, m.out.s_h = 1;
  m.pdl = p.pdl;
  return m;
}

// Launches batch prefill (p.items of prefill_plan_batch for m_tiles; ragged keys, or paged when
// p.page_indices is set) on `stream`. Split-KV (p.num_chunks > 1, m_tiles 1, items of
// prefill_split_items): p.o / p.lse are the partial states' buffers (p.lse required) and a
// second launch merges them into `out` (total_q rows).
template <typename T>
cudaError_t BatchPrefill(const PrefillParams<T>& p, int m_tiles, cudaStream_t stream, int64_t total_q,
                         const PrefillMergeOut<T>& out) {
  if (validate_batch(p) != Status::kSuccess) return cudaErrorInvalidValue;
  const bool split = p.num_chunks > 1;
  if (split && (m_tiles != 1 || !p.lse || !out.o || !out.lse || total_q < 0)) return cudaErrorInvalidValue;
  if (p.num_items == 0 || p.num_qo_heads == 0) return cudaSuccess;
  DeviceInfo info;
  FLASHINFER_CUDA_TRY(current_device_info(&info));
  const cudaError_t err =
      p.page_indices ? detail::dispatch_prefill<T, PrefillMode::kPaged>(p, m_tiles, p.num_items, info, stream)
                     : detail::dispatch_prefill<T, PrefillMode::kRagged>(p, m_tiles, p.num_items, info, stream);
  if (err != cudaSuccess || !split) return err;
  return MergeStates(prefill_merge_params(p, total_q, out), stream);
}
// Without split-KV.
template <typename T>
cudaError_t BatchPrefill(const PrefillParams<T>& p, int m_tiles, cudaStream_t stream) {
  return BatchPrefill(p, m_tiles, stream, 0, PrefillMergeOut<T>{});  // (split-KV without `out`: invalid there)
}

}  // namespace attention
}  // namespace flashinfer
