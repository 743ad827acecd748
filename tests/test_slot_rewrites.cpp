// Policies that rewrite what a kept slot holds (LayerState::take_rewrites): ThinK's
// key-channel pruning (think+POLICY) and CaM's value merging (cam+POLICY). Model-free:
// ThinK's zeroed channels against a float64 hand computation of the paper's channel score
// on random keys and queries; CaM's merges against a hand computation of the merge
// probability (cumulative attention in float64) and the averaged values at every
// compression, failing when the probability is negated; the token policy's kept set (so
// its budget) untouched at every step, layer and head. On the models: sim == decode (the
// rewrites reach sim mode's later queries as they reach the decode cache's rows), the
// bytes a pruned channel saves, and one-line errors where they cannot run.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "harness/runtime/attention.h"
#include "harness/runtime/device_policy.h"
#include "harness/runtime/policy_driver.h"
#include "harness/runtime/scorer.h"
#include "policies/cam.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/policy_drive.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

// A value in [-1, 1) from a few integers (splitmix64).
float rewrite_random(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t x = test::splitmix_bits(a, b, c, d);
  return static_cast<float>(x >> 40) / static_cast<float>(1ULL << 23) - 1.0f;
}

// Random keys, values and queries per (KV head, position); part 0 keys, 1 values, 2 the
// group's queries ([group][head_dim], query head kv * group + j).
struct RewriteTokens {
  int seed, head_dim, group;
  std::vector<float> key(int kv, int position) const { return vector(0, kv, position); }
  std::vector<float> value(int kv, int position) const { return vector(1, kv, position); }
  std::vector<float> queries(int kv, int position) const {
    std::vector<float> q(static_cast<size_t>(group) * head_dim);
    for (int j = 0; j < group; ++j)
      for (int c = 0; c < head_dim; ++c) q[j * head_dim + c] = rewrite_random(seed * 3 + 2, kv * group + j, position, c);
    return q;
  }
  std::vector<float> vector(int part, int kv, int position) const {
    std::vector<float> v(head_dim);
    // Channel c's scale grows with c, so the channels' magnitudes differ as a model's do.
    for (int c = 0; c < head_dim; ++c) v[c] = (0.5f + 0.25f * c) * rewrite_random(seed * 3 + part, kv, position, c);
    return v;
  }
};

PolicyOptions rewrite_budget(int tokens) {
  PolicyOptions o;
  o.budget.tokens = tokens;
  return o;
}

// Drives one layer's states over shape.length tokens with made-up attention and the
// random vectors.
test::LayerTrace rewrite_drive(LayerStates& states, const SequenceShape& shape, const RewriteTokens& tokens) {
  std::vector<float> key, value, queries;
  return test::drive_layer_tokens(
      states, shape,
      [&](int h, int i, const std::vector<int>& positions, const std::vector<char>*, float* out) {
        double sum = 0;
        for (size_t s = 0; s < positions.size(); ++s) sum += out[s] = 1.0f + rewrite_random(7, h, i, positions[s]);
        for (size_t s = 0; s < positions.size(); ++s) out[s] = static_cast<float>(out[s] / sum);
      },
      [&](int kv, int position) {
        key = tokens.key(kv, position);
        value = tokens.value(kv, position);
        queries = tokens.queries(kv, position);
        double squares = 0;
        for (float x : key) squares += static_cast<double>(x) * x;
        return NewToken{static_cast<float>(std::sqrt(squares)), key.data(), value.data(), queries.data()};
      });
}

// ThinK's channel scores of one KV head, in float64 from the paper's criterion as kvpress
// computes it: mean over the window's queries and the group of q_c^2, times the mean over
// the kept slots of k_c^2.
std::vector<double> think_channel_scores(const RewriteTokens& tokens, int kv, const std::vector<int>& kept, int prefill,
                                         int window) {
  const int d = tokens.head_dim, g = tokens.group, w = std::min(window, prefill);
  std::vector<double> query_mean(d, 0.0), key_mean(d, 0.0), scores(d);
  for (int p = prefill - w; p < prefill; ++p) {
    const auto q = tokens.queries(kv, p);
    for (int j = 0; j < g; ++j)
      for (int c = 0; c < d; ++c) query_mean[c] += static_cast<double>(q[j * d + c]) * q[j * d + c] / (w * g);
  }
  for (int position : kept) {
    const auto k = tokens.key(kv, position);
    for (int c = 0; c < d; ++c) key_mean[c] += static_cast<double>(k[c]) * k[c] / kept.size();
  }
  for (int c = 0; c < d; ++c) scores[c] = query_mean[c] * key_mean[c];
  return scores;
}

