// Tensor-core building blocks under cuda_emulator.h: flashinfer::mma (include/flashinfer/mma.cuh)
// replaced by warp-collective CPU versions with the exact PTX fragment layouts of
// ldmatrix.sync.aligned.m8n8.{x4,x2,x4.trans}.shared.b16 and
// mma.sync.aligned.m16n8k16.row.col.f32.{f16,bf16}.{f16,bf16}.f32, and pack2 (round to nearest).
// Same trick as cp_async_emulated.h (which this includes first): the real header is compiled into
// an unused namespace, flashinfer::mma_hardware (its #pragma once then keeps the kernels'
// "../mma.cuh" includes from redefining anything), and flashinfer::mma is this one.
//
// Warp-collective ops exchange through a per-warp table: every lane writes its operands, waits at
// the warp barrier (all 32 lanes must arrive: a divergent call is a DEADLOCK), reads the others',
// and waits again before the table can be reused. Each lane also records which op it is in, so
// lanes of one warp meeting in different collectives (say one in ldmatrix, another in a shuffle
// or another ldmatrix form) abort instead of exchanging garbage.
//
// Fragment layouts (lane L, groupID g = L / 4, t = L % 4):
//  ldmatrix .x4: lane L gives the address of row L % 8 of matrix L / 8 (16 contiguous bytes, 16-byte
//    aligned); afterwards r[i] holds row g, columns 2t (low half) and 2t + 1 of matrix i.
//    .x2: lanes 0-15 give the rows of matrices 0 and 1 (the other lanes' addresses are ignored).
//    .trans: r[i] holds (row 2t, column g) (low half) and (row 2t + 1, column g) of matrix i.
//  mma m16n8k16 row.col: A 16x16: a[0] = A[g][2t, 2t+1], a[1] = A[g+8][2t, 2t+1],
//    a[2] = A[g][2t+8, 2t+9], a[3] = A[g+8][2t+8, 2t+9]; B 16x8 (k x n): b[0] = B[2t, 2t+1][g],
//    b[1] = B[2t+8, 2t+9][g]; C/D 16x8: d[0], d[1] = D[g][2t, 2t+1], d[2], d[3] = D[g+8][2t, 2t+1].
//  The products of 16-bit values are exact in double; each output is c + the 16 products summed in
//  double, rounded once to float (the hardware's accumulation order differs by fp32 roundings).
#pragma once
#include <cstdint>
#include <cstdio>
#include <cstdlib>
#include <cstring>

#include "cp_async_emulated.h"

#define cp_async cp_async_hardware
#define mma mma_hardware
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wstrict-aliasing"  // (the real pack2's type pun, never called here)
#include "flashinfer/mma.cuh"
#pragma GCC diagnostic pop
#undef mma
#undef cp_async

