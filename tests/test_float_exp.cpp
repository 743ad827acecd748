// std::exp on floats eight at a time (policies/float_exp.h): expf's bits.
#include <cmath>
#include <cstdint>
#include <cstring>
#include <limits>
#include <random>
#include <vector>

#include "policies/float_exp.h"
#include "tests/test_support.h"
#include "tests/catch.h"

using namespace kvevict;

namespace {

uint32_t bits_of(float v) {
  uint32_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// How many of the outputs differ in any bit from std::exp(x - shift).
int differing(const std::vector<float>& x, float shift, void (*exp_fn)(const float*, float, float*, int)) {
  std::vector<float> out(x.size());
  exp_fn(x.data(), shift, out.data(), static_cast<int>(x.size()));
  int wrong = 0;
  for (size_t k = 0; k < x.size(); ++k) wrong += bits_of(out[k]) != bits_of(std::exp(x[k] - shift));
  return wrong;
}

}  // namespace

TEST_CASE("the vector expf has expf's bits", "[policy][exp][can-skip]") {
  if (!vector_expf_supported()) {
    KVEVICT_SKIP("this CPU has no AVX2 and FMA: the vector loop cannot run ('exp_of_difference has expf's bits on "
                 "any CPU' checks the calls that run instead)");
    return;
  }
  // Where glibc's FMA expf is the libm (Debian on x86-64), the self-check passes.
  CHECK(vector_expf_in_use());
  // Every 61st float of the whole main range [-2^7, 2^7], both signs (about 35M values;
  // an odd stride reaches every residue of the bits the table index comes from).
  std::vector<float> x = expf_main_range_floats(61);
  CHECK(differing(x, 0.0f, exp_of_difference_vector) == 0);
  // Beyond it: overflow, underflow, subnormal results, infinities, NaN (expf's own calls).
  x = {88.72f, 88.73f, 89.0f, -87.0f, -87.4f, -100.0f, -103.97f, -104.0f, -150.0f, 1e20f, -1e20f,
       std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
       std::numeric_limits<float>::quiet_NaN(), 0.0f, -0.0f};
  CHECK(differing(x, 0.0f, exp_of_difference_vector) == 0);
  // Rows as h2o-paper passes them: logits less their maximum, any length (the tail of
  // fewer than eight calls expf).
  std::mt19937 rng(3);
  std::normal_distribution<float> normal(0.0f, 4.0f);
  for (int n : {1, 7, 8, 9, 31, 1000}) {
    std::vector<float> row(n);
    for (float& v : row) v = normal(rng);
    float m = row[0];
    for (float v : row) m = std::max(m, v);
    INFO("n " << n);
    CHECK(differing(row, m, exp_of_difference_vector) == 0);
    CHECK(differing(row, m, exp_of_difference) == 0);
  }
}

TEST_CASE("exp_of_difference has expf's bits on any CPU", "[policy][exp]") {
  // What h2o-paper calls: the vector loop where it checked itself, std::exp otherwise.
  if (!vector_expf_supported()) CHECK_FALSE(vector_expf_in_use());
  std::vector<float> x = expf_main_range_floats(100003);
  CHECK(x.size() > 10000);
  const std::vector<float> edges = {88.72f, 88.73f, -103.97f, -104.0f, -150.0f, 0.0f, -0.0f,
                                    std::numeric_limits<float>::infinity(), -std::numeric_limits<float>::infinity(),
                                    std::numeric_limits<float>::quiet_NaN()};
  x.insert(x.end(), edges.begin(), edges.end());
  for (int n : {1, 7, 8, 9, static_cast<int>(x.size())}) {
    INFO("n " << n);
    const std::vector<float> head(x.begin(), x.begin() + n);
    CHECK(differing(head, 0.0f, exp_of_difference) == 0);
    CHECK(differing(head, 1.5f, exp_of_difference) == 0);
  }
}
