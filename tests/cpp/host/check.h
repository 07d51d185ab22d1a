// A minimal assertion helper for the host tests: count failures, print where, exit non-zero.
#pragma once

#include <cstdio>

namespace test {
inline int& failures() {
  static int n = 0;
  return n;
}
inline int finish(const char* name) {
  if (failures()) {
    std::printf("%s: %d check(s) FAILED\n", name, failures());
    return 1;
  }
  std::printf("%s: all checks passed\n", name);
  return 0;
}
}  // namespace test

#define CHECK(...)                                                            \
  do {                                                                        \
    if (!(__VA_ARGS__)) {                                                            \
      std::printf("%s:%d: CHECK(%s) failed\n", __FILE__, __LINE__, #__VA_ARGS__);   \
      ++test::failures();                                                     \
    }                                                                         \
  } while (0)
