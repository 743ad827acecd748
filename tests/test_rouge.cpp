// ROUGE scorer and NLTK Porter stemmer against the goldens in ../shared/data/golden
// (NLTK 3.8 PorterStemmer output and rouge_score F-measures), plus small hand cases.
#include "tests/catch.h"

#include <algorithm>
#include <cmath>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "tasks/porter_stemmer.h"
#include "tasks/rouge.h"
#include "tests/compare.h"
#include "tests/test_support.h"

using kvevict::porter_stem;
using kvevict::rouge_scores;
using kvevict::rouge_tokenize;

namespace {
using Tokens = std::vector<std::string>;
}

TEST_CASE("porter_stem matches NLTK on every XSum word", "[rouge][porter]") {
  const std::string path = kvevict::test::data("golden/porter_nltk_xsum_words.tsv");
  std::ifstream in(path);
  REQUIRE(in.good());

  size_t total = 0, matched = 0;
  std::vector<std::string> first_mismatches;
  std::string line;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    size_t tab = line.find('\t');
    REQUIRE(tab != std::string::npos);
    std::string word = line.substr(0, tab), expected = line.substr(tab + 1);
    std::string got = porter_stem(word);
    ++total;
    if (got == expected) {
      ++matched;
    } else if (first_mismatches.size() < 20) {
      first_mismatches.push_back(word + " -> " + got + " (NLTK: " + expected + ")");
    }
  }

  std::ostringstream report;
  report << matched << " / " << total << " words match NLTK";
  for (const auto& m : first_mismatches) report << "\n  " << m;
  INFO(report.str());
  CHECK(total == 22898);  // the README's count: a short read would pass too easily
  CHECK(matched == total);
}

TEST_CASE("porter_stem NLTK-mode specifics", "[rouge][porter]") {
  // Irregular forms bypass the steps; the lookup is on the word as given.
  CHECK(porter_stem("skies") == "sky");
  CHECK(porter_stem("dying") == "die");
  CHECK(porter_stem("news") == "news");
  CHECK(porter_stem("succeed") == "succeed");
  CHECK(porter_stem("Sky") == "ski");  // not in the table, so step 1c turns y into i
  // NLTK's -ies / -ied extensions.
  CHECK(porter_stem("dies") == "die");
  CHECK(porter_stem("flies") == "fli");
  CHECK(porter_stem("died") == "die");
  CHECK(porter_stem("spied") == "spi");
  // Step 1c: y -> i only after a consonant that is not the whole stem.
  CHECK(porter_stem("happy") == "happi");
  CHECK(porter_stem("enjoy") == "enjoy");
  // Step 1b tail, step 2 alli recursion and logi, step 4 first-match blocking.
  CHECK(porter_stem("hopping") == "hop");
  CHECK(porter_stem("falling") == "fall");
  CHECK(porter_stem("filing") == "file");
  CHECK(porter_stem("generously") == "gener");
  CHECK(porter_stem("geology") == "geolog");
  CHECK(porter_stem("replacement") == "replac");
  CHECK(porter_stem("controlling") == "control");
  // Words of 1-2 characters are only lowercased.
  CHECK(porter_stem("Is") == "is");
}

TEST_CASE("rouge_tokenize follows rouge_score's tokenizer", "[rouge]") {
  CHECK(rouge_tokenize("The 48-year-old, HE said!") == Tokens{"the", "48", "year", "old", "he", "said"});
  // Only tokens longer than 3 characters are stemmed.
  CHECK(rouge_tokenize("was does running") == Tokens{"was", "doe", "run"});
  CHECK(rouge_tokenize("was does running", false) == Tokens{"was", "does", "running"});
  // Non-ASCII characters are separators, except the two that Python lowercases to ASCII.
  CHECK(rouge_tokenize("caf\xC3\xA9 na\xC3\xAFve") == Tokens{"caf", "na", "ve"});
  CHECK(rouge_tokenize("5\xE2\x84\xAA") == Tokens{"5k"});                // KELVIN SIGN
  CHECK(rouge_tokenize("\xC4\xB0stanbul") == Tokens{"i", "stanbul"});  // I WITH DOT ABOVE
  CHECK(rouge_tokenize("  ...  ").empty());
}

