// The sweep driver, eval and rouge commands, end to end through the CLI.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "harness/common/errors.h"
#include "harness/sweep/sweep.h"
#include "notebooks-export/results_csv.h"
#include "tests/test_support.h"
#include "tests/catch.h"

using namespace kvevict;
namespace fs = std::filesystem;

namespace {

const char* kSmallSweep = R"({
  "name": "test",
  "tasks": ["copa", "perplexity"],
  "policies": ["full", "local", "h2o", "h2o-paper"],
  "budgets": [0.2, 0.5],
  "heavy_shares": [0.5, 1.0],
  "limit": 6,
  "max_length": 128
})";

std::string write_config(const std::string& dir, const std::string& text) {
  auto path = (fs::path(dir) / "sweep.json").string();
  std::ofstream(path) << text;
  return path;
}

std::string csv_of(const std::string& dir) { return (fs::path(dir) / "results.csv").string(); }

// Rows without the run-specific seconds, for comparing two runs.
std::vector<std::string> comparable_rows(const std::string& dir) {
  std::vector<std::string> out = test::rows_without_timing(dir);
  std::sort(out.begin(), out.end());
  return out;
}

}  // namespace

TEST_CASE("grid expansion", "[sweep]") {
  auto plan = expand_sweep(nlohmann::json::parse(kSmallSweep), "sweep.json", test::data(""));
  // Per task: full once; local ignores the heavy share (2 budgets); h2o and h2o-paper
  // take 2 budgets x 2 shares each.
  REQUIRE(plan.cells.size() == 2 * (1 + 2 + 4 + 4));
  std::set<std::string> keys;
  for (const auto& c : plan.cells) keys.insert(c.key());
  CHECK(keys.size() == plan.cells.size());
  CHECK(plan.cells[0].eval.task == "copa");
  CHECK(plan.cells[0].eval.policy == "full");
  CHECK(plan.cells[3].eval.policy == "h2o");
  CHECK(plan.cells[3].eval.policy_options.budget.ratio == 0.2);
  CHECK(plan.cells[3].eval.policy_options.budget.heavy_share == 0.5);
  CHECK(plan.cells[0].eval.task_options.limit == 6);

  auto xsum = nlohmann::json::parse(kSmallSweep);
  xsum["tasks"] = {"xsum"};
  xsum["limit"] = {{"xsum", 2}, {"*", 50}};
  auto with_xsum = expand_sweep(xsum, "sweep.json", test::data(""));
  CHECK(with_xsum.cells.size() == 1 + 2 + 4);  // h2o-paper cannot generate
  CHECK(with_xsum.skipped.size() == 1);
  CHECK(with_xsum.cells[0].eval.task_options.limit == 2);

  auto bad = nlohmann::json::parse(kSmallSweep);
  bad["budgets"] = {0.2, 1.5};
  CHECK_THROWS_WITH(expand_sweep(bad, "sweep.json", ""), Catch::Contains("outside (0, 1]"));
  bad = nlohmann::json::parse(kSmallSweep);
  bad["policies"] = {"lru"};
  CHECK_THROWS_WITH(expand_sweep(bad, "sweep.json", ""), Catch::Contains("unknown policy"));
  bad = nlohmann::json::parse(kSmallSweep);
  bad["budget"] = 0.2;
  CHECK_THROWS_WITH(expand_sweep(bad, "sweep.json", ""), Catch::Contains("unknown key \"budget\""));
  CHECK(parse_shard("1/3") == std::make_pair(1, 3));
  CHECK_THROWS_WITH(parse_shard("3/3"), Catch::Contains("0 <= i < N"));
}

