// Run-time value -> compile-time constant. Every helper ends in a Status, never a silent
// no-op for an unlisted value. Pure C++17.
#pragma once

#include <type_traits>

#include "status.h"

namespace flashinfer {

// Calls f(std::integral_constant<int, V>{}) for the V in Vs equal to v; f returns Status.
template <int... Vs, class F>
Status with_int(int v, F&& f) {
  Status s = Status::kUnsupported;
  (void)((v == Vs && (s = f(std::integral_constant<int, Vs>{}), true)) || ...);
  return s;
}

}  // namespace flashinfer
