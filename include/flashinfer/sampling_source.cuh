// The block-wide Source of sampling.h's loop drivers: passes over one row (its leading tiles
// cached in shared memory), a per-chunk mass table so a draw re-reads one chunk instead of
// scanning the row, and a gathered candidate list in shared memory. All threads of the block
// call every member alike.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>

#include "config.h"
#include "sampling.h"
#include "sampling_block.cuh"
#include "sampling_params.h"
#include "vec_dtypes.cuh"

namespace flashinfer {
namespace sampling {

// One row of T, 16 bytes per thread per tile; NaN past the end (its key is below every pivot,
// so padding is never counted, gathered or picked).
template <typename T>
struct RowReader {
  static constexpr int kVec = 16 / sizeof(T);
  using Raw = Vec<T, kVec>;
  const T* row = nullptr;
  int n = 0;
  int cache_elems = 0;   // elements [0, cache_elems) live in shared memory from offset 0
  bool aligned = false;  // row start 16-byte aligned

  FLASHINFER_DEVICE static T* cache() { return reinterpret_cast<T*>(blk::sampling_smem + kScratchBytes); }

  // Elements i .. i + kVec - 1 (i a multiple of kVec). kGlobal: bypass the cache (first pass).
  template <bool kGlobal>
  FLASHINFER_DEVICE Raw fetch(int i) const {
    Raw v;
    if (!kGlobal && i < cache_elems) {
      v = *reinterpret_cast<const Raw*>(cache() + i);
    } else if (aligned && i + kVec <= n) {
      v.load(row + i);
    } else {
      FLASHINFER_UNROLL
      for (int e = 0; e < kVec; ++e) v.v[e] = i + e < n ? row[i + e] : from_float<T>(NAN);
    }
    return v;
  }
  FLASHINFER_DEVICE void fill(int i, const Raw& v) const {
    if (i < cache_elems) *reinterpret_cast<Raw*>(cache() + i) = v;
  }
  FLASHINFER_DEVICE static void to_float(const Raw& v, float (&f)[kVec]) { v.to_float(f); }
  // Element i (< n) as stored.
  FLASHINFER_DEVICE T at(int i) const { return i < cache_elems ? cache()[i] : row[i]; }
};

// relu(target - draft) of two fp32 rows (speculative resampling); nothing cached.
struct DiffReader {
  static constexpr int kVec = 4;
  using Raw = Vec<float, 4>;
  const float* target = nullptr;
  const float* draft = nullptr;
  int n = 0;
  bool aligned = false;  // both rows 16-byte aligned

  template <bool kGlobal>
  FLASHINFER_DEVICE Raw fetch(int i) const {
    Raw t, d;
    if (aligned && i + kVec <= n) {
      t.load(target + i);
      d.load(draft + i);
      FLASHINFER_UNROLL
      for (int e = 0; e < kVec; ++e) t.v[e] = fmaxf(t.v[e] - d.v[e], 0.f);
    } else {
      FLASHINFER_UNROLL
      for (int e = 0; e < kVec; ++e) t.v[e] = i + e < n ? fmaxf(target[i + e] - draft[i + e], 0.f) : NAN;
    }
    return t;
  }
  FLASHINFER_DEVICE void fill(int, const Raw&) const {}
  FLASHINFER_DEVICE static void to_float(const Raw& v, float (&f)[kVec]) { v.to_float(f); }
};

template <class Reader>
struct GlobalSource {
  static constexpr int kVec = Reader::kVec;
  static constexpr int kSV = kStepVecs<kVec>;
  using Raw = typename Reader::Raw;

  Reader rd;
  const ScanLayout& L;  // a __grid_constant__ kernel parameter
  int passes = 0;  // passes over the row (first, aggregates, gathers)
  bool listed = false;
  int list_n = 0;
  int base_cnt = 0;
  float base_sum = 0.f;

  // [chunks][warps][kTableCols] per-warp chunk masses of the last pass
  FLASHINFER_DEVICE float* table() const { return reinterpret_cast<float*>(blk::sampling_smem + L.off_table); }
  // [chunks][kTableCols] chunk masses of the last pass
  FLASHINFER_DEVICE float* csum() const { return reinterpret_cast<float*>(blk::sampling_smem + L.off_csum); }
  FLASHINFER_DEVICE float* list_val() const { return reinterpret_cast<float*>(blk::sampling_smem + L.off_list_val); }
  FLASHINFER_DEVICE int* list_idx() const { return reinterpret_cast<int*>(blk::sampling_smem + L.off_list_idx); }

