// The H2O repository's request pipeline (--pipeline h2o) against its golden, the paper's
// budget arithmetic, h2o-global's column sums, and the pipeline as part of a results row.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>

#include "harness/common/errors.h"
#include "harness/eval/evaluator.h"
#include "harness/eval/h2o_adaptor.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "harness/sweep/sweep.h"
#include "notebooks-export/results_csv.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;
namespace fs = std::filesystem;

namespace {

EvalConfig h2o_piqa_config(const std::string& policy, const PolicyOptions& options) {
  EvalConfig config;
  config.task = "piqa";
  config.task_options.data_dir = test::data("");
  config.task_options.pipeline = Pipeline::H2O;
  config.task_options.lm_eval_shuffle = false;  // --file-order
  config.task_options.limit = 404;  // the golden has the 100 ASCII documents among lines 300..403
  config.policy = policy;
  config.policy_options = options;
  config.score = ScoreMode::Mean;
  config.compare_with_full = false;
  return config;
}

// Worst |score - golden| over the golden's documents and choices, for one golden key.
double worst_golden_diff(const EvalResult& result, const std::string& key, int* compared) {
  const auto golden = test::read_json(test::data("golden/h2o_pipeline_piqa300.json"));
  std::map<std::string, std::vector<double>> scores;
  for (const auto& doc : result.docs) scores[doc.id] = doc.choice_scores;
  std::vector<double> got, want;  // every golden document's choices, in the golden's order
  const auto& docs = golden["tasks"]["piqa"]["docs"];
  for (auto it = docs.begin(); it != docs.end(); ++it) {
    const std::string id = it.key();
    INFO("document " << id);
    REQUIRE(scores.count(id));
    const auto expected = it.value()[key].get<std::vector<double>>();
    REQUIRE(scores[id].size() == expected.size());
    got.insert(got.end(), scores[id].begin(), scores[id].end());
    want.insert(want.end(), expected.begin(), expected.end());
  }
  *compared = static_cast<int>(want.size());
  return test::max_diff(got, want);
}

Budget budget_of(const std::string& policy, const BudgetSpec& spec, int length) {
  PolicyOptions options;
  options.budget = spec;
  SequenceShape shape;
  shape.length = length;
  return make_policy(policy, options)->layer_budget(0, shape);
}

}  // namespace

TEST_CASE("pipeline h2o reproduces golden/h2o_pipeline_piqa300.json", "[h2o_pipeline][golden]") {
  int compared = 0;
  SECTION("full cache, through the library") {
    const EvalResult full = evaluate(test::stories(), h2o_piqa_config("full", {}));
    const double worst = worst_golden_diff(full, "full", &compared);
    INFO("max |diff| " << worst << " over " << compared << " scores");
    CHECK(compared == 200);
    CHECK(worst < 1e-4);
  }
  SECTION("h2o-paper 0.1/0.1, through the CLI's --predictions") {
    const std::string dir = test::temp_dir("h2o_pipeline_cli");
    const std::string predictions = dir + "/piqa.jsonl";
    auto run = test::run_kvevict("eval --task piqa --pipeline h2o --file-order --limit 404 --policy h2o-paper "
                                 "--heavy-ratio 0.1 --recent-ratio 0.1 --predictions " + predictions);
    INFO(run.err);
    REQUIRE(run.exit_code == 0);
    const auto summary = nlohmann::json::parse(run.out);
    CHECK(summary["pipeline"] == "h2o");
    CHECK(summary["score"] == "mean");  // the adaptor's log-likelihood is a mean
    EvalResult result;
    std::ifstream in(predictions);
    for (std::string line; std::getline(in, line);) {
      auto j = nlohmann::json::parse(line);
      DocOutcome doc;
      doc.id = j["id"].get<std::string>();
      doc.choice_scores = j["scores"].get<std::vector<double>>();
      result.docs.push_back(doc);
    }
    const double worst = worst_golden_diff(result, "h2o-paper_0.1_0.1", &compared);
    INFO("max |diff| " << worst << " over " << compared << " scores");
    CHECK(compared == 200);
    CHECK(worst < 1e-4);
  }
  SECTION("h2o-paper asked as --budget 0.2 --heavy-share 0.5 gives the same scores") {
    PolicyOptions options;
    options.budget.ratio = 0.2;
    options.budget.heavy_share = 0.5;
    const double worst = worst_golden_diff(evaluate(test::stories(), h2o_piqa_config("h2o-paper", options)),
                                           "h2o-paper_0.1_0.1", &compared);
    INFO("max |diff| " << worst);
    CHECK(worst < 1e-4);
  }
}

