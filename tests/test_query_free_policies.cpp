// KeyDiff, LagKV and the chunk+ wrapper (ChunkKV), whose scores read each token's key (and
// value) vectors (NewToken): their kept sets against a brute-force computation in double
// of the papers' rules on random keys, model-free; the budget at every step, layer and
// head; the driver refusing a caller that gives no vectors; the host path for them on
// any device; and sim == decode on stories260K.
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <map>
#include <numeric>
#include <string>
#include <vector>

#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "harness/runtime/device_policy.h"
#include "harness/runtime/policy_driver.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/policy_drive.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

using Positions = std::vector<int>;

// A value in [-1, 1) from a few integers (splitmix64).
float random_value(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t x = test::splitmix_bits(a, b, c, d);
  return static_cast<float>(x >> 40) / static_cast<float>(1ULL << 23) - 1.0f;
}

// Random keys and values per (KV head, position), head_dim floats each.
struct RandomTokens {
  int seed, head_dim;
  std::vector<float> key(int kv, int position) const { return vector(0, kv, position); }
  std::vector<float> value(int kv, int position) const { return vector(1, kv, position); }
  std::vector<float> vector(int part, int kv, int position) const {
    std::vector<float> v(head_dim);
    for (int c = 0; c < head_dim; ++c) v[c] = random_value(seed * 2 + part, kv, position, c);
    return v;
  }
};

double norm(const std::vector<float>& v) {
  double squares = 0;
  for (float x : v) squares += static_cast<double>(x) * x;
  return std::sqrt(squares);
}

// Drives one layer's states over shape.length tokens with made-up attention and the
// random vectors; the slots of every head after each step.
test::LayerTrace drive(const Policy& policy, const SequenceShape& shape, const RandomTokens& tokens, int layer = 0) {
  LayerStates states = policy.as_realisable()->make_layer_states(layer, shape);
  std::vector<float> key, value;
  return test::drive_layer_tokens(
      states, shape,
      [&](int h, int i, const std::vector<int>& positions, const std::vector<char>*, float* out) {
        double sum = 0;
        for (size_t s = 0; s < positions.size(); ++s) sum += out[s] = 1.0f + random_value(7, h, i, positions[s]);
        for (size_t s = 0; s < positions.size(); ++s) out[s] = static_cast<float>(out[s] / sum);
      },
      [&](int kv, int position) {
        key = tokens.key(kv, position);
        value = tokens.value(kv, position);
        return NewToken{static_cast<float>(norm(key)), key.data(), value.data()};
      });
}

// The `budget` positions of the highest scores (ties: the later position), ascending.
Positions top(const std::vector<double>& scores, int budget) {
  Positions order(scores.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : a > b;
  });
  order.resize(budget);
  std::sort(order.begin(), order.end());
  return order;
}

std::vector<double> negated(std::vector<double> scores) {
  for (double& s : scores) s = -s;
  return scores;
}

// KeyDiff over positions 0 .. n-1 of one head: -cos(k_i, mean_j k_j / |k_j|).
std::vector<double> keydiff_scores(const RandomTokens& tokens, int kv, int n) {
  const int d = tokens.head_dim;
  std::vector<double> anchor(d, 0.0), scores(n);
  for (int j = 0; j < n; ++j) {
    const auto k = tokens.key(kv, j);
    for (int c = 0; c < d; ++c) anchor[c] += k[c] / norm(k) / n;
  }
  double anchor_norm = 0;
  for (double a : anchor) anchor_norm += a * a;
  anchor_norm = std::sqrt(anchor_norm);
  for (int i = 0; i < n; ++i) {
    const auto k = tokens.key(kv, i);
    double dot = 0;
    for (int c = 0; c < d; ++c) dot += k[c] * anchor[c];
    scores[i] = -dot / (norm(k) * anchor_norm);
  }
  return scores;
}

