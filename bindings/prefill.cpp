// _prefill: single-request prefill attention (flashinfer.prefill.single_prefill_with_kv_cache).
// Checks, Params, launch; RoPE, mask packing and argument defaults live in the Python layer.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/pair.h>
#include <nanobind/stl/tuple.h>
#include <nanobind/stl/vector.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <optional>
#include <string>
#include <tuple>
#include <utility>
#include <vector>

#include "common.h"
#include "dispatch_dtype.h"
#include "prefill_inst.h"

namespace fb = flashinfer_bind;
namespace nb = nanobind;
using namespace nb::literals;
using flashinfer::attention::PrefillParams;
using fb::MutTensor;

namespace {

using fb::aligned16;

// q / k / v are read in 16-byte pieces: base 16-byte aligned, every stride a multiple of 8
// elements (size-1 dimensions excepted).
void check_vectors(const fb::Checker& c, const MutTensor& t, const char* name) {
  bool ok = aligned16(t.data());
  for (size_t i = 0; i + 1 < t.ndim(); ++i) ok = ok && (t.shape(i) <= 1 || t.stride(i) % 8 == 0);
  if (!ok)
    fb::fail(std::string(c.op) + ": " + name + " must be 16-byte aligned with strides that are multiples of 8 elements; "
             "got strides " + fb::stride_str(t));
}

void check_head_dims(const char* op, int64_t dqk, int64_t dvo) {
  if (!flashinfer::attention::prefill_head_dims_supported(static_cast<int>(dqk), static_cast<int>(dvo)))
    fb::fail(std::string(op) + ": (head_dim_qk, head_dim_vo) must be (64, 64), (128, 128), (256, 256), (512, 512) or "
             "(192, 128); got (" + std::to_string(dqk) + ", " + std::to_string(dvo) + ")");
}

void check_head_counts(const char* op, int64_t hq, int64_t hkv) {
  if (hkv <= 0 || hq % hkv != 0)
    fb::fail(std::string(op) + ": num_qo_heads (" + std::to_string(hq) + ") must be a multiple of num_kv_heads (" +
             std::to_string(hkv) + ")");
}

// out [rows, hq, dvo] of q's dtype and lse [rows, hq] float32, contiguous. rows_name: the rows'
// name in shapes (qo_len, total_q); rows_what: where the count comes from (qo_len, q.shape[0]).
void check_outputs(const fb::Checker& c, const MutTensor& out, const std::optional<MutTensor>& lse, fb::DType dt,
                   int64_t rows, const char* rows_name, const char* rows_what, int64_t hq, int64_t dvo) {
  c.ndim_in(out, "out", {3}, ("3-D [" + std::string(rows_name) + ", num_qo_heads, head_dim_vo]").c_str());
  c.dim_is(out, "out", 0, rows, rows_what);
  c.dim_is(out, "out", 1, hq, "num_qo_heads");
  c.dim_is(out, "out", 2, dvo, "v.shape[-1] (head_dim_vo)");
  c.dtype_is(out, "out", dt);
  c.last_contiguous(out, "out");
  if (lse) {
    c.ndim_in(*lse, "lse", {2}, ("2-D [" + std::string(rows_name) + ", num_qo_heads]").c_str());
    c.dim_is(*lse, "lse", 0, rows, rows_what);
    c.dim_is(*lse, "lse", 1, hq, "num_qo_heads");
    c.dtype_is(*lse, "lse", fb::DType::kF32);
    if ((rows > 1 && lse->stride(0) != hq) || (hq > 1 && lse->stride(1) != 1))
      fb::fail(std::string(c.op) + ": lse must be contiguous; got strides " + fb::stride_str(*lse));
  }
}

// The kernels store o two elements at a time: 4-byte aligned, even strides.
// out [rows, hq, dvo] against q [rows, hq, dqk]: out = q itself is fine (a CTA reads its q rows
// before it writes their o rows, and split chunks are merged by a later kernel); any other shared
// byte would race between CTAs.
void check_out_apart_q(const fb::Checker& c, const MutTensor& out, const MutTensor& q, int64_t rows, int64_t hq,
                       int64_t dvo, int64_t dqk) {
  c.out_apart(out, flashinfer::RowLayout{hq, out.stride(0), out.stride(1)}, dvo, q, "q",
              flashinfer::RowLayout{hq, q.stride(0), q.stride(1)}, dqk, rows * hq, {0});
}

void check_out_pairs(const fb::Checker& c, const MutTensor& out) {
  if (reinterpret_cast<uintptr_t>(out.data()) % 4 || (out.shape(0) > 1 && out.stride(0) % 2) ||
      (out.shape(1) > 1 && out.stride(1) % 2))
    fb::fail(std::string(c.op) + ": out must be 4-byte aligned with even strides; got strides " + fb::stride_str(out));
}

// What single and batch prefill fill alike: the tensors and their strides (k / v: token dim ln,
// head dim hn), head counts and dims, and the score options.
template <typename T>
void fill_attention(PrefillParams<T>& p, const MutTensor& q, const MutTensor& k, const MutTensor& v,
                    const MutTensor& out, const std::optional<MutTensor>& lse, const std::optional<MutTensor>& mask,
                    int ln, int hn, int64_t hq, int64_t hkv, int64_t dqk, int64_t dvo, bool causal, int window_left,
                    double sm_scale, double soft_cap, bool alibi, double v_scale, bool pdl) {
  p.q = static_cast<const T*>(q.data());
  p.k = static_cast<const T*>(k.data());
  p.v = static_cast<const T*>(v.data());
  p.o = static_cast<T*>(out.data());
  p.lse = lse ? static_cast<float*>(lse->data()) : nullptr;
  p.mask = mask ? static_cast<const uint8_t*>(mask->data()) : nullptr;
  p.q_stride_n = q.stride(0), p.q_stride_h = q.stride(1);
  p.k_stride_n = k.stride(ln), p.k_stride_h = k.stride(hn);
  p.v_stride_n = v.stride(ln), p.v_stride_h = v.stride(hn);
  p.o_stride_n = out.stride(0), p.o_stride_h = out.stride(1);
  p.num_qo_heads = static_cast<int>(hq), p.num_kv_heads = static_cast<int>(hkv);
  p.head_dim_qk = static_cast<int>(dqk), p.head_dim_vo = static_cast<int>(dvo);
  p.causal = causal && !mask;
  p.window_left = window_left;
  p.sm_scale = static_cast<float>(sm_scale);
  p.soft_cap = soft_cap > 0 ? static_cast<float>(soft_cap) : 0.f;
  p.alibi = alibi;
  p.v_scale = static_cast<float>(v_scale);
  p.pdl = pdl;
}

void single_prefill(MutTensor q, MutTensor k, MutTensor v, MutTensor out, std::optional<MutTensor> lse,
                    std::optional<MutTensor> mask, int layout, bool causal, int window_left, double sm_scale,
                    double soft_cap, bool alibi, double v_scale, uintptr_t stream, bool enable_pdl) {
  const fb::Checker c{"single_prefill_with_kv_cache"};
  if (layout != 0 && layout != 1) fb::fail(std::string(c.op) + ": kv_layout must be 0 (NHD) or 1 (HND); got " + std::to_string(layout));
  c.ndim_in(q, "q", {3}, "3-D [qo_len, num_qo_heads, head_dim]");
  const fb::DType dt = c.dtype_half(q, "q");
  const char* kv_what = layout == 1 ? "3-D [num_kv_heads, kv_len, head_dim] (HND)" : "3-D [kv_len, num_kv_heads, head_dim] (NHD)";
  c.ndim_in(k, "k", {3}, kv_what);
  c.ndim_in(v, "v", {3}, kv_what);
  c.dtype_is(k, "k", dt);
  c.dtype_is(v, "v", dt);
  c.last_contiguous(q, "q");
  c.last_contiguous(k, "k");
  c.last_contiguous(v, "v");
  const int hn = layout == 1 ? 0 : 1, ln = layout == 1 ? 1 : 0;
  const int64_t qo_len = q.shape(0), hq = q.shape(1), dqk = q.shape(2);
  const int64_t kv_len = k.shape(ln), hkv = k.shape(hn), dvo = v.shape(2);
  c.dim_is(k, "k", 2, dqk, "q.shape[-1] (head_dim_qk)");
  c.dim_is(v, "v", ln, kv_len, "k's kv_len");
  c.dim_is(v, "v", hn, hkv, "k's num_kv_heads");
  check_head_dims(c.op, dqk, dvo);
  check_head_counts(c.op, hq, hkv);
  check_outputs(c, out, lse, dt, qo_len, "qo_len", "qo_len", hq, dvo);
  if (mask) {
    c.ndim_in(*mask, "packed_custom_mask", {1}, "1-D uint8 (bits packed little-endian)");
    c.dtype_is(*mask, "packed_custom_mask", fb::DType::kU8);
    const int64_t need = (qo_len * kv_len + 7) / 8;
    if (static_cast<int64_t>(mask->shape(0)) < need)
      fb::fail(std::string(c.op) + ": packed_custom_mask must hold ceil(qo_len * kv_len / 8) = " + std::to_string(need) +
               " bytes; got " + std::to_string(mask->shape(0)));
    if (mask->shape(0) > 1 && mask->stride(0) != 1)
      fb::fail(std::string(c.op) + ": packed_custom_mask must be contiguous; got stride " + std::to_string(mask->stride(0)));
  }
  if (window_left < -1) fb::fail(std::string(c.op) + ": window_left must be >= -1; got " + std::to_string(window_left));
  check_vectors(c, q, "q");
  check_vectors(c, k, "k");
  check_vectors(c, v, "v");
  check_out_pairs(c, out);
  check_out_apart_q(c, out, q, qo_len, hq, dvo, dqk);
  if (qo_len * (hq / hkv) > (int64_t{1} << 31) - 1 - flashinfer::attention::kPrefillMaxRows ||
      kv_len > (int64_t{1} << 31) - 1 - flashinfer::attention::kPrefillKeys || hkv > 65535)
    fb::fail(std::string(c.op) + ": qo_len * group_size and kv_len must be < 2^31 and num_kv_heads <= 65535");
  const int dev = c.cuda_device({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}});
  if (lse) c.cuda_device({{&q, "q"}, {&*lse, "lse"}});
  if (mask) c.cuda_device({{&q, "q"}, {&*mask, "packed_custom_mask"}});
  if (qo_len == 0 || hq == 0) return;
  fb::DeviceGuard guard(c.op, dev);
  const bool pdl = enable_pdl && fb::device_supports_pdl(dev);
  fb::with_dtype(c.op, dt, [&](auto tag) {
    using T = decltype(tag);
    PrefillParams<T> p{};
    fill_attention(p, q, k, v, out, lse, mask, ln, hn, hq, hkv, dqk, dvo, causal, window_left, sm_scale, soft_cap, alibi,
                   v_scale, pdl);
    p.qo_len = qo_len, p.kv_len = kv_len;
    const cudaError_t err = flashinfer::attention::SinglePrefill(p, fb::as_stream(stream, dev));
    if (err != cudaSuccess) fb::throw_cuda(c.op, err);
  });
}

