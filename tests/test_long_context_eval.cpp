// The long-context tasks through the evaluator and the sweep: lengths, depths and the two
// question protocols, the uncompressed question in the policy state and the decode
// cache, RULER's scores in results rows and predictions, and the sweep's axes.

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <set>

#include "harness/common/errors.h"
#include "harness/config/sweep_grid.h"
#include "harness/eval/evaluator.h"
#include "harness/eval/result_rows.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "notebooks-export/svg_heatmap.h"
#include "notebooks-export/svg_plot.h"
#include "policies/registry.h"
#include "tasks/long_context.h"
#include "tests/policy_drive.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

EvalConfig long_context_config(const std::string& task, const std::string& policy, double budget,
                               QuestionMode question) {
  EvalConfig c;
  c.task = task;
  c.task_options.data_dir = test::data("");
  c.task_options.length = 500;
  c.task_options.limit = 2;
  c.task_options.seed = 1;
  c.policy = policy;
  if (!is_reference_policy(policy)) c.policy_options.budget.ratio = budget;
  c.mode = Mode::Decode;
  c.protocol = Protocol::PrefillCompress;
  c.question = question;
  c.compare_with_full = false;
  return c;
}

}  // namespace

TEST_CASE("a question fed uncompressed stays whole until decoding, then the budget holds it too",
          "[long-context][policies]") {
  // Context of 20 tokens compressed to 4 per head, a 6-token question, 5 decode steps.
  const int C = 20, Q = 6, steps = C + Q + 5, tokens = 4;
  for (const std::string name : {"h2o", "snapkv", "tova", "ada+h2o", "streamingllm"}) {
    PolicyOptions o;
    o.budget.tokens = tokens;
    auto policy = make_policy(name, o);
    SequenceShape shape;
    shape.length = steps;
    shape.prefill_len = C;
    shape.question_len = Q;
    shape.n_q_heads = 4;
    shape.n_kv_heads = 2;
    LayerStates states = policy->as_realisable()->make_layer_states(0, shape);
    auto attention = [](int q_head, int step, const std::vector<int>& positions, const std::vector<char>*, float* out) {
      float sum = 0;
      for (size_t s = 0; s < positions.size(); ++s) sum += out[s] = 1.0f + ((positions[s] * 7 + q_head + step) % 5);
      for (size_t s = 0; s < positions.size(); ++s) out[s] /= sum;
    };
    auto trace = test::drive_layer_states(states, shape, attention, [](int kv, int p) { return 1.0f + (p + kv) % 3; });
    INFO(name);
    int total = 0;
    for (const auto& head : trace.positions[C - 1]) total += static_cast<int>(head.size());
    CHECK(total == 2 * tokens);  // the context compressed to its budget
    for (int i = C; i < C + Q; ++i) {
      int held = 0;
      for (const auto& head : trace.positions[i]) {
        held += static_cast<int>(head.size());
        for (int p = C; p <= i; ++p) CHECK(std::find(head.begin(), head.end(), p) != head.end());
      }
      CHECK(held == 2 * (tokens + i - C + 1));  // nothing evicted while the question enters
    }
    for (int i = C + Q; i < steps; ++i) {
      int held = 0;
      for (const auto& head : trace.positions[i]) held += static_cast<int>(head.size());
      CHECK(held == 2 * (tokens + Q));  // decoding keeps the budget plus the question
    }
  }
}

