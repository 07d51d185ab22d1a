// Launch plans of the register-resident norm kernel (norm_plan / rows_shape), the tuning
// knobs' parsing, and the flat activation shape: every vector of every row has one owner,
// blocks stay within the kernel's __launch_bounds__, no warp is idle, requests that do not
// fit are adjusted (never rejected), and the default rule picks what norm.h documents.
#include <cstdint>
#include <initializer_list>

#include "check.h"
#include "flashinfer/activation.h"
#include "flashinfer/norm.h"

using namespace flashinfer;
using norm::NormKind;
using norm::NormPath;
using norm::NormShape;
using norm::NormTuning;
using norm::NormVariant;

static NormTuning tuning(NormVariant v, int vpt = 0, int rows = 0) {
  NormTuning t;
  t.variant = v;
  t.vecs_per_thread = vpt;
  t.rows_per_block = rows;
  return t;
}

// Invariants of any plan.
static void check_plan(const NormShape& l, int64_t hidden, int vec_elems, bool aligned) {
  const int64_t nvec = hidden / vec_elems;
  CHECK(l.threads >= 32 && l.threads <= 1024 && l.threads % 32 == 0);
  if (l.path == NormPath::kScalar) return;
  CHECK(aligned && hidden % vec_elems == 0);
  if (l.path != NormPath::kRows) return;
  const int v = l.vecs_per_thread, r = l.rows_per_block;
  CHECK(v == 1 || v == 2 || v == 4 || v == 8);
  CHECK(r == 1 || r == 2 || r == 4);
  CHECK(v * r <= norm::kRowsMaxPerThread);
  CHECK(l.threads <= norm::rows_max_threads(v * r));        // within __launch_bounds__
  CHECK(int64_t{l.threads} * v >= nvec);                    // every vector has an owner
  CHECK(int64_t{l.threads - 32} * v < nvec);                // no idle warp
  CHECK(nvec <= norm::kRowsMaxVecs);
}