// The batch's work items (prefill_plan_batch) and M tiles per warp (prefill_m_tiles of the
// whole batch's CTAs).
std::pair<std::vector<int32_t>, int> plan_batch(const std::vector<int64_t>& qo_lens, const std::vector<int64_t>& kv_lens,
                                                int64_t num_qo_heads, int64_t num_kv_heads, int head_dim_qk,
                                                int head_dim_vo, int num_sms) {
  const char* op = "BatchPrefillWrapper.plan";
  if (qo_lens.size() != kv_lens.size())
    fb::fail(std::string(op) + ": qo and kv lengths must be given for the same requests; got " +
             std::to_string(qo_lens.size()) + " and " + std::to_string(kv_lens.size()));
  check_head_counts(op, num_qo_heads, num_kv_heads);
  if (!(num_kv_heads == 1 && flashinfer::attention::mla_head_dims_supported(head_dim_qk, head_dim_vo)))
    check_head_dims(op, head_dim_qk, head_dim_vo);
  const int group = static_cast<int>(num_qo_heads / num_kv_heads);
  int64_t ctas = 0;
  for (size_t b = 0; b < qo_lens.size(); ++b) {
    if (qo_lens[b] < 0 || kv_lens[b] < 0) fb::fail(std::string(op) + ": negative length for request " + std::to_string(b));
    ctas += (qo_lens[b] * group + flashinfer::attention::prefill_rows(2) - 1) / flashinfer::attention::prefill_rows(2);
  }
  const int mt = flashinfer::attention::prefill_max_m_tiles(head_dim_qk, head_dim_vo) == 2 &&
                         ctas * num_kv_heads >= int64_t{2} * num_sms
                     ? 2
                     : 1;
  return {flashinfer::attention::prefill_plan_batch(qo_lens, kv_lens, group, mt), mt};
}

