// Model-free unit tests for every registered policy (as kvpress tests its presses):
// a policy's LayerStates are driven with synthetic attention and key norms, and their
// slots are checked step by step. Sim-only policies get synthetic logits.
#include "tests/test_support.h"
#include "tests/catch.h"

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <functional>
#include <set>

#include "harness/common/errors.h"
#include "policies/registry.h"
#include "tests/policy_drive.h"

using namespace kvevict;

namespace {

// A deterministic value in (0, 1] from a few integers.
float noise(uint64_t a, uint64_t b, uint64_t c, uint64_t d = 0) {
  uint64_t x = a * 0x9e3779b97f4a7c15ULL ^ (b + 0x632be59bd9b4e019ULL) * 0xbf58476d1ce4e5b9ULL ^
               (c + 7) * 0x94d049bb133111ebULL ^ (d + 13) * 0xd6e8feb86659fd93ULL;
  x ^= x >> 31;
  x *= 0xbf58476d1ce4e5b9ULL;
  x ^= x >> 29;
  return (static_cast<float>(x >> 40) + 1.0f) / static_cast<float>(1ULL << 24);
}

// Attention of query head h at step i over the slots: peaked weights that depend on
// (head, step, key position), normalised per row.
void attention_row(int seed, int h, int step, const std::vector<int>& positions, float* out) {
  float sum = 0;
  for (size_t s = 0; s < positions.size(); ++s) sum += (out[s] = std::pow(noise(seed, h, step, positions[s]), 4.0f));
  for (size_t s = 0; s < positions.size(); ++s) out[s] /= sum;
}

float key_norm(int seed, int kv, int position) { return 0.5f + noise(seed + 1, kv, position); }

// The slots of every KV head after each step, with what the newest query saw.
struct Trace {
  std::vector<std::vector<std::vector<int>>> positions;  // [step][kv_head] -> positions
  std::vector<std::vector<int>> visible;                 // [step][kv_head] -> slots visible, itself excluded
};

// Runs one layer as the policy driver does: append -> visible -> observe -> compress per
// token. `attention` gives the observed attention (default: attention_row).
Trace drive(const Policy& policy, int layer, const SequenceShape& shape, int seed,
            const test::AttentionFn& attention = {}) {
  LayerStates states = policy.as_realisable()->make_layer_states(layer, shape);
  const test::LayerTrace run = test::drive_layer_states(
      states, shape,
      attention ? attention
                : [&](int h, int step, const std::vector<int>& positions, const std::vector<char>*, float* out) {
                    attention_row(seed, h, step, positions, out);
                  },
      [&](int kv, int position) { return key_norm(seed, kv, position); });
  Trace trace;
  trace.positions = run.positions;
  for (const auto& step : run.seen) {
    std::vector<int> counts;
    for (const auto& seen : step) counts.push_back(static_cast<int>(seen.size()) - 1);
    trace.visible.push_back(counts);
  }
  return trace;
}

PolicyOptions ratio_options(double ratio) {
  PolicyOptions o;
  o.budget.ratio = ratio;
  o.params.set("window", 8);
  return o;
}

bool is_pattern(const std::string& name) {
  // Pattern policies declare a stride; their "kept" is what a query attends.
  for (const ParamSpec* p : make_policy(name, ratio_options(0.2))->parameters())
    if (p->key() == "stride") return true;
  return false;
}

}  // namespace

TEST_CASE("every registered policy is covered by the unit tests", "[policies][units]") {
  // The loops below take every name from the registry; this list is what they were
  // written against. A policy added or removed changes it here, where its coverage is
  // reviewed (and README's list of policies with it).
  const std::vector<std::string> reviewed = {"full",     "local",     "random",       "h2o",   "h2o-paper",
                                             "h2o-global", "streamingllm", "tova", "snapkv", "pyramidkv",
                                             "scissorhands", "knorm", "keydiff", "lagkv", "expected-attention",
                                             "kvzip", "duo-attention", "sparse-strided", "sparse-fixed"};
  CHECK(policy_names() == reviewed);
  std::set<std::string> keys;
  for (const ParamSpec* p : all_policy_params()) {
    INFO(p->key());
    CHECK(keys.insert(p->key()).second);
    CHECK(p->check(p->default_text(), p->key()) == p->default_text());  // every default is in range
  }
}

