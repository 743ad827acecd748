// Expected Attention (policies/expected_attention.cpp) and its Ada-KV form: the scores
// against a float64 hand computation of the paper's closed form (queries' mean and
// covariance before RoPE, the rotation averaged over the future positions as a d x d
// matrix, the softmax over the non-sink keys, the value norms) on a small random case;
// the kept sets against a brute force, model-free, for expected-attention and
// ada+expected-attention; the budget at every step, layer and head; the refusals; the
// model's RoPE frequencies in the shape; and sim == decode on stories260K, a GQA model, a
// partial-rotary model (gpt_neox) and one without RoPE (OPT).
#include <algorithm>
#include <cmath>
#include <cstdint>
#include <numeric>
#include <string>
#include <vector>

#include "harness/analysis/analyze.h"
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

using EaPositions = std::vector<int>;
using EaMatrix = std::vector<std::vector<double>>;

// A value in [-1, 1) from a few integers (splitmix64).
double ea_random(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  const uint64_t x = test::splitmix_bits(a, b, c, d);
  return static_cast<double>(x >> 11) / static_cast<double>(1ULL << 52) - 1.0;
}

// R(angle w) over a head of d dims, rotate-half pairs (i, i + pairs): a d x d matrix.
EaMatrix ea_rotation(const std::vector<double>& inv_freq, int d, double position) {
  EaMatrix R(d, std::vector<double>(d, 0.0));
  for (int c = 0; c < d; ++c) R[c][c] = 1.0;
  const int pairs = static_cast<int>(inv_freq.size());
  for (int i = 0; i < pairs; ++i) {
    const double angle = position * inv_freq[i];
    R[i][i] = std::cos(angle), R[i][i + pairs] = -std::sin(angle);
    R[i + pairs][i] = std::sin(angle), R[i + pairs][i + pairs] = std::cos(angle);
  }
  return R;
}

std::vector<double> ea_apply(const EaMatrix& M, const std::vector<double>& x) {
  std::vector<double> y(M.size(), 0.0);
  for (size_t a = 0; a < M.size(); ++a)
    for (size_t b = 0; b < x.size(); ++b) y[a] += M[a][b] * x[b];
  return y;
}

// Random pre-RoPE queries, keys and values; the harness gets the queries rotated to their
// position (float32, as the model hands them), the hand computation the pre-RoPE ones.
struct EaTokens {
  int seed, head_dim, group;
  std::vector<double> inv_freq;  // pairs; fewer than head_dim / 2: partial rotary
  std::vector<float> key(int kv, int p) const { return vector(0, kv, p); }
  std::vector<float> value(int kv, int p) const { return vector(1, kv, p); }
  std::vector<float> vector(int part, int kv, int p) const {
    std::vector<float> v(head_dim);
    for (int c = 0; c < head_dim; ++c) v[c] = static_cast<float>(ea_random(seed * 3 + part, kv, p, c));
    return v;
  }
  // Query head j of KV head kv's group, before RoPE; an offset per dim makes the mean matter.
  std::vector<double> pre_rope_query(int kv, int j, int p) const {
    std::vector<double> q(head_dim);
    for (int c = 0; c < head_dim; ++c) q[c] = 0.8 * ea_random(seed * 3 + 2, kv * group + j, p, c) + 0.5 * std::sin(c + j);
    return q;
  }
  // [group][head_dim], after RoPE at p, float32.
  std::vector<float> queries(int kv, int p) const {
    std::vector<float> out;
    const EaMatrix R = ea_rotation(inv_freq, head_dim, p);
    for (int j = 0; j < group; ++j)
      for (double x : ea_apply(R, pre_rope_query(kv, j, p))) out.push_back(static_cast<float>(x));
    return out;
  }
};

struct EaParams {
  int sinks = 2, future = 5, window = 0;
  bool covariance = true, vnorm = true;
  double epsilon = 0;
};

