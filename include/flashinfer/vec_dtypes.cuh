// Vectorised loads/stores of fp16/bf16/fp32 and their conversions to fp32 (and of fp8 cache
// vectors to fp32).
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_fp8.h>
#include <cuda_runtime.h>

#include <cstring>
#include <type_traits>

#include "config.h"

namespace flashinfer {

FLASHINFER_DEVICE float to_float(float x) { return x; }
FLASHINFER_DEVICE float to_float(__half x) { return __half2float(x); }
FLASHINFER_DEVICE float to_float(__nv_bfloat16 x) { return __bfloat162float(x); }

template <typename T>
FLASHINFER_DEVICE T from_float(float x);
template <>
FLASHINFER_DEVICE float from_float<float>(float x) { return x; }
template <>
FLASHINFER_DEVICE __half from_float<__half>(float x) { return __float2half_rn(x); }
template <>
FLASHINFER_DEVICE __nv_bfloat16 from_float<__nv_bfloat16>(float x) { return __float2bfloat16_rn(x); }

// A pair of 16-bit values in one 32-bit word (low half first) as two floats; the pointer picks
// the type. bf16 -> f32 is a shift.
FLASHINFER_DEVICE float2 unpack2(uint32_t w, const __nv_bfloat16*) {
  const uint32_t lo = w << 16, hi = w & 0xffff0000u;
  float2 f;
  memcpy(&f.x, &lo, 4);
  memcpy(&f.y, &hi, 4);
  return f;
}
FLASHINFER_DEVICE float2 unpack2(uint32_t w, const __half*) {
  __half2 h;
  memcpy(static_cast<void*>(&h), &w, 4);
  return __half22float2(h);
}

// A plain 16-byte load that the compiler keeps in program order (asm volatile): issued where it
// stands in the source, never sunk below later code (RoPE issues its q/k loads before the
// position -> cos/sin chain, append its K/V loads before the page lookup). No cache hint:
// evict-first (.cs) measured 3% slower on the H200 (benchmarks/NOTES.md, session 16).
FLASHINFER_DEVICE uint4 load128_ordered(const void* ptr) {
  uint4 r;
  asm volatile("ld.global.v4.u32 {%0, %1, %2, %3}, [%4];"
               : "=r"(r.x), "=r"(r.y), "=r"(r.z), "=r"(r.w)
               : "l"(ptr));
  return r;
}

// The same for one 4- or 8-byte index.
template <typename I>
FLASHINFER_DEVICE I load_index_ordered(const I* ptr) {
  static_assert(sizeof(I) == 4 || sizeof(I) == 8, "32- or 64-bit indices");
  if constexpr (sizeof(I) == 4) {
    uint32_t r;
    asm volatile("ld.global.u32 %0, [%1];" : "=r"(r) : "l"(ptr));
    return static_cast<I>(r);
  } else {
    unsigned long long r;
    asm volatile("ld.global.u64 %0, [%1];" : "=l"(r) : "l"(ptr));
    return static_cast<I>(r);
  }
}

// N elements of T stored together; 16-byte vectors load and store as one 128-bit access.
template <typename T, int N>
struct alignas(sizeof(T) * N) Vec {
  T v[N];

  static constexpr bool kIs16B = sizeof(T) * N == 16;

