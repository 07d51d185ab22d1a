// Occupancy and prefetch-depth arithmetic for the streaming (memory-bound) kernels: how many
// blocks fit on an SM and how many pipeline stages keep enough bytes in flight. Pure C++17.
#pragma once

#include <cstdint>

#include "config.h"
#include "device_info.h"

namespace flashinfer {

// Blocks of `threads` threads using `regs` registers per thread and `smem` bytes that fit on
// one SM (registers are allocated per warp in units of 256).
inline int blocks_per_sm(const DeviceInfo& dev, int threads, int regs, int64_t smem) {
  const int warps = ceil_div(threads, 32);
  const int regs_per_warp = round_up(regs > 0 ? regs : 1, 8) * 32;
  int by_threads = dev.max_threads_per_sm / (warps * 32);
  int by_regs = dev.regs_per_sm / (regs_per_warp * warps);
  // 1 KiB per block is reserved by the hardware on sm_80+.
  int by_smem = static_cast<int>(dev.smem_per_sm / (smem + 1024));
  int b = by_threads < by_regs ? by_threads : by_regs;
  b = b < by_smem ? b : by_smem;
  return b < 32 ? b : 32;
}

struct StreamConfig {
  int stages = 2;         // cp.async pipeline depth (rows or tiles in flight per block, + 1)
  int blocks_per_sm = 1;
  int64_t smem = 0;       // dynamic shared memory per block, bytes
  int64_t grid = 1;       // persistent grid: blocks loop over work items with stride grid
  int64_t inflight = 0;   // prefetched bytes per SM in steady state
};

// Little's law on an H200: ~4.3 TB/s at ~1.5 us of loaded latency needs ~50 KiB in flight
// per SM; twice that leaves margin for the reduction and store phases.
constexpr int64_t kTargetInflightPerSM = 128 * 1024;

// Picks the smallest depth (2..max_stages) whose bytes in flight reach the target, else the
// depth with the most bytes in flight. stage_bytes: shared memory one stage of one block uses.
inline StreamConfig stream_config(const DeviceInfo& dev, int64_t work_items, int threads, int regs,
                                  int64_t stage_bytes, int max_stages = 8) {
  StreamConfig best;
  best.stages = 0;
  for (int s = 2; s <= max_stages; ++s) {
    const int64_t smem = s * stage_bytes;
    if (smem > dev.smem_optin) break;
    const int bps = blocks_per_sm(dev, threads, regs, smem);
    if (bps == 0) break;
    const int64_t inflight = int64_t{bps} * (s - 1) * stage_bytes;
    if (best.stages == 0 || inflight > best.inflight) {
      best.stages = s;
      best.blocks_per_sm = bps;
      best.smem = smem;
      best.inflight = inflight;
    }
    if (inflight >= kTargetInflightPerSM) break;
  }
  if (best.stages == 0) return best;  // does not fit: the caller takes another path
  const int64_t full = int64_t{dev.num_sms} * best.blocks_per_sm;
  best.grid = work_items < full ? work_items : full;
  if (best.grid < 1) best.grid = 1;
  return best;
}

}  // namespace flashinfer