PolicyOptions ea_options(const EaParams& e, int budget_tokens) {
  PolicyOptions o;
  o.budget.tokens = budget_tokens;
  o.params.set("n_sink", e.sinks);
  o.params.set("n_future_positions", e.future);
  o.params.set("n_window", e.window);
  o.params.set("use_covariance", e.covariance ? "true" : "false");
  o.params.set("use_vnorm", e.vnorm ? "true" : "false");
  o.params.set("epsilon", e.epsilon);
  return o;
}

// The paper's score, in float64, of KV head kv's slots `held` (ascending) after the query
// at position T - 1: sinks +inf; the others (mean over the group of softmax over the
// non-sink slots of mu'.k / sqrt(d) + k^T Sigma' k / 2d) + epsilon, times |v|.
std::vector<double> ea_hand_scores(const EaTokens& tokens, const EaParams& e, int kv, const EaPositions& held, int T) {
  const int d = tokens.head_dim, g = tokens.group;
  // Rbar: the mean of R(t) over t = T .. T+F-1, summed plainly.
  EaMatrix Rbar(d, std::vector<double>(d, 0.0));
  for (int t = T; t < T + e.future; ++t) {
    const EaMatrix R = ea_rotation(tokens.inv_freq, d, t);
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b) Rbar[a][b] += R[a][b] / e.future;
  }
  std::vector<int> from;  // the queries the statistics cover
  for (int p = e.sinks; p < T; ++p) from.push_back(p);
  if (e.window > 0 && static_cast<int>(from.size()) > e.window) from.erase(from.begin(), from.end() - e.window);
  std::vector<double> scores(held.size(), std::numeric_limits<double>::infinity()), mean_attention(held.size(), 0.0);
  for (int j = 0; j < g; ++j) {
    std::vector<double> mu(d, 0.0);
    for (int p : from) {
      const auto q = tokens.pre_rope_query(kv, j, p);
      for (int c = 0; c < d; ++c) mu[c] += q[c] / from.size();
    }
    EaMatrix cov(d, std::vector<double>(d, 0.0));  // centred, over N
    for (int p : from) {
      const auto q = tokens.pre_rope_query(kv, j, p);
      for (int a = 0; a < d; ++a)
        for (int b = 0; b < d; ++b) cov[a][b] += (q[a] - mu[a]) * (q[b] - mu[b]) / from.size();
    }
    const auto mu_r = ea_apply(Rbar, mu);
    EaMatrix cov_r(d, std::vector<double>(d, 0.0));  // Rbar cov Rbar^T
    for (int a = 0; a < d; ++a)
      for (int b = 0; b < d; ++b)
        for (int x = 0; x < d; ++x)
          for (int y = 0; y < d; ++y) cov_r[a][b] += Rbar[a][x] * cov[x][y] * Rbar[b][y];
    std::vector<double> z(held.size(), 0.0);
    double sum = 0;
    for (size_t s = 0; s < held.size(); ++s) {
      if (held[s] < e.sinks) continue;
      const auto kf = tokens.key(kv, held[s]);
      const std::vector<double> k(kf.begin(), kf.end());
      double linear = 0, quadratic = 0;
      for (int a = 0; a < d; ++a) linear += mu_r[a] * k[a];
      for (int a = 0; a < d; ++a)
        for (int b = 0; b < d; ++b) quadratic += k[a] * cov_r[a][b] * k[b];
      z[s] = linear / std::sqrt(d) + (e.covariance ? quadratic / (2.0 * d) : 0.0);
      sum += std::exp(z[s]);
    }
    for (size_t s = 0; s < held.size(); ++s)
      if (held[s] >= e.sinks) mean_attention[s] += std::exp(z[s]) / sum / g;
  }
  for (size_t s = 0; s < held.size(); ++s) {
    if (held[s] < e.sinks) continue;
    const auto v = tokens.value(kv, held[s]);
    double norm = 0;
    for (float x : v) norm += static_cast<double>(x) * x;
    scores[s] = e.vnorm ? (mean_attention[s] + e.epsilon) * std::sqrt(norm) : mean_attention[s];
  }
  return scores;
}

