// _page: paged KV-cache append (every cache form and layout) and get_batch_indices_positions
// (CUDA or CPU tensors). Checks, Params, launch.
#include <nanobind/stl/string.h>

#include <cstdint>
#include <string>

#include "common.h"
#include "index_check.h"
#include "page_inst.h"

namespace fb = flashinfer_bind;
namespace nb = nanobind;
using namespace nb::literals;
using flashinfer::PagedKV;
using flashinfer::QKVLayout;
using flashinfer::paged_kv::AppendPagedKVParams;
using flashinfer::paged_kv::BatchIndicesPositionsParams;
using fb::MutTensor;

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// Element types the append copies: 16-bit floats and the 8-bit float8 formats.
std::string cache_dtype_name(const MutTensor& t) {
  const auto d = t.dtype();
  using C = nb::dlpack::dtype_code;
  if (d.bits == 8) {
    switch (static_cast<C>(d.code)) {
      case C::Float8_E4M3FN: return "float8_e4m3fn";
      case C::Float8_E5M2: return "float8_e5m2";
      case C::Float8_E4M3FNUZ: return "float8_e4m3fnuz";
      case C::Float8_E5M2FNUZ: return "float8_e5m2fnuz";
      default: break;
    }
  }
  return fb::dtype_name(t);
}

bool copyable_dtype(const MutTensor& t) {
  const auto d = t.dtype();
  using C = nb::dlpack::dtype_code;
  if (d.lanes != 1) return false;
  if (d.bits == 16) return d.code == uint8_t(C::Float) || d.code == uint8_t(C::Bfloat);
  return d.bits == 8 && d.code >= uint8_t(C::Float8_E3M4) && d.code <= uint8_t(C::Float8_E8M0FNU);
}

bool same_dtype(const MutTensor& a, const MutTensor& b) {
  return a.dtype().code == b.dtype().code && a.dtype().bits == b.dtype().bits && a.dtype().lanes == b.dtype().lanes;
}

void int32_vector(const fb::Checker& c, const MutTensor& t, const char* name, int64_t n, const char* what) {
  c.ndim_in(t, name, {1}, "1-D");
  c.dtype_is(t, name, fb::DType::kI32);
  if (n >= 0) c.dim_is(t, name, 0, n, what);
  if (t.shape(0) > 1 && t.stride(0) != 1)
    fb::fail(std::string(c.op) + ": " + name + " must be contiguous; got stride " + str(t.stride(0)));
}

// The cache as K/V base pointers plus the strides the kernel walks, from any §1.0 form.
struct CacheView {
  char* k = nullptr;
  char* v = nullptr;
  int64_t max_num_pages = 0, page_size = 1, num_heads = 0, head_dim = 0;
  int64_t stride_page = 0, stride_n = 0, stride_h = 0;
};

// One cache tensor without its K/V dim: dims = {page, [entry,] head, dim} (NHD) or
// {page, head, [entry,] dim} (HND); `skip` is the index of the K/V dim (5-D/4-D single form).
void fill_view(const MutTensor& t, int skip, QKVLayout layout, CacheView* cv) {
  int64_t shape[4], stride[4];
  int n = 0;
  for (int i = 0; i < static_cast<int>(t.ndim()); ++i) {
    if (i == skip) continue;
    shape[n] = static_cast<int64_t>(t.shape(i));
    stride[n] = t.stride(i);
    ++n;
  }
  cv->max_num_pages = shape[0];
  cv->stride_page = stride[0];
  cv->head_dim = shape[n - 1];
  if (n == 3) {  // page_size 1: [pages, heads, dim]
    cv->page_size = 1;
    cv->num_heads = shape[1];
    cv->stride_h = stride[1];
    cv->stride_n = 0;
  } else if (layout == QKVLayout::kNHD) {
    cv->page_size = shape[1];
    cv->stride_n = stride[1];
    cv->num_heads = shape[2];
    cv->stride_h = stride[2];
  } else {
    cv->num_heads = shape[1];
    cv->stride_h = stride[1];
    cv->page_size = shape[2];
    cv->stride_n = stride[2];
  }
}

