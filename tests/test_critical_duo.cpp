// CriticalKV / CriticalAdaKV (critical+POLICY, critical+ada+POLICY) and DuoAttention
// (duo-attention), model-free: kept sets against a brute force in double of the papers'
// rules (kvpress's two stages; DuoAttention's streaming heads from a pattern file), the
// two-stage scores in float64, the budget at every step, layer and head, the refusals
// (inner policies CriticalKV cannot weigh, pattern files of another shape or not numbers),
// and sim == decode on stories260K.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <fstream>
#include <numeric>
#include <string>
#include <vector>

#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "policies/critical_kv.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/policy_drive.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

using CritPositions = std::vector<int>;

// A value in [-1, 1) from a few integers (splitmix64).
double crit_random(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t x = test::splitmix_bits(a, b, c, d);
  return static_cast<double>(x >> 40) / static_cast<double>(1ULL << 23) - 1.0;
}

// The made-up cache: keys and values per (KV head, position), attention per (query head,
// query, key position) before normalisation over the query's slots.
struct CritTokens {
  int seed, head_dim;
  std::vector<float> vector(int part, int kv, int position) const {
    std::vector<float> v(head_dim);
    for (int c = 0; c < head_dim; ++c) v[c] = static_cast<float>(crit_random(seed * 2 + part, kv, position, c));
    return v;
  }
  double value_l1(int kv, int position) const {
    double sum = 0;
    for (float x : vector(1, kv, position)) sum += std::fabs(static_cast<double>(x));
    return sum;
  }
  // Sharper for later query heads, so that the KV heads' scores spread differently.
  float attention_weight(int q_head, int query, int position) const {
    return static_cast<float>(std::exp((1 + q_head) * crit_random(seed + 7, q_head, query, position)));
  }
};

test::LayerTrace crit_drive(const Policy& policy, const SequenceShape& shape, const CritTokens& tokens,
                            int layer = 0) {
  LayerStates states = policy.as_realisable()->make_layer_states(layer, shape);
  std::vector<float> key, value;
  return test::drive_layer_tokens(
      states, shape,
      [&](int h, int i, const CritPositions& positions, const std::vector<char>*, float* out) {
        double sum = 0;
        for (size_t s = 0; s < positions.size(); ++s) sum += out[s] = tokens.attention_weight(h, i, positions[s]);
        for (size_t s = 0; s < positions.size(); ++s) out[s] = static_cast<float>(out[s] / sum);
      },
      [&](int kv, int position) {
        key = tokens.vector(0, kv, position);
        value = tokens.vector(1, kv, position);
        double squares = 0;
        for (float x : key) squares += static_cast<double>(x) * x;
        return NewToken{static_cast<float>(std::sqrt(squares)), key.data(), value.data()};
      });
}

// H2O's score after one prefill of n tokens (no eviction before): each position's
// attention summed over the queries, averaged over the KV head's query group.
std::vector<double> crit_h2o_scores(const CritTokens& tokens, int kv, int group, int n) {
  std::vector<double> scores(n, 0.0);
  for (int i = 0; i < n; ++i)
    for (int g = 0; g < group; ++g) {
      const int q = kv * group + g;
      double sum = 0;
      for (int p = 0; p <= i; ++p) sum += tokens.attention_weight(q, i, p);
      for (int p = 0; p <= i; ++p) scores[p] += tokens.attention_weight(q, i, p) / sum / group;
    }
  return scores;
}

// The k best of `among` by score (ties: the later position), ascending.
CritPositions crit_best(CritPositions among, const std::vector<double>& scores, int k) {
  std::stable_sort(among.begin(), among.end(),
                   [&](int a, int b) { return scores[a] != scores[b] ? scores[a] > scores[b] : a > b; });
  among.resize(std::max(0, std::min<int>(k, among.size())));
  std::sort(among.begin(), among.end());
  return among;
}