// plan_batch with split-KV: (items, m_tiles, chunks). A batch of one-M-tile CTAs that leaves SMs
// idle gets prefill_num_chunks key chunks per request (at most max_chunks: what the caller's
// workspace holds; <= 1: no split) and items of prefill_split_items.
std::tuple<std::vector<int32_t>, int, int> plan_batch_split(const std::vector<int64_t>& qo_lens,
                                                            const std::vector<int64_t>& kv_lens, int64_t num_qo_heads,
                                                            int64_t num_kv_heads, int head_dim_qk, int head_dim_vo,
                                                            int num_sms, int max_chunks) {
  auto [items, mt] = plan_batch(qo_lens, kv_lens, num_qo_heads, num_kv_heads, head_dim_qk, head_dim_vo, num_sms);
  if (mt != 1 || max_chunks <= 1) return {std::move(items), mt, 1};
  int64_t max_kv = 0;
  for (int64_t l : kv_lens) max_kv = std::max(max_kv, l);
  const int64_t ctas = static_cast<int64_t>(items.size() / 2) * num_kv_heads;
  // FLASHINFER_PREFILL_SPLIT_CTAS=<n>: CTAs per SM split-KV aims at (a tuning knob, read once; default 2)
  static const int ctas_per_sm = [] {
    const char* e = std::getenv("FLASHINFER_PREFILL_SPLIT_CTAS");
    const int n = e ? std::atoi(e) : 0;
    return n > 0 && n <= 64 ? n : 2;
  }();
  const int c =
      std::min(flashinfer::attention::prefill_num_chunks(ctas, max_kv, num_sms, ctas_per_sm), max_chunks);
  if (c <= 1) return {std::move(items), mt, 1};
  return {flashinfer::attention::prefill_split_items(items, c), mt, c};
}

