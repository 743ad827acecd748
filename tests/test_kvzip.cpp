// KVzip (policies/kvzip.cpp) and its pre-pass (harness/runtime/prepass.h): model-free, the
// kept set of every head against the table's top in double on a random table, with the
// sinks and the tokens after the context, and the budget at every step, layer and head;
// on stories260K, the pre-pass's table against a brute-force maximum over the full
// attention matrices of [context, repeat prompt, context], sim mode == decode mode, and
// the one-line refusals, eval's cost fields and analyze's note.
#include <algorithm>
#include <fstream>
#include <cmath>
#include <limits>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/analysis/analyze.h"
#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "harness/runtime/attention.h"
#include "harness/runtime/prepass.h"
#include "harness/runtime/scorer.h"
#include "notebooks-export/results_csv.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/policy_drive.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

// A made-up pre-pass table: attention-like values in [0, 1) per (layer, KV head, position).
std::shared_ptr<const ObservedScores> kvzip_random_table(int layers, int n_kv, int context, int seed) {
  auto table = std::make_shared<ObservedScores>();
  table->n_layers = layers;
  table->n_kv_heads = n_kv;
  table->positions = context;
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < n_kv; ++h)
      for (int j = 0; j < context; ++j)
        table->values.push_back(static_cast<float>(test::splitmix_bits(seed, l, h, j) >> 40) /
                                static_cast<float>(1ULL << 24));
  return table;
}

PolicyOptions kvzip_options(int budget_tokens, int sinks) {
  PolicyOptions o;
  o.budget.tokens = budget_tokens;
  o.params.set("n_sink", sinks);
  return o;
}

// What KVzip keeps of one head after the query at `step` (>= the context's last): the
// sinks, every token after the context, and the context's other positions with the
// highest table entries (double) filling the rest of the budget; ascending. `sign` -1
// ranks the context by the negated score instead (the check that the case tells them apart).
std::vector<int> kvzip_expected(const ObservedScores& table, int layer, int kv, int step, int budget, int sinks,
                                double sign = 1) {
  const int C = table.positions;
  std::vector<int> kept, candidates;
  for (int p = 0; p < std::min(sinks, C); ++p) kept.push_back(p);
  for (int p = C; p <= step; ++p) kept.push_back(p);
  for (int p = sinks; p < C; ++p) candidates.push_back(p);
  const int room = std::max(0, budget - static_cast<int>(kept.size()));
  std::stable_sort(candidates.begin(), candidates.end(), [&](int a, int b) {
    return sign * static_cast<double>(table.at(layer, kv, a)) > sign * static_cast<double>(table.at(layer, kv, b));
  });
  candidates.resize(std::min<size_t>(candidates.size(), room));
  kept.insert(kept.end(), candidates.begin(), candidates.end());
  std::sort(kept.begin(), kept.end());
  return kept;
}

test::LayerTrace kvzip_drive(const Policy& policy, const SequenceShape& shape, int layer) {
  LayerStates states = policy.as_realisable()->make_layer_states(layer, shape);
  return test::drive_layer_states(
      states, shape,
      [](int, int, const std::vector<int>& positions, const std::vector<char>*, float* out) {
        std::fill(out, out + positions.size(), 1.0f / static_cast<float>(positions.size()));
      },
      [](int, int) { return 1.0f; });
}

}  // namespace

