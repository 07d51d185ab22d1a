// _decode: the decode planner (host), the batch-decode runner (plan-time constants + run()),
// and single-request decode. Checks, Params, launch; the math lives in attention/decode.cuh.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>
#include <nanobind/stl/tuple.h>

#include <algorithm>
#include <cstdlib>
#include <cstring>
#include <optional>
#include <vector>

#include "common.h"
#include "decode_inst.h"
#include "dispatch_dtype.h"
#include "flashinfer/attention/scheduler.h"

namespace fb = flashinfer_bind;
namespace nb = nanobind;
using namespace nb::literals;
using flashinfer::PosEncodingMode;
using flashinfer::attention::DecodeParams;
using flashinfer::attention::KVCache;
using fb::MutTensor;

namespace {

template <typename T>
nb::ndarray<nb::numpy, T> numpy_copy(const T* data, std::initializer_list<size_t> shape) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  auto* v = new std::vector<T>(data, data + n);
  nb::capsule owner(v, [](void* p) noexcept { delete static_cast<std::vector<T>*>(p); });
  return nb::ndarray<nb::numpy, T>(v->data(), shape.size(), shape.begin(), owner);
}

fb::DType parse_dtype(const std::string& s) {
  if (s == "float16") return fb::DType::kF16;
  if (s == "bfloat16") return fb::DType::kBF16;
  fb::fail("decode: dtype must be float16 or bfloat16; got " + s);
}

// The cache's element type code (KVCache): 0 q's dtype, 1 float8_e4m3fn, 2 float8_e5m2.
KVCache parse_kv_cache(int code) {
  if (code < 0 || code > 2) fb::fail("decode: kv cache type code must be 0, 1 or 2; got " + std::to_string(code));
  return static_cast<KVCache>(code);
}

int ctas_per_sm(fb::DType dt, int head_dim, int group, bool use_tc, int pos_mode, KVCache kv, int* num_sms,
                int stages = 0) {
  int ctas = 0;
  fb::with_dtype("decode", dt, [&](auto tag) {
    using T = decltype(tag);
    const cudaError_t err = flashinfer::attention::DecodeCtasPerSM<T>(head_dim, group, use_tc,
                                                                      static_cast<PosEncodingMode>(pos_mode), &ctas, num_sms,
                                                                      stages, kv);
    if (err != cudaSuccess) fb::throw_cuda("decode plan", err);
  });
  return ctas;
}

#ifdef FLASHINFER_DECODE_TRACE
// A diagnostic build only: the device address of a trace buffer (benchmarks/trace_decode.py sets
// FLASHINFER_DECODE_TRACE_PTR before each call), or null.
unsigned long long* trace_buffer() {
  const char* e = std::getenv("FLASHINFER_DECODE_TRACE_PTR");
  return e ? reinterpret_cast<unsigned long long*>(static_cast<uintptr_t>(std::strtoull(e, nullptr, 10))) : nullptr;
}
#endif

// FLASHINFER_DECODE_MIN_CHUNK (read once; 0 when unset): the fewest keys per split chunk.
int64_t min_chunk_knob() {
  static const int64_t v = [] {
    const char* e = std::getenv("FLASHINFER_DECODE_MIN_CHUNK");
    return e ? std::atoll(e) : int64_t{0};
  }();
  return v;
}

// The plan and its launch shape. allow_shape (not under CUDA graphs, whose launch shape must
// not depend on the plan): tensor-core work small enough for decode_prefers_deep plans for one
// CTA per SM at kDecodeDeepStages (launched at decode_deep_launch_stages); larger tensor-core
// work is planned for both the default and the wide shape (kDecodeWideStages, more CTAs per SM)
// and takes the wide one where decode_prefers_wide says so and its partial states fit in
// max_partial_states (< 0: no cap).
// Otherwise the default shape (stages 0). allow_wide = false keeps the default for larger work
// (single decode: 32768 keys measured 49.95 us at the default, 52.1 wide; batch 1 x 32768 alike
// either way). cfg arrives with ctas_per_sm at the default depth.
// Knobs, read once: FLASHINFER_DECODE_DEEP (0 never plans deep; n > 1 moves the threshold to n
// keys x KV heads per SM), FLASHINFER_DECODE_WIDE=0 (never plans wide). Plans other than the
// deep ones split no shorter than decode_min_chunk unless FLASHINFER_DECODE_MIN_CHUNK is set.
struct ShapedPlan {
  flashinfer::attention::DecodePlan plan;
  int stages = 0;     // > 0: the plan's pipeline depth; 0: the launch default
  int64_t slots = 0;  // persistent CTAs the plan is for
};

