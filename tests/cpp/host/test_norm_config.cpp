// Launch arithmetic of the row-wise kernels (norm.h, activation.h, occupancy.h): every
// element of every row has exactly one owner, blocks stay inside hardware limits, and the
// pipeline depth keeps the promised bytes in flight without exceeding shared memory.
#include <cstdint>
#include <initializer_list>

#include "check.h"
#include "flashinfer/activation.h"
#include "flashinfer/dispatch.h"
#include "flashinfer/norm.h"
#include "flashinfer/occupancy.h"

using namespace flashinfer;
using norm::NormKind;
using norm::NormPath;

static void check_shape(int64_t hidden, int vec_elems, bool aligned) {
  const norm::NormShape l = norm::norm_shape(hidden, vec_elems, aligned);
  CHECK(l.threads >= 32 && l.threads <= 1024 && l.threads % 32 == 0);
  const int64_t nvec = hidden / vec_elems;
  if (l.path == NormPath::kScalar) {
    CHECK(l.rows_per_block == 1);
    return;
  }
  CHECK(aligned && hidden % vec_elems == 0);
  CHECK(l.vecs_per_thread == 1 || l.vecs_per_thread == 2 || l.vecs_per_thread == 4 || l.vecs_per_thread == 8);
  const int per_row = l.path == NormPath::kWarpRows ? 32 : l.threads;
  CHECK(l.threads == per_row * l.rows_per_block);
  CHECK(int64_t{per_row} * l.vecs_per_thread >= nvec);                // every vector has an owner
  if (l.path == NormPath::kPipelined) CHECK(int64_t{per_row - 32} * l.vecs_per_thread < nvec);  // no idle warp
}

int main() {
  for (int64_t h : {1, 7, 64, 111, 128, 500, 1024, 1032, 2048, 3072, 3584, 4096, 8192, 16384, 65536, 65544, 70000}) {
    check_shape(h, 8, true);
    check_shape(h, 8, false);
    check_shape(h, 4, true);
  }
  // Paths the benchmark shapes take.
  CHECK(norm::norm_shape(4096, 8, true).path == NormPath::kPipelined);
  CHECK(norm::norm_shape(4096, 8, true).threads == 256);
  CHECK(norm::norm_shape(8192, 8, true).threads == 256);
  CHECK(norm::norm_shape(128, 8, true).path == NormPath::kWarpRows);
  CHECK(norm::norm_shape(111, 8, true).path == NormPath::kScalar);
  CHECK(norm::norm_shape(4096, 8, false).path == NormPath::kScalar);

  // Pipeline depth on an H200-like device and a smaller one.
  DeviceInfo h200;  // defaults: 132 SMs, 228 KiB smem per SM
  DeviceInfo small;
  small.num_sms = 46, small.smem_per_sm = 100 * 1024, small.smem_optin = 99 * 1024, small.max_threads_per_sm = 1536;
  for (const DeviceInfo& dev : {h200, small}) {
    for (int64_t h : {1032, 4096, 8192, 16384, 32768}) {
      for (NormKind k : {NormKind::kRMS, NormKind::kFusedAddRMS, NormKind::kLayer}) {
        const norm::NormShape l = norm::norm_shape(h, 8, true);
        const int64_t stage = norm::norm_stage_bytes(l, k);
        for (int64_t rows : {1, 7, 4096, 32768}) {
          const StreamConfig c = stream_config(dev, rows, l.threads, 40, stage);
          if (c.stages == 0) {  // only allowed when two stages cannot fit one block
            CHECK(2 * stage + 1024 > dev.smem_per_sm || 2 * stage > dev.smem_optin);
            continue;
          }
          CHECK(c.stages >= 2 && c.stages <= 8);
          CHECK(c.smem == c.stages * stage && c.smem <= dev.smem_optin);
          CHECK(c.blocks_per_sm >= 1);
          CHECK(int64_t{c.blocks_per_sm} * (c.smem + 1024) <= dev.smem_per_sm);
          CHECK(c.blocks_per_sm * l.threads <= dev.max_threads_per_sm);
          CHECK(c.grid >= 1 && c.grid <= rows && c.grid <= int64_t{dev.num_sms} * c.blocks_per_sm);
          if (rows >= int64_t{dev.num_sms} * c.blocks_per_sm) CHECK(c.grid == int64_t{dev.num_sms} * c.blocks_per_sm);
        }
      }
    }
  }
  // The main benchmark shape reaches the in-flight target on an H200.
  {
    const norm::NormShape l = norm::norm_shape(4096, 8, true);
    const StreamConfig c = stream_config(h200, 32768, l.threads, 40, norm::norm_stage_bytes(l, NormKind::kRMS));
    CHECK(c.inflight >= kTargetInflightPerSM);
  }
  // blocks_per_sm: registers, threads and shared memory each bind.
  CHECK(blocks_per_sm(h200, 256, 32, 0) == 8);
  CHECK(blocks_per_sm(h200, 256, 128, 0) == 2);
  CHECK(blocks_per_sm(h200, 256, 32, 100 * 1024) == 2);

  for (int64_t h : {1, 3, 8, 64, 128, 4096, 11008, 14336, 16384}) {
    for (bool aligned : {true, false}) {
      auto l = activation::act_shape(h, 8, aligned);
      CHECK(l.vec_elems == (aligned && h % 8 == 0 ? 8 : 1));
      const int64_t nvec = h / l.vec_elems;
      CHECK(l.threads % 32 == 0 && l.threads <= 1024);
      CHECK(l.chunks_per_row * l.threads * activation::kActUnroll >= nvec);
      CHECK((l.chunks_per_row - 1) * l.threads * activation::kActUnroll < nvec);
    }
  }

  // with_int: hits call f with the constant, misses report kUnsupported.
  int seen = 0;
  CHECK(with_int<1, 2, 4>(4, [&](auto v) { seen = decltype(v)::value; return Status::kSuccess; }) == Status::kSuccess);
  CHECK(seen == 4);
  CHECK(with_int<1, 2, 4>(3, [&](auto) { return Status::kSuccess; }) == Status::kUnsupported);
  return test::finish("test_norm_config");
}