SequenceShape ea_shape(const EaTokens& tokens, int length, int prefill, int n_kv, int layers = 1) {
  SequenceShape shape = test::sequence_shape(length, prefill, n_kv * tokens.group, n_kv, layers, tokens.head_dim);
  shape.rope_inv_freq = tokens.inv_freq;
  return shape;
}

// Drives one layer's states over the shape's tokens (made-up attention: the policy reads none).
test::LayerTrace ea_drive(const Policy& policy, const SequenceShape& shape, const EaTokens& tokens, int layer = 0) {
  LayerStates states = policy.as_realisable()->make_layer_states(layer, shape);
  std::vector<float> key, value, queries;
  return test::drive_layer_tokens(
      states, shape,
      [&](int, int, const std::vector<int>& positions, const std::vector<char>*, float* out) {
        std::fill(out, out + positions.size(), 1.0f / positions.size());
      },
      [&](int kv, int p) {
        key = tokens.key(kv, p);
        value = tokens.value(kv, p);
        queries = tokens.queries(kv, p);
        double norm = 0;
        for (float x : key) norm += static_cast<double>(x) * x;
        return NewToken{static_cast<float>(std::sqrt(norm)), key.data(), value.data(), queries.data()};
      });
}

// The uniform rule: the sinks, then the best scores (ties: the later position) up to `budget`.
EaPositions ea_top(const EaPositions& held, const std::vector<double>& scores, int budget) {
  std::vector<int> order(held.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) {
    return scores[a] != scores[b] ? scores[a] > scores[b] : held[a] > held[b];
  });
  EaPositions kept;
  for (int i = 0; i < budget; ++i) kept.push_back(held[order[i]]);
  std::sort(kept.begin(), kept.end());
  return kept;
}

std::vector<double> ea_negated(std::vector<double> scores) {
  for (double& s : scores)
    if (!std::isinf(s)) s = -s;
  return scores;
}

// 4 query heads over 2 KV heads; head_dim 6 with 2 of its 3 pairs rotating (partial rotary).
const EaTokens kEaTokens{5, 6, 2, {0.9, 0.23}};

}  // namespace

TEST_CASE("expected-attention's scores match a float64 hand computation of the closed form", "[policies][expected-attention]") {
  const EaTokens& tokens = kEaTokens;
  const int T = 14;
  std::vector<EaParams> cases(5);
  cases[1].window = 4;
  cases[2].covariance = false;
  cases[3].vnorm = false;
  cases[4].epsilon = 0.05, cases[4].future = 512, cases[4].window = 30;
  for (const EaParams& e : cases) {
    auto policy = make_policy("expected-attention", ea_options(e, 6));
    const auto& scored = dynamic_cast<const ScoredPolicy&>(*policy);
    const SequenceShape shape = ea_shape(tokens, T, T, 2);
    for (int kv = 0; kv < 2; ++kv) {
      // The head has taken tokens 0 .. T-1 and holds some of them (eviction keeps the
      // queries' statistics: they are the head's, not its slots').
      HeadSlots head;
      head.channels = scored.channels(tokens.head_dim);
      scored.on_create(head, shape);
      EaPositions held;
      for (int p = 0; p < T; ++p) {
        const auto key = tokens.key(kv, p), value = tokens.value(kv, p);
        const auto queries = tokens.queries(kv, p);
        const NewToken token{1.0f, key.data(), value.data(), queries.data()};
        scored.on_append(head, head.append(p), p, token);
        held.push_back(p);
      }
      for (int p : {3, 7, 8}) {
        const int slot = static_cast<int>(std::find(held.begin(), held.end(), p) - held.begin());
        head.erase(slot);
        held.erase(held.begin() + slot);
      }
      std::vector<float> got(held.size());
      scored.score(head, got.data());
      const auto want = ea_hand_scores(tokens, e, kv, held, T);
      for (size_t s = 0; s < held.size(); ++s) {
        INFO("window " << e.window << " covariance " << e.covariance << " vnorm " << e.vnorm << " future " << e.future
                       << " head " << kv << " position " << held[s]);
        if (std::isinf(want[s])) {
          CHECK(std::isinf(got[s]));
        } else {
          CHECK(std::abs(got[s] - want[s]) <= 2e-5 * std::abs(want[s]));
        }
      }
    }
  }
}

