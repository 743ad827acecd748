// The float exponentials of the policy softmax (harness/common/float_row_exp.h): the
// vector loops against the scalar code, all of them against the true exponential, and
// the row pass's sum lanes.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "harness/common/bit_cast.h"
#include "harness/common/float_row_exp.h"
#include "tests/catch.h"

using namespace kvevict;

namespace {

// Every float from 0 down to -100 whose bit pattern is a multiple of `stride` (offset
// by `offset`): every binade, and the range's cut at -87.
std::vector<float> row_exp_differences(uint32_t stride, uint32_t offset) {
  std::vector<float> d;
  const uint32_t lowest = bit_cast<uint32_t>(-100.0f);
  for (uint32_t b = 0x80000000u + offset % stride; b <= lowest; b += stride) d.push_back(bit_cast<float>(b));
  return d;
}

// Whether two float vectors hold the same bits (memcmp is not given the null data() of an
// empty vector).
bool same_float_bits(const std::vector<float>& a, const std::vector<float>& b) {
  return a.size() == b.size() && (a.empty() || std::memcmp(a.data(), b.data(), a.size() * sizeof(float)) == 0);
}

}  // namespace

TEST_CASE("exp_floats: the vector loops have the scalar code's bits", "[runtime][exp]") {
  // About 8M differences; under ATEN_CPU_CAPABILITY=avx2 the 8-lane loop, else the 16-lane one.
  std::vector<float> d = row_exp_differences(128, 77);
  CHECK(d.size() > 8000000);
  for (float v : {0.0f, -0.0f, -1e-30f, -86.99999f, -87.0f, -87.00001f, -88.0f, -103.9f, -150.0f, -1e30f,
                  -std::numeric_limits<float>::infinity(), std::numeric_limits<float>::quiet_NaN()})
    d.push_back(v);
  std::vector<float> got(d.size()), want(d.size());
  exp_floats(d.data(), got.data(), static_cast<int>(d.size()));
  exp_floats_scalar(d.data(), want.data(), static_cast<int>(d.size()));
  CHECK(same_float_bits(got, want));
  // Every length (the loops' tails), in place.
  for (int n = 0; n <= 40; ++n) {
    INFO("n " << n);
    std::vector<float> in_place(d.end() - n, d.end()), expected(n);
    exp_floats_scalar(in_place.data(), expected.data(), n);
    exp_floats(in_place.data(), in_place.data(), n);
    CHECK(same_float_bits(in_place, expected));
  }
}

TEST_CASE("exp_floats: within 1.5 ulp of exp down to -87, then 0", "[runtime][exp]") {
  const std::vector<float> d = row_exp_differences(97, 5);
  std::vector<float> got(d.size());
  exp_floats(d.data(), got.data(), static_cast<int>(d.size()));
  double worst = 0.0;  // in units of the float's last place
  for (size_t k = 0; k < d.size(); ++k) {
    if (d[k] < -87.0f) {
      CHECK(got[k] == 0.0f);
      continue;
    }
    const double exact = std::exp(static_cast<double>(d[k]));
    const double ulp = std::ldexp(1.0, std::ilogb(exact) - 23);
    worst = std::max(worst, std::abs(static_cast<double>(got[k]) - exact) / ulp);
  }
  INFO("worst error " << worst << " ulp");
  CHECK(worst < 1.5);
  CHECK(worst > 0.4);  // it is measured, not zero
  float one = -1.0f;
  const float zero = 0.0f, nan = std::numeric_limits<float>::quiet_NaN(),
              minus_inf = -std::numeric_limits<float>::infinity();
  exp_floats(&zero, &one, 1);
  CHECK(one == 1.0f);
  float e = 1.0f;
  exp_floats(&minus_inf, &e, 1);
  CHECK(e == 0.0f);
  exp_floats(&nan, &e, 1);
  CHECK(std::isnan(e));
}

TEST_CASE("exp_row_differences: exp_floats' bits and the sum lanes", "[runtime][exp]") {
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 6.0f);
  for (int n : {0, 1, 5, 7, 8, 9, 15, 16, 17, 31, 64, 1001}) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    if (n > 2) x[n - 2] = -200.0f;  // below -87 from the maximum: 0
    const float shift = n > 0 ? *std::max_element(x.begin(), x.end()) : 0.0f;
    double lanes[kRowSumLanes] = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0};  // sums of runs before
    double want_lanes[kRowSumLanes] = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0};
    std::vector<float> d(n), want(n), out(n);
    for (int k = 0; k < n; ++k) d[k] = x[k] - shift;
    exp_floats_scalar(d.data(), want.data(), n);
    for (int k = 0; k < n; ++k) want_lanes[k % kRowSumLanes] += static_cast<double>(want[k]);
    exp_row_differences(x.data(), shift, out.data(), n, lanes);
    INFO("n " << n);
    CHECK(same_float_bits(out, want));
    for (int j = 0; j < kRowSumLanes; ++j) CHECK(lanes[j] == want_lanes[j]);
    if (n > 2) CHECK(out[n - 2] == 0.0f);
    // In place, as slot_softmax runs it.
    double again[kRowSumLanes] = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0};
    exp_row_differences(x.data(), shift, x.data(), n, again);
    CHECK(same_float_bits(x, want));
  }
}