  FLASHINFER_DEVICE int elem(int step, int k) const {
    return ((step * kSV + k) * L.threads + static_cast<int>(threadIdx.x)) * kVec;
  }
  FLASHINFER_DEVICE int step_end(int c) const {
    const int e = (c + 1) * L.steps_per_chunk;
    return e < L.steps ? e : L.steps;
  }

  // Count and mass above each pivot over the whole row; chunk masses into table/csum. kFirst
  // (P == 1): also the row's max, min above the pivot and NaN flag, and fill the cache.
  template <int P, bool kFirst>
  FLASHINFER_DEVICE void row_pass(const uint32_t (&piv)[P], int (&cnt)[P], float (&sum)[P], RowStats* st) {
    const int lane = blk::lane(), w = blk::warp(), nw = blk::warps();
    int c_acc[P];
    FLASHINFER_UNROLL
    for (int m = 0; m < P; ++m) c_acc[m] = 0;
    float mx = -INFINITY, mn = INFINITY;
    bool nan = false;
    for (int c = 0; c < L.chunks; ++c) {
      float s[P];
      FLASHINFER_UNROLL
      for (int m = 0; m < P; ++m) s[m] = 0.f;
      for (int step = c * L.steps_per_chunk; step < step_end(c); ++step) {
        Raw raw[kSV];
        FLASHINFER_UNROLL
        for (int k = 0; k < kSV; ++k) raw[k] = rd.template fetch<kFirst>(elem(step, k));
        if (kFirst) {
          FLASHINFER_UNROLL
          for (int k = 0; k < kSV; ++k) rd.fill(elem(step, k), raw[k]);
        }
        FLASHINFER_UNROLL
        for (int k = 0; k < kSV; ++k) {
          float f[kVec];
          Reader::to_float(raw[k], f);
          FLASHINFER_UNROLL
          for (int e = 0; e < kVec; ++e) {
            const float x = f[e];
            const uint32_t key = order_key(x);
            FLASHINFER_UNROLL
            for (int m = 0; m < P; ++m) {
              const bool gt = key > piv[m];
              c_acc[m] += gt ? 1 : 0;
              s[m] += gt ? x : 0.f;
            }
            if (kFirst) {
              nan |= x != x && elem(step, k) + e < rd.n;  // (padding is NaN)
              mx = fmaxf(mx, x);
              if (key > piv[0]) mn = fminf(mn, x);
            }
          }
        }
      }
      FLASHINFER_UNROLL
      for (int m = 0; m < P; ++m) {
        const float ws = blk::warp_sum(s[m]);
        if (lane == 0) table()[(c * nw + w) * kTableCols + m] = ws;
      }
    }
    __syncthreads();
    for (int c = w; c < L.chunks; c += nw) {
      FLASHINFER_UNROLL
      for (int m = 0; m < P; ++m) {
        const float v = blk::warp_sum(lane < nw ? table()[(c * nw + lane) * kTableCols + m] : 0.f);
        if (lane == 0) csum()[c * kTableCols + m] = v;
      }
    }
    __syncthreads();
    FLASHINFER_UNROLL
    for (int m = 0; m < P; ++m) {
      float tot = 0.f;  // the same fold pick() walks, so a draw below it always lands
      for (int c = 0; c < L.chunks; ++c) tot += csum()[c * kTableCols + m];
      sum[m] = tot;
    }
    blk::sum<P>(c_acc, blk::scratch().i);
    FLASHINFER_UNROLL
    for (int m = 0; m < P; ++m) cnt[m] = c_acc[m];
    if (kFirst) {
      st->max = blk::max(mx);
      st->min = blk::min(mn);
      st->has_nan = blk::max(nan ? 1 : 0) != 0;
      st->count = cnt[0];
      st->total = sum[0];
    }
    ++passes;
  }

  // Pass 0: stats of the elements above `pivot`, and column 0 of the table for them.
  FLASHINFER_DEVICE RowStats first_pass(uint32_t pivot) {
    const uint32_t piv[1] = {pivot};
    int cnt[1];
    float sum[1];
    RowStats st;
    row_pass<1, true>(piv, cnt, sum, &st);
    return st;
  }

