// Kernels and launchers that merge attention states: two sets (MergeState, also in place with
// a row mask) and many states per row (MergeStates). The merge math is state.h's; parameters
// and the thread -> (row, head, vector) arithmetic are cascade.h's.
#pragma once

#include <cuda_runtime.h>

#include <cstdlib>

#include "../cp_async.cuh"
#include "../math.cuh"
#include "../occupancy.h"
#include "../utils.cuh"
#include "../vec_dtypes.cuh"
#include "cascade.h"
#include "state.h"

namespace flashinfer {
namespace attention {
namespace detail {

// Two floats -> a pair of 16-bit values in one 32-bit word: one cvt.rn.{bf16x2,f16x2}.f32 (the
// other way is vec_dtypes.cuh's unpack2).
FLASHINFER_DEVICE uint32_t pack2(float lo, float hi, const __nv_bfloat16*) {
  const __nv_bfloat162 h = __floats2bfloat162_rn(lo, hi);
  uint32_t w;
  memcpy(&w, &h, 4);
  return w;
}
FLASHINFER_DEVICE uint32_t pack2(float lo, float hi, const __half*) {
  const __half2 h = __floats2half2_rn(lo, hi);
  uint32_t w;
  memcpy(&w, &h, 4);
  return w;
}

// kE values of T in registers. kE == 8: a 16-byte vector kept as one uint4 and converted a
// pair at a time where it is used (unpacking it into 16-bit values at load time doubles its
// registers, and NVVM splits the store of a reassembled array); kE == 1: one element.
template <typename T, int kE>
struct Pack {
  static_assert(kE == 8 && sizeof(T) == 2, "Pack holds 16-byte vectors of 16-bit values, or one element");
  uint4 u;
  // A plain ld.global. H200, merge_state 8192 / 16384 x 32 x 128 bf16 at 32 registers (one
  // run, us): plain 54.3 / 100.8, .cs 54.9 / 103.4, .cg 54.5 / 100.9, .nc 54.4 / 100.8,
  // .nc.L1::no_allocate 54.9 / 103.5. (At 40 registers, session 7, .cs had been ahead.)
  FLASHINFER_DEVICE void load(const T* p) { u = *reinterpret_cast<const uint4*>(p); }
  // A plain (weak) 16-byte store in PTX: NVVM splits a C++ uint4 store of this reassembled
  // value into four 4-byte ones, and __stwb becomes a strong store.
  FLASHINFER_DEVICE void store(T* p) const {
#if defined(__CUDA_ARCH__)
    asm volatile("st.global.v4.u32 [%0], {%1, %2, %3, %4};" ::"l"(p), "r"(u.x), "r"(u.y), "r"(u.z), "r"(u.w)
                 : "memory");
#else
    memcpy(static_cast<void*>(p), &u, 16);  // (host compilation: the kernel emulator, tests/cpp/emu)
#endif
  }
  FLASHINFER_DEVICE void to_float(float* f) const {
    const float2 a = unpack2(u.x, tag()), b = unpack2(u.y, tag()), c = unpack2(u.z, tag()), d = unpack2(u.w, tag());
    f[0] = a.x, f[1] = a.y, f[2] = b.x, f[3] = b.y, f[4] = c.x, f[5] = c.y, f[6] = d.x, f[7] = d.y;
  }
  FLASHINFER_DEVICE void from_float(const float* f) {
    u = make_uint4(pack2(f[0], f[1], tag()), pack2(f[2], f[3], tag()), pack2(f[4], f[5], tag()),
                   pack2(f[6], f[7], tag()));
  }
  static FLASHINFER_DEVICE const T* tag() { return nullptr; }
};

template <typename T>
struct Pack<T, 1> {
  T x;
  FLASHINFER_DEVICE void load(const T* p) { x = *p; }
  FLASHINFER_DEVICE void store(T* p) const { *p = x; }
  FLASHINFER_DEVICE void to_float(float* f) const { f[0] = flashinfer::to_float(x); }
  FLASHINFER_DEVICE void from_float(const float* f) { x = flashinfer::from_float<T>(f[0]); }
};

// wa * a + wb * b in fp32, rounded once.
template <typename T, int kE>
FLASHINFER_DEVICE Pack<T, kE> weighted_sum(float wa, const Pack<T, kE>& a, float wb, const Pack<T, kE>& b) {
  float fa[kE], fb[kE];
  a.to_float(fa);
  b.to_float(fb);
  FLASHINFER_UNROLL
  for (int e = 0; e < kE; ++e) fa[e] = wa * fa[e] + wb * fb[e];
  Pack<T, kE> o;
  o.from_float(fa);
  return o;
}

}  // namespace detail

// One tile per group (cascade.h's MergeShape); kE elements per vector (8: 16-byte vectors, 1:
// any alignment); every load of a thread (kVecs vectors of each input, both LSEs) is issued
// before the first is used. The merged LSEs leave through shared memory (dynamic:
// merge_state_smem): after a barrier, thread t writes group t's, so that a block's LSEs go out
// as one coalesced store instead of one 4-byte store per group (whose four pieces of a 32-byte
// sector came from four warps). H200, bf16, an equivalent kernel in one A/B run: 8192 x 32 x
// 128 56.9 -> 55.9 us, 16384 x 32 x 128 107.9 -> 105.6 (without any LSE store: 54.2 / 101.8).
// One vector per thread fits 32 registers, so 16 blocks of 128 threads (the whole SM) are
// resident: 8192 / 16384 x 32 x 128 57.3 / 108.3 -> 54.9 / 103.4 us against 37 registers (12
// blocks). Each block is one round trip to DRAM; more of them in flight is what pays. More work
// per thread does not: two or four tiles per group (40 / 64 registers) took 62.9 / 75.7 us,
// one persistent block per slot 59.3, 64- and 32-thread blocks (twice / four times the blocks)
// 85 / 163 (the block scheduler's rate), 256 threads 55.0-55.4 (session 15).
template <typename T, int kE, int kVecs>
__global__ void __launch_bounds__(kMergeStateMaxThreads, kVecs == 1 ? 4 : (kVecs <= 2 ? 3 : (kVecs == 4 ? 2 : 1)))
    MergeStateKernel(const MergeStateParams<T> p, const MergeShape l) {
  using V = detail::Pack<T, kE>;
  FLASHINFER_EXTERN_SHARED int64_t lse_at[];  // [groups_per_block] offsets into s_out (-1: none)
  float* lse = reinterpret_cast<float*>(lse_at + l.groups_per_block);  // [groups_per_block] values
  const int g = static_cast<int>(threadIdx.x) >> l.group_log2;
  const int lane = static_cast<int>(threadIdx.x) & (l.group - 1);
  const int64_t tile = int64_t{blockIdx.x} * l.groups_per_block + g;
  pdl_wait();
  int64_t at = -1;
  float lse_g = 0.f;
  if (tile < l.tiles) {
    int64_t n, h;
    int r;
    merge_tile(l, tile, p.num_heads, &n, &h, &r);
    if (!p.mask || p.mask[n * p.mask_stride] != 0) {
      const T* va = p.v_a + (n * p.a.v_n + h * p.a.v_h);
      const T* vb = p.v_b + (n * p.b.v_n + h * p.b.v_h);
      V a[kVecs], b[kVecs];
      FLASHINFER_UNROLL
      for (int i = 0; i < kVecs; ++i) {
        const int j = merge_vec_index(l, lane, r, i);
        if (j < l.head_vecs) {
          a[i].load(va + j * kE);
          b[i].load(vb + j * kE);
        }
      }
      const float sa = p.s_a[n * p.a.s_n + h * p.a.s_h];
      const float sb = p.s_b[n * p.b.s_n + h * p.b.s_h];
      const MergeWeights w = merge_weights(sa, sb);
      T* vo = p.v_out + (n * p.out.v_n + h * p.out.v_h);
      FLASHINFER_UNROLL
      for (int i = 0; i < kVecs; ++i) {
        const int j = merge_vec_index(l, lane, r, i);
        if (j < l.head_vecs) detail::weighted_sum(w.wa, a[i], w.wb, b[i]).store(vo + j * kE);
      }
      if (l.write_s && r == 0) at = n * p.out.s_n + h * p.out.s_h;
      lse_g = w.lse;
    }
  }
  if (lane == 0) {
    lse_at[g] = at;
    lse[g] = lse_g;
  }
  __syncthreads();  // (in place: every group has also read s_a before its LSE is overwritten)
  const int t = static_cast<int>(threadIdx.x);
  if (t < l.groups_per_block && lse_at[t] >= 0) p.s_out[lse_at[t]] = lse[t];
  pdl_launch_dependents();
}

// MergeState on packed states (cascade.h's MergeFlatShape): kU vectors of each input per
// thread, all loads issued first; a vector's weights come from its row-head's two LSEs; the
// merged LSEs leave through shared memory in one coalesced store per block (as above). Every
// load instruction of a warp reads 512 contiguous bytes, where a tile group's read 256 bytes of
// each of two rows. H200, bf16, us (tile kernel -> this at one vector and 128 threads, two calls,
// session 25): 8192 x 32 x 128 54.0 -> 53.3-53.7, 16384 rows 100.7 -> 99.5-99.7, 2048 rows
// 18.9-19.2 -> 18.6, head_dim 64 30.9 -> 30.4, head_dim 256 100.3 -> 99.7, 1 row 4.7 -> 4.4. Two
// or four vectors per thread were slower (8192 rows 53.8-54.0 / 54.5-54.7), 256 and 512 threads
// the same or slower (53.3-53.6 / 53.8-54.0).
template <typename T, int kU>
__global__ void __launch_bounds__(kMergeStateMaxThreads, kU <= 1 ? 4 : (kU == 2 ? 3 : 2))
    MergeStateFlatKernel(const MergeStateParams<T> p, const MergeFlatShape l) {
  constexpr int kE = 16 / sizeof(T);
  using V = detail::Pack<T, kE>;
  FLASHINFER_EXTERN_SHARED float flat_lse[];  // [rows_per_block]
  const int t = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  const int64_t f0 = int64_t{blockIdx.x} * nt * kU;
  const int64_t rh0 = f0 >> l.hv_log2;
  const int64_t hmask = (int64_t{1} << l.hv_log2) - 1;
  pdl_wait();
  V a[kU], b[kU];
  FLASHINFER_UNROLL
  for (int u = 0; u < kU; ++u) {
    const int64_t f = f0 + int64_t{u} * nt + t;
    if (f < l.vecs) {
      a[u].load(p.v_a + f * kE);
      b[u].load(p.v_b + f * kE);
    }
  }
  float sa[kU], sb[kU];
  FLASHINFER_UNROLL
  for (int u = 0; u < kU; ++u) {
    const int64_t f = f0 + int64_t{u} * nt + t;
    sa[u] = sb[u] = 0.f;
    if (f < l.vecs) {
      sa[u] = p.s_a[f >> l.hv_log2];
      sb[u] = p.s_b[f >> l.hv_log2];
    }
  }
  FLASHINFER_UNROLL
  for (int u = 0; u < kU; ++u) {
    const int64_t f = f0 + int64_t{u} * nt + t;
    opaque(a[u].u);  // convert vector u only after vector u - 1 is stored (vec_dtypes.cuh)
    opaque(b[u].u);
    if (f < l.vecs) {
      const MergeWeights w = merge_weights(sa[u], sb[u]);
      detail::weighted_sum(w.wa, a[u], w.wb, b[u]).store(p.v_out + f * kE);
      if ((f & hmask) == 0) flat_lse[(f >> l.hv_log2) - rh0] = w.lse;
    }
  }
  __syncthreads();  // (in place: every thread of the block has read its s_a)
  for (int i = t; i < l.rows_per_block && rh0 + i < l.row_heads; i += nt) p.s_out[rh0 + i] = flat_lse[i];
  pdl_launch_dependents();
}

// MergeStates on 16-byte vectors: the tile layout of MergeStateKernel; each thread streams
// its kVecs vectors and the LSE of states k + 1 .. k + stages - 1 into its own shared-memory
// slots with cp.async while it folds state k in (state.h's online softmax: a state is a "key"
// with score s_k and value v_k). A thread reads back only slots it filled itself, so
// cp.async.wait_group orders everything and no barrier is needed. Each state is read once.
// Dynamic shared memory: [stages][kVecs][blockDim.x] uint4, then [stages][blockDim.x] float.
template <typename T, int kVecs>
__global__ void __launch_bounds__(kMergeThreads) MergeStatesPipelinedKernel(const MergeStatesParams<T> p,
                                                                            const MergeShape l, const int stages) {
  using V = detail::Pack<T, 8>;
  FLASHINFER_EXTERN_SHARED uint4 slots[];
  const int t = static_cast<int>(threadIdx.x), nt = static_cast<int>(blockDim.x);
  float* lse_slots = reinterpret_cast<float*>(slots + stages * kVecs * nt);
  const int g = t >> l.group_log2;
  const int lane = t & (l.group - 1);
  const int64_t tile = int64_t{blockIdx.x} * l.groups_per_block + g;
  pdl_wait();
  if (tile < l.tiles) {
    int64_t n, h;
    int r;
    merge_tile(l, tile, p.num_heads, &n, &h, &r);
    const T* v = p.v + (n * p.in.v_n + h * p.in.v_h);
    const float* s = p.s + (n * p.in.s_n + h * p.in.s_h);
    const int64_t num_states = p.num_states;
    auto issue = [&](int64_t k, int stage) {
      if (k < num_states) {
        const T* vk = v + k * p.v_stride_k;
        FLASHINFER_UNROLL
        for (int i = 0; i < kVecs; ++i) {
          const int j = merge_vec_index(l, lane, r, i);
          if (j < l.head_vecs) cp_async::copy16(slots + (stage * kVecs + i) * nt + t, vk + j * 8);
        }
        cp_async::copy<4>(lse_slots + stage * nt + t, s + k * p.s_stride_k);  // (the LSE rides along)
      }
      cp_async::commit();  // one group per state, empty past the end, so the counting holds
    };
    for (int stage = 0; stage + 1 < stages; ++stage) issue(stage, stage);
    OnlineSoftmax st;
    float acc[kVecs][8];
    FLASHINFER_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      FLASHINFER_UNROLL
      for (int e = 0; e < 8; ++e) acc[i][e] = 0.f;
    }
    int cur = 0;
    for (int64_t k = 0; k < num_states; ++k) {
      issue(k + stages - 1, cur == 0 ? stages - 1 : cur - 1);  // the slot state k - 1 used
      cp_async::wait(stages - 1);                              // state k has landed
      float scale, pk;
      st.update(lse_slots[cur * nt + t], &scale, &pk);
      FLASHINFER_UNROLL
      for (int i = 0; i < kVecs; ++i) {
        if (merge_vec_index(l, lane, r, i) >= l.head_vecs) continue;
        V x;
        x.u = slots[(cur * kVecs + i) * nt + t];
        float f[8];
        x.to_float(f);
        FLASHINFER_UNROLL
        for (int e = 0; e < 8; ++e) acc[i][e] = acc[i][e] * scale + pk * f[e];
      }
      cur = cur + 1 == stages ? 0 : cur + 1;
    }
    cp_async::wait(0);
    const float inv_d = st.inv_d();
    T* vo = p.v_out + (n * p.out.v_n + h * p.out.v_h);
    FLASHINFER_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      const int j = merge_vec_index(l, lane, r, i);
      if (j >= l.head_vecs) continue;
      FLASHINFER_UNROLL
      for (int e = 0; e < 8; ++e) acc[i][e] *= inv_d;
      V o;
      o.from_float(acc[i]);
      o.store(vo + j * 8);
    }
    if (r == 0 && lane == 0) p.s_out[n * p.out.s_n + h * p.out.s_h] = st.lse();
  }
  pdl_launch_dependents();
}

