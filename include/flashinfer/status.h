// Status codes returned by validate() and host planners. Pure C++17.
#pragma once

namespace flashinfer {

enum class Status : int {
  kSuccess = 0,
  kInvalidArgument,  // a size, stride or pointer the operation cannot accept
  kMisaligned,       // a pointer or stride breaks the vector width the path needs
  kUnsupported,      // a valid value this build has no instantiation for
  kCudaError,        // a CUDA runtime call failed (the launcher returns its cudaError_t)
};

inline const char* status_string(Status s) {
  switch (s) {
    case Status::kSuccess: return "success";
    case Status::kInvalidArgument: return "invalid argument";
    case Status::kMisaligned: return "misaligned pointer or stride";
    case Status::kUnsupported: return "unsupported by this build";
    case Status::kCudaError: return "CUDA error";
  }
  return "unknown status";
}

}  // namespace flashinfer