ShapedPlan shaped_plan(const std::vector<int64_t>& lens, const std::vector<int64_t>& begins,
                       flashinfer::attention::DecodePlanConfig cfg, fb::DType dt, int head_dim, bool use_tc,
                       int pos_mode, KVCache kv, bool allow_shape, bool allow_wide, int64_t max_partial_states) {
  using namespace flashinfer::attention;
  static const int64_t deep_keys = [] {
    const char* e = std::getenv("FLASHINFER_DECODE_DEEP");
    return e && *e ? static_cast<int64_t>(std::atoll(e)) : kDecodeDeepKeysPerSM;
  }();
  static const bool wide_on = [] {
    const char* e = std::getenv("FLASHINFER_DECODE_WIDE");
    return !(e && e[0] == '0' && e[1] == 0);
  }();
  const bool tc = decode_uses_tc(use_tc, static_cast<PosEncodingMode>(pos_mode), head_dim, kv);
  const bool shaped = allow_shape && tc;
  auto at_depth = [&](int stages) {
    DecodePlanConfig c = cfg;
    c.ctas_per_sm = ctas_per_sm(dt, head_dim, cfg.group_size, use_tc, pos_mode, kv, &c.num_sms, stages);
    return c;
  };
  if (shaped && decode_prefers_deep(lens, cfg.num_kv_heads, cfg.num_sms, deep_keys)) {
    const DecodePlanConfig c = at_depth(kDecodeDeepStages);  // (launched at decode_deep_launch_stages)
    return {plan_decode(lens, c, begins), decode_deep_launch_stages(head_dim, kv == KVCache::kSameAsQ ? 2 : 1),
            int64_t{c.num_sms} * c.ctas_per_sm};
  }
  if (min_chunk_knob() <= 0) {
    int64_t keys = 0;
    for (int64_t len : lens) keys += len;
    cfg.min_chunk = decode_min_chunk(tc, head_dim, kv == KVCache::kSameAsQ ? 2 : 1, cfg.min_chunk,
                                     keys * cfg.num_kv_heads, cfg.num_sms);
  }
  ShapedPlan out{plan_decode(lens, cfg, begins), 0, int64_t{cfg.num_sms} * cfg.ctas_per_sm};
  if (!shaped || !allow_wide || !wide_on) return out;
  const DecodePlanConfig w = at_depth(kDecodeWideStages);
  if (w.ctas_per_sm <= cfg.ctas_per_sm) return out;  // not wider on this device / head_dim
  const int64_t w_slots = int64_t{w.num_sms} * w.ctas_per_sm;
  DecodePlan wide = plan_decode(lens, w, begins);
  if ((max_partial_states < 0 || wide.num_partial_states <= max_partial_states) &&
      decode_prefers_wide(out.plan, out.slots, wide, w_slots))
    out = {std::move(wide), kDecodeWideStages, w_slots};
  return out;
}

// Split-KV tuning knobs for benchmarks, read once: FLASHINFER_DECODE_WAVES (aim at this many
// CTA waves instead of searching), FLASHINFER_DECODE_MIN_CHUNK (fewest keys per chunk) and
// FLASHINFER_DECODE_ITEM_COST (the planner's fixed cost per work item, in keys).
void apply_split_knobs(flashinfer::attention::DecodePlanConfig* cfg) {
  static const int waves = [] {
    const char* e = std::getenv("FLASHINFER_DECODE_WAVES");
    return e ? std::atoi(e) : 0;
  }();
  static const int64_t item_cost = [] {
    const char* e = std::getenv("FLASHINFER_DECODE_ITEM_COST");
    return e ? std::atoll(e) : int64_t{-1};
  }();
  if (item_cost >= 0) cfg->item_cost = item_cost;
  if (waves > 0) cfg->waves = waves;
  if (min_chunk_knob() > 0) cfg->min_chunk = min_chunk_knob();
}

void check_head_dim(const char* op, int64_t head_dim) {
  if (head_dim != 64 && head_dim != 128 && head_dim != 256 && head_dim != 512)
    fb::fail(std::string(op) + ": head_dim must be one of 64, 128, 256, 512; got " + std::to_string(head_dim));
}

// The KV cache of run(): one tensor ([pages, 2, ...]) or a (k, v) pair, in `layout`.
struct KVView {
  const void* k;
  const void* v;
  int64_t num_pages, page_size, num_heads, head_dim;
  int64_t k_page, k_n, k_h, v_page, v_n, v_h;
  fb::DType dtype;
};