// Split-KV's partial-state buffers (the caller's float workspace): o_part (q's dtype, >= o_need
// elements, 16-byte aligned) and lse_part (float32, >= l_need: the partial LSEs, then room for
// the merged LSE when the caller asked for none), on q's device.
void check_split_parts(const fb::Checker& c, const MutTensor& q, const std::optional<MutTensor>& o_part,
                       const std::optional<MutTensor>& lse_part, fb::DType dt, int64_t o_need, int64_t l_need) {
  if (!o_part || !lse_part) fb::fail(std::string(c.op) + ": split-KV needs o_part and lse_part");
  c.dtype_is(*o_part, "o_part", dt);
  c.dtype_is(*lse_part, "lse_part", fb::DType::kF32);
  auto numel = [](const MutTensor& t) {
    int64_t n = 1;
    for (size_t i = 0; i < t.ndim(); ++i) n *= static_cast<int64_t>(t.shape(i));
    return n;
  };
  auto dense = [](const MutTensor& t) { return t.ndim() <= 1 || t.stride(t.ndim() - 1) == 1; };
  if (numel(*o_part) < o_need || numel(*lse_part) < l_need || !aligned16(o_part->data()) || !dense(*o_part) ||
      !dense(*lse_part))
    fb::fail(std::string(c.op) + ": the float workspace is too small for this plan's split-KV partial states (" +
             std::to_string(o_need * 2 + l_need * 4) + " bytes)");
  c.cuda_device({{&q, "q"}, {&*o_part, "o_part"}, {&*lse_part, "lse_part"}});
}

// Points p's outputs at the partial states, o_part [total_q, chunks, H, head_dim_vo] and lse_part
// [total_q, chunks, H], and returns where the merge writes: p's outputs as they were (the merged
// LSE in lse_part's spare room when p had none).
template <typename T>
flashinfer::attention::PrefillMergeOut<T> split_partials(flashinfer::attention::PrefillParams<T>& p, int chunks,
                                                         int64_t total_q, const MutTensor& o_part,
                                                         const MutTensor& lse_part) {
  const int64_t hq = p.num_qo_heads, dvo = p.head_dim_vo;
  float* parts = static_cast<float*>(lse_part.data());
  flashinfer::attention::PrefillMergeOut<T> mo{p.o, p.o_stride_n, p.o_stride_h,
                                               p.lse ? p.lse : parts + total_q * chunks * hq};
  p.num_chunks = chunks;
  p.o = static_cast<T*>(o_part.data());
  p.o_stride_h = dvo, p.o_stride_c = hq * dvo, p.o_stride_n = chunks * hq * dvo;
  p.lse = parts, p.lse_stride_n = chunks * hq;
  return mo;
}

const int32_t* index_tensor(const fb::Checker& c, const MutTensor& t, const char* name) {
  c.ndim_in(t, name, {1}, "1-D int32");
  c.dtype_is(t, name, fb::DType::kI32);
  if (t.shape(0) > 1 && t.stride(0) != 1) fb::fail(std::string(c.op) + ": " + name + " must be contiguous");
  return static_cast<const int32_t*>(t.data());
}