  // Thread t owns list positions [t * per, (t + 1) * per): thread order is list order.
  FLASHINFER_DEVICE void list_span(int* begin, int* end) const {
    const int per = (list_n + static_cast<int>(blockDim.x) - 1) / static_cast<int>(blockDim.x);
    const int b = static_cast<int>(threadIdx.x) * per;
    *begin = b < list_n ? b : list_n;
    *end = b + per < list_n ? b + per : list_n;
  }

  template <int P>
  FLASHINFER_DEVICE void aggregate(const uint32_t (&piv)[P], int (&cnt)[P], float (&sum)[P]) {
    if (!listed) {
      row_pass<P, false>(piv, cnt, sum, nullptr);
      return;
    }
    int b, e;
    list_span(&b, &e);
    FLASHINFER_UNROLL
    for (int m = 0; m < P; ++m) {
      cnt[m] = 0;
      sum[m] = 0.f;
    }
    for (int j = b; j < e; ++j) {
      const float x = list_val()[j];
      const uint32_t key = order_key(x);
      FLASHINFER_UNROLL
      for (int m = 0; m < P; ++m) {
        const bool gt = key > piv[m];
        cnt[m] += gt ? 1 : 0;
        sum[m] += gt ? x : 0.f;
      }
    }
    blk::sum<P>(cnt, blk::scratch().i);
    blk::sum<P>(sum, blk::scratch().f);
    FLASHINFER_UNROLL
    for (int m = 0; m < P; ++m) {
      cnt[m] += base_cnt;
      sum[m] += base_sum;
    }
  }

  FLASHINFER_DEVICE bool in_list() const { return listed; }
  FLASHINFER_DEVICE int list_capacity() const { return L.list_cap; }
  // Every element above the list's lower end is in the list.
  FLASHINFER_DEVICE bool list_has_all() const { return listed && base_cnt == 0; }
  // Back to passes over the row (the list does not hold every candidate).
  FLASHINFER_DEVICE void unlist() { listed = false; }