CacheView cache_view(const fb::Checker& c, const MutTensor& a, const MutTensor& b, QKVLayout layout) {
  const std::string op = c.op;
  const char* form = layout == QKVLayout::kNHD
                         ? "a 5-D [max_num_pages, 2, page_size, num_kv_heads, head_dim] or 4-D "
                           "[max_num_pages, 2, num_kv_heads, head_dim] tensor"
                         : "a 5-D [max_num_pages, 2, num_kv_heads, page_size, head_dim] or 4-D "
                           "[max_num_pages, 2, num_kv_heads, head_dim] tensor";
  CacheView cv;
  if (!b.is_valid()) {  // single tensor: [:, 0] is K, [:, 1] is V
    c.ndim_in(a, "paged_kv_cache", {4, 5}, form);
    if (!copyable_dtype(a))
      fb::fail(op + ": paged_kv_cache.dtype must be float16, bfloat16 or a float8 type; got " + cache_dtype_name(a));
    if (a.shape(1) != 2)
      fb::fail(op + ": paged_kv_cache.shape[1] must be 2 (K and V); got " + str(static_cast<int64_t>(a.shape(1))) +
               " (shape " + fb::shape_str(a) + ")");
    c.last_contiguous(a, "paged_kv_cache");
    fill_view(a, 1, layout, &cv);
    const int64_t elem = a.dtype().bits / 8;
    cv.k = static_cast<char*>(a.data());
    cv.v = cv.k + a.stride(1) * elem;
    return cv;
  }
  const char* tform = layout == QKVLayout::kNHD ? "4-D [max_num_pages, page_size, num_kv_heads, head_dim] or 3-D "
                                                  "[max_num_pages, num_kv_heads, head_dim]"
                                                : "4-D [max_num_pages, num_kv_heads, page_size, head_dim] or 3-D "
                                                  "[max_num_pages, num_kv_heads, head_dim]";
  c.ndim_in(a, "paged_kv_cache[0] (k_cache)", {3, 4}, tform);
  if (!copyable_dtype(a))
    fb::fail(op + ": k_cache.dtype must be float16, bfloat16 or a float8 type; got " + cache_dtype_name(a));
  c.same_shape(b, "paged_kv_cache[1] (v_cache)", a, "k_cache");
  if (!same_dtype(a, b))
    fb::fail(op + ": v_cache.dtype must equal k_cache.dtype (" + cache_dtype_name(a) + "); got " +
             cache_dtype_name(b));
  c.last_contiguous(a, "k_cache");
  c.last_contiguous(b, "v_cache");
  for (size_t i = 0; i < a.ndim(); ++i)
    if (a.stride(i) != b.stride(i) && a.shape(i) > 1) {
      std::string ks, vs;
      for (size_t j = 0; j < a.ndim(); ++j) {
        ks += (j ? ", " : "") + str(a.stride(j));
        vs += (j ? ", " : "") + str(b.stride(j));
      }
      throw std::runtime_error(op + ": k_cache and v_cache must have identical strides; got (" + ks + ") and (" + vs +
                               ")");
    }
  // The same memory as both caches: every appended K would be overwritten by its V.
  if (a.data() == b.data() && a.size() > 0)
    fb::fail(op + ": paged_kv_cache[1] (v_cache) must not be the same memory as paged_kv_cache[0] (k_cache)");
  fill_view(a, -1, layout, &cv);
  cv.k = static_cast<char*>(a.data());
  cv.v = static_cast<char*>(b.data());
  return cv;
}

// The cache entries the append may write (K and V of every page, slot and head: head_dim
// elements each) must be apart in memory, or writes race or land in the other cache (an
// expand()ed dim, K and V views that overlap); and a page holds at least one slot.
void check_cache_apart(const fb::Checker& c, const CacheView& cv, const MutTensor& a, const MutTensor& b) {
  if (cv.page_size < 1)
    fb::fail(std::string(c.op) + ": paged_kv_cache's page_size must be >= 1; got shape " + fb::shape_str(a));
  const int64_t e = a.dtype().bits / 8;
  const int64_t size[4] = {cv.max_num_pages, cv.page_size, cv.num_heads, 2};
  const int64_t stride[4] = {cv.stride_page * e, cv.stride_n * e, cv.stride_h * e,
                             static_cast<int64_t>(reinterpret_cast<intptr_t>(cv.v) - reinterpret_cast<intptr_t>(cv.k))};
  if (!flashinfer::strides_nest(4, size, stride, cv.head_dim * e))
    fb::fail(std::string(c.op) + ": the entries of paged_kv_cache (K and V of every page, slot and head) must not " +
             "overlap in memory (the kernel writes them); got " +
             (b.is_valid() ? "k_cache of shape " + fb::shape_str(a) + " and strides " + fb::stride_str(a) +
                                 ", v_cache " + std::to_string(stride[3]) + " bytes after it"
                           : "shape " + fb::shape_str(a) + " and strides " + fb::stride_str(a)));
}