// kvpress's two stages over positions 0 .. n-1 with a budget of `capacity` (sink and recent
// windows as `budget` has them): windows, then the stage-1 best base scores, then the best
// (base + eps) * ||v||_1; `sign` -1 ranks stage 2 by the negated score.
CritPositions crit_two_stages(const std::vector<double>& base, const std::vector<double>& norms, const Budget& budget,
                              int capacity, double ratio, double sign = 1) {
  const int n = static_cast<int>(base.size());
  const int n_sink = std::min(budget.sink, n), n_recent = std::min(budget.recent, n - n_sink);
  CritPositions kept, candidates;
  for (int p = 0; p < n; ++p) (p < n_sink || p >= n - n_recent ? kept : candidates).push_back(p);
  const int heavy = std::min<int>(std::max(0, capacity - n_sink - n_recent), candidates.size());
  const int first = std::min(heavy, std::max(0, static_cast<int>(ratio * capacity) - n_sink - n_recent));
  const CritPositions stage1 = crit_best(candidates, base, first);
  CritPositions rest;
  for (int p : candidates)
    if (!std::binary_search(stage1.begin(), stage1.end(), p)) rest.push_back(p);
  std::vector<double> second(n);
  for (int p = 0; p < n; ++p) second[p] = sign * (base[p] + kCriticalEpsilon) * norms[p];
  const CritPositions stage2 = crit_best(rest, second, heavy - first);
  kept.insert(kept.end(), stage1.begin(), stage1.end());
  kept.insert(kept.end(), stage2.begin(), stage2.end());
  std::sort(kept.begin(), kept.end());
  return kept;
}

PolicyOptions crit_tokens_budget(int tokens) {
  PolicyOptions o;
  o.budget.tokens = tokens;
  return o;
}

constexpr int kCritTokens = 24;

// Writes `text` to a file `name` in a fresh temporary folder of its own (temp_dir empties
// a folder it is asked for again); returns its path.
std::string crit_write(const std::string& name, const std::string& text) {
  static int written = 0;
  const std::string path = test::temp_dir("critical_duo_" + std::to_string(written++)) + "/" + name;
  std::ofstream(path, std::ios::binary) << text;
  return path;
}

PolicyOptions duo_options(const std::string& pattern, double head_ratio, int tokens = 10, int sinks = 2) {
  PolicyOptions o = crit_tokens_budget(tokens);
  o.params.set("pattern_file", pattern);
  o.params.set("head_compression_ratio", head_ratio);
  o.params.set("n_sink", sinks);
  return o;
}

// [layer][KV head] -> streaming (holds fewer than all tokens at the end of the trace).
std::vector<std::vector<int>> duo_streaming(const Policy& policy, const SequenceShape& shape) {
  std::vector<std::vector<int>> streaming(shape.n_layers, std::vector<int>(shape.n_kv_heads));
  for (int layer = 0; layer < shape.n_layers; ++layer) {
    const auto trace = crit_drive(policy, shape, CritTokens{1, shape.head_dim}, layer);
    for (int h = 0; h < shape.n_kv_heads; ++h)
      streaming[layer][h] = static_cast<int>(trace.positions.back()[h].size()) < shape.length;
  }
  return streaming;
}

}  // namespace

TEST_CASE("critical_scores: stage 1 at +inf, stage 2 (s + eps) * ||v||_1 in float64", "[policies][critical]") {
  const int n = 12;
  std::vector<int> positions(n);
  std::iota(positions.begin(), positions.end(), 0);
  std::vector<float> base(n), norms(n);
  for (int s = 0; s < n; ++s) {
    base[s] = static_cast<float>(0.5 + 0.5 * crit_random(3, 1, s, 0));
    norms[s] = static_cast<float>(2.0 + crit_random(3, 2, s, 0));
  }
  Budget budget;
  budget.capacity = 8;
  budget.sink = 1;
  budget.recent = 1;
  std::vector<float> scores;
  critical_scores(positions, base.data(), norms, budget, 0.5, &scores);
  // Stage 1: int(0.5 x 8) = 4 places, 2 taken by the windows: the 2 best base scores of 1 .. 10.
  std::vector<double> base64(base.begin(), base.end());
  CritPositions middle(n - 2);
  std::iota(middle.begin(), middle.end(), 1);
  const CritPositions stage1 = crit_best(middle, base64, 2);
  for (int s = 0; s < n; ++s) {
    INFO("slot " << s);
    if (std::binary_search(stage1.begin(), stage1.end(), s)) {
      CHECK(std::isinf(scores[s]));
    } else {
      const double expected = (static_cast<double>(base[s]) + 1e-4) * static_cast<double>(norms[s]);
      CHECK(std::fabs(scores[s] - expected) <= 1e-6 * std::fabs(expected));
    }
  }
  // first_stage_ratio 0: no slot at +inf; 1: every candidate place goes to stage 1.
  critical_scores(positions, base.data(), norms, budget, 0.0, &scores);
  CHECK(std::none_of(scores.begin(), scores.end(), [](float x) { return std::isinf(x); }));
  critical_scores(positions, base.data(), norms, budget, 1.0, &scores);
  CHECK(std::count_if(scores.begin(), scores.end(), [](float x) { return std::isinf(x); }) == 6);
}

