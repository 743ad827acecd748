// Generation diversity metrics (distinct-1/2/3, repetition) with hand-computed values,
// and their rows in an XSum evaluation.

#include <fstream>

#include "tasks/metrics.h"
#include "tests/test_support.h"
#include "tests/catch.h"

using namespace kvevict;

TEST_CASE("distinct-n and repetition of one generation", "[metrics][diversity]") {
  // the cat sat on the mat the cat sat: 9 words, 5 distinct; 8 bigrams, 6 distinct;
  // 7 trigrams, 6 distinct (the cat sat twice); 6 four-grams, all distinct.
  const std::string text = "The cat sat on the mat. The cat sat.";
  CHECK(*distinct_n(text, 1) == Approx(5.0 / 9));
  CHECK(*distinct_n(text, 2) == Approx(6.0 / 8));
  CHECK(*distinct_n(text, 3) == Approx(6.0 / 7));
  CHECK(*repetition(text) == Approx(0.0));
  // no no no no no: 1/5, 1/4, 1/3 distinct; two four-grams, one repeats the other.
  CHECK(*distinct_n("no no no no no", 1) == Approx(0.2));
  CHECK(*distinct_n("no no no no no", 2) == Approx(0.25));
  CHECK(*distinct_n("no no no no no", 3) == Approx(1.0 / 3));
  CHECK(*repetition("no no no no no") == Approx(0.5));
  // Case and punctuation do not make words distinct (rouge_score's tokens).
  CHECK(*distinct_n("Dog, dog! DOG", 1) == Approx(1.0 / 3));
  // Too short for the n-gram: undefined, not 0 or 1.
  CHECK(*distinct_n("Hi there", 2) == Approx(1.0));
  CHECK_FALSE(distinct_n("Hi there", 3).has_value());
  CHECK_FALSE(repetition("a b c").has_value());
  CHECK_FALSE(distinct_n("", 1).has_value());
}

TEST_CASE("diversity metrics average over the generations where they are defined", "[metrics][diversity]") {
  auto metrics = diversity_metrics({"no no no no no", "Hi there", ""});
  REQUIRE(metrics.size() == 4);
  CHECK(metrics[0].name == "distinct1");
  CHECK(metrics[0].value == Approx(0.6));  // (0.2 + 1) / 2
  CHECK(metrics[0].n == 2);
  CHECK(metrics[1].name == "distinct2");
  CHECK(metrics[1].value == Approx(0.625));  // (0.25 + 1) / 2
  CHECK(metrics[2].name == "distinct3");
  CHECK(metrics[2].value == Approx(1.0 / 3));
  CHECK(metrics[2].n == 1);
  CHECK(metrics[3].name == "repetition");
  CHECK(metrics[3].value == Approx(0.5));
  CHECK(metrics[3].n == 1);
}

TEST_CASE("an XSum evaluation reports the diversity of its generations", "[metrics][diversity][cli]") {
  const std::string dir = test::temp_dir("diversity_xsum");
  auto r = test::run_kvevict("eval --task xsum --limit 2 --max-length 256 --policy h2o --budget 0.5 --predictions " + dir +
                             "/p.jsonl");
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  std::vector<std::string> generations;
  std::ifstream in(dir + "/p.jsonl");
  for (std::string line; std::getline(in, line);) generations.push_back(nlohmann::json::parse(line)["prediction"]);
  REQUIRE(generations.size() == 2);
  auto expected = diversity_metrics(generations);
  for (const auto& m : expected) {
    INFO(m.name);
    REQUIRE(j["metrics"].contains(m.name));
    CHECK(j["metrics"][m.name]["value"].get<double>() == Approx(m.value));
  }
}