TEST_CASE("the H2O adaptor scores the ftfy-fixed text and joint tokens", "[h2o_pipeline]") {
  auto policy = make_policy("full", {});
  // Curly quotes are uncurled before tokenising: the same scores as the straight text.
  auto curly = score_h2o_request(test::stories(), *policy, Mode::Sim, {"\xE2\x80\x9CTom\xE2\x80\x99s dog", " ran home."});
  auto plain = score_h2o_request(test::stories(), *policy, Mode::Sim, {"\"Tom's dog", " ran home."});
  CHECK(curly.result.sum_logprob == plain.result.sum_logprob);
  CHECK(curly.result.num_tokens == plain.result.num_tokens);
  // SentencePiece's separate continuation has one extra "▁" piece: the eval mask spans
  // one position more than the joint continuation, and the scoring stops at the end of
  // the joint sequence, so it covers the joint continuation exactly.
  const auto& tokenizer = test::stories().require_tokenizer();
  const int joint_cont = static_cast<int>(tokenizer.encode("\"Tom's dog ran home.").size() -
                                          tokenizer.encode("\"Tom's dog").size());
  const int separate_cont = static_cast<int>(tokenizer.encode(" ran home.").size());
  CHECK(separate_cont == joint_cont + 1);
  CHECK(plain.result.num_tokens == joint_cont);
  CHECK(plain.joint_length == static_cast<int>(tokenizer.encode("\"Tom's dog ran home.").size()));
}

TEST_CASE("pipeline h2o refuses what the adaptor does not do", "[h2o_pipeline][errors]") {
  EvalConfig config = h2o_piqa_config("full", {});
  config.task_options.limit = 1;
  config.bos = true;
  CHECK_THROWS_WITH(evaluate(test::stories(), config), Catch::Contains("--pipeline h2o runs without BOS"));
  config.bos.reset();
  config.protocol = Protocol::PrefillCompress;
  CHECK_THROWS_WITH(evaluate(test::stories(), config), Catch::Contains("stream protocol"));
  CHECK_THROWS_WITH(parse_pipeline("helm"), Catch::Contains("unknown pipeline \"helm\""));
}

TEST_CASE("XSum under --pipeline h2o uses H2O's prompt file as it is", "[h2o_pipeline][xsum]") {
  TaskOptions options;
  options.data_dir = test::data("");
  options.pipeline = Pipeline::H2O;
  options.limit = 2;
  const auto docs = make_task("xsum")->generation_docs(options);
  REQUIRE(docs.size() == 2);
  std::ifstream in(test::data("xsum/xsum_0shot.jsonl"));
  std::string line;
  std::getline(in, line);
  const auto first = nlohmann::json::parse(line);
  CHECK(docs[0].prompt == first["article"].get<std::string>());
  CHECK(docs[0].reference == first["summary_gt"].get<std::string>());
  CHECK(docs[0].stop == std::vector<std::string>{"###"});
  CHECK(docs[0].temperature == 0.3);
  CHECK(docs[0].max_new_tokens == 64);
  options.shots = 1;
  CHECK_THROWS_WITH(make_task("xsum")->generation_docs(options), Catch::Contains("--pipeline lm-eval"));
}

TEST_CASE("h2o-paper and h2o-global budgets are int(h*L) and int(r*L) however asked", "[policy][budget]") {
  for (const std::string policy : {"h2o-paper", "h2o-global"}) {
    INFO(policy);
    BudgetSpec paper;
    paper.heavy_ratio = 0.1;
    paper.recent_ratio = 0.1;
    BudgetSpec shared;
    shared.ratio = 0.2;
    shared.heavy_share = 0.5;
    // L = 95: the paper's int(0.1*95) = 9 each; splitting int(0.2*95) = 19 would give 9 + 10.
    for (const BudgetSpec& spec : {paper, shared}) {
      const Budget b = budget_of(policy, spec, 95);
      CHECK(b.capacity - b.recent == 9);
      CHECK(b.recent == 9);
    }
    for (int L : {1, 5, 9, 10, 11, 19, 29, 37, 95, 99, 101, 143, 199, 513, 1023}) {
      INFO("L = " << L);
      const Budget a = budget_of(policy, paper, L), b = budget_of(policy, shared, L);
      CHECK(a.recent == static_cast<int>(0.1 * L));
      CHECK(a.capacity - a.recent == static_cast<int>(0.1 * L));
      CHECK(b.recent == a.recent);
      CHECK(b.capacity == a.capacity);
    }
    // 0.7*0.2 is 0.13999999999999999 in floating point; the paper's int(0.14*50) is 7.
    BudgetSpec skewed;
    skewed.ratio = 0.2;
    skewed.heavy_share = 0.3;
    const Budget s = budget_of(policy, skewed, 50);
    CHECK(s.recent == static_cast<int>(0.14 * 50));
    CHECK(s.recent == 7);
    CHECK(s.capacity - s.recent == static_cast<int>(0.06 * 50));
    // The local baseline keeps its own rule: recent = the whole int(0.2*L).
    const Budget local = budget_of("local", shared, 95);
    CHECK(local.recent == 19);
  }
}

