// mbarriers (flashinfer::bulk's init / arrive / wait_parity, include/flashinfer/bulk_copy.cuh) and
// named barriers (flashinfer::barrier, barrier.cuh) under cuda_emulator.h. Include after
// cuda_emulator.h and cp_async_emulated.h, before any flashinfer header (the trick of
// cp_async_emulated.h: the real headers compile into unused namespaces first).
//  - An mbarrier keeps its state in its own 8 bytes: arrivals still expected in the current
//    phase, the count it was initialized with, and the current phase's parity. The arrival that
//    completes a phase flips the parity and re-arms the count. wait_parity(P) returns once the
//    phase of parity P has completed (the current parity is not P); until then the fiber parks
//    as a spinner (wait kind 5). A scheduler releases spinners whenever some arrival happened
//    since it last did (`epoch`), and reports a deadlock when none did and nothing else can move.
//  - A named barrier's sync parks the fiber (wait kind 6) with its id and count, an arrive only
//    counts the thread in; the scheduler opens the barrier when the fibers parked there and the
//    arrivals make `count` (more arrivals than that abort). set_max_regs does nothing.
//  - cp_async::arrive_noinc (an arrival once the thread's cp.async copies land) lands them at
//    once and arrives.
//  - Bulk copies (bulk::copy, the TMA engine's row copies) and arrive_expect_tx: a barrier's
//    phase completes when its arrivals are in and its expected bytes have landed. A copy takes
//    its data at issue and lands when a thread waits on its barrier (the latest legal time), or
//    at issue with emu_cp::eager (cp_async_emulated.h), the earliest. Tensor-map copies are not
//    emulated.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#define bulk bulk_hardware
#define barrier barrier_hardware
#include "flashinfer/barrier.cuh"
#include "flashinfer/bulk_copy.cuh"
#undef barrier
#undef bulk

namespace emu_bar {
struct Mbar {
  uint32_t pending;
  uint16_t count;
  uint16_t parity;
};
static_assert(sizeof(Mbar) == 8, "one mbarrier word");
inline int64_t epoch = 0;  // arrivals that completed a phase, so far
inline int id_of[1024], count_of[1024];  // [thread]: the named barrier a parked fiber waits at
inline int arrived[16];                  // [id]: arrivals (not syncs) in the barrier's current round
inline Mbar get(const uint64_t* bar) {
  Mbar m;
  std::memcpy(&m, bar, 8);
  return m;
}
inline void put(uint64_t* bar, const Mbar& m) { std::memcpy(bar, &m, 8); }
// Bulk copies in flight, and the bytes each barrier still expects in its current phase.
struct BulkCopy {
  void* dst;
  std::vector<unsigned char> data;
  uint64_t* bar;
};
inline std::vector<BulkCopy> bulk_in_flight;
inline std::map<const uint64_t*, int64_t> tx;
// Releases what the scheduler can release among threads [0, n) of the running CTA: a named
// barrier every participant has reached, else (if an arrival happened since the last call that
// did so) the spinners. False: nothing to release.
inline bool release(int n) {
  static int64_t last_epoch = -1;
  for (int t = 0; t < n; ++t) {
    if (emu::fibers[size_t(t)].wait != 6) continue;
    int waiting = 0;
    for (int u = 0; u < n; ++u) waiting += emu::fibers[size_t(u)].wait == 6 && id_of[u] == id_of[t];
    const int id = id_of[t];
    if (waiting + arrived[id] > count_of[t]) {
      std::printf("named barrier %d: %d threads wait, %d arrived, count %d\n", id, waiting, arrived[id], count_of[t]);
      std::abort();
    }
    if (waiting + arrived[id] == count_of[t]) {
      arrived[id] = 0;
      for (int u = 0; u < n; ++u)
        if (emu::fibers[size_t(u)].wait == 6 && id_of[u] == id) emu::fibers[size_t(u)].wait = 0;
      return true;
    }
  }
  if (epoch == last_epoch) return false;
  bool any = false;
  for (int t = 0; t < n; ++t)
    if (emu::fibers[size_t(t)].wait == 5) emu::fibers[size_t(t)].wait = 0, any = true;
  if (any) last_epoch = epoch;
  return any;
}
// At the end of a CTA: no named barrier may be left with arrivals no sync consumed.
inline void end_cta() {
  for (int id = 0; id < 16; ++id)
    if (arrived[id]) {
      std::printf("named barrier %d: %d arrivals left at the end of the CTA\n", id, arrived[id]);
      std::abort();
    }
}
// emu::launch releases spinners and named barriers through it.
inline const bool hooked = (emu::extra_release = &release, true);
}  // namespace emu_bar

