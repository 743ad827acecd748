// DuoAttention's calibration (duo-attention with calibration passkey; policies/
// duo_attention.cpp, harness/runtime/prepass.h): model-free, the streaming heads and kept
// sets from a random calibration table against a hand ranking (and not its negation), the
// budget of the streaming heads at every step; on stories260K, the passkey prompt's spans,
// the table against a brute-force mean over the full attention matrices, one table per
// model, sim mode == decode mode, and the one-line refusals.
#include <algorithm>
#include <cmath>
#include <memory>
#include <numeric>
#include <string>
#include <vector>

#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "harness/runtime/attention.h"
#include "harness/runtime/prepass.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/policy_drive.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

std::shared_ptr<const ObservedScores> calib_random_table(int layers, int n_kv, int seed, double sign = 1) {
  auto table = std::make_shared<ObservedScores>();
  table->kind = Prepass::PasskeyRetrieval;
  table->n_layers = layers;
  table->n_kv_heads = n_kv;
  table->positions = 1;
  for (int l = 0; l < layers; ++l)
    for (int h = 0; h < n_kv; ++h)
      table->values.push_back(static_cast<float>(sign * static_cast<double>(test::splitmix_bits(seed, l, h, 0) >> 40) /
                                                 static_cast<double>(1ULL << 24)));
  return table;
}

PolicyOptions calib_options(int budget_tokens, double ratio) {
  PolicyOptions o;
  o.budget.tokens = budget_tokens;
  o.params.set("n_sink", 2);
  o.params.set("calibration", "passkey");
  o.params.set("head_compression_ratio", ratio);
  return o;
}

// The round(ratio x L x H) lowest-scoring heads (hand ranking in double), 1 = streaming.
std::vector<std::vector<int>> calib_expected(const ObservedScores& table, double ratio) {
  const int n = table.n_layers * table.n_kv_heads;
  std::vector<int> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return table.values[a] < table.values[b]; });
  std::vector<std::vector<int>> streaming(table.n_layers, std::vector<int>(table.n_kv_heads, 0));
  for (int i = 0; i < static_cast<int>(std::nearbyint(ratio * n)); ++i)
    streaming[order[i] / table.n_kv_heads][order[i] % table.n_kv_heads] = 1;
  return streaming;
}

test::LayerTrace calib_drive(const Policy& policy, const SequenceShape& shape, int layer) {
  LayerStates states = policy.as_realisable()->make_layer_states(layer, shape);
  return test::drive_layer_states(
      states, shape,
      [](int, int, const std::vector<int>& positions, const std::vector<char>*, float* out) {
        std::fill(out, out + positions.size(), 1.0f / static_cast<float>(positions.size()));
      },
      [](int, int) { return 1.0f; });
}

}  // namespace

TEST_CASE("duo-attention calibration passkey streams the heads its table scores lowest", "[policies][duo]") {
  const int layers = 3, n_kv = 4, length = 30, budget = 8;
  SequenceShape shape = test::sequence_shape(length, 0, 2 * n_kv, n_kv, layers, 4);
  shape.observed = calib_random_table(layers, n_kv, 3);
  for (const double ratio : {0.25, 0.5, 0.75}) {
    auto policy = make_policy("duo-attention", calib_options(budget, ratio));
    REQUIRE(policy->prepass() == Prepass::PasskeyRetrieval);
    const auto expected = calib_expected(*shape.observed, ratio);
    // The case tells the score from its negation.
    CHECK(expected != calib_expected(*calib_random_table(layers, n_kv, 3, -1), ratio));
    std::vector<int> all(length), streamed = {0, 1};
    std::iota(all.begin(), all.end(), 0);
    for (int p = length - (budget - 2); p < length; ++p) streamed.push_back(p);
    int streaming_heads = 0;
    for (int layer = 0; layer < layers; ++layer) {
      const auto trace = calib_drive(*policy, shape, layer);
      for (int h = 0; h < n_kv; ++h) {
        INFO("ratio " << ratio << " layer " << layer << " KV head " << h);
        CHECK(trace.positions.back()[h] == (expected[layer][h] ? streamed : all));
        streaming_heads += expected[layer][h];
        // A streaming head holds the budget at every step.
        if (expected[layer][h])
          for (int i = 0; i < length; ++i) REQUIRE(static_cast<int>(trace.positions[i][h].size()) == std::min(i + 1, budget));
      }
    }
    CHECK(streaming_heads == static_cast<int>(std::nearbyint(ratio * layers * n_kv)));
  }
}

TEST_CASE("duo-attention refuses a pattern file with calibration, and calibration without its pass, in one line",
          "[policies][duo]") {
  PolicyOptions both = calib_options(8, 0.5);
  both.params.set("pattern_file", "heads.tsv");
  const std::string contradiction = test::error_of([&] { make_policy("duo-attention", both); });
  CHECK_THAT(contradiction, Catch::Contains("--pattern-file") && Catch::Contains("--calibration passkey") &&
                                Catch::Contains("not both"));
  CHECK(contradiction.find('\n') == std::string::npos);
  const SequenceShape shape = test::sequence_shape(10, 0, 2, 1, 1, 4);
  const std::string missing = test::error_of([&] { make_policy("duo-attention", calib_options(8, 0.5))->validate(shape); });
  CHECK_THAT(missing, Catch::Contains("calibration pass"));
  CHECK(missing.find('\n') == std::string::npos);
  PolicyOptions neither;
  neither.budget.tokens = 8;
  CHECK_THAT(test::error_of([&] { make_policy("duo-attention", neither)->validate(shape); }),
             Catch::Contains("--pattern-file") && Catch::Contains("--calibration passkey"));
}

