// norm_launch_config() / act_launch_config(): a launch covers every element of every row
// exactly once and stays inside the hardware limits, for many shapes.
#include <cstdint>
#include <initializer_list>

#include "check.h"
#include "flashinfer/activation.h"
#include "flashinfer/dispatch.h"
#include "flashinfer/norm.h"

using namespace flashinfer;
using norm::NormKind;

static void check_norm(int64_t rows, int64_t hidden, int vec_elems, bool aligned, NormKind kind) {
  const norm::NormLaunch l = norm::norm_launch_config(rows, hidden, vec_elems, aligned, kind);
  CHECK(l.threads >= 32 && l.threads <= 1024 && l.threads % 32 == 0);
  CHECK(l.threads == l.threads_per_row * l.rows_per_block);
  CHECK(l.blocks * l.rows_per_block >= rows);
  CHECK((l.blocks - 1) * l.rows_per_block < rows || rows == 0);
  if (l.vectorized) {
    CHECK(aligned && hidden % vec_elems == 0);
    CHECK(l.vecs_per_thread == 1 || l.vecs_per_thread == 2 || l.vecs_per_thread == 4 ||
          l.vecs_per_thread == 8);
    const int64_t nvec = hidden / vec_elems;
    // every vector of the row has an owner, and no thread is wholly idle beyond one warp
    CHECK(int64_t{l.threads_per_row} * l.vecs_per_thread >= nvec);
    if (l.rows_per_block == 1) CHECK(int64_t{l.threads_per_row - 32} * l.vecs_per_thread < nvec);
  } else {
    CHECK(l.rows_per_block == 1);
  }
}

int main() {
  const NormKind kinds[] = {NormKind::kRMS, NormKind::kFusedAddRMS, NormKind::kLayer};
  for (NormKind k : kinds) {
    for (int64_t h : {1, 7, 64, 111, 128, 500, 1024, 2048, 3072, 3584, 4096, 8192, 16384, 65536, 65544, 70000}) {
      for (int64_t rows : {0, 1, 7, 8, 9, 128, 4096, 32768}) {
        check_norm(rows, h, 8, true, k);
        check_norm(rows, h, 8, false, k);
        check_norm(rows, h, 4, true, k);
      }
    }
  }
  // The shapes the benchmark targets take the register-resident path with 256-thread blocks.
  for (int64_t h : {4096, 8192}) {
    auto l = norm::norm_launch_config(32768, h, 8, true, NormKind::kRMS);
    CHECK(l.vectorized && l.threads == 256 && l.rows_per_block == 1);
  }
  CHECK(!norm::norm_launch_config(4, 111, 8, true, NormKind::kRMS).vectorized);
  CHECK(!norm::norm_launch_config(4, 4096, 8, false, NormKind::kRMS).vectorized);
  CHECK(norm::norm_launch_config(4, 128, 8, true, NormKind::kRMS).rows_per_block == 8);

  for (int64_t h : {1, 3, 8, 64, 128, 4096, 11008, 14336, 16384}) {
    for (bool aligned : {true, false}) {
      auto l = activation::act_launch_config(5, h, 8, aligned);
      CHECK(l.vec_elems == (aligned && h % 8 == 0 ? 8 : 1));
      const int64_t nvec = h / l.vec_elems;
      CHECK(l.threads % 32 == 0 && l.threads <= 1024);
      CHECK(l.col_blocks * l.threads * activation::kActUnroll >= nvec);
      CHECK((l.col_blocks - 1) * l.threads * activation::kActUnroll < nvec);
      CHECK(l.row_blocks == 5);
    }
  }

  // with_int: hits call f with the constant, misses report kUnsupported.
  int seen = 0;
  CHECK(with_int<1, 2, 4>(4, [&](auto v) { seen = decltype(v)::value; return Status::kSuccess; }) == Status::kSuccess);
  CHECK(seen == 4);
  CHECK(with_int<1, 2, 4>(3, [&](auto) { return Status::kSuccess; }) == Status::kUnsupported);
  return test::finish("test_norm_config");
}