void batch_prefill(MutTensor q, MutTensor k, MutTensor v, MutTensor out, std::optional<MutTensor> lse,
                   std::optional<MutTensor> mask, std::optional<MutTensor> mask_indptr, MutTensor qo_indptr,
                   MutTensor kv_indptr, std::optional<MutTensor> page_indices, std::optional<MutTensor> last_page_len,
                   MutTensor items, int64_t num_items, int m_tiles, int page_size, int layout, bool causal,
                   int window_left, double sm_scale, double soft_cap, bool alibi, double v_scale, uintptr_t stream,
                   bool enable_pdl, int num_chunks, std::optional<MutTensor> o_part, std::optional<MutTensor> lse_part) {
  const fb::Checker c{"BatchPrefillWrapper.run"};
  const bool paged = page_indices.has_value();
  if (layout != 0 && layout != 1) fb::fail(std::string(c.op) + ": kv_layout must be 0 (NHD) or 1 (HND); got " + std::to_string(layout));
  c.ndim_in(q, "q", {3}, "3-D [total_q, num_qo_heads, head_dim]");
  const fb::DType dt = c.dtype_half(q, "q");
  const int kv_nd = paged ? 4 : 3;
  const char* kv_what = paged ? (layout == 1 ? "4-D [max_num_pages, num_kv_heads, page_size, head_dim] (HND)"
                                             : "4-D [max_num_pages, page_size, num_kv_heads, head_dim] (NHD)")
                              : (layout == 1 ? "3-D [num_kv_heads, total_kv, head_dim] (HND)"
                                             : "3-D [total_kv, num_kv_heads, head_dim] (NHD)");
  c.ndim_in(k, "k", {kv_nd}, kv_what);
  c.ndim_in(v, "v", {kv_nd}, kv_what);
  c.dtype_is(k, "k", dt);
  c.dtype_is(v, "v", dt);
  c.last_contiguous(q, "q");
  c.last_contiguous(k, "k");
  c.last_contiguous(v, "v");
  // token / head dimensions of k and v
  const int off = paged ? 1 : 0;
  const int hn = off + (layout == 1 ? 0 : 1), ln = off + (layout == 1 ? 1 : 0);
  const int64_t total_q = q.shape(0), hq = q.shape(1), dqk = q.shape(2), hkv = k.shape(hn), dvo = v.shape(kv_nd - 1);
  c.dim_is(k, "k", kv_nd - 1, dqk, "q.shape[-1] (head_dim_qk)");
  c.dim_is(v, "v", hn, hkv, "k's num_kv_heads");
  c.dim_is(v, "v", ln, k.shape(ln), paged ? "k's page_size" : "k's total_kv");
  if (paged) {
    c.dim_is(k, "k", ln, page_size, "page_size");
    c.dim_is(v, "v", 0, k.shape(0), "k's max_num_pages");
  }
  check_head_dims(c.op, dqk, dvo);
  check_head_counts(c.op, hq, hkv);
  check_outputs(c, out, lse, dt, total_q, "total_q", "q.shape[0]", hq, dvo);
  const int32_t* qo_ptr = index_tensor(c, qo_indptr, "qo_indptr");
  const int32_t* kv_ptr = index_tensor(c, kv_indptr, paged ? "paged_kv_indptr" : "kv_indptr");
  c.dim_is(kv_indptr, paged ? "paged_kv_indptr" : "kv_indptr", 0, qo_indptr.shape(0), "len(qo_indptr)");
  const int32_t* pages = paged ? index_tensor(c, *page_indices, "paged_kv_indices") : nullptr;
  const int32_t* last = nullptr;
  if (paged) {
    if (!last_page_len) fb::fail(std::string(c.op) + ": a paged cache needs paged_kv_last_page_len");
    last = index_tensor(c, *last_page_len, "paged_kv_last_page_len");
    c.dim_is(*last_page_len, "paged_kv_last_page_len", 0, static_cast<int64_t>(qo_indptr.shape(0)) - 1, "batch size");
    if (page_size <= 0) fb::fail(std::string(c.op) + ": page_size must be > 0; got " + std::to_string(page_size));
  }
  const int32_t* item_ptr = index_tensor(c, items, "items");
  if (num_items < 0 || 2 * num_items > static_cast<int64_t>(items.shape(0)))
    fb::fail(std::string(c.op) + ": the plan's work items do not fit its buffer (re-plan)");
  if (m_tiles != 1 && m_tiles != 2) fb::fail(std::string(c.op) + ": m_tiles must be 1 or 2; got " + std::to_string(m_tiles));
  const bool split = num_chunks > 1;
  if (num_chunks < 0 || num_chunks > flashinfer::attention::kPrefillMaxChunks || (split && m_tiles != 1))
    fb::fail(std::string(c.op) + ": num_chunks must be in [0, 64] (> 1 with m_tiles 1); got " + std::to_string(num_chunks));
  if (split) check_split_parts(c, q, o_part, lse_part, dt, total_q * num_chunks * hq * dvo, total_q * (num_chunks + 1) * hq);
  const int32_t* mask_ind = nullptr;
  if (mask) {
    c.ndim_in(*mask, "packed_custom_mask", {1}, "1-D uint8 (bits packed little-endian)");
    c.dtype_is(*mask, "packed_custom_mask", fb::DType::kU8);
    if (mask->shape(0) > 1 && mask->stride(0) != 1) fb::fail(std::string(c.op) + ": packed_custom_mask must be contiguous");
    if (!mask_indptr) fb::fail(std::string(c.op) + ": a custom mask needs mask_indptr");
    mask_ind = index_tensor(c, *mask_indptr, "mask_indptr");
  }
  if (window_left < -1) fb::fail(std::string(c.op) + ": window_left must be >= -1; got " + std::to_string(window_left));
  check_vectors(c, q, "q");
  check_vectors(c, k, "k");
  check_vectors(c, v, "v");
  check_out_pairs(c, out);
  check_out_apart_q(c, out, q, total_q, hq, dvo, dqk);
  if (total_q * (hq / hkv) > (int64_t{1} << 31) - 1 - flashinfer::attention::kPrefillMaxRows || hkv > 65535)
    fb::fail(std::string(c.op) + ": total_q * group_size must be < 2^31 and num_kv_heads <= 65535");
  const int dev = c.cuda_device({{&q, "q"}, {&k, "k"}, {&v, "v"}, {&out, "out"}, {&qo_indptr, "qo_indptr"},
                                 {&kv_indptr, "kv_indptr"}, {&items, "items"}});
  if (lse) c.cuda_device({{&q, "q"}, {&*lse, "lse"}});
  if (mask) c.cuda_device({{&q, "q"}, {&*mask, "packed_custom_mask"}, {&*mask_indptr, "mask_indptr"}});
  if (paged) c.cuda_device({{&q, "q"}, {&*page_indices, "paged_kv_indices"}, {&*last_page_len, "paged_kv_last_page_len"}});
  if (num_items == 0 || hq == 0) return;
  fb::DeviceGuard guard(c.op, dev);
  const bool pdl = enable_pdl && fb::device_supports_pdl(dev);
  fb::with_dtype(c.op, dt, [&](auto tag) {
    using T = decltype(tag);
    PrefillParams<T> p{};
    fill_attention(p, q, k, v, out, lse, mask, ln, hn, hq, hkv, dqk, dvo, causal, window_left, sm_scale, soft_cap, alibi,
                   v_scale, pdl);
    p.qo_indptr = qo_ptr, p.kv_indptr = kv_ptr, p.page_indices = pages, p.last_page_len = last;
    p.mask_indptr = mask_ind;
    p.items = item_ptr, p.num_items = num_items;
    p.page_size = paged ? page_size : 1;
    if (paged) {
      p.k_stride_page = k.stride(0), p.v_stride_page = v.stride(0);
      p.num_pages = static_cast<int64_t>(k.shape(0));
    }
    const flashinfer::attention::PrefillMergeOut<T> mo =
        split ? split_partials(p, num_chunks, total_q, *o_part, *lse_part) : flashinfer::attention::PrefillMergeOut<T>{};
    const cudaError_t err = flashinfer::attention::BatchPrefill(p, m_tiles, fb::as_stream(stream, dev), total_q, mo);
    if (err != cudaSuccess) fb::throw_cuda(c.op, err);
  });
}

