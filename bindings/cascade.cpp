// _cascade: merging attention states (merge_state, merge_state_in_place, merge_states).
// Checks, Params, launch. Shape mismatches between arguments raise RuntimeError (as
// FlashInfer's C++ checks do, spec §2); every other bad argument raises ValueError.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <optional>
#include <stdexcept>
#include <string>
#include <utility>

#include "cascade_inst.h"
#include "common.h"
#include "dispatch_dtype.h"

namespace fb = flashinfer_bind;
namespace nb = nanobind;
using namespace nb::literals;
using flashinfer::attention::MergeStateParams;
using flashinfer::attention::MergeStatesParams;
using flashinfer::attention::StateStrides;
using fb::MutTensor;

namespace {

[[noreturn]] void fail_shape(const char* op, const std::string& msg) {
  throw std::runtime_error(std::string(op) + ": " + msg);
}

// Stride of dimension i in elements; 0 for a size-1 dimension (never stepped, and an
// arbitrary stride there must not defeat the 16-byte vector path).
int64_t stride_of(const MutTensor& t, size_t i) { return t.shape(i) == 1 ? 0 : t.stride(i); }

std::string dims_str(std::initializer_list<int64_t> dims) {
  std::string s = "(";
  size_t k = 0;
  for (int64_t d : dims) s += (k++ ? ", " : "") + std::to_string(d);
  return s + (dims.size() == 1 ? ",)" : ")");
}

// t.shape must equal `dims` (from `what`), else RuntimeError.
void shape_is(const char* op, const MutTensor& t, const char* name, std::initializer_list<int64_t> dims,
              const char* what) {
  bool ok = t.ndim() == dims.size();
  size_t i = 0;
  for (int64_t d : dims) ok = ok && static_cast<int64_t>(t.shape(i++)) == d;
  if (!ok)
    fail_shape(op, std::string(name) + ".shape must equal " + what + " " + dims_str(dims) + "; got " +
                       fb::shape_str(t));
}

// A values tensor of `ndim` dims, fp16/bf16 (or `dt` when given), last dimension contiguous.
fb::DType check_values(const fb::Checker& c, const MutTensor& t, const char* name, int ndim, const char* layout,
                       const fb::DType* dt) {
  c.ndim_in(t, name, {ndim}, layout);
  const fb::DType d = c.dtype_half(t, name);
  if (dt && d != *dt)
    fb::fail(std::string(c.op) + ": " + name + ".dtype must equal the values' dtype " + fb::dtype_str(*dt) +
             "; got " + fb::dtype_str(d));
  c.last_contiguous(t, name);
  return d;
}

// An LSE tensor of `ndim` dims, float32 (any strides).
void check_lse(const fb::Checker& c, const MutTensor& t, const char* name, int ndim, const char* layout) {
  c.ndim_in(t, name, {ndim}, layout);
  if (fb::dtype_of(t) != fb::DType::kF32)
    fb::fail(std::string(c.op) + ": " + name + ".dtype must be float32 (LSE); got " + fb::dtype_name(t));
}

// head_dim is a runtime value; vector indices stay in 32 bits up to kMergeMaxHeadDim.
void check_head_dim(const char* op, const char* name, int dim, int64_t head_dim) {
  const std::string what = std::string(op) + ": " + name + ".shape[" + std::to_string(dim) + "] (head_dim) must be ";
  if (head_dim == 0) fb::fail(what + "> 0; got 0");
  if (head_dim > flashinfer::attention::kMergeMaxHeadDim)
    fb::fail(what + "<= " + std::to_string(flashinfer::attention::kMergeMaxHeadDim) + "; got " +
             std::to_string(head_dim));
}

// A tensor the kernel writes must not alias itself (an expanded view: stride 0, or strides
// that make rows overlap), or its threads would race on the same memory. v tensors are 3-D
// [seq_len, num_heads, head_dim] with a contiguous last dimension (rows of head_dim elements),
// s tensors 2-D [seq_len, num_heads] with any strides (rows of one element); layout.h's
// rows_disjoint decides, exactly.
void check_no_self_overlap(const char* op, const MutTensor& t, const char* name) {
  const bool v = t.ndim() == 3;
  const flashinfer::RowLayout l{int64_t(t.shape(1)), t.stride(0), t.stride(1)};
  if (!flashinfer::rows_disjoint(l, int64_t(t.shape(0)) * int64_t(t.shape(1)), v ? int64_t(t.shape(2)) : 1))
    fb::fail(std::string(op) + ": " + name + " is written and must not overlap itself (an expanded or " +
             "overlapping view); got shape " + fb::shape_str(t) + " and strides " + fb::stride_str(t));
}

// merge_state_in_place writes v and s while its threads read v_other and s_other: two of these
// may share a byte only by being the very same view (then each element is read and written by
// one thread). v tensors are rows of head_dim elements, s tensors rows of one.
void check_apart(const fb::Checker& c, const MutTensor& w, const char* w_name, const MutTensor& r, const char* r_name) {
  bool same = w.data() == r.data() && w.ndim() == r.ndim() && w.itemsize() == r.itemsize();
  for (size_t i = 0; same && i < w.ndim(); ++i) same = w.shape(i) == r.shape(i) && w.stride(i) == r.stride(i);
  if (same) return;
  auto rows = [](const MutTensor& t, int64_t* n, int64_t* bytes) {
    *n = int64_t(t.shape(0)) * int64_t(t.shape(1));
    *bytes = (t.ndim() == 3 ? int64_t(t.shape(2)) : 1) * int64_t(t.itemsize());
    return fb::in_bytes(flashinfer::RowLayout{int64_t(t.shape(1)), t.stride(0), t.stride(1)}, int64_t(t.itemsize()));
  };
  int64_t wn, wb, rn, rb;
  const flashinfer::RowLayout lw = rows(w, &wn, &wb), lr = rows(r, &rn, &rb);
  if (flashinfer::tensors_intersect(lw, wn, wb, lr, rn, rb, fb::byte_delta(w, r)))
    fb::fail(std::string(c.op) + ": " + r_name + " must not overlap " + w_name + " in memory (the kernel writes " +
             w_name + "), unless it is the same tensor");
}

StateStrides strides_of(const MutTensor& v, const MutTensor& s) {
  return StateStrides{stride_of(v, 0), stride_of(v, 1), stride_of(s, 0), stride_of(s, 1)};
}

// Shared by merge_state (out-of-place) and merge_state_in_place (out = a, optional mask).
void merge_state_impl(const char* op, const char* na, const char* nsa, const char* nb_, const char* nsb,
                      MutTensor v_a, MutTensor s_a, MutTensor v_b, MutTensor s_b, MutTensor* v_out,
                      MutTensor* s_out, std::optional<MutTensor> mask, uintptr_t stream) {
  const fb::Checker c{op};
  const char* layout_v = "3-D [seq_len, num_heads, head_dim]";
  const char* layout_s = "2-D [seq_len, num_heads]";
  const fb::DType dt = check_values(c, v_a, na, 3, layout_v, nullptr);
  const int64_t seq_len = static_cast<int64_t>(v_a.shape(0)), num_heads = static_cast<int64_t>(v_a.shape(1)),
                head_dim = static_cast<int64_t>(v_a.shape(2));
  check_head_dim(op, na, 2, head_dim);
  check_values(c, v_b, nb_, 3, layout_v, &dt);
  const std::string va_shape = std::string(na) + ".shape";
  shape_is(op, v_b, nb_, {seq_len, num_heads, head_dim}, va_shape.c_str());
  const std::string va_rows = std::string(na) + ".shape[:2]";
  check_lse(c, s_a, nsa, 2, layout_s);
  shape_is(op, s_a, nsa, {seq_len, num_heads}, va_rows.c_str());
  check_lse(c, s_b, nsb, 2, layout_s);
  shape_is(op, s_b, nsb, {seq_len, num_heads}, va_rows.c_str());
  if (v_out) {
    check_values(c, *v_out, "v_merged", 3, layout_v, &dt);
    shape_is(op, *v_out, "v_merged", {seq_len, num_heads, head_dim}, va_shape.c_str());
    check_lse(c, *s_out, "s_merged", 2, layout_s);
    shape_is(op, *s_out, "s_merged", {seq_len, num_heads}, va_rows.c_str());
  }
  check_no_self_overlap(op, v_out ? *v_out : v_a, v_out ? "v_merged" : na);
  check_no_self_overlap(op, v_out ? *s_out : s_a, v_out ? "s_merged" : nsa);
  if (!v_out) {  // in place: v_a and s_a are written while v_b and s_b are read
    check_apart(c, v_a, na, s_a, nsa);
    check_apart(c, v_a, na, v_b, nb_);
    check_apart(c, v_a, na, s_b, nsb);
    check_apart(c, s_a, nsa, v_b, nb_);
    check_apart(c, s_a, nsa, s_b, nsb);
  }
  if (mask) {
    c.ndim_in(*mask, "mask", {1}, "1-D [seq_len]");
    const auto d = mask->dtype();
    using C = nb::dlpack::dtype_code;
    const bool ok = d.lanes == 1 && d.bits == 8 && (d.code == uint8_t(C::Bool) || d.code == uint8_t(C::UInt));
    if (!ok) fb::fail(std::string(op) + ": mask.dtype must be bool or uint8; got " + fb::dtype_name(*mask));
    shape_is(op, *mask, "mask", {seq_len}, "(seq_len,) =");
  }
  const int dev = v_out ? c.cuda_device({{&v_a, na}, {&s_a, nsa}, {&v_b, nb_}, {&s_b, nsb}, {v_out, "v_merged"},
                                         {s_out, "s_merged"}})
                        : c.cuda_device({{&v_a, na}, {&s_a, nsa}, {&v_b, nb_}, {&s_b, nsb}});
  if (mask) c.cuda_device({{&v_a, na}, {&*mask, "mask"}});
  if (seq_len == 0 || num_heads == 0) return;
  fb::DeviceGuard guard(op, dev);
  const bool pdl = fb::device_supports_pdl(dev);
  MutTensor& vo = v_out ? *v_out : v_a;
  MutTensor& so = v_out ? *s_out : s_a;
  fb::with_dtype(op, dt, [&](auto tag) {
    using T = decltype(tag);
    MergeStateParams<T> p{};
    p.v_a = static_cast<const T*>(v_a.data());
    p.s_a = static_cast<const float*>(s_a.data());
    p.v_b = static_cast<const T*>(v_b.data());
    p.s_b = static_cast<const float*>(s_b.data());
    p.v_out = static_cast<T*>(vo.data());
    p.s_out = static_cast<float*>(so.data());
    p.mask = mask ? static_cast<const uint8_t*>(mask->data()) : nullptr;
    p.mask_stride = mask ? stride_of(*mask, 0) : 0;
    p.seq_len = seq_len;
    p.num_heads = num_heads;
    p.head_dim = head_dim;
    p.a = strides_of(v_a, s_a);
    p.b = strides_of(v_b, s_b);
    p.out = strides_of(vo, so);
    p.pdl = pdl;
    const cudaError_t err = flashinfer::attention::MergeState(p, fb::as_stream(stream, dev));
    if (err != cudaSuccess) fb::throw_cuda(op, err);
  });
}

void merge_state(MutTensor v_a, MutTensor s_a, MutTensor v_b, MutTensor s_b, MutTensor v_merged,
                 MutTensor s_merged, uintptr_t stream) {
  merge_state_impl("merge_state", "v_a", "s_a", "v_b", "s_b", v_a, s_a, v_b, s_b, &v_merged, &s_merged,
                   std::nullopt, stream);
}

void merge_state_in_place(MutTensor v, MutTensor s, MutTensor v_other, MutTensor s_other,
                          std::optional<MutTensor> mask, uintptr_t stream) {
  merge_state_impl("merge_state_in_place", "v", "s", "v_other", "s_other", v, s, v_other, s_other, nullptr,
                   nullptr, mask, stream);
}

void merge_states(MutTensor v, MutTensor s, MutTensor v_merged, MutTensor s_merged, uintptr_t stream) {
  const char* op = "merge_states";
  const fb::Checker c{op};
  const fb::DType dt = check_values(c, v, "v", 4, "4-D [seq_len, num_states, num_heads, head_dim]", nullptr);
  const int64_t seq_len = static_cast<int64_t>(v.shape(0)), num_states = static_cast<int64_t>(v.shape(1)),
                num_heads = static_cast<int64_t>(v.shape(2)), head_dim = static_cast<int64_t>(v.shape(3));
  check_head_dim(op, "v", 3, head_dim);
  check_lse(c, s, "s", 3, "3-D [seq_len, num_states, num_heads]");
  shape_is(op, s, "s", {seq_len, num_states, num_heads}, "v.shape[:3]");
  check_values(c, v_merged, "v_merged", 3, "3-D [seq_len, num_heads, head_dim]", &dt);
  shape_is(op, v_merged, "v_merged", {seq_len, num_heads, head_dim}, "(v.shape[0], v.shape[2], v.shape[3]) =");
  check_lse(c, s_merged, "s_merged", 2, "2-D [seq_len, num_heads]");
  shape_is(op, s_merged, "s_merged", {seq_len, num_heads}, "(v.shape[0], v.shape[2]) =");
  check_no_self_overlap(op, v_merged, "v_merged");
  check_no_self_overlap(op, s_merged, "s_merged");
  const int dev = c.cuda_device({{&v, "v"}, {&s, "s"}, {&v_merged, "v_merged"}, {&s_merged, "s_merged"}});
  if (seq_len == 0 || num_heads == 0) return;
  fb::DeviceGuard guard(op, dev);
  const bool pdl = fb::device_supports_pdl(dev);
  fb::with_dtype(op, dt, [&](auto tag) {
    using T = decltype(tag);
    MergeStatesParams<T> p{};
    p.v = static_cast<const T*>(v.data());
    p.s = static_cast<const float*>(s.data());
    p.v_out = static_cast<T*>(v_merged.data());
    p.s_out = static_cast<float*>(s_merged.data());
    p.seq_len = seq_len;
    p.num_states = num_states;
    p.num_heads = num_heads;
    p.head_dim = head_dim;
    p.in = StateStrides{stride_of(v, 0), stride_of(v, 2), stride_of(s, 0), stride_of(s, 2)};
    p.out = strides_of(v_merged, s_merged);
    p.v_stride_k = stride_of(v, 1);
    p.s_stride_k = stride_of(s, 1);
    p.pdl = pdl;
    const cudaError_t err = flashinfer::attention::MergeStates(p, fb::as_stream(stream, dev));
    if (err != cudaSuccess) fb::throw_cuda(op, err);
  });
}

}  // namespace

NB_MODULE(_cascade, m) {
  flashinfer_bind::register_argument_error();
  m.doc() = "flashinfer attention-state merging kernels (DLPack tensors; see flashinfer.cascade)";
  m.def("merge_state", &merge_state, "v_a"_a, "s_a"_a, "v_b"_a, "s_b"_a, "v_merged"_a, "s_merged"_a, "stream"_a);
  m.def("merge_state_in_place", &merge_state_in_place, "v"_a, "s"_a, "v_other"_a, "s_other"_a,
        "mask"_a.none(), "stream"_a);
  m.def("merge_states", &merge_states, "v"_a, "s"_a, "v_merged"_a, "s_merged"_a, "stream"_a);
  m.def("supported_dtypes", &fb::supported_dtypes);
}
