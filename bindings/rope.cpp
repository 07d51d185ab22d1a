// _rope: rotary position embedding on q and k (positions from pos_ids or indptr/offsets;
// cos/sin computed from the frequency schedule or read from a float32 cos/sin cache).
// Checks, Params, launch.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cfloat>
#include <cmath>
#include <cstdio>
#include <cstdint>
#include <optional>
#include <string>

#include "common.h"
#include "dispatch_dtype.h"
#include "index_check.h"
#include "rope_inst.h"

namespace fb = flashinfer_bind;
namespace nb = nanobind;
using namespace nb::literals;
using flashinfer::RopeFreq;
using flashinfer::rope::RopeParams;
using fb::MutTensor;

namespace {

// A tensor seen as [nnz, heads, dim] with strides in elements (last dim contiguous).
struct Heads {
  int64_t nnz = 0, heads = 0, dim = 0, stride_n = 0, stride_h = 0;
};

std::string str(int64_t v) { return std::to_string(v); }

Heads heads_of_3d(const fb::Checker& c, const MutTensor& t, const char* name, const char* what) {
  c.ndim_in(t, name, {3}, what);
  c.last_contiguous(t, name);
  return {static_cast<int64_t>(t.shape(0)), static_cast<int64_t>(t.shape(1)), static_cast<int64_t>(t.shape(2)),
          t.stride(0), t.stride(1)};
}

// The cos/sin-cache form's query/key: 2-D [nnz, heads * head_size] (viewed as [nnz, -1,
// head_size]) or 3-D [nnz, heads, head_size].
Heads heads_of_flat(const fb::Checker& c, const MutTensor& t, const char* name, int64_t head_size) {
  c.ndim_in(t, name, {2, 3}, "2-D [nnz, num_heads * head_size] or 3-D [nnz, num_heads, head_size]");
  c.last_contiguous(t, name);
  if (t.ndim() == 3) {
    c.dim_is(t, name, 2, head_size, "head_size");
    return {static_cast<int64_t>(t.shape(0)), static_cast<int64_t>(t.shape(1)), head_size, t.stride(0),
            t.stride(1)};
  }
  const int64_t width = static_cast<int64_t>(t.shape(1));
  if (width % head_size != 0)
    fb::fail(std::string(c.op) + ": " + name + ".shape[1] (" + str(width) + ") must be a multiple of head_size (" +
             str(head_size) + ")");
  return {static_cast<int64_t>(t.shape(0)), width / head_size, head_size, t.stride(0), head_size};
}

// An output (q_rope / k_rope): input's shape and dtype, last dim contiguous; seen like the input.
Heads out_like(const fb::Checker& c, const MutTensor& out, const char* name, const MutTensor& in,
               const char* in_name, const Heads& in_h, fb::DType dt) {
  c.same_shape(out, name, in, in_name);
  c.dtype_is(out, name, dt);
  c.last_contiguous(out, name);
  Heads h = in_h;
  h.stride_n = out.stride(0);
  h.stride_h = out.ndim() == 3 ? out.stride(1) : in_h.dim;
  return h;
}

fb::DType index_dtype(const fb::Checker& c, const MutTensor& t, const char* name) {
  const fb::DType d = fb::dtype_of(t);
  if (d != fb::DType::kI32 && d != fb::DType::kI64)
    fb::fail(std::string(c.op) + ": " + name + ".dtype must be int32 or int64; got " + fb::dtype_name(t));
  return d;
}

// 1-D, `n` elements, contiguous.
void vector_of(const fb::Checker& c, const MutTensor& t, const char* name, int64_t n, const char* what) {
  c.ndim_in(t, name, {1}, "1-D");
  c.dim_is(t, name, 0, n, what);
  if (n > 1 && t.stride(0) != 1)
    fb::fail(std::string(c.op) + ": " + name + " must be contiguous; got stride " + str(t.stride(0)));
}

// Everything but the typed pointers.
struct RopeArgs {
  MutTensor *q, *k, *q_out, *k_out;  // q_out/k_out null: in place
  MutTensor *pos_ids, *indptr, *offsets, *cache;
  Heads qh, kh, qoh, koh;
  int64_t batch_size = 0, rotary_dim = 0, max_pos = 0, cache_stride = 0;
  RopeFreq freq;
  bool interleave = false;
};

template <typename T, typename IdType>
RopeParams<T, IdType> make_params(const RopeArgs& a, int32_t* err, bool pdl) {
  RopeParams<T, IdType> p{};
  p.q = static_cast<const T*>(a.q->data());
  p.k = static_cast<const T*>(a.k->data());
  p.q_out = a.q_out ? static_cast<T*>(a.q_out->data()) : const_cast<T*>(p.q);
  p.k_out = a.k_out ? static_cast<T*>(a.k_out->data()) : const_cast<T*>(p.k);
  p.pos_ids = a.pos_ids ? static_cast<const IdType*>(a.pos_ids->data()) : nullptr;
  p.indptr = a.indptr ? static_cast<const IdType*>(a.indptr->data()) : nullptr;
  p.offsets = a.offsets ? static_cast<const IdType*>(a.offsets->data()) : nullptr;
  p.cos_sin_cache = a.cache ? static_cast<const float*>(a.cache->data()) : nullptr;
  p.nnz = a.qh.nnz;
  p.batch_size = a.batch_size;
  p.num_q_heads = a.qh.heads;
  p.num_k_heads = a.kh.heads;
  p.head_dim = a.qh.dim;
  p.rotary_dim = a.rotary_dim;
  p.max_pos = a.max_pos;
  p.cache_stride = a.cache_stride;
  p.q_stride_n = a.qh.stride_n;
  p.q_stride_h = a.qh.stride_h;
  p.k_stride_n = a.kh.stride_n;
  p.k_stride_h = a.kh.stride_h;
  const Heads& qo = a.q_out ? a.qoh : a.qh;
  const Heads& ko = a.k_out ? a.koh : a.kh;
  p.q_out_stride_n = qo.stride_n;
  p.q_out_stride_h = qo.stride_h;
  p.k_out_stride_n = ko.stride_n;
  p.k_out_stride_h = ko.stride_h;
  p.freq = a.freq;
  p.interleave = a.interleave;
  p.err = err;
  p.pdl = pdl;
  return p;
}

// A written [nnz, heads, dim] tensor: no two of its head rows may share memory.
void written_rows_disjoint(const fb::Checker& c, const MutTensor& t, const char* name, const Heads& h) {
  c.rows_disjoint(t, name, flashinfer::RowLayout{h.heads, h.stride_n, h.stride_h}, h.nnz * h.heads, h.dim);
}

// In place, q and k are both rotated: they must not share memory (exact for views of one fused
// QKV buffer, whose heads lie back to back; see layout.h tensors_intersect).
void written_apart(const fb::Checker& c, const MutTensor& q, const char* qn, const Heads& qh, const MutTensor& k,
                   const char* kn, const Heads& kh) {
  const int64_t e = static_cast<int64_t>(q.itemsize()), delta = fb::byte_delta(q, k);
  if (flashinfer::tensors_intersect(fb::in_bytes({qh.heads, qh.stride_n, qh.stride_h}, e), qh.nnz * qh.heads,
                                    qh.dim * e, fb::in_bytes({kh.heads, kh.stride_n, kh.stride_h}, e),
                                    kh.nnz * kh.heads, kh.dim * e, delta))
    fb::fail(std::string(c.op) + ": " + kn + " must not overlap " + qn +
             " in memory (both are rotated in place); got " + qn + " strides " + fb::stride_str(q) + ", " + kn +
             " strides " + fb::stride_str(k) + ", " + kn + " starting " + str(delta / e) + " elements after " + qn);
}

// Overlap checks of the written tensors, device check, launch, and (with an error record) the
// read-back that turns a recorded bad index into a ValueError.
void run(const fb::Checker& c, fb::DType dt, fb::DType idt, const RopeArgs& a, uintptr_t stream_id,
         const MutTensor& err) {
  const char* op = c.op;
  if (a.q_out) {
    written_rows_disjoint(c, *a.q_out, a.cache ? "query_out" : "q_rope", a.qoh);
    written_rows_disjoint(c, *a.k_out, a.cache ? "key_out" : "k_rope", a.koh);
  } else {
    written_rows_disjoint(c, *a.q, a.cache ? "query" : "q", a.qh);
    written_rows_disjoint(c, *a.k, a.cache ? "key" : "k", a.kh);
    written_apart(c, *a.q, a.cache ? "query" : "q", a.qh, *a.k, a.cache ? "key" : "k", a.kh);
  }
  const fb::IndexCheck check(c, err);
  int dev;
  if (a.q_out) {
    dev = a.cache ? c.cuda_device({{a.q, "query"}, {a.k, "key"}, {a.q_out, "query_out"}, {a.k_out, "key_out"},
                                   {a.pos_ids, "positions"}, {a.cache, "cos_sin_cache"}})
          : a.pos_ids ? c.cuda_device({{a.q, "q"}, {a.k, "k"}, {a.q_out, "q_rope"}, {a.k_out, "k_rope"},
                                       {a.pos_ids, "pos_ids"}})
                      : c.cuda_device({{a.q, "q"}, {a.k, "k"}, {a.q_out, "q_rope"}, {a.k_out, "k_rope"},
                                       {a.indptr, "indptr"}, {a.offsets, "offsets"}});
  } else {
    dev = a.cache ? c.cuda_device(
                        {{a.q, "query"}, {a.k, "key"}, {a.pos_ids, "positions"}, {a.cache, "cos_sin_cache"}})
          : a.pos_ids ? c.cuda_device({{a.q, "q"}, {a.k, "k"}, {a.pos_ids, "pos_ids"}})
                      : c.cuda_device({{a.q, "q"}, {a.k, "k"}, {a.indptr, "indptr"}, {a.offsets, "offsets"}});
  }
  if (err.is_valid()) c.cuda_device({{a.q, a.cache ? "query" : "q"}, {&err, "err"}});
  if (a.qh.nnz == 0 || a.qh.heads + a.kh.heads == 0) return;
  fb::DeviceGuard guard(op, dev);
  const cudaStream_t stream = fb::as_stream(stream_id, dev);
  check.begin(op, stream);
  fb::with_dtype(op, dt, [&](auto tag) {
    using T = decltype(tag);
    const bool pdl = fb::device_supports_pdl(dev);  // a PDL launch enqueues ~0.5 us faster on the H200
    const cudaError_t e = idt == fb::DType::kI32
                              ? flashinfer::rope::Rope(make_params<T, int32_t>(a, check.device_ptr(), pdl), stream)
                              : flashinfer::rope::Rope(make_params<T, int64_t>(a, check.device_ptr(), pdl), stream);
    if (e != cudaSuccess) fb::throw_cuda(op, e);
  });
  int32_t bits = 0;
  int64_t row = 0;
  if (check.ok(op, stream, &bits, &row)) return;
  std::string msg = std::string(op) + ": ";
  if (bits & flashinfer::rope::kPositionOutOfRange) {
    msg += "positions[" + str(row) + "] = " + str(fb::read_index(*a.pos_ids, row, stream)) +
           " is outside [0, " + str(a.max_pos) + ") (the rows of cos_sin_cache)";
  } else {
    msg += "token " + str(row) + " lies in no segment of indptr (indptr must start at 0, be nondecreasing and end "
           "at nnz = " + str(a.qh.nnz) + ")";
  }
  fb::fail(msg + "; nothing was written for it (detected by FLASHINFER_CHECK_INDICES)");
}

void check_scalars(const fb::Checker& c, double rope_scale, double rope_theta, bool llama31, double low,
                   double high, double old_context_len) {
  const std::string op = c.op;
  if (!(rope_scale > 0.0) || !std::isfinite(rope_scale))
    fb::fail(op + ": rope_scale must be a positive finite number; got " + std::to_string(rope_scale));
  if (!(rope_theta > 0.0) || !std::isfinite(rope_theta))
    fb::fail(op + ": rope_theta must be a positive finite number; got " + std::to_string(rope_theta));
  if (!llama31) return;
  if (!(low > 0.0) || !std::isfinite(low))
    fb::fail(op + ": low_freq_factor must be a positive finite number; got " + std::to_string(low));
  if (!std::isfinite(high))
    fb::fail(op + ": high_freq_factor must be a finite number; got " + std::to_string(high));
  if (!(high > low))
    fb::fail(op + ": high_freq_factor (" + std::to_string(high) + ") must be greater than low_freq_factor (" +
             std::to_string(low) + ")");
  if (!(old_context_len > 0.0) || !std::isfinite(old_context_len))
    fb::fail(op + ": old_context_len must be a positive finite number; got " + std::to_string(old_context_len));
}

// The kernels take inv_freq_d as a float32: it must be finite there, or every angle is inf (NaN
// rows). f_d = rope_theta^(-2d / rotary_dim) is monotonic in d (1 at d = 0) and inv_freq_d lies
// between f_d / rope_scale and f_d (Llama-3.1 blends the two), so max(f_0, f_last) * max(1,
// 1 / rope_scale) bounds it; the common rope_theta >= 1 needs no pow.
void check_inv_freq(const fb::Checker& c, double rope_scale, double rope_theta, int64_t rotary_dim) {
  const double f_max =
      rope_theta >= 1.0 ? 1.0 : std::pow(rope_theta, -2.0 * static_cast<double>(rotary_dim / 2 - 1) / rotary_dim);
  const double bound = f_max * (rope_scale < 1.0 ? 1.0 / rope_scale : 1.0);
  if (!(bound <= static_cast<double>(FLT_MAX))) {
    char msg[160];
    std::snprintf(msg, sizeof(msg), "rope_theta %g and rope_scale %g give inverse frequencies up to %g, beyond float32",
                  rope_theta, rope_scale, bound);
    fb::fail(std::string(c.op) + ": " + msg);
  }
}

int64_t checked_rotary_dim(const fb::Checker& c, std::optional<int64_t> rotary_dim, int64_t head_dim) {
  const int64_t rd = rotary_dim.value_or(head_dim);
  if (rd <= 0 || rd % 2 != 0 || rd > head_dim)
    fb::fail(std::string(c.op) + ": rotary_dim must be a positive even number <= head_dim (" + str(head_dim) +
             "); got " + str(rd));
  return rd;
}

// apply_rope / apply_llama31_rope and their _pos_ids / _inplace variants. q_out, k_out None:
// in place. pos_ids None: the indptr/offsets form.
void apply_rope(const char* op_name, MutTensor q, MutTensor k, MutTensor q_out, MutTensor k_out,
                MutTensor pos_ids, MutTensor indptr, MutTensor offsets, std::optional<int64_t> rotary_dim,
                bool interleave, double rope_scale, double rope_theta, bool llama31, double low_freq_factor,
                double high_freq_factor, double old_context_len, uintptr_t stream, MutTensor err) {
  const fb::Checker c{op_name};
  RopeArgs a;
  a.q = &q;
  a.k = &k;
  a.qh = heads_of_3d(c, q, "q", "3-D [nnz, num_q_heads, head_dim]");
  const fb::DType dt = c.dtype_half(q, "q");
  a.kh = heads_of_3d(c, k, "k", "3-D [nnz, num_k_heads, head_dim]");
  c.dtype_is(k, "k", dt);
  c.dim_is(k, "k", 0, a.qh.nnz, "q.shape[0] (nnz)");
  c.dim_is(k, "k", 2, a.qh.dim, "q.shape[2] (head_dim)");
  a.rotary_dim = checked_rotary_dim(c, rotary_dim, a.qh.dim);
  if (q_out.is_valid() != k_out.is_valid())
    fb::fail(std::string(op_name) + ": give both q_rope and k_rope, or neither");
  if (q_out.is_valid()) {
    a.q_out = &q_out;
    a.k_out = &k_out;
    a.qoh = out_like(c, q_out, "q_rope", q, "q", a.qh, dt);
    a.koh = out_like(c, k_out, "k_rope", k, "k", a.kh, dt);
  } else {
    a.q_out = a.k_out = nullptr;
  }
  fb::DType idt;
  a.pos_ids = a.indptr = a.offsets = a.cache = nullptr;
  if (pos_ids.is_valid()) {
    a.pos_ids = &pos_ids;
    idt = index_dtype(c, pos_ids, "pos_ids");
    vector_of(c, pos_ids, "pos_ids", a.qh.nnz, "q.shape[0] (nnz)");
  } else {
    if (!indptr.is_valid() || !offsets.is_valid())
      fb::fail(std::string(op_name) + ": indptr and offsets are required");
    a.indptr = &indptr;
    a.offsets = &offsets;
    idt = index_dtype(c, indptr, "indptr");
    c.ndim_in(indptr, "indptr", {1}, "1-D [batch_size + 1]");
    if (indptr.shape(0) < 1)
      fb::fail(std::string(op_name) + ": indptr must have batch_size + 1 >= 1 elements; got 0");
    a.batch_size = static_cast<int64_t>(indptr.shape(0)) - 1;
    vector_of(c, indptr, "indptr", a.batch_size + 1, "batch_size + 1");
    c.dtype_is(offsets, "offsets", idt);
    vector_of(c, offsets, "offsets", a.batch_size, "indptr.shape[0] - 1 (batch_size)");
  }
  check_scalars(c, rope_scale, rope_theta, llama31, low_freq_factor, high_freq_factor, old_context_len);
  check_inv_freq(c, rope_scale, rope_theta, a.rotary_dim);
  a.freq.theta = rope_theta;
  a.freq.scale = rope_scale;
  a.freq.llama31 = llama31;
  a.freq.low_freq_factor = low_freq_factor;
  a.freq.high_freq_factor = high_freq_factor;
  a.freq.old_context_len = old_context_len;
  a.interleave = interleave;
  run(c, dt, idt, a, stream, err);
}

// apply_rope_with_cos_sin_cache[_inplace]: cos = cache[pos, :rd/2], sin = cache[pos, rd/2:].
void apply_rope_cos_sin_cache(const char* op_name, MutTensor positions, MutTensor query, MutTensor key,
                              int64_t head_size, MutTensor cos_sin_cache, bool is_neox, MutTensor query_out,
                              MutTensor key_out, uintptr_t stream, MutTensor err) {
  const fb::Checker c{op_name};
  if (fb::dtype_of(cos_sin_cache) != fb::DType::kF32) fb::fail("cos_sin_cache should be float32");
  if (head_size <= 0) fb::fail(std::string(op_name) + ": head_size must be > 0; got " + str(head_size));
  RopeArgs a;
  a.q = &query;
  a.k = &key;
  a.qh = heads_of_flat(c, query, "query", head_size);
  const fb::DType dt = c.dtype_half(query, "query");
  a.kh = heads_of_flat(c, key, "key", head_size);
  c.dtype_is(key, "key", dt);
  c.dim_is(key, "key", 0, a.qh.nnz, "query.shape[0] (nnz)");
  c.ndim_in(cos_sin_cache, "cos_sin_cache", {2}, "2-D [max_position, rotary_dim]");
  c.last_contiguous(cos_sin_cache, "cos_sin_cache");
  const int64_t rd = static_cast<int64_t>(cos_sin_cache.shape(1));
  if (rd <= 0 || rd % 2 != 0 || rd > head_size)
    fb::fail(std::string(op_name) +
             ": cos_sin_cache.shape[1] (rotary_dim) must be a positive even number <= head_size (" + str(head_size) +
             "); got " + str(rd));
  a.rotary_dim = rd;
  a.cache = &cos_sin_cache;
  a.max_pos = static_cast<int64_t>(cos_sin_cache.shape(0));
  if (a.max_pos == 0 && a.qh.nnz > 0)  // (every position would be out of range: outputs left unwritten)
    fb::fail(std::string(op_name) + ": cos_sin_cache must have a row per position; got 0 rows for " + str(a.qh.nnz) +
             " tokens");
  a.cache_stride = cos_sin_cache.stride(0);
  a.pos_ids = &positions;
  a.indptr = a.offsets = nullptr;
  const fb::DType idt = index_dtype(c, positions, "positions");
  vector_of(c, positions, "positions", a.qh.nnz, "query.shape[0] (nnz)");
  if (query_out.is_valid() != key_out.is_valid())
    fb::fail(std::string(op_name) + ": give both query_out and key_out, or neither");
  if (query_out.is_valid()) {
    a.q_out = &query_out;
    a.k_out = &key_out;
    a.qoh = out_like(c, query_out, "query_out", query, "query", a.qh, dt);
    a.koh = out_like(c, key_out, "key_out", key, "key", a.kh, dt);
  } else {
    a.q_out = a.k_out = nullptr;
  }
  a.interleave = !is_neox;
  run(c, dt, idt, a, stream, err);
}

}  // namespace

NB_MODULE(_rope, m) {
  flashinfer_bind::register_argument_error();
  m.doc() = "flashinfer rotary position embedding kernels (DLPack tensors; see flashinfer.rope)";
  m.def("apply_rope", &apply_rope, "op"_a, "q"_a, "k"_a, "q_rope"_a.none(), "k_rope"_a.none(), "pos_ids"_a.none(),
        "indptr"_a.none(), "offsets"_a.none(), "rotary_dim"_a.none(), "interleave"_a, "rope_scale"_a,
        "rope_theta"_a, "llama31"_a, "low_freq_factor"_a, "high_freq_factor"_a, "old_context_len"_a, "stream"_a,
        "err"_a.none());
  m.def("apply_rope_cos_sin_cache", &apply_rope_cos_sin_cache, "op"_a, "positions"_a, "query"_a, "key"_a,
        "head_size"_a, "cos_sin_cache"_a, "is_neox"_a, "query_out"_a.none(), "key_out"_a.none(), "stream"_a,
        "err"_a.none());
  m.def("supported_dtypes", &fb::supported_dtypes);
}
