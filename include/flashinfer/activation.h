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

struct ActLaunch {
  int vec_elems = 1;  // 16-byte vectors when aligned, else scalar
  int threads = 256;
  int64_t row_blocks = 0;  // grid.x (rows; the kernel loops past the cap)
  int64_t col_blocks = 0;  // grid.y
};

constexpr int kActUnroll = 4;  // vectors per thread, loaded before any is used
constexpr int64_t kMaxGridY = 65535;

inline ActLaunch act_launch_config(int64_t rows, int64_t hidden, int vec16_elems, bool aligned16) {
  ActLaunch l;
  l.vec_elems = aligned16 && hidden % vec16_elems == 0 ? vec16_elems : 1;
  const int64_t nvec = hidden / l.vec_elems;
  const int64_t per_thread = kActUnroll;
  l.threads = static_cast<int>(nvec >= 256 * per_thread ? 256 : round_up<int64_t>(ceil_div<int64_t>(nvec, per_thread), 32));
  l.col_blocks = ceil_div<int64_t>(nvec, int64_t{l.threads} * per_thread);
  l.row_blocks = rows;
  return l;
}

template <typename T>
Status validate(const ActParams<T>& p) {
  if (p.rows < 0 || p.hidden <= 0) return Status::kInvalidArgument;
  if (p.rows > 0 && (!p.out || !p.input)) return Status::kInvalidArgument;
  if (p.in_rows.inner <= 0 || p.out_rows.inner <= 0) return Status::kInvalidArgument;
  // grid.y covers columns: 65535 * 256 threads * 4 vectors is ~67M elements per row.
  if (ceil_div<int64_t>(p.hidden, 256 * kActUnroll) > kMaxGridY) return Status::kUnsupported;
  return Status::kSuccess;
}

}  // namespace activation
}  // namespace flashinfer
