// RMSNorm / fused-add RMSNorm / LayerNorm: parameters, validation and launch configuration.
// Pure C++17 (no CUDA): the binding fills NormParams, ctest checks the launch arithmetic.
#pragma once

#include <cstdint>
#include <cstdlib>
#include <cstring>

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

enum class Fp8Kind : int { kE4M3 = 0, kE5M2 = 1 };

// The fp8 norms (norm_quant.cuh). T: input / residual element type; WT: weight (and LayerNorm bias) element type (T for the
// RMSNorms, float for LayerNorm).
template <typename T, typename WT>
struct NormQuantParams {
  uint8_t* out;             // [rows, hidden] fp8 bytes via out_rows
  const T* input;           // [rows, hidden] via in_rows
  T* residual;              // kFusedAddRMS: via res_rows, receives input + residual (rounded)
  const WT* weight;         // [hidden]
  const WT* bias;           // [hidden], kLayer only
  const float* scale_ptr;   // a device scalar, or null: `scale`
  float scale;
  int64_t rows, hidden;
  RowLayout in_rows, out_rows, res_rows;
  float eps;
  Fp8Kind fp8;
  bool pdl;
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
//  kRows:      rows of 129..2048 vectors (the default there): one block per group of
//              rows_per_block rows, not persistent; every thread loads its vectors of all the
//              group's rows (and the weight) before one block reduction, so a block's whole
//              working set is in flight at once and no setup precedes the loads.
enum class NormPath : int { kWarpRows = 0, kPipelined = 1, kScalar = 2, kRows = 3 };

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

// --- kRows: launch shape, run-time tuning ------------------------------------------------

// Block-size bound of a kRows kernel whose threads hold `per_thread` = vecs x rows vectors of
// each input: it sets the kernel's __launch_bounds__ (register budget 64 / 64 / 128 / 255).
FLASHINFER_HOST_DEVICE constexpr int rows_max_threads(int per_thread) {
  return per_thread <= 2 ? 1024 : per_thread <= 4 ? 512 : 256;
}
constexpr int kRowsMaxPerThread = 8;   // vecs_per_thread x rows_per_block
constexpr int64_t kRowsMaxVecs = 2048;  // widest row the kRows path holds in registers

// Which kernel family handles vectorisable rows. kAuto: see norm_plan().
enum class NormVariant : int { kAuto = 0, kRows = 1, kPipe = 2 };
// Loads of the streamed rows in the kRows kernel: plain ld.global, or
// ld.global.L1::no_allocate.L2::256B. (ld.global.cs, evict-first, measured 1-3% slower than
// plain on the H200: benchmarks/NOTES.md, session 16.)
enum class NormLoad : int { kPlain = 0, kNoAllocate = 1 };

// Benchmark knobs, read once from the environment (tests may overwrite norm_tuning()):
//   FLASHINFER_NORM_VARIANT = auto | rows | pipe
//   FLASHINFER_NORM_VPT     = 0 (auto) | 1 | 2 | 4 | 8   vectors per thread per row (kRows)
//   FLASHINFER_NORM_ROWS    = 0 (auto) | 1 | 2 | 4       rows per block (kRows)
//   FLASHINFER_NORM_LOAD    = plain | na                 (kRows)
// A request that does not fit a shape is adjusted (see norm_plan), never an error.
struct NormTuning {
  NormVariant variant = NormVariant::kAuto;
  int vecs_per_thread = 0;
  int rows_per_block = 0;
  NormLoad load = NormLoad::kPlain;
};

inline bool parse_norm_variant(const char* s, NormVariant* v) {
  if (!s || !*s || !std::strcmp(s, "auto")) return *v = NormVariant::kAuto, true;
  if (!std::strcmp(s, "rows")) return *v = NormVariant::kRows, true;
  if (!std::strcmp(s, "pipe")) return *v = NormVariant::kPipe, true;
  return false;
}
inline bool parse_norm_load(const char* s, NormLoad* l) {
  if (!s || !*s || !std::strcmp(s, "plain")) return *l = NormLoad::kPlain, true;
  if (!std::strcmp(s, "na")) return *l = NormLoad::kNoAllocate, true;
  return false;
}
// vecs_per_thread / rows_per_block values: 0 (auto) or a power of two up to `max`.
inline bool valid_tuning_count(int n, int max) { return n == 0 || (n > 0 && n <= max && (n & (n - 1)) == 0); }

// Unknown or invalid environment values mean auto.
inline NormTuning norm_tuning_from(const char* variant, const char* vpt, const char* rows, const char* load) {
  NormTuning t;
  if (!parse_norm_variant(variant, &t.variant)) t.variant = NormVariant::kAuto;
  if (!parse_norm_load(load, &t.load)) t.load = NormLoad::kPlain;
  const int v = vpt ? std::atoi(vpt) : 0, r = rows ? std::atoi(rows) : 0;
  t.vecs_per_thread = valid_tuning_count(v, kMaxVecsPerThread) ? v : 0;
  t.rows_per_block = valid_tuning_count(r, 4) ? r : 0;
  return t;
}

// The process-wide knobs (one instance per module: an inline function's static).
inline NormTuning& norm_tuning() {
  static NormTuning t = norm_tuning_from(std::getenv("FLASHINFER_NORM_VARIANT"), std::getenv("FLASHINFER_NORM_VPT"),
                                         std::getenv("FLASHINFER_NORM_ROWS"), std::getenv("FLASHINFER_NORM_LOAD"));
  return t;
}

// kRows shape for a row of nvec vectors starting from the requested (v, r): v doubles until
// the block fits rows_max_threads(v * r); r halves when v * r would exceed the register
// budget. Returns false when no shape fits (rows wider than kRowsMaxVecs).
inline bool rows_shape(int64_t nvec, int v, int r, NormShape* l) {
  if (nvec <= 0 || nvec > kRowsMaxVecs) return false;
  for (;;) {
    while (v * r > kRowsMaxPerThread && r > 1) r /= 2;
    if (v * r > kRowsMaxPerThread) return false;
    const int64_t threads = round_up<int64_t>(ceil_div<int64_t>(nvec, v), 32);
    if (threads <= rows_max_threads(v * r)) {
      l->path = NormPath::kRows;
      l->vecs_per_thread = v;
      l->rows_per_block = r;
      l->threads = static_cast<int>(threads);
      return true;
    }
    if (v < kMaxVecsPerThread) {
      v *= 2;
    } else {
      return false;
    }
  }
}

// The launch shape of a call. Default (kAuto) rule, by vectors per row nvec:
//   nvec <= 128:        kWarpRows (a warp per row)
//   nvec <= 2048:       kRows with one vector per thread per row (a block of nvec threads,
//                       FlashInfer's fused-add shape) where that fits 1024 threads, else two;
//                       over >= 16384 rows, RMSNorm of >= 512 vectors and fused-add of <= 512
//                       vectors take two rows per block (more loads in flight per thread),
//                       everything else one. LayerNorm of > 512 vectors: kPipelined.
//   wider:              kPipelined (rows streamed through shared memory)
// Not vectorisable (alignment, hidden % vec_elems): kScalar. `t` overrides (see NormTuning):
// pipe takes norm_shape()'s choice (warp-sized rows stay kWarpRows); rows takes kRows for
// every row of <= kRowsMaxVecs vectors, warp-sized ones included.
inline NormShape norm_plan(int64_t rows, int64_t hidden, int vec_elems, bool aligned16, NormKind kind,
                           const NormTuning& t) {
  const NormShape base = norm_shape(hidden, vec_elems, aligned16);
  if (base.path == NormPath::kScalar) return base;
  const int64_t nvec = hidden / vec_elems;
  if (t.variant == NormVariant::kPipe || (t.variant == NormVariant::kAuto && base.path == NormPath::kWarpRows))
    return base;
  // LayerNorm over rows of > 512 vectors: the pipelined kernel (32768 x 8192 bf16 on the H200:
  // 425.7 vs 486.4 us). Up to 512 vectors the register rows measured as fast or faster since
  // the plain loads of session 16 (4096 x 4096 31.2 vs 37.0 us, 128 rows 6.6-6.9 vs 8.0, 32768
  // rows 201.3 vs 201.9).
  if (t.variant == NormVariant::kAuto && kind == NormKind::kLayer && nvec > 512) return base;
  // Defaults measured on the H200 (bf16, % of the copy ceiling; benchmarks/NOTES.md):
  // RMSNorm with >= 1024 rows takes 2 vectors per thread (4096 x 4096: 70% vs 58%; 32768 x 4096:
  // 90.0% vs 88.4%), fewer rows keep 1 (128 x 4096: 5.5 vs 5.9 us). Over >= 16384 rows of >= 512
  // vectors it takes 2 rows per block, and 4 vectors per thread from 1024 vectors (session 16,
  // plain loads and stores, us: 32768 x 4096 v2r2 131.8 (gemma) vs v2r4 135.5 vs v2r1 137.8;
  // x 8192 v4r2 265.9 vs v2r2 269.0). Fused add: 1 vector per thread, 2 rows per block for
  // >= 16384 rows of <= 512 vectors (92.2% vs 90.9%; 4 rows: 270.0 vs 266.4). LayerNorm: 1
  // vector per thread, 1 row (its fp32 weights compile that shape and v2r1 only: Norm()).
  int v = t.vecs_per_thread, r = t.rows_per_block;
  const bool rms = kind == NormKind::kRMS, fused = kind == NormKind::kFusedAddRMS;
  const bool many_rows = rows >= 16384;
  if (v == 0) v = rms && many_rows && nvec >= 1024 ? 4 : nvec > 1024 || (rms && rows >= 1024) ? 2 : 1;
  if (r == 0) r = many_rows && ((rms && nvec >= 512) || (fused && nvec <= 512)) ? 2 : 1;
  NormShape l;
  if (rows_shape(nvec, v, r, &l)) return l;
  return base;  // too wide for registers: kPipelined (or kScalar)
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