// fp8: the cache tensors arrive as their uint8 views (the Python layer checks their fp8 dtype).
KVView kv_view(const fb::Checker& c, MutTensor& a, std::optional<MutTensor>& b, int layout, bool fp8) {
  KVView kv{};
  const bool hnd = layout == 1;
  auto elem = [fp8](const MutTensor& t, const char* name, const fb::Checker& c) {
    c.last_contiguous(t, name);
    if (!fp8) return c.dtype_half(t, name);
    c.dtype_is(t, name, fb::DType::kU8);
    return fb::DType::kU8;
  };
  if (!b) {  // single tensor: [P, 2, ps, H, D] / [P, 2, H, ps, D], or [P, 2, H, D] (page_size 1)
    c.ndim_in(a, "paged_kv_cache", {4, 5}, "[max_num_pages, 2, page_size, num_kv_heads, head_dim] (NHD), "
              "[max_num_pages, 2, num_kv_heads, page_size, head_dim] (HND) or [max_num_pages, 2, num_kv_heads, head_dim]");
    c.dim_is(a, "paged_kv_cache", 1, 2, "2 (K and V)");
    kv.dtype = elem(a, "paged_kv_cache", c);
    kv.num_pages = a.shape(0);
    kv.k = a.data();
    kv.v = static_cast<const char*>(a.data()) + a.stride(1) * int64_t(a.itemsize());
    kv.k_page = kv.v_page = a.stride(0);
    if (a.ndim() == 5) {
      kv.page_size = a.shape(hnd ? 3 : 2);
      kv.num_heads = a.shape(hnd ? 2 : 3);
      kv.k_n = kv.v_n = a.stride(hnd ? 3 : 2);
      kv.k_h = kv.v_h = a.stride(hnd ? 2 : 3);
    } else {
      kv.page_size = 1;
      kv.num_heads = a.shape(2);
      kv.k_n = kv.v_n = 0;
      kv.k_h = kv.v_h = a.stride(2);
    }
    kv.head_dim = a.shape(a.ndim() - 1);
    return kv;
  }
  MutTensor& v = *b;
  c.ndim_in(a, "paged_kv_cache[0] (k_cache)", {3, 4}, "[max_num_pages, page_size, num_kv_heads, head_dim] (NHD), "
            "[max_num_pages, num_kv_heads, page_size, head_dim] (HND) or [max_num_pages, num_kv_heads, head_dim]");
  c.same_shape(v, "paged_kv_cache[1] (v_cache)", a, "paged_kv_cache[0] (k_cache)");
  kv.dtype = elem(a, "paged_kv_cache[0] (k_cache)", c);
  if (elem(v, "paged_kv_cache[1] (v_cache)", c) != kv.dtype)
    fb::fail(std::string(c.op) + ": k_cache and v_cache must have the same dtype; got " + fb::dtype_name(a) + " and " +
             fb::dtype_name(v));
  kv.k = a.data();
  kv.v = v.data();
  kv.num_pages = a.shape(0);
  kv.k_page = a.stride(0);
  kv.v_page = v.stride(0);
  if (a.ndim() == 4) {
    kv.page_size = a.shape(hnd ? 2 : 1);
    kv.num_heads = a.shape(hnd ? 1 : 2);
    kv.k_n = a.stride(hnd ? 2 : 1), kv.v_n = v.stride(hnd ? 2 : 1);
    kv.k_h = a.stride(hnd ? 1 : 2), kv.v_h = v.stride(hnd ? 1 : 2);
  } else {
    kv.page_size = 1;
    kv.num_heads = a.shape(1);
    kv.k_n = kv.v_n = 0;
    kv.k_h = a.stride(1), kv.v_h = v.stride(1);
  }
  kv.head_dim = a.shape(a.ndim() - 1);
  return kv;
}

using fb::aligned16;

void check_kv_alignment(const fb::Checker& c, const KVView& kv) {
  const bool ok = aligned16(kv.k) && aligned16(kv.v) && kv.k_page % 8 == 0 && kv.v_page % 8 == 0 && kv.k_n % 8 == 0 &&
                  kv.v_n % 8 == 0 && kv.k_h % 8 == 0 && kv.v_h % 8 == 0;
  if (!ok)
    fb::fail(std::string(c.op) + ": the KV cache must be 16-byte aligned with strides that are multiples of 8 "
             "elements (only the last dimension must be contiguous)");
}

// Plan-time constants of a BatchDecodeWithPagedKVCacheWrapper; run() adds the tensors.
class DecodeRunner {
 public:
  DecodeRunner(int device, const std::string& dtype, int64_t batch_size, int num_qo_heads, int num_kv_heads,
               int head_dim, int64_t page_size, int layout, int pos_mode, int window_left, double sm_scale,
               double soft_cap, double rope_scale, double rope_theta, uintptr_t indptr, uintptr_t indices,
               uintptr_t last_page_len, uintptr_t seq_lens, uintptr_t items, uintptr_t num_items, uintptr_t merge,
               uintptr_t partial_o, uintptr_t partial_lse, uintptr_t merge_counters, bool launch_merge,
               int64_t max_grid, int64_t max_page_index, bool use_tc, int64_t num_items_host, int stages,
               int64_t kv_keys_host, int kv_cache, int q_len)
      : device_(device), dtype_(parse_dtype(dtype)), batch_(batch_size), hq_(num_qo_heads), hkv_(num_kv_heads),
        hd_(head_dim), page_size_(page_size), layout_(layout), pos_(pos_mode), window_(window_left),
        sm_scale_(float(sm_scale)), soft_cap_(float(soft_cap)), rope_scale_(float(rope_scale)),
        rope_theta_(float(rope_theta)), indptr_(indptr), indices_(indices), last_(last_page_len), seq_lens_(seq_lens),
        items_(items), num_items_(num_items), merge_(merge), partial_o_(partial_o), partial_lse_(partial_lse),
        counters_(merge_counters),
        launch_merge_(launch_merge), max_grid_(max_grid), max_page_index_(max_page_index), use_tc_(use_tc),
        num_items_host_(num_items_host), stages_(stages), kv_keys_host_(kv_keys_host),
        kv_cache_(parse_kv_cache(kv_cache)), q_len_(q_len) {
    check_head_dim("BatchDecodeWithPagedKVCacheWrapper.plan", head_dim);
    if (num_kv_heads <= 0) fb::fail("BatchDecodeWithPagedKVCacheWrapper.plan: num_kv_heads must be positive");
    if (q_len < 1 || (num_qo_heads / num_kv_heads) % q_len != 0)
      fb::fail("BatchDecodeWithPagedKVCacheWrapper.plan: q_len_per_req " + std::to_string(q_len) +
               " must be >= 1 and divide the columns per KV head (" + std::to_string(num_qo_heads / num_kv_heads) + ")");
  }

