// Launch arithmetic of the state-merge kernels (attention/cascade.h): replaying the kernels'
// thread -> (row, head, vector) map on the CPU, every (row-head, vector) has exactly one
// owner and every row-head's LSE exactly one writer, for vectorised and scalar paths and any
// head_dim (several rounds for wide heads), and for the flat kernel of packed states. Also the
// shape limits, MergeState's passes, the pipeline depth of MergeStates, the 32-bit div_mod and
// validate().
#include <cstdint>
#include <initializer_list>
#include <random>
#include <vector>

#include "check.h"
#include "flashinfer/attention/cascade.h"
#include "flashinfer/occupancy.h"

using namespace flashinfer;
using namespace flashinfer::attention;

namespace {

// Replays the kernels' thread -> (row, head, vector) map (merge_tile, merge_vec_index) over
// the grid of merge_shape(...): every vector has one owner, every LSE one writer.
void check_coverage(int64_t seq_len, int64_t num_heads, int64_t head_dim, int vec_elems, int vecs) {
  const int64_t row_heads = seq_len * num_heads;
  const MergeShape l = merge_shape(row_heads, head_dim, vec_elems, vecs);
  std::vector<int> owners(static_cast<size_t>(row_heads * l.head_vecs), 0);
  std::vector<int> lse_writers(static_cast<size_t>(row_heads), 0);
  for (int64_t b = 0; b < l.blocks; ++b) {
    for (int t = 0; t < l.threads; ++t) {
      const int g = t >> l.group_log2, lane = t & (l.group - 1);
      const int64_t tile = b * l.groups_per_block + g;
      if (tile >= l.tiles) continue;
      int64_t n = -1, h = -1;
      int r = -1;
      merge_tile(l, tile, num_heads, &n, &h, &r);
      CHECK(n >= 0 && n < seq_len && h >= 0 && h < num_heads && r >= 0 && r < l.rounds);
      const int64_t rh = n * num_heads + h;
      for (int i = 0; i < l.vecs; ++i) {
        const int j = merge_vec_index(l, lane, r, i);
        CHECK(j >= 0);
        if (j < l.head_vecs) ++owners[static_cast<size_t>(rh * l.head_vecs + j)];
      }
    }
  }
  // MergeStateKernel's LSE store: after the barrier, thread t < groups_per_block writes the
  // LSE of its block's group t, when that group's tile is round 0 of its row-head.
  for (int64_t b = 0; b < l.blocks; ++b) {
    for (int t = 0; t < l.groups_per_block; ++t) {
      const int64_t tile = b * l.groups_per_block + t;
      if (tile >= l.tiles) continue;
      int64_t n = -1, h = -1;
      int r = -1;
      merge_tile(l, tile, num_heads, &n, &h, &r);
      if (r == 0) ++lse_writers[static_cast<size_t>(n * num_heads + h)];
    }
  }
  CHECK(merge_state_smem(l) == int64_t{l.groups_per_block} * 12);  // an offset and a value per group
  bool all_once = true;
  for (int c : owners) all_once = all_once && c == 1;
  CHECK(all_once);
  for (int c : lse_writers) all_once = all_once && c == 1;
  CHECK(all_once);
}

void check_shape(int64_t row_heads, int64_t head_dim, int vec_elems, int vecs) {
  const MergeShape l = merge_shape(row_heads, head_dim, vec_elems, vecs);
  CHECK(l.vec_elems == vec_elems && l.vecs == vecs);
  CHECK(int64_t{l.head_vecs} * vec_elems == head_dim);
  CHECK(l.group >= 1 && l.group <= 32 && (1 << l.group_log2) == l.group);
  CHECK(32 % l.group == 0);  // a group never straddles a warp
  // The smallest group that covers the head in one round, or 32 lanes and several rounds.
  CHECK(l.rounds >= 1);
  CHECK(int64_t{l.rounds} * l.vecs * l.group >= l.head_vecs);
  if (l.rounds > 1) CHECK(int64_t{l.rounds - 1} * l.vecs * l.group < l.head_vecs);  // no empty round
  if (l.group < 32) CHECK(l.rounds == 1);
  if (l.group > 1) CHECK(int64_t{l.group / 2} * l.vecs < l.head_vecs);
  CHECK(l.tiles == row_heads * l.rounds);
  CHECK(l.threads >= 32 && l.threads <= kMergeThreads && l.threads % 32 == 0 && l.threads % l.group == 0);
  CHECK(l.groups_per_block * l.group == l.threads);
  CHECK(l.threads <= round_up<int64_t>(l.tiles * l.group, 32));  // no idle warp on small problems
  CHECK(l.blocks >= 1 && l.blocks * l.groups_per_block >= l.tiles);
  CHECK((l.blocks - 1) * l.groups_per_block < l.tiles);  // no idle block
  CHECK(l.write_s);
}

}  // namespace