// LagKV as kvpress's LagKVPress computes it over positions 0 .. n-1 of one head: sinks
// and the unlagged tail score above everything, a lagged chunk's tokens their rank (in
// the chunk) of the mean of softmax(std((x - min_lag) / (max_lag - min_lag))) over K and V.
std::vector<double> lagkv_scores(const RandomTokens& tokens, int kv, int n, int sinks, int lag) {
  const int d = tokens.head_dim, chunks = (n - sinks) / lag;
  std::vector<double> scores(n, 2.0);
  for (int s = 0; s < sinks; ++s) scores[s] = 3.0;
  for (int j = 0; j + 1 < chunks; ++j) {
    const int start = sinks + j * lag;
    std::vector<double> combined(lag, 0.0);
    for (int part = 0; part < 2; ++part) {
      std::vector<double> lo(d, 1e300), hi(d, -1e300), spread(lag);
      for (int r = start + lag; r < start + 2 * lag; ++r) {
        const auto x = tokens.vector(part, kv, r);
        for (int c = 0; c < d; ++c) lo[c] = std::min<double>(lo[c], x[c]), hi[c] = std::max<double>(hi[c], x[c]);
      }
      for (int t = 0; t < lag; ++t) {
        const auto x = tokens.vector(part, kv, start + t);
        std::vector<double> y(d);
        for (int c = 0; c < d; ++c) y[c] = (x[c] - lo[c]) / (hi[c] - lo[c]);
        const double mean = std::accumulate(y.begin(), y.end(), 0.0) / d;
        double var = 0;
        for (double v : y) var += (v - mean) * (v - mean) / (d - 1);
        spread[t] = std::sqrt(var);
      }
      double sum = 0;
      for (double s : spread) sum += std::exp(s);
      for (int t = 0; t < lag; ++t) combined[t] += std::exp(spread[t]) / sum / 2;
    }
    // argsort(argsort): each token's rank in its chunk, over lag.
    Positions order(lag);
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return combined[a] < combined[b]; });
    for (int r = 0; r < lag; ++r) scores[start + order[r]] = static_cast<double>(r) / lag;
  }
  return scores;
}

PolicyOptions token_budget(int tokens) {
  PolicyOptions o;
  o.budget.tokens = tokens;
  return o;
}

// One compression: a prefill of 20 tokens kept down to the budget once.
constexpr int kTokens = 20;
SequenceShape prefill_shape(int n_kv, int head_dim) {
  return test::sequence_shape(kTokens, kTokens, 2 * n_kv, n_kv, 1, head_dim);
}

}  // namespace

TEST_CASE("keydiff keeps the keys least similar to the mean normalised key", "[policies][query-free]") {
  const int n_kv = 3, budget = 8;
  for (const int head_dim : {4, 8}) {
    const RandomTokens tokens{11, head_dim};
    auto policy = make_policy("keydiff", token_budget(budget));
    const auto trace = drive(*policy, prefill_shape(n_kv, head_dim), tokens);
    for (int kv = 0; kv < n_kv; ++kv) {
      const auto scores = keydiff_scores(tokens, kv, kTokens);
      INFO("head_dim " << head_dim << " KV head " << kv);
      CHECK(trace.positions.back()[kv] == top(scores, budget));
      // The case tells the score from its negation (the keys most like the anchor).
      CHECK(top(scores, budget) != top(negated(scores), budget));
    }
  }
}

TEST_CASE("lagkv keeps the sinks, the unlagged chunk and each lagged chunk's most distinctive tokens",
          "[policies][query-free]") {
  // 2 sinks, then 18 tokens in chunks of 4: chunks 0-2 lagged by the next, chunk 3 and the
  // 2 left over (6 tokens) unlagged. 14 kept: the sinks, those 6, and the 2 best-ranked
  // tokens of each lagged chunk.
  const int n_kv = 2, head_dim = 6, budget = 14, sinks = 2, lag = 4;
  const RandomTokens tokens{5, head_dim};
  PolicyOptions o = token_budget(budget);
  o.params.set("n_sink", sinks);
  o.params.set("lag_size", lag);
  auto policy = make_policy("lagkv", o);
  const auto trace = drive(*policy, prefill_shape(n_kv, head_dim), tokens);
  for (int kv = 0; kv < n_kv; ++kv) {
    const auto scores = lagkv_scores(tokens, kv, kTokens, sinks, lag);
    const Positions expected = top(scores, budget);
    INFO("KV head " << kv);
    CHECK(trace.positions.back()[kv] == expected);
    for (int p : {0, 1, 14, 15, 16, 17, 18, 19}) CHECK(std::binary_search(expected.begin(), expected.end(), p));
    for (int chunk = 0; chunk < 3; ++chunk) {
      const auto in_chunk = [&](int p) { return p >= sinks && (p - sinks) / lag == chunk; };
      CHECK(std::count_if(expected.begin(), expected.end(), in_chunk) == 2);
    }
    // Each lagged chunk keeps other tokens under the negated score.
    std::vector<double> inverted = scores;
    for (int p = sinks; p < 14; ++p) inverted[p] = -scores[p];
    CHECK(top(inverted, budget) != expected);
  }
  // Fewer than two chunks after the sinks: no lag yet, the newest stay (a sliding window).
  auto short_lag = make_policy("lagkv", o);
  const auto window = drive(*short_lag, test::sequence_shape(9, 9, 2, 1, 1, head_dim), tokens);
  PolicyOptions six = o;
  six.budget.tokens = 6;
  const auto six_kept = drive(*make_policy("lagkv", six), test::sequence_shape(9, 9, 2, 1, 1, head_dim), tokens);
  CHECK(window.positions.back()[0] == Positions({0, 1, 2, 3, 4, 5, 6, 7, 8}));
  CHECK(six_kept.positions.back()[0] == Positions({0, 1, 5, 6, 7, 8}));
}