// The `count` channels of lowest score (ties: the lower channel), ascending.
std::vector<int> lowest_channels(const std::vector<double>& scores, int count) {
  std::vector<int> order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return scores[a] < scores[b]; });
  order.resize(count);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<double> rewrite_negated(std::vector<double> scores) {
  for (double& s : scores) s = -s;
  return scores;
}

}  // namespace

TEST_CASE("think+: the key channels it zeroes are those of lowest query-key magnitude (float64 hand computation)",
          "[policies][rewrites][think]") {
  const int prefill = 20, budget = 8;
  for (const int n_kv : {1, 2})
    for (const int head_dim : {8, 10})
      for (const double ratio : {0.5, 0.3})
        for (const int window : {4, 32})
          for (const std::string inner : {"knorm", "h2o", "keydiff"}) {
            PolicyOptions o = rewrite_budget(budget);
            o.params.set("key_channel_compression_ratio", ratio);
            o.params.set("think_window", window);
            auto policy = make_policy("think+" + inner, o);
            auto alone = make_policy(inner, rewrite_budget(budget));
            const SequenceShape shape = test::sequence_shape(prefill, prefill, 2 * n_kv, n_kv, 1, head_dim);
            const RewriteTokens tokens{head_dim + n_kv, head_dim, 2};
            LayerStates states = policy->as_realisable()->make_layer_states(0, shape);
            LayerStates alone_states = alone->as_realisable()->make_layer_states(0, shape);
            const auto trace = rewrite_drive(states, shape, tokens);
            const auto alone_trace = rewrite_drive(alone_states, shape, tokens);
            INFO("think+" << inner << " n_kv " << n_kv << " head_dim " << head_dim << " ratio " << ratio << " window "
                          << window);
            // The token policy chooses as it does alone.
            CHECK(trace.positions == alone_trace.positions);
            const int pruned = static_cast<int>(head_dim * ratio);
            for (int kv = 0; kv < n_kv; ++kv) {
              const std::vector<int>& kept = states.heads[kv]->positions();
              REQUIRE(static_cast<int>(kept.size()) == budget);
              SlotRewrites rewrites;
              REQUIRE(states.heads[kv]->take_rewrites(&rewrites));
              std::vector<int> all_slots(kept.size());
              std::iota(all_slots.begin(), all_slots.end(), 0);
              CHECK(rewrites.key_slots == all_slots);
              CHECK(rewrites.value_slots.empty());
              const auto scores = think_channel_scores(tokens, kv, kept, prefill, window);
              CHECK(rewrites.zeroed_channels == lowest_channels(scores, pruned));
              CHECK(rewrites.zeroed_channels != lowest_channels(rewrite_negated(scores), pruned));
              // Taken once: the pruning happens at the prefill's end only.
              SlotRewrites again;
              CHECK_FALSE(states.heads[kv]->take_rewrites(&again));
            }
          }
}

