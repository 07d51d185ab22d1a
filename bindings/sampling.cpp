// _sampling: sorting-free sampling from probabilities (every filter), from logits (Gumbel-max),
// top-k / top-p renormalization, the top-k logit mask, softmax and chain speculative sampling.
// Checks (shapes and dtypes before the device, so CPU tensors reach every message), Params,
// launch. The per-row parameter messages are the ones FlashInfer's tests match.
#include <nanobind/stl/optional.h>
#include <nanobind/stl/string.h>

#include <cstdint>
#include <optional>
#include <string>
#include <tuple>

#include "common.h"
#include "sampling_inst.h"

namespace fb = flashinfer_bind;
namespace nb = nanobind;
using namespace nb::literals;
using fb::MutTensor;
using OptTensor = std::optional<MutTensor>;
namespace fs = flashinfer::sampling;

namespace {

std::string str(int64_t v) { return std::to_string(v); }

// torch exports bool as DLPack Bool; older producers as UInt8 (same one-byte 0/1 layout).
bool is_bool(const MutTensor& t) {
  const auto code = t.dtype().code;
  return (code == uint8_t(nb::dlpack::dtype_code::Bool) || code == uint8_t(nb::dlpack::dtype_code::UInt)) &&
         t.dtype().bits == 8 && t.dtype().lanes == 1;
}
bool is_u64(const MutTensor& t) {
  return t.dtype().code == uint8_t(nb::dlpack::dtype_code::UInt) && t.dtype().bits == 64 && t.dtype().lanes == 1;
}

void contiguous_1d(const fb::Checker& c, const MutTensor& t, const char* name) {
  if (t.ndim() == 1 && t.shape(0) > 1 && t.stride(0) != 1)
    fb::fail(std::string(c.op) + ": " + name + " must be contiguous; got stride " + str(t.stride(0)));
}

// A [rows, vocab] matrix read row by row: last dim contiguous, rows at any stride >= 0.
struct Rows {
  int64_t rows = 0, stride = 0;
  int vocab = 0;
};

Rows rows_of(const fb::Checker& c, const MutTensor& t, const char* name) {
  c.ndim_in(t, name, {2}, "2-D [batch_size, vocab_size]");
  c.last_contiguous(t, name);
  Rows r;
  r.rows = static_cast<int64_t>(t.shape(0));
  const int64_t v = static_cast<int64_t>(t.shape(1));
  if (v <= 0 || v > (int64_t{1} << 30))
    fb::fail(std::string(c.op) + ": " + name + ".shape[1] (vocab size) must be in [1, 2^30]; got " + str(v));
  r.vocab = static_cast<int>(v);
  r.stride = r.rows > 1 ? t.stride(0) : r.vocab;
  if (r.stride < 0) fb::fail(std::string(c.op) + ": " + name + " must have a non-negative row stride");
  return r;
}

// The kernels that sample, renormalize or softmax read rows of at least `vocab` apart (an
// expand()ed distribution would pass every other check, then fail at launch without a name).
void rows_apart(const fb::Checker& c, const Rows& r, const char* name) {
  if (r.rows > 1 && r.stride < r.vocab)
    fb::fail(std::string(c.op) + ": " + name + " rows must not overlap: row stride " + str(r.stride) +
             " < vocab size " + str(r.vocab) + " (pass a contiguous tensor)");
}

// A per-row sampling parameter given as a tensor: 1-D of length `rows` (FlashInfer's messages).
void check_param(const fb::Checker& c, const OptTensor& t, const char* name, fb::DType want, int64_t rows) {
  if (!t) return;
  if (t->ndim() == 0)
    fb::fail("Expected a 1D tensor of shape (batch_size,) or scalar for the sampling parameter, but got a "
             "0-dimensional tensor.");
  if (t->ndim() > 1)
    fb::fail("Expected a 1D tensor or scalar for the sampling parameter, but got a " + str(t->ndim()) + "D tensor.");
  if (static_cast<int64_t>(t->shape(0)) != rows)
    fb::fail("Sampling parameter tensor batch size mismatch: expected length " + str(rows) +
             " to match the reference tensor batch size, but got length " + str(t->shape(0)) + ".");
  c.dtype_is(*t, name, want);
  contiguous_1d(c, *t, name);
}

// indices (optional) and the output: [batch] int32 or int64, the output of indices' dtype.
int64_t check_outputs(const fb::Checker& c, const OptTensor& indices, const MutTensor& out, int64_t rows,
                      fb::DType* id_type) {
  int64_t batch = rows;
  *id_type = fb::DType::kI32;
  if (indices) {
    c.ndim_in(*indices, "indices", {1}, "1-D [batch_size]");
    *id_type = fb::dtype_of(*indices);
    if (*id_type != fb::DType::kI32 && *id_type != fb::DType::kI64)
      fb::fail(std::string(c.op) + ": indices.dtype must be int32 or int64; got " + fb::dtype_name(*indices));
    contiguous_1d(c, *indices, "indices");
    batch = static_cast<int64_t>(indices->shape(0));
  }
  c.ndim_in(out, "out", {1}, "1-D [batch_size]");
  c.dim_is(out, "out", 0, batch, "the batch size");
  c.dtype_is(out, "out", *id_type);
  contiguous_1d(c, out, "out");
  return batch;
}

// Philox seeds and offsets: Python scalars, or int64/uint64 tensors of length 1 or batch.
fs::RandomSeeds check_seeds(const fb::Checker& c, const OptTensor& seed_arr, uint64_t seed, const OptTensor& offset_arr,
                            uint64_t offset, int64_t batch) {
  fs::RandomSeeds r;
  r.seed = seed;
  r.offset = offset;
  auto one = [&](const OptTensor& t, const char* name, int64_t* len) {
    if (!t) return;
    c.ndim_in(*t, name, {1}, "1-D");
    if (fb::dtype_of(*t) != fb::DType::kI64 && !is_u64(*t))
      fb::fail(std::string(c.op) + ": " + name + " tensor must be int64/uint64; got " + fb::dtype_name(*t));
    const int64_t n = static_cast<int64_t>(t->shape(0));
    if (n != 1 && n != batch)
      fb::fail(std::string(c.op) + ": " + name + " tensor length must be 1 or " + str(batch) + "; got " + str(n));
    contiguous_1d(c, *t, name);
    *len = n;
  };
  one(seed_arr, "seed", &r.seed_len);
  one(offset_arr, "offset", &r.offset_len);
  if (seed_arr) r.seed_arr = static_cast<const uint64_t*>(seed_arr->data());
  if (offset_arr) r.offset_arr = static_cast<const uint64_t*>(offset_arr->data());
  return r;
}

int device_of(const fb::Checker& c, std::initializer_list<std::pair<const OptTensor*, const char*>> ts) {
  int dev = -1;
  for (auto [t, name] : ts) {
    if (!*t) continue;
    const int d = c.cuda_device({{&**t, name}});
    if (dev >= 0 && d != dev)
      fb::fail(std::string(c.op) + ": " + name + " is on cuda:" + str(d) + " but the inputs are on cuda:" + str(dev));
    dev = d;
  }
  return dev;
}

template <class F>
void on_device(const char* op, int dev, F&& f) {
  fb::DeviceGuard guard(op, dev);
  const cudaError_t err = f();
  if (err != cudaSuccess) fb::throw_cuda(op, err);
}

// run(T{}) for the value type of the renorm / mask / top-k kernels: fp16, bf16, else fp32 (the
// caller has checked the dtype; every sampling kernel is instantiated for all three).
template <class F>
void with_value_type(fb::DType dt, F&& run) {
  if (dt == fb::DType::kF16) {
    run(__half{});
  } else if (dt == fb::DType::kBF16) {
    run(__nv_bfloat16{});
  } else {
    run(float{});
  }
}

enum Filter : int { kTopK = 1, kTopP = 2, kMinP = 4, kTopKFirst = 8 };

// Every sampler over probabilities: `filters` selects top-k / top-p / min-p (joint) or
// top-k-first; stats (optional int32 [batch, 2]) receives (draws, passes) per output.
void sampling(const char* op, MutTensor probs, MutTensor out, OptTensor valid, OptTensor indices, OptTensor top_k_arr,
              int64_t top_k, OptTensor top_p_arr, double top_p, OptTensor min_p_arr, double min_p, int filters,
              OptTensor seed_arr, uint64_t seed, OptTensor offset_arr, uint64_t offset, OptTensor stats,
              int cluster, uintptr_t stream, bool pdl) {
  const fb::Checker c{op};
  const Rows r = rows_of(c, probs, "probs");
  rows_apart(c, r, "probs");
  c.dtype_is(probs, "probs", fb::DType::kF32);
  fb::DType id_type;
  const int64_t batch = check_outputs(c, indices, out, r.rows, &id_type);
  if (valid) {
    c.ndim_in(*valid, "valid", {1}, "1-D [batch_size]");
    c.dim_is(*valid, "valid", 0, batch, "the batch size");
    if (!is_bool(*valid)) fb::fail(std::string(op) + ": valid.dtype must be bool; got " + fb::dtype_name(*valid));
    contiguous_1d(c, *valid, "valid");
  }
  check_param(c, top_k_arr, "top_k", fb::DType::kI32, r.rows);
  check_param(c, top_p_arr, "top_p", fb::DType::kF32, r.rows);
  check_param(c, min_p_arr, "min_p", fb::DType::kF32, r.rows);
  const fs::RandomSeeds rng = check_seeds(c, seed_arr, seed, offset_arr, offset, batch);
  if (stats) {
    c.ndim_in(*stats, "stats", {2}, "2-D [batch_size, 2]");
    c.dim_is(*stats, "stats", 0, batch, "the batch size");
    c.dim_is(*stats, "stats", 1, 2, "2");
    c.dtype_is(*stats, "stats", fb::DType::kI32);
    if (batch > 0 && (stats->stride(1) != 1 || (batch > 1 && stats->stride(0) != 2)))
      fb::fail(std::string(op) + ": stats must be contiguous");
  }
  const OptTensor p(probs), o(out);
  const int dev = device_of(c, {{&p, "probs"}, {&o, "out"}, {&valid, "valid"}, {&indices, "indices"},
                                {&top_k_arr, "top_k"}, {&top_p_arr, "top_p"}, {&min_p_arr, "min_p"},
                                {&seed_arr, "seed"}, {&offset_arr, "offset"}, {&stats, "stats"}});
  if (batch == 0) return;
  auto run = [&](auto id_tag) {
    using IdT = decltype(id_tag);
    fs::SamplingParams<IdT> sp;
    sp.probs = static_cast<const float*>(probs.data());
    sp.row_stride = r.stride;
    sp.rows = r.rows;
    sp.vocab = r.vocab;
    sp.batch = batch;
    sp.indices = indices ? static_cast<const IdT*>(indices->data()) : nullptr;
    sp.out = static_cast<IdT*>(out.data());
    sp.valid = valid ? static_cast<bool*>(valid->data()) : nullptr;
    sp.top_k_arr = top_k_arr ? static_cast<const int*>(top_k_arr->data()) : nullptr;
    sp.top_p_arr = top_p_arr ? static_cast<const float*>(top_p_arr->data()) : nullptr;
    sp.min_p_arr = min_p_arr ? static_cast<const float*>(min_p_arr->data()) : nullptr;
    sp.top_k = static_cast<int>(top_k < 0 ? 0 : (top_k > 0x7fffffff ? 0x7fffffff : top_k));
    sp.top_p = static_cast<float>(top_p);
    sp.min_p = static_cast<float>(min_p);
    sp.use_top_k = (filters & (kTopK | kTopKFirst)) != 0;
    sp.use_top_p = (filters & (kTopP | kTopKFirst)) != 0;
    sp.use_min_p = (filters & kMinP) != 0;
    sp.top_k_first = (filters & kTopKFirst) != 0;
    sp.rng = rng;
    sp.stats = stats ? static_cast<int*>(stats->data()) : nullptr;
    sp.cluster = cluster < -1 ? -1 : cluster;
    sp.pdl = pdl && fb::device_supports_pdl(dev);
    on_device(op, dev, [&] { return fs::Sampling(sp, fb::as_stream(stream, dev)); });
  };
  if (id_type == fb::DType::kI64) {
    run(int64_t{});
  } else {
    run(int32_t{});
  }
}

// The common call on a short argument list (what flashinfer.sampling's fast path passes): no
// indices, valid, per-row tensors, seed tensors or stats. The same checks and launch.
void sample_probs(const char* op, MutTensor probs, MutTensor out, int filters, OptTensor top_k_arr, int64_t top_k,
                  OptTensor top_p_arr, double top_p, OptTensor min_p_arr, double min_p, uint64_t seed, uint64_t offset,
                  int cluster, uintptr_t stream) {
  sampling(op, probs, out, std::nullopt, std::nullopt, top_k_arr, top_k, top_p_arr, top_p, min_p_arr, min_p, filters,
           std::nullopt, seed, std::nullopt, offset, std::nullopt, cluster, stream, true);
}

// kind: 0 top-k renorm (fp32/fp16/bf16), 1 top-p renorm (fp32), 2 top-k logit mask.
void renorm(const char* op, int kind, MutTensor input, MutTensor out, OptTensor top_k_arr, int64_t top_k,
            OptTensor top_p_arr, double top_p, uintptr_t stream, bool pdl) {
  const fb::Checker c{op};
  const char* name = kind == 2 ? "logits" : "probs";
  const Rows r = rows_of(c, input, name);
  rows_apart(c, r, name);
  const fb::DType dt = fb::dtype_of(input);
  if (kind == 1) {
    c.dtype_is(input, name, fb::DType::kF32);
  } else if (dt != fb::DType::kF32 && dt != fb::DType::kF16 && dt != fb::DType::kBF16) {
    fb::fail(std::string(op) + ": " + name + ".dtype must be float32, float16 or bfloat16; got " +
             fb::dtype_name(input));
  }
  c.same_shape(out, "out", input, name);
  c.dtype_is(out, "out", dt);
  c.last_contiguous(out, "out");
  const int64_t out_stride = r.rows > 1 ? out.stride(0) : r.vocab;
  if (r.rows > 1 && out_stride < r.vocab) fb::fail(std::string(op) + ": out rows must not overlap");
  check_param(c, top_k_arr, "top_k", fb::DType::kI32, r.rows);
  check_param(c, top_p_arr, "top_p", fb::DType::kF32, r.rows);
  const OptTensor i(input), o(out);
  const int dev = device_of(c, {{&i, name}, {&o, "out"}, {&top_k_arr, "top_k"}, {&top_p_arr, "top_p"}});
  if (r.rows == 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    fs::RenormParams<T> rp;
    rp.in = static_cast<const T*>(input.data());
    rp.out = static_cast<T*>(out.data());
    rp.in_stride = r.stride;
    rp.out_stride = out_stride;
    rp.rows = r.rows;
    rp.vocab = r.vocab;
    rp.kind = static_cast<fs::RenormKind>(kind);
    rp.top_k_arr = top_k_arr ? static_cast<const int*>(top_k_arr->data()) : nullptr;
    rp.top_p_arr = top_p_arr ? static_cast<const float*>(top_p_arr->data()) : nullptr;
    rp.top_k = static_cast<int>(top_k < 0 ? 0 : (top_k > 0x7fffffff ? 0x7fffffff : top_k));
    rp.top_p = static_cast<float>(top_p);
    rp.pdl = pdl && fb::device_supports_pdl(dev);
    on_device(op, dev, [&] { return fs::Renorm(rp, fb::as_stream(stream, dev)); });
  };
  with_value_type(dt, run);
}

void softmax(MutTensor logits, MutTensor out, OptTensor temperature_arr, double temperature, uintptr_t stream,
             bool pdl) {
  const char* op = "softmax";
  const fb::Checker c{op};
  const Rows r = rows_of(c, logits, "logits");
  rows_apart(c, r, "logits");
  c.dtype_is(logits, "logits", fb::DType::kF32);
  c.same_shape(out, "out", logits, "logits");
  c.dtype_is(out, "out", fb::DType::kF32);
  c.last_contiguous(out, "out");
  const int64_t out_stride = r.rows > 1 ? out.stride(0) : r.vocab;
  if (r.rows > 1 && out_stride < r.vocab) fb::fail(std::string(op) + ": out rows must not overlap");
  if (temperature_arr) {
    c.ndim_in(*temperature_arr, "temperature", {1}, "1-D [batch_size]");
    c.dim_is(*temperature_arr, "temperature", 0, r.rows, "logits.shape[0]");
    c.dtype_is(*temperature_arr, "temperature", fb::DType::kF32);
    contiguous_1d(c, *temperature_arr, "temperature");
  }
  const OptTensor l(logits), o(out);
  const int dev = device_of(c, {{&l, "logits"}, {&o, "out"}, {&temperature_arr, "temperature"}});
  if (r.rows == 0) return;
  fs::SoftmaxParams sp;
  sp.logits = static_cast<const float*>(logits.data());
  sp.out = static_cast<float*>(out.data());
  sp.in_stride = r.stride;
  sp.out_stride = out_stride;
  sp.rows = r.rows;
  sp.vocab = r.vocab;
  sp.temperature_arr = temperature_arr ? static_cast<const float*>(temperature_arr->data()) : nullptr;
  sp.temperature = static_cast<float>(temperature);
  sp.pdl = pdl && fb::device_supports_pdl(dev);
  on_device(op, dev, [&] { return fb::softmax_launch(sp, fb::as_stream(stream, dev)); });
}

void sampling_from_logits(MutTensor logits, MutTensor out, OptTensor indices, OptTensor seed_arr, uint64_t seed,
                          OptTensor offset_arr, uint64_t offset, uintptr_t stream, bool pdl) {
  const char* op = "sampling_from_logits";
  const fb::Checker c{op};
  const Rows r = rows_of(c, logits, "logits");
  rows_apart(c, r, "logits");
  c.dtype_is(logits, "logits", fb::DType::kF32);
  fb::DType id_type;
  const int64_t batch = check_outputs(c, indices, out, r.rows, &id_type);
  const fs::RandomSeeds rng = check_seeds(c, seed_arr, seed, offset_arr, offset, batch);
  const OptTensor l(logits), o(out);
  const int dev = device_of(c, {{&l, "logits"}, {&o, "out"}, {&indices, "indices"}, {&seed_arr, "seed"},
                                {&offset_arr, "offset"}});
  if (batch == 0) return;
  auto run = [&](auto id_tag) {
    using IdT = decltype(id_tag);
    fs::LogitsSamplingParams<IdT> lp;
    lp.logits = static_cast<const float*>(logits.data());
    lp.row_stride = r.stride;
    lp.rows = r.rows;
    lp.vocab = r.vocab;
    lp.batch = batch;
    lp.indices = indices ? static_cast<const IdT*>(indices->data()) : nullptr;
    lp.out = static_cast<IdT*>(out.data());
    lp.rng = rng;
    lp.pdl = pdl && fb::device_supports_pdl(dev);
    on_device(op, dev, [&] { return fs::LogitsSampling(lp, fb::as_stream(stream, dev)); });
  };
  if (id_type == fb::DType::kI64) {
    run(int64_t{});
  } else {
    run(int32_t{});
  }
}

void chain_speculative_sampling(MutTensor draft_probs, MutTensor draft_ids, MutTensor target_probs, MutTensor out,
                                MutTensor accepted, MutTensor emitted, OptTensor seed_arr, uint64_t seed,
                                OptTensor offset_arr, uint64_t offset, uintptr_t stream, bool pdl) {
  const char* op = "chain_speculative_sampling";
  const fb::Checker c{op};
  c.ndim_in(draft_probs, "draft_probs", {3}, "3-D [batch_size, num_speculate_tokens, vocab_size]");
  c.dtype_is(draft_probs, "draft_probs", fb::DType::kF32);
  c.last_contiguous(draft_probs, "draft_probs");
  const int64_t b = static_cast<int64_t>(draft_probs.shape(0)), n = static_cast<int64_t>(draft_probs.shape(1));
  const int64_t v = static_cast<int64_t>(draft_probs.shape(2));
  if (v <= 0 || v > (int64_t{1} << 30))
    fb::fail(std::string(op) + ": draft_probs.shape[2] (vocab size) must be in [1, 2^30]; got " + str(v));
  c.ndim_in(draft_ids, "draft_token_ids", {2}, "2-D [batch_size, num_speculate_tokens]");
  c.dim_is(draft_ids, "draft_token_ids", 0, b, "draft_probs.shape[0]");
  c.dim_is(draft_ids, "draft_token_ids", 1, n, "draft_probs.shape[1]");
  c.dtype_is(draft_ids, "draft_token_ids", fb::DType::kI32);
  c.last_contiguous(draft_ids, "draft_token_ids");
  c.ndim_in(target_probs, "target_probs", {3}, "3-D [batch_size, num_speculate_tokens + 1, vocab_size]");
  c.dim_is(target_probs, "target_probs", 0, b, "draft_probs.shape[0]");
  c.dim_is(target_probs, "target_probs", 1, n + 1, "num_speculate_tokens + 1");
  c.dim_is(target_probs, "target_probs", 2, v, "draft_probs.shape[2]");
  c.dtype_is(target_probs, "target_probs", fb::DType::kF32);
  c.last_contiguous(target_probs, "target_probs");
  c.ndim_in(out, "output_token_ids", {2}, "2-D [batch_size, num_speculate_tokens + 1]");
  c.dim_is(out, "output_token_ids", 0, b, "the batch size");
  c.dim_is(out, "output_token_ids", 1, n + 1, "num_speculate_tokens + 1");
  c.dtype_is(out, "output_token_ids", fb::DType::kI32);
  if (b > 1 && (out.stride(0) != n + 1 || (n > 0 && out.stride(1) != 1)))
    fb::fail(std::string(op) + ": output_token_ids must be contiguous");
  for (auto [t, name] : {std::pair<MutTensor*, const char*>{&accepted, "accepted_num"}, {&emitted, "emitted_num"}}) {
    c.ndim_in(*t, name, {1}, "1-D [batch_size]");
    c.dim_is(*t, name, 0, b, "the batch size");
    c.dtype_is(*t, name, fb::DType::kI32);
    contiguous_1d(c, *t, name);
  }
  const fs::RandomSeeds rng = check_seeds(c, seed_arr, seed, offset_arr, offset, b);
  const OptTensor d(draft_probs), di(draft_ids), t(target_probs), o(out), a(accepted), e(emitted);
  const int dev = device_of(c, {{&d, "draft_probs"}, {&di, "draft_token_ids"}, {&t, "target_probs"},
                                {&o, "output_token_ids"}, {&a, "accepted_num"}, {&e, "emitted_num"},
                                {&seed_arr, "seed"}, {&offset_arr, "offset"}});
  if (b == 0) return;
  fs::ChainSpeculativeParams cp;
  cp.draft_probs = static_cast<const float*>(draft_probs.data());
  cp.draft_ids = static_cast<const int*>(draft_ids.data());
  cp.target_probs = static_cast<const float*>(target_probs.data());
  cp.out = static_cast<int*>(out.data());
  cp.accepted = static_cast<int*>(accepted.data());
  cp.emitted = static_cast<int*>(emitted.data());
  cp.draft_stride_b = draft_probs.stride(0);
  cp.draft_stride_n = draft_probs.stride(1);
  cp.ids_stride_b = draft_ids.stride(0);
  cp.target_stride_b = target_probs.stride(0);
  cp.target_stride_n = target_probs.stride(1);
  cp.batch = b;
  cp.n = static_cast<int>(n);
  cp.vocab = static_cast<int>(v);
  cp.rng = rng;
  cp.pdl = pdl && fb::device_supports_pdl(dev);
  on_device(op, dev, [&] { return fb::chain_speculative_launch(cp, fb::as_stream(stream, dev)); });
}

// The k largest per row: values [rows, k] (input dtype) and int64 indices [rows, k].
void top_k(MutTensor input, MutTensor values, MutTensor indices, int64_t k, int tie_break, uintptr_t stream, bool pdl) {
  const char* op = "top_k";
  const fb::Checker c{op};
  const Rows r = rows_of(c, input, "input");
  const fb::DType dt = fb::dtype_of(input);
  if (dt != fb::DType::kF32 && dt != fb::DType::kF16 && dt != fb::DType::kBF16)
    fb::fail(std::string(op) + ": input.dtype must be float32, float16 or bfloat16; got " + fb::dtype_name(input));
  if (k < 1 || k > r.vocab)
    fb::fail(std::string(op) + ": k must be in [1, input.shape[1]] = [1, " + str(r.vocab) + "]; got " + str(k));
  if (tie_break < 0 || tie_break > 2)
    fb::fail(std::string(op) + ": tie_break must be 0 (NONE), 1 (SMALL) or 2 (LARGE); got " + str(tie_break));
  for (auto [t, name, want] : {std::tuple<MutTensor*, const char*, fb::DType>{&values, "values", dt},
                               {&indices, "indices", fb::DType::kI64}}) {
    c.ndim_in(*t, name, {2}, "2-D [batch_size, k]");
    c.dim_is(*t, name, 0, r.rows, "input.shape[0]");
    c.dim_is(*t, name, 1, k, "k");
    c.dtype_is(*t, name, want);
    if (r.rows > 0 && (t->stride(1) != 1 || (r.rows > 1 && t->stride(0) != k)))
      fb::fail(std::string(op) + ": " + name + " must be contiguous");
  }
  const OptTensor i(input), v(values), x(indices);
  const int dev = device_of(c, {{&i, "input"}, {&v, "values"}, {&x, "indices"}});
  if (r.rows == 0) return;
  auto run = [&](auto tag) {
    using T = decltype(tag);
    fs::TopKParams<T> tp;
    tp.in = static_cast<const T*>(input.data());
    tp.values = static_cast<T*>(values.data());
    tp.indices = static_cast<int64_t*>(indices.data());
    tp.in_stride = r.stride;
    tp.rows = r.rows;
    tp.vocab = r.vocab;
    tp.k = static_cast<int>(k);
    tp.tie_break = static_cast<fs::TopKTieBreak>(tie_break);
    tp.pdl = pdl && fb::device_supports_pdl(dev);
    on_device(op, dev, [&] { return fs::TopK(tp, fb::as_stream(stream, dev)); });
  };
  with_value_type(dt, run);
}

}  // namespace

