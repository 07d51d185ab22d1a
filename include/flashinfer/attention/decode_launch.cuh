// Launch shapes and dispatch of the decode kernels (CUDA-core in decode_cc.cuh, tensor-core in
// decode_tc.cuh): persistent grid size, pipeline depth and shared memory per device, and the
// head_dim / q-head-bucket / path dispatch the bindings instantiate.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>
#include <cstring>

#include "../dispatch.h"
#include "../occupancy.h"
#include "../utils.cuh"
#include "decode.cuh"
#include "decode_cc.cuh"
#include "decode_tc.cuh"

namespace flashinfer {
namespace attention {

// Launch shape of a decode kernel on the current device: persistent grid size, stages and
// shared memory. Independent of the plan (CUDA-graph replays reuse it with new plans).
constexpr int kMaxStages = 16;
constexpr int64_t kMinDecodeInflight = 96 * 1024;  // cp_async::wait supports up to 15 groups in flight
constexpr int kDecodeTCStages = 3;                  // the tensor-core kernel's pipeline depth

struct DecodeLaunch {
  int64_t grid = 1;
  int stages = 2;
  int64_t smem = 0;
  int64_t merge_grid = 1;
};

// kernel: the decode kernel to size; stage_bytes / merge_smem: its shared memory needs;
// fixed_stages > 0: that pipeline depth (when it fits) instead of the occupancy rule;
// slack: bytes added to the total (alignment room).
template <auto kernel>
cudaError_t decode_launch_shape(int64_t stage_bytes, int64_t merge_smem, DecodeLaunch* l, int fixed_stages = 0,
                                int64_t slack = 0) {
  int device = 0;
  FLASHINFER_CUDA_TRY(current_device(&device));
  DeviceInfo dev;
  FLASHINFER_CUDA_TRY(current_device_info(&dev, device));
  // Pipeline depth: bandwidth-first by default; FLASHINFER_DECODE_STAGES=<n> forces n stages
  // (a tuning knob for benchmarks, read once).
  static const int forced = [] {
    const char* e = std::getenv("FLASHINFER_DECODE_STAGES");
    return e ? std::atoi(e) : 0;
  }();
  const int regs = kernel_regs<kernel>();
  StreamConfig c = stream_config(dev, int64_t{1} << 40, kDecodeThreads, regs, stage_bytes, kMaxStages);
  // Decode is latency-bound as much as bandwidth-bound: when two stages let more CTAs reside,
  // take them (128 x 8192 on the H200: 80% of the copy ceiling at 3 CTAs x 2 stages, 73% at
  // 2 CTAs x 3 stages).
  const int64_t smem2 = 2 * stage_bytes > merge_smem ? 2 * stage_bytes : merge_smem;
  if (blocks_per_sm(dev, kDecodeThreads, regs, smem2) >
      blocks_per_sm(dev, kDecodeThreads, regs, c.smem > merge_smem ? c.smem : merge_smem)) {
    c.stages = 2;
    c.smem = 2 * stage_bytes;
  }
  const int want = forced >= 2 ? forced : fixed_stages;
  if (want >= 2 && want <= kMaxStages && want * stage_bytes <= dev.smem_optin) {
    c.stages = want;
    c.smem = want * stage_bytes;
  }
  // the merge scratch aliases the stages: use the larger of the two
  c.smem = (c.smem > merge_smem ? c.smem : merge_smem) + slack;
  const int bps = blocks_per_sm(dev, kDecodeThreads, kernel_regs<kernel>(), c.smem);
  l->stages = c.stages;
  l->smem = c.smem;
  l->grid = int64_t{dev.num_sms} * (bps > 0 ? bps : 1);
  l->merge_grid = int64_t{dev.num_sms} * 4;
  return ensure_dynamic_smem<kernel>(c.smem, device);
}

// Launches decode (+ the merge when `launch_merge`) for head_dim kHeadDim and a q-head
// bucket kG >= min(group_size, 8). `grid` 0: the device's persistent grid.
// (Which kernel a call takes: decode_uses_tc, decode.h.)

// The tensor-core kernel's copy engine asked for: tensor-map boxes on sm_90+ unless
// FLASHINFER_DECODE_COPY (read once) says "bulk" (row copies) or "cpasync". A call whose
// cache does not suit the asked engine takes the next one down (see DecodeDispatched).
// H200, bf16, 32/8 heads x 128, page 16 (us, rows -> boxes): 1 x 32768 55.3 -> 52.7,
// 16 x 4096 86.7 -> 83.8, 64 x 2048 154.9 -> 149.3, 256 x 1024 301.6 -> 281.1,
// 128 x 8192 1063.8 -> 1039.3, 1 x 4096 19.2 -> 19.3.
inline TcCopy decode_tc_copy_asked(const DeviceInfo& dev) {
  static const TcCopy mode = [] {
    const char* e = std::getenv("FLASHINFER_DECODE_COPY");
    if (e && std::strcmp(e, "cpasync") == 0) return TcCopy::kCpAsync;
    if (e && (std::strcmp(e, "bulk") == 0 || std::strcmp(e, "rows") == 0)) return TcCopy::kRows;
    return TcCopy::kBoxes;
  }();
  return dev.cc_major >= 9 ? mode : TcCopy::kCpAsync;
}

// Whether the box engine marks the K/V lines it streams L2 evict-first, so that they replace
// each other rather than the dirty lines earlier kernels left in L2 (whose write-back would
// share DRAM with the stream). It pays while the whole stream is a few times L2, and costs a
// little on long streams. H200, bf16, 32/8 x 128, page 16, L2 dirty from a 256 MiB memset
// (us, normal -> evict-first; MB of K+V):
//   gains:   1 x 32768 (134) 53.2 -> 51.4, single 32768 52.0 -> 50.0, 6 x 4096 (101) 42.2 ->
//            38.9, 8 x 2048 (67) 33.8 -> 31.8, 8 x 4096 (134) 50.3 -> 47.6, 12 x 4096 (201)
//            66.5 -> 65.1;
//   neutral: 1 x 4096 19.5 -> 19.4, 16 x 4096 (268) 81.5 -> 81.5, 8 x 8192 (268) 81.9 -> 81.8,
//            128 x 8192 1050 -> 1050;
//   losses:  8 x 16384 (537) 141.5 -> 147.2, 64 x 2048 (537) 149.3 -> 151.8, 256 x 1024 (537)
//            281.8 -> 285.8.
// So the policy is on when the launch streams at most kDecodeL2FirstBytes of K and V. Against
// the earlier rule (batches <= 4), same run, us normal -> evict-first: 16 x 2048 50.7 -> 48.0,
// 32 x 1024 48.9 -> 47.0, 64 x 512 51.3 -> 49.8, 96 x 512 66.0 -> 63.7, 128 x 256 52.1 -> 48.8,
// 16 x 4096 at head_dim 64 50.7 -> 49.0 and at 4 KV heads 53.5 -> 51.5; 16 x 4096 (256 MiB,
// off) 80.9 either way. Where the key count is unknown at launch (CUDA graphs), batches of at
// most kDecodeL2FirstBatch requests. FLASHINFER_DECODE_L2=first|normal (read once) forces a policy.
constexpr int64_t kDecodeL2FirstBytes = int64_t{224} << 20;
constexpr int64_t kDecodeL2FirstBatch = 4;
inline bool decode_tc_l2_evict_first(int64_t batch_size, int64_t kv_bytes) {
  static const int forced = [] {
    const char* e = std::getenv("FLASHINFER_DECODE_L2");
    if (e && std::strcmp(e, "first") == 0) return 1;
    if (e && std::strcmp(e, "normal") == 0) return 0;
    return -1;
  }();
  if (forced >= 0) return forced == 1;
  return kv_bytes > 0 ? kv_bytes <= kDecodeL2FirstBytes : batch_size <= kDecodeL2FirstBatch;
}

// fp8 caches on little work take cp.async copies instead of boxes: with half the bytes per tile a
// CTA runs only a few tiles, and the box path's longer first copy (page id, then one lane's
// tensor copy and its mbarrier) shows. H200, e4m3, bf16 q, 32/8 x 128, page 16, us (boxes /
// cp.async; keys x KV heads per SM): 1 x 4096 (248) 17.2 / 15.8, 4 x 1024 (248) 15.1 / 14.0,
// single 4096 17.6 / 17.1; 16 x 1024 (993) 24.2 / 27.3, 1 x 16384 (993) 26.9 / 29.2, 1 x 32768
// 37.2 / 41.5. fp16 / bf16 caches keep boxes there (1 x 4096 17.2 / 18.1, 4 x 1024 16.9 / 17.7).
constexpr int64_t kDecodeFp8BoxMinKeysPerSM = 512;
inline bool decode_fp8_prefers_cp_async(int64_t keys, int num_kv_heads, int num_sms) {
  return keys > 0 && keys * num_kv_heads <= kDecodeFp8BoxMinKeysPerSM * num_sms;
}

// The L2 promotion of the box engine's tensor maps: 128 bytes (a box row of 64 dims is one
// 128-byte line). With 256-byte promotion (the choice before session 8) the two 64-dim halves of
// a key row, fetched by two boxes back to back, each pull the whole 256 bytes, and the time
// says the pulls are not merged. H200, bf16, 32/8 x 128, page 16 (us, 256 B -> 128 B / none):
// 128 x 8192 1045 -> 997 / 1000, 256 x 1024 281 -> 272 / 272, 64 x 2048 148 -> 146 / 145,
// 16 x 4096 83.6 -> 83.1 / 83.4, 1 x 32768 50.4 -> 50.8 / 50.6; a contiguous HND cache (one
// page per request) at 128 x 8192 1021 -> 983 / 982.
// FLASHINFER_DECODE_PROMO=none|64|128|256 (read once) chooses another, for measurements.
inline CUtensorMapL2promotion decode_tc_l2_promotion() {
  static const CUtensorMapL2promotion promo = [] {
    const char* e = std::getenv("FLASHINFER_DECODE_PROMO");
    if (e && std::strcmp(e, "none") == 0) return CU_TENSOR_MAP_L2_PROMOTION_NONE;
    if (e && std::strcmp(e, "64") == 0) return CU_TENSOR_MAP_L2_PROMOTION_L2_64B;
    if (e && std::strcmp(e, "256") == 0) return CU_TENSOR_MAP_L2_PROMOTION_L2_256B;
    return CU_TENSOR_MAP_L2_PROMOTION_L2_128B;
  }();
  return promo;
}

// Bulk copies (and the fp8 tensor-core path's 16-byte cp.async of 16 elements) need 16-byte
// aligned rows: base pointers and every stride in whole 16 bytes of cache elements.
template <typename T>
bool decode_tc_bulk_aligned(const DecodeParams<T>& p) {
  const int64_t kE = p.kv_cache == KVCache::kSameAsQ ? int64_t{16 / sizeof(T)} : 16;
  auto al = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return al(p.kv.k_data) && al(p.kv.v_data) && p.kv.stride_page % kE == 0 && p.kv.stride_n % kE == 0 &&
         p.kv.stride_h % kE == 0 && p.v_stride_page % kE == 0 && p.v_stride_n % kE == 0 && p.v_stride_h % kE == 0;
}

// The box engine's conditions on a call: 16-byte aligned rows, and either a contiguous cache
// (boxes of 64 keys start anywhere) or a paged one with known page count whose tiles are whole
// boxes: pages of 16/32/64 keys or a multiple of 64, tiles that start on a page (the planner
// aligns chunk starts to tiles; a sliding window's first tile starts mid-page).
template <typename T>
bool decode_tc_boxes_fit(const DecodeParams<T>& p) {
  if (!decode_tc_bulk_aligned(p)) return false;
  if (p.contiguous_len >= 0) return p.contiguous_len > 0;
  const int64_t ps = p.kv.page_size;
  return p.items && p.num_pages > 0 && p.window_left < 0 && ps % 16 == 0 && (kTcTile % ps == 0 || ps % kTcTile == 0);
}

// The tensor maps of the box engine (false: the driver rejected them; copy rows instead).
// The last cache's maps are kept per host thread: a decode step reuses the same cache.
template <typename T>
bool decode_tc_tensor_maps(const DecodeParams<T>& p, DecodeTensorMaps* m) {
  struct Key {
    const void *k, *v;
    int64_t geometry[12];
  };
  static_assert(sizeof(Key) == 2 * sizeof(void*) + 12 * sizeof(int64_t), "no padding: compared bytewise");
  const Key key{p.kv.k_data, p.kv.v_data, {p.head_dim, p.num_kv_heads, p.kv.page_size, p.num_pages, p.contiguous_len,
                p.kv.stride_page, p.kv.stride_n, p.kv.stride_h, p.v_stride_page, p.v_stride_n, p.v_stride_h,
                static_cast<int64_t>(p.kv_cache)}};
  struct Cached {
    Key key;
    DecodeTensorMaps maps;
    bool ok = false, valid = false;
  };
  thread_local Cached cached;
  if (cached.valid && std::memcmp(&cached.key, &key, sizeof(Key)) == 0) {
    *m = cached.maps;
    return cached.ok;
  }
  // A contiguous cache is one page of contiguous_len entries.
  const bool contiguous = p.contiguous_len >= 0;
  const int64_t ps = contiguous ? p.contiguous_len : p.kv.page_size, pages = contiguous ? 1 : p.num_pages;
  const int64_t e = ps < kTcTile && !contiguous ? ps : kTcTile;
  const int eb = p.kv_cache == KVCache::kSameAsQ ? int{sizeof(T)} : 1;  // bytes per cache element
  auto encode = [&](CUtensorMap* map, const T* base, int64_t s_page, int64_t s_n, int64_t s_h) {
    const bool entry_first = s_n <= s_h;  // HND: entries are the inner of the two
    m->entry_dim = entry_first ? 1 : 2;
    const uint64_t dims[4] = {uint64_t(p.head_dim), uint64_t(entry_first ? ps : p.num_kv_heads),
                              uint64_t(entry_first ? p.num_kv_heads : ps), uint64_t(pages)};
    if (contiguous) s_page = entry_first ? s_h * p.num_kv_heads : s_n * ps;  // (one page: never stepped)
    const uint64_t strides[3] = {uint64_t((entry_first ? s_n : s_h) * eb), uint64_t((entry_first ? s_h : s_n) * eb),
                                 uint64_t(s_page * eb)};
    // a box row is one 128-byte line: 64 dims of fp16 / bf16, 128 of fp8
    const uint32_t box[4] = {uint32_t(128 / eb), uint32_t(entry_first ? e : 1), uint32_t(entry_first ? 1 : e), 1};
    return tma::encode_4d(map, eb, base, dims, strides, box, decode_tc_l2_promotion()) == cudaSuccess;
  };
  const bool k_first = p.kv.stride_n <= p.kv.stride_h, v_first = p.v_stride_n <= p.v_stride_h;
  const bool ok = k_first == v_first && encode(&m->k, p.kv.k_data, p.kv.stride_page, p.kv.stride_n, p.kv.stride_h) &&
                  encode(&m->v, p.kv.v_data, p.v_stride_page, p.v_stride_n, p.v_stride_h);
  cached.key = key;
  cached.maps = *m;
  cached.ok = ok;
  cached.valid = true;
  return ok;
}

// Calls f with a value of the cache element type `kv` names: T, __nv_fp8_e4m3 or __nv_fp8_e5m2.
template <typename T, typename F>
cudaError_t with_kv_type(KVCache kv, F&& f) {
  switch (kv) {
    case KVCache::kFp8E4M3: return f(__nv_fp8_e4m3{});
    case KVCache::kFp8E5M2: return f(__nv_fp8_e5m2{});
    default: return f(T{});
  }
}

// stages > 0: that pipeline depth (the plan's), else each kernel's default. rope: the
// CUDA-core kernel's RoPE instantiation (the tensor-core kernel takes no RoPE); kv: its cache
// element type.
template <typename T, int kHeadDim, int kG>
cudaError_t decode_shape_for(bool tc, TcCopy copy, bool rope, DecodeLaunch* l, int stages = 0,
                             KVCache kv = KVCache::kSameAsQ) {
  if constexpr (kHeadDim <= 128) {
    if (tc && kv != KVCache::kSameAsQ) {  // fp8 (decode_tc_takes_fp8): boxes or cp.async
      if constexpr (decode_tc_takes_fp8(kHeadDim)) {
        return with_kv_type<T>(kv, [&](auto tag) {
          using TKV = decltype(tag);
          if constexpr (sizeof(TKV) == 1) {
            const int depth = stages > 0 ? stages : kDecodeTCStages;
            if (copy == TcCopy::kBoxes)
              return decode_launch_shape<DecodeTCKernel<T, kHeadDim, TcCopy::kBoxes, TKV>>(
                  decode_tc_stage_bytes(kHeadDim, TcCopy::kBoxes, 1), 0, l, depth,
                  kTcBoxAlign);
            return decode_launch_shape<DecodeTCKernel<T, kHeadDim, TcCopy::kCpAsync, TKV>>(
                decode_tc_stage_bytes(kHeadDim, TcCopy::kCpAsync, 1), 0, l, depth);
          }
          return cudaErrorInvalidValue;
        });
      }
      return cudaErrorInvalidValue;  // (decode_uses_tc never asks for it)
    }
    if (tc) {
      // Three 64-key stages x 2 CTAs beat two stages x 3 CTAs on the H200 (row copies, bf16:
      // 128 x 8192 1080 vs 1091 us, 64 x 2048 156 vs 167, 256 x 1024 303 vs 318; 1 x 32768
      // 56.9 vs 56.2) and, with boxes, also four stages x 1 CTA except at 1 x 4096 (2 / 3 / 4
      // stages: 256 x 1024 302 / 281 / 345, 128 x 8192 1062 / 1042 / 1151, 1 x 4096 19.7 /
      // 19.4 / 17.8). Not everywhere: where the 3-CTA plan splits requests no more (24 x 4096,
      // 48 x 2048) two stages x 3 CTAs are 13-16% faster, so batch decode plans for both and
      // picks (scheduler.h decode_prefers_wide; the plan's depth arrives as `stages`).
      // (merge_smem 0: the tensor-core kernel's epilogue scratch is one of its stages)
      switch (copy) {
        case TcCopy::kBoxes:
          return decode_launch_shape<DecodeTCKernel<T, kHeadDim, TcCopy::kBoxes>>(
              decode_tc_stage_bytes(kHeadDim, copy), 0, l, stages > 0 ? stages : kDecodeTCStages,
              kTcBoxAlign);
        case TcCopy::kRows:
          return decode_launch_shape<DecodeTCKernel<T, kHeadDim, TcCopy::kRows>>(
              decode_tc_stage_bytes(kHeadDim, copy), 0, l, stages > 0 ? stages : kDecodeTCStages);
        default:
          return decode_launch_shape<DecodeTCKernel<T, kHeadDim, TcCopy::kCpAsync>>(
              decode_tc_stage_bytes(kHeadDim, copy), 0, l, stages > 0 ? stages : kDecodeTCStages);
      }
    }
  }
  const int cc_stages = stages > 0 ? stages : decode_cc_stages(kG);
  return with_kv_type<T>(kv, [&](auto tag) {
    using TKV = decltype(tag);
    const int64_t stage = decode_cc_stage_bytes(kHeadDim, kG, sizeof(TKV));
    if (rope)
      return decode_launch_shape<DecodeCCKernel<T, kHeadDim, kG, true, TKV>>(stage, decode_merge_smem(kHeadDim), l,
                                                                              cc_stages);
    return decode_launch_shape<DecodeCCKernel<T, kHeadDim, kG, false, TKV>>(stage, decode_merge_smem(kHeadDim), l,
                                                                             cc_stages);
  });
}

template <typename T, int kHeadDim, int kG>
cudaError_t DecodeDispatched(const DecodeParams<T>& p, bool use_tc, bool launch_merge, int64_t max_grid,
                             cudaStream_t stream) {
  // fp8 caches whose rows are only 8-byte aligned take the CUDA-core kernel (8-byte copies).
  const bool tc = decode_uses_tc(use_tc, p.pos_encoding, kHeadDim, p.kv_cache) &&
                  (p.kv_cache == KVCache::kSameAsQ || decode_tc_bulk_aligned(p));
  TcCopy copy = TcCopy::kCpAsync;
  DecodeTensorMaps maps{};  // (only the box engine reads them)
  if (tc) {
    const bool fp8 = p.kv_cache != KVCache::kSameAsQ;
    DeviceInfo dev;
    FLASHINFER_CUDA_TRY(current_device_info(&dev));
    copy = decode_tc_copy_asked(dev);
    // fp8 caches have boxes or cp.async (no row engine)
    if (copy == TcCopy::kBoxes && !(kHeadDim <= 128 && decode_tc_boxes_fit(p) && decode_tc_tensor_maps(p, &maps)))
      copy = fp8 ? TcCopy::kCpAsync : TcCopy::kRows;
    const int64_t keys = p.contiguous_len >= 0 ? p.contiguous_len : p.kv_keys_host;
    const int64_t kv_bytes = keys * p.num_kv_heads * kHeadDim * 2 * (fp8 ? int64_t{1} : int64_t{sizeof(T)});
    maps.l2_evict_first = decode_tc_l2_evict_first(p.batch_size, kv_bytes) ? 1 : 0;
    if (copy == TcCopy::kRows && (fp8 || !decode_tc_bulk_aligned(p))) copy = TcCopy::kCpAsync;
    if (fp8 && copy == TcCopy::kBoxes && decode_fp8_prefers_cp_async(keys, p.num_kv_heads, dev.num_sms))
      copy = TcCopy::kCpAsync;
  }
  DecodeLaunch l;
  const bool rope = p.pos_encoding == PosEncodingMode::kRoPELlama;
  FLASHINFER_CUDA_TRY((decode_shape_for<T, kHeadDim, kG>(tc, copy, rope, &l, p.stages, p.kv_cache)));
  // (never: stages <= kMaxStages == kTcMaxStages, the mbarriers the kernel has)
  if (copy != TcCopy::kCpAsync && l.stages > kTcMaxStages) return cudaErrorInvalidValue;
  const int64_t grid = max_grid > 0 && max_grid < l.grid ? max_grid : l.grid;
  bool launched = false;
  if constexpr (kHeadDim <= 128) {
    if (tc && p.kv_cache != KVCache::kSameAsQ) {
      if constexpr (decode_tc_takes_fp8(kHeadDim)) {
        const dim3 g(static_cast<unsigned>(grid)), b(kDecodeThreads);
        FLASHINFER_CUDA_TRY(with_kv_type<T>(p.kv_cache, [&](auto tag) {
          using TKV = decltype(tag);
          if constexpr (sizeof(TKV) == 1) {
            if (copy == TcCopy::kBoxes)
              return launch(DecodeTCKernel<T, kHeadDim, TcCopy::kBoxes, TKV>, g, b, l.smem, stream, p.pdl, p,
                            l.stages, maps);
            return launch(DecodeTCKernel<T, kHeadDim, TcCopy::kCpAsync, TKV>, g, b, l.smem, stream, p.pdl, p,
                          l.stages, maps);
          }
          return cudaErrorInvalidValue;
        }));
        launched = true;
      }
    } else if (tc) {
      const dim3 g(static_cast<unsigned>(grid)), b(kDecodeThreads);
      switch (copy) {
        case TcCopy::kBoxes:
          FLASHINFER_CUDA_TRY(
              launch(DecodeTCKernel<T, kHeadDim, TcCopy::kBoxes>, g, b, l.smem, stream, p.pdl, p, l.stages, maps));
          break;
        case TcCopy::kRows:
          FLASHINFER_CUDA_TRY(
              launch(DecodeTCKernel<T, kHeadDim, TcCopy::kRows>, g, b, l.smem, stream, p.pdl, p, l.stages, maps));
          break;
        default:
          FLASHINFER_CUDA_TRY(
              launch(DecodeTCKernel<T, kHeadDim, TcCopy::kCpAsync>, g, b, l.smem, stream, p.pdl, p, l.stages, maps));
      }
      launched = true;
    }
  }
  if (!launched) {
    const dim3 g(static_cast<unsigned>(grid)), b(kDecodeThreads);
    FLASHINFER_CUDA_TRY(with_kv_type<T>(p.kv_cache, [&](auto tag) {
      using TKV = decltype(tag);
      if (rope) return launch(DecodeCCKernel<T, kHeadDim, kG, true, TKV>, g, b, l.smem, stream, p.pdl, p, l.stages);
      return launch(DecodeCCKernel<T, kHeadDim, kG, false, TKV>, g, b, l.smem, stream, p.pdl, p, l.stages);
    }));
  }
  if (!launch_merge) return cudaSuccess;
  const int64_t rows = p.batch_size * p.num_qo_heads;  // (one CTA per row at a time)
  const int64_t merge_grid = rows > 0 && rows < l.merge_grid ? rows : l.merge_grid;
  return launch(DecodeMergeKernel<T, kHeadDim>, dim3(static_cast<unsigned>(merge_grid)), dim3(kDecodeThreads), 0,
                stream, p.pdl, p);
}

// One head_dim's launch, dispatched over the q-head bucket (DecodeForHeadDim) and its launch
// shape (DecodeShapeForHeadDim): each head_dim is its own unit of instantiation, which the
// bindings compile in parallel (cmake/instances.cmake; a translation unit holding every decode
// kernel of a dtype was the build's critical path).
template <typename T, int kD>
cudaError_t DecodeForHeadDim(const DecodeParams<T>& p, bool use_tc, bool launch_merge, int64_t max_grid,
                             cudaStream_t stream) {
  switch (decode_group_bucket(p.group_size, p.head_dim)) {
    case 1: return DecodeDispatched<T, kD, 1>(p, use_tc, launch_merge, max_grid, stream);
    case 2: return DecodeDispatched<T, kD, 2>(p, use_tc, launch_merge, max_grid, stream);
    case 4: return DecodeDispatched<T, kD, 4>(p, use_tc, launch_merge, max_grid, stream);
    default:
      if constexpr (decode_max_group(kD) >= 8) return DecodeDispatched<T, kD, 8>(p, use_tc, launch_merge, max_grid, stream);
      return cudaErrorInvalidValue;
  }
}

template <typename T, int kD>
cudaError_t DecodeShapeForHeadDim(int group_size, bool tc, TcCopy copy, bool rope, DecodeLaunch* l, int stages,
                                  KVCache kv) {
  switch (decode_group_bucket(group_size, kD)) {
    case 1: return decode_shape_for<T, kD, 1>(tc, copy, rope, l, stages, kv);
    case 2: return decode_shape_for<T, kD, 2>(tc, copy, rope, l, stages, kv);
    case 4: return decode_shape_for<T, kD, 4>(tc, copy, rope, l, stages, kv);
    default:
      if constexpr (decode_max_group(kD) >= 8) return decode_shape_for<T, kD, 8>(tc, copy, rope, l, stages, kv);
      return cudaErrorInvalidValue;
  }
}

// Dispatch on head_dim and the q-head bucket. max_grid > 0 caps the decode grid (the
// number of work items when it is known to be small); CUDA-graph users pass 0.
template <typename T>
cudaError_t Decode(const DecodeParams<T>& p, bool use_tc, bool launch_merge, int64_t max_grid, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  cudaError_t err = cudaErrorInvalidValue;
  auto go = [&](auto hd) {
    err = DecodeForHeadDim<T, decltype(hd)::value>(p, use_tc, launch_merge, max_grid, stream);
    return Status::kSuccess;
  };
  if (with_int<64, 128, 256, 512>(p.head_dim, go) != Status::kSuccess) return cudaErrorInvalidValue;
  return err;
}

// CTAs of the decode kernel resident per SM on the current device (the planner's input), at
// pipeline depth `stages` (0: the default).
template <typename T>
cudaError_t DecodeCtasPerSM(int head_dim, int group_size, bool use_tc, PosEncodingMode pos, int* ctas, int* num_sms,
                            int stages, KVCache kv) {
  const bool tc = decode_uses_tc(use_tc, pos, head_dim, kv);
  const bool rope = pos == PosEncodingMode::kRoPELlama;
  DeviceInfo dev;
  FLASHINFER_CUDA_TRY(current_device_info(&dev));
  const TcCopy copy = tc ? decode_tc_copy_asked(dev) : TcCopy::kCpAsync;
  DecodeLaunch l;
  cudaError_t err = cudaErrorInvalidValue;
  auto go = [&](auto hd) {
    err = DecodeShapeForHeadDim<T, decltype(hd)::value>(group_size, tc, copy, rope, &l, stages, kv);
    return Status::kSuccess;
  };
  if (with_int<64, 128, 256, 512>(head_dim, go) != Status::kSuccess) return cudaErrorInvalidValue;
  if (err != cudaSuccess) return err;
  *num_sms = dev.num_sms;
  *ctas = static_cast<int>(l.grid / dev.num_sms);
  return cudaSuccess;
}

}  // namespace attention
}  // namespace flashinfer
