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

// One row of T, 16 bytes per thread per tile; `pad` past the end. -inf (the default) is never
// >= key_floor(piv) for a pivot piv >= kKeyNegInf, so padding is never counted, gathered or
// picked, and a NaN in the row is x != x with no index test. A kernel with pivots below
// kKeyNegInf (TopK: every number counts, -inf too) pads with NaN instead (has_nan then
// includes the padding).
template <typename T>
struct RowReader {
  static constexpr bool kCached = true;  // leading elements in shared memory (cache_elems)
  static constexpr int kVec = 16 / sizeof(T);
  using Raw = Vec<T, kVec>;
  const T* row = nullptr;
  int n = 0;
  int cache_elems = 0;   // elements [0, cache_elems) live in shared memory from offset 0
  bool aligned = false;  // row start 16-byte aligned
  float pad = -INFINITY;

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
      for (int e = 0; e < kVec; ++e) v.v[e] = i + e < n ? row[i + e] : from_float<T>(pad);
    }
    return v;
  }
  // One step: the S vectors at i0, i0 + tile, ... (tile: elements per tile). One test for the
  // whole step on the fast paths (all cached; all past the cache, in range and aligned).
  template <bool kGlobal, int S>
  FLASHINFER_DEVICE void fetch_step(int i0, int tile, Raw (&raw)[S]) const {
    const int last = i0 + (S - 1) * tile;
    if (!kGlobal && last < cache_elems) {
      const T* c = cache() + i0;
      FLASHINFER_UNROLL
      for (int k = 0; k < S; ++k) raw[k] = *reinterpret_cast<const Raw*>(c + k * tile);
    } else if (aligned && last + kVec <= n && (kGlobal || i0 >= cache_elems)) {
      const T* r = row + i0;
      FLASHINFER_UNROLL
      for (int k = 0; k < S; ++k) raw[k].load(r + k * tile);
    } else {
      FLASHINFER_UNROLL
      for (int k = 0; k < S; ++k) raw[k] = fetch<kGlobal>(i0 + k * tile);
    }
  }
  FLASHINFER_DEVICE void fill(int i, const Raw& v) const {
    if (i < cache_elems) *reinterpret_cast<Raw*>(cache() + i) = v;
  }
  template <int S>
  FLASHINFER_DEVICE void fill_step(int i0, int tile, const Raw (&raw)[S]) const {
    if (i0 + (S - 1) * tile < cache_elems) {
      T* c = cache() + i0;
      FLASHINFER_UNROLL
      for (int k = 0; k < S; ++k) *reinterpret_cast<Raw*>(c + k * tile) = raw[k];
    } else if (i0 < cache_elems) {
      FLASHINFER_UNROLL
      for (int k = 0; k < S; ++k) fill(i0 + k * tile, raw[k]);
    }
  }
  FLASHINFER_DEVICE static void to_float(const Raw& v, float (&f)[kVec]) { v.to_float(f); }
  // Element i (< n) as stored.
  FLASHINFER_DEVICE T at(int i) const { return i < cache_elems ? cache()[i] : row[i]; }
};