TEST_CASE("duo-attention's calibration table is the question's attention on the needle, once per model",
          "[policies][duo]") {
  const Model& model = test::stories();
  const Tokenizer& tokenizer = model.require_tokenizer();
  const PasskeyPrompt prompt = passkey_prompt(tokenizer, static_cast<int>(model.arch().bos_token_id), 300, 0);
  const int T = static_cast<int>(prompt.tokens.size());
  REQUIRE(T > 250);
  REQUIRE(T < 330);
  REQUIRE(0 < prompt.needle_begin);
  REQUIRE(prompt.needle_begin < prompt.needle_end);
  REQUIRE(prompt.needle_end < prompt.question_begin);
  REQUIRE(prompt.question_begin < T);
  const std::string needle = tokenizer.decode(
      std::vector<int>(prompt.tokens.begin() + prompt.needle_begin, prompt.tokens.begin() + prompt.needle_end));
  CHECK_THAT(needle, Catch::Contains("The pass key is"));
  CHECK(passkey_prompt(tokenizer, 1, 300, 0).tokens == passkey_prompt(tokenizer, 1, 300, 0).tokens);
  CHECK(passkey_prompt(tokenizer, 1, 300, 0).tokens != passkey_prompt(tokenizer, 1, 300, 1).tokens);

  const auto table = retrieval_scores(model, prompt);
  const int L = static_cast<int>(model.arch().n_layers), n_kv = static_cast<int>(model.arch().n_kv_heads);
  const int n_q = static_cast<int>(model.arch().n_heads), group = n_q / n_kv;
  std::vector<std::vector<double>> on_needle(L, std::vector<double>(n_kv, 0.0));
  FullAttention attention(
      [&](int layer, int64_t first, int64_t rows, int64_t n, const torch::Tensor&, const torch::Tensor&,
          const torch::Tensor&, const torch::Tensor& p) {
        const torch::Tensor host = p.to(torch::kCPU, torch::kFloat64).contiguous();
        const double* data = host.data_ptr<double>();
        for (int h = 0; h < n_q; ++h)
          for (int64_t r = 0; r < rows; ++r) {
            if (first + r < prompt.question_begin) continue;
            for (int j = prompt.needle_begin; j < prompt.needle_end; ++j)
              on_needle[layer][h / group] += data[(h * rows + r) * n + j];
          }
      },
      1);
  model.forward(prompt.tokens, 0, attention);
  const double rows = static_cast<double>(T - prompt.question_begin) * group;
  std::vector<double> scores;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < n_kv; ++h) {
      INFO("layer " << l << " KV head " << h);
      CHECK(std::abs(table->at(l, h, 0) - on_needle[l][h] / rows) < 1e-6);
      scores.push_back(on_needle[l][h] / rows);
    }
  // The heads differ: the calibration separates them.
  CHECK(*std::max_element(scores.begin(), scores.end()) > 2 * *std::min_element(scores.begin(), scores.end()));
  // One table per model, made at the first call.
  CHECK(calibration_scores(model) == calibration_scores(model));
  CHECK(calibration_scores(model)->tokens <= model.arch().max_positions);
}

TEST_CASE("duo-attention calibration passkey: sim mode and decode mode agree on stories260K", "[policies][duo][sim-decode]") {
  const auto tokens = test::golden_tokens();
  const std::vector<std::pair<std::string, double>> tolerances = {{"float64", 1e-9}, {"float32", 5e-5}};
  for (const auto& [dtype, tolerance] : tolerances) {
    ModelOptions options = test::model_options();
    options.dtype = dtype;
    auto model = Model::load(test::data("models/stories260K-hf"), options);
    const auto full = score_sequence(*model, *make_policy("full", {}), Mode::Sim, tokens);
    for (double budget : {0.1, 0.3})
      for (int prefill : {0, static_cast<int>(tokens.size()) / 2}) {
        PolicyOptions o;
        o.budget.ratio = budget;
        o.params.set("calibration", "passkey");
        auto policy = make_policy("duo-attention", o);
        const auto sim = score_sequence(*model, *policy, Mode::Sim, tokens, prefill);
        const auto decode = score_sequence(*model, *policy, Mode::Decode, tokens, prefill);
        INFO(dtype << " budget " << budget << " prefill " << prefill);
        CHECK(test::max_diff(sim.next_token_logprob, decode.next_token_logprob) < tolerance);
        CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
        CHECK(decode.kv.prepass_tokens == 0);  // once per model, in no sequence's statistics
        // Half the heads stream: some keep the budget, the others every token.
        int streaming = 0, heads = 0;
        for (const auto& layer : decode.kv.kept_per_head)
          for (int kept : layer) {
            ++heads;
            streaming += kept < static_cast<int>(tokens.size());
          }
        CHECK(streaming == heads / 2);
        if (dtype == "float32") CHECK(test::max_diff(sim.next_token_logprob, full.next_token_logprob) > 1e-3);
      }
  }
}