TEST_CASE("grid expansion reads integer keys as integers that fit, never converted", "[sweep][errors]") {
  // fuzz_sweep_config's finding: "max_length": 2.2e45 was a float-to-int conversion out of
  // range (undefined behaviour); 2.5 shots were 2, seed 2^32 + 42 was 42.
  const std::vector<std::pair<std::string, nlohmann::json>> bad = {
      {"max_length", 2.2e45}, {"max_length", 512.5}, {"max_length", 1}, {"shots", {2.5}},
      {"seeds", {-1}}, {"seeds", {2.5}}, {"seeds", {1e23}}, {"budget_tokens", {1e10}}, {"limit", 2.5}, {"limit", {{"copa", 1e45}}},
      {"temperature", -1}};
  for (const auto& [key, value] : bad) {
    auto config = nlohmann::json::parse(kSmallSweep);
    config[key] = value;
    INFO(key << ": " << value.dump());
    CHECK_THROWS_WITH(expand_sweep(config, "sweep.json", ""), Catch::Contains("sweep.json") && Catch::Contains(key));
  }
  auto fine = nlohmann::json::parse(kSmallSweep);
  fine["max_length"] = 512;
  fine["seeds"] = {1, 2};
  CHECK(expand_sweep(fine, "sweep.json", "").cells.front().eval.max_length == 512);
  // A seed is any unsigned 64-bit integer, read exactly (2^32 + 42 was 42 as an int).
  fine["seeds"] = {4294967338ULL, 18446744073709551615ULL};
  const SweepPlan seeded = expand_sweep(fine, "sweep.json", "");
  std::set<uint64_t> seeds;
  for (const SweepCell& cell : seeded.cells) {
    seeds.insert(cell.eval.task_options.seed);
    CHECK(cell.eval.sample_seed == cell.eval.task_options.seed);
    CHECK(identity_row(cell.model, cell.eval).seed == cell.eval.task_options.seed);
  }
  CHECK(seeds == std::set<uint64_t>{4294967338ULL, 18446744073709551615ULL});
}

TEST_CASE("a sweep resumes after a kill and redoes only the torn row", "[sweep]") {
  auto dir = test::temp_dir("sweep_resume");
  auto config = write_config(dir, kSmallSweep);
  auto out = (fs::path(dir) / "run").string();
  auto first = test::run_kvevict("sweep " + config + " --out " + out);
  REQUIRE(first.exit_code == 0);
  const auto complete = comparable_rows(out);
  const std::string full_text = test::read_text(csv_of(out));
  REQUIRE(complete.size() > 10);

  // Simulate kill -9 in the middle of a cell's write: cut the file inside its last row.
  // The last cell is perplexity (two rows: mean_nll, ppl), so it is left half written.
  auto size = fs::file_size(csv_of(out));
  fs::resize_file(csv_of(out), size - 25);
  const size_t last_row = full_text.rfind('\n', size - 2);
  const std::string kept_prefix = full_text.substr(0, full_text.rfind('\n', last_row - 1) + 1);
  auto second = test::run_kvevict("sweep " + config + " --out " + out);
  REQUIRE(second.exit_code == 0);
  CHECK_THAT(second.err, Catch::Contains("to run 1"));
  const std::string resumed = test::read_text(csv_of(out));
  CHECK(resumed.substr(0, kept_prefix.size()) == kept_prefix);  // finished rows untouched
  CHECK(comparable_rows(out) == complete);

  // A third run has nothing to do.
  auto third = test::run_kvevict("sweep " + config + " --out " + out);
  CHECK_THAT(third.err, Catch::Contains("to run 0"));
  CHECK(test::read_text(csv_of(out)) == resumed);
}

TEST_CASE("shards merged equal an unsharded run", "[sweep]") {
  auto dir = test::temp_dir("sweep_shards");
  auto config = write_config(dir, kSmallSweep);
  auto whole = (fs::path(dir) / "whole").string();
  REQUIRE(test::run_kvevict("sweep " + config + " --out " + whole).exit_code == 0);
  std::string shards;
  for (int i = 0; i < 3; ++i) {
    auto shard = (fs::path(dir) / ("shard" + std::to_string(i))).string();
    REQUIRE(test::run_kvevict("sweep " + config + " --out " + shard + " --shard " + std::to_string(i) + "/3").exit_code == 0);
    shards += " " + shard;
  }
  auto merged = (fs::path(dir) / "merged").string();
  auto r = test::run_kvevict("merge" + shards + " --out " + merged);
  REQUIRE(r.exit_code == 0);
  CHECK(comparable_rows(merged) == comparable_rows(whole));

  // Shards of another config are refused.
  auto other_config = nlohmann::json::parse(kSmallSweep);
  other_config["limit"] = 3;
  auto other_dir = (fs::path(dir) / "other").string();
  fs::create_directories(other_dir);
  auto other = write_config(other_dir, other_config.dump());
  auto other_out = (fs::path(dir) / "other_shard").string();
  REQUIRE(test::run_kvevict("sweep " + other + " --out " + other_out + " --shard 1/3").exit_code == 0);
  auto refused = test::run_kvevict("merge " + (fs::path(dir) / "shard0").string() + " " + other_out +
                                   " --out " + (fs::path(dir) / "bad_merge").string());
  CHECK(refused.exit_code != 0);
  CHECK_THAT(refused.err, Catch::Contains("differs") && Catch::Contains("refusing to merge"));
}

