// Warpgroup MMAs under cuda_emulator.h: flashinfer::wgmma (include/flashinfer/wgmma.cuh)
// replaced by CPU versions, with the real header compiled into flashinfer::wgmma_hardware (the
// trick of mma_emulated.h, which this includes first; its #pragma once then keeps the kernels'
// "../wgmma.cuh" includes from redefining anything).
//
// What is emulated, and how faithfully:
//  - A product (Wgmma<T, N>::ss / ss_tn / rs_tn) is only recorded when issued; commit() closes a group;
//    wait<N>() runs every group but the N most recent, in order. So shared memory and the A
//    registers (rs_tn: read through the caller's pointer) are read at the latest legal time,
//    and a kernel that refills a tile, or rewrites P, before waiting on the product that reads
//    it computes a wrong result here as it would on the GPU.
//  - Each warp computes its own 16 rows of the m64 tile (the hardware splits a warpgroup's
//    product the same way): lane (g, t) of warp w % 4 owns rows 16 w + g (+8), columns
//    8 j + 2 t (+1), as wgmma.cuh describes. wait<N> is warp-collective (all 32 lanes must
//    reach it with the same groups, or the test aborts); rs_tn's A fragment of row r, column k
//    comes from the lane that holds it (the m16n8k16 A layout).
//  - Descriptors: a 128-byte-swizzled tile as wgmma.cuh describes it. The emulated descriptor
//    keeps the full host pointer (48 bits) and the byte offsets in units of 1024 (the kernels'
//    offsets are 1024-multiples; a K-major leading offset is ignored, 16 by convention).
//    Element addresses are computed as the hardware's: the linear address of the element, then
//    bits 4-6 XOR bits 7-9 (the tile must be 1024-byte aligned for that to be its layout; the
//    kernel aligns it). K-major operand element (row, k) of a k16 step: start + (row / 8) sbo +
//    (row % 8) 128 + 2 k; MN-major (transposed B) element (k, n): start + (n / 64) lbo +
//    (k / 8) sbo + (k % 8) 128 + 2 (n % 64).
//  - Products of 16-bit values are exact in double; each output is the accumulator plus the 16
//    products summed in double, rounded once to float.
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "mma_emulated.h"

#define wgmma wgmma_hardware
#include "flashinfer/wgmma.cuh"
#undef wgmma