  void run(MutTensor q, MutTensor kv_a, std::optional<MutTensor> kv_b, MutTensor out, std::optional<MutTensor> lse,
           double scale_mult, uintptr_t stream, bool enable_pdl) {
    const fb::Checker c{"BatchDecodeWithPagedKVCacheWrapper.run"};
    c.ndim_in(q, "q", {3}, "3-D [batch_size * q_len_per_req, num_qo_heads, head_dim]");
    // q_len_ > 1: the plan's heads are query columns, q_len_ per q head (decode.h decode_query)
    const int hq = hq_ / q_len_;
    const int64_t rows = batch_ * q_len_;
    const fb::DType dt = c.dtype_half(q, "q");
    if (dt != dtype_)
      fb::fail(std::string("The dtype of q ") + fb::dtype_str(dt) + " does not match the q_data_type " +
               fb::dtype_str(dtype_) + " specified in plan function.");
    c.dim_is(q, "q", 0, rows, "the planned batch size * q_len_per_req");
    c.dim_is(q, "q", 1, hq, "num_qo_heads");
    c.dim_is(q, "q", 2, hd_, "head_dim");
    c.last_contiguous(q, "q");
    const bool fp8 = kv_cache_ != KVCache::kSameAsQ;
    KVView kv = kv_view(c, kv_a, kv_b, layout_, fp8);
    if (!fp8 && kv.dtype != dtype_)
      fb::fail(std::string("The dtype of k ") + fb::dtype_str(kv.dtype) + " does not match the kv_data_type " +
               fb::dtype_str(dtype_) + " specified in plan function.");
    if (kv.num_heads != hkv_)
      fb::fail(std::string(c.op) + ": paged_kv_cache has " + std::to_string(kv.num_heads) +
               " KV heads; the plan says num_kv_heads = " + std::to_string(hkv_));
    if (kv.head_dim != hd_)
      fb::fail(std::string(c.op) + ": paged_kv_cache head_dim is " + std::to_string(kv.head_dim) +
               "; the plan says " + std::to_string(hd_));
    if (kv.page_size != page_size_)
      fb::fail(std::string(c.op) + ": paged_kv_cache page_size is " + std::to_string(kv.page_size) +
               "; the plan says page_size = " + std::to_string(page_size_));
    if (max_page_index_ >= kv.num_pages)
      fb::fail(std::string(c.op) + ": the planned indices reference page " + std::to_string(max_page_index_) +
               " but paged_kv_cache has only " + std::to_string(kv.num_pages) + " pages");
    check_kv_alignment(c, kv);
    bool out_ok = out.ndim() == 3 && fb::dtype_of(out) == dt;  // (its device: cuda_device below names it)
    for (size_t i = 0; out_ok && i < 3; ++i) out_ok = out.shape(i) == q.shape(i);
    if (!out_ok)
      fb::fail("Invalid shape of out: expected " + fb::shape_str(q) + " " + fb::dtype_str(dt) + "; got " +
               fb::shape_str(out) + " " + fb::dtype_name(out));
    c.last_contiguous(out, "out");
    const flashinfer::RowLayout out_l{hq, out.stride(0), out.stride(1)};
    c.rows_disjoint(out, "out", out_l, rows * hq, hd_);
    // out = q itself is fine (a request's q rows are read before its o rows are written); any
    // other overlap would race between CTAs
    c.out_apart(out, out_l, hd_, q, "q", flashinfer::RowLayout{hq, q.stride(0), q.stride(1)}, hd_, rows * hq, {0});
    if (lse) {
      c.ndim_in(*lse, "lse", {2}, "2-D [batch_size * q_len_per_req, num_qo_heads]");
      c.dim_is(*lse, "lse", 0, rows, "batch_size * q_len_per_req");
      c.dim_is(*lse, "lse", 1, hq, "num_qo_heads");
      c.dtype_is(*lse, "lse", fb::DType::kF32);
      if (lse->stride(1) != 1 || (rows > 1 && lse->stride(0) != hq))
        fb::fail(std::string(c.op) + ": lse must be contiguous");
    }
    if (!aligned16(q.data()) || q.stride(0) % 8 || q.stride(1) % 8 || !aligned16(out.data()) || out.stride(0) % 8 ||
        out.stride(1) % 8)
      fb::fail(std::string(c.op) + ": q and out must be 16-byte aligned with row strides that are multiples of 8");
    const int dev = lse ? c.cuda_device({{&q, "q"}, {&kv_a, "paged_kv_cache"}, {&out, "out"}, {&*lse, "lse"}})
                        : c.cuda_device({{&q, "q"}, {&kv_a, "paged_kv_cache"}, {&out, "out"}});
    if (kv_b) c.cuda_device({{&q, "q"}, {&*kv_b, "paged_kv_cache[1]"}});
    if (dev != device_)
      fb::fail(std::string(c.op) + ": tensors are on cuda:" + std::to_string(dev) + " but the wrapper's workspace is on cuda:" +
               std::to_string(device_));
    fb::DeviceGuard guard(c.op, dev);
    const bool pdl = enable_pdl && fb::device_supports_pdl(dev);
    fb::with_dtype(c.op, dt, [&](auto tag) {
      using T = decltype(tag);
      DecodeParams<T> p{};
      p.q = static_cast<const T*>(q.data());
      p.q_stride_n = q.stride(0), p.q_stride_h = q.stride(1);
      p.kv.k_data = static_cast<const T*>(kv.k);
      p.kv.v_data = static_cast<const T*>(kv.v);
      p.kv.indptr = reinterpret_cast<const int32_t*>(indptr_);
      p.kv.indices = reinterpret_cast<const int32_t*>(indices_);
      p.kv.last_page_len = reinterpret_cast<const int32_t*>(last_);
      p.kv.batch_size = batch_, p.kv.page_size = page_size_, p.kv.num_heads = hkv_, p.kv.head_dim = hd_;
      p.kv.stride_page = kv.k_page, p.kv.stride_n = kv.k_n, p.kv.stride_h = kv.k_h;
      p.v_stride_page = kv.v_page, p.v_stride_n = kv.v_n, p.v_stride_h = kv.v_h;
      p.kv_cache = kv_cache_;
      p.q_len = q_len_;
      p.num_pages = kv.num_pages;
      p.contiguous_len = -1;
      p.seq_lens = reinterpret_cast<const int32_t*>(seq_lens_);
      p.o = static_cast<T*>(out.data());
      p.o_stride_n = out.stride(0), p.o_stride_h = out.stride(1);
      p.lse = lse ? static_cast<float*>(lse->data()) : nullptr;
      p.items = reinterpret_cast<const flashinfer::attention::DecodeWorkItem*>(items_);
      p.num_items = reinterpret_cast<const int32_t*>(num_items_);
      p.num_items_host = num_items_host_;
      p.kv_keys_host = kv_keys_host_;
      p.stages = stages_;
      p.merge = reinterpret_cast<const flashinfer::attention::DecodeMergeInfo*>(merge_);
      p.partial_o = reinterpret_cast<float*>(partial_o_);
      p.partial_lse = reinterpret_cast<float*>(partial_lse_);
      p.merge_counters = reinterpret_cast<int32_t*>(counters_);
      p.batch_size = batch_;
      p.num_qo_heads = hq_, p.num_kv_heads = hkv_, p.group_size = hq_ / hkv_;
      p.head_dim = hd_;
      p.sub_groups = flashinfer::attention::decode_sub_groups(p.group_size, p.head_dim);
      p.sm_scale = sm_scale_ * float(scale_mult);
      p.soft_cap = soft_cap_;
      p.window_left = window_;
      p.pos_encoding = static_cast<PosEncodingMode>(pos_);
      p.rope_scale = rope_scale_, p.rope_theta = rope_theta_;
      p.pdl = pdl;
#ifdef FLASHINFER_DECODE_TRACE
      p.trace = trace_buffer();
#endif
      const cudaStream_t st = fb::as_stream(stream, dev);
      if (max_grid_ == 0) note_capture(st, kv.num_pages);
      const cudaError_t err = flashinfer::attention::Decode(p, use_tc_, launch_merge_, max_grid_, st);
      if (err != cudaSuccess) fb::throw_cuda(c.op, err);
    });
  }