TEST_CASE("chunk+keydiff keeps whole chunks by the mean of keydiff's scores over the layer's heads",
          "[policies][query-free][chunk]") {
  const int n_kv = 2, head_dim = 5, budget = 8, chunk = 4;
  const RandomTokens tokens{3, head_dim};
  PolicyOptions o = token_budget(budget);
  o.params.set("chunk_length", chunk);
  auto policy = make_policy("chunk+keydiff", o);
  CHECK(policy->name() == "chunk+keydiff");
  const auto trace = drive(*policy, prefill_shape(n_kv, head_dim), tokens);
  // Per chunk: the mean over its tokens and the heads of keydiff's score.
  std::vector<double> per_token(kTokens, 0.0);
  for (int kv = 0; kv < n_kv; ++kv) {
    const auto scores = keydiff_scores(tokens, kv, kTokens);
    for (int c = 0; c < kTokens / chunk; ++c) {
      double sum = 0;
      for (int p = c * chunk; p < (c + 1) * chunk; ++p) sum += scores[p];
      for (int p = c * chunk; p < (c + 1) * chunk; ++p) per_token[p] += sum / chunk / n_kv;
    }
  }
  const Positions expected = top(per_token, budget);
  CHECK(top(negated(per_token), budget) != expected);
  for (int kv = 0; kv < n_kv; ++kv) CHECK(trace.positions.back()[kv] == expected);
  // Two whole chunks: each kept position's chunk is kept entirely.
  for (int p : expected)
    for (int q = p / chunk * chunk; q < (p / chunk + 1) * chunk; ++q)
      CHECK(std::binary_search(expected.begin(), expected.end(), q));
  // The chunks are not the ones keydiff alone would keep token by token.
  const auto alone = drive(*make_policy("keydiff", token_budget(budget)), prefill_shape(n_kv, head_dim), tokens);
  CHECK(alone.positions.back() != trace.positions.back());
}

TEST_CASE("chunk+ composes like ada+: over any scored policy, and refuses the others",
          "[policies][query-free][chunk]") {
  PolicyOptions o = token_budget(8);
  auto snap = make_policy("chunk+snapkv", o);
  CHECK(snap->name() == "chunk+snapkv");
  std::vector<std::string> keys;
  for (const ParamSpec* p : snap->parameters()) keys.push_back(p->key());
  CHECK(std::find(keys.begin(), keys.end(), "chunk_length") != keys.end());
  CHECK(std::find(keys.begin(), keys.end(), "window") != keys.end());
  CHECK(make_policy("ada+chunk+h2o", o)->name() == "ada+chunk+h2o");
  CHECK(make_policy("chunk+pyramidkv", o)->layer_budget(0, test::sequence_shape(100, 0, 2, 1, 4)).capacity ==
        make_policy("pyramidkv", o)->layer_budget(0, test::sequence_shape(100, 0, 2, 1, 4)).capacity);
  for (const std::string bad :
       {"chunk+full", "chunk+ada+h2o", "chunk+h2o+sparse-strided", "chunk+sparse-fixed", "chunk+h2o-paper"})
    CHECK_THAT(test::error_of([&] { make_policy(bad, o); }), Catch::Contains("not a scored eviction policy"));
  CHECK_THAT(policy_help(), Catch::Contains("chunk+SCORED"));
}

TEST_CASE("keydiff, lagkv and chunk+ hold the budget at every step, layer and head", "[policies][query-free]") {
  const SequenceShape shape = test::sequence_shape(60, 0, 4, 2, 3, 6);
  PolicyOptions o;
  o.budget.ratio = 0.25;
  o.params.set("lag_size", 4);
  o.params.set("chunk_length", 3);
  o.params.set("window", 4);
  const RandomTokens tokens{9, 6};
  for (const std::string name : {"keydiff", "lagkv", "chunk+keydiff", "chunk+lagkv", "chunk+snapkv", "ada+keydiff"}) {
    auto policy = make_policy(name, o);
    for (int layer = 0; layer < shape.n_layers; ++layer) {
      const Budget budget = policy->layer_budget(layer, shape);
      REQUIRE(budget.capacity == 15);
      const auto trace = drive(*policy, shape, tokens, layer);
      int layer_total = 0;
      for (int i = 0; i < shape.length; ++i) {
        layer_total = 0;
        for (int h = 0; h < shape.n_kv_heads; ++h) {
          const auto& kept = trace.positions[i][h];
          INFO(name << " layer " << layer << " step " << i << " head " << h);
          layer_total += static_cast<int>(kept.size());
          if (name.rfind("ada+", 0) != 0) REQUIRE(static_cast<int>(kept.size()) == std::min(i + 1, budget.capacity));
          REQUIRE(std::is_sorted(kept.begin(), kept.end()));
          for (int p = 0; p < std::min(budget.sink, i + 1); ++p)
            REQUIRE(std::binary_search(kept.begin(), kept.end(), p));
        }
        INFO(name << " layer " << layer << " step " << i);
        REQUIRE(layer_total == shape.n_kv_heads * std::min(i + 1, budget.capacity));
      }
    }
  }
}