TEST_CASE("expected-attention keeps the sinks and the keys of the highest expected attention, as a brute force",
          "[policies][expected-attention]") {
  const EaTokens& tokens = kEaTokens;
  for (int prefill : {20, 0}) {
    for (int window : {0, 5}) {
      EaParams e;
      e.window = window;
      const int budget = 7, length = 30;
      auto policy = make_policy("expected-attention", ea_options(e, budget));
      const SequenceShape shape = ea_shape(tokens, length, prefill, 2);
      const auto trace = ea_drive(*policy, shape, tokens);
      for (int kv = 0; kv < 2; ++kv) {
        // The brute force: every step after the prefill keeps the best of what the head holds.
        EaPositions held;
        int evictions = 0, unlike_negated = 0;
        for (int i = 0; i < length; ++i) {
          held.push_back(i);
          if (i >= prefill - 1 && static_cast<int>(held.size()) > budget) {
            const auto scores = ea_hand_scores(tokens, e, kv, held, i + 1);
            const auto kept = ea_top(held, scores, budget);
            unlike_negated += kept != ea_top(held, ea_negated(scores), budget);
            held = kept;
            ++evictions;
          }
          INFO("prefill " << prefill << " window " << window << " head " << kv << " step " << i);
          REQUIRE(trace.positions[i][kv] == held);
        }
        CHECK(evictions > 0);
        CHECK(unlike_negated == evictions);  // the score's sign decides every one of them
      }
    }
  }
}

TEST_CASE("ada+expected-attention ranks the layer's heads together by expected attention, as a brute force",
          "[policies][expected-attention]") {
  const EaTokens& tokens = kEaTokens;
  const int n_kv = 2, length = 20, budget = 7;
  EaParams e;
  PolicyOptions o = ea_options(e, budget);
  o.params.set("ada_safeguard", 0.3);
  auto policy = make_policy("ada+expected-attention", o);
  CHECK(policy->as_realisable()->token_vectors() == TokenVectors::KeysValuesAndQueries);
  const SequenceShape shape = ea_shape(tokens, length, length, n_kv);
  const auto trace = ea_drive(*policy, shape, tokens);
  // Ada-KV's rule over the hand scores of every position: each head keeps its sinks and its
  // int(0.3 x 7) = 2 best; the rest of the layer's 2 x 7 goes to the best scores of both heads.
  struct Candidate {
    int tier;
    double score;
    int position, head;
  };
  auto rule = [&](bool negate) {
    std::vector<Candidate> all;
    EaPositions held(length);
    std::iota(held.begin(), held.end(), 0);
    auto better = [](const Candidate& a, const Candidate& b) {
      if (a.tier != b.tier) return a.tier > b.tier;
      if (a.score != b.score) return a.score > b.score;
      if (a.position != b.position) return a.position > b.position;
      return a.head < b.head;
    };
    for (int kv = 0; kv < n_kv; ++kv) {
      auto scores = ea_hand_scores(tokens, e, kv, held, length);
      if (negate) scores = ea_negated(scores);
      std::vector<Candidate> head;
      for (int p = 0; p < length; ++p)
        head.push_back({p < e.sinks ? 2 : 0, std::isinf(scores[p]) ? 1e300 : scores[p], p, kv});
      std::sort(head.begin(), head.end(), better);
      for (int i = 0; i < 2; ++i) head[i].tier = std::max(head[i].tier, 1);
      all.insert(all.end(), head.begin(), head.end());
    }
    std::sort(all.begin(), all.end(), better);
    std::vector<EaPositions> kept(n_kv);
    for (int i = 0; i < n_kv * budget; ++i) kept[all[i].head].push_back(all[i].position);
    for (auto& k : kept) std::sort(k.begin(), k.end());
    return kept;
  };
  const auto want = rule(false);
  std::vector<EaPositions> got = {trace.positions[length - 1][0], trace.positions[length - 1][1]};
  CHECK(got == want);
  CHECK(got != rule(true));
  CHECK(got[0].size() != got[1].size());  // the heads' budgets differ: the ranking is across heads
}