int main() {
  const NormKind kinds[] = {NormKind::kRMS, NormKind::kFusedAddRMS, NormKind::kLayer};
  const int64_t hiddens[] = {1, 8, 64, 111, 128, 1024, 1032, 2048, 3072, 4096, 4104, 8192, 8200, 12288,
                             16384, 16392, 24576, 32768, 65536, 65544};
  // Every request over every shape gives a valid plan.
  for (int64_t h : hiddens)
    for (bool aligned : {true, false})
      for (NormKind k : kinds)
        for (int64_t rows : {1, 7, 128, 4096, 32768})
          for (NormVariant var : {NormVariant::kAuto, NormVariant::kRows, NormVariant::kPipe})
            for (int v : {0, 1, 2, 4, 8})
              for (int r : {0, 1, 2, 4}) check_plan(norm::norm_plan(rows, h, 8, aligned, k, tuning(var, v, r)), h, 8, aligned);

  const NormTuning autot;
  auto plan = [&](int64_t rows, int64_t h, NormKind k, const NormTuning& t) { return norm::norm_plan(rows, h, 8, true, k, t); };
  // Default rule: the benchmark shapes.
  {
    NormShape l = plan(32768, 4096, NormKind::kRMS, autot);
    CHECK(l.path == NormPath::kRows && l.vecs_per_thread == 2 && l.rows_per_block == 2 && l.threads == 256);
    l = plan(32768, 8192, NormKind::kRMS, autot);
    CHECK(l.path == NormPath::kRows && l.vecs_per_thread == 4 && l.rows_per_block == 2 && l.threads == 256);
    l = plan(16384, 2048, NormKind::kRMS, autot);  // 256 vectors: one row per block
    CHECK(l.path == NormPath::kRows && l.vecs_per_thread == 2 && l.rows_per_block == 1 && l.threads == 128);
    l = plan(4096, 4096, NormKind::kRMS, autot);
    CHECK(l.path == NormPath::kRows && l.vecs_per_thread == 2 && l.rows_per_block == 1 && l.threads == 256);
    for (int64_t rows : {1, 128}) {
      l = plan(rows, 4096, NormKind::kRMS, autot);
      CHECK(l.path == NormPath::kRows && l.vecs_per_thread == 1 && l.rows_per_block == 1 && l.threads == 512);
    }
    for (int64_t rows : {1, 4096, 32768}) {
      l = plan(rows, 4096, NormKind::kFusedAddRMS, autot);
      CHECK(l.path == NormPath::kRows && l.vecs_per_thread == 1 && l.rows_per_block == (rows >= 16384 ? 2 : 1) &&
            l.threads == 512);
      l = plan(rows, 8192, NormKind::kFusedAddRMS, autot);
      CHECK(l.path == NormPath::kRows && l.vecs_per_thread == 1 && l.rows_per_block == 1 && l.threads == 1024);
      // LayerNorm: register rows (one vector, one row: the shape its fp32 weights compile) up
      // to 512 vectors, wider rows pipelined.
      l = plan(rows, 4096, NormKind::kLayer, autot);
      CHECK(l.path == NormPath::kRows && l.vecs_per_thread == 1 && l.rows_per_block == 1 && l.threads == 512);
      CHECK(plan(rows, 8192, NormKind::kLayer, autot).path == NormPath::kPipelined);
    }
    l = plan(7, 16384, NormKind::kRMS, autot);  // 2048 vectors: two per thread
    CHECK(l.path == NormPath::kRows && l.vecs_per_thread == 2 && l.threads == 1024);
    l = plan(7, 1032, NormKind::kRMS, autot);  // 129 vectors: a 160-thread block, one lane of the last warp
    CHECK(l.path == NormPath::kRows && l.vecs_per_thread == 1 && l.threads == 160);
    CHECK(plan(7, 1024, NormKind::kRMS, autot).path == NormPath::kWarpRows);
    CHECK(plan(7, 32768, NormKind::kRMS, autot).path == NormPath::kPipelined);
    CHECK(plan(7, 4096 + 3, NormKind::kRMS, autot).path == NormPath::kScalar);
    CHECK(norm::norm_plan(7, 4096, 8, false, NormKind::kRMS, autot).path == NormPath::kScalar);
  }
  // Overrides: honoured where they fit, adjusted where not.
  {
    NormShape l = plan(100, 4096, NormKind::kRMS, tuning(NormVariant::kPipe));
    CHECK(l.path == NormPath::kPipelined);
    CHECK(plan(100, 512, NormKind::kRMS, tuning(NormVariant::kPipe)).path == NormPath::kWarpRows);
    l = plan(100, 512, NormKind::kRMS, tuning(NormVariant::kRows));  // warp-sized rows on request
    CHECK(l.path == NormPath::kRows && l.threads == 64);
    l = plan(100, 4096, NormKind::kRMS, tuning(NormVariant::kRows, 4, 2));
    CHECK(l.vecs_per_thread == 4 && l.rows_per_block == 2 && l.threads == 128);
    l = plan(100, 4096, NormKind::kFusedAddRMS, tuning(NormVariant::kRows, 2, 4));
    CHECK(l.vecs_per_thread == 2 && l.rows_per_block == 4 && l.threads == 256);
    // 1024 vectors x 4 rows: v grows to 2 (512 threads > 256 for v x r = 8), then to 4 with r = 2
    l = plan(100, 8192, NormKind::kRMS, tuning(NormVariant::kRows, 1, 4));
    CHECK(l.vecs_per_thread == 4 && l.rows_per_block == 2 && l.threads == 256);
    l = plan(100, 16384, NormKind::kRMS, tuning(NormVariant::kRows, 1, 4));  // 2048 vectors: r shrinks
    CHECK(l.vecs_per_thread == 8 && l.rows_per_block == 1 && l.threads == 256);
    l = plan(100, 4096, NormKind::kRMS, tuning(NormVariant::kRows, 8, 2));  // v x r > 8: r shrinks
    CHECK(l.vecs_per_thread == 8 && l.rows_per_block == 1 && l.threads == 64);
    CHECK(plan(100, 32768, NormKind::kRMS, tuning(NormVariant::kRows, 1, 1)).path == NormPath::kPipelined);
  }
  // rows_shape directly.
  {
    NormShape l;
    CHECK(!norm::rows_shape(0, 1, 1, &l));
    CHECK(!norm::rows_shape(norm::kRowsMaxVecs + 1, 1, 1, &l));
    CHECK(norm::rows_shape(norm::kRowsMaxVecs, 1, 1, &l) && l.vecs_per_thread == 2 && l.threads == 1024);
    CHECK(norm::rows_shape(1, 1, 4, &l) && l.threads == 32 && l.rows_per_block == 4);
  }
  // Environment strings: valid values parse, anything else means auto.
  {
    NormTuning t = norm::norm_tuning_from("rows", "2", "4", "na");
    CHECK(t.variant == NormVariant::kRows && t.vecs_per_thread == 2 && t.rows_per_block == 4 &&
          t.load == norm::NormLoad::kNoAllocate);
    t = norm::norm_tuning_from("pipe", nullptr, nullptr, nullptr);
    CHECK(t.variant == NormVariant::kPipe && t.vecs_per_thread == 0 && t.rows_per_block == 0 &&
          t.load == norm::NormLoad::kPlain);
    t = norm::norm_tuning_from("bogus", "3", "8", "xx");
    CHECK(t.variant == NormVariant::kAuto && t.vecs_per_thread == 0 && t.rows_per_block == 0 &&
          t.load == norm::NormLoad::kPlain);
    t = norm::norm_tuning_from(nullptr, "16", "-1", "plain");
    CHECK(t.variant == NormVariant::kAuto && t.vecs_per_thread == 0 && t.rows_per_block == 0);
    t = norm::norm_tuning_from("", "8", "1", "");
    CHECK(t.variant == NormVariant::kAuto && t.vecs_per_thread == 8 && t.rows_per_block == 1);
    NormVariant v;
    CHECK(norm::parse_norm_variant("auto", &v) && v == NormVariant::kAuto);
    CHECK(!norm::parse_norm_variant("Rows", &v));
  }
  // Flat activation shape: chunks balanced, every vector owned, no idle warp, <= 256 threads.
  for (int64_t nvec : {1, 8, 14, 100, 256, 512, 1000, 1376, 1792, 2048, 4096, 65536}) {
    for (int u : {1, 2, 4, 8}) {
      const activation::ActFlatShape f = activation::act_flat_shape(nvec, u);
      CHECK(f.unroll == u);
      CHECK(f.threads >= 32 && f.threads <= activation::kActFlatMaxThreads && f.threads % 32 == 0);
      CHECK(f.chunks_per_row * f.threads * u >= nvec);
      CHECK((f.chunks_per_row - 1) * f.threads * u < nvec);  // the last chunk is not empty
      CHECK(int64_t{f.threads - 32} * u * f.chunks_per_row < nvec);  // no idle warp in any chunk
      CHECK(f.chunks_per_row <= activation::kMaxGridY);
    }
  }
  {
    const activation::ActFlatShape f = activation::act_flat_shape(1792, 4);  // silu_and_mul 14336
    CHECK(f.chunks_per_row == 2 && f.threads == 224);
    activation::ActTuning t = activation::act_tuning_from("pipe", "8");
    CHECK(t.variant == activation::ActVariant::kPipe && t.unroll == 8);
    t = activation::act_tuning_from("flat", "3");
    CHECK(t.variant == activation::ActVariant::kFlat && t.unroll == 0);
    t = activation::act_tuning_from("x", nullptr);
    CHECK(t.variant == activation::ActVariant::kAuto && t.unroll == 0);
  }
  return test::finish("test_norm_plan");
}