// relu(target - draft) of two fp32 rows (speculative resampling); nothing cached; -inf past
// the end.
struct DiffReader {
  static constexpr bool kCached = false;
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
      for (int e = 0; e < kVec; ++e) t.v[e] = i + e < n ? fmaxf(target[i + e] - draft[i + e], 0.f) : -INFINITY;
    }
    return t;
  }
  template <bool kGlobal, int S>
  FLASHINFER_DEVICE void fetch_step(int i0, int tile, Raw (&raw)[S]) const {
    FLASHINFER_UNROLL
    for (int k = 0; k < S; ++k) raw[k] = fetch<kGlobal>(i0 + k * tile);
  }
  FLASHINFER_DEVICE void fill(int, const Raw&) const {}
  template <int S>
  FLASHINFER_DEVICE void fill_step(int, int, const Raw (&)[S]) const {}
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
  // Chunk c lies wholly in the shared-memory cache.
  FLASHINFER_DEVICE bool chunk_cached(int c) const {
    if constexpr (Reader::kCached) {
      return int64_t{step_end(c)} * kSV * L.tile <= rd.cache_elems;
    } else {
      return false;
    }
  }
  FLASHINFER_DEVICE int step_end(int c) const {
    const int e = (c + 1) * L.steps_per_chunk;
    return e < L.steps ? e : L.steps;
  }

  // Count and mass above each pivot over the whole row; chunk masses into table/csum. kFirst
  // (P == 1): also the row's max, min above the pivot and NaN flag, and fill the cache.
  // Elements are compared as floats against key_floor of the pivots. Each thread keeps kG
  // partial counts / masses / extremes per pivot (vector k feeds partial k % kG), so kG
  // independent add chains per pivot, folded in a fixed order: deterministic. Counts are
  // floats (a predicated add each; exact: a thread sees far fewer than 2^24 elements).
  //
  // early (P == 1, later passes): after each chunk (L.early == 2: each chunk read wholly from
  // the shared-memory cache, so no barrier drains loads in flight from global memory), the
  // mass of the candidates at or below piv[0] so far (the chunk's mass in column
  // early->column of the last pass, minus its mass above piv[0]) is compared with
  // early->bound; once above it the pass stops and returns true (the table and sums are then
  // incomplete).
  struct Early {
    int column;
    float bound;
  };
  template <int P, bool kFirst>
  FLASHINFER_DEVICE bool row_pass(const uint32_t (&piv)[P], int (&cnt)[P], float (&sum)[P], RowStats* st,
                                  const Early* early = nullptr) {
    constexpr int kG0 = P >= 8 ? 1 : 8 / P;
    constexpr int kG = kG0 < kSV ? kG0 : kSV;
    const int lane = blk::lane(), w = blk::warp(), nw = blk::warps();
    float t[P];
    FLASHINFER_UNROLL
    for (int m = 0; m < P; ++m) t[m] = key_floor(piv[m]);
    float t_min = t[0];  // (fminf skips a NaN threshold: an empty set)
    FLASHINFER_UNROLL
    for (int m = 1; m < P; ++m) t_min = fminf(t_min, t[m]);
    float c_acc[kG][P];
    float mx[kG], mn[kG];
    bool nan = false;
    FLASHINFER_UNROLL
    for (int g = 0; g < kG; ++g) {
      FLASHINFER_UNROLL
      for (int m = 0; m < P; ++m) c_acc[g][m] = 0.f;
      mx[g] = -INFINITY;
      mn[g] = INFINITY;
    }
    const int tile = L.tile;
    float run_above = 0.f, run_cand = 0.f;  // (early)
    for (int c = 0; c < L.chunks; ++c) {
      float s[kG][P];
      FLASHINFER_UNROLL
      for (int g = 0; g < kG; ++g) {
        FLASHINFER_UNROLL
        for (int m = 0; m < P; ++m) s[g][m] = 0.f;
      }
      const int step_e = step_end(c);
      int i0 = elem(c * L.steps_per_chunk, 0);
      for (int step = c * L.steps_per_chunk; step < step_e; ++step, i0 += kSV * tile) {
        Raw raw[kSV];
        rd.template fetch_step<kFirst>(i0, tile, raw);
        if (kFirst) rd.fill_step(i0, tile, raw);
        FLASHINFER_UNROLL
        for (int k = 0; k < kSV; ++k) {
          const int g = k % kG;
          float f[kVec];
          Reader::to_float(raw[k], f);
          if (!kFirst) {  // later passes: skip a vector with no element in any set (no-op adds)
            float hi = f[0];
            FLASHINFER_UNROLL
            for (int e = 1; e < kVec; ++e) hi = fmaxf(hi, f[e]);
            if (!(hi >= t_min)) continue;
          }
          FLASHINFER_UNROLL
          for (int e = 0; e < kVec; ++e) {
            const float x = f[e];
            FLASHINFER_UNROLL
            for (int m = 0; m < P; ++m) {
              if (x >= t[m]) {
                c_acc[g][m] += 1.f;
                s[g][m] += x;
              }
            }
            if (kFirst) {
              nan |= x != x;  // (padding is -inf)
              mx[g] = fmaxf(mx[g], x);
              if (x >= t[0]) mn[g] = fminf(mn[g], x);
            }
          }
        }
      }
      FLASHINFER_UNROLL
      for (int m = 0; m < P; ++m) {
        float v = s[0][m];
        FLASHINFER_UNROLL
        for (int g = 1; g < kG; ++g) v += s[g][m];
        const float ws = blk::warp_sum(v);
        if (lane == 0) table()[(c * nw + w) * kTableCols + m] = ws;
      }
      if (P == 1 && !kFirst && early && (L.early == 1 || chunk_cached(c))) {  // (uniform)
        __syncthreads();
        float above = 0.f;
        for (int j = 0; j < nw; ++j) above += table()[(c * nw + j) * kTableCols];
        run_above += above;
        run_cand += csum()[c * kTableCols + early->column];
        if (run_cand - run_above > early->bound) {
          __syncthreads();  // (every thread has read the table and csum: the next pass rewrites them)
          ++passes;
          return true;
        }
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
    FLASHINFER_UNROLL
    for (int m = 0; m < P; ++m) {
      cnt[m] = static_cast<int>(c_acc[0][m]);
      FLASHINFER_UNROLL
      for (int g = 1; g < kG; ++g) cnt[m] += static_cast<int>(c_acc[g][m]);
    }
    blk::sum<P>(cnt, blk::scratch().i);
    if (kFirst) {
      float tmx = mx[0], tmn = mn[0];
      FLASHINFER_UNROLL
      for (int g = 1; g < kG; ++g) {
        tmx = fmaxf(tmx, mx[g]);
        tmn = fminf(tmn, mn[g]);
      }
      st->max = blk::max(tmx);
      st->min = blk::min(tmn);
      st->has_nan = blk::max(nan ? 1 : 0) != 0;
      st->count = cnt[0];
      st->total = sum[0];
    }
    ++passes;
    return false;
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

  static constexpr bool kEarlyAccept = true;  // (sampling.h: aggregate_or_accept)
  FLASHINFER_DEVICE bool aggregate_or_accept(const uint32_t (&piv)[1], int column, float bound, int (&cnt)[1],
                                             float (&sum)[1]) {
    if (listed || L.early == 0) {
      aggregate<1>(piv, cnt, sum);
      return false;
    }
    const Early e{column, bound};
    return row_pass<1, false>(piv, cnt, sum, nullptr, &e);
  }

  template <int P>
  FLASHINFER_DEVICE void aggregate(const uint32_t (&piv)[P], int (&cnt)[P], float (&sum)[P]) {
    if (!listed) {
      row_pass<P, false>(piv, cnt, sum, nullptr);
      return;
    }
    int b, e;
    list_span(&b, &e);
    float t[P];
    FLASHINFER_UNROLL
    for (int m = 0; m < P; ++m) {
      t[m] = key_floor(piv[m]);
      cnt[m] = 0;
      sum[m] = 0.f;
    }
    for (int j = b; j < e; ++j) {
      const float x = list_val()[j];
      FLASHINFER_UNROLL
      for (int m = 0; m < P; ++m) {
        if (x >= t[m]) {
          cnt[m] += 1;
          sum[m] += x;
        }
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
    const float t_lo = key_floor(lo), t_hi = key_floor(hi);  // lo < key <= hi
    auto in = [&](float x) { return x >= t_lo && !(x >= t_hi); };
    int base = 0;
    const int tile = L.tile;
    for (int step = 0, i0 = elem(0, 0); step < L.steps; ++step, i0 += kSV * tile) {
      Raw raw[kSV];
      rd.template fetch_step<false>(i0, tile, raw);
      int mine[kSV];
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        float f[kVec];
        Reader::to_float(raw[k], f);
        mine[k] = 0;
        FLASHINFER_UNROLL
        for (int e = 0; e < kVec; ++e) mine[k] += in(f[e]) ? 1 : 0;
      }
      FLASHINFER_UNROLL
      for (int k = 1; k < kSV; ++k) mine[0] += mine[k];
      int total = 0;
      int pos = base + blk::exclusive_scan(mine[0], blk::scratch().i, &total);
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        float f[kVec];
        Reader::to_float(raw[k], f);
        FLASHINFER_UNROLL
        for (int e = 0; e < kVec; ++e) {
          if (in(f[e])) {
            if (pos < L.list_cap) {
              list_val()[pos] = f[e];
              list_idx()[pos] = i0 + k * tile + e;
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
    const float t_low = key_floor(low);
    const int tile_n = L.tile;
    float run = 0.f;
    int last = -1;  // this thread's last candidate in the chunk
    float last_x = 0.f;
    const int step_e = step_end(c);
    int i0 = elem(c * L.steps_per_chunk, 0);
    for (int step = c * L.steps_per_chunk; step < step_e; ++step, i0 += kSV * tile_n) {
      Raw raw[kSV];
      rd.template fetch_step<false>(i0, tile_n, raw);
      float s[kSV];
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        float f[kVec];
        Reader::to_float(raw[k], f);
        s[k] = 0.f;
        FLASHINFER_UNROLL
        for (int e = 0; e < kVec; ++e) {
          if (f[e] >= t_low) {
            s[k] += f[e];
            last = i0 + k * tile_n + e;
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
      const int ih = i0 + hit * tile_n;
      float f[kVec];
      Reader::to_float(mine_raw, f);
      int cand = 0x7fffffff, tile_last = -1;
      float cand_x = 0.f, tile_last_x = 0.f;
      float acc = excl;
      FLASHINFER_UNROLL
      for (int e = 0; e < kVec; ++e) {
        if (f[e] >= t_low) {
          acc += f[e];
          if (cand == 0x7fffffff && excl <= target && acc > target) {
            cand = ih + e;
            cand_x = f[e];
          }
          tile_last = ih + e;
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
    const float t_low = key_floor(low);
    float s = 0.f;
    int last = -1;
    for (int j = b; j < e; ++j) {
      if (list_val()[j] >= t_low) {
        s += list_val()[j];
        last = j;
      }
    }
    const float excl = blk::exclusive_scan(s, blk::scratch().f, static_cast<float*>(nullptr));
    int cand = 0x7fffffff;
    float acc = excl;
    for (int j = b; j < e && cand == 0x7fffffff; ++j) {
      const float x = list_val()[j];
      if (x >= t_low) {
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
