// _norm: RMSNorm, Gemma RMSNorm, their fused-add forms, LayerNorm. Checks, Params, launch.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cmath>
#include <cstdio>

#include "common.h"
#include "dispatch_dtype.h"
#include "norm_inst.h"

namespace fb = flashinfer_bind;
namespace nb = nanobind;
using namespace nb::literals;
using flashinfer::norm::NormKind;
using flashinfer::norm::NormParams;
using fb::MutTensor;

namespace {

// eps as the kernels add it under the square root: a finite number >= 0.
void check_eps(const char* op, double eps) {
  if (std::isfinite(static_cast<float>(eps)) && eps >= 0.0) return;  // (the kernels take it as a float)
  char shown[32];
  std::snprintf(shown, sizeof(shown), "%g", eps);
  fb::fail(std::string(op) + ": eps must be a finite float32 number >= 0; got " + shown);
}

// A 1-D parameter every row reads (weight, gemma, beta) must not share a byte with a tensor the
// kernel writes (rows of `hidden` elements laid out by lw), or rows read it half rewritten.
void check_param_apart(const fb::Checker& c, const MutTensor& written, const char* w_name,
                       const flashinfer::RowLayout& lw, int64_t rows, int64_t hidden, const MutTensor& param,
                       const char* p_name) {
  const int64_t ew = static_cast<int64_t>(written.itemsize()), ep = static_cast<int64_t>(param.itemsize());
  if (flashinfer::tensors_intersect(fb::in_bytes(lw, ew), rows, hidden * ew, flashinfer::RowLayout{}, 1,
                                    hidden * ep, fb::byte_delta(written, param)))
    fb::fail(std::string(c.op) + ": " + p_name + " must not overlap " + w_name + " in memory (the kernel writes " +
             w_name + " while every row reads " + p_name + ")");
}

// A 2-D fp16/bf16 input with a contiguous last dimension: its dtype, and hidden size (> 0).
int64_t check_input_2d(const fb::Checker& c, const MutTensor& input, fb::DType* dt) {
  c.ndim_in(input, "input", {2}, "2-D [num_tokens, hidden_size]");
  *dt = c.dtype_half(input, "input");
  c.last_contiguous(input, "input");
  const int64_t hidden = static_cast<int64_t>(input.shape(1));
  if (hidden == 0) fb::fail(std::string(c.op) + ": input.shape[-1] (hidden size) must be > 0; got 0");
  return hidden;
}

// A 1-D [hidden] weight of dtype dt, contiguous.
void check_weight(const fb::Checker& c, const MutTensor& weight, int64_t hidden, fb::DType dt) {
  c.ndim_in(weight, "weight", {1}, "1-D [hidden_size]");
  c.dim_is(weight, "weight", 0, hidden, "input.shape[-1]");
  c.dtype_is(weight, "weight", dt);
  c.last_contiguous(weight, "weight");
}

// out = input / rms(input) * (weight + weight_offset); input 2-D or 3-D.
void rmsnorm(const char* op, MutTensor input, MutTensor weight, MutTensor out, double eps,
             float weight_offset, uintptr_t stream, bool enable_pdl) {
  const fb::Checker c{op};
  check_eps(op, eps);
  c.ndim_in(input, "input", {2, 3}, "2-D [num_tokens, hidden_size] or 3-D [num_tokens, num_heads, head_dim]");
  const fb::DType dt = c.dtype_half(input, "input");
  c.last_contiguous(input, "input");
  const int64_t hidden = static_cast<int64_t>(input.shape(input.ndim() - 1));
  if (hidden == 0) fb::fail(std::string(op) + ": input.shape[-1] (hidden size) must be > 0; got 0");
  check_weight(c, weight, hidden, dt);
  c.same_shape(out, "out", input, "input");
  c.dtype_is(out, "out", dt);
  c.last_contiguous(out, "out");
  int64_t rows = 0, out_rows = 0;
  const flashinfer::RowLayout in_l = c.rows(input, "input", &rows);
  const flashinfer::RowLayout out_l = c.rows(out, "out", &out_rows);
  c.rows_disjoint(out, "out", out_l, out_rows, hidden);
  c.out_apart(out, out_l, hidden, input, "input", in_l, hidden, rows, {0});
  check_param_apart(c, out, "out", out_l, rows, hidden, weight, "weight");
  const int dev = c.cuda_device({{&input, "input"}, {&weight, "weight"}, {&out, "out"}});
  if (rows == 0) return;
  fb::DeviceGuard guard(op, dev);
  const bool pdl = enable_pdl && fb::device_supports_pdl(dev);
  fb::with_dtype(op, dt, [&](auto tag) {
    using T = decltype(tag);
    NormParams<T, T> p{static_cast<T*>(out.data()), static_cast<const T*>(input.data()), nullptr,
                       static_cast<const T*>(weight.data()), nullptr, rows, hidden, in_l, out_l,
                       flashinfer::RowLayout{}, static_cast<float>(eps), weight_offset, pdl};
    const cudaError_t err = flashinfer::norm::Norm(p, NormKind::kRMS, fb::as_stream(stream, dev));
    if (err != cudaSuccess) fb::throw_cuda(op, err);
  });
}

// residual += input; input = residual / rms(residual) * (weight + weight_offset), 2-D.
void fused_add_rmsnorm(const char* op, MutTensor input, MutTensor residual, MutTensor weight, double eps,
                       float weight_offset, uintptr_t stream, bool enable_pdl) {
  const fb::Checker c{op};
  check_eps(op, eps);
  fb::DType dt;
  const int64_t hidden = check_input_2d(c, input, &dt);
  c.same_shape(residual, "residual", input, "input");
  c.dtype_is(residual, "residual", dt);
  c.last_contiguous(residual, "residual");
  check_weight(c, weight, hidden, dt);
  int64_t rows = 0, res_rows = 0;
  const flashinfer::RowLayout in_l = c.rows(input, "input", &rows);
  const flashinfer::RowLayout res_l = c.rows(residual, "residual", &res_rows);
  c.rows_disjoint(input, "input", in_l, rows, hidden);  // both are written in place
  c.rows_disjoint(residual, "residual", res_l, res_rows, hidden);
  c.no_overlap(input, "input", in_l, residual, "residual", res_l, rows, hidden);
  check_param_apart(c, input, "input", in_l, rows, hidden, weight, "weight");
  check_param_apart(c, residual, "residual", res_l, rows, hidden, weight, "weight");
  const int dev = c.cuda_device({{&input, "input"}, {&residual, "residual"}, {&weight, "weight"}});
  if (rows == 0) return;
  fb::DeviceGuard guard(op, dev);
  const bool pdl = enable_pdl && fb::device_supports_pdl(dev);
  fb::with_dtype(op, dt, [&](auto tag) {
    using T = decltype(tag);
    T* x = static_cast<T*>(input.data());
    NormParams<T, T> p{x, x, static_cast<T*>(residual.data()), static_cast<const T*>(weight.data()),
                       nullptr, rows, hidden, in_l, in_l, res_l, static_cast<float>(eps), weight_offset, pdl};
    const cudaError_t err = flashinfer::norm::Norm(p, NormKind::kFusedAddRMS, fb::as_stream(stream, dev));
    if (err != cudaSuccess) fb::throw_cuda(op, err);
  });
}

// out = (input - mean) / sqrt(var + eps) * gemma + beta; input 2-D fp16/bf16, gemma/beta fp32.
void layernorm(MutTensor input, MutTensor gemma, MutTensor beta, MutTensor out, double eps, uintptr_t stream) {
  const char* op = "layernorm";
  const fb::Checker c{op};
  check_eps(op, eps);
  fb::DType dt;
  const int64_t hidden = check_input_2d(c, input, &dt);
  for (auto [t, name] : {std::pair<MutTensor*, const char*>{&gemma, "gemma"}, {&beta, "beta"}}) {
    c.ndim_in(*t, name, {1}, "1-D [hidden_size]");
    c.dim_is(*t, name, 0, hidden, "input.shape[-1]");
    c.dtype_is(*t, name, fb::DType::kF32);
    c.last_contiguous(*t, name);
  }
  c.same_shape(out, "out", input, "input");
  c.dtype_is(out, "out", dt);
  c.last_contiguous(out, "out");
  int64_t rows = 0, out_rows = 0;
  const flashinfer::RowLayout in_l = c.rows(input, "input", &rows);
  const flashinfer::RowLayout out_l = c.rows(out, "out", &out_rows);
  c.rows_disjoint(out, "out", out_l, out_rows, hidden);
  c.out_apart(out, out_l, hidden, input, "input", in_l, hidden, rows, {0});
  check_param_apart(c, out, "out", out_l, rows, hidden, gemma, "gemma");
  check_param_apart(c, out, "out", out_l, rows, hidden, beta, "beta");
  const int dev = c.cuda_device({{&input, "input"}, {&gemma, "gemma"}, {&beta, "beta"}, {&out, "out"}});
  if (rows == 0) return;
  fb::DeviceGuard guard(op, dev);
  fb::with_dtype(op, dt, [&](auto tag) {
    using T = decltype(tag);
    NormParams<T, float> p{static_cast<T*>(out.data()), static_cast<const T*>(input.data()), nullptr,
                           static_cast<const float*>(gemma.data()), static_cast<const float*>(beta.data()),
                           rows, hidden, in_l, out_l, flashinfer::RowLayout{}, static_cast<float>(eps),
                           0.f, false};
    const cudaError_t err = flashinfer::norm::Norm(p, NormKind::kLayer, fb::as_stream(stream, dev));
    if (err != cudaSuccess) fb::throw_cuda(op, err);
  });
}

// ---- fp8-output norms (norm_quant.cuh) ----

// `out` arrives as a uint8 view of the caller's float8 tensor (fp8: its format).
void check_quant_out(const fb::Checker& c, const MutTensor& out, const MutTensor& input) {
  const auto d = out.dtype();
  if (!(d.code == uint8_t(nb::dlpack::dtype_code::UInt) && d.bits == 8 && d.lanes == 1))
    fb::fail(std::string(c.op) + ": out must be a float8_e4m3fn or float8_e5m2 tensor (passed as its uint8 view)");
  c.same_shape(out, "out", input, "input");
  c.last_contiguous(out, "out");
}

// Two [rows, hidden] tensors, of any element sizes, one of which the kernel writes while the
// other is read: no shared byte.
void check_quant_apart(const fb::Checker& c, const MutTensor& a, const char* a_name, const flashinfer::RowLayout& la,
                       const MutTensor& b, const char* b_name, const flashinfer::RowLayout& lb, int64_t rows,
                       int64_t hidden) {
  const int64_t ea = static_cast<int64_t>(a.itemsize()), eb = static_cast<int64_t>(b.itemsize());
  if (flashinfer::tensors_intersect(fb::in_bytes(la, ea), rows, hidden * ea, fb::in_bytes(lb, eb), rows, hidden * eb,
                                    fb::byte_delta(a, b)))
    fb::fail(std::string(c.op) + ": " + a_name + " must not overlap " + b_name + " in memory");
}

// The scale: a 1-element float32 tensor on the input's device (read by the kernel), or a float.
const float* quant_scale(const fb::Checker& c, const std::optional<MutTensor>& scale_t, double scale) {
  if (!scale_t) {
    if (!std::isfinite(scale) || scale == 0.0)
      fb::fail(std::string(c.op) + ": scale must be a finite nonzero number; got " + std::to_string(scale));
    return nullptr;
  }
  int64_t n = 1;
  for (size_t i = 0; i < scale_t->ndim(); ++i) n *= static_cast<int64_t>(scale_t->shape(i));
  if (n != 1) fb::fail("scale must be a scalar tensor");
  c.dtype_is(*scale_t, "scale", fb::DType::kF32);
  return static_cast<const float*>(scale_t->data());
}

using flashinfer::norm::Fp8Kind;
using flashinfer::norm::NormQuantParams;

// rmsnorm_quant (residual == nullopt) and fused_add_rmsnorm_quant: out = fp8(norm / scale).
void rmsnorm_quant(const char* op, MutTensor out, MutTensor input, std::optional<MutTensor> residual,
                   MutTensor weight, std::optional<MutTensor> scale_t, double scale, double eps, int fp8,
                   uintptr_t stream, bool enable_pdl) {
  const fb::Checker c{op};
  check_eps(op, eps);
  fb::DType dt;
  const int64_t hidden = check_input_2d(c, input, &dt);
  check_quant_out(c, out, input);
  check_weight(c, weight, hidden, dt);
  int64_t rows = 0, n = 0;
  const flashinfer::RowLayout in_l = c.rows(input, "input", &rows);
  const flashinfer::RowLayout out_l = c.rows(out, "out", &n);
  flashinfer::RowLayout res_l;
  c.rows_disjoint(out, "out", out_l, rows, hidden);
  check_quant_apart(c, out, "out", out_l, input, "input", in_l, rows, hidden);
  if (residual) {
    c.same_shape(*residual, "residual", input, "input");
    c.dtype_is(*residual, "residual", dt);
    c.last_contiguous(*residual, "residual");
    res_l = c.rows(*residual, "residual", &n);
    c.rows_disjoint(*residual, "residual", res_l, rows, hidden);  // written
    check_quant_apart(c, *residual, "residual", res_l, input, "input", in_l, rows, hidden);
    check_quant_apart(c, out, "out", out_l, *residual, "residual", res_l, rows, hidden);
    check_param_apart(c, *residual, "residual", res_l, rows, hidden, weight, "weight");
  }
  check_param_apart(c, out, "out", out_l, rows, hidden, weight, "weight");
  const float* scale_p = quant_scale(c, scale_t, scale);
  const int dev = residual ? c.cuda_device({{&out, "out"}, {&input, "input"}, {&*residual, "residual"},
                                            {&weight, "weight"}})
                           : c.cuda_device({{&out, "out"}, {&input, "input"}, {&weight, "weight"}});
  if (scale_t) c.cuda_device({{&input, "input"}, {&*scale_t, "scale"}});
  if (rows == 0) return;
  fb::DeviceGuard guard(op, dev);
  const bool pdl = enable_pdl && fb::device_supports_pdl(dev);
  fb::with_dtype(op, dt, [&](auto tag) {
    using T = decltype(tag);
    NormQuantParams<T, T> p{static_cast<uint8_t*>(out.data()), static_cast<const T*>(input.data()),
                            residual ? static_cast<T*>(residual->data()) : nullptr,
                            static_cast<const T*>(weight.data()), nullptr, scale_p, static_cast<float>(scale),
                            rows, hidden, in_l, out_l, res_l, static_cast<float>(eps), static_cast<Fp8Kind>(fp8), pdl};
    const cudaError_t err = flashinfer::norm::NormQuant(
        p, residual ? NormKind::kFusedAddRMS : NormKind::kRMS, fb::as_stream(stream, dev));
    if (err != cudaSuccess) fb::throw_cuda(op, err);
  });
}

// layernorm_quant: out = fp8(bf16(layernorm(input)) / scale); input bf16, contiguous.
void layernorm_quant(MutTensor out, MutTensor input, MutTensor gemma, MutTensor beta,
                     std::optional<MutTensor> scale_t, double scale, double eps, int fp8, uintptr_t stream) {
  const char* op = "layernorm_quant";
  const fb::Checker c{op};
  check_eps(op, eps);
  c.ndim_in(input, "input", {2}, "2-D [num_tokens, hidden_size]");
  if (fb::dtype_of(input) != fb::DType::kBF16) fb::fail("input must be bfloat16");
  const int64_t hidden = static_cast<int64_t>(input.shape(1));
  if (hidden == 0) fb::fail(std::string(op) + ": input.shape[-1] (hidden size) must be > 0; got 0");
  if (input.stride(1) != 1 || (input.shape(0) > 1 && input.stride(0) != hidden)) fb::fail("input must be contiguous");
  check_quant_out(c, out, input);
  for (auto [t, name] : {std::pair<MutTensor*, const char*>{&gemma, "gemma"}, {&beta, "beta"}}) {
    c.ndim_in(*t, name, {1}, "1-D [hidden_size]");
    c.dim_is(*t, name, 0, hidden, "input.shape[-1]");
    c.dtype_is(*t, name, fb::DType::kF32);
    c.last_contiguous(*t, name);
  }
  int64_t rows = 0, n = 0;
  const flashinfer::RowLayout in_l = c.rows(input, "input", &rows);
  const flashinfer::RowLayout out_l = c.rows(out, "out", &n);
  c.rows_disjoint(out, "out", out_l, rows, hidden);
  check_quant_apart(c, out, "out", out_l, input, "input", in_l, rows, hidden);
  check_param_apart(c, out, "out", out_l, rows, hidden, gemma, "gemma");
  check_param_apart(c, out, "out", out_l, rows, hidden, beta, "beta");
  const float* scale_p = quant_scale(c, scale_t, scale);
  const int dev = c.cuda_device({{&out, "out"}, {&input, "input"}, {&gemma, "gemma"}, {&beta, "beta"}});
  if (scale_t) c.cuda_device({{&input, "input"}, {&*scale_t, "scale"}});
  if (rows == 0) return;
  fb::DeviceGuard guard(op, dev);
  fb::with_dtype(op, fb::DType::kBF16, [&](auto tag) {
    using T = decltype(tag);
    NormQuantParams<T, float> p{static_cast<uint8_t*>(out.data()), static_cast<const T*>(input.data()), nullptr,
                                static_cast<const float*>(gemma.data()), static_cast<const float*>(beta.data()),
                                scale_p, static_cast<float>(scale), rows, hidden, in_l, out_l,
                                flashinfer::RowLayout{}, static_cast<float>(eps), static_cast<Fp8Kind>(fp8), false};
    const cudaError_t err = flashinfer::norm::NormQuant(p, NormKind::kLayer, fb::as_stream(stream, dev));
    if (err != cudaSuccess) fb::throw_cuda(op, err);
  });
}

// Benchmark/test hook: overwrite the tuning knobs that FLASHINFER_NORM_* set at start-up.
void set_tuning(const std::string& variant, int vecs_per_thread, int rows_per_block, const std::string& load) {
  namespace fn = flashinfer::norm;
  fn::NormTuning t;
  if (!fn::parse_norm_variant(variant.c_str(), &t.variant))
    fb::fail("_set_tuning: variant must be 'auto', 'rows' or 'pipe'; got '" + variant + "'");
  if (!fn::valid_tuning_count(vecs_per_thread, fn::kMaxVecsPerThread))
    fb::fail("_set_tuning: vecs_per_thread must be 0 (auto), 1, 2, 4 or 8; got " + std::to_string(vecs_per_thread));
  if (!fn::valid_tuning_count(rows_per_block, 4))
    fb::fail("_set_tuning: rows_per_block must be 0 (auto), 1, 2 or 4; got " + std::to_string(rows_per_block));
  if (!fn::parse_norm_load(load.c_str(), &t.load)) fb::fail("_set_tuning: load must be 'plain' or 'na'; got '" + load + "'");
  t.vecs_per_thread = vecs_per_thread;
  t.rows_per_block = rows_per_block;
  fn::norm_tuning() = t;
}

nb::tuple get_tuning() {
  namespace fn = flashinfer::norm;
  const fn::NormTuning& t = fn::norm_tuning();
  const char* v = t.variant == fn::NormVariant::kRows ? "rows" : t.variant == fn::NormVariant::kPipe ? "pipe" : "auto";
  return nb::make_tuple(v, t.vecs_per_thread, t.rows_per_block, t.load == fn::NormLoad::kNoAllocate ? "na" : "plain");
}

}  // namespace