namespace flashinfer {
namespace bulk {
inline void mbarrier_init(uint64_t* bar, int count) {
  if (count <= 0 || count > 65535) std::abort();
  emu_bar::put(bar, emu_bar::Mbar{uint32_t(count), uint16_t(count), 0});
  emu_bar::tx[bar] = 0;
}
inline void fence_init() {}
inline void fence_proxy_async() {}
namespace detail {
// The phase completes once every arrival is in (pending 0) and no byte is expected.
inline void complete_if_done(uint64_t* bar, emu_bar::Mbar& m) {
  if (m.pending == 0 && emu_bar::tx[bar] == 0) m.pending = m.count, m.parity ^= 1, ++emu_bar::epoch;
}
inline void complete_tx(uint64_t* bar, uint32_t bytes) {
  emu_bar::tx[bar] -= bytes;
  emu_bar::Mbar m = emu_bar::get(bar);
  complete_if_done(bar, m);
  emu_bar::put(bar, m);
}
}  // namespace detail
inline void arrive(uint64_t* bar) {
  emu_bar::Mbar m = emu_bar::get(bar);
  if (m.pending == 0 || m.pending > m.count) {
    std::printf("mbarrier arrive on an uninitialized barrier (thread %u)\n", threadIdx.x);
    std::abort();
  }
  --m.pending;
  detail::complete_if_done(bar, m);
  emu_bar::put(bar, m);
}
inline void wait_parity(uint64_t* bar, uint32_t parity) {
  // (the latest legal time: this barrier's bulk copies land now)
  for (size_t i = 0; i < emu_bar::bulk_in_flight.size();) {
    emu_bar::BulkCopy& c = emu_bar::bulk_in_flight[i];
    if (c.bar != bar) {
      ++i;
      continue;
    }
    std::memcpy(c.dst, c.data.data(), c.data.size());
    const uint32_t bytes = static_cast<uint32_t>(c.data.size());
    emu_bar::bulk_in_flight.erase(emu_bar::bulk_in_flight.begin() + static_cast<std::ptrdiff_t>(i));
    detail::complete_tx(bar, bytes);
  }
  while (emu_bar::get(bar).parity == (parity & 1)) emu::yield_at(5);
}
inline void arrive_expect_tx(uint64_t* bar, uint32_t bytes) {
  emu_bar::tx[bar] += bytes;
  arrive(bar);
}
inline void copy(void* dst, const void* src, uint32_t bytes, uint64_t* bar) {
  if (bytes % 16 || reinterpret_cast<uintptr_t>(dst) % 16 || reinterpret_cast<uintptr_t>(src) % 16) {
    std::printf("bulk copy of %u bytes, %p -> %p: not 16-byte aligned\n", bytes, src, dst);
    std::abort();
  }
  if (emu_cp::eager) {
    std::memcpy(dst, src, bytes);
    detail::complete_tx(bar, bytes);
    return;
  }
  emu_bar::BulkCopy c{dst, std::vector<unsigned char>(bytes), bar};
  std::memcpy(c.data.data(), src, bytes);
  emu_bar::bulk_in_flight.push_back(std::move(c));
}
}  // namespace bulk
namespace cp_async {
// (cp_async_emulated.h's copies: this thread's land now, then the arrival)
inline void arrive_noinc(uint64_t* bar) {
  emu_cp::land(threadIdx.x);
  bulk::arrive(bar);
}
}  // namespace cp_async
namespace barrier {
inline void sync(int id, int threads) {
  emu_bar::id_of[threadIdx.x] = id;
  emu_bar::count_of[threadIdx.x] = threads;
  emu::yield_at(6);
}
inline void arrive(int id, int threads) {
  if (++emu_bar::arrived[id] > threads) {
    std::printf("named barrier %d: more than %d arrivals\n", id, threads);
    std::abort();
  }
}
template <int kRegs, bool kInc>
inline void set_max_regs() {}
}  // namespace barrier
}  // namespace flashinfer
