// kvevict analyze: the golden attention statistics, block-wise computation, recall
// and persistence sanity, outputs and errors.

#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <map>
#include <numeric>
#include <set>

#include "harness/analysis/analyze.h"
#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "harness/runtime/attention.h"
#include "harness/runtime/scorer.h"
#include "tests/policy_drive.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

// Every number in a JSON value, in document order (objects by key).
void collect_numbers(const nlohmann::json& j, std::vector<double>& out) {
  if (j.is_number()) out.push_back(j.get<double>());
  if (j.is_structured())
    for (const auto& item : j) collect_numbers(item, out);
}

// The same document shape: keys and array lengths, with the numbers left out.
nlohmann::json shape_of(const nlohmann::json& j) {
  if (j.is_number()) return "number";
  if (!j.is_structured()) return j;
  nlohmann::json shape = j.is_array() ? nlohmann::json::array() : nlohmann::json::object();
  for (auto it = j.begin(); it != j.end(); ++it) {
    if (j.is_array()) shape.push_back(shape_of(*it));
    else shape[it.key()] = shape_of(it.value());
  }
  return shape;
}

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

TEST_CASE("analyze counts only the keys a sliding window lets a query see", "[analyze][window]") {
  // tiny-random-mistral: window 8, 40 tokens, so most queries see 8 of their keys.
  auto model = Model::load(test::data("models/tiny-random-mistral"), test::model_options());
  const auto tokens = test::read_json(test::data("golden/tiny_models/tiny-random-mistral.json"))["tokens"].get<std::vector<int>>();
  const int64_t window = model->arch().sliding_window;
  REQUIRE(window == 8);
  REQUIRE(tokens.size() > 3 * static_cast<size_t>(window));
  // The reference: the model's own attention probabilities, and the statistics over the
  // visible keys computed here, by brute force.
  const int hq = static_cast<int>(model->arch().n_heads), T = static_cast<int>(tokens.size());
  std::vector<std::vector<std::vector<double>>> probs(model->arch().n_layers);  // [layer][h * T + i][j]
  FullAttention observed(
      [&](int layer, int64_t first, int64_t rows, int64_t n, const torch::Tensor&, const torch::Tensor&,
          const torch::Tensor&, const torch::Tensor& p) {
        auto host = p.to(torch::kFloat64).contiguous();
        probs[layer].resize(static_cast<size_t>(hq) * T);
        for (int h = 0; h < hq; ++h)
          for (int64_t r = 0; r < rows; ++r) {
            const double* row = host.data_ptr<double>() + (h * rows + r) * n;
            probs[layer][h * T + first + r].assign(row, row + n);
          }
      },
      5);
  model->forward(tokens, 0, observed);
  AnalyzeOptions options;
  options.recall_policies = {"h2o"};
  options.recall_budgets = {0.5};
  const AttentionAnalysis analysis = analyze_attention(*model, {tokens}, options);
  for (size_t l = 0; l < analysis.layers.size(); ++l) {
    double sparse = 0, entries = 0, hidden_mass = 0;
    for (int h = 0; h < hq; ++h)
      for (int i = 0; i < T; ++i) {
        const auto& row = probs[l][h * T + i];
        const int lo = std::max<int>(0, i - static_cast<int>(window) + 1);
        double top = 0;
        for (int j = lo; j <= i; ++j) top = std::max(top, row[j]);
        for (int j = lo; j <= i; ++j) sparse += row[j] < 0.01 * top;
        for (int j = 0; j < lo; ++j) hidden_mass += row[j];
        entries += i - lo + 1;
      }
    INFO("layer " << l);
    CHECK(hidden_mass == 0);  // the model itself never attends past the window
    double got_entries = 0;
    for (const auto& head : analysis.layers[l].heads) got_entries += head.entries;
    CHECK(got_entries == entries);  // 292 per head, not the 820 of the causal triangle
    CHECK(analysis.layers[l].sparsity() == Approx(sparse / entries).margin(1e-12));
    // h2o at 50% keeps 20 slots, but a query sees at most the window.
    CHECK(analysis.layers[l].recall.at("h2o").at(0.5).attended() <= window - 1);
    CHECK(analysis.layers[l].recall.at("h2o").at(0.5).recall() == Approx(1.0).margin(1e-6));
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

TEST_CASE("analyze's recall and persistence equal a brute force over the model's own attention",
          "[analyze][kept]") {
  // The reference: stories260K's logits, attention and key norms, observed under full
  // attention; each recall policy's kept sets worked out here (local and streamingllm by
  // their definition, the others through their LayerStates over a masked softmax of the
  // observed logits, as tests/policy_drive.h drives them), and the heavy-hitter sets by a
  // full sort of the accumulated attention.
  const Model& model = test::stories();
  const auto tokens = test::golden_tokens();
  const int T = static_cast<int>(tokens.size()), hq = static_cast<int>(model.arch().n_heads),
            hkv = static_cast<int>(model.arch().n_kv_heads), group = hq / hkv, layers = static_cast<int>(model.arch().n_layers);
  REQUIRE(model.arch().sliding_window == 0);
  std::vector<std::vector<double>> probs(layers, std::vector<double>(static_cast<size_t>(hq) * T * T, 0.0));
  std::vector<std::vector<float>> logits(layers, std::vector<float>(static_cast<size_t>(hq) * T * T, 0.0f));
  std::vector<std::vector<float>> norms(layers);  // [layer][position * hkv + kv]
  FullAttention observed(
      [&](int layer, int64_t first, int64_t rows, int64_t n, const torch::Tensor& k, const torch::Tensor&,
          const torch::Tensor& l, const torch::Tensor& p) {
        const auto p64 = p.to(torch::kFloat64).contiguous();
        const auto l32 = l.to(torch::kFloat32).contiguous();
        for (int h = 0; h < hq; ++h)
          for (int64_t r = 0; r < rows; ++r)
            for (int64_t j = 0; j < n; ++j) {
              const size_t at = (static_cast<size_t>(h) * T + first + r) * T + j;
              probs[layer][at] = p64.data_ptr<double>()[(h * rows + r) * n + j];
              logits[layer][at] = l32.data_ptr<float>()[(h * rows + r) * n + j];
            }
        const auto key_norms = k.to(torch::kFloat32).norm(2, -1).contiguous();  // [T, hkv]
        norms[layer].assign(key_norms.data_ptr<float>(), key_norms.data_ptr<float>() + key_norms.numel());
      },
      37);  // analyze's blocks below: the same products, so the same bits
  model.forward(tokens, 0, observed);

  AnalyzeOptions options;
  options.recall_policies = {"local", "streamingllm", "h2o", "tova", "knorm", "snapkv"};
  options.recall_budgets = {0.1, 0.3};
  options.persistence_deltas = {1, 4, 16, 64};
  options.block_rows = 37;
  const AttentionAnalysis analysis = analyze_attention(model, {tokens}, options);
  REQUIRE(static_cast<int>(analysis.layers.size()) == layers);
  const SequenceShape shape = shape_for(model, T, 0);

  for (int layer = 0; layer < layers; ++layer) {
    const auto p = [&](int h, int i, int j) { return probs[layer][(static_cast<size_t>(h) * T + i) * T + j]; };
    // seen[i][kv]: the keys query i sees under one policy; recall and attended from them.
    auto recall_of = [&](const std::vector<std::vector<std::vector<int>>>& seen) {
      double mass = 0, attended = 0;
      for (int i = 0; i < T; ++i)
        for (int h = 0; h < hq; ++h) {
          for (int j : seen[i][h / group]) mass += p(h, i, j);
          attended += static_cast<double>(seen[i][h / group].size()) - 1;
        }
      return std::make_pair(mass / (T * hq), attended / (T * hq));
    };
    for (const std::string& name : options.recall_policies)
      for (double budget : options.recall_budgets) {
        const int tokens_kept = static_cast<int>(budget * T);
        std::vector<std::vector<std::vector<int>>> seen(T, std::vector<std::vector<int>>(hkv));
        if (name == "local" || name == "streamingllm") {
          // local: keys i - budget .. i. streamingllm: 4 sinks and keys i - (budget - 4) .. i.
          const int sinks = name == "local" ? 0 : 4;
          for (int i = 0; i < T; ++i)
            for (int kv = 0; kv < hkv; ++kv)
              for (int j = 0; j <= i; ++j)
                if (j < sinks || j >= i - (tokens_kept - sinks)) seen[i][kv].push_back(j);
        } else {
          PolicyOptions o;
          o.budget.ratio = budget;
          auto policy = make_policy(name, o);
          LayerStates states = policy->as_realisable()->make_layer_states(layer, shape);
          const test::LayerTrace trace = test::drive_layer_states(
              states, shape,
              [&](int h, int i, const std::vector<int>& positions, const std::vector<char>* visible, float* out) {
                // The softmax of the query's logits over the slots it sees, in double.
                const float* row = logits[layer].data() + (static_cast<size_t>(h) * T + i) * T;
                double m = -std::numeric_limits<double>::infinity(), sum = 0;
                std::vector<double> e(positions.size(), 0.0);
                for (size_t s = 0; s < positions.size(); ++s)
                  if (!visible || (*visible)[s]) m = std::max<double>(m, row[positions[s]]);
                for (size_t s = 0; s < positions.size(); ++s)
                  if (!visible || (*visible)[s]) sum += (e[s] = std::exp(row[positions[s]] - m));
                const double inv = 1.0 / sum;
                for (size_t s = 0; s < positions.size(); ++s) out[s] = static_cast<float>(e[s] * inv);
              },
              [&](int kv, int position) { return norms[layer][static_cast<size_t>(position) * hkv + kv]; });
          seen = trace.seen;
        }
        const auto [recall, attended] = recall_of(seen);
        const RecallStatistics& got = analysis.layers[layer].recall.at(name).at(budget);
        INFO("layer " << layer << " " << name << " budget " << budget);
        CHECK(got.rows == T * hq);
        CHECK(std::abs(got.recall() - recall) < 1e-12);
        CHECK(std::abs(got.attended() - attended) < 1e-12);
        CHECK(recall < 1.0 - 1e-6);  // the budget evicts attention: the check compares something
      }

    // Persistence: the top k = int(0.1 T) keys by attention accumulated over queries 0..i
    // (the lower position among equals), for every i >= k; the mean overlap of the sets
    // delta steps apart, over heads and steps.
    const int k = std::max(1, static_cast<int>(0.1 * T));
    std::map<int, std::pair<double, double>> overlap;  // delta -> (sum, count)
    for (int h = 0; h < hq; ++h) {
      std::vector<double> acc(T, 0.0);
      std::vector<std::set<int>> top(T);
      for (int i = 0; i < T; ++i) {
        for (int j = 0; j <= i; ++j) acc[j] += p(h, i, j);
        if (i < k) continue;
        std::vector<int> order(i + 1);
        std::iota(order.begin(), order.end(), 0);
        std::sort(order.begin(), order.end(), [&](int a, int b) { return acc[a] != acc[b] ? acc[a] > acc[b] : a < b; });
        top[i] = std::set<int>(order.begin(), order.begin() + k);
        for (int delta : options.persistence_deltas) {
          if (i - delta < k) continue;
          int common = 0;
          for (int j : top[i]) common += static_cast<int>(top[i - delta].count(j));
          overlap[delta].first += static_cast<double>(common) / k;
          overlap[delta].second += 1;
        }
      }
    }
    for (int delta : options.persistence_deltas) {
      INFO("layer " << layer << " persistence delta " << delta);
      const double want = overlap[delta].first / overlap[delta].second;
      CHECK(std::abs(analysis.layers[layer].persistence_at(delta) - want) < 1e-12);
      CHECK(want < 1.0);  // the sets do change: the comparison is not of two constants
    }
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

TEST_CASE("analyze --config runs each entry into its own folder, as the same flags would", "[analyze][cli]") {
  const std::string dir = test::temp_dir("analyze_config");
  const std::string config = dir + "/observations.json";
  std::ofstream(config) << R"({"analyze": [
    {"name": "story", "text_file": "text/tinystories_sample.txt", "max_tokens": 60,
     "recall_policies": ["local"], "recall_budgets": [0.25], "deltas": [2, 8]},
    {"name": "copa", "task": "copa", "limit": 1, "recall_policies": ["h2o"], "recall_budgets": [0.5]}]})";
  auto r = test::run_kvevict("analyze --config " + config + " --out " + dir + "/by_config");
  INFO(r.err);
  REQUIRE(r.exit_code == 0);
  // Each entry, run by hand with its flags.
  const std::string flags[2] = {"--text-file " + test::data("text/tinystories_sample.txt") +
                                    " --max-tokens 60 --recall-policies local --recall-budgets 0.25 --deltas 2,8",
                                "--task copa --limit 1 --recall-policies h2o --recall-budgets 0.5"};
  const std::string names[2] = {"story", "copa"};
  for (int e = 0; e < 2; ++e) {
    INFO("entry " << names[e]);
    const std::string by_hand = dir + "/by_hand_" + names[e];
    auto hand = test::run_kvevict("analyze " + flags[e] + " --out " + by_hand);
    REQUIRE(hand.exit_code == 0);
    const std::string entry = dir + "/by_config/" + names[e];
    CHECK(test::read_json(entry + "/analysis.json") == test::read_json(by_hand + "/analysis.json"));
    CHECK(test::read_text(entry + "/analysis.csv") == test::read_text(by_hand + "/analysis.csv"));
    CHECK(std::filesystem::exists(entry + "/plots/recall_vs_budget.svg"));
  }
  // The overrides really differ between the entries.
  const auto story = test::read_json(dir + "/by_config/story/analysis.json");
  const auto copa = test::read_json(dir + "/by_config/copa/analysis.json");
  CHECK(story["tokens"] == 60);
  CHECK(story["layers"][0]["recall"].contains("local"));
  CHECK(story["layers"][0]["persistence"].contains("8"));
  CHECK(copa["sequences"] == 2);  // one document, two choices
  CHECK(copa["layers"][0]["recall"]["h2o"].contains("0.5"));

  auto no_out = test::run_kvevict("analyze --config " + config);
  CHECK(no_out.exit_code == 1);
  CHECK_THAT(no_out.err, Catch::Contains("analyze --config needs --out DIR"));
  std::ofstream(dir + "/empty.json") << R"({"name": "x"})";
  auto no_list = test::run_kvevict("analyze --config " + dir + "/empty.json --out " + dir + "/nothing");
  CHECK(no_list.exit_code == 1);
  CHECK_THAT(no_list.err, Catch::Contains(dir + "/empty.json: no \"analyze\" list"));
}

TEST_CASE("analyze --block-rows changes how the rows are blocked, not the statistics; below 1 is refused",
          "[analyze][cli]") {
  const std::string dir = test::temp_dir("analyze_block_rows");
  // float64: ATen's products over blocks of other row counts need not sum in one order, and
  // sparsity counts the probabilities under a threshold. In float32 (LibTorch 2.6, AVX2)
  // that moved one of 8520 counts between 7-row blocks and one block.
  const std::string text = "analyze --dtype float64 --text-file " + test::data("text/tinystories_sample.txt") +
                           " --max-tokens 150 --recall-policies local,h2o --recall-budgets 0.2,0.5 --block-rows ";
  nlohmann::json analyses[3];
  const int blocks[3] = {1, 7, 512};  // a row at a time, uneven blocks, one block
  for (int b = 0; b < 3; ++b) {
    auto r = test::run_kvevict(text + std::to_string(blocks[b]));
    INFO("block rows " << blocks[b] << ": " << r.err);
    REQUIRE(r.exit_code == 0);
    analyses[b] = nlohmann::json::parse(r.out);
  }
  std::vector<double> one_block;
  collect_numbers(analyses[2], one_block);
  CHECK(one_block.size() > 50);  // 5 layers of sparsity, fits, persistence, recall, attended
  for (int b = 0; b < 2; ++b) {
    INFO("block rows " << blocks[b] << " against one block");
    CHECK(shape_of(analyses[b]) == shape_of(analyses[2]));
    std::vector<double> numbers;
    collect_numbers(analyses[b], numbers);
    CHECK(test::max_diff(numbers, one_block) < 1e-5);
  }
  // What the flag is for: memory. A block of 512 rows of a 512-token sequence holds its
  // [8 heads, 512, 512] float32 scores (8 MiB), blocks of 8 rows 1/64 of that; the peak
  // must show at least a quarter of the difference (the same run varies by about 0.2 MiB).
  const std::string long_text = "analyze --text-file " + test::data("text/tinystories_sample.txt") +
                                " --max-tokens 512 --recall-policies none --block-rows ";
  const auto [small_exit, small_kib] = test::run_kvevict_peak_memory(long_text + "8");
  const auto [large_exit, large_kib] = test::run_kvevict_peak_memory(long_text + "512");
  REQUIRE(small_exit == 0);
  REQUIRE(large_exit == 0);
  INFO("peak memory " << small_kib << " KiB with 8-row blocks, " << large_kib << " KiB with one 512-row block");
  CHECK(large_kib - small_kib >= 2048);
  for (const std::string bad : {"0", "-3"}) {
    auto r = test::run_kvevict(text + bad);
    INFO(r.err);
    CHECK(r.exit_code != 0);
    CHECK_THAT(r.err, Catch::Contains("--block-rows"));
  }
}

namespace {
std::vector<double> doubles_of(const torch::Tensor& t) {
  const auto flat = t.to(torch::kCPU, torch::kFloat64).contiguous().view(-1);
  return std::vector<double>(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
}
}  // namespace

TEST_CASE("analyze --kv-quant observes the attention of decode mode's KIVI cache, row by row", "[analyze][kivi]") {
  ModelOptions options = test::model_options();
  options.dtype = "float64";
  const auto model = Model::load(test::data("models/stories260K-hf"), options);
  const std::vector<int> tokens = test::golden_tokens();
  const int64_t T = static_cast<int64_t>(tokens.size());
  const SequenceShape shape = shape_for(*model, static_cast<int>(T), 0);
  for (const auto& [bits, residual] : std::vector<std::pair<int, int>>{{2, 16}, {4, 16}, {2, 256}}) {
    INFO("bits " << bits << ", R " << residual << ", G 8");
    KvQuantSpec spec;
    spec.bits = bits;
    spec.group = 8;
    spec.residual = residual;
    int64_t rows_seen = 0;
    double worst_row_sum = 0;
    const auto observed = make_observed_kivi_attention(
        spec, torch::kFloat64,
        [&](int, int64_t first, int64_t rows, int64_t n, const torch::Tensor&, const torch::Tensor&,
            const torch::Tensor&, const torch::Tensor& probs) {
          CHECK(rows == 1);
          CHECK(n == first + 1);
          rows_seen += rows;
          const auto sums = probs.sum(-1).to(torch::kFloat64);
          worst_row_sum = std::max(worst_row_sum, (sums - 1).abs().max().item<double>());
        });
    const auto analysed = model->forward(tokens, 0, *observed);
    // The same cache as sim mode runs it (checked against the KIVI golden in test_kivi.cpp).
    PolicyOptions o;
    o.kv_quant = spec;
    const auto full = make_policy("full", o);
    SimAttention sim(*model, *full, shape);
    const auto simulated = model->forward(tokens, 0, sim);
    CHECK(test::max_diff(doubles_of(analysed), doubles_of(simulated)) < 1e-9);
    CHECK(rows_seen == model->arch().n_layers * T);
    CHECK(worst_row_sum < 1e-12);
    // R above the length quantizes nothing: the unquantized model's numbers.
    FullAttention plain;
    const auto unquantized = model->forward(tokens, 0, plain);
    const double from_plain = test::max_diff(doubles_of(analysed), doubles_of(unquantized));
    if (residual >= T)
      CHECK(from_plain < 1e-9);
    else
      CHECK(from_plain > 1e-3);
  }
}

TEST_CASE("kvevict analyze --kv-quant: the settings in the JSON, the statistics of the quantized cache",
          "[analyze][kivi][cli]") {
  const std::string text = "analyze --text-file " + test::data("text/tinystories_sample.txt") +
                           " --max-tokens 150 --recall-policies local,h2o --recall-budgets 0.2,0.5";
  auto plain = test::run_kvevict(text);
  auto unflushed = test::run_kvevict(text + " --kv-quant kivi --kv-bits 2 --kv-group 8 --kv-residual 256");
  auto two_bit = test::run_kvevict(text + " --kv-quant kivi --kv-bits 2 --kv-group 8 --kv-residual 16");
  INFO(plain.err << unflushed.err << two_bit.err);
  REQUIRE(plain.exit_code == 0);
  REQUIRE(unflushed.exit_code == 0);
  REQUIRE(two_bit.exit_code == 0);
  auto a = nlohmann::json::parse(plain.out), b = nlohmann::json::parse(unflushed.out),
       c = nlohmann::json::parse(two_bit.out);
  CHECK(a["kv_quant"] == "none");
  CHECK(c["kv_quant"] == "kivi");
  CHECK(c["kv_bits"] == 2);
  CHECK(c["kv_group"] == 8);
  CHECK(c["kv_residual"] == 16);
  std::vector<double> na, nb, nc;
  for (auto* analysis : {&a, &b, &c})
    for (const char* key : {"kv_quant", "kv_bits", "kv_group", "kv_residual"}) analysis->erase(key);
  collect_numbers(a, na);
  collect_numbers(b, nb);
  collect_numbers(c, nc);
  CHECK(na.size() > 50);
  CHECK(test::max_diff(na, nc) > 1e-3);  // 2-bit keys and values move them
  // Nothing flushed: the unquantized statistics, up to how the two attention paths round
  // (one row at a time against the observed blocks). Persistence counts top-k members:
  // a key at a near tie with the k-th can change sides, which moves a layer's fraction by
  // one over its count (1.2e-4 at the most at these 150 tokens), so it is compared apart.
  std::vector<double> pa, pb;
  for (auto* analysis : {&a, &b}) {
    auto& persistence = analysis == &a ? pa : pb;
    for (auto& layer : (*analysis)["layers"]) {
      collect_numbers(layer["persistence"], persistence);
      layer.erase("persistence");
    }
  }
  na.clear();
  nb.clear();
  collect_numbers(a, na);
  collect_numbers(b, nb);
  CHECK(na.size() > 40);
  CHECK(test::max_diff(na, nb) < 1e-5);
  CHECK(pa.size() >= 5);
  CHECK(test::max_diff(pa, pb) < 5e-4);
  auto bad_group = test::run_kvevict(text + " --kv-quant kivi --kv-group 3 --kv-residual 9");
  CHECK(bad_group.exit_code == 1);
  CHECK_THAT(bad_group.err, Catch::Contains("--kv-group"));
  auto bad_bits = test::run_kvevict(text + " --kv-quant kivi --kv-bits 3");
  CHECK(bad_bits.exit_code == 1);
  CHECK_THAT(bad_bits.err, Catch::Contains("--kv-bits"));
}