TEST_CASE("critical+h2o keeps the windows, the stage-1 best H2O scores and the best score x value norm",
          "[policies][critical]") {
  const int n_kv = 3, group = 2, head_dim = 6, budget_tokens = 12;
  const CritTokens tokens{4, head_dim};
  const SequenceShape shape = test::sequence_shape(kCritTokens, kCritTokens, n_kv * group, n_kv, 1, head_dim);
  for (const double heavy_share : {1.0, 0.75})
    for (const double ratio : {0.5, 0.25}) {
      PolicyOptions o = crit_tokens_budget(budget_tokens);
      o.budget.heavy_share = heavy_share;
      o.params.set("first_stage_ratio", ratio);
      auto policy = make_policy("critical+h2o", o);
      CHECK(policy->name() == "critical+h2o");
      const Budget budget = policy->layer_budget(0, shape);
      const auto trace = crit_drive(*policy, shape, tokens);
      auto alone = make_policy("h2o", o);
      const auto h2o_trace = crit_drive(*alone, shape, tokens);
      int differs_from_h2o = 0;
      for (int kv = 0; kv < n_kv; ++kv) {
        const auto base = crit_h2o_scores(tokens, kv, group, kCritTokens);
        std::vector<double> norms(kCritTokens);
        for (int p = 0; p < kCritTokens; ++p) norms[p] = tokens.value_l1(kv, p);
        const CritPositions expected = crit_two_stages(base, norms, budget, budget.capacity, ratio);
        INFO("heavy share " << heavy_share << " first stage " << ratio << " KV head " << kv);
        CHECK(trace.positions.back()[kv] == expected);
        // The case tells stage 2's score from its negation.
        CHECK(crit_two_stages(base, norms, budget, budget.capacity, ratio, -1) != expected);
        differs_from_h2o += h2o_trace.positions.back()[kv] != expected;
      }
      CHECK(differs_from_h2o > 0);
    }
  // A first stage of the whole budget is the inner policy alone.
  PolicyOptions whole = crit_tokens_budget(budget_tokens);
  whole.params.set("first_stage_ratio", 1.0);
  CHECK(crit_drive(*make_policy("critical+h2o", whole), shape, tokens).positions ==
        crit_drive(*make_policy("h2o", whole), shape, tokens).positions);
}

