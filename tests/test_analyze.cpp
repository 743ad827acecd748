// kvevict analyze: the golden attention statistics, block-wise computation, recall
// and persistence sanity, outputs and errors.

#include <filesystem>

#include "harness/analysis/analyze.h"
#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "tests/test_support.h"
#undef CHECK
#undef CHECK_EQ
#include <catch2/catch.hpp>

using namespace kvevict;

namespace {

}  // namespace

TEST_CASE("analyze reproduces the golden attention statistics", "[analyze][golden]") {
  auto golden = test::read_json(test::data("golden/attention_stats_stories260K_T200.json"));
  auto tokens = test::golden_tokens();
  REQUIRE(static_cast<int>(tokens.size()) == golden["tokens"].get<int>());
  AnalyzeOptions options;
  options.recall_policies = {};
  for (int block : {256, 7}) {  // one block, or many: the same numbers
    options.block_rows = block;
    AttentionAnalysis analysis = analyze_attention(test::stories(), {tokens}, options);
    REQUIRE(analysis.layers.size() == golden["layers"].size());
    for (size_t l = 0; l < analysis.layers.size(); ++l) {
      const auto& want = golden["layers"][l];
      const auto& got = analysis.layers[l];
      INFO("block " << block << " layer " << l);
      CHECK(std::abs(got.sparsity() - want["sparsity"].get<double>()) < 1e-3);
      CHECK(std::abs(got.slope() - want["powerlaw_slope"].get<double>()) < 1e-3);
      CHECK(std::abs(got.r2() - want["powerlaw_r2"].get<double>()) < 1e-3);
      CHECK(std::abs(got.top20() - want["top20_mass"].get<double>()) < 1e-3);
    }
  }
}

TEST_CASE("attention recall and heavy-hitter persistence behave as defined", "[analyze]") {
  auto tokens = test::golden_tokens();
  AnalyzeOptions options;
  options.recall_policies = {"full", "local", "h2o", "sparse-strided"};
  options.recall_budgets = {0.1, 0.5, 1.0};
  options.persistence_deltas = {1, 64};
  AttentionAnalysis analysis = analyze_attention(test::stories(), {tokens}, options);
  for (const auto& layer : analysis.layers) {
    // The full cache and a budget of the whole sequence hold all attention (float32 rows sum to 1 within 1e-8).
    CHECK(layer.recall.at("full").at(0.1).recall() == Approx(1.0).margin(1e-6));
    CHECK(layer.recall.at("local").at(1.0).recall() == Approx(1.0).margin(1e-6));
    CHECK(layer.recall.at("h2o").at(1.0).recall() == Approx(1.0).margin(1e-6));
    for (const std::string policy : {"local", "h2o"}) {
      const double small = layer.recall.at(policy).at(0.1).recall(), large = layer.recall.at(policy).at(0.5).recall();
      CHECK(small < large);
      CHECK(small > 0.3);
      // A 10% budget of 200 tokens attends at most 20 keys besides the query.
      CHECK(layer.recall.at(policy).at(0.1).attended() <= 20.0);
    }
    // Heavy hitters persist: the set one step later is nearly the same, 64 steps later less so.
    CHECK(layer.persistence_at(1) > 0.9);
    CHECK(layer.persistence_at(64) < layer.persistence_at(1));
    CHECK(layer.rank_profile.size() == tokens.size());
  }
}

TEST_CASE("kvevict analyze writes JSON, CSV and plots; bad input is named", "[analyze][cli]") {
  const std::string out = test::temp_dir("analyze_cli");
  auto r = test::run_kvevict("analyze --text-file " + test::data("text/tinystories_sample.txt") +
                             " --max-tokens 120 --recall-policies local,h2o+sparse-fixed --recall-budgets 0.2,0.4 --out " +
                             out);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["layers"].size() == 5);
  CHECK(j["layers"][0]["recall"]["h2o+sparse-fixed"].contains("0.4"));
  for (const std::string file : {"analysis.json", "analysis.csv", "plots/sparsity_per_layer.svg",
                                 "plots/powerlaw_rank.svg", "plots/recall_vs_budget.svg"})
    CHECK(std::filesystem::exists(std::filesystem::path(out) / file));
  const std::string csv = test::read_text(out + "/analysis.csv");
  CHECK_THAT(csv, Catch::StartsWith("layer,head,statistic,policy,budget,delta,value\n"));
  CHECK_THAT(csv, Catch::Contains("\n4,7,powerlaw_r2,,,,"));
  CHECK_THAT(test::read_text(out + "/plots/powerlaw_rank.svg"), Catch::Contains("stroke-dasharray"));

  auto task = test::run_kvevict("analyze --task copa --limit 2 --recall-policies none");
  REQUIRE(task.exit_code == 0);
  CHECK(nlohmann::json::parse(task.out)["sequences"] == 4);  // two choices per document

  auto none = test::run_kvevict("analyze");
  CHECK(none.exit_code != 0);
  CHECK_THAT(none.err, Catch::Contains("--text-file, --tokens-file or --task"));
  auto bad = test::run_kvevict("analyze --text-file " + test::data("text/tinystories_sample.txt") +
                               " --recall-policies lru");
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.err, Catch::Contains("unknown policy \"lru\""));
  auto budget = test::run_kvevict("analyze --text-file " + test::data("text/tinystories_sample.txt") +
                                  " --recall-budgets 0.2,1.5");
  CHECK(budget.exit_code != 0);
  CHECK_THAT(budget.err, Catch::Contains("--recall-budgets"));
}