TEST_CASE("the registry's named defaults are registered: the full cache keeps all, the default evicts", "[policies][units]") {
  const auto names = policy_names();
  for (const std::string& name : {reference_policy_name(), default_eviction_policy_name()})
    CHECK(std::find(names.begin(), names.end(), name) != names.end());
  CHECK(make_policy(reference_policy_name(), PolicyOptions{})->keeps_everything());
  PolicyOptions half;
  half.budget.ratio = 0.5;
  CHECK_FALSE(make_policy(default_eviction_policy_name(), half)->keeps_everything());
}

TEST_CASE("scored policies keep exactly the budget each step, sinks and the recent window always",
          "[policies][units]") {
  const SequenceShape shape = test::sequence_shape(90, 0, 4, 2, 3);
  for (const std::string& name : policy_names()) {
    if (test::needs_pattern_file(name) || test::needs_prepass(name)) continue;  // test_critical_duo, test_kvzip
    auto policy = make_policy(name, ratio_options(0.2));
    if (!policy->realisable() || is_pattern(name)) continue;
    for (int layer = 0; layer < shape.n_layers; ++layer) {
      const Budget budget = policy->layer_budget(layer, shape);
      const Trace trace = drive(*policy, layer, shape, 11);
      for (int i = 0; i < shape.length; ++i)
        for (int h = 0; h < shape.n_kv_heads; ++h) {
          const auto& kept = trace.positions[i][h];
          INFO(name << " layer " << layer << " step " << i << " head " << h);
          if (policy->keeps_everything()) {
            REQUIRE(static_cast<int>(kept.size()) == i + 1);
            continue;
          }
          REQUIRE(static_cast<int>(kept.size()) == std::min(i + 1, budget.capacity));
          REQUIRE(std::is_sorted(kept.begin(), kept.end()));
          for (int p = 0; p < std::min(budget.sink, i + 1); ++p)
            REQUIRE(std::binary_search(kept.begin(), kept.end(), p));
          for (int p = std::max(0, i - budget.recent + 1); p <= i; ++p)
            REQUIRE(std::binary_search(kept.begin(), kept.end(), p));
        }
    }
  }
  // The sinks are real: streamingllm keeps its 4 first tokens and nothing between them
  // and the recent window.
  auto streaming = make_policy("streamingllm", ratio_options(0.2));
  const Trace trace = drive(*streaming, 0, shape, 3);
  CHECK(trace.positions.back()[0] == std::vector<int>({0, 1, 2, 3, 76, 77, 78, 79, 80, 81, 82, 83, 84, 85, 86, 87, 88, 89}));
}

