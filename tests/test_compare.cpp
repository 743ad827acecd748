// tests/compare.h: the suite's one vector comparison fails on NaN and infinity.
#include <cmath>
#include <limits>
#include <vector>

#include "tests/compare.h"
#include "tests/catch.h"

using kvevict::test::max_diff;

TEST_CASE("max_diff is the largest difference and refuses NaN and infinity on either side", "[compare]") {
  CHECK(max_diff({}, {}) == 0);
  CHECK(max_diff({1.0, -2.0, 3.0}, {1.0, -2.5, 3.25}) == 0.5);
  CHECK(max_diff({-1e-9}, {1e-9}) == Approx(2e-9));
  const double nan = std::numeric_limits<double>::quiet_NaN(), inf = std::numeric_limits<double>::infinity();
  // The pattern it replaced, std::max(worst, |a - b|), returned 0 for each of these.
  for (double bad : {nan, inf, -inf}) {
    INFO("value " << bad);
    CHECK_THROWS_WITH(max_diff({0.0, 1.0, bad, bad}, {0.0, 1.0, 2.0, 3.0}),
                      Catch::Contains("index 2 of 4 is not finite"));
    CHECK_THROWS_WITH(max_diff({0.0, 1.0, 2.0}, {0.0, bad, 2.0}), Catch::Contains("index 1 of 3 is not finite"));
    CHECK_THROWS(max_diff({bad}, {bad}));  // equal infinities are no excuse
  }
  CHECK_THROWS_WITH(max_diff({1.0, 2.0}, {1.0}), Catch::Contains("sizes differ (2 and 1)"));
}