// Returns false, touching nothing, when an index tensor is not int32: Python then casts them
// (FlashInfer's .int()) and calls again, so the common int32 call pays no dtype checks in Python.
bool append_paged_kv_cache(MutTensor append_key, MutTensor append_value, MutTensor batch_indices,
                           MutTensor positions, MutTensor cache_a, MutTensor cache_b, MutTensor kv_indices,
                           MutTensor kv_indptr, MutTensor kv_last_page_len, int kv_layout, uintptr_t stream_id,
                           MutTensor err) {
  const char* op = "append_paged_kv_cache";
  const fb::Checker c{op};
  for (const MutTensor* t : {&batch_indices, &positions, &kv_indices, &kv_indptr, &kv_last_page_len})
    if (fb::dtype_of(*t) != fb::DType::kI32) return false;
  if (kv_layout != 0 && kv_layout != 1) fb::fail(std::string(op) + ": kv_layout must be 0 (NHD) or 1 (HND)");
  const QKVLayout layout = static_cast<QKVLayout>(kv_layout);
  const CacheView cv = cache_view(c, cache_a, cache_b, layout);
  check_cache_apart(c, cv, cache_a, cache_b);
  c.ndim_in(append_key, "append_key", {3}, "3-D [nnz, num_kv_heads, head_dim]");
  if (!same_dtype(append_key, cache_a))
    fb::fail(std::string(op) + ": append_key.dtype must equal the cache dtype (" + cache_dtype_name(cache_a) +
             "); got " + cache_dtype_name(append_key));
  c.dim_is(append_key, "append_key", 1, cv.num_heads, "the cache's num_kv_heads");
  c.dim_is(append_key, "append_key", 2, cv.head_dim, "the cache's head_dim");
  c.last_contiguous(append_key, "append_key");
  c.same_shape(append_value, "append_value", append_key, "append_key");
  if (!same_dtype(append_value, cache_a))
    fb::fail(std::string(op) + ": append_value.dtype must equal the cache dtype (" + cache_dtype_name(cache_a) +
             "); got " + cache_dtype_name(append_value));
  c.last_contiguous(append_value, "append_value");
  const int64_t nnz = static_cast<int64_t>(append_key.shape(0));
  int32_vector(c, batch_indices, "batch_indices", nnz, "append_key.shape[0] (nnz)");
  int32_vector(c, positions, "positions", nnz, "append_key.shape[0] (nnz)");
  int32_vector(c, kv_last_page_len, "kv_last_page_len", -1, "");
  const int64_t batch_size = static_cast<int64_t>(kv_last_page_len.shape(0));
  int32_vector(c, kv_indptr, "kv_indptr", batch_size + 1, "kv_last_page_len.shape[0] + 1 (batch_size + 1)");
  int32_vector(c, kv_indices, "kv_indices", -1, "");
  int dev = c.cuda_device({{&append_key, "append_key"}, {&append_value, "append_value"},
                           {&batch_indices, "batch_indices"}, {&positions, "positions"},
                           {&cache_a, cache_b.is_valid() ? "k_cache" : "paged_kv_cache"}, {&kv_indices, "kv_indices"},
                           {&kv_indptr, "kv_indptr"}, {&kv_last_page_len, "kv_last_page_len"}});
  if (cache_b.is_valid()) c.cuda_device({{&cache_a, "k_cache"}, {&cache_b, "v_cache"}});
  const fb::IndexCheck check(c, err);
  if (err.is_valid()) c.cuda_device({{&append_key, "append_key"}, {&err, "err"}});
  if (nnz == 0 || cv.num_heads == 0 || cv.head_dim == 0) return true;
  fb::DeviceGuard guard(op, dev);
  const cudaStream_t stream = fb::as_stream(stream_id, dev);
  check.begin(op, stream);
  auto run = [&](auto tag) {
    using T = decltype(tag);
    AppendPagedKVParams<T, int32_t> p{};
    p.kv = PagedKV<T, int32_t>{reinterpret_cast<T*>(cv.k),
                               reinterpret_cast<T*>(cv.v),
                               static_cast<const int32_t*>(kv_indptr.data()),
                               static_cast<const int32_t*>(kv_indices.data()),
                               static_cast<const int32_t*>(kv_last_page_len.data()),
                               batch_size,
                               cv.page_size,
                               cv.num_heads,
                               cv.head_dim,
                               cv.stride_page,
                               cv.stride_n,
                               cv.stride_h};
    p.key = static_cast<const T*>(append_key.data());
    p.value = static_cast<const T*>(append_value.data());
    p.batch_indices = static_cast<const int32_t*>(batch_indices.data());
    p.positions = static_cast<const int32_t*>(positions.data());
    p.nnz = nnz;
    p.key_stride_n = append_key.stride(0);
    p.key_stride_h = append_key.stride(1);
    p.value_stride_n = append_value.stride(0);
    p.value_stride_h = append_value.stride(1);
    p.num_indices = static_cast<int64_t>(kv_indices.shape(0));
    p.max_num_pages = cv.max_num_pages;
    p.err = check.device_ptr();
    p.pdl = fb::device_supports_pdl(dev);  // a PDL launch enqueues ~0.5 us faster on the H200
    return flashinfer::paged_kv::AppendPagedKV(p, stream);
  };
  const cudaError_t e = append_key.dtype().bits == 16 ? run(uint16_t{}) : run(uint8_t{});
  if (e != cudaSuccess) fb::throw_cuda(op, e);
  int32_t bits = 0;
  int64_t row = 0;
  if (check.ok(op, stream, &bits, &row)) return true;
  const int64_t b = fb::read_index(batch_indices, row, stream), pos = fb::read_index(positions, row, stream);
  std::string why;
  if (bits & flashinfer::kBadBatchIndex)
    why = "batch_indices[" + str(row) + "] = " + str(b) + " is outside [0, " + str(batch_size) + ")";
  else if (bits & flashinfer::kBadPosition)
    why = "positions[" + str(row) + "] = " + str(pos) + " is negative";
  else if (bits & flashinfer::kPageNotInTable)
    why = "positions[" + str(row) + "] = " + str(pos) + " of request " + str(b) +
          " lies beyond its pages in kv_indptr/kv_indices (page size " + str(cv.page_size) +
          "): the page table must already include the appended tokens";
  else
    why = "the page id kv_indices holds for positions[" + str(row) + "] = " + str(pos) + " of request " + str(b) +
          " is outside [0, " + str(cv.max_num_pages) + ") (the cache's pages)";
  fb::fail(std::string(op) + ": " + why + "; that entry was not written (detected by FLASHINFER_CHECK_INDICES)");
}