TEST_CASE("kvzip keeps each head's sinks, the tokens after the context and the context's top by the pre-pass",
          "[policies][kvzip]") {
  const int layers = 2, n_kv = 3, context = 24, length = 30, budget = 10, sinks = 2;
  SequenceShape shape = test::sequence_shape(length, context, 2 * n_kv, n_kv, layers, 4);
  shape.observed = kvzip_random_table(layers, n_kv, context, 5);
  for (const std::string name : {"kvzip", "ada+kvzip"}) {
    auto policy = make_policy(name, kvzip_options(budget, sinks));
    REQUIRE(policy->prepass() == Prepass::ContextReconstruction);
    for (int layer = 0; layer < layers; ++layer) {
      const auto trace = kvzip_drive(*policy, shape, layer);
      for (int step = context - 1; step < length; ++step) {
        int total = 0;
        for (int kv = 0; kv < n_kv; ++kv) {
          const auto& kept = trace.positions[step][kv];
          total += static_cast<int>(kept.size());
          if (name != "kvzip") continue;  // ada+ moves budget between heads: checked by its total
          INFO("layer " << layer << " KV head " << kv << " step " << step);
          CHECK(kept == kvzip_expected(*shape.observed, layer, kv, step, budget, sinks));
          // The case tells the score from its negation.
          CHECK(kvzip_expected(*shape.observed, layer, kv, step, budget, sinks) !=
                kvzip_expected(*shape.observed, layer, kv, step, budget, sinks, -1));
        }
        INFO(name << " layer " << layer << " step " << step);
        CHECK(total == n_kv * budget);
      }
    }
  }
}

TEST_CASE("kvzip holds the budget at every step, layer and head", "[policies][kvzip]") {
  const int layers = 3, n_kv = 2, context = 40, length = 60, sinks = 4;
  SequenceShape shape = test::sequence_shape(length, context, 4, n_kv, layers, 4);
  shape.observed = kvzip_random_table(layers, n_kv, context, 9);
  PolicyOptions o;
  o.budget.ratio = 0.25;
  o.params.set("n_sink", sinks);
  for (const std::string name : {"kvzip", "ada+kvzip", "chunk+kvzip"}) {
    if (name == "chunk+kvzip") o.params.set("chunk_length", 3);
    auto policy = make_policy(name, o);
    for (int layer = 0; layer < layers; ++layer) {
      const Budget budget = policy->layer_budget(layer, shape);
      REQUIRE(budget.capacity == 15);
      const auto trace = kvzip_drive(*policy, shape, layer);
      for (int i = context - 1; i < length; ++i) {
        int total = 0;
        for (int h = 0; h < n_kv; ++h) {
          const auto& kept = trace.positions[i][h];
          INFO(name << " layer " << layer << " step " << i << " head " << h);
          total += static_cast<int>(kept.size());
          if (name == "kvzip") REQUIRE(static_cast<int>(kept.size()) == budget.capacity);
          REQUIRE(std::is_sorted(kept.begin(), kept.end()));
          for (int p = 0; p < sinks; ++p) REQUIRE(std::binary_search(kept.begin(), kept.end(), p));
        }
        INFO(name << " layer " << layer << " step " << i);
        REQUIRE(total == n_kv * budget.capacity);
      }
    }
  }
}

TEST_CASE("kvzip refuses a sequence without its pre-pass, in one line naming it", "[policies][kvzip]") {
  auto policy = make_policy("kvzip", kvzip_options(4, 2));
  const SequenceShape shape = test::sequence_shape(10, 5, 2, 1, 1, 4);
  const std::string error = test::error_of([&] { policy->validate(shape); });
  CHECK_THAT(error, Catch::Contains("kvzip") && Catch::Contains("pre-pass"));
  CHECK(error.find('\n') == std::string::npos);
  CHECK_THAT(test::error_of([&] { policy->as_realisable()->make_layer_states(0, shape); }),
             Catch::Contains("pre-pass"));
  CHECK(make_policy("h2o", kvzip_options(4, 2))->prepass() == Prepass::None);
}