TEST_CASE("think+: the token policy's budget holds at every step, layer and head, and later keys stay whole",
          "[policies][rewrites][think]") {
  const int length = 40, prefill = 16, n_kv = 2, head_dim = 8;
  for (const std::string inner : {"h2o", "snapkv", "pyramidkv", "streamingllm", "keydiff", "ada+snapkv", "chunk+h2o"}) {
    PolicyOptions o;
    o.budget.ratio = 0.3;
    o.params.set("window", 4);
    o.params.set("chunk_length", 3);
    auto policy = make_policy("think+" + inner, o);
    auto alone = make_policy(inner, o);
    for (int layer : {0, 2}) {
      const SequenceShape shape = test::sequence_shape(length, prefill, 2 * n_kv, n_kv, 3, head_dim);
      const RewriteTokens tokens{layer + 5, head_dim, 2};
      LayerStates states = policy->as_realisable()->make_layer_states(layer, shape);
      LayerStates alone_states = alone->as_realisable()->make_layer_states(layer, shape);
      const auto trace = rewrite_drive(states, shape, tokens);
      const auto alone_trace = rewrite_drive(alone_states, shape, tokens);
      INFO("think+" << inner << " layer " << layer);
      CHECK(trace.positions == alone_trace.positions);
      const Budget budget = policy->layer_budget(layer, shape);
      for (int i = prefill - 1; i < length; ++i) {
        int total = 0;
        for (int kv = 0; kv < n_kv; ++kv) {
          total += static_cast<int>(trace.positions[i][kv].size());
          if (inner.rfind("ada+", 0) != 0) CHECK(static_cast<int>(trace.positions[i][kv].size()) <= budget.capacity);
        }
        CHECK(total <= n_kv * budget.capacity);
      }
      // One rewrite each, made at the prefill's end: the keys of the decode steps stay whole.
      for (int kv = 0; kv < n_kv; ++kv) {
        SlotRewrites rewrites;
        CHECK(states.heads[kv]->take_rewrites(&rewrites));
        CHECK(static_cast<int>(rewrites.zeroed_channels.size()) == head_dim * 5 / 10);
        CHECK_FALSE(states.heads[kv]->take_rewrites(&rewrites));
      }
    }
  }
}

TEST_CASE("the driver refuses a rewrite inside a block of queries, and maps slots to cache rows",
          "[policies][rewrites][think]") {
  const int prefill = 6, head_dim = 4;
  const SequenceShape shape = test::sequence_shape(8, prefill, 2, 1, 1, head_dim);
  auto policy = make_policy("think+knorm", rewrite_budget(3));
  std::vector<float> norms(8), keys(8 * head_dim), values(8 * head_dim), queries(8 * 2 * head_dim);
  // knorm keeps the smallest norms: here the newest keys, so the eviction moves rows.
  for (int i = 0; i < 8; ++i) norms[i] = 2.0f - 0.1f * i;
  for (size_t i = 0; i < keys.size(); ++i) keys[i] = values[i] = rewrite_random(1, 0, 0, i);
  for (size_t i = 0; i < queries.size(); ++i) queries[i] = rewrite_random(2, 0, 0, i);
  BlockTokens tokens(norms.data());
  tokens.keys = keys.data();
  tokens.values = values.data();
  tokens.queries = queries.data();
  tokens.head_dim = head_dim;
  tokens.group = 2;
  {
    // Sim mode's columns: one call past the prefill's end would let queries 6 and 7 read
    // keys whose channels the end of the prefill zeroed.
    PolicyDriver driver(*policy->as_realisable(), 0, shape, 0, SlotColumns::Positions);
    std::vector<float> logits(2 * 8 * 8, 0.0f);
    CHECK_THAT(test::error_of([&] { driver.rows(0, 8, 8, logits.data(), tokens); }), Catch::Contains("inside a block"));
  }
  PolicyDriver driver(*policy->as_realisable(), 0, shape, 0, SlotColumns::CacheRows);
  REQUIRE(driver.rewrites());
  std::vector<float> logits(2 * prefill * prefill, 0.0f);
  driver.rows(0, prefill, prefill, logits.data(), tokens);
  CHECK_FALSE(driver.take_moves().empty());  // 6 rows down to 3: the kept rows above 2 move
  const auto rewrites = driver.take_rewrites();
  REQUIRE(rewrites.size() == 1);
  // The kept slots' rows after the moves: 0 .. 2.
  CHECK(rewrites[0].key_columns == std::vector<int>{0, 1, 2});
  CHECK(rewrites[0].zeroed_channels.size() == 2);
  CHECK(driver.take_rewrites().empty());
  // Two K+V rows of 4 elements at the prefill's peak of 6 slots, before any was pruned.
  CHECK(driver.peak_total_elements() == 6 * 2 * head_dim);
}

