// _activation: act(x[..., :H]) * x[..., H:] for SiLU, GELU and GELU-tanh.
#include "activation_inst.h"
#include "common.h"
#include "dispatch_dtype.h"
#include <nanobind/stl/string.h>

namespace fb = flashinfer_bind;
namespace nb = nanobind;
using namespace nb::literals;
using flashinfer::activation::ActKind;
using flashinfer::activation::ActParams;
using fb::MutTensor;

namespace {

void act_and_mul(const char* op, ActKind kind, MutTensor input, MutTensor out, uintptr_t stream,
                 bool enable_pdl) {
  const fb::Checker c{op};
  if (input.ndim() < 1) fb::fail(std::string(op) + ": input must have at least 1 dimension; got 0-D");
  const fb::DType dt = c.dtype_half(input, "input");
  const size_t nd = input.ndim();
  const int64_t two_h = static_cast<int64_t>(input.shape(nd - 1));
  if (two_h % 2 != 0) fb::fail("The last dimension must be even (2 * hidden_size).");
  const int64_t hidden = two_h / 2;
  c.last_contiguous(input, "input");
  bool ok = out.ndim() == nd && static_cast<int64_t>(out.shape(nd - 1)) * 2 == two_h;
  for (size_t i = 0; ok && i + 1 < nd; ++i) ok = out.shape(i) == input.shape(i);
  if (!ok)
    fb::fail(std::string(op) + ": out.shape must be input.shape[:-1] + (input.shape[-1] // 2,) for input " +
             fb::shape_str(input) + "; got " + fb::shape_str(out));
  c.dtype_is(out, "out", dt);
  c.last_contiguous(out, "out");
  int64_t rows = 0, out_rows = 0;
  const flashinfer::RowLayout in_l = c.rows(input, "input", &rows);
  const flashinfer::RowLayout out_l = c.rows(out, "out", &out_rows);
  c.rows_disjoint(out, "out", out_l, out_rows, hidden);
  c.out_apart(out, out_l, hidden, input, "input", in_l, two_h, rows, {0, hidden});  // in place: either half
  const int dev = c.cuda_device({{&input, "input"}, {&out, "out"}});
  if (rows == 0 || hidden == 0) return;
  fb::DeviceGuard guard(op, dev);
  const bool pdl = enable_pdl && fb::device_supports_pdl(dev);
  fb::with_dtype(op, dt, [&](auto tag) {
    using T = decltype(tag);
    ActParams<T> p{static_cast<T*>(out.data()), static_cast<const T*>(input.data()), rows, hidden, in_l,
                   out_l, pdl};
    const cudaError_t err = flashinfer::activation::ActAndMul(p, kind, fb::as_stream(stream, dev));
    if (err != cudaSuccess) fb::throw_cuda(op, err);
  });
}

// Benchmark/test hook: overwrite the knobs that FLASHINFER_ACT_* set at start-up.
void set_tuning(const std::string& variant, int unroll) {
  namespace fa = flashinfer::activation;
  fa::ActTuning t;
  if (!fa::parse_act_variant(variant.c_str(), &t.variant))
    fb::fail("_set_tuning: variant must be 'auto', 'flat' or 'pipe'; got '" + variant + "'");
  if (!fa::valid_act_unroll(unroll))
    fb::fail("_set_tuning: unroll must be 0 (auto), 1, 2, 4 or 8; got " + std::to_string(unroll));
  t.unroll = unroll;
  fa::act_tuning() = t;
}

nb::tuple get_tuning() {
  namespace fa = flashinfer::activation;
  const fa::ActTuning& t = fa::act_tuning();
  const char* v = t.variant == fa::ActVariant::kFlat ? "flat" : t.variant == fa::ActVariant::kPipe ? "pipe" : "auto";
  return nb::make_tuple(v, t.unroll);
}

}  // namespace

NB_MODULE(_activation, m) {
  flashinfer_bind::register_argument_error();
  m.doc() = "flashinfer gated activation kernels (DLPack tensors; see flashinfer.activation)";
  auto def = [&](const char* name, ActKind kind) {
    m.def(
        name,
        [name, kind](MutTensor input, MutTensor out, uintptr_t stream, bool pdl) {
          act_and_mul(name, kind, input, out, stream, pdl);
        },
        "input"_a, "out"_a, "stream"_a, "enable_pdl"_a);
  };
  def("silu_and_mul", ActKind::kSilu);
  def("gelu_and_mul", ActKind::kGelu);
  def("gelu_tanh_and_mul", ActKind::kGeluTanh);
  m.def("_set_tuning", &set_tuning, "variant"_a, "unroll"_a = 0);
  m.def("_tuning", &get_tuning);
}