TEST_CASE("kvzip's pre-pass table is the most attention a reconstruction row pays each context key",
          "[policies][kvzip]") {
  const Model& model = test::stories();
  const auto all = test::golden_tokens();
  const std::vector<int> context(all.begin(), all.begin() + 20);
  const std::vector<int> prompt = kvzip_repeat_prompt(model.require_tokenizer());
  REQUIRE(!prompt.empty());
  const auto table = reconstruction_scores(model, context, prompt);
  const int C = 20, L = static_cast<int>(model.arch().n_layers), n_kv = static_cast<int>(model.arch().n_kv_heads);
  const int n_q = static_cast<int>(model.arch().n_heads), group = n_q / n_kv;
  const int T = 2 * C + static_cast<int>(prompt.size());
  REQUIRE(table->positions == C);
  REQUIRE(table->tokens == T);
  // The whole attention matrix of every layer, one query row at a time.
  std::vector<std::vector<double>> probs(L, std::vector<double>(static_cast<size_t>(n_q) * T * T, 0.0));
  FullAttention attention(
      [&](int layer, int64_t first, int64_t rows, int64_t n, const torch::Tensor&, const torch::Tensor&,
          const torch::Tensor&, const torch::Tensor& p) {
        const torch::Tensor host = p.to(torch::kCPU, torch::kFloat64).contiguous();
        const double* data = host.data_ptr<double>();
        for (int h = 0; h < n_q; ++h)
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < n; ++j)
              probs[layer][(static_cast<size_t>(h) * T + first + r) * T + j] = data[(h * rows + r) * n + j];
      },
      1);
  std::vector<int> pass = context;
  pass.insert(pass.end(), prompt.begin(), prompt.end());
  pass.insert(pass.end(), context.begin(), context.end());
  model.forward(pass, 0, attention);
  int differing_from_last_row = 0;
  for (int l = 0; l < L; ++l)
    for (int kv = 0; kv < n_kv; ++kv)
      for (int j = 0; j < C; ++j) {
        double most = 0, last = 0;
        for (int g = 0; g < group; ++g)
          for (int i = C; i < T; ++i) most = std::max(most, probs[l][(static_cast<size_t>(kv * group + g) * T + i) * T + j]);
        for (int g = 0; g < group; ++g)
          last = std::max(last, probs[l][(static_cast<size_t>(kv * group + g) * T + T - 1) * T + j]);
        INFO("layer " << l << " KV head " << kv << " key " << j);
        // float32 attention; the brute force's blocks of one row round the logits' products
        // differently (up to 1.1e-6 seen), far below the attention's spread.
        CHECK(std::abs(static_cast<double>(table->at(l, kv, j)) - most) < 1e-5);
        if (most != last) ++differing_from_last_row;
      }
  // The maximum runs over many rows: the last row alone would not give it.
  CHECK(differing_from_last_row > 0);
}

TEST_CASE("kvzip: sim mode and decode mode agree on stories260K, and the pre-pass's cost is reported",
          "[policies][kvzip][sim-decode]") {
  const auto tokens = test::golden_tokens();
  const int prefill = static_cast<int>(tokens.size()) / 2;
  const auto full = score_sequence(test::stories(), *make_policy("full", {}), Mode::Sim, tokens, prefill);
  const std::vector<std::pair<std::string, double>> tolerances = {{"float64", 1e-9}, {"float32", 5e-5}};
  for (const auto& [dtype, tolerance] : tolerances) {
    ModelOptions options = test::model_options();
    options.dtype = dtype;
    auto model = Model::load(test::data("models/stories260K-hf"), options);
    const int prompt = static_cast<int>(kvzip_repeat_prompt(model->require_tokenizer()).size());
    for (const std::string name : {"kvzip", "ada+kvzip"})
      for (double budget : {0.1, 0.2, 0.5}) {
        PolicyOptions o;
        o.budget.ratio = budget;
        auto policy = make_policy(name, o);
        const auto sim = score_sequence(*model, *policy, Mode::Sim, tokens, prefill);
        const auto decode = score_sequence(*model, *policy, Mode::Decode, tokens, prefill);
        INFO(dtype << " policy " << name << " budget " << budget);
        CHECK(test::max_diff(sim.next_token_logprob, decode.next_token_logprob) < tolerance);
        CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
        CHECK(sim.kv.prepass_tokens == 2 * prefill + prompt);
        CHECK(decode.kv.prepass_context == prefill);
        if (dtype == "float32") CHECK(test::max_diff(sim.next_token_logprob, full.next_token_logprob) > 1e-3);
      }
  }
}