TEST_CASE("think+: sim mode and decode mode agree, and the pruning changes the log-probs",
          "[policies][rewrites][think][sim-decode]") {
  struct RewriteCase {
    std::string model;
    std::vector<int> tokens;
  };
  std::vector<RewriteCase> cases = {{"models/stories260K-hf", test::golden_tokens()}};
  for (std::string name : {"tiny-random-llama3", "tiny-random-mistral"}) {
    auto golden = test::read_json(test::data("golden/tiny_models/" + name + ".json"));
    cases.push_back({"models/" + name, golden["tokens"].get<std::vector<int>>()});
  }
  // The tolerances of test_policies.cpp's sim == decode.
  for (const auto& [dtype, tolerance] : std::vector<std::pair<std::string, double>>{{"float64", 1e-9}, {"float32", 5e-5}})
    for (const auto& c : cases) {
      ModelOptions options = test::model_options();
      options.dtype = dtype;
      auto model = Model::load(test::data(c.model), options);
      const int prefill = static_cast<int>(c.tokens.size()) / 2;
      for (const std::string inner : {"h2o", "snapkv", "keydiff", "block+h2o", "ada+snapkv"})
        for (double budget : {0.2, 0.5}) {
          PolicyOptions o;
          o.budget.ratio = budget;
          o.params.set("window", 8);
          o.params.set("block_size", 7);
          o.params.set("key_channel_compression_ratio", 0.5);
          o.params.set("think_window", 8);
          auto policy = make_policy("think+" + inner, o);
          o.params = {};
          o.params.set("window", 8);
          o.params.set("block_size", 7);
          auto alone = make_policy(inner, o);
          const auto sim = score_sequence(*model, *policy, Mode::Sim, c.tokens, prefill);
          const auto decode = score_sequence(*model, *policy, Mode::Decode, c.tokens, prefill);
          INFO(c.model << " " << dtype << " think+" << inner << " budget " << budget);
          CHECK(test::max_diff(sim.next_token_logprob, decode.next_token_logprob) < tolerance);
          CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
          CHECK(sim.kv.peak_bytes == decode.kv.peak_bytes);
          CHECK(sim.kv.peak_bytes_full == decode.kv.peak_bytes_full);
          // The pruned channels reach the queries after the prefill: not the token policy's numbers.
          const auto plain = score_sequence(*model, *alone, Mode::Decode, c.tokens, prefill);
          CHECK(test::max_diff(plain.next_token_logprob, decode.next_token_logprob) > 1e-4);
          // The prefill's own queries ran before the pruning: their log-probs are the token policy's.
          std::vector<double> head(decode.next_token_logprob.begin(), decode.next_token_logprob.begin() + prefill);
          std::vector<double> plain_head(plain.next_token_logprob.begin(), plain.next_token_logprob.begin() + prefill);
          CHECK(test::max_diff(head, plain_head) == 0);
        }
    }
}

TEST_CASE("think+: a pruned key channel's bytes are not counted as held", "[policies][rewrites][think]") {
  // stories260K: 5 layers, 4 KV heads, head_dim 8. 40 tokens, a budget of all 40, a
  // prefill of 20: at the last query each head holds 40 slots, the 20 of the prefill
  // with 4 of their 8 key channels zeroed.
  auto tokens = test::golden_tokens();
  tokens.resize(40);
  PolicyOptions o = rewrite_budget(40);
  o.params.set("key_channel_compression_ratio", 0.5);
  auto think = make_policy("think+h2o", o);
  for (Mode mode : {Mode::Sim, Mode::Decode}) {
    const auto score = score_sequence(test::stories(), *think, mode, tokens, 20);
    INFO((mode == Mode::Sim ? "sim" : "decode"));
    CHECK(score.kv.peak_bytes == 5 * 4 * (40 * 2 * 8 - 20 * 4) * 2);
    CHECK(score.kv.peak_bytes_full == 5 * 4 * 40 * 2 * 8 * 2);
  }
  const auto h2o = score_sequence(test::stories(), *make_policy("h2o", rewrite_budget(40)), Mode::Decode, tokens, 20);
  CHECK(h2o.kv.peak_bytes == 5 * 4 * 40 * 2 * 8 * 2);
}