TEST_CASE("the driver refuses a caller that does not give the vectors a policy reads", "[policies][query-free]") {
  const SequenceShape shape = test::sequence_shape(4, 0, 2, 1, 1, 4);
  for (const std::string name : {"keydiff", "lagkv", "chunk+keydiff", "ada+lagkv"}) {
    auto policy = make_policy(name, token_budget(2));
    PolicyDriver driver(*policy->as_realisable(), 0, shape, 0, SlotColumns::Positions);
    CHECK(driver.token_vectors() != TokenVectors::None);
    std::vector<float> logits(2, 0.0f), norms(1, 1.0f);
    INFO(name);
    CHECK_THAT(test::error_of([&] { driver.rows(0, 1, 1, logits.data(), norms.data()); }),
               Catch::Contains("did not give"));
  }
  CHECK(make_policy("knorm", token_budget(2))->as_realisable()->token_vectors() == TokenVectors::None);
  CHECK(make_policy("chunk+knorm", token_budget(2))->as_realisable()->token_vectors() == TokenVectors::None);
  CHECK(make_policy("lagkv", token_budget(2))->as_realisable()->token_vectors() == TokenVectors::KeysAndValues);
}

TEST_CASE("keydiff, lagkv and chunk+ have no device recipe: they run on the host path", "[policies][query-free]") {
  const SequenceShape shape = test::sequence_shape(40, 0, 2, 1, 1, 8);
  for (const std::string name : {"keydiff", "lagkv", "chunk+keydiff", "chunk+knorm", "chunk+h2o"})
    CHECK(DeviceScoredLayer::make(*make_policy(name, token_budget(8)), 0, shape, 0) == nullptr);
  // The recipe of the inner policy is not the wrapper's: knorm alone has one.
  CHECK(DeviceScoredLayer::make(*make_policy("knorm", token_budget(8)), 0, shape, 0) != nullptr);
}

TEST_CASE("keydiff, lagkv and chunk+: sim mode and decode mode agree on stories260K",
          "[policies][query-free][sim-decode]") {
  const auto tokens = test::golden_tokens();
  const auto full = score_sequence(test::stories(), *make_policy("full", {}), Mode::Sim, tokens);
  // The tolerances of test_policies.cpp's sim == decode: any eviction decision that
  // differs moves float64 log-probs by far more than 1e-9; float32 sums in other orders.
  const std::vector<std::pair<std::string, double>> tolerances = {{"float64", 1e-9}, {"float32", 5e-5}};
  for (const auto& [dtype, tolerance] : tolerances) {
    ModelOptions options = test::model_options();
    options.dtype = dtype;
    auto model = Model::load(test::data("models/stories260K-hf"), options);
    for (const std::string name : {"keydiff", "lagkv", "chunk+keydiff", "chunk+lagkv", "chunk+snapkv"})
      for (double budget : {0.1, 0.2, 0.5})
        for (int prefill : {0, static_cast<int>(tokens.size()) / 2}) {
          PolicyOptions o;
          o.budget.ratio = budget;
          o.params.set("lag_size", 8);  // 4 sinks + 2 x 8: lagged chunks from 20 slots on
          o.params.set("chunk_length", 5);
          o.params.set("window", 8);
          auto policy = make_policy(name, o);
          const auto sim = score_sequence(*model, *policy, Mode::Sim, tokens, prefill);
          const auto decode = score_sequence(*model, *policy, Mode::Decode, tokens, prefill);
          INFO(dtype << " policy " << name << " budget " << budget << " prefill " << prefill);
          CHECK(test::max_diff(sim.next_token_logprob, decode.next_token_logprob) < tolerance);
          CHECK(sim.kv.kept_per_layer == decode.kv.kept_per_layer);
          CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
          // It evicts: the log-probs are not the full cache's.
          if (dtype == "float32") CHECK(test::max_diff(sim.next_token_logprob, full.next_token_logprob) > 1e-3);
        }
  }
}