// MergeStates on any alignment (kE == 1; the 16-byte path is MergeStatesPipelinedKernel):
// as MergeStateKernel, folding a row-head's states in with state.h's online softmax (a state
// is a "key" with score s_k and value v_k), kUnroll states' loads in flight at once; each
// state is read once.
template <typename T, int kE, int kVecs, int kUnroll>
__global__ void __launch_bounds__(kMergeThreads) MergeStatesKernel(const MergeStatesParams<T> p, const MergeShape l) {
  using V = detail::Pack<T, kE>;
  const int g = static_cast<int>(threadIdx.x) >> l.group_log2;
  const int lane = static_cast<int>(threadIdx.x) & (l.group - 1);
  const int64_t tile = int64_t{blockIdx.x} * l.groups_per_block + g;
  pdl_wait();
  if (tile < l.tiles) {
    int64_t n, h;
    int r;
    merge_tile(l, tile, p.num_heads, &n, &h, &r);
    const T* v = p.v + (n * p.in.v_n + h * p.in.v_h);
    const float* s = p.s + (n * p.in.s_n + h * p.in.s_h);
    OnlineSoftmax st;
    float acc[kVecs][kE];
    FLASHINFER_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      FLASHINFER_UNROLL
      for (int e = 0; e < kE; ++e) acc[i][e] = 0.f;
    }
    for (int64_t k0 = 0; k0 < p.num_states; k0 += kUnroll) {
      V x[kUnroll][kVecs];
      float sk[kUnroll];
      FLASHINFER_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        if (k0 + u < p.num_states) {
          const T* vk = v + (k0 + u) * p.v_stride_k;
          FLASHINFER_UNROLL
          for (int i = 0; i < kVecs; ++i) {
            const int j = merge_vec_index(l, lane, r, i);
            if (j < l.head_vecs) x[u][i].load(vk + j * kE);
          }
        }
      }
      FLASHINFER_UNROLL
      for (int u = 0; u < kUnroll; ++u) sk[u] = k0 + u < p.num_states ? s[(k0 + u) * p.s_stride_k] : neg_inf();
      FLASHINFER_UNROLL
      for (int u = 0; u < kUnroll; ++u) {
        if (k0 + u >= p.num_states) break;
        float scale, pk;
        st.update(sk[u], &scale, &pk);
        FLASHINFER_UNROLL
        for (int i = 0; i < kVecs; ++i) {
          if (merge_vec_index(l, lane, r, i) >= l.head_vecs) continue;
          float f[kE];
          x[u][i].to_float(f);
          FLASHINFER_UNROLL
          for (int e = 0; e < kE; ++e) acc[i][e] = acc[i][e] * scale + pk * f[e];
        }
      }
    }
    const float inv_d = st.inv_d();
    T* vo = p.v_out + (n * p.out.v_n + h * p.out.v_h);
    FLASHINFER_UNROLL
    for (int i = 0; i < kVecs; ++i) {
      const int j = merge_vec_index(l, lane, r, i);
      if (j >= l.head_vecs) continue;
      FLASHINFER_UNROLL
      for (int e = 0; e < kE; ++e) acc[i][e] *= inv_d;
      V o;
      o.from_float(acc[i]);
      o.store(vo + j * kE);
    }
    if (r == 0 && lane == 0) p.s_out[n * p.out.s_n + h * p.out.s_h] = st.lse();
  }
  pdl_launch_dependents();
}