TEST_CASE("think+: refused with one line where it cannot run", "[policies][rewrites][think][errors]") {
  const auto tokens = test::golden_tokens();
  CHECK_THAT(test::error_of([] { make_policy("think+h2o-paper", rewrite_budget(8)); }),
             Catch::Contains("think+h2o-paper") && Catch::Contains("not a realisable policy that evicts"));
  CHECK_THAT(test::error_of([] { make_policy("think+full", {}); }), Catch::Contains("not a realisable policy that evicts"));
  CHECK_THAT(test::error_of([] { make_policy("think+think+h2o", rewrite_budget(8)); }), Catch::Contains("twice"));
  // The stream protocol has no prefill to prune at the end of.
  CHECK_THAT(test::error_of([&] {
               score_sequence(test::stories(), *make_policy("think+h2o", rewrite_budget(8)), Mode::Sim, tokens, 0);
             }),
             Catch::Contains("think+h2o") && Catch::Contains("stream protocol"));
  // KIVI holds the keys quantized; DMC's slots merge tokens.
  PolicyOptions kivi = rewrite_budget(8);
  kivi.kv_quant.bits = 2;
  kivi.kv_quant.group = 8;
  kivi.kv_quant.residual = 16;
  CHECK_THAT(test::error_of([&] { make_policy("think+h2o", kivi); }),
             Catch::Contains("think+h2o") && Catch::Contains("kivi"));
  CHECK_THAT(test::error_of([] { check_dmc_policy(*make_policy("think+h2o", rewrite_budget(8))); }),
             Catch::Contains("think+h2o") && Catch::Contains("DMC"));
  // No device recipe: the host path, which carries the rewrites out, runs it on any device.
  const SequenceShape shape = test::sequence_shape(40, 20, 2, 1, 1, 8);
  CHECK(DeviceScoredLayer::make(*make_policy("think+knorm", rewrite_budget(8)), 0, shape, 0) == nullptr);
  CHECK(make_policy("think+knorm", rewrite_budget(8))->as_realisable()->rewrites_slots());
  CHECK_FALSE(make_policy("knorm", rewrite_budget(8))->as_realisable()->rewrites_slots());
}

namespace {

// CaM's merges at one compression of one KV head, computed by hand: for each evicted
// position (ascending) whose draw passes p = clamp(A_i / mean of A over its window, 0, 1),
// the window's kept slot indices and v_i / m. attention: A by position (float64);
// values: the values as the cache holds them, by position.
struct CamMerge {
  int slot;
  std::vector<float> delta;
};
std::vector<CamMerge> cam_hand_merges(const std::vector<int>& before, const std::vector<int>& kept,
                                      const std::map<int, double>& attention,
                                      const std::map<int, std::vector<float>>& values, int merge_budget,
                                      uint64_t seed, int layer, int kv, bool negate, int* refused_count) {
  std::vector<CamMerge> merges;
  for (int position : before) {
    if (std::binary_search(kept.begin(), kept.end(), position)) continue;
    const int first = static_cast<int>(std::upper_bound(kept.begin(), kept.end(), position) - kept.begin());
    const int m = std::min(merge_budget, static_cast<int>(kept.size()) - first);
    if (m == 0) continue;
    double mean = 0;
    for (int t = first; t < first + m; ++t) mean += attention.at(kept[t]) / m;
    double ratio = mean > 0 ? attention.at(position) / mean : (attention.at(position) > 0 ? 1.0 : 0.0);
    if (negate) ratio = -ratio;
    const double p = std::min(1.0, std::max(0.0, ratio));
    if (!(cam_merge_draw(seed, layer, kv, position) < p)) {
      ++*refused_count;
      continue;
    }
    for (int t = first; t < first + m; ++t) {
      std::vector<float> delta(values.at(position));
      for (float& x : delta) x /= m;
      merges.push_back({t, delta});
    }
  }
  return merges;
}

}  // namespace

