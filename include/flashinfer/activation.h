// Gated activations act(x1) * x2 over [..., 2H] -> [..., H]: parameters and launch arithmetic.
// Pure C++17.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

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

// Vectorised (16-byte, aligned) rows take the flat kernel (ActFlatShape, below) or, when
// FLASHINFER_ACT_VARIANT=pipe, a persistent pipelined kernel over tiles of (row, column
// chunk) shaped by ActShape; anything else takes a scalar kernel over a (rows, column
// blocks) grid (ActShape's threads).
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

// --- flat: the default kernel for vectorised rows ----------------------------------------
// Not persistent: a grid of (rows, column chunks); each thread loads `unroll` 16-byte vectors
// of the gate half and of the up half (2 * unroll loads in flight) before any math, then
// stores. No cache hints: evict-first (.cs) measured 7% slower (NOTES.md, session 16). Chunks
// are balanced so the last one is not mostly idle.
constexpr int kActFlatMaxThreads = 256;
constexpr int kActFlatDefaultUnroll = 4;

struct ActFlatShape {
  int unroll = kActFlatDefaultUnroll;  // 1, 2, 4 or 8 vectors of each half per thread
  int threads = 32;
  int64_t chunks_per_row = 1;  // chunk c covers vectors [c * threads * unroll, ...)
};

inline ActFlatShape act_flat_shape(int64_t nvec, int unroll) {
  ActFlatShape l;
  l.unroll = unroll;
  const int64_t per_chunk_max = int64_t{kActFlatMaxThreads} * unroll;
  l.chunks_per_row = ceil_div<int64_t>(nvec > 0 ? nvec : 1, per_chunk_max);
  l.threads = static_cast<int>(round_up<int64_t>(ceil_div<int64_t>(nvec > 0 ? nvec : 1, l.chunks_per_row * unroll), 32));
  return l;
}

// Benchmark knobs, read once from the environment (tests may overwrite act_tuning()):
//   FLASHINFER_ACT_VARIANT = auto | flat | pipe   (auto = flat)
//   FLASHINFER_ACT_UNROLL  = 0 (auto: 4) | 1 | 2 | 4 | 8   vectors of each half per thread (flat)
enum class ActVariant : int { kAuto = 0, kFlat = 1, kPipe = 2 };

struct ActTuning {
  ActVariant variant = ActVariant::kAuto;
  int unroll = 0;
};

inline bool parse_act_variant(const char* s, ActVariant* v) {
  if (!s || !*s || !std::strcmp(s, "auto")) return *v = ActVariant::kAuto, true;
  if (!std::strcmp(s, "flat")) return *v = ActVariant::kFlat, true;
  if (!std::strcmp(s, "pipe")) return *v = ActVariant::kPipe, true;
  return false;
}
inline bool valid_act_unroll(int u) { return u == 0 || u == 1 || u == 2 || u == 4 || u == 8; }

// Unknown or invalid environment values mean auto.
inline ActTuning act_tuning_from(const char* variant, const char* unroll) {
  ActTuning t;
  if (!parse_act_variant(variant, &t.variant)) t.variant = ActVariant::kAuto;
  const int u = unroll ? std::atoi(unroll) : 0;
  t.unroll = valid_act_unroll(u) ? u : 0;
  return t;
}

inline ActTuning& act_tuning() {
  static ActTuning t = act_tuning_from(std::getenv("FLASHINFER_ACT_VARIANT"), std::getenv("FLASHINFER_ACT_UNROLL"));
  return t;
}

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
