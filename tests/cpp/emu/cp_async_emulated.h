// cp.async under cuda_emulator.h: flashinfer::cp_async (include/flashinfer/cp_async.cuh) replaced
// by per-thread queues of committed groups of 16- and 8-byte copies. A copy takes the data it
// reads at issue and lands at the latest legal time, the wait that retires its group, so a slot
// read before its wait shows up; with emu_cp::eager it lands at once instead, so a slot refilled
// (or used as scratch) while its data is still needed shows up. Include after cuda_emulator.h and
// before any flashinfer header: the real header is compiled first into an unused namespace (its
// #pragma once then keeps the kernels' "../cp_async.cuh" includes from redefining anything), and
// flashinfer::cp_async is this one.
#pragma once
#include <cstdint>
#include <cstring>
#include <vector>

inline size_t __cvta_generic_to_shared(const void* p) { return reinterpret_cast<size_t>(p); }  // (its low bits: alignment)
#define cp_async cp_async_hardware
#include "flashinfer/cp_async.cuh"
#undef cp_async

namespace emu_cp {
struct Copy {
  void* dst;
  unsigned char data[16];
  int bytes;
};
inline std::vector<std::vector<std::vector<Copy>>> groups(1024);  // [thread][group][copy]
inline std::vector<std::vector<Copy>> open(1024);                 // [thread][copy], not committed
inline int64_t copies = 0;
inline bool eager = false;  // copies land at issue (the earliest legal time), not at their wait
// Thread t's copies in flight (committed or not) land now.
inline void land(unsigned t) {
  for (auto& grp : groups[t])
    for (const auto& c : grp) std::memcpy(c.dst, c.data, size_t(c.bytes));
  for (const auto& c : open[t]) std::memcpy(c.dst, c.data, size_t(c.bytes));
  for (auto& grp : groups[t]) grp.clear();  // (empty groups: wait() retires them)
  open[t].clear();
}
}  // namespace emu_cp

namespace flashinfer {
namespace cp_async {

inline void copy_n(void* smem, const void* gmem, bool valid, int bytes) {
  emu_cp::Copy c;
  c.dst = smem;
  c.bytes = bytes;
  if (valid) std::memcpy(c.data, gmem, bytes); else std::memset(c.data, 0, bytes);
  ++emu_cp::copies;
  if (emu_cp::eager) {
    std::memcpy(smem, c.data, size_t(bytes));
    return;
  }
  emu_cp::open[threadIdx.x].push_back(c);
}
inline void copy16_or_zero(void* smem, const void* gmem, bool valid) { copy_n(smem, gmem, valid, 16); }
inline void copy16(void* smem, const void* gmem) { copy16_or_zero(smem, gmem, true); }
template <int kBytes>
inline void copy(void* smem, const void* gmem) { copy_n(smem, gmem, true, kBytes); }
template <int kBytes>
inline void copy_or_zero(void* smem, const void* gmem, bool valid) { copy_n(smem, gmem, valid, kBytes); }
inline void commit() {
  emu_cp::groups[threadIdx.x].push_back(std::move(emu_cp::open[threadIdx.x]));
  emu_cp::open[threadIdx.x].clear();
}
inline void wait(int n) {
  auto& g = emu_cp::groups[threadIdx.x];
  if (n > 15) n = 15;
  while (static_cast<int>(g.size()) > n) {
    for (const auto& c : g.front()) std::memcpy(c.dst, c.data, c.bytes);
    g.erase(g.begin());
  }
}

}  // namespace cp_async
}  // namespace flashinfer