fb::DType int_dtype(const fb::Checker& c, const MutTensor& t, const char* name) {
  const fb::DType d = fb::dtype_of(t);
  if (d != fb::DType::kI32 && d != fb::DType::kI64)
    fb::fail(std::string(c.op) + ": " + name + ".dtype must be int32 or int64; got " + fb::dtype_name(t));
  if (t.ndim() == 1 && t.shape(0) > 1 && t.stride(0) != 1)
    fb::fail(std::string(c.op) + ": " + name + " must be contiguous; got stride " + str(t.stride(0)));
  return d;
}

// batch_indices[e], positions[e] for every entry e < nnz; CPU tensors run on the host.
void get_batch_indices_positions(MutTensor append_indptr, MutTensor seq_lens, MutTensor batch_indices,
                                 MutTensor positions, bool zero_unheld, uintptr_t stream_id) {
  const char* op = "get_batch_indices_positions";
  const fb::Checker c{op};
  c.ndim_in(append_indptr, "append_indptr", {1}, "1-D [batch_size + 1]");
  const fb::DType it = int_dtype(c, append_indptr, "append_indptr");
  if (append_indptr.shape(0) < 1)
    fb::fail(std::string(op) + ": append_indptr must have batch_size + 1 >= 1 elements; got 0");
  const int64_t batch_size = static_cast<int64_t>(append_indptr.shape(0)) - 1;
  c.ndim_in(seq_lens, "seq_lens", {1}, "1-D [batch_size]");
  c.dim_is(seq_lens, "seq_lens", 0, batch_size, "append_indptr.shape[0] - 1 (batch_size)");
  const fb::DType st = int_dtype(c, seq_lens, "seq_lens");
  int32_vector(c, batch_indices, "batch_indices", -1, "");
  const int64_t nnz = static_cast<int64_t>(batch_indices.shape(0));
  int32_vector(c, positions, "positions", nnz, "nnz");
  // The outputs are written while other threads read the inputs: no shared byte (all four are
  // contiguous 1-D tensors).
  auto bytes = [](const MutTensor& t) {
    const auto lo = reinterpret_cast<uintptr_t>(t.data());
    return std::pair<uintptr_t, uintptr_t>{lo, lo + t.shape(0) * t.itemsize()};
  };
  const std::pair<const MutTensor*, const char*> outs[2] = {{&batch_indices, "batch_indices"}, {&positions, "positions"}};
  const std::pair<const MutTensor*, const char*> others[3] = {
      {&positions, "positions"}, {&append_indptr, "append_indptr"}, {&seq_lens, "seq_lens"}};
  for (const auto& [o, o_name] : outs)
    for (const auto& [t, t_name] : others) {
      if (o == t) continue;
      const auto [olo, ohi] = bytes(*o);
      const auto [tlo, thi] = bytes(*t);
      if (olo < thi && tlo < ohi)
        fb::fail(std::string(op) + ": " + o_name + " must not overlap " + t_name + " in memory (it is written)");
    }
  const bool on_cpu = append_indptr.device_type() == nb::device::cpu::value;
  int dev = -1;
  if (on_cpu) {
    for (auto [t, name] : {std::pair<MutTensor*, const char*>{&seq_lens, "seq_lens"},
                           {&batch_indices, "batch_indices"}, {&positions, "positions"}})
      if (t->device_type() != nb::device::cpu::value)
        fb::fail(std::string(op) + ": " + name + " must be on the CPU like append_indptr; got device type " +
                 fb::Checker::device_type_name(t->device_type()));
  } else {
    dev = c.cuda_device({{&append_indptr, "append_indptr"}, {&seq_lens, "seq_lens"},
                         {&batch_indices, "batch_indices"}, {&positions, "positions"}});
  }
  if (nnz == 0) return;
  auto go = [&](auto idx_tag, auto seq_tag) {
    using IdType = decltype(idx_tag);
    using SeqT = decltype(seq_tag);
    BatchIndicesPositionsParams<IdType, SeqT> p{static_cast<const IdType*>(append_indptr.data()),
                                                static_cast<const SeqT*>(seq_lens.data()),
                                                static_cast<int32_t*>(batch_indices.data()),
                                                static_cast<int32_t*>(positions.data()),
                                                batch_size,
                                                nnz,
                                                zero_unheld};
    if (on_cpu) {
      flashinfer::paged_kv::batch_indices_positions_host(p);
      return;
    }
    fb::DeviceGuard guard(op, dev);
    const cudaError_t e = flashinfer::paged_kv::BatchIndicesPositions(p, fb::as_stream(stream_id, dev));
    if (e != cudaSuccess) fb::throw_cuda(op, e);
  };
  if (it == fb::DType::kI32) {
    if (st == fb::DType::kI32) go(int32_t{}, int32_t{}); else go(int32_t{}, int64_t{});
  } else {
    if (st == fb::DType::kI32) go(int64_t{}, int32_t{}); else go(int64_t{}, int64_t{});
  }
}