TEST_CASE("ruler tasks run through eval in both question modes, scored by RULER's string match",
          "[long-context][eval]") {
  const Model& model = test::stories();
  auto aware_full = evaluate(model, long_context_config("ruler_niah_single_1", "full", 0, QuestionMode::Aware));
  auto agnostic_full = evaluate(model, long_context_config("ruler_niah_single_1", "full", 0, QuestionMode::Agnostic));
  REQUIRE(aware_full.metrics.size() == 2);
  CHECK(aware_full.metrics[0].name == "string_match_all");
  CHECK(aware_full.metrics[1].name == "string_match_part");
  CHECK(aware_full.haystack == "noise");
  REQUIRE(aware_full.docs.size() == 2);
  // The full cache compresses nothing: both modes generate the same text.
  for (size_t d = 0; d < aware_full.docs.size(); ++d)
    CHECK(aware_full.docs[d].generated == agnostic_full.docs[d].generated);
  // Under a budget the agnostic cache keeps the question on top of the context's budget.
  auto aware = evaluate(model, long_context_config("ruler_niah_single_1", "snapkv", 0.2, QuestionMode::Aware));
  auto agnostic = evaluate(model, long_context_config("ruler_niah_single_1", "snapkv", 0.2, QuestionMode::Agnostic));
  CHECK(agnostic.kv_tokens_kept > aware.kv_tokens_kept);
  CHECK(aware.kv_tokens_kept < aware_full.kv_tokens_kept);
  for (const auto* result : {&aware, &agnostic})
    for (const auto& m : result->metrics) {
      CHECK(m.value >= 0);
      CHECK(m.value <= 100);
      CHECK(m.n == 2);
    }
  // Each document's score is RULER's fraction of its references found in the answer.
  for (const auto& doc : aware.docs) {
    REQUIRE(doc.long_context);
    CHECK(doc.long_context->length == 500);
    CHECK(doc.long_context->prompt_tokens + doc.long_context->max_new_tokens <= 500);
    CHECK(doc.score == 100 * string_match_all_fraction(ruler_postprocess(doc.generated), doc.long_context->references));
  }
  // Results rows carry the length, the question protocol and the haystack.
  const auto rows = eval_rows("stories260K", long_context_config("ruler_niah_single_1", "snapkv", 0.2,
                                                                 QuestionMode::Agnostic), agnostic);
  REQUIRE(!rows.empty());
  CHECK(rows[0].length == 500);
  CHECK(rows[0].question == "agnostic");
  CHECK(rows[0].haystack == "noise");
  CHECK(!rows[0].depth);
  // Predictions carry what RULER's files carry.
  const std::string path = test::temp_dir("long-context-predictions") + "/p.jsonl";
  write_predictions(agnostic, long_context_config("ruler_niah_single_1", "snapkv", 0.2, QuestionMode::Agnostic), path);
  std::ifstream in(path);
  std::string line;
  REQUIRE(std::getline(in, line));
  const auto j = nlohmann::json::parse(line);
  for (const char* key : {"task", "length", "prompt_tokens", "prompt", "references", "prediction", "score", "haystack"})
    CHECK(j.contains(key));
  CHECK(j["references"].is_array());
}

TEST_CASE("niah takes a depth; the protocols and options are refused where they do not apply",
          "[long-context][eval][errors]") {
  const Model& model = test::stories();
  auto niah = long_context_config("niah", "full", 0, QuestionMode::Aware);
  niah.task_options.depth = 0.5;
  niah.task_options.limit = 1;
  auto result = evaluate(model, niah);
  REQUIRE(result.docs.size() == 1);
  CHECK(result.docs[0].long_context->depth == 0.5);
  CHECK(result.metrics[0].name == "rouge1_x10");

  auto stream = long_context_config("ruler_niah_single_1", "snapkv", 0.2, QuestionMode::Agnostic);
  stream.protocol = Protocol::Stream;
  CHECK_THROWS_WITH(evaluate(model, stream), Catch::Contains("needs --protocol prefill-compress"));
  auto copa = long_context_config("copa", "full", 0, QuestionMode::Agnostic);
  copa.task_options.length = 0;
  CHECK_THROWS_WITH(evaluate(model, copa), Catch::Contains("does not"));
  copa.question = QuestionMode::Aware;
  copa.task_options.length = 500;
  CHECK_THROWS_WITH(evaluate(model, copa), Catch::Contains("--length applies to the long-context tasks"));
  auto pattern = long_context_config("ruler_niah_single_1", "sparse-strided", 0.2, QuestionMode::Agnostic);
  CHECK_THROWS_WITH(evaluate(model, pattern), Catch::Contains("static patterns"));
  auto too_long = long_context_config("ruler_niah_single_1", "full", 0, QuestionMode::Aware);
  too_long.task_options.length = 2048;
  // Refused before any item is built (a length of 10^9 used to fit items until killed).
  CHECK_THROWS_WITH(evaluate(model, too_long),
                    Catch::Contains("--length 2048") && Catch::Contains("longer than the model's context of 512 tokens"));
}