TEST_CASE("critical+ada+h2o: Ada-KV's count per head from H2O's scores, then each head's two stages",
          "[policies][critical]") {
  const int n_kv = 3, group = 2, head_dim = 5, budget_tokens = 10;
  const CritTokens tokens{8, head_dim};
  const SequenceShape shape = test::sequence_shape(kCritTokens, kCritTokens, n_kv * group, n_kv, 1, head_dim);
  PolicyOptions o = crit_tokens_budget(budget_tokens);
  o.budget.heavy_share = 0.8;
  o.params.set("ada_safeguard", 0.2);
  auto policy = make_policy("critical+ada+h2o", o);
  CHECK(policy->name() == "critical+ada+h2o");
  const Budget budget = policy->layer_budget(0, shape);
  const auto trace = crit_drive(*policy, shape, tokens);
  // Ada-KV's allocation by brute force: windows, then each head's guard, then the layer's best.
  struct Candidate {
    int tier;
    double score;
    int position, head;
  };
  const auto better = [](const Candidate& a, const Candidate& b) {
    if (a.tier != b.tier) return a.tier > b.tier;
    if (a.score != b.score) return a.score > b.score;
    if (a.position != b.position) return a.position > b.position;
    return a.head < b.head;
  };
  std::vector<Candidate> all;
  std::vector<std::vector<double>> base(n_kv), norms(n_kv, std::vector<double>(kCritTokens));
  const int guard = static_cast<int>(0.2 * budget.capacity);
  for (int kv = 0; kv < n_kv; ++kv) {
    base[kv] = crit_h2o_scores(tokens, kv, group, kCritTokens);
    for (int p = 0; p < kCritTokens; ++p) norms[kv][p] = tokens.value_l1(kv, p);
    std::vector<Candidate> head;
    for (int p = 0; p < kCritTokens; ++p)
      head.push_back({p < budget.sink || p >= kCritTokens - budget.recent ? 2 : 0, base[kv][p], p, kv});
    std::sort(head.begin(), head.end(), better);
    for (int i = 0; i < guard; ++i) head[i].tier = std::max(head[i].tier, 1);
    all.insert(all.end(), head.begin(), head.end());
  }
  std::sort(all.begin(), all.end(), better);
  std::vector<int> counts(n_kv, 0);
  for (int i = 0; i < n_kv * budget.capacity; ++i) counts[all[i].head]++;
  CHECK(*std::min_element(counts.begin(), counts.end()) != *std::max_element(counts.begin(), counts.end()));
  int total = 0;
  for (int kv = 0; kv < n_kv; ++kv) {
    const CritPositions expected = crit_two_stages(base[kv], norms[kv], budget, counts[kv], 0.5);
    INFO("KV head " << kv << " count " << counts[kv]);
    CHECK(trace.positions.back()[kv] == expected);
    CHECK(crit_two_stages(base[kv], norms[kv], budget, counts[kv], 0.5, -1) != expected);
    total += static_cast<int>(trace.positions.back()[kv].size());
  }
  CHECK(total == n_kv * budget.capacity);
  // With the whole budget in stage 1 it is ada+h2o.
  o.params.set("first_stage_ratio", 1.0);
  CHECK(crit_drive(*make_policy("critical+ada+h2o", o), shape, tokens).positions ==
        crit_drive(*make_policy("ada+h2o", o), shape, tokens).positions);
}

TEST_CASE("critical+ wraps scored policies whose heads decide alone, and refuses the others",
          "[policies][critical]") {
  const PolicyOptions o = crit_tokens_budget(8);
  auto snap = make_policy("critical+snapkv", o);
  std::vector<std::string> keys;
  for (const ParamSpec* p : snap->parameters()) keys.push_back(p->key());
  CHECK(std::find(keys.begin(), keys.end(), "first_stage_ratio") != keys.end());
  CHECK(std::find(keys.begin(), keys.end(), "window") != keys.end());
  CHECK(std::find(keys.begin(), keys.end(), "ada_safeguard") == keys.end());
  std::vector<std::string> ada_keys;
  for (const ParamSpec* p : make_policy("critical+ada+snapkv", o)->parameters()) ada_keys.push_back(p->key());
  CHECK(std::find(ada_keys.begin(), ada_keys.end(), "ada_safeguard") != ada_keys.end());
  CHECK(snap->as_realisable()->token_vectors() == TokenVectors::KeysAndValues);
  CHECK(make_policy("critical+pyramidkv", o)->layer_budget(1, test::sequence_shape(100, 0, 2, 1, 4)).capacity ==
        make_policy("pyramidkv", o)->layer_budget(1, test::sequence_shape(100, 0, 2, 1, 4)).capacity);
  for (const std::string bad : {"critical+full", "critical+sparse-fixed", "critical+h2o-paper", "critical+ada+full",
                                "chunk+critical+h2o", "ada+critical+h2o", "critical+h2o+sparse-strided"})
    CHECK_THAT(test::error_of([&] { make_policy(bad, o); }), Catch::Contains("not a scored eviction policy"));
  for (const std::string shared : {"critical+tova", "critical+chunk+h2o", "critical+ada+tova"})
    CHECK_THAT(test::error_of([&] { make_policy(shared, o); }), Catch::Contains("decides once for all heads"));
  CHECK_THAT(policy_help(), Catch::Contains("critical+SCORED"));
}