NB_MODULE(_sampling, m) {
  flashinfer_bind::register_argument_error();
  m.doc() = "flashinfer sorting-free sampling kernels (DLPack tensors; see flashinfer.sampling)";
  m.def("sampling", &sampling, "op"_a, "probs"_a, "out"_a, "valid"_a.none(), "indices"_a.none(), "top_k_arr"_a.none(),
        "top_k"_a, "top_p_arr"_a.none(), "top_p"_a, "min_p_arr"_a.none(), "min_p"_a, "filters"_a, "seed_arr"_a.none(),
        "seed"_a, "offset_arr"_a.none(), "offset"_a, "stats"_a.none(), "cluster"_a, "stream"_a, "enable_pdl"_a);
  m.def("sample_probs", &sample_probs, "op"_a, "probs"_a, "out"_a, "filters"_a, "top_k_arr"_a.none(), "top_k"_a,
        "top_p_arr"_a.none(), "top_p"_a, "min_p_arr"_a.none(), "min_p"_a, "seed"_a, "offset"_a, "cluster"_a,
        "stream"_a);
  m.def("renorm", &renorm, "op"_a, "kind"_a, "input"_a, "out"_a, "top_k_arr"_a.none(), "top_k"_a,
        "top_p_arr"_a.none(), "top_p"_a, "stream"_a, "enable_pdl"_a);
  m.def("softmax", &softmax, "logits"_a, "out"_a, "temperature_arr"_a.none(), "temperature"_a, "stream"_a,
        "enable_pdl"_a);
  m.def("sampling_from_logits", &sampling_from_logits, "logits"_a, "out"_a, "indices"_a.none(), "seed_arr"_a.none(),
        "seed"_a, "offset_arr"_a.none(), "offset"_a, "stream"_a, "enable_pdl"_a);
  m.def("chain_speculative_sampling", &chain_speculative_sampling, "draft_probs"_a, "draft_token_ids"_a,
        "target_probs"_a, "out"_a, "accepted"_a, "emitted"_a, "seed_arr"_a.none(), "seed"_a, "offset_arr"_a.none(),
        "offset"_a, "stream"_a, "enable_pdl"_a);
  m.def("top_k", &top_k, "input"_a, "values"_a, "indices"_a, "k"_a, "tie_break"_a, "stream"_a, "enable_pdl"_a);
  m.attr("FILTER_TOP_K") = int(kTopK);
  m.attr("FILTER_TOP_P") = int(kTopP);
  m.attr("FILTER_MIN_P") = int(kMinP);
  m.attr("FILTER_TOP_K_FIRST") = int(kTopKFirst);
}
