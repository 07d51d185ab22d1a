// The cluster-wide Source of sampling.h's loop drivers (sm_90): one thread-block cluster per
// output row, CTA r owning a contiguous slice of the row (sampling_params.h: ClusterSplit,
// slice_layout) kept whole in its shared memory. Each CTA runs the same driver loop on the same
// values: aggregate() runs the block-wide pass over the slice (GlobalSource), publishes the
// slice's counts and masses, and folds every CTA's in rank order after one cluster barrier, so
// every CTA holds bitwise identical totals; pick() finds the CTA whose slice holds the running
// mass's crossing (the fold in rank order again), lets it resolve the element in its slice and
// broadcasts it. Element order is (rank, then the slice's own order), a fixed order as
// sampling.h requires. No candidate list: later passes read shared memory.
//
// Exchange safety: slots are written, a cluster barrier passes, then read; a slot is written
// again only after a later barrier, which no CTA reaches before it finished reading (the
// aggregate slots alternate between two buffers; one pick is always followed by an aggregate
// or the kernel's final barrier before the next pick). Only warp 0, whose thread 0 writes every
// slot, arrives at these barriers with release semantics (cl::sync_warp0); the other warps'
// reads of peers' slots have returned their values (stored locally before a __syncthreads)
// before they arrive, so a later overwrite cannot reach them.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#if defined(__CUDACC__) && !defined(FLASHINFER_SAMPLING_EMULATED_CLUSTER)
#include <cooperative_groups.h>
#endif

#include "config.h"
#include "sampling.h"
#include "sampling_block.cuh"
#include "sampling_params.h"
#include "sampling_source.cuh"

namespace flashinfer {
namespace sampling {
namespace cl {

#if !defined(FLASHINFER_SAMPLING_EMULATED_CLUSTER)
// Cluster barrier with release/acquire semantics: shared-memory writes before it are visible
// to every CTA of the cluster after it. Every thread of every CTA must call it.
FLASHINFER_DEVICE void sync() {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 900
  cooperative_groups::this_cluster().sync();
#else
  __trap();  // the launcher never runs the cluster path below sm_90
#endif
#endif
}

// A cluster barrier that publishes the shared-memory writes warp 0 made before it (every
// exchange's writer is thread 0): warp 0 arrives with release semantics, the other warps
// relaxed. A release arrive is a GPU-scope memory barrier (MEMBAR.ALL.GPU, an L2 round trip)
// in each warp that executes it; cooperative_groups' sync() makes every warp pay it.
FLASHINFER_DEVICE void sync_warp0() {
#if defined(__CUDA_ARCH__)
#if __CUDA_ARCH__ >= 900
  if (threadIdx.x < 32) {
    asm volatile("barrier.cluster.arrive.release;\n" ::: "memory");
  } else {
    asm volatile("barrier.cluster.arrive.relaxed;\n" ::: "memory");
  }
  asm volatile("barrier.cluster.wait;\n" ::: "memory");
#else
  __trap();
#endif
#endif
}

// `p` (in this CTA's shared memory) in the shared memory of the cluster's CTA `rank`.
template <typename T>
FLASHINFER_DEVICE T* peer(T* p, int rank) {
#if defined(__CUDA_ARCH__) && __CUDA_ARCH__ >= 900
  return cooperative_groups::this_cluster().map_shared_rank(p, rank);
#else
  (void)rank;
  return p;
#endif
}
#endif  // (an emulator supplies cl::sync, cl::sync_warp0 and cl::peer)

}  // namespace cl

template <class Reader>
struct ClusterSource {
  GlobalSource<Reader> local;  // this CTA's slice (indices relative to the slice)
  int rank = 0;
  int size = 1;
  int base = 0;   // the slice's first element in the row
  int phase = 0;  // which of the two published slots the next exchange writes

  FLASHINFER_DEVICE unsigned char* area() const { return blk::sampling_smem + local.L.off_cluster; }
  FLASHINFER_DEVICE ClusterSlot* slot(int k) const { return reinterpret_cast<ClusterSlot*>(area()) + k; }
  FLASHINFER_DEVICE ClusterPick* pick_slot() const { return reinterpret_cast<ClusterPick*>(area() + 2 * sizeof(ClusterSlot)); }
  // every rank's slot of the last exchange, copied into this CTA's shared memory
  FLASHINFER_DEVICE ClusterSlot* ranks() const {
    return reinterpret_cast<ClusterSlot*>(area() + 2 * sizeof(ClusterSlot) + sizeof(ClusterPick));
  }
  // their fold (warp 0 writes it, every thread reads it)
  FLASHINFER_DEVICE ClusterSlot* folded() const { return ranks() + kMaxCluster; }

