// Element-type dispatch over the dtypes this build instantiates (FLASHINFER_DTYPES, written
// by CMake into flashinfer_instances.h). A miss names what the wheel supports.
#pragma once

#include <cuda_bf16.h>
#include <cuda_fp16.h>

#include <string>

#include "common.h"
#include "flashinfer_instances.h"  // FLASHINFER_FOR_EACH_DTYPE(X): X(DType::kF16, __half) ...

namespace flashinfer_bind {

inline std::string supported_dtypes() {
  std::string s;
#define FLASHINFER_NAME_(tag, ctype) s += std::string(s.empty() ? "" : ", ") + dtype_str(tag);
  FLASHINFER_FOR_EACH_DTYPE(FLASHINFER_NAME_)
#undef FLASHINFER_NAME_
  return s;
}

// Calls f(ctype{}) -- a value of the element type -- for the instantiated type matching d.
template <class F>
void with_dtype(const char* op, DType d, F&& f) {
#define FLASHINFER_CASE_(tag, ctype) \
  if (d == tag) return f(ctype{});
  FLASHINFER_FOR_EACH_DTYPE(FLASHINFER_CASE_)
#undef FLASHINFER_CASE_
  fail(std::string(op) + ": this build supports dtypes (" + supported_dtypes() + "); got " + dtype_str(d) +
       " (rebuild with FLASHINFER_DTYPES including it)");
}

}  // namespace flashinfer_bind