// MLA's work items (mla_plan_items) and key chunks per request: `chunks` when > 0 (CUDA graphs
// keep the first plan's), else mla_num_chunks of the batch, with chunks < 0 as if every request
// had many keys (a CUDA graph's first plan: its lengths say nothing of the replays').
std::pair<std::vector<int32_t>, int> mla_plan(const std::vector<int64_t>& qo_lens, const std::vector<int64_t>& kv_lens,
                                              int64_t num_heads, int num_sms, int chunks) {
  const char* op = "BatchMLAPagedAttentionWrapper.plan";
  if (qo_lens.size() != kv_lens.size())
    fb::fail(std::string(op) + ": qo and kv lengths must be given for the same requests");
  if (num_heads <= 0) fb::fail(std::string(op) + ": num_heads must be > 0");
  int64_t items = 0, max_kv = 0;
  for (size_t b = 0; b < qo_lens.size(); ++b) {
    if (qo_lens[b] < 0 || kv_lens[b] < 0) fb::fail(std::string(op) + ": negative length for request " + std::to_string(b));
    items += (qo_lens[b] * num_heads + flashinfer::attention::prefill_rows(1) - 1) / flashinfer::attention::prefill_rows(1);
    max_kv = std::max(max_kv, kv_lens[b]);
  }
  if (chunks > flashinfer::attention::kMlaMaxChunks)
    fb::fail(std::string(op) + ": at most " + std::to_string(flashinfer::attention::kMlaMaxChunks) + " chunks");
  if (chunks < 0) max_kv = int64_t{1} << 40;
  const int c = chunks > 0 ? chunks : flashinfer::attention::mla_num_chunks(items, max_kv, num_sms);
  return {flashinfer::attention::mla_plan_items(qo_lens, kv_lens, static_cast<int>(num_heads), c), c};
}