TEST_CASE("kvzip refuses the stream protocol, a pre-pass past the model's context and a model without a tokenizer", "[policies][kvzip]") {
  const auto tokens = test::golden_tokens();
  auto policy = make_policy("kvzip", kvzip_options(8, 4));
  const std::string stream = test::error_of([&] { score_sequence(test::stories(), *policy, Mode::Sim, tokens, 0); });
  CHECK_THAT(stream, Catch::Contains("kvzip") && Catch::Contains("stream protocol"));
  CHECK(stream.find('\n') == std::string::npos);
  const int context = static_cast<int>(test::stories().arch().max_positions) / 2 + 1;
  std::vector<int> longer(context + 1, tokens[1]);
  CHECK_THAT(test::error_of([&] { score_sequence(test::stories(), *policy, Mode::Sim, longer, context); }),
             Catch::Contains("pre-pass") && Catch::Contains("past the model's context"));
  // A model without a tokenizer cannot write the repeat prompt: refused before any work.
  auto opt = Model::load(test::data("models/tiny-random-opt"), test::model_options());
  REQUIRE(opt->tokenizer() == nullptr);
  const std::string no_tokenizer = test::error_of([&] { check_policy_for_model(*policy, *opt); });
  CHECK_THAT(no_tokenizer, Catch::Contains("policy kvzip") && Catch::Contains("tokenizer"));
  CHECK(no_tokenizer.find('\n') == std::string::npos);
}

TEST_CASE("kvzip's pre-pass cost in eval's JSON and result rows; the stream protocol refused in one line",
          "[policies][kvzip][cli]") {
  const std::string base = "eval --task copa --limit 3 --model " + test::data("models/stories260K-hf") +
                           " --policy kvzip --budget 0.5 --protocol ";
  auto r = test::run_kvevict(base + "prefill-compress --format json");
  REQUIRE(r.exit_code == 0);
  const auto j = nlohmann::json::parse(r.out);
  // 2 C + R tokens per context of C: a little above 2 (COPA's contexts are short).
  CHECK(j["prepass_token_ratio"].get<double>() > 2.0);
  CHECK(j["prepass_token_ratio"].get<double>() < 4.0);
  CHECK(j["prepass_seconds"].get<double>() > 0.0);
  r = test::run_kvevict(base + "prefill-compress --format csv");
  REQUIRE(r.exit_code == 0);
  const std::string path = test::temp_dir("kvzip_rows") + "/rows.csv";
  std::ofstream(path) << r.out;
  const auto rows = read_results_csv(path);
  REQUIRE(!rows.empty());
  for (const ResultRow& row : rows) CHECK(row.prepass_token_ratio == j["prepass_token_ratio"].get<double>());
  r = test::run_kvevict(base + "stream --format json");
  CHECK(r.exit_code != 0);
  CHECK_THAT(r.err, Catch::Contains("kvzip") && Catch::Contains("stream protocol"));
  CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
}

TEST_CASE("results files from before prepass_token_ratio still read", "[policies][kvzip][results]") {
  ResultRow row;
  row.model = "m";
  row.task = "copa";
  row.policy = "kvzip";
  row.metric = "acc";
  row.value = 0.5;
  row.n = 10;
  const std::string path = test::write_older_results("pre-prepass-results", {"prepass_token_ratio"}, row);
  const auto rows = read_results_csv(path);
  REQUIRE(rows.size() == 1);
  CHECK(!rows[0].prepass_token_ratio);
}

TEST_CASE("analyze's recall leaves kvzip out with a note: its single pass runs no reconstruction",
          "[policies][kvzip][analyze]") {
  const auto all = test::golden_tokens();
  const std::vector<int> tokens(all.begin(), all.begin() + 40);
  AnalyzeOptions options;
  options.recall_policies = {"kvzip", "h2o"};
  options.recall_budgets = {0.5};
  const AttentionAnalysis analysis = analyze_attention(test::stories(), {tokens}, options);
  bool noted = false;
  for (const std::string& note : analysis.notes) noted = noted || note.rfind("kvzip: scores the context by a pre-pass", 0) == 0;
  CHECK(noted);
  for (const auto& layer : analysis.layers) {
    CHECK(layer.recall.count("kvzip") == 0);
    CHECK(layer.recall.count("h2o") == 1);
  }
}
