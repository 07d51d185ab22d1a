// pos_enc.h: inv_freq against the direct formulas (plain, and Llama-3.1 written the way Meta's
// reference code does, by wavelength), the pair/frequency-index maps, and the RoPE launch
// arithmetic (every (token, head, feature) covered, head groups partition the heads).
#include <cmath>
#include <cstdint>
#include <algorithm>
#include <cstring>
#include <initializer_list>
#include <set>
#include <utility>

#include "check.h"
#include "flashinfer/pos_enc.h"

using namespace flashinfer;

namespace {

// Distance in float ulps (same sign assumed).
int64_t ulps(float a, float b) {
  int32_t ia, ib;
  std::memcpy(&ia, &a, 4);
  std::memcpy(&ib, &b, 4);
  return ia > ib ? int64_t{ia} - ib : int64_t{ib} - ia;
}

// Spec §6, plain: (1/rope_scale) * theta^(-2d/rotary_dim), in long double.
long double plain_freq(long double theta, long double scale, int64_t d, int64_t rd) {
  return std::pow(theta, -2.0L * d / rd) / scale;
}

// Llama-3.1 as Meta's apply_scaling writes it: by wavelength, three regions.
long double llama31_freq(long double theta, long double scale, long double low, long double high,
                         long double old_ctx, int64_t d, int64_t rd) {
  const long double pi = 3.141592653589793238462643383279502884L;
  const long double f = std::pow(theta, -2.0L * d / rd);
  const long double wavelen = 2 * pi / f;
  const long double low_wavelen = old_ctx / low, high_wavelen = old_ctx / high;
  if (wavelen < high_wavelen) return f;
  if (wavelen > low_wavelen) return f / scale;
  const long double smooth = (old_ctx / wavelen - low) / (high - low);
  return (1 - smooth) * f / scale + smooth * f;
}

void test_plain_frequencies() {
  for (double theta : {1e4, 5e5, 1e6, 10.0}) {
    for (double scale : {1.0, 8.0, 0.5}) {
      for (int64_t rd : {2, 16, 64, 96, 128, 256}) {
        RopeFreq f;
        f.theta = theta;
        f.scale = scale;
        for (int64_t d = 0; d < rd / 2; ++d) {
          const float want = static_cast<float>(plain_freq(theta, scale, d, rd));
          const float got = rope_inv_freq(f, d, rd);
          CHECK(ulps(got, want) <= 1);
          CHECK(std::fabs(rope_inv_freq_f64(f, d, rd) - static_cast<double>(plain_freq(theta, scale, d, rd))) <=
                1e-13 * static_cast<double>(plain_freq(theta, scale, d, rd)));
        }
        CHECK(rope_inv_freq(f, 0, rd) == static_cast<float>(1.0 / scale));  // d = 0: theta^0
      }
    }
  }
  // Frequencies fall strictly with d.
  RopeFreq f;
  for (int64_t d = 1; d < 64; ++d) CHECK(rope_inv_freq(f, d, 128) < rope_inv_freq(f, d - 1, 128));
}

void test_llama31_frequencies() {
  for (double scale : {8.0, 32.0, 1.0}) {
    for (auto [low, high] : {std::pair<double, double>{1, 4}, {2, 8}, {0.5, 1.5}}) {
      for (double old_ctx : {8192.0, 4096.0}) {
        for (int64_t rd : {64, 128, 256}) {
          RopeFreq f;
          f.theta = 5e5;
          f.scale = scale;
          f.llama31 = true;
          f.low_freq_factor = low;
          f.high_freq_factor = high;
          f.old_context_len = old_ctx;
          int regions[3] = {0, 0, 0};  // unchanged, smoothed, divided by scale
          for (int64_t d = 0; d < rd / 2; ++d) {
            const long double want = llama31_freq(5e5, scale, low, high, old_ctx, d, rd);
            const float got = rope_inv_freq(f, d, rd);
            CHECK(ulps(got, static_cast<float>(want)) <= 1);
            const long double base = std::pow(5e5L, -2.0L * d / rd);
            if (std::fabs(static_cast<double>(want - base)) <= 1e-15 * static_cast<double>(base)) ++regions[0];
            else if (std::fabs(static_cast<double>(want - base / scale)) <= 1e-15 * static_cast<double>(base))
              ++regions[2];
            else ++regions[1];
          }
          // theta 5e5 spans all three regions for these contexts (scale 1 makes them coincide).
          if (scale != 1.0) CHECK(regions[0] > 0 && regions[2] > 0);
        }
      }
    }
  }
  // Smoothing off (llama31 = false) equals the plain schedule exactly.
  RopeFreq a, b;
  a.theta = b.theta = 5e5;
  a.scale = b.scale = 8;
  b.llama31 = false;
  for (int64_t d = 0; d < 64; ++d) CHECK(rope_inv_freq(a, d, 128) == rope_inv_freq(b, d, 128));
}

void test_angle_is_fp32_product() {
  RopeFreq f;
  for (int64_t pos : {int64_t{0}, int64_t{1}, int64_t{4095}, int64_t{999999}, int64_t{1} << 20}) {
    for (int64_t d : {0, 1, 17, 63}) {
      const float inv = rope_inv_freq(f, d, 128);
      const float want = static_cast<float>(pos) * inv;  // one fp32 rounding of the product
      CHECK(rope_angle(pos, inv) == want);
    }
  }
}

void test_pairs() {
  for (int64_t rd : {2, 4, 16, 64, 128, 96}) {
    for (bool interleave : {false, true}) {
      std::set<int64_t> seen;
      for (int64_t d = 0; d < rd / 2; ++d) {
        const int64_t a = rope_pair_first(d, interleave), b = rope_pair_second(d, rd, interleave);
        CHECK(a >= 0 && a < rd && b >= 0 && b < rd && a != b);
        CHECK(seen.insert(a).second && seen.insert(b).second);
        CHECK(rope_freq_index(a, rd, interleave) == d && rope_freq_index(b, rd, interleave) == d);
      }
      CHECK(static_cast<int64_t>(seen.size()) == rd);  // every rotary feature in exactly one pair
    }
  }
}

void test_launch_config() {
  for (int64_t nnz : {1, 3, 64, 4096, 32768, 200000}) {
    for (int64_t heads : {1, 9, 40, 72}) {
      for (int64_t hd : {64, 80, 128, 256}) {
        for (int64_t rd : {hd, hd / 2, int64_t{16}, int64_t{2}}) {
          for (bool in_place : {false, true}) {
            for (bool aligned : {false, true}) {
              for (int64_t hpt : {0, 1, 4, 6, 8, 40, 100}) {
                const rope::RopeLaunch l = rope::rope_launch_config(nnz, heads, hd, rd, in_place, 8, aligned, hpt);
                const int64_t half = rd / 2;
                CHECK(l.vectorized == (aligned && half % 8 == 0 && hd % 8 == 0 && nnz > rope::kRopeScalarTokens));
                const int64_t e = l.vec_elems;
                // rotary units cover [0, rd); copy units cover [rd, hd) unless in place
                CHECK(l.rot_units * e == half);
                if (in_place) {
                  CHECK(l.copy_units == 0);
                } else if (l.vectorized) {
                  CHECK((hd - rd) % e == 0 && l.copy_units * 2 * e >= hd - rd);
                  CHECK(l.copy_units == 0 || (l.copy_units - 1) * 2 * e < hd - rd);
                } else {
                  CHECK(l.copy_units == hd - rd);
                }
                CHECK(l.units == l.rot_units + l.copy_units);
                // head groups partition [0, heads)
                CHECK(l.head_groups >= 1 && l.heads_per_group >= 1 && l.heads_per_group <= heads);
                CHECK(l.head_groups * l.heads_per_group >= heads);
                CHECK((l.head_groups - 1) * l.heads_per_group < heads);
                // a group above one chunk is whole chunks (or all heads)
                CHECK(l.heads_per_group <= rope::kRopeHeadChunk || l.heads_per_group % rope::kRopeHeadChunk == 0 ||
                      l.heads_per_group == heads);
                if (hpt > 0) CHECK(l.heads_per_group == std::min<int64_t>(heads, hpt <= 4 ? hpt : (hpt + 3) / 4 * 4));
                // scalar launches of few tokens: a (head group, token) grid of units-thread blocks
                CHECK(l.grid2d == (!l.vectorized && nnz <= rope::kRopeScalarTokens && l.units <= 1024));
                if (l.grid2d) CHECK(l.threads == l.units && l.blocks == l.head_groups * nnz);
                CHECK(l.blocks * l.threads >= nnz * l.head_groups * l.units);
                CHECK((l.blocks - 1) * l.threads < nnz * l.head_groups * l.units);
              }
            }
          }
        }
      }
    }
  }
  // Small grids: one head per thread; large ones: a chunk of heads per thread.
  CHECK(rope::rope_launch_config(1, 40, 128, 128, false, 8, true).heads_per_group == 1);
  CHECK(rope::rope_launch_config(64, 40, 128, 128, false, 8, true).heads_per_group == 1);
  CHECK(rope::rope_launch_config(4096, 40, 128, 128, false, 8, true).heads_per_group == rope::kRopeHeadChunk);
  CHECK(rope::rope_launch_config(32768, 40, 128, 128, false, 8, true).heads_per_group == rope::kRopeHeadChunk);
  CHECK(rope::rope_launch_config(32768, 40, 128, 128, false, 8, true).head_groups == 10);
  // an override is honoured even for small grids
  CHECK(rope::rope_launch_config(1, 40, 128, 128, false, 8, true, 8).heads_per_group == 8);
  // launches of up to small_tokens tokens take the scalar kernel, one pair per thread
  const rope::RopeLaunch one = rope::rope_launch_config(1, 40, 128, 128, true, 8, true);
  CHECK(!one.vectorized && one.units == 64 && one.heads_per_group == 1 && one.blocks * one.threads >= 40 * 64);
  CHECK(rope::rope_launch_config(rope::kRopeScalarTokens + 1, 40, 128, 128, true, 8, true).vectorized);
  CHECK(rope::rope_launch_config(1, 40, 128, 128, true, 8, true, 0, -1).vectorized);
  CHECK(!rope::rope_launch_config(4096, 40, 128, 128, true, 8, true, 0, 4096).vectorized);
  CHECK(one.grid2d && one.threads == 64 && one.blocks == 40);
  // the 2-D grid's limits: tokens fit gridDim.y, units one block; past them the flat grid
  CHECK(rope::rope_launch_config(4096, 40, 128, 128, true, 8, true, 0, 4096).grid2d);
  CHECK(!rope::rope_launch_config(70000, 40, 128, 128, true, 8, true, 0, 70000).grid2d);
  CHECK(!rope::rope_launch_config(70000, 40, 128, 128, true, 8, true, 0, 70000).vectorized);
  CHECK(rope::rope_launch_config(1, 8, 2048, 2048, true, 8, true).grid2d);    // 1024 units
  CHECK(!rope::rope_launch_config(1, 8, 4096, 2048, false, 8, true).grid2d);  // 1024 + 2048 units
}

// rope_sincos against long double sin/cos of the same fp32 angle, over the angles RoPE makes
// (positions up to 2^31 times frequencies up to 2) and the quadrant boundaries.
void test_sincos() {
  double worst = 0;
  auto check = [&](float a) {
    float s, c;
    rope::rope_sincos(a, &s, &c);
    const long double x = static_cast<long double>(a);
    const double es = std::fabs(static_cast<double>(s - std::sin(x)));
    const double ec = std::fabs(static_cast<double>(c - std::cos(x)));
    worst = std::max(worst, std::max(es, ec));
    CHECK(es <= 3e-7 && ec <= 3e-7);
  };
  for (float a : {0.f, -0.f, 1e-30f, 0.5f, 0.78539816f, 0.78539819f, 1.5707963f, 1.5707964f, 3.1415925f,
                  3.1415927f, 4.712389f, 6.2831855f, -1.f, -3.1415927f, 105615.f, 105616.f, 131071.f, 999999.f,
                  1e6f, 1048576.f, 4294967296.f, 8589934592.f})
    check(a);
  uint64_t x = 88172645463325252ull;  // xorshift
  auto next = [&] {
    x ^= x << 13;
    x ^= x >> 7;
    x ^= x << 17;
    return x;
  };
  RopeFreq f;
  for (int i = 0; i < 200000; ++i) {
    const int64_t pos = static_cast<int64_t>(next() % (int64_t{1} << 31)) >> (next() % 31);
    const int64_t d = static_cast<int64_t>(next() % 64);
    check(rope_angle(pos, rope_inv_freq(f, d, 128)));
    check(static_cast<float>(static_cast<int64_t>(next() % 2000001) - 1000000) * 1e-3f);
  }
  CHECK(worst > 0 && worst < 3e-7);
  float s, c;
  rope::rope_sincos(0.f, &s, &c);
  CHECK(s == 0.f && c == 1.f);
  rope::rope_sincos(std::nanf(""), &s, &c);
  CHECK(std::isnan(s) && std::isnan(c));
}

void test_freq_table() {
  for (int64_t rd : {2, 64, 128, 256, 512}) {
    RopeFreq f;
    f.theta = 5e5;
    f.scale = 8;
    f.llama31 = rd != 64;
    rope::RopeFreqTable t;
    rope::rope_fill_freq_table(f, rd, &t);
    for (int64_t d = 0; d < rope::kRopeParamFreqs; ++d) {
      if (d < rd / 2) CHECK(t.inv_freq[d] == rope_inv_freq(f, d, rd));  // bit-identical
      else CHECK(t.inv_freq[d] == 0.f);
    }
  }
}

void test_validate() {
  rope::RopeParams<uint16_t, int32_t> p{};
  uint16_t q[1], k[1];
  int32_t pos[1];
  p.q = p.q_out = q;
  p.k = p.k_out = k;
  p.pos_ids = pos;
  p.nnz = 1;
  p.num_q_heads = p.num_k_heads = 1;
  p.head_dim = 64;
  p.rotary_dim = 64;
  p.interleave = false;
  CHECK(rope::validate(p) == Status::kSuccess);
  CHECK(p.in_place());
  p.rotary_dim = 63;
  CHECK(rope::validate(p) == Status::kInvalidArgument);
  p.rotary_dim = 66;
  CHECK(rope::validate(p) == Status::kInvalidArgument);
  p.rotary_dim = 32;
  p.freq.scale = 0;
  CHECK(rope::validate(p) == Status::kInvalidArgument);
  p.freq.scale = 1;
  p.freq.llama31 = true;
  p.freq.low_freq_factor = p.freq.high_freq_factor = 2;
  CHECK(rope::validate(p) == Status::kInvalidArgument);
  p.freq.high_freq_factor = 4;
  CHECK(rope::validate(p) == Status::kSuccess);
  p.pos_ids = nullptr;  // indptr form without indptr
  CHECK(rope::validate(p) == Status::kInvalidArgument);
}

}  // namespace

int main() {
  test_plain_frequencies();
  test_llama31_frequencies();
  test_angle_is_fp32_product();
  test_pairs();
  test_launch_config();
  test_sincos();
  test_freq_table();
  test_validate();
  return test::finish("test_pos_enc");
}