  // Publishes this CTA's P columns (and first-pass stats), then folds every rank's in rank order.
  template <int P>
  FLASHINFER_DEVICE void exchange(int (&cnt)[P], float (&sum)[P], RowStats* st) {
    ClusterSlot* mine = slot(phase);
    if (threadIdx.x == 0) {
      FLASHINFER_UNROLL
      for (int m = 0; m < P; ++m) {
        mine->sum[m] = sum[m];
        mine->cnt[m] = cnt[m];
      }
      if (st) {
        mine->max = st->max;
        mine->min = st->min;
        mine->nan = st->has_nan ? 1 : 0;
      }
    }
    cl::sync_warp0();
    constexpr int kWords = static_cast<int>(sizeof(ClusterSlot) / 16);
    for (int j = static_cast<int>(threadIdx.x); j < size * kWords; j += static_cast<int>(blockDim.x)) {
      const int r = j / kWords, w = j % kWords;
      const int4* src = reinterpret_cast<const int4*>(cl::peer(mine, r)) + w;
      reinterpret_cast<int4*>(ranks() + r)[w] = *src;
    }
    __syncthreads();
    // Warp 0 folds in rank order, one value per lane (lane m: column m's mass, lane 8 + m its
    // count, lane 16 the first-pass stats); every thread then reads the fold, a few loads
    // instead of every rank's slot (16 ranks x 16 values x 8 warps of broadcast loads).
    const ClusterSlot* all = ranks();
    ClusterSlot* fold = folded();
    const int l = static_cast<int>(threadIdx.x);
    if (l < P) {
      float s = 0.f;
      for (int r = 0; r < size; ++r) s += all[r].sum[l];
      fold->sum[l] = s;
    } else if (l >= kTableCols && l < kTableCols + P) {
      int c = 0;
      for (int r = 0; r < size; ++r) c += all[r].cnt[l - kTableCols];
      fold->cnt[l - kTableCols] = c;
    } else if (l == 2 * kTableCols && st) {
      float mx = all[0].max, mn = all[0].min;
      int nan = all[0].nan;
      for (int r = 1; r < size; ++r) {
        mx = fmaxf(mx, all[r].max);
        mn = fminf(mn, all[r].min);
        nan |= all[r].nan;
      }
      fold->max = mx;
      fold->min = mn;
      fold->nan = nan;
    }
    __syncthreads();
    FLASHINFER_UNROLL
    for (int m = 0; m < P; ++m) {
      cnt[m] = fold->cnt[m];
      sum[m] = fold->sum[m];
    }
    if (st) {
      st->max = fold->max;
      st->min = fold->min;
      st->has_nan = fold->nan != 0;
      st->count = cnt[0];
      st->total = sum[0];
    }
    phase ^= 1;
  }

  FLASHINFER_DEVICE RowStats first_pass(uint32_t pivot) {
    RowStats st = local.first_pass(pivot);
    int cnt[1] = {st.count};
    float sum[1] = {st.total};
    exchange<1>(cnt, sum, &st);
    return st;
  }

  template <int P>
  FLASHINFER_DEVICE void aggregate(const uint32_t (&piv)[P], int (&cnt)[P], float (&sum)[P]) {
    local.template aggregate<P>(piv, cnt, sum);
    exchange<P>(cnt, sum, nullptr);
  }

  // The rank whose slice holds the crossing of u (the same fold as exchange()), the owner
  // resolves it in its slice, every CTA reads the owner's answer.
  FLASHINFER_DEVICE Pick pick(uint32_t low, int column, float u) {
    const ClusterSlot* all = ranks();
    float run = 0.f;
    int owner = -1;
    for (int r = 0; r < size; ++r) {
      const float m = all[r].sum[column];
      if (run + m > u) {
        owner = r;
        break;
      }
      run += m;
    }
    float rest = u - run;
    if (owner < 0) {  // u rounded up to the total: the last candidate of the last slice with mass
      owner = size - 1;
      while (owner > 0 && !(all[owner].sum[column] > 0.f)) --owner;
      rest = INFINITY;
    }
    ClusterPick* mine = pick_slot();
    if (owner == rank) {  // (uniform per CTA: every thread computed the same owner)
      const Pick p = local.pick(low, column, rest);
      if (threadIdx.x == 0) {
        mine->index = p.index >= 0 ? base + p.index : -1;
        mine->value = p.value;
      }
    }
    cl::sync_warp0();
    const ClusterPick* src = cl::peer(mine, owner);
    Pick p;
    p.index = src->index;
    p.value = src->value;
    return p;
  }

  // No candidate list: the slices stay in shared memory, so aggregates are cheap already.
  FLASHINFER_DEVICE bool in_list() const { return false; }
  FLASHINFER_DEVICE int list_capacity() const { return -1; }  // select_threshold never gathers
  FLASHINFER_DEVICE bool list_has_all() const { return false; }
  FLASHINFER_DEVICE void unlist() {}
  FLASHINFER_DEVICE void gather(uint32_t, uint32_t, int, float) {}
  FLASHINFER_DEVICE int passes() const { return local.passes; }
};

}  // namespace sampling
}  // namespace flashinfer