TEST_CASE("expected-attention and its ada+ and chunk+ forms hold the budget at every step, layer and head",
          "[policies][expected-attention]") {
  const EaTokens& tokens = kEaTokens;
  const SequenceShape shape = ea_shape(tokens, 50, 0, 2, 3);
  PolicyOptions o;
  o.budget.ratio = 0.25;
  o.params.set("chunk_length", 3);
  o.params.set("n_window", 6);
  for (const std::string name : {"expected-attention", "ada+expected-attention", "chunk+expected-attention"}) {
    auto policy = make_policy(name, o);
    for (int layer = 0; layer < shape.n_layers; ++layer) {
      const Budget budget = policy->layer_budget(layer, shape);
      REQUIRE(budget.capacity == 12);
      const auto trace = ea_drive(*policy, shape, tokens, layer);
      for (int i = 0; i < shape.length; ++i) {
        int layer_total = 0;
        for (int h = 0; h < shape.n_kv_heads; ++h) {
          const auto& kept = trace.positions[i][h];
          INFO(name << " layer " << layer << " step " << i << " head " << h);
          layer_total += static_cast<int>(kept.size());
          if (name.rfind("ada+", 0) != 0) REQUIRE(static_cast<int>(kept.size()) == std::min(i + 1, budget.capacity));
          REQUIRE(std::is_sorted(kept.begin(), kept.end()));
          for (int p = 0; p < std::min(budget.sink, i + 1); ++p) REQUIRE(std::binary_search(kept.begin(), kept.end(), p));
        }
        INFO(name << " layer " << layer << " step " << i);
        REQUIRE(layer_total == shape.n_kv_heads * std::min(i + 1, budget.capacity));
      }
    }
  }
}

TEST_CASE("expected-attention is refused where its queries or parameters cannot be had", "[policies][expected-attention]") {
  // A caller that hands no queries: the driver's internal error.
  const SequenceShape shape = ea_shape(kEaTokens, 4, 0, 1);
  for (const std::string name : {"expected-attention", "ada+expected-attention"}) {
    auto policy = make_policy(name, ea_options(EaParams{}, 2));
    PolicyDriver driver(*policy->as_realisable(), 0, shape, 0, SlotColumns::Positions);
    CHECK(driver.token_vectors() == TokenVectors::KeysValuesAndQueries);
    std::vector<float> logits(2, 0.0f), norms(1, 1.0f), keys(6, 0.5f), values(6, 0.5f);
    BlockTokens without_queries(norms.data());
    without_queries.keys = keys.data();
    without_queries.values = values.data();
    without_queries.head_dim = 6;
    INFO(name);
    const std::string error = test::error_of([&] { driver.rows(0, 1, 1, logits.data(), without_queries); });
    CHECK_THAT(error, Catch::Contains("value and query vectors"));
    CHECK_THAT(error, Catch::Contains("did not give"));
  }
  // Its parameters' ranges, one line naming the key.
  PolicyOptions o;
  CHECK_THAT(test::error_of([&] { o.params.set("n_future_positions", 0); }), Catch::Contains("n_future_positions"));
  CHECK_THAT(test::error_of([&] { o.params.set("n_window", -1); }), Catch::Contains("n_window"));
  CHECK_THAT(test::error_of([&] { o.params.set("use_covariance", "maybe"); }), Catch::Contains("use_covariance"));
  // No device recipe: the host path, on any device.
  CHECK(DeviceScoredLayer::make(*make_policy("expected-attention", ea_options(EaParams{}, 2)), 0, shape, 0) == nullptr);
  // analyze's recall observes keys and values, not queries: noted, not run.
  AnalyzeOptions options;
  options.recall_policies = {"expected-attention", "h2o"};
  options.recall_budgets = {0.5};
  const auto tokens = test::golden_tokens();
  const auto analysis = analyze_attention(test::stories(), {std::vector<int>(tokens.begin(), tokens.begin() + 24)}, options);
  bool noted = false;
  for (const auto& note : analysis.notes) noted = noted || note.find("expected-attention: reads each token's queries") == 0;
  CHECK(noted);
}

