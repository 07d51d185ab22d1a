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
// fixed_stages > 0: that pipeline depth (when it fits) instead of the occupancy rule.
template <auto kernel>
cudaError_t decode_launch_shape(int64_t stage_bytes, int64_t merge_smem, DecodeLaunch* l, int fixed_stages = 0) {
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
  c.smem = c.smem > merge_smem ? c.smem : merge_smem;
  const int bps = blocks_per_sm(dev, kDecodeThreads, kernel_regs<kernel>(), c.smem);
  l->stages = c.stages;
  l->smem = c.smem;
  l->grid = int64_t{dev.num_sms} * (bps > 0 ? bps : 1);
  l->merge_grid = int64_t{dev.num_sms} * 4;
  return ensure_dynamic_smem<kernel>(c.smem, device);
}

// Launches decode (+ the merge when `launch_merge`) for head_dim kHeadDim and a q-head
// bucket kG >= min(group_size, 8). `grid` 0: the device's persistent grid.
// Which kernel a call takes: the tensor-core kernel when asked for, except for in-kernel RoPE
// (ROPE_LLAMA) and head_dim 256 (its 128 fp32 accumulators per thread would spill), which
// stay on the CUDA-core kernel with q-head bucket kG.
inline bool decode_uses_tc(bool use_tensor_cores, PosEncodingMode pos, int head_dim) {
  return use_tensor_cores && pos != PosEncodingMode::kRoPELlama && head_dim <= 128;
}

// The tensor-core kernel's copy engine: bulk copies (TMA) on sm_90+ unless
// FLASHINFER_DECODE_COPY=cpasync (read once); "bulk" asks for them where the GPU has them.
inline bool decode_tc_bulk_enabled(const DeviceInfo& dev) {
  static const int mode = [] {
    const char* e = std::getenv("FLASHINFER_DECODE_COPY");
    if (e && std::strcmp(e, "cpasync") == 0) return 0;
    return 1;
  }();
  return mode == 1 && dev.cc_major >= 9;
}

// Bulk copies need 16-byte aligned rows: base pointers and every stride in whole 16 bytes.
template <typename T>
bool decode_tc_bulk_aligned(const DecodeParams<T>& p) {
  constexpr int64_t kE = 16 / sizeof(T);
  auto al = [](const void* ptr) { return reinterpret_cast<uintptr_t>(ptr) % 16 == 0; };
  return al(p.kv.k_data) && al(p.kv.v_data) && p.kv.stride_page % kE == 0 && p.kv.stride_n % kE == 0 &&
         p.kv.stride_h % kE == 0 && p.v_stride_page % kE == 0 && p.v_stride_n % kE == 0 && p.v_stride_h % kE == 0;
}

template <typename T, int kHeadDim, int kG>
cudaError_t decode_shape_for(bool tc, bool bulk, DecodeLaunch* l) {
  if constexpr (kHeadDim <= 128) {
    if (tc) {
      // Three 64-key stages x 2 CTAs beat two stages x 3 CTAs on the H200 except for single
      // long requests (bulk copies, bf16: 128 x 8192 1080 vs 1091 us, 64 x 2048 156 vs 167,
      // 256 x 1024 303 vs 318; 1 x 32768 56.9 vs 56.2).
      if (bulk)
        return decode_launch_shape<DecodeTCKernel<T, kHeadDim, true>>(
            decode_tc_stage_bytes(kHeadDim, true), decode_tc_merge_smem(kHeadDim), l, kDecodeTCStages);
      return decode_launch_shape<DecodeTCKernel<T, kHeadDim, false>>(
          decode_tc_stage_bytes(kHeadDim, false), decode_tc_merge_smem(kHeadDim), l, kDecodeTCStages);
    }
  }
  return decode_launch_shape<DecodeCCKernel<T, kHeadDim, kG>>(
      decode_cc_stage_bytes(kHeadDim, kG), decode_merge_smem(kHeadDim), l, decode_cc_stages(kG));
}