TEST_CASE("eval sizes stream budgets on the joint request and h2o-global sums its last row", "[policy][budget]") {
  // One COPA request, scored by the evaluator, against score_sequence over all L joint
  // tokens (the paper's mask covers every row) and over the first L-1 only.
  EvalConfig config;
  config.task = "copa";
  config.task_options.data_dir = test::data("");
  config.task_options.limit = 3;
  config.policy = "h2o-global";
  config.policy_options.budget.heavy_ratio = 0.1;
  config.policy_options.budget.recent_ratio = 0.1;
  config.compare_with_full = false;
  const EvalResult result = evaluate(test::stories(), config);
  const auto docs = make_task("copa")->multiple_choice_docs(config.task_options);
  auto policy = make_policy("h2o-global", config.policy_options);
  const auto& tokenizer = test::stories().require_tokenizer();
  std::vector<double> scored, all_rows_sums, without_last_sums;  // one per document and choice
  for (size_t d = 0; d < docs.size(); ++d) {
    for (size_t c = 0; c < docs[d].requests.size(); ++c) {
      std::vector<int> whole = tokenizer.encode(docs[d].requests[c].context);
      const auto cont = tokenizer.encode(docs[d].requests[c].continuation);
      whole.insert(whole.end(), cont.begin(), cont.end());
      const int L = static_cast<int>(whole.size());
      auto all_rows = score_sequence(test::stories(), *policy, Mode::Sim, whole, 0, L);
      std::vector<int> input(whole.begin(), whole.end() - 1);
      auto without_last = score_sequence(test::stories(), *policy, Mode::Sim, input, 0, L, whole.back());
      double sum_all = 0, sum_without = 0;
      for (int j = L - static_cast<int>(cont.size()); j < L; ++j) {
        sum_all += all_rows.next_token_logprob[j - 1];
        sum_without += without_last.next_token_logprob[j - 1];
      }
      scored.push_back(result.docs[d].choice_scores[c]);
      all_rows_sums.push_back(sum_all);
      without_last_sums.push_back(sum_without);
    }
  }
  CHECK(test::max_diff(scored, all_rows_sums) < 1e-9);
  // The last row's attention changes the heavy set: leaving it out scores differently.
  CHECK(test::max_diff(scored, without_last_sums) > 1e-6);
}

TEST_CASE("the pipeline is a results column and part of a sweep cell's identity", "[h2o_pipeline][sweep]") {
  const std::string dir = test::temp_dir("pipeline_column");
  const nlohmann::json config = nlohmann::json::parse(R"({
    "tasks": ["copa"], "policies": ["full", "h2o-paper"], "budgets": [0.2], "heavy_shares": [0.5],
    "pipelines": ["lm-eval", "h2o"], "limit": 4})");
  const SweepPlan plan = expand_sweep(config, "cfg.json", test::data(""));
  REQUIRE(plan.cells.size() == 4);
  std::set<std::string> keys;
  for (const auto& cell : plan.cells) keys.insert(cell.key());
  CHECK(keys.size() == 4);
  for (const auto& cell : plan.cells)
    CHECK(cell.eval.score == (cell.eval.task_options.pipeline == Pipeline::H2O ? ScoreMode::Mean : ScoreMode::Sum));
  CHECK_THROWS_WITH(expand_sweep(nlohmann::json::parse(R"({"tasks": ["copa"], "pipelines": ["x"]})"), "cfg.json", ""),
                    Catch::Contains("cfg.json") && Catch::Contains("unknown pipeline \"x\""));

  // A results.csv written before the column existed reads as lm-eval, and an append
  // rewrites it with the current header.
  auto legacy_columns = result_columns();
  legacy_columns.erase(std::find(legacy_columns.begin(), legacy_columns.end(), "pipeline"));
  ResultRow old_row;
  old_row.model = "m";
  old_row.task = "copa";
  old_row.policy = "full";
  old_row.protocol = "stream";
  old_row.mode = "sim";
  old_row.score = "sum";
  old_row.metric = "acc";
  old_row.value = 0.5;
  old_row.n = 4;
  std::string header, line;
  auto fields = old_row.fields();
  for (const auto& c : legacy_columns) {
    header += (header.empty() ? "" : ",") + c;
    line += (c == legacy_columns.front() ? "" : ",") + csv_quote(fields[c]);
  }
  const std::string csv = dir + "/results.csv";
  std::ofstream(csv) << header << "\n" << line << "\n";
  auto rows = read_results_csv(csv);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].pipeline == "lm-eval");
  CHECK(rows[0].value == 0.5);
  ResultRow new_row = old_row;
  new_row.pipeline = "h2o";
  append_rows_durably(csv, {new_row});
  rows = read_results_csv(csv);
  REQUIRE(rows.size() == 2);
  CHECK(rows[0].pipeline == "lm-eval");
  CHECK(rows[1].pipeline == "h2o");
  CHECK(row_cell_key(rows[0]) != row_cell_key(rows[1]));
  CHECK(test::read_text(csv).rfind(result_header() + "\n", 0) == 0);
}