  // Under CUDA graphs (max_grid_ 0): the fewest cache pages a run captured into a graph, -1 if
  // none. A replay skips run()'s checks, so the next plan() checks its page indices against it.
  int64_t captured_pages() const { return captured_pages_; }

 private:
  void note_capture(cudaStream_t st, int64_t num_pages) {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    if (st == nullptr) return;  // (the legacy stream is never captured; asking it can fail mid-capture)
    if (cudaStreamIsCapturing(st, &status) != cudaSuccess) {
      (void)cudaGetLastError();  // (not the launch's error)
      return;
    }
    if (status == cudaStreamCaptureStatusActive)
      captured_pages_ = captured_pages_ < 0 ? num_pages : std::min(captured_pages_, num_pages);
  }

  int device_;
  fb::DType dtype_;
  int64_t batch_;
  int hq_, hkv_, hd_;
  int64_t page_size_;
  int layout_, pos_, window_;
  float sm_scale_, soft_cap_, rope_scale_, rope_theta_;
  uintptr_t indptr_, indices_, last_, seq_lens_, items_, num_items_, merge_, partial_o_, partial_lse_, counters_;
  bool launch_merge_;
  int64_t max_grid_, max_page_index_;
  bool use_tc_;
  int64_t num_items_host_;  // > 0: the plan's item count (0 under CUDA graphs: read on the device)
  int stages_;              // > 0: the plan's pipeline depth
  int64_t kv_keys_host_;    // > 0: the plan's total key count (0 under CUDA graphs)
  KVCache kv_cache_;        // the planned cache element type
  int q_len_;               // query tokens per request (their columns: decode_query)
  int64_t captured_pages_ = -1;
};

