// RMSNorm / fused-add RMSNorm / LayerNorm: parameters, validation and launch configuration.
// Pure C++17 (no CUDA): the binding fills NormParams, ctest checks the launch arithmetic.
#pragma once

#include <cstdint>

#include "config.h"
#include "layout.h"
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

// The shape of a launch. The vectorised path holds a whole row in registers: each of
// `threads_per_row` threads owns `vecs_per_thread` 16-byte vectors; rows_per_block rows
// share a block (one warp each) when rows are short. The scalar path loops over the row.
struct NormLaunch {
  bool vectorized = false;
  int vecs_per_thread = 1;  // one of 1, 2, 4, 8
  int threads_per_row = 32;
  int rows_per_block = 1;
  int threads = 32;  // block size
  int64_t blocks = 0;
};

constexpr int kMaxVecsPerThread = 8;
constexpr int kWarpRowsMaxVecs = 4 * 32;  // rows up to 128 vectors (1024 16-bit elements): a warp each

// vec_elems: elements per 16-byte vector. aligned16: every row start (and weight) is 16-byte
// aligned. Pure arithmetic: no device query.
inline NormLaunch norm_launch_config(int64_t rows, int64_t hidden, int vec_elems, bool aligned16,
                                     NormKind kind) {
  NormLaunch l;
  const int64_t nvec = hidden / vec_elems;
  l.vectorized = aligned16 && hidden % vec_elems == 0 && nvec > 0 &&
                 nvec <= int64_t{kMaxVecsPerThread} * 1024;
  if (!l.vectorized) {
    l.threads_per_row = static_cast<int>(hidden >= 1024 ? 1024 : round_up<int64_t>(hidden, 32));
    if (l.threads_per_row < 32) l.threads_per_row = 32;
    if (l.threads_per_row > 256 && hidden < 4096) l.threads_per_row = 256;
    l.rows_per_block = 1;
    l.threads = l.threads_per_row;
    l.blocks = rows;
    return l;
  }
  if (nvec <= kWarpRowsMaxVecs) {
    l.vecs_per_thread = nvec <= 32 ? 1 : nvec <= 64 ? 2 : 4;
    l.threads_per_row = 32;
    l.rows_per_block = 8;
  } else {
    // Prefer 256-thread blocks (8 resident per SM keeps ~64 KiB per SM in flight); the
    // fused kernel keeps fp32 sums of two inputs, so it moves to wider blocks sooner.
    const int64_t max_vecs_at_256 = kind == NormKind::kFusedAddRMS ? 4 : 8;
    int v = 1;
    while (v < max_vecs_at_256 && ceil_div<int64_t>(nvec, v) > 256) v *= 2;
    while (v < kMaxVecsPerThread && ceil_div<int64_t>(nvec, v) > 1024) v *= 2;
    l.vecs_per_thread = v;
    l.threads_per_row = static_cast<int>(round_up<int64_t>(ceil_div<int64_t>(nvec, v), 32));
    l.rows_per_block = 1;
  }
  l.threads = l.threads_per_row * l.rows_per_block;
  l.blocks = ceil_div<int64_t>(rows, l.rows_per_block);
  return l;
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