// MLA (flashinfer.mla): q_nope [total_q, H, 512] and q_pe [total_q, H, dkpe], the ckv cache
// [pages, page_size, 512] and the kpe cache [pages, page_size, dkpe] (q_pe and kpe None when dkpe
// is 0) as one paged KV head whose V is ckv; last_page_len[b] = kv_len[b] - (pages_b - 1) * page_size. Split-KV
// (num_chunks > 1, items of mla_plan): the partial states go to o_part (q's dtype, >=
// total_q * num_chunks * H * 512 elements) and lse_part (float32, >= total_q * (num_chunks + 1) *
// H: the last total_q * H hold the merged lse when `lse` is None), then merge into out / lse.
void mla_run(MutTensor q, std::optional<MutTensor> q_pe, MutTensor ckv, std::optional<MutTensor> kpe, MutTensor out,
             std::optional<MutTensor> lse,
             MutTensor qo_indptr, MutTensor kv_indptr, MutTensor page_indices, MutTensor last_page_len, MutTensor items,
             int64_t num_items, int num_chunks, std::optional<MutTensor> o_part, std::optional<MutTensor> lse_part,
             int page_size, bool causal, double sm_scale, uintptr_t stream, bool enable_pdl) {
  const fb::Checker c{"BatchMLAPagedAttentionWrapper.run"};
  constexpr int64_t kDckv = flashinfer::attention::kMlaHeadDimCkv;
  c.ndim_in(q, "q_nope", {3}, "3-D [total_q, num_heads, head_dim_ckv]");
  const fb::DType dt = c.dtype_half(q, "q_nope");
  c.ndim_in(ckv, "ckv_cache", {3}, "3-D [num_pages, page_size, head_dim_ckv]");
  c.dtype_is(ckv, "ckv_cache", dt);
  c.dim_is(ckv, "ckv_cache", 2, kDckv, "head_dim_ckv");
  if (page_size <= 0) fb::fail(std::string(c.op) + ": page_size must be > 0; got " + std::to_string(page_size));
  c.dim_is(ckv, "ckv_cache", 1, page_size, "page_size");
  c.dim_is(q, "q_nope", 2, kDckv, "head_dim_ckv");
  const int64_t total_q = q.shape(0), hq = q.shape(1);
  const int64_t dkpe = kpe ? static_cast<int64_t>(kpe->shape(kpe->ndim() - 1)) : 0, dqk = kDckv + dkpe;
  if (kpe.has_value() != q_pe.has_value()) fb::fail(std::string(c.op) + ": q_pe and kpe_cache come together");
  if (q_pe) {
    c.ndim_in(*q_pe, "q_pe", {3}, "3-D [total_q, num_heads, head_dim_kpe]");
    c.dtype_is(*q_pe, "q_pe", dt);
    c.dim_is(*q_pe, "q_pe", 0, total_q, "q_nope.shape[0]");
    c.dim_is(*q_pe, "q_pe", 1, hq, "q_nope.shape[1]");
    c.dim_is(*q_pe, "q_pe", 2, dkpe, "kpe_cache.shape[-1] (head_dim_kpe)");
    c.last_contiguous(*q_pe, "q_pe");
    check_vectors(c, *q_pe, "q_pe");
    c.cuda_device({{&q, "q_nope"}, {&*q_pe, "q_pe"}});
  }
  if (kpe) {
    c.ndim_in(*kpe, "kpe_cache", {3}, "3-D [num_pages, page_size, head_dim_kpe]");
    c.dtype_is(*kpe, "kpe_cache", dt);
    c.dim_is(*kpe, "kpe_cache", 0, ckv.shape(0), "ckv_cache's num_pages");
    c.dim_is(*kpe, "kpe_cache", 1, page_size, "page_size");
    c.last_contiguous(*kpe, "kpe_cache");
    check_vectors(c, *kpe, "kpe_cache");
  }
  if (!flashinfer::attention::mla_head_dims_supported(static_cast<int>(dqk), static_cast<int>(kDckv)))
    fb::fail(std::string(c.op) + ": head_dim_kpe must be 64 or 0; got " + std::to_string(dkpe));
  c.last_contiguous(q, "q_nope");
  c.last_contiguous(ckv, "ckv_cache");
  check_vectors(c, q, "q_nope");
  check_vectors(c, ckv, "ckv_cache");
  check_outputs(c, out, lse, dt, total_q, "total_q", "q_nope.shape[0]", hq, kDckv);
  check_out_pairs(c, out);
  const int32_t* qo_ptr = index_tensor(c, qo_indptr, "qo_indptr");
  const int32_t* kv_ptr = index_tensor(c, kv_indptr, "kv_indptr");
  c.dim_is(kv_indptr, "kv_indptr", 0, qo_indptr.shape(0), "len(qo_indptr)");
  const int32_t* pages = index_tensor(c, page_indices, "kv_indices");
  const int32_t* last = index_tensor(c, last_page_len, "last_page_len");
  c.dim_is(last_page_len, "last_page_len", 0, static_cast<int64_t>(qo_indptr.shape(0)) - 1, "batch size");
  const int32_t* item_ptr = index_tensor(c, items, "items");
  if (num_items < 0 || 2 * num_items > static_cast<int64_t>(items.shape(0)))
    fb::fail(std::string(c.op) + ": the plan's work items do not fit its buffer (re-plan)");
  if (total_q * hq > (int64_t{1} << 31) - 1 - flashinfer::attention::kPrefillMaxRows)
    fb::fail(std::string(c.op) + ": total_q * num_heads must be < 2^31");
  const bool split = num_chunks > 1;
  if (num_chunks < 0 || num_chunks > flashinfer::attention::kMlaMaxChunks)
    fb::fail(std::string(c.op) + ": num_chunks must be in [0, 64]; got " + std::to_string(num_chunks));
  if (split) check_split_parts(c, q, o_part, lse_part, dt, total_q * num_chunks * hq * kDckv, total_q * (num_chunks + 1) * hq);
  const int dev = c.cuda_device({{&q, "q_nope"}, {&ckv, "ckv_cache"}, {&out, "out"}, {&qo_indptr, "qo_indptr"},
                                 {&kv_indptr, "kv_indptr"}, {&page_indices, "kv_indices"},
                                 {&last_page_len, "last_page_len"}, {&items, "items"}});
  if (lse) c.cuda_device({{&q, "q_nope"}, {&*lse, "lse"}});
  if (kpe) c.cuda_device({{&q, "q_nope"}, {&*kpe, "kpe_cache"}});
  if (num_items == 0 || hq == 0) return;
  fb::DeviceGuard guard(c.op, dev);
  const bool pdl = enable_pdl && fb::device_supports_pdl(dev);
  fb::with_dtype(c.op, dt, [&](auto tag) {
    using T = decltype(tag);
    PrefillParams<T> p{};
    p.q = static_cast<const T*>(q.data());
    p.k = static_cast<const T*>(ckv.data());
    p.v = p.k;
    p.k_rope = kpe ? static_cast<const T*>(kpe->data()) : nullptr;
    if (q_pe) {
      p.q_rope = static_cast<const T*>(q_pe->data());
      p.qr_stride_n = q_pe->stride(0), p.qr_stride_h = q_pe->stride(1);
    }
    p.o = static_cast<T*>(out.data());
    p.lse = lse ? static_cast<float*>(lse->data()) : nullptr;
    p.q_stride_n = q.stride(0), p.q_stride_h = q.stride(1);
    p.k_stride_n = ckv.stride(1), p.k_stride_page = ckv.stride(0);
    p.v_stride_n = p.k_stride_n, p.v_stride_page = p.k_stride_page;
    if (kpe) p.kr_stride_n = kpe->stride(1), p.kr_stride_page = kpe->stride(0);
    p.o_stride_n = out.stride(0), p.o_stride_h = out.stride(1);
    p.num_qo_heads = static_cast<int>(hq), p.num_kv_heads = 1;
    p.head_dim_qk = static_cast<int>(dqk), p.head_dim_vo = static_cast<int>(kDckv);
    p.causal = causal;
    p.window_left = -1;
    p.sm_scale = static_cast<float>(sm_scale);
    p.v_scale = 1.f;
    p.pdl = pdl;
    p.qo_indptr = qo_ptr, p.kv_indptr = kv_ptr, p.page_indices = pages, p.last_page_len = last;
    p.items = item_ptr, p.num_items = num_items;
    p.page_size = page_size;
    p.num_pages = static_cast<int64_t>(ckv.shape(0));
    const flashinfer::attention::MlaMergeOut<T> mo =
        split ? split_partials(p, num_chunks, total_q, *o_part, *lse_part) : flashinfer::attention::MlaMergeOut<T>{};
    const cudaError_t err = flashinfer::attention::BatchMla(p, total_q, mo, fb::as_stream(stream, dev));
    if (err != cudaSuccess) fb::throw_cuda(c.op, err);
  });
}

}  // namespace