TEST_CASE("cam+: each evicted value merges into the kept values after it with CaM's probability (hand computation)",
          "[policies][rewrites][cam]") {
  const int length = 36, prefill = 14, n_kv = 2, group = 2, head_dim = 4;
  int merges_seen = 0, passes_refused = 0;
  for (const std::string inner : {"h2o", "keydiff", "streamingllm", "snapkv"})
    for (const int merge_budget : {1, 3, 32})
      for (const uint64_t seed : {0ULL, 11ULL})
        for (const bool negate : {false, true}) {
          PolicyOptions o = rewrite_budget(9);
          o.params.set("merge_budget", merge_budget);
          o.params.set("merge_seed", std::to_string(seed));
          o.params.set("window", 3);
          auto policy = make_policy("cam+" + inner, o);
          auto alone = make_policy(inner, o);
          const int layer = 1;
          const SequenceShape shape = test::sequence_shape(length, prefill, n_kv * group, n_kv, 2, head_dim);
          const RewriteTokens tokens{static_cast<int>(seed) + 3, head_dim, group};
          LayerStates states = policy->as_realisable()->make_layer_states(layer, shape);
          LayerStates alone_states = alone->as_realisable()->make_layer_states(layer, shape);
          INFO("cam+" << inner << " merge_budget " << merge_budget << " seed " << seed);
          bool all_match = true;
          for (int kv = 0; kv < n_kv; ++kv) {
            LayerState& state = *states.heads[kv];
            LayerState& plain = *alone_states.heads[kv];
            std::map<int, double> attention;
            std::map<int, std::vector<float>> values;
            for (int i = 0; i < length; ++i) {
              const auto key = tokens.key(kv, i), value = tokens.value(kv, i), queries = tokens.queries(kv, i);
              double squares = 0;
              for (float x : key) squares += static_cast<double>(x) * x;
              const NewToken token{static_cast<float>(std::sqrt(squares)), key.data(), value.data(), queries.data()};
              state.append(i, token);
              plain.append(i, token);
              values[i] = value;
              attention[i] = 0;
              const std::vector<int> before = state.positions();
              const int n = static_cast<int>(before.size());
              std::vector<float> probs(static_cast<size_t>(group) * n);
              for (int j = 0; j < group; ++j) {
                double sum = 0;
                for (int s = 0; s < n; ++s) sum += probs[j * n + s] = 1.0f + rewrite_random(9, kv * group + j, i, before[s]);
                for (int s = 0; s < n; ++s) probs[j * n + s] = static_cast<float>(probs[j * n + s] / sum);
              }
              for (int s = 0; s < n; ++s) {
                double sum = 0;
                for (int j = 0; j < group; ++j) sum += probs[j * n + s];
                attention[before[s]] += sum / group;
              }
              state.observe(probs.data());
              plain.observe(probs.data());
              if (i < prefill - 1) continue;
              std::vector<int> keep, plain_keep;
              const bool evicted = state.compress(&keep);
              CHECK(evicted == plain.compress(&plain_keep));
              CHECK(state.positions() == plain.positions());  // the token policy decides
              CHECK(static_cast<int>(state.positions().size()) <= 9);
              if (evicted) CHECK(keep == plain_keep);
              int refused = 0;
              const auto expected = cam_hand_merges(before, state.positions(), attention, values, merge_budget, seed,
                                                    layer, kv, negate, &refused);
              SlotRewrites rewrites;
              const bool rewrote = state.take_rewrites(&rewrites);
              std::vector<int> slots;
              std::vector<float> deltas;
              for (const CamMerge& m : expected) {
                slots.push_back(m.slot);
                deltas.insert(deltas.end(), m.delta.begin(), m.delta.end());
              }
              all_match = all_match && rewrote == !expected.empty() && rewrites.value_slots == slots &&
                          rewrites.value_deltas == deltas && rewrites.key_slots.empty();
              if (!negate) {
                merges_seen += static_cast<int>(expected.size());
                passes_refused += refused;
              }
              // The cache's values now: each kept value plus its additions summed in float32.
              const std::vector<int>& kept = state.positions();
              std::map<int, std::vector<float>> sums;
              for (const CamMerge& m : expected) {
                auto& sum = sums[kept[m.slot]];
                sum.resize(head_dim, 0.0f);
                for (int c = 0; c < head_dim; ++c) sum[c] += m.delta[c];
              }
              for (const auto& [position, sum] : sums)
                for (int c = 0; c < head_dim; ++c) values[position][c] += sum[c];
            }
          }
          // Negating the merge probability must break the agreement: it merges nothing.
          if (negate) CHECK_FALSE(all_match);
          else CHECK(all_match);
        }
  // Both sides of the draw happen: merges, and evictions whose draw fails.
  CHECK(merges_seen > 0);
  CHECK(passes_refused > 0);
}

