// RMSNorm / fused-add RMSNorm / LayerNorm: parameters, validation and launch configuration.
// Pure C++17 (no CUDA): the binding fills NormParams, ctest checks the launch arithmetic.
#pragma once

#include <cstdint>

#include "config.h"
#include "device_info.h"
#include "layout.h"
#include "occupancy.h"
#include "status.h"

namespace flashinfer {
namespace norm {

enum class NormKind : int {
  kRMS = 0,          // out = x / rms(x) * (w + weight_offset)
  kFusedAddRMS = 1,  // r = x + residual; residual <- r; x <- r / rms(r) * (w + weight_offset)
  kLayer = 2,        // out = (x - mean) / sqrt(var + eps) * w + bias
};

// T: element type of input/output/residual. WT: element type of weight and bias.
template <typename T, typename WT = T>
struct NormParams {
  T* out;              // [rows, hidden] via out_rows; == input for kFusedAddRMS
  const T* input;      // [rows, hidden] via in_rows
  T* residual;         // [rows, hidden] via res_rows; kFusedAddRMS only
  const WT* weight;    // [hidden], contiguous
  const WT* bias;      // [hidden], contiguous; kLayer only
  int64_t rows;
  int64_t hidden;
  RowLayout in_rows, out_rows, res_rows;
  float eps;
  float weight_offset;  // 0 for RMSNorm, 1 for Gemma's (1 + w)
  bool pdl;             // launch with programmatic dependent launch (sm_90+)
};

// 16-byte vectors of the element type carry this many elements.
template <typename T>
constexpr int kVecElems = 16 / sizeof(T);

// How a row is processed.
//  kWarpRows:  short rows (<= 128 vectors): one warp per row, 8 rows per block, the row in
//              registers.
//  kPipelined: one block per row, blocks persistent over rows; each thread streams its
//              16-byte vectors of upcoming rows into shared memory with cp.async, several
//              rows ahead, so bytes in flight are not bounded by registers.
//  kScalar:    any size or alignment: one block per row, scalar passes over global memory.
enum class NormPath : int { kWarpRows = 0, kPipelined = 1, kScalar = 2 };

struct NormShape {
  NormPath path = NormPath::kScalar;
  int vecs_per_thread = 1;  // 16-byte vectors a thread owns per row: 1, 2, 4 or 8
  int threads = 32;         // block size
  int rows_per_block = 1;   // kWarpRows: 8
};

constexpr int kMaxVecsPerThread = 8;
constexpr int kWarpRowsMaxVecs = 4 * 32;  // <= 1024 16-bit elements: a warp per row
constexpr int kWarpRowsPerBlock = 8;

// vec_elems: elements per 16-byte vector. aligned16: every row start (and weight) is 16-byte
// aligned. Pure arithmetic: no device query.
inline NormShape norm_shape(int64_t hidden, int vec_elems, bool aligned16) {
  NormShape l;
  const int64_t nvec = hidden / vec_elems;
  const bool vectorized = aligned16 && hidden % vec_elems == 0 && nvec > 0 &&
                          nvec <= int64_t{kMaxVecsPerThread} * 1024;
  if (!vectorized) {
    int t = static_cast<int>(hidden >= 1024 ? 1024 : round_up<int64_t>(hidden, 32));
    if (t > 256 && hidden < 4096) t = 256;
    l.threads = t;
    return l;
  }
  if (nvec <= kWarpRowsMaxVecs) {
    l.path = NormPath::kWarpRows;
    l.vecs_per_thread = nvec <= 32 ? 1 : nvec <= 64 ? 2 : 4;
    l.rows_per_block = kWarpRowsPerBlock;
    l.threads = 32 * kWarpRowsPerBlock;
    return l;
  }
  // 256-thread blocks while a thread owns <= 8 vectors (rows up to 2048 vectors), wider after.
  l.path = NormPath::kPipelined;
  int v = 1;
  while (v < kMaxVecsPerThread && ceil_div<int64_t>(nvec, v) > 256) v *= 2;
  l.vecs_per_thread = v;
  l.threads = static_cast<int>(round_up<int64_t>(ceil_div<int64_t>(nvec, v), 32));
  return l;
}

// Shared memory of one pipeline stage: one row of each streamed input, in thread-owned slots.
inline int64_t norm_stage_bytes(const NormShape& l, NormKind kind) {
  const int inputs = kind == NormKind::kFusedAddRMS ? 2 : 1;
  return int64_t{inputs} * l.vecs_per_thread * l.threads * 16;
}

// What the kernels assume; the binding has already produced friendlier messages.
template <typename T, typename WT>
Status validate(const NormParams<T, WT>& p, NormKind kind) {
  if (p.rows < 0 || p.hidden <= 0) return Status::kInvalidArgument;
  if (p.rows > (int64_t{1} << 40)) return Status::kInvalidArgument;
  if (p.in_rows.inner <= 0 || p.out_rows.inner <= 0 || p.res_rows.inner <= 0)
    return Status::kInvalidArgument;
  if (!p.out || !p.input || !p.weight) return p.rows == 0 ? Status::kSuccess : Status::kInvalidArgument;
  if (kind == NormKind::kFusedAddRMS && !p.residual) return Status::kInvalidArgument;
  if (kind == NormKind::kLayer && !p.bias) return Status::kInvalidArgument;
  return Status::kSuccess;
}

}  // namespace norm
}  // namespace flashinfer