  // Copies the elements with lo < key <= hi (value, index) to the list, in (step, thread,
  // vector, element) order: a block scan per step places each thread's matches.
  FLASHINFER_DEVICE void gather(uint32_t lo, uint32_t hi, int bc, float bs) {
    int base = 0;
    for (int step = 0; step < L.steps; ++step) {
      Raw raw[kSV];
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) raw[k] = rd.template fetch<false>(elem(step, k));
      int mine = 0;
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        float f[kVec];
        Reader::to_float(raw[k], f);
        FLASHINFER_UNROLL
        for (int e = 0; e < kVec; ++e) {
          const uint32_t key = order_key(f[e]);
          mine += (key > lo && key <= hi) ? 1 : 0;
        }
      }
      int total = 0;
      int pos = base + blk::exclusive_scan(mine, blk::scratch().i, &total);
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        float f[kVec];
        Reader::to_float(raw[k], f);
        FLASHINFER_UNROLL
        for (int e = 0; e < kVec; ++e) {
          const uint32_t key = order_key(f[e]);
          if (key > lo && key <= hi) {
            if (pos < L.list_cap) {
              list_val()[pos] = f[e];
              list_idx()[pos] = elem(step, k) + e;
            }
            ++pos;
          }
        }
      }
      base += total;
    }
    __syncthreads();
    list_n = base < L.list_cap ? base : L.list_cap;
    listed = true;
    base_cnt = bc;
    base_sum = bs;
    ++passes;
  }

  // Broadcasts the value of element `index` held by the thread with mine == index.
  FLASHINFER_DEVICE Pick broadcast(int index, int mine, float mine_value) {
    if (mine == index) blk::scratch().value = mine_value;
    __syncthreads();
    Pick p;
    p.index = index;
    p.value = blk::scratch().value;
    __syncthreads();
    return p;
  }

  FLASHINFER_DEVICE Pick pick(uint32_t low, int column, float u) {
    if (listed) return list_pick(low, u);
    // The chunk whose running mass first exceeds u, folding csum exactly as row_pass did.
    float run = 0.f;
    int c = 0;
    for (; c < L.chunks; ++c) {
      const float m = csum()[c * kTableCols + column];
      if (run + m > u) break;
      run += m;
    }
    if (c == L.chunks) {  // u rounded up to the total: the last chunk with mass, at its end
      c = L.chunks - 1;
      while (c > 0 && !(csum()[c * kTableCols + column] > 0.f)) --c;
      return resolve(low, c, INFINITY);
    }
    return resolve(low, c, u - run);
  }

  // Within chunk c: the candidate (key > low) where the candidates' running mass exceeds u.
  FLASHINFER_DEVICE Pick resolve(uint32_t low, int c, float u) {
    float run = 0.f;
    int last = -1;  // this thread's last candidate in the chunk
    float last_x = 0.f;
    for (int step = c * L.steps_per_chunk; step < step_end(c); ++step) {
      Raw raw[kSV];
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) raw[k] = rd.template fetch<false>(elem(step, k));
      float s[kSV];
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        float f[kVec];
        Reader::to_float(raw[k], f);
        s[k] = 0.f;
        FLASHINFER_UNROLL
        for (int e = 0; e < kVec; ++e) {
          if (order_key(f[e]) > low) {
            s[k] += f[e];
            last = elem(step, k) + e;
            last_x = f[e];
          }
        }
      }
      float tile[kSV];
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) tile[k] = s[k];
      blk::sum<kSV>(tile, blk::scratch().f);
      int hit = -1;
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        if (hit < 0) {
          if (run + tile[k] > u) {
            hit = k;
          } else {
            run += tile[k];
          }
        }
      }
      if (hit < 0) continue;
      // Tile `hit` holds the crossing: scan the threads' masses, walk the crossing thread.
      float mine_s = 0.f;
      Raw mine_raw = raw[0];
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        if (k == hit) {
          mine_s = s[k];
          mine_raw = raw[k];
        }
      }
      const float excl = blk::exclusive_scan(mine_s, blk::scratch().f, static_cast<float*>(nullptr));
      const float target = u - run;
      const int i0 = elem(step, hit);
      float f[kVec];
      Reader::to_float(mine_raw, f);
      int cand = 0x7fffffff, tile_last = -1;
      float cand_x = 0.f, tile_last_x = 0.f;
      float acc = excl;
      FLASHINFER_UNROLL
      for (int e = 0; e < kVec; ++e) {
        if (order_key(f[e]) > low) {
          acc += f[e];
          if (cand == 0x7fffffff && excl <= target && acc > target) {
            cand = i0 + e;
            cand_x = f[e];
          }
          tile_last = i0 + e;
          tile_last_x = f[e];
        }
      }
      const int first = blk::min(cand);
      if (first != 0x7fffffff) return broadcast(first, cand, cand_x);
      return broadcast(blk::max(tile_last), tile_last, tile_last_x);  // rounding fell short
    }
    return broadcast(blk::max(last), last, last_x);  // rounding fell short in every tile
  }

  // The same walk over the list (thread spans in list order).
  FLASHINFER_DEVICE Pick list_pick(uint32_t low, float u) {
    int b, e;
    list_span(&b, &e);
    float s = 0.f;
    int last = -1;
    for (int j = b; j < e; ++j) {
      if (order_key(list_val()[j]) > low) {
        s += list_val()[j];
        last = j;
      }
    }
    const float excl = blk::exclusive_scan(s, blk::scratch().f, static_cast<float*>(nullptr));
    int cand = 0x7fffffff;
    float acc = excl;
    for (int j = b; j < e && cand == 0x7fffffff; ++j) {
      const float x = list_val()[j];
      if (order_key(x) > low) {
        acc += x;
        if (excl <= u && acc > u) cand = j;
      }
    }
    int pos = blk::min(cand);
    if (pos == 0x7fffffff) pos = blk::max(last);
    Pick p;
    p.index = pos >= 0 ? list_idx()[pos] : -1;
    p.value = pos >= 0 ? list_val()[pos] : 0.f;
    return p;
  }
};

template <class Reader>
FLASHINFER_DEVICE GlobalSource<Reader> make_source(const Reader& rd, const ScanLayout& L) {
  return GlobalSource<Reader>{rd, L};
}

}  // namespace sampling
}  // namespace flashinfer