int main() {
  for (int64_t hd : {8, 16, 24, 64, 72, 128, 256, 512, 520, 1024, 2048}) {
    for (int vecs : {1, 2, 4}) {
      for (int64_t seq : {1, 3, 17}) {
        for (int64_t heads : {1, 2, 8, 33}) {
          check_shape(seq * heads, hd, 8, vecs);
          check_shape(seq * heads, hd, 1, vecs);
          check_coverage(seq, heads, hd, 8, vecs);
          if (hd <= 520) check_coverage(seq, heads, hd, 1, vecs);
        }
      }
    }
  }
  // Scalar fallback for head dims no vector divides.
  for (int64_t hd : {1, 3, 7, 9, 111, 200}) {
    for (int64_t seq : {1, 5, 64}) {
      for (int64_t heads : {1, 3, 32}) {
        check_shape(seq * heads, hd, 1, kMergeVecs);
        check_coverage(seq, heads, hd, 1, kMergeVecs);
      }
    }
  }
  // LSE-only shape (second pass of an in-place merge of a wide head): one thread per row-head.
  for (int64_t rh : {1, 31, 33, 1000}) {
    const MergeShape l = merge_shape(rh, 0, 1, kMergeVecs);
    CHECK(l.head_vecs == 0 && l.group == 1 && l.rounds == 1 && l.tiles == rh);
    CHECK(l.blocks * l.groups_per_block >= rh && (l.blocks - 1) * l.groups_per_block < rh);
    check_coverage(rh, 1, 0, 1, kMergeVecs);
  }
  // The benchmark shapes: merge_state 8192 x 32 x 128 bf16 and merge_states 2048 x 32 x 128.
  {
    const MergeShape l = merge_shape(int64_t{8192} * 32, 128, 8, kMergeVecs);
    CHECK(l.group == 8 && l.rounds == 1 && l.threads == 256 && l.groups_per_block == 32 && l.blocks == 8192);
    const MergeShape m = merge_shape(int64_t{2048} * 32, 128, 8, kMergeStatesVecs);
    CHECK(m.group == 8 && m.rounds == 1 && m.threads == 256);
    CHECK(merge_shape(1, 64, 8, 2).group == 4);
    CHECK(merge_shape(1, 256, 8, 2).group == 16);
    CHECK(merge_shape(1, 512, 8, 2).group == 32 && merge_shape(1, 512, 8, 2).rounds == 1);
    CHECK(merge_shape(1, 1024, 8, 2).rounds == 2);
    CHECK(merge_shape(1, 64, 8, 2).threads == 32);  // one (row, head): a single warp
    CHECK(merge_shape(1, 128, 1, 2).rounds == 2);   // scalar path: 64 elements per round
  }
  // Huge problems: the grid stays within gridDim.x for anything that fits in memory.
  {
    const MergeShape l = merge_shape(int64_t{1} << 35, 128, 8, 2);  // 8 TiB of values
    CHECK(l.blocks <= kMergeMaxBlocks);
    check_shape(int64_t{1} << 35, 128, 8, 2);
  }

  // MergeStates pipeline: a stage per state in flight, within shared memory, on an H200.
  {
    DeviceInfo h200;
    const MergeShape l = merge_shape(int64_t{2048} * 32, 128, 8, kMergeStatesVecs);
    const int64_t stage = merge_states_stage_bytes(l.threads);
    CHECK(stage == int64_t{l.threads} * (kMergeStatesVecs * 16 + 4));
    for (int regs : {32, 48, 64, 80}) {
      const StreamConfig c = stream_config(h200, l.blocks, l.threads, regs, stage, kMergeStatesMaxStages);
      CHECK(c.stages >= 2 && c.stages <= kMergeStatesMaxStages && c.smem <= h200.smem_optin);
      CHECK(c.inflight >= kTargetInflightPerSM);
    }
  }

  // MergeState's passes: two only for an in-place merge (s_out is s_a or s_b) of heads that take
  // several rounds; vectors only where head_dim, pointers and strides allow.
  {
    alignas(16) static uint16_t va[64], vb[64], vo[64];  // (2-byte elements: only sizeof(T) matters here)
    alignas(16) static float sa[4], sb[4], so[4];
    auto params = [&](int64_t d, bool in_place, int64_t v_h) {
      MergeStateParams<uint16_t> p{};
      p.v_a = va, p.v_b = vb, p.v_out = in_place ? va : vo;
      p.s_a = sa, p.s_b = sb, p.s_out = in_place ? sa : so;
      p.seq_len = 2, p.num_heads = 3, p.head_dim = d;
      p.a = p.b = p.out = StateStrides{3 * v_h, v_h, 3, 1};
      return p;
    };
    const MergeStatePasses one = merge_state_passes(params(128, true, 128), 1, 128);
    CHECK(one.vec && one.count == 1 && one.pass[0].rounds == 1 && one.pass[0].write_s && one.pass[0].threads <= 128);
    const MergeStatePasses two = merge_state_passes(params(1024, true, 1024), 1, 128);
    CHECK(two.vec && two.count == 2 && two.pass[0].rounds == 4 && !two.pass[0].write_s);
    CHECK(two.pass[1].head_vecs == 0 && two.pass[1].write_s && two.pass[1].tiles == 6);
    const MergeStatePasses out = merge_state_passes(params(1024, false, 1024), 1, 128);
    CHECK(out.count == 1 && out.pass[0].write_s);
    const MergeStatePasses scalar = merge_state_passes(params(111, false, 111), 1, 128);
    CHECK(!scalar.vec && scalar.count == 1 && scalar.pass[0].vecs == kMergeVecs && scalar.pass[0].rounds == 2);
    CHECK(!merge_state_passes(params(128, false, 131), 1, 128).vec);  // a head stride of 131: no vectors
    MergeStateParams<uint16_t> empty = params(128, false, 128);
    empty.seq_len = 0;
    CHECK(merge_state_passes(empty, 1, 128).count == 0);
  }

  // MergeStateFlatKernel (packed states): replaying its thread -> vector map, every vector has
  // one owner, every row-head's LSE one writer (the thread holding its vector 0), a block's
  // vectors are whole row-heads, and its LSE stage holds them; strided, masked, misaligned or
  // non-power-of-two heads take the tile kernel.
  {
    alignas(16) static uint16_t fa[1 << 16], fb[1 << 16], fo[1 << 16];
    alignas(16) static float la[1 << 12], lb[1 << 12], lo[1 << 12];
    auto packed = [&](int64_t seq, int64_t heads, int64_t d) {
      MergeStateParams<uint16_t> p{};
      p.v_a = fa, p.v_b = fb, p.v_out = fo;
      p.s_a = la, p.s_b = lb, p.s_out = lo;
      p.seq_len = seq, p.num_heads = heads, p.head_dim = d;
      p.a = p.b = p.out = StateStrides{heads * d, d, heads, 1};
      return p;
    };
    for (int64_t d : {8, 16, 64, 128, 256}) {
      for (int64_t seq : {1, 3, 17}) {
        for (int64_t heads : {1, 2, 32}) {
          for (int unroll : {1, 2, 4}) {
            for (int threads : {128, 256, 512}) {
              MergeFlatShape l;
              const bool ok = merge_flat_shape(packed(seq, heads, d), true, unroll, threads, &l);
              CHECK(ok == (d / 8 <= threads));
              if (!ok) continue;
              const int64_t hv = d / 8;
              CHECK(l.row_heads == seq * heads && l.vecs == l.row_heads * hv && (int64_t{1} << l.hv_log2) == hv);
              CHECK(l.rows_per_block * hv == int64_t{threads} * unroll);
              std::vector<int> owners(static_cast<size_t>(l.vecs), 0), writers(static_cast<size_t>(l.row_heads), 0);
              for (int64_t b = 0; b < l.blocks; ++b) {
                const int64_t f0 = b * threads * unroll, rh0 = f0 >> l.hv_log2;
                for (int t = 0; t < threads; ++t) {
                  for (int u = 0; u < unroll; ++u) {
                    const int64_t f = f0 + int64_t{u} * threads + t;
                    if (f >= l.vecs) continue;
                    ++owners[static_cast<size_t>(f)];
                    const int64_t slot = (f >> l.hv_log2) - rh0;  // its row-head's LSE stage slot
                    CHECK(slot >= 0 && slot < l.rows_per_block);
                  }
                }
                for (int i = 0; i < l.rows_per_block && rh0 + i < l.row_heads; ++i) ++writers[static_cast<size_t>(rh0 + i)];
              }
              bool once = true;
              for (int c : owners) once = once && c == 1;
              for (int c : writers) once = once && c == 1;
              CHECK(once);
              CHECK(l.blocks == (l.vecs + int64_t{threads} * unroll - 1) / (int64_t{threads} * unroll));
            }
          }
        }
      }
    }
    MergeFlatShape l;
    CHECK(merge_flat_shape(packed(8192, 32, 128), true, 1, 128, &l) && l.blocks == 32768 && l.rows_per_block == 8);
    CHECK(!merge_flat_shape(packed(4, 2, 128), false, 1, 128, &l));  // no 16-byte vectors
    CHECK(!merge_flat_shape(packed(4, 2, 96), true, 1, 128, &l));    // 12 vectors per head
    CHECK(!merge_flat_shape(packed(4, 2, 4096), true, 1, 128, &l));  // a head wider than a block
    MergeStateParams<uint16_t> q = packed(4, 2, 128);
    static const uint8_t mask[4] = {1, 0, 1, 1};
    q.mask = mask;
    CHECK(!merge_flat_shape(q, true, 1, 128, &l));  // masked merges
    q = packed(4, 2, 128);
    q.b.v_n = 3 * 128;  // b's rows have a gap
    CHECK(!merge_flat_shape(q, true, 1, 128, &l));
    q = packed(4, 2, 128);
    q.out.s_h = 2;  // strided LSEs
    CHECK(!merge_flat_shape(q, true, 1, 128, &l));
    q = packed(1, 1, 128);
    q.a = StateStrides{0, 0, 0, 0};  // size-1 dimensions: their strides do not matter
    CHECK(merge_flat_shape(q, true, 1, 128, &l) && l.vecs == 16);
  }

  // div_mod: exact, on both the 32-bit and the 64-bit branch.
  {
    std::mt19937_64 rng(7);
    for (int trial = 0; trial < 20000; ++trial) {
      const int64_t heads = 1 + static_cast<int64_t>(rng() % (trial % 3 == 0 ? 200 : 70000));
      const int64_t limit = trial % 2 ? (int64_t{1} << 31) - 1 : int64_t{1} << 45;
      const int64_t rh = static_cast<int64_t>(rng() % static_cast<uint64_t>(limit));
      int64_t n = -1, h = -1;
      div_mod(rh, heads, &n, &h);
      CHECK(n == rh / heads && h == rh % heads);
    }
    int64_t n = -1, h = -1;
    div_mod(INT32_MAX, 1, &n, &h);
    CHECK(n == INT32_MAX && h == 0);
    div_mod(int64_t{INT32_MAX} + 1, 3, &n, &h);
    CHECK(n == (int64_t{INT32_MAX} + 1) / 3 && h == (int64_t{INT32_MAX} + 1) % 3);
  }

  // vec_aligned: base pointer and both strides.
  {
    alignas(16) static uint16_t buf[64];
    CHECK(vec_aligned(buf, 0, 0, 8, 2));
    CHECK(vec_aligned(buf, 4096, 128, 8, 2));
    CHECK(!vec_aligned(buf + 1, 4096, 128, 8, 2));
    CHECK(!vec_aligned(buf, 4100, 128, 8, 2));
    CHECK(!vec_aligned(buf, 4096, 132, 8, 2));
    CHECK(vec_aligned(buf + 8, -128, 8, 8, 2));
    CHECK(vec_aligned(buf + 1, 3, 5, 1, 2));  // single elements: anything goes
  }

  // validate()
  {
    alignas(16) static uint16_t v[16];
    alignas(16) static float s[2];
    MergeStateParams<uint16_t> p{};
    p.v_a = p.v_b = v;
    p.v_out = v;
    p.s_a = p.s_b = s;
    p.s_out = s;
    p.seq_len = 1, p.num_heads = 2, p.head_dim = 8;
    CHECK(validate(p) == Status::kSuccess);
    p.head_dim = 0;
    CHECK(validate(p) == Status::kInvalidArgument);
    p.head_dim = kMergeMaxHeadDim + 1;
    CHECK(validate(p) == Status::kUnsupported);
    p.head_dim = 8;
    p.seq_len = -1;
    CHECK(validate(p) == Status::kInvalidArgument);
    p.seq_len = 0;
    p.v_b = nullptr;
    CHECK(validate(p) == Status::kSuccess);  // nothing to do
    p.seq_len = 1;
    CHECK(validate(p) == Status::kInvalidArgument);

    MergeStatesParams<uint16_t> q{};
    q.v = v, q.s = s, q.v_out = v, q.s_out = s;
    q.seq_len = 1, q.num_states = 3, q.num_heads = 1, q.head_dim = 8;
    CHECK(validate(q) == Status::kSuccess);
    q.v = nullptr;
    CHECK(validate(q) == Status::kInvalidArgument);
    q.num_states = 0;  // zero states: the empty state, nothing read
    CHECK(validate(q) == Status::kSuccess);
    q.num_states = -1;
    CHECK(validate(q) == Status::kInvalidArgument);
  }
  return test::finish("test_cascade_config");
}
