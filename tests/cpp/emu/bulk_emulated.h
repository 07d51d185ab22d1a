// Bulk copies (include/flashinfer/bulk_copy.cuh) under cuda_emulator.h: a copy takes the data it
// reads at issue and lands at the latest legal time, the first wait on its barrier, so a read
// of the destination before that wait sees stale bytes and a test comparing against the plain
// path fails. Barrier misuse (init of a live barrier, wait or copy on a dead one) aborts.
// Include after cuda_emulator.h and before any flashinfer header (the cp_async_emulated.h
// trick: the real header compiles into an unused namespace). Defines
// FLASHINFER_EMULATED_BULK_COPY, which lets the kernels take their bulk paths here.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <vector>

#define FLASHINFER_EMULATED_BULK_COPY 1
#ifndef FLASHINFER_EMU_CVTA_DECLARED
#define FLASHINFER_EMU_CVTA_DECLARED
inline size_t __cvta_generic_to_shared(const void* p) { return reinterpret_cast<size_t>(p); }  // (never called)
#endif
#define bulk bulk_hardware
#include "flashinfer/bulk_copy.cuh"
#undef bulk

namespace emu_bulk {
struct Pending {
  void* dst;
  std::vector<unsigned char> data;
};
inline std::map<uint64_t*, std::vector<Pending>> pending;  // per live barrier
inline int64_t copies = 0;
inline void fail(const char* what) {
  std::fprintf(stderr, "emulated bulk copy: %s\n", what);
  std::abort();
}
}  // namespace emu_bulk

namespace flashinfer {
namespace bulk {

inline void mbarrier_init(uint64_t* bar, int) {
  if (emu_bulk::pending.count(bar)) emu_bulk::fail("init of a live barrier");
  emu_bulk::pending[bar];
}
inline void mbarrier_inval(uint64_t* bar) {
  auto it = emu_bulk::pending.find(bar);
  if (it == emu_bulk::pending.end()) emu_bulk::fail("inval of a dead barrier");
  if (!it->second.empty()) emu_bulk::fail("inval with copies in flight");
  emu_bulk::pending.erase(it);
}
inline void fence_init() {}
inline void fence_proxy_async() {}
inline void arrive_expect_tx(uint64_t* bar, uint32_t) {
  if (!emu_bulk::pending.count(bar)) emu_bulk::fail("arrive on a dead barrier");
}
inline void copy(void* smem, const void* gmem, uint32_t bytes, uint64_t* bar) {
  auto it = emu_bulk::pending.find(bar);
  if (it == emu_bulk::pending.end()) emu_bulk::fail("copy on a dead barrier");
  if (bytes % 16 || reinterpret_cast<uintptr_t>(smem) % 16 || reinterpret_cast<uintptr_t>(gmem) % 16)
    emu_bulk::fail("misaligned copy");
  const auto* g = static_cast<const unsigned char*>(gmem);
  it->second.push_back({smem, std::vector<unsigned char>(g, g + bytes)});
  ++emu_bulk::copies;
}
inline void wait_parity(uint64_t* bar, uint32_t parity) {
  auto it = emu_bulk::pending.find(bar);
  if (it == emu_bulk::pending.end()) emu_bulk::fail("wait on a dead barrier");
  if (parity != 0) emu_bulk::fail("only phase 0 is emulated");
  for (const auto& p : it->second) std::memcpy(p.dst, p.data.data(), p.data.size());
  it->second.clear();
}

}  // namespace bulk
}  // namespace flashinfer
