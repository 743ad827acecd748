// A limit that selects no documents is an error, not an accuracy of 0 over n = 0.
#include <algorithm>
#include "tests/catch.h"

#include "tests/test_support.h"

TEST_CASE("eval refuses a limit that selects no documents", "[eval][errors]") {
  for (const std::string limit : {"0", "-5"}) {
    INFO("--limit " << limit);
    auto result = kvevict::test::run_kvevict("eval --task copa --limit " + limit);
    CHECK(result.exit_code != 0);
    CHECK(result.out.empty());
    CHECK(std::count(result.err.begin(), result.err.end(), '\n') == 1);
    CHECK_THAT(result.err, Catch::Contains("limit must be a positive number") && Catch::Contains(limit));
  }
  auto one = kvevict::test::run_kvevict("eval --task copa --limit 1");
  CHECK(one.exit_code == 0);
}
