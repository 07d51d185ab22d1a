// Sorting-free sampling kernels and launchers: SamplingKernel (plain, top-k, top-p, min-p,
// joint top-k/top-p and top-k-first, one block per output), SamplingClusterKernel (the same on
// sm_90 with one thread-block cluster per output, each CTA holding a slice of the row in shared
// memory; chosen for small batches, FLASHINFER_SAMPLING_CLUSTER overrides) and RenormKernel
// (top-k / top-p renormalization and the top-k logit mask, one block per row). The loops and
// their logic live in sampling.h; the block-wide source in sampling_source.cuh, the cluster-wide
// one in sampling_cluster.cuh; the layouts in sampling_params.h.
#pragma once

#include <cuda_runtime.h>

#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "math.cuh"
#include "philox.h"
#include "sampling.h"
#include "sampling_block.cuh"
#include "sampling_cluster.cuh"
#include "sampling_params.h"
#include "sampling_source.cuh"
#include "utils.cuh"
#include "vec_dtypes.cuh"

namespace flashinfer {
namespace sampling {

template <typename T>
FLASHINFER_DEVICE RowReader<T> row_reader(const T* row, int vocab, const ScanLayout& L) {
  RowReader<T> rd;
  rd.row = row;
  rd.n = vocab;
  rd.cache_elems = L.cache_elems;
  rd.aligned = reinterpret_cast<uintptr_t>(row) % 16 == 0;
  return rd;
}

// One draw from one row: pass 0 (mass, max, validity), then, for top-k-first with an active k,
// the exact top-k threshold, then the rejection loop of sampling.h. False for a row with NaN
// or without positive finite mass. Src: GlobalSource (one block) or ClusterSource (a cluster).
template <typename IdT, class Src>
FLASHINFER_DEVICE bool sample_row(Src& src, const SamplingParams<IdT>& p, int64_t b, int64_t row, SampleResult* r) {
  const RowStats s = src.first_pass(kKeyZero);
  if (!probs_valid(s)) return false;
  RowFilter f;
  if (p.use_top_k) f.top_k = p.top_k_arr ? p.top_k_arr[row] : p.top_k;
  if (p.use_top_p) f.top_p = p.top_p_arr ? p.top_p_arr[row] : p.top_p;
  if (p.use_min_p) f.min_p = p.min_p_arr ? p.min_p_arr[row] : p.min_p;
  SamplingStart st;
  if (p.top_k_first && top_k_active(f.top_k, s.count)) {
    Criterion ck;
    ck.top_k = f.top_k;
    ck.max_key = order_key(s.max);
    const Bracket bk = select_threshold(src, ck, full_bracket(s), true, false);
    // (never listed: the search's last aggregate, over the row, holds column bk.col_lo)
    st = top_k_first_start(ck.max_key, f.top_p, bk, !src.in_list());
    if (!src.list_has_all()) src.unlist();
  } else {
    st = joint_start(s, f);  // (top-k-first without an active k: top-p of the row)
  }
  // The stream is rebuilt per draw (a few loads) rather than held in registers.
  auto uniform = [&](int d) { return uniform_co(p.rng.stream(b).word(static_cast<uint32_t>(d))); };
  *r = rejection_sample(src, st.crit, st.state, uniform, st.crit.filters() ? kMaxDraws : 1);
  return r->index >= 0;
}

template <typename IdT>
FLASHINFER_DEVICE void write_sample(const SamplingParams<IdT>& p, int64_t b, bool ok, const SampleResult& r,
                                    int passes) {
  p.out[b] = static_cast<IdT>(ok ? r.index : 0);
  if (p.valid) p.valid[b] = ok;
  if (p.stats) {
    p.stats[2 * b] = r.draws;
    p.stats[2 * b + 1] = passes;
  }
}

// One block per output (grid-stride). An out-of-range index or an invalid row yields 0 and
// valid = false.
template <typename IdT>
__global__ void __launch_bounds__(kMaxThreads, 1) SamplingKernel(const __grid_constant__ SamplingParams<IdT> p,
                                                                const __grid_constant__ ScanLayout L) {
  pdl_wait();
  for (int64_t b = blockIdx.x; b < p.batch; b += gridDim.x) {
    const int64_t row = p.indices ? static_cast<int64_t>(p.indices[b]) : b;
    SampleResult r;
    int passes = 0;
    bool ok = row >= 0 && row < p.rows;
    if (ok) {
      auto src = make_source(row_reader(p.probs + row * p.row_stride, p.vocab, L), L);
      ok = sample_row(src, p, b, row, &r);
      passes = src.passes;
    }
    if (threadIdx.x == 0) write_sample(p, b, ok, r, passes);
    __syncthreads();  // the next row refills the shared-memory cache
  }
  pdl_launch_dependents();
}

// One cluster of cs.size CTAs per output (grid.x = batch * cs.size, cluster dims (cs.size, 1, 1),
// so a CTA's rank in its cluster is blockIdx.x % cs.size): CTA r samples the row's slice r
// together with the others (ClusterSource). sm_90 only; the launcher checks.
template <typename IdT>
__global__ void __launch_bounds__(kMaxThreads, 1)
    SamplingClusterKernel(const __grid_constant__ SamplingParams<IdT> p, const __grid_constant__ ScanLayout L,
                          const __grid_constant__ ClusterSplit cs) {
  pdl_wait();
  const int rank = static_cast<int>(blockIdx.x % static_cast<unsigned>(cs.size));
  const int64_t b = blockIdx.x / static_cast<unsigned>(cs.size);
  const int64_t row = p.indices ? static_cast<int64_t>(p.indices[b]) : b;
  SampleResult r;
  int passes = 0;
  bool ok = row >= 0 && row < p.rows;  // the same in every CTA of the cluster
  if (ok) {
    const int base = rank * cs.slice;
    const int left = p.vocab - base;
    const int n = left < 0 ? 0 : (left < cs.slice ? left : cs.slice);
    ClusterSource<RowReader<float>> src{make_source(row_reader(p.probs + row * p.row_stride + base, n, L), L), rank,
                                        cs.size, base};
    ok = sample_row(src, p, b, row, &r);
    passes = src.passes();
  }
  if (rank == 0 && threadIdx.x == 0) write_sample(p, b, ok, r, passes);
  cl::sync();  // no CTA leaves while a peer may still read its shared memory
  pdl_launch_dependents();
}

// Finds the kept set {key > lo} (exact threshold search) and writes the row once.
template <typename T>
__global__ void __launch_bounds__(kMaxThreads, 1) RenormKernel(const __grid_constant__ RenormParams<T> p,
                                                              const __grid_constant__ ScanLayout L) {
  constexpr int kVec = RowReader<T>::kVec;
  constexpr int kSV = kStepVecs<kVec>;
  using Raw = typename RowReader<T>::Raw;
  const bool mask = p.kind == RenormKind::kTopKMask;
  pdl_wait();
  for (int64_t row = blockIdx.x; row < p.rows; row += gridDim.x) {
    const RowReader<T> rd = row_reader(p.in + row * p.in_stride, p.vocab, L);
    auto src = make_source(rd, L);
    const RowStats s = src.first_pass(mask ? kKeyNegInf : kKeyZero);
    Criterion c;
    c.max_key = order_key(s.max);
    if (p.kind == RenormKind::kTopPRenorm) {
      const float top_p = p.top_p_arr ? p.top_p_arr[row] : p.top_p;
      if (top_p_active(top_p) && s.count > 0) {
        c.use_top_p = true;
        c.top_p_mass = top_p * s.total;
      }
    } else {
      const int k = p.top_k_arr ? p.top_k_arr[row] : p.top_k;
      if (top_k_active(k, s.count)) c.top_k = k;
    }
    const bool keep_all = !c.filters();
    uint32_t lo = mask ? kKeyNegInf : kKeyZero;
    float div = s.total;
    if (!keep_all) {
      const Bracket bk = select_threshold(src, c, full_bracket(s), false, false);
      lo = bk.lo;
      div = bk.sum_lo;
    }
    T* out = p.out + row * p.out_stride;
    const bool out_aligned = reinterpret_cast<uintptr_t>(out) % 16 == 0;
    const float t_lo = key_floor(lo);  // keep: key > lo
    for (int step = 0, i0 = src.elem(0, 0); step < L.steps; ++step, i0 += kSV * L.tile) {
      Raw raw[kSV];
      rd.template fetch_step<false>(i0, L.tile, raw);
      FLASHINFER_UNROLL
      for (int k = 0; k < kSV; ++k) {
        const int i = i0 + k * L.tile;
        if (i >= p.vocab) continue;
        Raw o = raw[k];
        if (!(mask && keep_all)) {  // the mask keeps values bit for bit
          float f[kVec];
          raw[k].to_float(f);
          FLASHINFER_UNROLL
          for (int e = 0; e < kVec; ++e) {
            const bool keep = f[e] >= t_lo;
            if (mask) {
              if (!keep) o.v[e] = from_float<T>(-INFINITY);
            } else {
              o.v[e] = from_float<T>(keep ? f[e] / div : 0.f);
            }
          }
        }
        if (out_aligned && i + kVec <= p.vocab) {
          o.store(out + i);
        } else {
          FLASHINFER_UNROLL
          for (int e = 0; e < kVec; ++e)
            if (i + e < p.vocab) out[i + e] = o.v[e];
        }
      }
    }
    __syncthreads();
  }
  pdl_launch_dependents();
}

inline int64_t smem_budget(const DeviceInfo& dev) { return int64_t{dev.smem_optin} - kStaticSmemReserve; }

// FLASHINFER_SAMPLING_CLUSTER (read once): unset or "auto" lets cluster_split decide; 0 or 1
// forces the one-block kernel; n >= 2 forces clusters of n CTAs (power of two, <= 16, sm_90).
inline int sampling_cluster_env() {
  static const int v = [] {
    const char* e = std::getenv("FLASHINFER_SAMPLING_CLUSTER");
    if (!e || !*e || std::strcmp(e, "auto") == 0) return 0;
    const int n = std::atoi(e);
    return n <= 1 ? 1 : n;
  }();
  return v;
}

// FLASHINFER_SAMPLING_EARLY (read once; ScanLayout::early of the one-block kernel): the top-p
// early accept's checks: 0 off, 1 after every chunk, 2 after chunks read from the shared-memory
// cache only (default). H200 top_p, batch 64 / 256 (us): off 58.8 / 118.0, 1: 63.1 / 111.9,
// 2: 61.1 / 110.0 (benchmarks/sweeps/sampling_early.txt; peaked rows alike).
inline int sampling_early_env() {
  static const int v = [] {
    const char* e = std::getenv("FLASHINFER_SAMPLING_EARLY");
    const int n = e ? std::atoi(e) : 2;
    return n < 0 || n > 2 ? 2 : n;
  }();
  return v;
}

// The largest cluster the kernel may use on `dev` for this block size and shared memory (asked
// once per device, size and layout; 1 when the kernel binary is older than sm_90 or the
// device cannot co-schedule even two such CTAs).
template <auto kKernel>
cudaError_t max_cluster_size(int dev, const DeviceInfo& info, int threads, int64_t smem, int* out) {
  *out = 1;
  if (info.cc_major < 9) return cudaSuccess;
  static const int binary = [] {
    cudaFuncAttributes a{};
    return cudaFuncGetAttributes(&a, kKernel) == cudaSuccess ? a.binaryVersion : 0;
  }();
  if (binary < 90) return cudaSuccess;
  constexpr int kDevices = 64, kWays = 8;
  struct Known {
    int threads = 0;
    int64_t smem = -1;
    int size = 1;
  };
  static Known known[kDevices][kWays];
  static int next[kDevices] = {};
  static bool non_portable[kDevices] = {};
  const bool cached = dev >= 0 && dev < kDevices;
  if (cached) {
    for (const Known& k : known[dev]) {
      if (k.threads == threads && k.smem == smem) {
        *out = k.size;
        return cudaSuccess;
      }
    }
    if (!non_portable[dev]) {  // clusters of 16 need the opt-in
      if (cudaFuncSetAttribute(kKernel, cudaFuncAttributeNonPortableClusterSizeAllowed, 1) != cudaSuccess)
        (void)cudaGetLastError();
      non_portable[dev] = true;
    }
  }
  int best = 1;
  for (int size = kMaxCluster; size >= 2 && best == 1; size /= 2) {
    cudaLaunchConfig_t cfg = {};
    cfg.gridDim = dim3(static_cast<unsigned>(size));
    cfg.blockDim = dim3(static_cast<unsigned>(threads));
    cfg.dynamicSmemBytes = static_cast<size_t>(smem);
    cudaLaunchAttribute attr[1];
    attr[0].id = cudaLaunchAttributeClusterDimension;
    attr[0].val.clusterDim.x = static_cast<unsigned>(size);
    attr[0].val.clusterDim.y = 1;
    attr[0].val.clusterDim.z = 1;
    cfg.attrs = attr;
    cfg.numAttrs = 1;
    int clusters = 0;
    if (cudaOccupancyMaxActiveClusters(&clusters, kKernel, &cfg) != cudaSuccess) {
      (void)cudaGetLastError();  // (an unsupported size is an error, not sticky)
      clusters = 0;
    }
    if (clusters >= 1) best = size;
  }
  if (cached) {
    known[dev][next[dev]] = Known{threads, smem, best};
    next[dev] = (next[dev] + 1) % kWays;
  }
  *out = best;
  return cudaSuccess;
}

template <typename IdT>
cudaError_t SamplingOnCluster(const SamplingParams<IdT>& p, const ClusterSplit& cs, cudaStream_t stream) {
  const ScanLayout L = slice_layout(cs.slice);
  constexpr auto kernel = SamplingClusterKernel<IdT>;
  cudaLaunchConfig_t cfg = {};
  cfg.gridDim = dim3(static_cast<unsigned>(p.batch * cs.size));
  cfg.blockDim = dim3(static_cast<unsigned>(L.threads));
  cfg.dynamicSmemBytes = static_cast<size_t>(L.smem_bytes);
  cfg.stream = stream;
  cudaLaunchAttribute attr[2];
  attr[0].id = cudaLaunchAttributeClusterDimension;
  attr[0].val.clusterDim.x = static_cast<unsigned>(cs.size);
  attr[0].val.clusterDim.y = 1;
  attr[0].val.clusterDim.z = 1;
  attr[1].id = cudaLaunchAttributeProgrammaticStreamSerialization;
  attr[1].val.programmaticStreamSerializationAllowed = 1;
  cfg.attrs = attr;
  cfg.numAttrs = p.pdl ? 2 : 1;
  return cudaLaunchKernelEx(&cfg, kernel, p, L, cs);
}

template <typename IdT>
cudaError_t Sampling(const SamplingParams<IdT>& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.batch == 0) return cudaSuccess;
  DeviceInfo dev;
  int dev_id = -1;
  FLASHINFER_CUDA_TRY(current_device(&dev_id));
  FLASHINFER_CUDA_TRY(current_device_info(&dev, dev_id));
  const int64_t budget = smem_budget(dev);
  const int forced = p.cluster >= 0 ? (p.cluster <= 1 ? 1 : p.cluster) : sampling_cluster_env();
  if (forced != 1 && dev.cc_major >= 9 && p.batch * kMaxCluster <= 0x7fffffff) {
    // The split; when the device cannot co-schedule that many CTAs, the largest it can.
    for (int max_c = kMaxCluster; max_c >= 2;) {
      const ClusterSplit cs = cluster_split(p.batch, p.vocab, dev.num_sms, budget, max_c, forced);
      if (cs.size < 2) break;
      const ScanLayout L = slice_layout(cs.slice);
      FLASHINFER_CUDA_TRY(ensure_dynamic_smem<SamplingClusterKernel<IdT>>(static_cast<size_t>(L.smem_bytes), dev_id));
      int max_size = 1;
      FLASHINFER_CUDA_TRY(
          max_cluster_size<SamplingClusterKernel<IdT>>(dev_id, dev, L.threads, L.smem_bytes, &max_size));
      if (max_size >= cs.size) {
        if (SamplingOnCluster(p, cs, stream) == cudaSuccess) return cudaSuccess;
        (void)cudaGetLastError();  // a launch-configuration error: the one-block kernel instead
        break;
      }
      max_c = max_size;
    }
  }
  ScanLayout L = scan_layout(p.vocab, 4, p.top_k_first, budget);
  L.early = sampling_early_env();
  FLASHINFER_CUDA_TRY(ensure_dynamic_smem<SamplingKernel<IdT>>(static_cast<size_t>(L.smem_bytes), dev_id));
  return launch(SamplingKernel<IdT>, dim3(static_cast<unsigned>(p.batch)), dim3(L.threads),
                static_cast<size_t>(L.smem_bytes), stream, p.pdl, p, L);
}

template <typename T>
cudaError_t Renorm(const RenormParams<T>& p, cudaStream_t stream) {
  if (validate(p) != Status::kSuccess) return cudaErrorInvalidValue;
  if (p.rows == 0) return cudaSuccess;
  DeviceInfo dev;
  FLASHINFER_CUDA_TRY(current_device_info(&dev));
  const ScanLayout L = scan_layout(p.vocab, static_cast<int>(sizeof(T)), true, smem_budget(dev));
  FLASHINFER_CUDA_TRY(ensure_dynamic_smem<RenormKernel<T>>(static_cast<size_t>(L.smem_bytes)));
  const int64_t grid = p.rows < 0x7fffffff ? p.rows : 0x7fffffff;
  return launch(RenormKernel<T>, dim3(static_cast<unsigned>(grid)), dim3(L.threads), static_cast<size_t>(L.smem_bytes),
                stream, p.pdl, p, L);
}

}  // namespace sampling
}  // namespace flashinfer