TEST_CASE("sweep output feeds tables, notebooks and SVG plots", "[sweep][export]") {
  auto dir = test::temp_dir("sweep_export");
  auto config = write_config(dir, kSmallSweep);
  auto out = (fs::path(dir) / "run").string();
  REQUIRE(test::run_kvevict("sweep " + config + " --out " + out).exit_code == 0);
  auto table = test::run_kvevict("table " + out + " --rows task --cols policy --metric acc --where budget=0.2 --where heavy_share=0.5");
  REQUIRE(table.exit_code == 0);
  CHECK_THAT(table.out, Catch::StartsWith("| task | full | local | h2o | h2o-paper |"));
  CHECK(fs::exists(fs::path(out) / "table.md"));
  auto nb = (fs::path(dir) / "plots.ipynb").string();
  auto svg = (fs::path(dir) / "svg").string();
  REQUIRE(test::run_kvevict("export " + out + " --notebook " + nb + " --svg " + svg).exit_code == 0);
  CHECK(test::read_json(nb)["nbformat"] == 4);
  CHECK(fs::exists(fs::path(svg) / "copa_acc_budget.svg"));
  CHECK(fs::exists(fs::path(svg) / "perplexity_mean_nll_heavy_share.svg"));
  auto executed = (fs::path(dir) / "executed.ipynb").string();
  int rc = std::system(("jupyter nbconvert --to notebook --execute --output " + executed + " " + nb +
                        " >/dev/null 2>&1").c_str());
  INFO("jupyter nbconvert must be installed (.ci/install-deps.sh installs it)");
  CHECK(rc == 0);
}

TEST_CASE("eval prints metrics and writes predictions; rouge scores a JSONL", "[eval][cli]") {
  auto dir = test::temp_dir("eval_cli");
  auto predictions = (fs::path(dir) / "p.jsonl").string();
  auto r = test::run_kvevict("eval --task piqa --limit 8 --policy h2o --budget 0.2 --predictions " + predictions);
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["n"] == 8);
  CHECK(j["metrics"].contains("acc"));
  CHECK(j["metrics"].contains("acc_norm"));
  CHECK(j.contains("agreement_with_full"));
  std::ifstream in(predictions);
  int lines = 0;
  for (std::string line; std::getline(in, line); ++lines) CHECK(nlohmann::json::parse(line).contains("scores"));
  CHECK(lines == 8);

  // Continuations longer than the window are scored on their last max_length tokens.
  auto short_window = (fs::path(dir) / "short.jsonl").string();
  auto windowed = test::run_kvevict("eval --task piqa --limit 4 --max-length 6 --policy h2o --budget 0.5 --predictions " +
                                    short_window);
  REQUIRE(windowed.exit_code == 0);
  CHECK(std::isfinite(nlohmann::json::parse(windowed.out)["mean_abs_ll_change"].get<double>()));
  std::ifstream short_in(short_window);
  for (std::string line; std::getline(short_in, line);)
    for (double score : nlohmann::json::parse(line)["scores"].get<std::vector<double>>())
      CHECK((std::isfinite(score) && score < 0 && score > -200));

  auto golden = test::read_json(test::data("golden/rouge_xsum_lead1_200.json"));
  auto jsonl = (fs::path(dir) / "lead1.jsonl").string();
  double r1 = 0, r2 = 0, rl = 0;
  {
    std::ofstream out(jsonl);
    for (const auto& item : golden) {
      out << nlohmann::json{{"reference", item["reference"]}, {"prediction", item["prediction"]}}.dump() << "\n";
      r1 += item["rouge1"].get<double>();
      r2 += item["rouge2"].get<double>();
      rl += item["rougeL"].get<double>();
    }
  }
  auto rouge = test::run_kvevict("rouge --jsonl " + jsonl);
  REQUIRE(rouge.exit_code == 0);
  auto scores = nlohmann::json::parse(rouge.out);
  CHECK(scores["rouge1"].get<double>() == Approx(100 * r1 / golden.size()).margin(1e-9));
  CHECK(scores["rouge2"].get<double>() == Approx(100 * r2 / golden.size()).margin(1e-9));
  CHECK(scores["rougeL"].get<double>() == Approx(100 * rl / golden.size()).margin(1e-9));

  std::ofstream(jsonl, std::ios::app) << "{not json\n";
  auto bad = test::run_kvevict("rouge --jsonl " + jsonl);
  CHECK(bad.exit_code != 0);
  CHECK_THAT(bad.err, Catch::Contains("lead1.jsonl:201"));
  auto unknown = test::run_kvevict("eval --task mmlu");
  CHECK(unknown.exit_code != 0);
  CHECK_THAT(unknown.err, Catch::Contains("mmlu"));
}