NB_MODULE(_norm, m) {
  flashinfer_bind::register_argument_error();
  m.doc() = "flashinfer normalization kernels (DLPack tensors; see flashinfer.norm)";
  m.def(
      "rmsnorm",
      [](MutTensor input, MutTensor weight, MutTensor out, double eps, uintptr_t stream, bool pdl) {
        rmsnorm("rmsnorm", input, weight, out, eps, 0.f, stream, pdl);
      },
      "input"_a, "weight"_a, "out"_a, "eps"_a, "stream"_a, "enable_pdl"_a);
  m.def(
      "gemma_rmsnorm",
      [](MutTensor input, MutTensor weight, MutTensor out, double eps, uintptr_t stream, bool pdl) {
        rmsnorm("gemma_rmsnorm", input, weight, out, eps, 1.f, stream, pdl);
      },
      "input"_a, "weight"_a, "out"_a, "eps"_a, "stream"_a, "enable_pdl"_a);
  m.def(
      "fused_add_rmsnorm",
      [](MutTensor input, MutTensor residual, MutTensor weight, double eps, uintptr_t stream, bool pdl) {
        fused_add_rmsnorm("fused_add_rmsnorm", input, residual, weight, eps, 0.f, stream, pdl);
      },
      "input"_a, "residual"_a, "weight"_a, "eps"_a, "stream"_a, "enable_pdl"_a);
  m.def(
      "gemma_fused_add_rmsnorm",
      [](MutTensor input, MutTensor residual, MutTensor weight, double eps, uintptr_t stream, bool pdl) {
        fused_add_rmsnorm("gemma_fused_add_rmsnorm", input, residual, weight, eps, 1.f, stream, pdl);
      },
      "input"_a, "residual"_a, "weight"_a, "eps"_a, "stream"_a, "enable_pdl"_a);
  m.def("layernorm", &layernorm, "input"_a, "gemma"_a, "beta"_a, "out"_a, "eps"_a, "stream"_a);
  m.def(
      "rmsnorm_quant",
      [](MutTensor out, MutTensor input, MutTensor weight, std::optional<MutTensor> scale_t, double scale, double eps,
         int fp8, uintptr_t stream, bool pdl) {
        rmsnorm_quant("rmsnorm_quant", out, input, std::nullopt, weight, scale_t, scale, eps, fp8, stream, pdl);
      },
      "out"_a, "input"_a, "weight"_a, "scale_tensor"_a.none(), "scale"_a, "eps"_a, "fp8"_a, "stream"_a, "enable_pdl"_a);
  m.def(
      "fused_add_rmsnorm_quant",
      [](MutTensor out, MutTensor input, MutTensor residual, MutTensor weight, std::optional<MutTensor> scale_t,
         double scale, double eps, int fp8, uintptr_t stream, bool pdl) {
        rmsnorm_quant("fused_add_rmsnorm_quant", out, input, residual, weight, scale_t, scale, eps, fp8, stream, pdl);
      },
      "out"_a, "input"_a, "residual"_a, "weight"_a, "scale_tensor"_a.none(), "scale"_a, "eps"_a, "fp8"_a, "stream"_a,
      "enable_pdl"_a);
  m.def("layernorm_quant", &layernorm_quant, "out"_a, "input"_a, "gemma"_a, "beta"_a, "scale_tensor"_a.none(),
        "scale"_a, "eps"_a, "fp8"_a, "stream"_a);
  m.def("supported_dtypes", &fb::supported_dtypes);
  m.def("_set_tuning", &set_tuning, "variant"_a, "vecs_per_thread"_a = 0, "rows_per_block"_a = 0, "load"_a = "plain");
  m.def("_tuning", &get_tuning);
}