namespace emu_mma {
enum Op : int { kNone = 0, kLdX4, kLdX2, kLdX4Trans, kMmaF16, kMmaBf16 };
struct Lane {
  int op;
  const void* addr;  // ldmatrix: this lane's row address
  uint32_t a[4], b[2];
};
constexpr int kMaxWarps = 32;
inline Lane table[kMaxWarps][32];
inline int64_t ops = 0;  // warp-collective ops run, for tests that want to know

// Publishes this lane's entry, waits for the warp, checks that all lanes are in the same op.
inline Lane* exchange(const Lane& mine) {
  const int w = static_cast<int>(threadIdx.x / 32), l = static_cast<int>(threadIdx.x % 32);
  if (w >= kMaxWarps) { std::printf("mma_emulated: too many warps\n"); std::abort(); }
  table[w][l] = mine;
  emu::yield_at(2);
  for (int i = 0; i < 32; ++i)
    if (table[w][i].op != mine.op) {
      std::printf("mma_emulated: warp %d lane %d in op %d, lane %d in op %d (block %u)\n", w, l, mine.op, i,
                  table[w][i].op, blockIdx.x);
      std::abort();
    }
  if (l == 0) ++ops;
  return table[w];
}
// Second barrier: nobody overwrites the table before every lane has read it.
inline void done() { emu::yield_at(2); }

inline uint16_t load16(const void* row, int col) {
  uint16_t v;
  std::memcpy(&v, static_cast<const unsigned char*>(row) + 2 * col, 2);
  return v;
}
inline uint32_t pack16(uint16_t lo, uint16_t hi) { return uint32_t(lo) | (uint32_t(hi) << 16); }

inline void check_row(const void* p, int lane) {
  if (reinterpret_cast<uintptr_t>(p) % 16 != 0) {
    std::printf("mma_emulated: ldmatrix row address %p of lane %d (thread %u, block %u) not 16-byte aligned\n", p,
                lane, threadIdx.x, blockIdx.x);
    std::abort();
  }
}

// num matrices; lane L's result from the rows the lanes gave.
inline void ldmatrix(uint32_t* r, const void* smem_row, int num, bool trans, Op op) {
  Lane mine{};
  mine.op = op;
  mine.addr = smem_row;
  const int L = static_cast<int>(threadIdx.x % 32), g = L / 4, t = L % 4;
  Lane* lanes = exchange(mine);
  for (int i = 0; i < num; ++i) {
    // row k of matrix i lives at the address of lane 8 i + k
    for (int k = 0; k < 8; ++k) check_row(lanes[8 * i + k].addr, 8 * i + k);
    if (!trans) {
      const void* row = lanes[8 * i + g].addr;
      r[i] = pack16(load16(row, 2 * t), load16(row, 2 * t + 1));
    } else {
      r[i] = pack16(load16(lanes[8 * i + 2 * t].addr, g), load16(lanes[8 * i + 2 * t + 1].addr, g));
    }
  }
  done();
}

template <typename T>
inline double val(uint16_t bits) {
  T x;
  std::memcpy(static_cast<void*>(&x), &bits, 2);
  return static_cast<double>(emu::tf(x));
}
inline uint16_t lo16(uint32_t v) { return uint16_t(v & 0xffffu); }
inline uint16_t hi16(uint32_t v) { return uint16_t(v >> 16); }

template <typename T>
inline void mma_16816(float* d, const uint32_t* a, const uint32_t* b, Op op) {
  Lane mine{};
  mine.op = op;
  for (int i = 0; i < 4; ++i) mine.a[i] = a[i];
  mine.b[0] = b[0], mine.b[1] = b[1];
  const int L = static_cast<int>(threadIdx.x % 32), g = L / 4, t = L % 4;
  Lane* lanes = exchange(mine);
  // A[m][k]: row m = g' (+8), columns 2t' (+1) (+8) held by lane 4 g' + t'
  auto A = [&](int m, int k) {
    const int gg = m % 8, hi_row = m / 8, kk = k % 8, hi_col = k / 8, tt = kk / 2;
    const uint32_t reg = lanes[4 * gg + tt].a[hi_row + 2 * hi_col];
    return val<T>(kk % 2 ? hi16(reg) : lo16(reg));
  };
  // B[k][n]: column n = g', rows 2t' (+1) (+8) held by lane 4 g' + t'
  auto B = [&](int k, int n) {
    const int kk = k % 8, tt = kk / 2;
    const uint32_t reg = lanes[4 * n + tt].b[k / 8];
    return val<T>(kk % 2 ? hi16(reg) : lo16(reg));
  };
  float out[4];
  for (int e = 0; e < 4; ++e) {
    const int m = g + 8 * (e / 2), n = 2 * t + e % 2;
    double s = d[e];
    for (int k = 0; k < 16; ++k) s += A(m, k) * B(k, n);
    out[e] = static_cast<float>(s);
  }
  done();
  for (int e = 0; e < 4; ++e) d[e] = out[e];
}
}  // namespace emu_mma

namespace flashinfer {
namespace mma {

using mma_hardware::swizzle_offset;  // (pure address math: the real one)

inline void ldmatrix_x4(uint32_t* r, const void* smem_row) { emu_mma::ldmatrix(r, smem_row, 4, false, emu_mma::kLdX4); }
inline void ldmatrix_x2(uint32_t* r, const void* smem_row) { emu_mma::ldmatrix(r, smem_row, 2, false, emu_mma::kLdX2); }
inline void ldmatrix_x4_trans(uint32_t* r, const void* smem_row) {
  emu_mma::ldmatrix(r, smem_row, 4, true, emu_mma::kLdX4Trans);
}

template <typename T>
inline void mma_16816(float* d, const uint32_t* a, const uint32_t* b);
template <>
inline void mma_16816<__half>(float* d, const uint32_t* a, const uint32_t* b) {
  emu_mma::mma_16816<__half>(d, a, b, emu_mma::kMmaF16);
}
template <>
inline void mma_16816<__nv_bfloat16>(float* d, const uint32_t* a, const uint32_t* b) {
  emu_mma::mma_16816<__nv_bfloat16>(d, a, b, emu_mma::kMmaBf16);
}

template <typename T>
inline uint32_t pack2(float lo, float hi);
template <>
inline uint32_t pack2<__half>(float lo, float hi) {
  const __half l = __float2half_rn(lo), h = __float2half_rn(hi);
  uint16_t a, b;
  std::memcpy(&a, &l, 2);
  std::memcpy(&b, &h, 2);
  return emu_mma::pack16(a, b);
}
template <>
inline uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  const __nv_bfloat16 l = __float2bfloat16_rn(lo), h = __float2bfloat16_rn(hi);
  uint16_t a, b;
  std::memcpy(&a, &l, 2);
  std::memcpy(&b, &h, 2);
  return emu_mma::pack16(a, b);
}

}  // namespace mma
}  // namespace flashinfer
