// The exponential of the policy softmax (harness/runtime/double_exp.h): the vector loops
// against the scalar code, and all of them against std::exp.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "harness/common/bit_cast.h"
#include "harness/runtime/double_exp.h"
#include "tests/test_support.h"
#include "tests/catch.h"

using namespace kvevict;

namespace {

// How many outputs of exp_doubles differ in any bit from the scalar code's.
int differing_from_scalar(const std::vector<double>& x) {
  std::vector<double> out(x.size()), want(x.size());
  exp_doubles(x.data(), out.data(), static_cast<int>(x.size()));
  exp_doubles_scalar(x.data(), want.data(), static_cast<int>(x.size()));
  int wrong = 0;
  for (size_t k = 0; k < x.size(); ++k) wrong += bit_cast<uint64_t>(out[k]) != bit_cast<uint64_t>(want[k]);
  return wrong;
}

// The distance in units in the last place between two finite positive doubles.
uint64_t ulps_apart(double a, double b) {
  const uint64_t x = bit_cast<uint64_t>(a), y = bit_cast<uint64_t>(b);
  return x > y ? x - y : y - x;
}

const std::vector<double>& edges() {
  static const std::vector<double> e = {
      0.0, -0.0, 0x1p-54, -0x1p-54, 0x1p-60, 1e-300, 0.5, -0.5, 1.0, -1.0, 511.99999, 512.0, -512.0, 707.99999,
      -707.99999, 708.0, -708.0, 709.78, 709.79, -708.5, -740.0, -745.13, -745.14, 1e300, -1e300,
      std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
      std::numeric_limits<double>::quiet_NaN()};
  return e;
}

}  // namespace

TEST_CASE("exp_doubles: the vector loops have the scalar code's bits", "[runtime][exp]") {
  // About 8M doubles over every binade from 2^-54 to 2^9, both signs: the low four bits
  // of k, the table's index, take every value many times over. Under
  // ATEN_CPU_CAPABILITY=avx2 this checks the four-lane loop, else the eight-lane one.
  std::vector<double> x = exp_main_path_doubles(uint64_t{1} << 36, 777);
  CHECK(x.size() > 8000000);
  x.insert(x.end(), edges().begin(), edges().end());
  CHECK(differing_from_scalar(x) == 0);
  // Every length (the vector loops' tails), in place.
  for (int n = 0; n <= 19; ++n) {
    INFO("n " << n);
    std::vector<double> head(edges().begin(), edges().begin() + n), in_place = head, want(n);
    exp_doubles(in_place.data(), in_place.data(), n);
    exp_doubles_scalar(head.data(), want.data(), n);
    int wrong = 0;
    for (int k = 0; k < n; ++k) wrong += bit_cast<uint64_t>(in_place[k]) != bit_cast<uint64_t>(want[k]);
    CHECK(wrong == 0);
  }
}

TEST_CASE("exp_doubles: within one ulp of std::exp, and std::exp off its path", "[runtime][exp]") {
  std::vector<double> x = exp_main_path_doubles(uint64_t{1} << 38, 4242);
  std::vector<double> out(x.size());
  exp_doubles(x.data(), out.data(), static_cast<int>(x.size()));
  size_t equal = 0, farther = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    const uint64_t apart = ulps_apart(out[k], std::exp(x[k]));
    equal += apart == 0;
    farther += apart > 1;
  }
  INFO("of " << x.size() << ": " << equal << " equal to std::exp");
  CHECK(farther == 0);
  CHECK(equal > x.size() * 99 / 100);  // glibc's exp is within 0.51 ulp; so is this, nearly
  // Exact where exp is: exp(0) and exp(tiny) are 1.
  for (double v : {0.0, -0.0, 0x1p-54, -0x1p-60}) {
    double e = 0.0;
    exp_doubles(&v, &e, 1);
    CHECK(e == 1.0);
  }
  // Off the path, std::exp's own bits: overflow, underflow, subnormal results, NaN.
  for (double v : {708.0, 709.78, 1e300, -708.0, -708.5, -740.0, -745.14, -1e300,
                   std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity()}) {
    INFO("x " << v);
    double e = 0.0;
    exp_doubles(&v, &e, 1);
    CHECK(bit_cast<uint64_t>(e) == bit_cast<uint64_t>(std::exp(v)));
  }
  const double nan = std::numeric_limits<double>::quiet_NaN();
  double e = 0.0;
  exp_doubles(&nan, &e, 1);
  CHECK(std::isnan(e));
}