TEST_CASE("a sweep varies lengths, niah depths and question modes", "[long-context][sweep]") {
  auto config = nlohmann::json::parse(R"({
    "tasks": ["ruler_niah_single_1", "niah", "copa"], "policies": ["snapkv"], "budgets": [0.2],
    "protocols": ["stream", "prefill-compress"], "lengths": [256, 500], "depths": [0, 0.5, 1],
    "questions": ["aware", "agnostic"]})");
  const auto plan = expand_sweep(config, "sweep.json", test::data(""));
  int ruler = 0, niah = 0, copa = 0;
  std::set<std::string> keys;
  for (const auto& cell : plan.cells) {
    keys.insert(cell.key());
    const auto& e = cell.eval;
    if (e.task == "copa") {
      ++copa;
      CHECK(e.task_options.length == 0);
      CHECK(!e.task_options.depth);
      continue;
    }
    CHECK((e.question == QuestionMode::Aware || e.protocol == Protocol::PrefillCompress));
    if (e.task == "niah") {
      ++niah;
      CHECK(e.task_options.depth);
    } else {
      ++ruler;
      CHECK(!e.task_options.depth);
    }
  }
  // copa: 2 protocols; ruler: 2 lengths x (stream aware + prefill aware + prefill agnostic); niah x 3 depths.
  CHECK(copa == 2);
  CHECK(ruler == 2 * 3);
  CHECK(niah == 2 * 3 * 3);
  CHECK(keys.size() == plan.cells.size());
  CHECK(!plan.skipped.empty());

  auto no_lengths = config;
  no_lengths.erase("lengths");
  CHECK_THROWS_WITH(expand_sweep(no_lengths, "sweep.json", ""), Catch::Contains("needs \"lengths\""));
  auto no_depths = config;
  no_depths.erase("depths");
  CHECK_THROWS_WITH(expand_sweep(no_depths, "sweep.json", ""), Catch::Contains("niah needs \"depths\""));
  auto bad_depth = config;
  bad_depth["depths"] = {1.5};
  CHECK_THROWS_WITH(expand_sweep(bad_depth, "sweep.json", ""), Catch::Contains("\"depths\""));
  auto bad_question = config;
  bad_question["questions"] = {"sometimes"};
  CHECK_THROWS_WITH(expand_sweep(bad_question, "sweep.json", ""), Catch::Contains("\"questions\""));
}

TEST_CASE("results files from before the long-context columns still read, and an append upgrades them",
          "[long-context][results]") {
  ResultRow row;
  row.model = "m";
  row.task = "copa";
  row.policy = "full";
  row.metric = "acc";
  row.value = 0.5;
  row.n = 10;
  const std::string path = test::write_older_results("older-results", {"length", "depth", "question", "haystack"}, row);
  auto rows = read_results_csv(path);
  REQUIRE(rows.size() == 1);
  CHECK(rows[0].task == "copa");
  CHECK(!rows[0].length);
  append_rows_durably(path, {row});
  std::ifstream in(path);
  std::string header;
  std::getline(in, header);
  CHECK(header == result_header());
  CHECK(read_results_csv(path).size() == 2);
  // A header with an unknown column, or without the essentials, is still refused.
  std::ofstream(path, std::ios::binary) << "model,task,policy,metric,value,colour\n";
  CHECK_THROWS_WITH(read_results_csv(path), Catch::Contains("expected the results header"));
  std::ofstream(path, std::ios::binary) << "model,task\n";
  CHECK_THROWS_WITH(read_results_csv(path), Catch::Contains("expected the results header"));
}

TEST_CASE("export draws the needle grid as a depth x length heatmap per policy", "[long-context][export]") {
  std::vector<ResultRow> rows;
  for (const std::string policy : {"full", "snapkv"})
    for (int length : {1024, 2048})
      for (double depth : {0.0, 0.5, 1.0}) {
        ResultRow row;
        row.model = "m";
        row.task = "niah";
        row.policy = policy;
        if (policy != "full") row.budget = 0.2;
        row.length = length;
        row.depth = depth;
        row.question = "agnostic";
        row.metric = "rouge1_x10";
        row.value = policy == "full" ? 10 : depth * 10 + length / 1024;
        row.n = 1;
        rows.push_back(row);
      }
  ResultRow no_grid = rows.front();  // a row without a depth is no cell of any grid
  no_grid.depth.reset();
  rows.push_back(no_grid);
  const auto maps = depth_length_heatmaps(rows);
  REQUIRE(maps.size() == 2);
  CHECK(maps[0].label == "full");
  INFO(maps[1].label);
  CHECK(maps[1].label.rfind("snapkv (budget=0.2", 0) == 0);
  CHECK(maps[1].lengths == std::vector<int>{1024, 2048});
  CHECK(maps[1].depths == std::vector<double>{0, 0.5, 1});
  CHECK(maps[1].cells.at({2048, 0.5}) == 7);
  const std::string svg = render_heatmap_svg(maps[1]);
  CHECK(svg.find("7.0</text>") != std::string::npos);
  CHECK(svg.find("needle depth") != std::string::npos);
  const auto paths = write_svg_plots(rows, test::temp_dir("heatmaps"));
  int heatmaps = 0;
  for (const auto& path : paths) {
    UNSCOPED_INFO(path);
    heatmaps += std::filesystem::path(path).filename().string().find("_heatmap") != std::string::npos;
  }
  CHECK(heatmaps == 2);
}