namespace emu_wgmma {
struct Op {
  bool rs;  // A from registers (else from shared memory, K-major)
  bool tn;  // B MN-major, transposed by the instruction (else K-major)
  int n;
  double (*cvt)(uint16_t);
  float* d;
  uint64_t desc_a, desc_b;
  const uint32_t* a;
  int accumulate;
};
struct State {
  std::vector<Op> open;
  std::vector<std::vector<Op>> groups;
};
constexpr int kMaxThreads = 1024;
inline State state[kMaxThreads];
inline int64_t products = 0;  // products run (per warp), for tests that want to know

inline void fail(const char* what) {
  std::printf("wgmma_emulated: %s (thread %u, block %u)\n", what, threadIdx.x, blockIdx.x);
  std::abort();
}
inline uint64_t encode(const void* p, uint32_t lbo, uint32_t sbo) {
  const uint64_t a = reinterpret_cast<uintptr_t>(p);
  if (a >> 48) fail("pointer beyond 48 bits");
  if ((lbo != 16 && lbo % 1024) || sbo % 1024 || lbo >= 256 * 1024 || sbo >= 256 * 1024)
    fail("descriptor offsets not multiples of 1024 bytes");
  return a | (uint64_t{lbo == 16 ? 0u : lbo / 1024} << 48) | (uint64_t{sbo / 1024} << 56);
}
inline const char* start(uint64_t d) { return reinterpret_cast<const char*>(d & ((uint64_t{1} << 48) - 1)); }
inline uint32_t lbo(uint64_t d) { return static_cast<uint32_t>((d >> 48) & 0xff) * 1024; }
inline uint32_t sbo(uint64_t d) { return static_cast<uint32_t>((d >> 56) & 0xff) * 1024; }
// The 16-bit element at linear address `lin` of a 128-byte-swizzled tile.
inline uint16_t load_sw(const char* lin) {
  uintptr_t a = reinterpret_cast<uintptr_t>(lin);
  a ^= ((a >> 7) & 7) << 4;
  uint16_t v;
  std::memcpy(&v, reinterpret_cast<const void*>(a), 2);
  return v;
}
inline uint16_t kmajor(uint64_t d, int row, int k) {
  return load_sw(start(d) + (row / 8) * sbo(d) + (row % 8) * 128 + 2 * k);
}
inline uint16_t mnmajor(uint64_t d, int k, int n) {
  return load_sw(start(d) + (n / 64) * lbo(d) + (k / 8) * sbo(d) + (k % 8) * 128 + 2 * (n % 64));
}

template <int kPending>
inline void wait() {
  State& mine = state[threadIdx.x];
  emu_mma::Lane me{};
  me.op = 100;  // (an op code of its own: lanes meeting in an ldmatrix / mma abort)
  me.addr = &mine;
  emu_mma::Lane* lanes = emu_mma::exchange(me);
  const int run = static_cast<int>(mine.groups.size()) - kPending;
  for (int i = 0; i < 32; ++i) {
    const State& other = *static_cast<const State*>(lanes[i].addr);
    if (static_cast<int>(other.groups.size()) != static_cast<int>(mine.groups.size()))
      fail("lanes of a warp wait with different groups in flight");
  }
  const int L = static_cast<int>(threadIdx.x % 32), g = L / 4, t = L % 4;
  const int w = static_cast<int>(threadIdx.x / 32) % 4;
  for (int gi = 0; gi < run; ++gi) {
    for (size_t oi = 0; oi < mine.groups[size_t(gi)].size(); ++oi) {
      const Op& op = mine.groups[size_t(gi)][oi];
      // A[r][k], r local to the warp's 16 rows
      auto A = [&](int r, int k) -> double {
        if (!op.rs) return op.cvt(kmajor(op.desc_a, 16 * w + r, k));  // (the warp's rows of the m64 tile)
        const int gg = r % 8, hi_row = r / 8, kk = k % 8, hi_col = k / 8;
        const State& holder = *static_cast<const State*>(lanes[4 * gg + kk / 2].addr);
        const uint32_t reg = holder.groups[size_t(gi)][oi].a[hi_row + 2 * hi_col];
        return op.cvt(kk % 2 ? emu_mma::hi16(reg) : emu_mma::lo16(reg));
      };
      auto B = [&](int k, int n) -> double {
        return op.cvt(op.tn ? mnmajor(op.desc_b, k, n) : kmajor(op.desc_b, n, k));
      };
      for (int j = 0; j < op.n / 8; ++j)
        for (int e = 0; e < 4; ++e) {
          const int r = g + 8 * (e / 2), c = 8 * j + 2 * t + e % 2;
          double s = op.accumulate ? op.d[4 * j + e] : 0.0;
          for (int k = 0; k < 16; ++k) s += A(r, k) * B(k, c);
          op.d[4 * j + e] = static_cast<float>(s);
        }
      if (L == 0) ++products;
    }
  }
  emu_mma::done();  // (every lane has read the others' A registers)
  mine.groups.erase(mine.groups.begin(), mine.groups.begin() + (run > 0 ? run : 0));
}
}  // namespace emu_wgmma

namespace flashinfer {
namespace wgmma {

using wgmma_hardware::smem_u32;      // (the host branch: the pointer's low bits)
using wgmma_hardware::sw128_offset;  // (pure address math: the real one)

inline uint64_t desc_sw128(const void* smem, uint32_t lbo, uint32_t sbo) { return emu_wgmma::encode(smem, lbo, sbo); }
inline void fence() {}
inline void fence_proxy_async() {}
template <int N>
inline void fence_operands(float*) {}
template <int N>
inline void fence_operands(uint32_t*) {}
inline void commit() {
  emu_wgmma::State& s = emu_wgmma::state[threadIdx.x];
  s.groups.push_back(std::move(s.open));
  s.open.clear();
}
template <int kPending>
inline void wait() {
  emu_wgmma::wait<kPending>();
}

template <typename T, int N>
struct Wgmma {
  static void ss(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
    emu_wgmma::state[threadIdx.x].open.push_back(
        {false, false, N, &emu_mma::val<T>, d, desc_a, desc_b, nullptr, accumulate});
  }
  static void ss_tn(float* d, uint64_t desc_a, uint64_t desc_b, int accumulate) {
    emu_wgmma::state[threadIdx.x].open.push_back(
        {false, true, N, &emu_mma::val<T>, d, desc_a, desc_b, nullptr, accumulate});
  }
  static void rs_tn(float* d, const uint32_t* a, uint64_t desc_b, int accumulate) {
    emu_wgmma::state[threadIdx.x].open.push_back({true, true, N, &emu_mma::val<T>, d, 0, desc_b, a, accumulate});
  }
};

}  // namespace wgmma
}  // namespace flashinfer