TEST_CASE("rouge_scores hand cases", "[rouge]") {
  auto identical = rouge_scores("The cat sat on the mat.", "the cat sat on the mat");
  CHECK(identical.rouge1 == 1.0);
  CHECK(identical.rouge2 == 1.0);
  CHECK(identical.rougeL == 1.0);

  auto disjoint = rouge_scores("alpha beta gamma", "delta epsilon");
  CHECK(disjoint.rouge1 == 0.0);
  CHECK(disjoint.rouge2 == 0.0);
  CHECK(disjoint.rougeL == 0.0);

  auto empty_prediction = rouge_scores("some reference text", "");
  CHECK(empty_prediction.rouge1 == 0.0);
  CHECK(empty_prediction.rouge2 == 0.0);
  CHECK(empty_prediction.rougeL == 0.0);

  auto both_empty = rouge_scores("", "!!!");
  CHECK(both_empty.rouge1 == 0.0);
  CHECK(both_empty.rougeL == 0.0);

  // Clipped counts: "the" appears 3 times in the reference, twice in the prediction.
  // P = 2/2, R = 2/3, F = 0.8. Bigrams: "the the" 1 of 1 vs 1 of 2, F = 2/3.
  auto clipped = rouge_scores("the the the", "the the");
  CHECK(clipped.rouge1 == Approx(0.8).epsilon(1e-15));
  CHECK(clipped.rouge2 == Approx(2.0 / 3.0).epsilon(1e-15));
  CHECK(clipped.rougeL == Approx(0.8).epsilon(1e-15));

  // LCS is order-aware where unigrams are not: LCS("a b c d", "d c b a") = 1.
  auto reversed = rouge_scores("w x y z", "z y x w");
  CHECK(reversed.rouge1 == 1.0);
  CHECK(reversed.rouge2 == 0.0);
  CHECK(reversed.rougeL == Approx(0.25).epsilon(1e-15));
}

TEST_CASE("rouge_scores match rouge_score on 200 XSum LEAD-1 items", "[rouge]") {
  const auto items =
      kvevict::test::read_json(kvevict::test::data("golden/rouge_xsum_lead1_200.json"));
  REQUIRE(items.size() == 200);

  std::vector<double> got, want;  // rouge1, rouge2, rougeL of every item
  size_t failures = 0;
  std::ostringstream first_failures;
  first_failures.precision(17);
  for (const auto& item : items) {
    auto scores = rouge_scores(item.at("reference").get<std::string>(),
                               item.at("prediction").get<std::string>());
    const double item_got[3] = {scores.rouge1, scores.rouge2, scores.rougeL};
    const double item_want[3] = {item.at("rouge1").get<double>(), item.at("rouge2").get<double>(),
                                 item.at("rougeL").get<double>()};
    bool off = false;
    for (int k = 0; k < 3; ++k) off = off || !(std::abs(item_got[k] - item_want[k]) <= 1e-9);  // NaN is off
    got.insert(got.end(), item_got, item_got + 3);
    want.insert(want.end(), item_want, item_want + 3);
    if (off && failures++ < 5) {
      first_failures << "\n  idx " << item.at("idx") << ": got " << scores.rouge1 << " / "
                     << scores.rouge2 << " / " << scores.rougeL << ", expected "
                     << item.at("rouge1") << " / " << item.at("rouge2") << " / "
                     << item.at("rougeL");
    }
  }
  INFO(failures << " of 200 items off by more than 1e-9" << first_failures.str());
  CHECK(failures == 0);
  CHECK(kvevict::test::max_diff(got, want) <= 1e-9);
}
