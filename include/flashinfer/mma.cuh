// Warp-level tensor-core building blocks (sm_80+): ldmatrix loads from shared memory and the
// m16n8k16 MMA with fp32 accumulators for fp16 / bf16 operands.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <cstdint>

#include "config.h"
#include "cp_async.cuh"

namespace flashinfer {
namespace mma {

// Byte offset of 16-byte chunk `chunk` of row `row` in a shared-memory tile of kRowBytes-byte
// rows (>= 8 chunks), the chunks XOR-swizzled by row % 8: the 8 rows one ldmatrix phase reads
// sit in 8 different bank groups.
template <int kRowBytes>
FLASHINFER_DEVICE uint32_t swizzle_offset(int row, int chunk) {
  return static_cast<uint32_t>(row * kRowBytes + ((chunk ^ (row & 7)) << 4));
}

// Four 8x8 b16 matrices; lane L supplies the row address of matrix L / 8.
FLASHINFER_DEVICE void ldmatrix_x4(uint32_t* r, const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(cp_async::smem_addr(smem_row)));
}

// Two 8x8 b16 matrices; lanes 0-15 supply the row addresses.
FLASHINFER_DEVICE void ldmatrix_x2(uint32_t* r, const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x2.shared.b16 {%0, %1}, [%2];\n"
               : "=r"(r[0]), "=r"(r[1])
               : "r"(cp_async::smem_addr(smem_row)));
}

FLASHINFER_DEVICE void ldmatrix_x4_trans(uint32_t* r, const void* smem_row) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(cp_async::smem_addr(smem_row)));
}

// d += a (16x16, row) * b (16x8, col), fp32 accumulators.
template <typename T>
FLASHINFER_DEVICE void mma_16816(float* d, const uint32_t* a, const uint32_t* b);

template <>
FLASHINFER_DEVICE void mma_16816<__half>(float* d, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

template <>
FLASHINFER_DEVICE void mma_16816<__nv_bfloat16>(float* d, const uint32_t* a, const uint32_t* b) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, {%8, %9}, "
      "{%0, %1, %2, %3};\n"
      : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b[0]), "r"(b[1]));
}

// Two floats -> one register of two 16-bit values (lo in the low half).
template <typename T>
FLASHINFER_DEVICE uint32_t pack2(float lo, float hi);
template <>
FLASHINFER_DEVICE uint32_t pack2<__half>(float lo, float hi) {
  __half2 h = __floats2half2_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}
template <>
FLASHINFER_DEVICE uint32_t pack2<__nv_bfloat16>(float lo, float hi) {
  __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<uint32_t*>(&h);
}

}  // namespace mma
}  // namespace flashinfer