  // Read-only-cached load (data reused across blocks, e.g. weights).
  FLASHINFER_DEVICE void load(const T* p) { *this = *reinterpret_cast<const Vec*>(p); }
  FLASHINFER_DEVICE void store(T* p) const { *reinterpret_cast<Vec*>(p) = *this; }
  // A 16-byte vector of a streamed row as a uint4 (a copy of the element array can be split
  // into 2-byte stores: the fp16 / bf16 types are not trivially copyable). No cache hint: on the
  // H200 evict-first (.cs) made the norm, activation and RoPE kernels 2-8% slower
  // (benchmarks/NOTES.md, session 16). The store still reaches SASS as four 4-byte STG.E where
  // the vector was assembled from 16-bit conversions (norm, activation); an asm st.global.v4
  // avoids that, as cascade.cuh's Pack::store does (to be measured: NOTES, next steps).
  FLASHINFER_DEVICE void load128(const T* p) {
    static_assert(kIs16B, "16-byte vectors only");
    const uint4 u = *reinterpret_cast<const uint4*>(p);
    *this = *reinterpret_cast<const Vec*>(&u);
  }
  FLASHINFER_DEVICE void store128(T* p) const {
    static_assert(kIs16B, "16-byte vectors only");
    *reinterpret_cast<uint4*>(p) = *reinterpret_cast<const uint4*>(this);
  }
  FLASHINFER_DEVICE void to_float(float* f) const {
    FLASHINFER_UNROLL
    for (int i = 0; i < N; ++i) f[i] = flashinfer::to_float(v[i]);
  }
  FLASHINFER_DEVICE void from_float(const float* f) {
    FLASHINFER_UNROLL
    for (int i = 0; i < N; ++i) v[i] = flashinfer::from_float<T>(f[i]);
  }
};

// Hides a 16-byte value from the optimizer (an empty volatile asm that "modifies" its four
// words): work on it cannot be scheduled before this point. The norm kernels keep the packed
// 16-bit registers live across a reduction this way instead of their fp32 conversions (twice the
// registers); the streaming kernels convert vector u only after vector u - 1 is stored.
FLASHINFER_DEVICE void opaque(uint4& u) { asm volatile("" : "+r"(u.x), "+r"(u.y), "+r"(u.z), "+r"(u.w)); }
template <typename T, int N>
FLASHINFER_DEVICE void opaque(Vec<T, N>& v) {
  static_assert(Vec<T, N>::kIs16B, "16-byte vectors only");
  opaque(*reinterpret_cast<uint4*>(&v));
}

// 16 bytes at p (16-byte aligned, any memory space; typically shared memory) as one Vec, read
// with one 16-byte load. Converting through a Vec pointer instead (ptr->to_float) reads every
// element with its own 16-bit load (LDS.U16 from shared memory: 8 loads, each of 4 wavefronts
// when lanes are 16 bytes apart).
template <typename T>
FLASHINFER_DEVICE Vec<T, 16 / sizeof(T)> load16(const void* p) {
  const uint4 u = *static_cast<const uint4*>(p);
  Vec<T, 16 / sizeof(T)> v;
  memcpy(&v, &u, sizeof(u));
  return v;
}

// Two fp8 values (bits 0-7 and 8-15 of v; TKV __nv_fp8_e4m3 or __nv_fp8_e5m2) as an fp16 pair,
// exactly (a hardware cvt on sm_89+).
template <typename TKV>
FLASHINFER_DEVICE __half2 fp8x2_to_half2(uint32_t v) {
  constexpr __nv_fp8_interpretation_t kInterp = std::is_same_v<TKV, __nv_fp8_e5m2> ? __NV_E5M2 : __NV_E4M3;
  return __half2(__nv_cvt_fp8x2_to_halfraw2(static_cast<__nv_fp8x2_storage_t>(v & 0xffffu), kInterp));
}

// Eight cache elements of type TKV at p (shared memory, aligned to their size: 16 bytes of
// fp16 / bf16 or 8 of fp8) as floats. fp8 converts exactly, two at a time through fp16.
template <typename TKV>
FLASHINFER_DEVICE void load8_to_float(const void* p, float* f) {
  if constexpr (sizeof(TKV) == 2) {
    load16<TKV>(p).to_float(f);
  } else {
    static_assert(sizeof(TKV) == 1, "fp16 / bf16 or fp8 cache elements");
    const uint2 u = *static_cast<const uint2*>(p);
    FLASHINFER_UNROLL
    for (int i = 0; i < 4; ++i) {
      const uint32_t w = i < 2 ? u.x : u.y;
      const float2 v = __half22float2(fp8x2_to_half2<TKV>(w >> (16 * (i & 1))));
      f[2 * i] = v.x;
      f[2 * i + 1] = v.y;
    }
  }
}

}  // namespace flashinfer
