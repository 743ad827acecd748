// Policy parameters reach the sweep and the CLI through their one declaration: the
// sweep's "policy_options" keys, the per-cell seed, and the flags, with ranges checked.
#include <fstream>

#include "harness/common/errors.h"
#include "harness/sweep/sweep.h"
#include "policies/registry.h"
#include "tests/test_support.h"
#include "tests/catch.h"

using namespace kvevict;

namespace {

nlohmann::json sweep_with(const nlohmann::json& policy_options) {
  auto config = nlohmann::json::parse(R"({"tasks": ["copa"], "policies": ["pyramidkv", "random"],
                                          "budgets": [0.2], "seeds": [1, 2]})");
  config["policy_options"] = policy_options;
  return config;
}

}  // namespace

TEST_CASE("a sweep's policy_options are the declared parameters, checked", "[sweep][params]") {
  const auto plan = expand_sweep(sweep_with({{"window", 8}, {"kernel", 7}, {"pooling", "max"}, {"pyramid_beta", 5.5}}),
                                 "sweep.json", "");
  REQUIRE(plan.cells.size() == 4);
  for (const auto& cell : plan.cells) {
    const PolicyParams& params = cell.eval.policy_options.params;
    INFO(cell.eval.policy);
    CHECK(params.text(*find_policy_param("window")) == "8");
    CHECK(params.text(*find_policy_param("kernel")) == "7");
    CHECK(params.text(*find_policy_param("pooling")) == "max");
    CHECK(params.real(*find_policy_param("pyramid_beta")) == 5.5);  // settable now
    if (cell.eval.policy == "random")  // the seed comes from "seeds", per cell
      CHECK(params.seed(*find_policy_param("seed")) == static_cast<uint64_t>(cell.eval.task_options.seed));
  }
  const auto error_of = [](const nlohmann::json& options) {
    try {
      expand_sweep(sweep_with(options), "sweep.json", "");
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(error_of({{"windw", 8}}), Catch::Contains("sweep.json") && Catch::Contains("unknown key \"windw\"") &&
                                            Catch::Contains("window"));
  CHECK_THAT(error_of({{"kernel", 4}}), Catch::Contains("policy_options.kernel") && Catch::Contains("odd"));
  CHECK_THAT(error_of({{"n_sink", -2}}), Catch::Contains("policy_options.n_sink"));
  CHECK_THAT(error_of({{"group_reduce", "sum"}}), Catch::Contains("one of mean, max"));
  CHECK_THAT(error_of({{"seed", 3}}), Catch::Contains("\"seed\" is set per cell from \"seeds\""));
  CHECK_THAT(error_of({{"window", true}}), Catch::Contains("policy_options.window"));
  CHECK(error_of({{"stride", -1}, {"summary", 2}, {"n_sink", 0}}).empty());
  // A text parameter (a file path) is a string, without control characters, ';' or '='.
  CHECK_THAT(error_of({{"pattern_file", 3}}), Catch::Contains("policy_options.pattern_file") && Catch::Contains("string"));
  CHECK_THAT(error_of({{"pattern_file", "a;b.tsv"}}), Catch::Contains("policy_options.pattern_file") && Catch::Contains("';'"));
  CHECK_THAT(error_of({{"pattern_file", "a\nb.tsv"}}), Catch::Contains("control characters"));
}

TEST_CASE("duo-attention from the CLI: a pattern file for the model, heads holding different counts", "[cli][params]") {
  // stories260K: 5 layers x 4 KV heads; half of them (the lowest scores) stream.
  const std::string heads = test::temp_dir("duo_cli") + "/heads.tsv";
  {
    std::string text;
    for (int l = 0; l < 5; ++l)
      for (int h = 0; h < 4; ++h) text += std::to_string((l * 4 + h * 7) % 20 / 20.0) + (h < 3 ? "\t" : "\n");
    std::ofstream(heads) << text;
  }
  const std::string text = " --text-file " + test::data("text/tinystories_sample.txt") + " --max-tokens 80 --format json";
  auto run = test::run_kvevict("perplexity" + text + " --policy duo-attention --budget 0.2 --n-sink 2 --pattern-file " + heads);
  REQUIRE(run.exit_code == 0);
  const auto per_head = nlohmann::json::parse(run.out)["kv_tokens_kept_per_head"];
  REQUIRE(per_head.size() == 5);
  int streaming = 0, full = 0;
  for (const auto& layer : per_head)
    for (const auto& kept : layer) (kept.get<int>() < 80 ? streaming : full)++;
  CHECK(streaming == 10);
  CHECK(full == 10);
}

TEST_CASE("every declared parameter is a CLI flag, range-checked", "[cli][params]") {
  const std::string text = " --text-file " + test::data("text/tinystories_sample.txt") + " --max-tokens 80 --format json";
  auto even = test::run_kvevict("perplexity" + text + " --policy snapkv --budget 0.2 --kernel 4");
  CHECK(even.exit_code != 0);
  CHECK_THAT(even.err, Catch::Contains("--kernel") && Catch::Contains("odd"));
  auto steep = test::run_kvevict("perplexity" + text + " --policy pyramidkv --budget 0.2");
  auto flat = test::run_kvevict("perplexity" + text + " --policy pyramidkv --budget 0.2 --pyramid-beta 1");
  REQUIRE(steep.exit_code == 0);
  REQUIRE(flat.exit_code == 0);
  const auto steep_kept = nlohmann::json::parse(steep.out)["kv_tokens_kept"].get<std::vector<int>>();
  const auto flat_kept = nlohmann::json::parse(flat.out)["kv_tokens_kept"].get<std::vector<int>>();
  CHECK(steep_kept.front() > steep_kept.back());  // beta 20: a pyramid
  CHECK(flat_kept.front() == flat_kept.back());   // beta 1: every layer the same
  auto help = test::run_kvevict("eval --help");
  for (const ParamSpec* spec : all_policy_params()) CHECK_THAT(help.out, Catch::Contains(spec->cli_flag()));
}