// Host planner: kv lengths and page-table starts -> (items [n, 8], merge [batch, 2], partial
// states, any split, chunk, grid, stages, total keys). allow_shape and max_partial_states: see shaped_plan.
nb::tuple plan(nb::ndarray<const int64_t, nb::ndim<1>, nb::device::cpu, nb::c_contig> kv_lens,
               nb::ndarray<const int64_t, nb::ndim<1>, nb::device::cpu, nb::c_contig> page_begins, int num_qo_heads,
               int num_kv_heads, int head_dim, int64_t page_size, const std::string& dtype, bool disable_split_kv,
               int64_t fixed_split_tokens, bool use_tc, int pos_mode, int device, bool allow_shape,
               int64_t max_partial_states, int kv_cache) {
  const char* op = "BatchDecodeWithPagedKVCacheWrapper.plan";
  check_head_dim(op, head_dim);
  if (num_kv_heads <= 0 || num_qo_heads % num_kv_heads != 0)
    fb::fail(std::string(op) + ": num_qo_heads (" + std::to_string(num_qo_heads) +
             ") must be a positive multiple of num_kv_heads (" + std::to_string(num_kv_heads) + ")");
  fb::DeviceGuard guard(op, device);
  const fb::DType dt = parse_dtype(dtype);
  const KVCache kv = parse_kv_cache(kv_cache);
  flashinfer::attention::DecodePlanConfig cfg;
  cfg.ctas_per_sm = ctas_per_sm(dt, head_dim, num_qo_heads / num_kv_heads, use_tc, pos_mode, kv, &cfg.num_sms);
  cfg.num_kv_heads = num_kv_heads;
  cfg.group_size = num_qo_heads / num_kv_heads;
  cfg.max_group_per_cta = flashinfer::attention::decode_max_group(head_dim);
  cfg.page_size = page_size;
  cfg.disable_split_kv = disable_split_kv;
  cfg.fixed_split_tokens = fixed_split_tokens;
  apply_split_knobs(&cfg);
  std::vector<int64_t> lens(kv_lens.data(), kv_lens.data() + kv_lens.shape(0));
  if (page_begins.shape(0) != kv_lens.shape(0))
    fb::fail(std::string(op) + ": page_begins must have one entry per request");
  std::vector<int64_t> begins(page_begins.data(), page_begins.data() + page_begins.shape(0));
  const ShapedPlan sp = shaped_plan(lens, begins, cfg, dt, head_dim, use_tc, pos_mode, kv, allow_shape, true,
                                     max_partial_states);
  const auto& pl = sp.plan;
  const size_t n = pl.items.size();
  constexpr size_t kInts = flashinfer::attention::kDecodeWorkItemInts;
  std::vector<int32_t> dummy(kInts, 0);
  auto items = numpy_copy(n ? reinterpret_cast<const int32_t*>(pl.items.data()) : dummy.data(), {n, kInts});
  auto merge = numpy_copy(lens.empty() ? dummy.data() : reinterpret_cast<const int32_t*>(pl.merge.data()), {lens.size(), 2});
  int64_t keys = 0;
  for (int64_t len : lens) keys += len > 0 ? len : 0;
  // FLASHINFER_DECODE_MERGE (read once): "last" always merges in the decode kernel, "kernel" always
  // in DecodeMergeKernel; unset: decode_merges_in_kernel. CUDA graphs (allow_shape false) keep
  // the in-kernel merge, whose launch does not depend on the plan.
  static const int merge_mode = [] {
    const char* e = std::getenv("FLASHINFER_DECODE_MERGE");
    if (e && std::strcmp(e, "last") == 0) return 1;
    if (e && std::strcmp(e, "kernel") == 0) return 2;
    return 0;
  }();
  const bool merge_kernel = allow_shape && pl.any_split &&
                            (merge_mode == 2 || (merge_mode == 0 && !flashinfer::attention::decode_merges_in_kernel(pl)));
  return nb::make_tuple(items, merge, pl.num_partial_states, pl.any_split, pl.chunk_tokens, sp.slots, sp.stages,
                        keys, merge_kernel);
}