NB_MODULE(_prefill, m) {
  flashinfer_bind::register_argument_error();
  m.doc() = "flashinfer prefill attention kernels (DLPack tensors; see flashinfer.prefill)";
  m.def("single_prefill", &single_prefill, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "mask"_a.none(), "kv_layout"_a,
        "causal"_a, "window_left"_a, "sm_scale"_a, "soft_cap"_a, "alibi"_a, "v_scale"_a, "stream"_a, "pdl"_a);
  m.def("plan_batch", &plan_batch, "qo_lens"_a, "kv_lens"_a, "num_qo_heads"_a, "num_kv_heads"_a, "head_dim_qk"_a,
        "head_dim_vo"_a, "num_sms"_a);
  m.def("batch_prefill", &batch_prefill, "q"_a, "k"_a, "v"_a, "out"_a, "lse"_a.none(), "mask"_a.none(),
        "mask_indptr"_a.none(), "qo_indptr"_a, "kv_indptr"_a, "page_indices"_a.none(), "last_page_len"_a.none(),
        "items"_a, "num_items"_a, "m_tiles"_a, "page_size"_a, "kv_layout"_a, "causal"_a, "window_left"_a, "sm_scale"_a,
        "soft_cap"_a, "alibi"_a, "v_scale"_a, "stream"_a, "pdl"_a, "num_chunks"_a = 1, "o_part"_a.none() = nb::none(),
        "lse_part"_a.none() = nb::none());
  m.def("plan_batch_split", &plan_batch_split, "qo_lens"_a, "kv_lens"_a, "num_qo_heads"_a, "num_kv_heads"_a,
        "head_dim_qk"_a, "head_dim_vo"_a, "num_sms"_a, "max_chunks"_a);
  m.def("mla_plan", &mla_plan, "qo_lens"_a, "kv_lens"_a, "num_heads"_a, "num_sms"_a, "chunks"_a);
  m.def("mla_run", &mla_run, "q_nope"_a, "q_pe"_a.none(), "ckv"_a, "kpe"_a.none(), "out"_a, "lse"_a.none(), "qo_indptr"_a, "kv_indptr"_a,
        "page_indices"_a, "last_page_len"_a, "items"_a, "num_items"_a, "num_chunks"_a, "o_part"_a.none(),
        "lse_part"_a.none(), "page_size"_a, "causal"_a, "sm_scale"_a, "stream"_a, "pdl"_a);
  m.def("supported_dtypes", &fb::supported_dtypes);
}
