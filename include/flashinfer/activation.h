// Gated activations act(x1) * x2 over [..., 2H] -> [..., H]: parameters and launch arithmetic.
// Pure C++17.
#pragma once

#include <cstdint>

#include "config.h"
#include "layout.h"
#include "status.h"

namespace flashinfer {
namespace activation {

enum class ActKind : int {
  kSilu = 0,      // x * sigmoid(x)
  kGelu = 1,      // exact: 0.5 x (1 + erf(x / sqrt(2)))
  kGeluTanh = 2,  // 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
};

template <typename T>
struct ActParams {
  T* out;          // [rows, hidden] via out_rows
  const T* input;  // [rows, 2 * hidden] via in_rows: gate half first, then the up half
  int64_t rows;
  int64_t hidden;
  RowLayout in_rows, out_rows;
  bool pdl;
};

// Vectorised (16-byte, aligned) rows stream through a persistent, cp.async-pipelined kernel
// over tiles of (row, column chunk); anything else takes a scalar kernel over a
// (rows, column blocks) grid.
struct ActShape {
  int vec_elems = 1;  // 16 / sizeof(T) when vectorised, else 1
  int threads = 256;
  int64_t chunks_per_row = 1;  // column chunks of threads * kActUnroll vectors
};

constexpr int kActUnroll = 2;  // vectors of each half a thread owns per tile
constexpr int64_t kMaxGridY = 65535;

inline ActShape act_shape(int64_t hidden, int vec16_elems, bool aligned16) {
  ActShape l;
  l.vec_elems = aligned16 && hidden % vec16_elems == 0 ? vec16_elems : 1;
  const int64_t nvec = hidden / l.vec_elems;
  l.threads = static_cast<int>(nvec >= 256 * kActUnroll ? 256 : round_up<int64_t>(ceil_div<int64_t>(nvec, kActUnroll), 32));
  l.chunks_per_row = ceil_div<int64_t>(nvec, int64_t{l.threads} * kActUnroll);
  return l;
}

// Shared memory of one pipeline stage: both halves of one tile.
inline int64_t act_stage_bytes(const ActShape& l) { return int64_t{2} * kActUnroll * l.threads * 16; }

template <typename T>
Status validate(const ActParams<T>& p) {
  if (p.rows < 0 || p.hidden <= 0) return Status::kInvalidArgument;
  if (p.rows > 0 && (!p.out || !p.input)) return Status::kInvalidArgument;
  if (p.in_rows.inner <= 0 || p.out_rows.inner <= 0) return Status::kInvalidArgument;
  // The scalar path's grid.y covers columns: 65535 * 256 threads * 2 is ~33M elements per row.
  if (ceil_div<int64_t>(p.hidden, 256 * kActUnroll) > kMaxGridY) return Status::kUnsupported;
  return Status::kSuccess;
}

}  // namespace activation
}  // namespace flashinfer