TEST_CASE("pattern policies attend within the budget and keep what a later query needs", "[policies][units]") {
  const SequenceShape shape = test::sequence_shape(100, 0, 4, 2, 2);
  const int budget_tokens = 20;  // int(0.2 * 100)
  for (const std::string& name : policy_names()) {
    if (test::needs_pattern_file(name) || test::needs_prepass(name)) continue;  // test_critical_duo, test_kvzip
    if (!is_pattern(name)) continue;
    auto policy = make_policy(name, ratio_options(0.2));
    const Trace trace = drive(*policy, 0, shape, 5);
    const int capacity = policy->layer_budget(0, shape).capacity;
    for (int i = 0; i < shape.length; ++i)
      for (int h = 0; h < shape.n_kv_heads; ++h) {
        INFO(name << " step " << i << " head " << h);
        REQUIRE(trace.visible[i][h] <= budget_tokens);
        REQUIRE(static_cast<int>(trace.positions[i][h].size()) <= capacity);
      }
  }
  // With the period given, the visible slots are exactly the pattern's (stride 4).
  PolicyOptions o;
  o.params.set("stride", 4);
  auto strided = make_policy("sparse-strided", o);
  const Trace trace = drive(*strided, 0, test::sequence_shape(30, 0, 2, 2, 1), 9);
  for (int i = 0; i < 30; ++i) {
    int expected = 0;
    for (int j = 0; j < i; ++j) expected += (i - j < 4 || (i - j) % 4 == 0);
    INFO("step " << i);
    CHECK(trace.visible[i][0] == expected);
    CHECK(static_cast<int>(trace.positions[i][0].size()) == i + 1);  // strided never drops a key
  }
  o.params.set("summary", 2);
  auto fixed = make_policy("sparse-fixed", o);
  const Trace fixed_trace = drive(*fixed, 0, test::sequence_shape(30, 0, 2, 2, 1), 9);
  for (int i = 0; i < 30; ++i) {
    int expected = 0;
    for (int j = 0; j < i; ++j) expected += (j / 4 == i / 4 || j % 4 >= 2);
    std::vector<int> needed;  // keys a query after i attends: summaries, and the next query's block
    for (int j = 0; j <= i; ++j)
      if (j % 4 >= 2 || j / 4 == (i + 1) / 4) needed.push_back(j);
    INFO("step " << i);
    CHECK(fixed_trace.visible[i][0] == expected);
    CHECK(fixed_trace.positions[i][0] == needed);
  }
}

TEST_CASE("the mean layer budget equals the budget for every policy", "[policies][units]") {
  for (int layers : {1, 5, 12}) {
    const SequenceShape shape = test::sequence_shape(200, 0, 8, 4, layers);
    for (const std::string& name : policy_names()) {
      if (test::needs_pattern_file(name) || test::needs_prepass(name)) continue;  // test_critical_duo, test_kvzip
      auto policy = make_policy(name, ratio_options(0.2));
      if (policy->keeps_everything() || is_pattern(name)) continue;
      long total = 0;
      for (int l = 0; l < layers; ++l) total += policy->layer_budget(l, shape).capacity;
      INFO(name << " layers " << layers);
      CHECK(total == 40L * layers);  // int(0.2 * 200) tokens per layer on average
    }
  }
  // PyramidKV's layers really differ (the schedule is not flat) and the largest is at the bottom.
  auto pyramid = make_policy("pyramidkv", ratio_options(0.2));
  const SequenceShape five = test::sequence_shape(200, 0, 8, 4, 5);
  CHECK(pyramid->layer_budget(0, five).capacity > pyramid->layer_budget(4, five).capacity);
}

TEST_CASE("every policy is deterministic", "[policies][units]") {
  const SequenceShape shape = test::sequence_shape(70, 0, 4, 2, 2);
  for (const std::string& name : policy_names()) {
    if (test::needs_pattern_file(name) || test::needs_prepass(name)) continue;  // test_critical_duo, test_kvzip
    auto policy = make_policy(name, ratio_options(0.3));
    INFO(name);
    if (policy->realisable()) {
      const Trace a = drive(*policy, 1, shape, 21);
      const Trace b = drive(*make_policy(name, ratio_options(0.3)), 1, shape, 21);
      CHECK(a.positions == b.positions);
      CHECK(a.visible == b.visible);
    } else {
      const int T = 50;
      std::vector<float> logits(static_cast<size_t>(2) * T * T);
      for (size_t x = 0; x < logits.size(); ++x) logits[x] = 4 * noise(2, x, 0);
      std::vector<float> p1(logits.size(), 0.0f), p2(logits.size(), 0.0f);
      const SequenceShape sim = test::sequence_shape(T, 0, 2, 2, 1);
      policy->as_sim_only()->simulate_layer(0, sim, T, logits.data(), p1.data());
      make_policy(name, ratio_options(0.3))->as_sim_only()->simulate_layer(0, sim, T, logits.data(), p2.data());
      CHECK(p1 == p2);
    }
  }
  // The random policy's seed matters.
  PolicyOptions seeded = ratio_options(0.3);
  seeded.params.set("seed", 7);
  CHECK(drive(*make_policy("random", seeded), 0, shape, 21).positions !=
        drive(*make_policy("random", ratio_options(0.3)), 0, shape, 21).positions);
}