TEST_CASE("critical+, critical+ada+ and duo-attention hold the budget at every step, layer and head",
          "[policies][critical][duo]") {
  const SequenceShape shape = test::sequence_shape(60, 0, 4, 2, 3, 6);
  const std::string pattern = crit_write("pattern.tsv", "0.9\t0.1\n0.4\t0.8\n0.2\t0.6\n");
  PolicyOptions o;
  o.budget.ratio = 0.25;
  o.params.set("window", 4);
  o.params.set("pattern_file", pattern);
  const CritTokens tokens{9, 6};
  for (const std::string name :
       {"critical+h2o", "critical+snapkv", "critical+knorm", "critical+ada+h2o", "critical+ada+snapkv",
        "duo-attention"}) {
    PolicyOptions options = o;
    if (name != "duo-attention") options.params.clear(*find_policy_param("pattern_file"));
    auto policy = make_policy(name, options);
    policy->validate(shape);
    int streaming_heads = 0;
    for (int layer = 0; layer < shape.n_layers; ++layer) {
      const Budget budget = policy->layer_budget(layer, shape);
      REQUIRE(budget.capacity == 15);
      const auto trace = crit_drive(*policy, shape, tokens, layer);
      for (int i = 0; i < shape.length; ++i) {
        int layer_total = 0;
        for (int h = 0; h < shape.n_kv_heads; ++h) {
          const auto& kept = trace.positions[i][h];
          INFO(name << " layer " << layer << " step " << i << " head " << h);
          layer_total += static_cast<int>(kept.size());
          REQUIRE(std::is_sorted(kept.begin(), kept.end()));
          REQUIRE(std::adjacent_find(kept.begin(), kept.end()) == kept.end());
          for (int p = 0; p < std::min(budget.sink, i + 1); ++p)
            REQUIRE(std::binary_search(kept.begin(), kept.end(), p));
          if (name == "duo-attention") {
            // A streaming head holds the budget, a retrieval head every token.
            const bool streaming = trace.positions.back()[h].size() < static_cast<size_t>(shape.length);
            REQUIRE(static_cast<int>(kept.size()) == (streaming ? std::min(i + 1, budget.capacity) : i + 1));
            if (i + 1 == shape.length) streaming_heads += streaming;
          } else if (name.find("ada+") == std::string::npos) {
            REQUIRE(static_cast<int>(kept.size()) == std::min(i + 1, budget.capacity));
          }
        }
        INFO(name << " layer " << layer << " step " << i);
        if (name != "duo-attention") REQUIRE(layer_total == shape.n_kv_heads * std::min(i + 1, budget.capacity));
      }
    }
    if (name == "duo-attention") CHECK(streaming_heads == 3);
  }
}