// Keys per chunk, chunk count and pipeline depth for single decode of kv_len keys (the same
// planner).
nb::tuple single_plan(int64_t kv_len, int num_qo_heads, int num_kv_heads, int head_dim, const std::string& dtype,
                      bool use_tc, int pos_mode, int device, int kv_cache) {
  const char* op = "single_decode_with_kv_cache";
  check_head_dim(op, head_dim);
  fb::DeviceGuard guard(op, device);
  const fb::DType dt = parse_dtype(dtype);
  const KVCache kv = parse_kv_cache(kv_cache);
  flashinfer::attention::DecodePlanConfig cfg;
  cfg.ctas_per_sm = ctas_per_sm(dt, head_dim, num_qo_heads / num_kv_heads, use_tc, pos_mode, kv, &cfg.num_sms);
  cfg.num_kv_heads = num_kv_heads;
  cfg.group_size = num_qo_heads / num_kv_heads;
  cfg.max_group_per_cta = flashinfer::attention::decode_max_group(head_dim);
  apply_split_knobs(&cfg);
  const ShapedPlan sp = shaped_plan({kv_len}, {}, cfg, dt, head_dim, use_tc, pos_mode, kv, true, false, -1);
  const int64_t chunks = sp.plan.merge[0].num_chunks;
  const int64_t chunk = chunks > 1 ? (kv_len + chunks - 1) / chunks : (kv_len > 0 ? kv_len : 1);
  return nb::make_tuple(chunk, chunks, sp.stages);
}

// partial: float32 scratch of >= chunks * num_qo_heads * (head_dim + 1) elements when chunks > 1
// (the partial outputs, then their LSEs): one allocation per call instead of two.
void single_decode(MutTensor q, MutTensor k, MutTensor v, MutTensor out, std::optional<MutTensor> lse,
                   std::optional<MutTensor> partial, int layout,
                   int64_t chunk, int64_t chunks, int pos_mode, int window_left, double sm_scale, double soft_cap,
                   double rope_scale, double rope_theta, bool use_tc, uintptr_t stream, bool enable_pdl, int stages,
                   int kv_cache) {
  const fb::Checker c{"single_decode_with_kv_cache"};
  c.ndim_in(q, "q", {2}, "2-D [num_qo_heads, head_dim]");
  const fb::DType dt = c.dtype_half(q, "q");
  c.last_contiguous(q, "q");
  c.ndim_in(k, "k", {3}, layout == 1 ? "3-D [num_kv_heads, kv_len, head_dim] (HND)" : "3-D [kv_len, num_kv_heads, head_dim] (NHD)");
  c.same_shape(v, "v", k, "k");
  const KVCache kvc = parse_kv_cache(kv_cache);
  const fb::DType kv_dt = kvc == KVCache::kSameAsQ ? dt : fb::DType::kU8;  // (fp8: their uint8 views)
  c.dtype_is(k, "k", kv_dt);
  c.dtype_is(v, "v", kv_dt);
  c.last_contiguous(k, "k");
  c.last_contiguous(v, "v");
  const int64_t hq = q.shape(0), hd = q.shape(1);
  const int hn = layout == 1 ? 0 : 1, ln = layout == 1 ? 1 : 0;
  const int64_t hkv = k.shape(hn), kv_len = k.shape(ln);
  check_head_dim(c.op, hd);
  c.dim_is(k, "k", 2, hd, "q.shape[-1] (head_dim)");
  if (hkv <= 0 || hq % hkv != 0)
    fb::fail(std::string(c.op) + ": num_qo_heads (" + std::to_string(hq) + ") must be a multiple of num_kv_heads (" +
             std::to_string(hkv) + ")");
  c.same_shape(out, "out", q, "q");
  c.dtype_is(out, "out", dt);
  if (lse) {
    c.ndim_in(*lse, "lse", {1}, "1-D [num_qo_heads]");
    c.dim_is(*lse, "lse", 0, hq, "num_qo_heads");
    c.dtype_is(*lse, "lse", fb::DType::kF32);
  }
  float* partial_o = nullptr;
  float* partial_lse = nullptr;
  if (chunks > 1) {
    if (!partial) fb::fail(std::string(c.op) + ": split decode needs a partial-state buffer");
    c.dtype_is(*partial, "partial", fb::DType::kF32);
    int64_t n = 1;
    for (size_t i = 0; i < partial->ndim(); ++i) n *= static_cast<int64_t>(partial->shape(i));
    if (n < chunks * hq * (hd + 1) || (partial->ndim() == 1 && partial->stride(0) != 1))
      fb::fail(std::string(c.op) + ": partial must be a contiguous float32 buffer of >= " +
               std::to_string(chunks * hq * (hd + 1)) + " elements; got " + std::to_string(n));
    partial_o = static_cast<float*>(partial->data());
    partial_lse = partial_o + chunks * hq * hd;
  }
  KVView kv{k.data(), v.data(), 1, std::max<int64_t>(kv_len, 1), hkv, hd, 0, k.stride(ln), k.stride(hn), 0,
            v.stride(ln), v.stride(hn), dt};
  check_kv_alignment(c, kv);
  if (!aligned16(q.data()) || q.stride(0) % 8 || !aligned16(out.data()) || out.stride(0) % 8)
    fb::fail(std::string(c.op) + ": q and out must be 16-byte aligned with row strides that are multiples of 8");
  const int dev = c.cuda_device({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}});
  fb::DeviceGuard guard(c.op, dev);
  const bool pdl = enable_pdl && fb::device_supports_pdl(dev);
  fb::with_dtype(c.op, dt, [&](auto tag) {
    using T = decltype(tag);
    DecodeParams<T> p{};
    p.q = static_cast<const T*>(q.data());
    p.q_stride_n = 0, p.q_stride_h = q.stride(0);
    p.kv.k_data = static_cast<const T*>(kv.k);
    p.kv.v_data = static_cast<const T*>(kv.v);
    p.kv.batch_size = 1, p.kv.page_size = kv.page_size, p.kv.num_heads = hkv, p.kv.head_dim = hd;
    p.kv.stride_page = 0, p.kv.stride_n = kv.k_n, p.kv.stride_h = kv.k_h;
    p.v_stride_page = 0, p.v_stride_n = kv.v_n, p.v_stride_h = kv.v_h;
    p.kv_cache = kvc;
    p.contiguous_len = kv_len;
    p.o = static_cast<T*>(out.data());
    p.o_stride_n = 0, p.o_stride_h = out.stride(0);
    p.lse = lse ? static_cast<float*>(lse->data()) : nullptr;
    p.implicit_chunk = chunk, p.implicit_chunks = chunks;
    p.partial_o = partial_o;
    p.partial_lse = partial_lse;
    p.batch_size = 1;
    p.num_qo_heads = int(hq), p.num_kv_heads = int(hkv), p.group_size = int(hq / hkv);
    p.head_dim = int(hd);
    p.sub_groups = flashinfer::attention::decode_sub_groups(p.group_size, p.head_dim);
    p.sm_scale = float(sm_scale), p.soft_cap = float(soft_cap), p.window_left = window_left;
    p.pos_encoding = static_cast<PosEncodingMode>(pos_mode);
    p.rope_scale = float(rope_scale), p.rope_theta = float(rope_theta);
    p.pdl = pdl;
    p.stages = stages;
#ifdef FLASHINFER_DECODE_TRACE
    p.trace = trace_buffer();
#endif
    const int64_t n_items = int64_t{hkv} * p.sub_groups * chunks;
    const cudaError_t err = flashinfer::attention::Decode(p, use_tc, chunks > 1, n_items, fb::as_stream(stream, dev));
    if (err != cudaSuccess) fb::throw_cuda(c.op, err);
  });
}

}  // namespace