TEST_CASE("shape_for hands the policy the model's RoPE frequencies", "[policies][expected-attention]") {
  const Model& model = test::stories();
  const SequenceShape shape = shape_for(model, 40, 0);
  REQUIRE(static_cast<int64_t>(shape.rope_inv_freq.size()) == model.arch().rotary_dim / 2);
  for (size_t i = 0; i < shape.rope_inv_freq.size(); ++i) {
    const double want = std::pow(model.arch().rope_theta, -2.0 * i / model.arch().rotary_dim);
    CHECK(std::abs(shape.rope_inv_freq[i] - want) <= 1e-6 * want);
  }
  auto neox = Model::load(test::data("models/tiny-random-gptneox"), test::model_options());
  CHECK(shape_for(*neox, 40, 0).rope_inv_freq.size() == 2);  // rotary_pct 0.25 of head_dim 16
  auto opt = Model::load(test::data("models/tiny-random-opt"), test::model_options());
  CHECK(shape_for(*opt, 40, 0).rope_inv_freq.empty());  // learned positions: no rotation
}

TEST_CASE("expected-attention: sim mode and decode mode agree on stories260K and tiny models",
          "[policies][expected-attention][sim-decode]") {
  const auto golden = test::golden_tokens();
  const std::vector<std::pair<std::string, double>> tolerances = {{"float64", 1e-9}, {"float32", 5e-5}};
  for (const std::string model_name : {"stories260K-hf", "tiny-random-llama-gqa", "tiny-random-gptneox", "tiny-random-opt"}) {
    // The tiny models' context is 64 positions at least; their vocabularies 256 at least.
    std::vector<int> tokens = golden;
    if (model_name != "stories260K-hf") {
      tokens.resize(48);
      for (int& t : tokens) t %= 256;
    }
    for (const auto& [dtype, tolerance] : tolerances) {
      ModelOptions options = test::model_options();
      options.dtype = dtype;
      auto model = Model::load(test::data("models/" + model_name), options);
      const auto full = score_sequence(*model, *make_policy("full", {}), Mode::Sim, tokens);
      for (const std::string name : {"expected-attention", "ada+expected-attention"})
        for (double budget : {0.2, 0.5})
          for (int prefill : {0, static_cast<int>(tokens.size()) / 2}) {
            if (model_name != "stories260K-hf" && (budget == 0.5 || (prefill == 0 && name[0] == 'a'))) continue;
            PolicyOptions o;
            o.budget.ratio = budget;
            o.params.set("n_future_positions", 16);
            if (prefill == 0) o.params.set("n_window", 8);
            auto policy = make_policy(name, o);
            const auto sim = score_sequence(*model, *policy, Mode::Sim, tokens, prefill);
            const auto decode = score_sequence(*model, *policy, Mode::Decode, tokens, prefill);
            INFO(model_name << " " << dtype << " policy " << name << " budget " << budget << " prefill " << prefill);
            CHECK(test::max_diff(sim.next_token_logprob, decode.next_token_logprob) < tolerance);
            CHECK(sim.kv.kept_per_layer == decode.kv.kept_per_layer);
            CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
            if (dtype == "float32") CHECK(test::max_diff(sim.next_token_logprob, full.next_token_logprob) > 1e-3);
          }
    }
  }
}