// The MergeStateKernel instantiation of one pass (merge_state_passes): 16-byte vectors, l.vecs
// of them per thread, or single elements (also the LSE-only pass, head_vecs 0).
template <typename T>
auto merge_state_kernel(bool vec, const MergeShape& l) -> void (*)(MergeStateParams<T>, MergeShape) {
  constexpr int kE = 16 / sizeof(T);
  if (!vec || l.head_vecs == 0) return MergeStateKernel<T, 1, kMergeVecs>;
  switch (l.vecs) {
    case 1: return MergeStateKernel<T, kE, 1>;
    case 4: return MergeStateKernel<T, kE, 4>;
    case 8: return MergeStateKernel<T, kE, 8>;
    default: return MergeStateKernel<T, kE, kMergeVecs>;
  }
}

// Launches MergeState on `stream` (current device): packed states in one MergeStateFlatKernel
// launch (merge_flat_shape), any others in the passes of merge_state_passes (cascade.h).
template <typename T>
cudaError_t MergeState(const MergeStateParams<T>& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  // 16-byte vectors per thread: one (H200, 8192 x 32 x 128 bf16, session 4: 56.7 us at 1, 59.4
  // at 2, 63.9 at 4, 77.7 at 8); FLASHINFER_MERGE_VECS=1|2|4|8 overrides (a tuning knob, read once).
  static const int env_vecs = [] {
    const char* e = std::getenv("FLASHINFER_MERGE_VECS");
    const int v = e ? std::atoi(e) : 0;
    return v == 1 || v == 2 || v == 4 || v == 8 ? v : 1;
  }();
  // Block size: FLASHINFER_MERGE_THREADS=128|256|512 (a tuning knob, read once). H200, 8192 x
  // 32 x 128 bf16 (us): 128 / 256 / 512 threads 56.5 / 57.6 / 59.1 (session 7), 54.4 / 55.2 /
  // 56.3 at 32 registers (session 15).
  static const int env_threads = [] {
    const char* e = std::getenv("FLASHINFER_MERGE_THREADS");
    const int v = e ? std::atoi(e) : 0;
    return v == 256 || v == 512 ? v : kMergeStateThreads;
  }();
  const MergeStatePasses passes = merge_state_passes(p, env_vecs, env_threads);
  // FLASHINFER_MERGE_FLAT=0|1|2|4: vectors per thread of MergeStateFlatKernel, which packed
  // states take unless it is 0 (a tuning knob, read once; default 1).
  static const int env_flat = [] {
    const char* e = std::getenv("FLASHINFER_MERGE_FLAT");
    const int v = e ? std::atoi(e) : 1;
    return v == 1 || v == 2 || v == 4 ? v : 0;
  }();
  MergeFlatShape fl;
  if (passes.count > 0 && env_flat > 0 && merge_flat_shape(p, passes.vec, env_flat, env_threads, &fl)) {
    if (fl.blocks > kMergeMaxBlocks) return cudaErrorInvalidValue;
    auto kernel = env_flat == 1   ? MergeStateFlatKernel<T, 1>
                  : env_flat == 2 ? MergeStateFlatKernel<T, 2>
                                  : MergeStateFlatKernel<T, 4>;
    return launch(kernel, dim3(static_cast<unsigned>(fl.blocks)), dim3(static_cast<unsigned>(fl.threads)),
                  static_cast<size_t>(fl.rows_per_block) * 4, stream, p.pdl, p, fl);
  }
  for (int i = 0; i < passes.count; ++i) {
    const MergeShape& l = passes.pass[i];
    if (l.blocks > kMergeMaxBlocks) return cudaErrorInvalidValue;
    const dim3 grid(static_cast<unsigned>(l.blocks)), block(static_cast<unsigned>(l.threads));
    FLASHINFER_CUDA_TRY(launch(merge_state_kernel<T>(passes.vec, l), grid, block,
                               static_cast<size_t>(merge_state_smem(l)), stream, p.pdl, p, l));
  }
  return cudaSuccess;
}