TEST_CASE("cam+: the merge draw is a function of (seed, layer, head, position) alone", "[policies][rewrites][cam]") {
  CHECK(cam_merge_draw(3, 1, 2, 40) == cam_merge_draw(3, 1, 2, 40));
  CHECK(cam_merge_draw(3, 1, 2, 40) != cam_merge_draw(4, 1, 2, 40));
  CHECK(cam_merge_draw(3, 1, 2, 40) != cam_merge_draw(3, 0, 2, 40));
  CHECK(cam_merge_draw(3, 1, 2, 40) != cam_merge_draw(3, 1, 1, 40));
  CHECK(cam_merge_draw(3, 1, 2, 40) != cam_merge_draw(3, 1, 2, 41));
  double mean = 0;
  for (int p = 0; p < 4000; ++p) {
    const double u = cam_merge_draw(5, 0, 0, p);
    REQUIRE(u >= 0);
    REQUIRE(u < 1);
    mean += u / 4000;
  }
  CHECK(std::abs(mean - 0.5) < 0.02);
}

TEST_CASE("cam+: sim mode and decode mode agree, and the merges change the log-probs",
          "[policies][rewrites][cam][sim-decode]") {
  std::vector<std::pair<std::string, std::vector<int>>> cases = {{"models/stories260K-hf", test::golden_tokens()}};
  for (std::string name : {"tiny-random-llama3", "tiny-random-mistral"}) {
    auto golden = test::read_json(test::data("golden/tiny_models/" + name + ".json"));
    cases.push_back({"models/" + name, golden["tokens"].get<std::vector<int>>()});
  }
  for (const auto& [dtype, tolerance] : std::vector<std::pair<std::string, double>>{{"float64", 1e-9}, {"float32", 5e-5}})
    for (const auto& [model_name, tokens] : cases) {
      ModelOptions options = test::model_options();
      options.dtype = dtype;
      auto model = Model::load(test::data(model_name), options);
      for (const std::string inner : {"h2o", "snapkv", "keydiff", "ada+snapkv", "block+h2o", "think+h2o"})
        for (int prefill : {0, static_cast<int>(tokens.size()) / 2}) {
          if (prefill == 0 && (inner == "block+h2o" || inner == "think+h2o")) continue;  // both need a prefill
          PolicyOptions o;
          o.budget.ratio = 0.2;
          o.params.set("window", 8);
          o.params.set("block_size", 7);
          o.params.set("merge_budget", 4);
          auto policy = make_policy("cam+" + inner, o);
          PolicyOptions plain_options;
          plain_options.budget.ratio = 0.2;
          plain_options.params.set("window", 8);
          plain_options.params.set("block_size", 7);
          auto alone = make_policy(inner, plain_options);
          const auto sim = score_sequence(*model, *policy, Mode::Sim, tokens, prefill);
          const auto decode = score_sequence(*model, *policy, Mode::Decode, tokens, prefill);
          INFO(model_name << " " << dtype << " cam+" << inner << " prefill " << prefill);
          CHECK(test::max_diff(sim.next_token_logprob, decode.next_token_logprob) < tolerance);
          CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
          CHECK(sim.kv.peak_bytes == decode.kv.peak_bytes);
          const auto plain = score_sequence(*model, *alone, Mode::Decode, tokens, prefill);
          CHECK(test::max_diff(plain.next_token_logprob, decode.next_token_logprob) > 1e-4);
        }
    }
}