TEST_CASE("duo-attention makes the lowest-scoring heads streaming: sinks and the newest tokens",
          "[policies][duo]") {
  // 3 layers x 2 KV heads; at 0.5, the 3 lowest (0.1, 0.2, 0.4) stream.
  const SequenceShape shape = test::sequence_shape(30, 0, 4, 2, 3, 4);
  const std::string tsv = crit_write("heads.tsv", "0.9\t0.1\n0.4\t0.8\n0.2\t0.6\n");
  auto policy = make_policy("duo-attention", duo_options(tsv, 0.5));
  const std::vector<std::vector<int>> expected = {{0, 1}, {1, 0}, {1, 0}};
  CHECK(duo_streaming(*policy, shape) == expected);
  // Negated scores (1 - s) stream the other heads.
  const std::string negated = crit_write("negated.tsv", "0.1\t0.9\n0.6\t0.2\n0.8\t0.4\n");
  CHECK(duo_streaming(*make_policy("duo-attention", duo_options(negated, 0.5)), shape) ==
        std::vector<std::vector<int>>{{1, 0}, {0, 1}, {0, 1}});
  // The kept positions: a streaming head, 2 sinks and the 8 newest; a retrieval head, all.
  const auto trace = crit_drive(*policy, shape, CritTokens{2, 4}, 0);
  CritPositions all(30), streamed = {0, 1};
  std::iota(all.begin(), all.end(), 0);
  for (int p = 22; p < 30; ++p) streamed.push_back(p);
  CHECK(trace.positions.back()[0] == all);
  CHECK(trace.positions.back()[1] == streamed);
  // The same pattern as CSV (CRLF, a blank line) and as JSON.
  const std::string csv = crit_write("heads.csv", "0.9,0.1\r\n0.4, 0.8\r\n\r\n0.2,0.6\r\n");
  const std::string json = crit_write("heads.json", " [[0.9, 0.1], [0.4, 0.8], [0.2, 0.6]]\n");
  for (const std::string& file : {csv, json}) {
    INFO(file);
    CHECK(duo_streaming(*make_policy("duo-attention", duo_options(file, 0.5)), shape) == expected);
  }
  // round(ratio x 6) heads stream, halves to even as kvpress's round: 0.25 -> 2, 0.75 -> 4.
  const auto count = [&](double ratio) {
    int n = 0;
    for (const auto& layer : duo_streaming(*make_policy("duo-attention", duo_options(tsv, ratio)), shape))
      n += std::accumulate(layer.begin(), layer.end(), 0);
    return n;
  };
  CHECK(count(0.0) == 0);
  CHECK(count(0.25) == 2);
  CHECK(count(0.75) == 4);
  CHECK(count(1.0) == 6);
  // Every head streaming is streamingllm with the same sinks and budget.
  PolicyOptions stream = crit_tokens_budget(10);
  stream.params.set("n_sink", 2);
  for (int layer = 0; layer < 3; ++layer)
    CHECK(crit_drive(*make_policy("duo-attention", duo_options(tsv, 1.0)), shape, CritTokens{2, 4}, layer).positions ==
          crit_drive(*make_policy("streamingllm", stream), shape, CritTokens{2, 4}, layer).positions);
  // Scores clip to [0, 1] (DuoAttention's loader): -1 and -3 tie at 0, the earlier head streams.
  const std::string clipped = crit_write("clipped.tsv", "-1\t-3\n0.5\t0.5\n0.5\t0.5\n");
  CHECK(duo_streaming(*make_policy("duo-attention", duo_options(clipped, 1.0 / 6)), shape) ==
        std::vector<std::vector<int>>{{1, 0}, {0, 0}, {0, 0}});
}

