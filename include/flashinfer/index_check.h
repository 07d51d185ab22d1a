// Opt-in index checking (FLASHINFER_CHECK_INDICES=1 in Python). Kernels always skip an index
// that would reach outside a tensor; given an error record they also note it there, and the
// binding reads the record back and raises. Pure C++17; the device path uses atomics.
#pragma once

#include <cstdint>

#include "config.h"

namespace flashinfer {

// err[0]: OR of the op's error bits; err[1]: INT32_MAX - (first offending row), so a zeroed
// record means "no error" and a max keeps the smallest row.
constexpr int kIndexErrorWords = 2;

FLASHINFER_HOST_DEVICE void record_index_error(int32_t* err, int32_t bits, int64_t row) {
  if (err == nullptr) return;
  const int64_t r = row < 0 ? 0 : (row > 0x7ffffffe ? 0x7ffffffe : row);
  const int32_t key = static_cast<int32_t>(0x7fffffff - r);
#if defined(__CUDA_ARCH__)
  atomicOr(err, bits);
  atomicMax(err + 1, key);
#else
  err[0] |= bits;
  if (key > err[1]) err[1] = key;
#endif
}

inline int64_t first_error_row(const int32_t* err) { return int64_t{0x7fffffff} - err[1]; }

}  // namespace flashinfer