TEST_CASE("cam+: refused with one line where it cannot run", "[policies][rewrites][cam][errors]") {
  CHECK_THAT(test::error_of([] { make_policy("cam+h2o-paper", rewrite_budget(8)); }),
             Catch::Contains("cam+h2o-paper") && Catch::Contains("not a realisable policy that evicts"));
  CHECK_THAT(test::error_of([] { make_policy("cam+full", {}); }), Catch::Contains("not a realisable policy that evicts"));
  PolicyOptions kivi = rewrite_budget(8);
  kivi.kv_quant.bits = 2;
  kivi.kv_quant.group = 8;
  kivi.kv_quant.residual = 16;
  CHECK_THAT(test::error_of([&] { make_policy("cam+h2o", kivi); }), Catch::Contains("cam+h2o") && Catch::Contains("kivi"));
  CHECK_THAT(test::error_of([] { check_dmc_policy(*make_policy("cam+h2o", rewrite_budget(8))); }),
             Catch::Contains("cam+h2o") && Catch::Contains("DMC"));
  const SequenceShape shape = test::sequence_shape(40, 20, 2, 1, 1, 8);
  CHECK(DeviceScoredLayer::make(*make_policy("cam+h2o", rewrite_budget(8)), 0, shape, 0) == nullptr);
  CHECK(make_policy("cam+h2o", rewrite_budget(8))->as_realisable()->token_vectors() >= TokenVectors::KeysAndValues);
}

TEST_CASE("a driver's rewrites land on the rows and channels they name", "[policies][rewrites]") {
  for (const auto dtype : {torch::kFloat32, torch::kFloat64}) {
    const auto keys = torch::arange(2 * 5 * 4, torch::TensorOptions().dtype(dtype)).view({2, 5, 4}).add(1);
    const auto values = keys.clone().neg();
    const auto keys_before = keys.clone(), values_before = values.clone();
    RowRewrites zero;
    zero.kv_head = 1;
    zero.key_columns = {0, 3};
    zero.zeroed_channels = {1, 2};
    RowRewrites add;
    add.kv_head = 0;
    add.value_columns = {2, 4, 2};
    add.value_deltas = {0.5f, 1, 2, 4, 1, 1, 1, 1, 0.25f, 0, 0, 8};
    apply_row_rewrites(keys, values, {zero, add});
    auto expected_keys = keys_before.clone();
    for (int row : {0, 3})
      for (int c : {1, 2}) expected_keys[1][row][c] = 0;
    CHECK(torch::equal(keys, expected_keys));
    auto expected_values = values_before.clone();
    const std::vector<double> row2 = {0.75, 1, 2, 12}, row4 = {1, 1, 1, 1};
    for (int c = 0; c < 4; ++c) {
      expected_values[0][2][c] += row2[c];
      expected_values[0][4][c] += row4[c];
    }
    CHECK(torch::equal(values, expected_values));
  }
}

TEST_CASE("think+ at key_channel_compression_ratio 0 is the token policy, number for number", "[policies][rewrites][think]") {
  const auto tokens = test::golden_tokens();
  PolicyOptions o;
  o.budget.ratio = 0.3;
  auto h2o = make_policy("h2o", o);
  o.params.set("key_channel_compression_ratio", 0.0);
  auto think = make_policy("think+h2o", o);
  for (Mode mode : {Mode::Sim, Mode::Decode}) {
    const auto plain = score_sequence(test::stories(), *h2o, mode, tokens, 100);
    const auto pruned = score_sequence(test::stories(), *think, mode, tokens, 100);
    INFO((mode == Mode::Sim ? "sim" : "decode"));
    CHECK(test::max_diff(plain.next_token_logprob, pruned.next_token_logprob) == 0);
    CHECK(plain.kv.peak_bytes == pruned.kv.peak_bytes);
    CHECK(plain.kv.kept_per_head == pruned.kv.kept_per_head);
  }
}