template <typename T>
cudaError_t MergeStates(const MergeStatesParams<T>& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  const int64_t row_heads = p.seq_len * p.num_heads;
  if (row_heads == 0) return cudaSuccess;
  constexpr int kE = 16 / sizeof(T);
  const bool vec = p.head_dim % kE == 0 && vec_aligned(p.v_out, p.out.v_n, p.out.v_h, kE, sizeof(T)) &&
                   (p.num_states == 0 || (vec_aligned(p.v, p.in.v_n, p.in.v_h, kE, sizeof(T)) &&
                                          p.v_stride_k % kE == 0));
  if (vec) {
    constexpr auto kernel = MergeStatesPipelinedKernel<T, kMergeStatesVecs>;
    const MergeShape l = merge_shape(row_heads, p.head_dim, kE, kMergeStatesVecs);
    if (l.blocks > kMergeMaxBlocks) return cudaErrorInvalidValue;
    DeviceInfo dev;
    FLASHINFER_CUDA_TRY(current_device_info(&dev));
    // No deeper than the states need: stages - 1 <= num_states.
    const int64_t cap = p.num_states + 1 < kMergeStatesMaxStages ? p.num_states + 1 : kMergeStatesMaxStages;
    const StreamConfig c = stream_config(dev, l.blocks, l.threads, kernel_regs<kernel>(),
                                         merge_states_stage_bytes(l.threads), static_cast<int>(cap < 2 ? 2 : cap));
    if (c.stages > 0) {
      FLASHINFER_CUDA_TRY(ensure_dynamic_smem<kernel>(c.smem));
      return launch(kernel, dim3(static_cast<unsigned>(l.blocks)), dim3(static_cast<unsigned>(l.threads)), c.smem,
                    stream, p.pdl, p, l, c.stages);
    }
  }
  const MergeShape l = merge_shape(row_heads, p.head_dim, 1, kMergeStatesVecs);
  if (l.blocks > kMergeMaxBlocks) return cudaErrorInvalidValue;
  return launch(MergeStatesKernel<T, 1, kMergeStatesVecs, kMergeStatesUnroll>, dim3(static_cast<unsigned>(l.blocks)),
                dim3(static_cast<unsigned>(l.threads)), 0, stream, p.pdl, p, l);
}

}  // namespace attention
}  // namespace flashinfer