TEST_CASE("duo-attention refuses a pattern file it cannot use, naming the file", "[policies][duo]") {
  const SequenceShape shape = test::sequence_shape(30, 0, 4, 2, 3, 4);
  const auto refusal = [&](const std::string& name, const std::string& text) {
    const std::string path = crit_write(name, text);
    const std::string message = test::error_of([&] {
      auto policy = make_policy("duo-attention", duo_options(path, 0.5));
      policy->validate(shape);
      policy->as_realisable()->make_layer_states(0, shape);
    });
    INFO(message);
    CHECK_THAT(message, Catch::Contains("pattern_file \"" + path + "\""));
    CHECK(message.find('\n') == std::string::npos);
    return message;
  };
  CHECK_THAT(refusal("two_layers.tsv", "0.1\t0.2\n0.3\t0.4\n"), Catch::Contains("2 layers x 2 KV heads, the model has 3 x 2"));
  CHECK_THAT(refusal("three_heads.csv", "0.1,0.2,0.3\n0.1,0.2,0.3\n0.1,0.2,0.3\n"),
             Catch::Contains("3 layers x 3 KV heads"));
  CHECK_THAT(refusal("word.tsv", "0.1\t0.2\n0.3\tabc\n0.5\t0.6\n"), Catch::Contains("line 2, field 2: \"abc\""));
  CHECK_THAT(refusal("nan.tsv", "0.1\tnan\n0.3\t0.4\n0.5\t0.6\n"), Catch::Contains("\"nan\" is not a finite number"));
  CHECK_THAT(refusal("empty_field.csv", "0.1,\n0.3,0.4\n0.5,0.6\n"), Catch::Contains("line 1, field 2"));
  CHECK_THAT(refusal("ragged.tsv", "0.1\t0.2\n0.3\n0.5\t0.6\n"), Catch::Contains("layer 1 has 1 head scores"));
  CHECK_THAT(refusal("empty.tsv", "\n\n"), Catch::Contains("no head scores"));
  CHECK_THAT(refusal("string.json", "[[0.1, \"x\"], [0.3, 0.4], [0.5, 0.6]]"), Catch::Contains("[0][1]"));
  CHECK_THAT(refusal("object.json", "[{\"a\": 1}]"), Catch::Contains("layer 0 is not an array"));
  CHECK_THAT(refusal("broken.json", "[[0.1, 0.2]"), Catch::Contains("malformed JSON"));
  const std::string missing = test::temp_dir("critical_duo_missing") + "/absent.tsv";
  CHECK_THAT(test::error_of([&] { make_policy("duo-attention", duo_options(missing, 0.5)); }),
             Catch::Contains("pattern_file \"" + missing + "\": cannot open file"));
  // A byte budget would size the retrieval heads too.
  PolicyOptions memory = duo_options(crit_write("ok.tsv", "0.1\t0.2\n0.3\t0.4\n0.5\t0.6\n"), 0.5);
  memory.budget = BudgetSpec{};
  memory.kv_quant.memory = 0.5;
  CHECK_THAT(test::error_of([&] { make_policy("duo-attention", memory); }),
             Catch::Contains("--kv-memory") && Catch::Contains("retrieval heads keep every token"));
  // No file at all: the flag is named.
  CHECK_THAT(test::error_of([&] { make_policy("duo-attention", crit_tokens_budget(8))->validate(shape); }),
             Catch::Contains("duo-attention needs --pattern-file"));
}

TEST_CASE("critical+, critical+ada+ and duo-attention: sim mode and decode mode agree on stories260K",
          "[policies][critical][duo][sim-decode]") {
  const auto tokens = test::golden_tokens();
  const auto full = score_sequence(test::stories(), *make_policy("full", {}), Mode::Sim, tokens);
  const ArchSpec& arch = test::stories().arch();
  std::string pattern;
  for (int64_t l = 0; l < arch.n_layers; ++l)
    for (int64_t h = 0; h < arch.n_kv_heads; ++h)
      pattern += std::to_string(0.5 + 0.5 * crit_random(5, l, h, 0)) + (h + 1 < arch.n_kv_heads ? "\t" : "\n");
  const std::string pattern_file = crit_write("stories.tsv", pattern);
  const std::vector<std::pair<std::string, double>> tolerances = {{"float64", 1e-9}, {"float32", 5e-5}};
  for (const auto& [dtype, tolerance] : tolerances) {
    ModelOptions options = test::model_options();
    options.dtype = dtype;
    auto model = Model::load(test::data("models/stories260K-hf"), options);
    for (const std::string name : {"critical+h2o", "critical+snapkv", "critical+ada+snapkv", "duo-attention"})
      for (double budget : {0.2, 0.5})
        for (int prefill : {0, static_cast<int>(tokens.size()) / 2}) {
          PolicyOptions o;
          o.budget.ratio = budget;
          if (name == "duo-attention") o.params.set("pattern_file", pattern_file);
          else o.params.set("window", 8);
          auto policy = make_policy(name, o);
          const auto sim = score_sequence(*model, *policy, Mode::Sim, tokens, prefill);
          const auto decode = score_sequence(*model, *policy, Mode::Decode, tokens, prefill);
          INFO(dtype << " policy " << name << " budget " << budget << " prefill " << prefill);
          CHECK(test::max_diff(sim.next_token_logprob, decode.next_token_logprob) < tolerance);
          CHECK(sim.kv.kept_per_layer == decode.kv.kept_per_layer);
          CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
          if (dtype == "float32") CHECK(test::max_diff(sim.next_token_logprob, full.next_token_logprob) > 1e-3);
        }
  }
}
