// Philox4x32-10 against the published known-answer vectors (Random123's kat_vectors), and the
// uniform conversions: ranges, exactness, and that streams differ by offset and subsequence.
#include <cmath>
#include <cstdint>
#include <set>

#include "check.h"
#include "flashinfer/philox.h"

using namespace flashinfer;

struct Kat {
  uint32_t ctr[4];
  uint32_t key[2];
  uint32_t want[4];
};

int main() {
  const Kat kats[] = {
      {{0, 0, 0, 0}, {0, 0}, {0x6627e8d5, 0xe169c58d, 0xbc57ac4c, 0x9b00dbd8}},
      {{0xffffffff, 0xffffffff, 0xffffffff, 0xffffffff},
       {0xffffffff, 0xffffffff},
       {0x408f276d, 0x41c83b0e, 0xa20bc7c6, 0x6d5451fd}},
      {{0x243f6a88, 0x85a308d3, 0x13198a2e, 0x03707344},
       {0xa4093822, 0x299f31d0},
       {0xd16cfe09, 0x94fdcceb, 0x5001e420, 0x24126ea1}},
  };
  for (const Kat& k : kats) {
    const Philox4x32 out =
        philox4x32_10(Philox4x32{{k.ctr[0], k.ctr[1], k.ctr[2], k.ctr[3]}}, k.key[0], k.key[1]);
    for (int i = 0; i < 4; ++i) CHECK(out.v[i] == k.want[i]);
  }

  // The stream layout: block b = philox({b, subsequence, offset_lo, offset_hi}, seed).
  const PhiloxStream s{0x299f31d0a4093822ull, 0x0370734413198a2eull, 0x85a308d3u};
  const Philox4x32 b = s.block(0x243f6a88u);
  for (int i = 0; i < 4; ++i) CHECK(b.v[i] == kats[2].want[i]);
  const PhiloxStream zero{0, 0, 0};
  for (uint32_t i = 0; i < 4; ++i) CHECK(zero.word(i) == kats[0].want[i]);

  // Uniforms: [0, 1) and (0, 1), exact at the ends of the word range.
  CHECK(uniform_co(0u) == 0.f);
  CHECK(uniform_co(0xffffffffu) < 1.f);
  CHECK(uniform_co(0xffffffffu) == 1.f - 0x1p-24f);
  CHECK(uniform_oo(0u) > 0.f);
  CHECK(uniform_oo(0xffffffffu) < 1.f);
  CHECK(std::isfinite(-std::log(-std::log(uniform_oo(0u)))));
  CHECK(std::isfinite(-std::log(-std::log(uniform_oo(0xffffffffu)))));

  // Streams that differ in seed, offset (even by one) or subsequence share no early words, and
  // a stream's mean is about 1/2.
  const PhiloxStream base{12345, 0, 0};
  const PhiloxStream variants[] = {{12346, 0, 0}, {12345, 1, 0}, {12345, 0, 1}, {12345, 1000, 0}};
  std::set<uint32_t> seen;
  for (uint32_t n = 0; n < 64; ++n) seen.insert(base.word(n));
  for (const PhiloxStream& v : variants) {
    int same = 0;
    for (uint32_t n = 0; n < 64; ++n) same += static_cast<int>(seen.count(v.word(n)));
    CHECK(same == 0);
  }
  double mean = 0;
  const int n = 1 << 16;
  for (int i = 0; i < n; ++i) mean += uniform_co(base.word(static_cast<uint32_t>(i)));
  mean /= n;
  CHECK(std::fabs(mean - 0.5) < 0.01);
  return test::finish("test_philox");
}