TEST_CASE("a KV head aggregates its query group's attention (GQA), by mean or max", "[policies][units]") {
  // Running 4 query heads over 2 KV heads must equal running 2 query heads whose
  // attention is already the group's mean (or max).
  const int n_q = 4, n_kv = 2, group = 2, seed = 17;
  const SequenceShape gqa = test::sequence_shape(80, 0, n_q, n_kv, 1);
  const SequenceShape reduced = test::sequence_shape(80, 0, n_kv, n_kv, 1);
  for (const std::string reduce : {"mean", "max"}) {
    // The reduced run's KV head kv observes its group's mean (or max) of the GQA run's rows.
    const test::AttentionFn aggregated = [&](int kv, int step, const std::vector<int>& positions,
                                             const std::vector<char>*, float* out) {
      const size_t n = positions.size();
      std::vector<float> row(n);
      std::fill(out, out + n, 0.0f);
      for (int j = 0; j < group; ++j) {
        attention_row(seed, kv * group + j, step, positions, row.data());
        for (size_t s = 0; s < n; ++s) out[s] = reduce == "max" ? std::max(out[s], row[s]) : out[s] + row[s];
      }
      if (reduce == "mean")
        for (size_t s = 0; s < n; ++s) out[s] /= group;
    };
    for (const std::string& name : policy_names()) {
      if (test::needs_pattern_file(name) || test::needs_prepass(name)) continue;  // test_critical_duo, test_kvzip
      PolicyOptions o = ratio_options(0.2);
      o.params.set("group_reduce", reduce);
      auto policy = make_policy(name, o);
      if (!policy->realisable()) continue;
      // A policy that reads its group's queries (expected-attention) sees the group itself,
      // not only its attention; test_expected_attention.cpp checks its GQA.
      if (policy->as_realisable()->token_vectors() == TokenVectors::KeysValuesAndQueries) continue;
      const Trace expected = drive(*policy, 0, reduced, seed, aggregated);
      const Trace got = drive(*policy, 0, gqa, seed);
      INFO(name << " group_reduce " << reduce);
      CHECK(got.positions == expected.positions);
    }
  }
  // The aggregation is not a no-op on this data: the attention scorers keep different
  // tokens under mean and max.
  PolicyOptions mean = ratio_options(0.2), max = ratio_options(0.2);
  max.params.set("group_reduce", "max");
  for (const std::string name : {"tova", "snapkv", "scissorhands"}) {
    INFO(name);
    CHECK(drive(*make_policy(name, mean), 0, gqa, seed).positions !=
          drive(*make_policy(name, max), 0, gqa, seed).positions);
  }
}