template <typename T, int kHeadDim, int kG>
cudaError_t DecodeDispatched(const DecodeParams<T>& p, bool use_tc, bool launch_merge, int64_t max_grid,
                             cudaStream_t stream) {
  const bool tc = decode_uses_tc(use_tc, p.pos_encoding, kHeadDim);
  bool bulk = false;
  if (tc) {
    DeviceInfo dev;
    FLASHINFER_CUDA_TRY(current_device_info(&dev));
    bulk = decode_tc_bulk_enabled(dev) && decode_tc_bulk_aligned(p);
  }
  DecodeLaunch l;
  FLASHINFER_CUDA_TRY((decode_shape_for<T, kHeadDim, kG>(tc, bulk, &l)));
  const int64_t grid = max_grid > 0 && max_grid < l.grid ? max_grid : l.grid;
  bool launched = false;
  if constexpr (kHeadDim <= 128) {
    if (tc) {
      if (bulk && l.stages <= kTcMaxStages) {
        FLASHINFER_CUDA_TRY(launch(DecodeTCKernel<T, kHeadDim, true>, dim3(static_cast<unsigned>(grid)),
                                   dim3(kDecodeThreads), l.smem, stream, p.pdl, p, l.stages));
      } else {
        FLASHINFER_CUDA_TRY(launch(DecodeTCKernel<T, kHeadDim, false>, dim3(static_cast<unsigned>(grid)),
                                   dim3(kDecodeThreads), l.smem, stream, p.pdl, p, l.stages));
      }
      launched = true;
    }
  }
  if (!launched) {
    FLASHINFER_CUDA_TRY(launch(DecodeCCKernel<T, kHeadDim, kG>, dim3(static_cast<unsigned>(grid)),
                               dim3(kDecodeThreads), l.smem, stream, p.pdl, p, l.stages));
  }
  if (!launch_merge) return cudaSuccess;
  return launch(DecodeMergeKernel<T, kHeadDim>, dim3(static_cast<unsigned>(l.merge_grid)), dim3(kDecodeThreads), 0,
                stream, p.pdl, p);
}

// Dispatch on head_dim and the q-head bucket. max_grid > 0 caps the decode grid (the
// number of work items when it is known to be small); CUDA-graph users pass 0.
template <typename T>
cudaError_t Decode(const DecodeParams<T>& p, bool use_tc, bool launch_merge, int64_t max_grid, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  const int bucket = decode_group_bucket(p.group_size);
  cudaError_t err = cudaErrorInvalidValue;
  auto go = [&](auto hd) {
    constexpr int kD = decltype(hd)::value;
    switch (bucket) {
      case 1: err = DecodeDispatched<T, kD, 1>(p, use_tc, launch_merge, max_grid, stream); break;
      case 2: err = DecodeDispatched<T, kD, 2>(p, use_tc, launch_merge, max_grid, stream); break;
      case 4: err = DecodeDispatched<T, kD, 4>(p, use_tc, launch_merge, max_grid, stream); break;
      default: err = DecodeDispatched<T, kD, 8>(p, use_tc, launch_merge, max_grid, stream); break;
    }
    return Status::kSuccess;
  };
  if (with_int<64, 128, 256>(p.head_dim, go) != Status::kSuccess) return cudaErrorInvalidValue;
  return err;
}

// CTAs of the decode kernel resident per SM on the current device (the planner's input).
template <typename T>
cudaError_t DecodeCtasPerSM(int head_dim, int group_size, bool use_tc, PosEncodingMode pos, int* ctas, int* num_sms) {
  const bool tc = decode_uses_tc(use_tc, pos, head_dim);
  DeviceInfo dev;
  FLASHINFER_CUDA_TRY(current_device_info(&dev));
  const bool bulk = tc && decode_tc_bulk_enabled(dev);
  DecodeLaunch l;
  cudaError_t err = cudaErrorInvalidValue;
  const int bucket = decode_group_bucket(group_size);
  auto go = [&](auto hd) {
    constexpr int kD = decltype(hd)::value;
    switch (bucket) {
      case 1: err = decode_shape_for<T, kD, 1>(tc, bulk, &l); break;
      case 2: err = decode_shape_for<T, kD, 2>(tc, bulk, &l); break;
      case 4: err = decode_shape_for<T, kD, 4>(tc, bulk, &l); break;
      default: err = decode_shape_for<T, kD, 8>(tc, bulk, &l); break;
    }
    return Status::kSuccess;
  };
  if (with_int<64, 128, 256>(head_dim, go) != Status::kSuccess) return cudaErrorInvalidValue;
  if (err != cudaSuccess) return err;
  *num_sms = dev.num_sms;
  *ctas = static_cast<int>(l.grid / dev.num_sms);
  return cudaSuccess;
}

}  // namespace attention
}  // namespace flashinfer