// Benchmark/test hook: overwrite the knobs FLASHINFER_APPEND_VPT / _THREADS set at start-up.
void set_append_tuning(int vecs_per_thread, int threads) {
  namespace pk = flashinfer::paged_kv;
  if (!pk::valid_append_vpt(vecs_per_thread))
    fb::fail("_set_tuning: vecs_per_thread must be 0 (auto), 1, 2, 4 or 8; got " + str(vecs_per_thread));
  if (!pk::valid_append_threads(threads))
    fb::fail("_set_tuning: threads must be 0 (auto), 128, 256, 512 or 1024; got " + str(threads));
  pk::append_tuning() = pk::AppendTuning{vecs_per_thread, threads};
}

nb::tuple get_append_tuning() {
  const flashinfer::paged_kv::AppendTuning& t = flashinfer::paged_kv::append_tuning();
  return nb::make_tuple(t.vecs_per_thread, t.threads);
}

}  // namespace

NB_MODULE(_page, m) {
  flashinfer_bind::register_argument_error();
  m.doc() = "flashinfer paged KV-cache kernels (DLPack tensors; see flashinfer.page)";
  m.def("append_paged_kv_cache", &append_paged_kv_cache, "append_key"_a, "append_value"_a, "batch_indices"_a,
        "positions"_a, "cache_a"_a, "cache_b"_a.none(), "kv_indices"_a, "kv_indptr"_a, "kv_last_page_len"_a,
        "kv_layout"_a, "stream"_a, "err"_a.none());
  m.def("get_batch_indices_positions", &get_batch_indices_positions, "append_indptr"_a, "seq_lens"_a,
        "batch_indices"_a, "positions"_a, "zero_unheld"_a, "stream"_a);
  m.def("_set_tuning", &set_append_tuning, "vecs_per_thread"_a = 0, "threads"_a = 0);
  m.def("_tuning", &get_append_tuning);
}