TEST_CASE("sim-only policies mask each row to heavy hitters plus the recent band", "[policies][units]") {
  const int T = 60, n_q = 2;
  std::vector<float> logits(static_cast<size_t>(n_q) * T * T);
  for (size_t x = 0; x < logits.size(); ++x) logits[x] = 3 * noise(4, x, 1);
  const SequenceShape shape = test::sequence_shape(T, 0, n_q, n_q, 3);
  for (const std::string& name : policy_names()) {
    if (test::needs_pattern_file(name) || test::needs_prepass(name)) continue;  // test_critical_duo, test_kvzip
    auto policy = make_policy(name, ratio_options(0.2));
    if (policy->realisable()) continue;
    const Budget budget = policy->layer_budget(0, shape);
    CHECK(budget.capacity == 12);  // int(0.1 * 60) heavy + int(0.1 * 60) recent, the paper's split
    CHECK(budget.recent == 6);
    for (int l = 1; l < shape.n_layers; ++l) CHECK(policy->layer_budget(l, shape).capacity == budget.capacity);
    std::vector<float> probs(logits.size(), 0.0f);
    policy->as_sim_only()->simulate_layer(0, shape, T, logits.data(), probs.data());
    for (int h = 0; h < n_q; ++h)
      for (int i = 0; i < T; ++i) {
        const float* row = probs.data() + (static_cast<size_t>(h) * T + i) * T;
        int kept = 0;
        double sum = 0;
        for (int j = 0; j <= i; ++j) {
          kept += row[j] > 0;
          sum += row[j];
        }
        INFO(name << " head " << h << " row " << i);
        CHECK(std::abs(sum - 1.0) < 1e-5);
        CHECK(kept <= budget.capacity + 1);  // heavy + recent band + itself
        for (int j = std::max(0, i - budget.recent); j <= i; ++j) CHECK(row[j] > 0);
        for (int j = i + 1; j < T; ++j) CHECK(row[j] == 0);
      }
  }
}

TEST_CASE("policy parameters are declared once and checked against their range", "[policies][params]") {
  const auto error_of = [](const std::string& key, const std::string& value) {
    try {
      PolicyParams params;
      params.set(key, value);
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(error_of("kernel", "4"), Catch::Contains("kernel") && Catch::Contains("odd"));
  CHECK_THAT(error_of("kernel", "0"), Catch::Contains("kernel"));
  CHECK_THAT(error_of("n_sink", "-1"), Catch::Contains("n_sink"));
  CHECK_THAT(error_of("window", "0"), Catch::Contains("window"));
  CHECK_THAT(error_of("pooling", "median"), Catch::Contains("one of avg, max"));
  CHECK_THAT(error_of("group_reduce", "sum"), Catch::Contains("one of mean, max"));
  CHECK_THAT(error_of("stride", "0"), Catch::Contains("stride"));
  CHECK_THAT(error_of("pyramid_beta", "0.5"), Catch::Contains("pyramid_beta"));
  CHECK_THAT(error_of("window", "2.5"), Catch::Contains("integer"));
  CHECK_THAT(error_of("seed", "-3"), Catch::Contains("unsigned"));
  CHECK_THAT(error_of("nope", "1"), Catch::Contains("unknown policy parameter \"nope\""));
  CHECK(error_of("stride", "-1").empty());  // -1: the period comes from the budget
  CHECK(error_of("kernel", "7").empty());
  CHECK(error_of("pyramid_beta", "2.5").empty());
  // A policy lists what it reads; a composition reads both parts'.
  auto names_of = [](const std::string& policy) {
    std::set<std::string> keys;
    for (const ParamSpec* p : make_policy(policy, {})->parameters()) keys.insert(p->key());
    return keys;
  };
  CHECK(names_of("pyramidkv") == std::set<std::string>{"group_reduce", "window", "kernel", "pooling", "pyramid_beta"});
  CHECK(names_of("full").empty());
  CHECK(names_of("random+sparse-fixed") == std::set<std::string>{"group_reduce", "seed", "stride", "summary"});
  // pyramid_beta reaches the policy.
  PolicyOptions steep = ratio_options(0.2), flat = ratio_options(0.2);
  steep.params.set("pyramid_beta", 20.0);
  flat.params.set("pyramid_beta", 1.0);
  const SequenceShape five = test::sequence_shape(200, 0, 8, 4, 5);
  CHECK(make_policy("pyramidkv", steep)->layer_budget(4, five).capacity <
        make_policy("pyramidkv", flat)->layer_budget(4, five).capacity);
}
