// std::exp on doubles four at a time (harness/runtime/double_exp.h): exp's bits.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "harness/runtime/double_exp.h"
#include "tests/test_support.h"
#include "tests/catch.h"

using namespace kvevict;

namespace {

uint64_t bits_of(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// How many of the outputs differ in any bit from std::exp(x).
int differing(const std::vector<double>& x, void (*exp_fn)(const double*, double*, int)) {
  std::vector<double> out(x.size());
  exp_fn(x.data(), out.data(), static_cast<int>(x.size()));
  int wrong = 0;
  for (size_t k = 0; k < x.size(); ++k) wrong += bits_of(out[k]) != bits_of(std::exp(x[k]));
  return wrong;
}

}  // namespace

TEST_CASE("the vector exp has exp's bits", "[runtime][exp][can-skip]") {
  if (!vector_exp_supported()) {
    KVEVICT_SKIP("this CPU has no AVX2 and FMA: the vector loop cannot run ('exp_doubles has exp's bits on any CPU' "
                 "checks the calls that run instead)");
    return;
  }
  // Where glibc's FMA exp is the libm (Debian on x86-64), the self-check passes.
  CHECK(vector_exp_in_use());
  // 65536 doubles of every binade of the main path, both signs (about 8M values), at an
  // offset the self-check does not use; the low 7 bits of k, the table index, take every
  // value many times over.
  std::vector<double> x = exp_main_path_doubles(uint64_t{1} << 36, 777);
  CHECK(x.size() > 8000000);
  CHECK(differing(x, exp_doubles_vector) == 0);
  // The path's ends and beyond: tiny arguments, 512 and up (glibc's scaled special
  // case), overflow, underflow, subnormal results, infinities, NaN (exp's own calls).
  x = {0.0, -0.0, 0x1p-54, -0x1p-54, 0x1.fffffffffffffp-55, 0x1p-60, 511.99999, 512.0, -512.0, 600.0, -700.0, 709.78,
       709.79, -708.4, -708.5, -740.0, -745.13, -745.14, 1e300, -1e300, std::numeric_limits<double>::infinity(),
       -std::numeric_limits<double>::infinity(), std::numeric_limits<double>::quiet_NaN()};
  CHECK(differing(x, exp_doubles_vector) == 0);
  // Slots as sim mode's masked softmax passes them: float logits less their maximum in
  // double, any length (the tail of fewer than four calls exp), in place.
  std::mt19937 rng(5);
  std::normal_distribution<float> normal(0.0f, 6.0f);
  for (int n : {1, 3, 4, 5, 17, 1000}) {
    std::vector<float> logits(n);
    for (float& v : logits) v = normal(rng);
    double m = logits[0];
    for (float v : logits) m = std::max<double>(m, v);
    std::vector<double> row(n), in_place(n);
    for (int k = 0; k < n; ++k) row[k] = in_place[k] = logits[k] - m;
    exp_doubles(in_place.data(), in_place.data(), n);
    int wrong = 0;
    for (int k = 0; k < n; ++k) wrong += bits_of(in_place[k]) != bits_of(std::exp(row[k]));
    INFO("n " << n);
    CHECK(wrong == 0);
    CHECK(differing(row, exp_doubles) == 0);
  }
}

TEST_CASE("exp_doubles has exp's bits on any CPU", "[runtime][exp]") {
  // What sim mode calls: the vector loop where it checked itself, std::exp otherwise.
  if (!vector_exp_supported()) CHECK_FALSE(vector_exp_in_use());
  std::vector<double> x = exp_main_path_doubles(uint64_t{1} << 44, 12345);
  CHECK(x.size() > 10000);
  const std::vector<double> edges = {0.0, -0.0, 0x1p-54, -0x1p-54, 511.99999, 512.0, -512.0, 709.79, -745.14,
                                     std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                                     std::numeric_limits<double>::quiet_NaN()};
  x.insert(x.end(), edges.begin(), edges.end());
  for (int n : {1, 3, 4, 5, static_cast<int>(x.size())}) {
    INFO("n " << n);
    std::vector<double> head(x.begin(), x.begin() + n);
    CHECK(differing(head, exp_doubles) == 0);
    std::vector<double> in_place = head;  // out may be x
    exp_doubles(in_place.data(), in_place.data(), n);
    int wrong = 0;
    for (int k = 0; k < n; ++k) wrong += bits_of(in_place[k]) != bits_of(std::exp(head[k]));
    CHECK(wrong == 0);
  }
}

TEST_CASE("exp_differences: exp's bits and the softmax's sum lanes", "[runtime][exp]") {
  // A softmax row's differences from its maximum: one lane a run exactly 0 (outside exp's
  // main path, std::exp's own call), the rest below it, and lengths with every tail.
  std::mt19937 rng(9);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int n : {0, 1, 5, 8, 13, 64, 1001}) {
    std::vector<float> x(n);
    for (float& v : x) v = normal(rng);
    const double shift = n > 0 ? *std::max_element(x.begin(), x.end()) : 0.0;
    double lanes[kExpSumLanes] = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0};  // sums of runs before
    double want_lanes[kExpSumLanes] = {1.0, 2.0, 3.0, 4.0, 5.0, 6.0, 7.0, 8.0};
    std::vector<double> out(n), want(n);
    for (int k = 0; k < n; ++k) want_lanes[k % kExpSumLanes] += want[k] = std::exp(static_cast<double>(x[k]) - shift);
    exp_differences(x.data(), shift, out.data(), n, lanes);
    int wrong = 0;
    for (int k = 0; k < n; ++k) wrong += bits_of(out[k]) != bits_of(want[k]);
    CHECK(wrong == 0);
    for (int j = 0; j < kExpSumLanes; ++j) CHECK(bits_of(lanes[j]) == bits_of(want_lanes[j]));
  }
}