NB_MODULE(_decode, m) {
  flashinfer_bind::register_argument_error();
  m.doc() = "flashinfer decode attention (see flashinfer.decode)";
  m.def("plan", &plan, "kv_lens"_a, "page_begins"_a, "num_qo_heads"_a, "num_kv_heads"_a, "head_dim"_a, "page_size"_a, "dtype"_a,
        "disable_split_kv"_a, "fixed_split_tokens"_a, "use_tensor_cores"_a, "pos_encoding_mode"_a, "device"_a,
        "allow_shape"_a, "max_partial_states"_a, "kv_cache"_a);
  m.def("sub_groups", &flashinfer::attention::decode_sub_groups, "group_size"_a, "head_dim"_a,
        "q-head sub-groups (CTA work units per KV head) of a GQA group at head_dim");
  m.def("single_plan", &single_plan, "kv_len"_a, "num_qo_heads"_a, "num_kv_heads"_a, "head_dim"_a, "dtype"_a,
        "use_tensor_cores"_a, "pos_encoding_mode"_a, "device"_a, "kv_cache"_a);
  m.def("single_decode", &single_decode, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "partial"_a.none(),
        "layout"_a, "chunk"_a, "chunks"_a, "pos_encoding_mode"_a, "window_left"_a,
        "sm_scale"_a, "soft_cap"_a, "rope_scale"_a, "rope_theta"_a, "use_tensor_cores"_a, "stream"_a, "enable_pdl"_a,
        "stages"_a, "kv_cache"_a);
  nb::class_<DecodeRunner>(m, "DecodeRunner")
      .def(nb::init<int, const std::string&, int64_t, int, int, int, int64_t, int, int, int, double, double, double,
                    double, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t, uintptr_t,
                    uintptr_t, uintptr_t, bool, int64_t, int64_t, bool, int64_t, int, int64_t, int, int>())
      .def("run", &DecodeRunner::run, "q"_a, "kv_a"_a, "kv_b"_a.none(), "out"_a, "lse"_a.none(), "scale_mult"_a,
           "stream"_a, "enable_pdl"_a)
      .def_prop_ro("captured_pages", &DecodeRunner::captured_pages);
}
