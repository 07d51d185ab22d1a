// Philox4x32-10 (Salmon et al., "Parallel random numbers: as easy as 1, 2, 3", SC'11), the
// counter-based generator behind curand's Philox4_32_10, and the uniform floats the samplers
// draw from it. Pure C++17: kernels and the CPU tests share it.
#pragma once

#include <cstdint>

#include "config.h"

namespace flashinfer {

struct Philox4x32 {
  uint32_t v[4];
};

namespace detail {

constexpr uint32_t kPhiloxM0 = 0xD2511F53u;  // multiplies counter word 0
constexpr uint32_t kPhiloxM1 = 0xCD9E8D57u;  // multiplies counter word 2
constexpr uint32_t kPhiloxW0 = 0x9E3779B9u;  // key schedule (golden ratio)
constexpr uint32_t kPhiloxW1 = 0xBB67AE85u;  // key schedule (sqrt(3) - 1)

FLASHINFER_HOST_DEVICE uint32_t mulhi32(uint32_t a, uint32_t b) {
#if defined(__CUDA_ARCH__)
  return __umulhi(a, b);
#else
  return static_cast<uint32_t>((uint64_t{a} * b) >> 32);
#endif
}

}  // namespace detail

// The 128-bit block for `counter` under the 64-bit `key`: ten rounds, key bumped between rounds.
FLASHINFER_HOST_DEVICE Philox4x32 philox4x32_10(Philox4x32 c, uint32_t k0, uint32_t k1) {
  FLASHINFER_HD_UNROLL
  for (int r = 0; r < 10; ++r) {
    if (r > 0) {
      k0 += detail::kPhiloxW0;
      k1 += detail::kPhiloxW1;
    }
    const uint32_t hi0 = detail::mulhi32(detail::kPhiloxM0, c.v[0]);
    const uint32_t lo0 = detail::kPhiloxM0 * c.v[0];
    const uint32_t hi1 = detail::mulhi32(detail::kPhiloxM1, c.v[2]);
    const uint32_t lo1 = detail::kPhiloxM1 * c.v[2];
    c = Philox4x32{{hi1 ^ c.v[1] ^ k0, lo1, hi0 ^ c.v[3] ^ k1, lo0}};
  }
  return c;
}

// The random stream of one output row. Block `b` of stream (seed, offset, subsequence) is
// philox(counter = {b, subsequence, offset_lo, offset_hi}, key = seed): a different offset or
// subsequence gives an unrelated stream, so any change of offset draws fresh numbers (the
// generator advances it by at least the number of draws a call makes).
struct PhiloxStream {
  uint64_t seed;
  uint64_t offset;
  uint32_t subsequence;

  FLASHINFER_HOST_DEVICE Philox4x32 block(uint32_t b) const {
    const Philox4x32 ctr{{b, subsequence, static_cast<uint32_t>(offset), static_cast<uint32_t>(offset >> 32)}};
    return philox4x32_10(ctr, static_cast<uint32_t>(seed), static_cast<uint32_t>(seed >> 32));
  }
  // Word n of the stream (4 words per block).
  FLASHINFER_HOST_DEVICE uint32_t word(uint32_t n) const {
    const Philox4x32 b = block(n >> 2);
    const uint32_t j = n & 3u;  // selects, not an index: keeps the block in registers
    return j == 0u ? b.v[0] : (j == 1u ? b.v[1] : (j == 2u ? b.v[2] : b.v[3]));
  }
};

// A uniform float in [0, 1): the top 24 bits, so every value is exact and 1 is unreachable.
FLASHINFER_HOST_DEVICE float uniform_co(uint32_t x) { return static_cast<float>(x >> 8) * 0x1p-24f; }

// A uniform float in (0, 1): 23 bits centred in their cells, so neither end is reachable and
// -log(u) is finite and positive (Gumbel and exponential variates).
FLASHINFER_HOST_DEVICE float uniform_oo(uint32_t x) {
  return (static_cast<float>(x >> 9) + 0.5f) * 0x1p-23f;
}

}  // namespace flashinfer
