// Ada-KV head budgets (ada+POLICY): the layer keeps the uniform total, each head at least
// its safeguard, and the kept set is the layer's global top set; model-free cases with
// knorm (whose scores are the key norms the test chooses), the invariants under H2O's
// running scores, and sim == decode with ragged heads on stories260K.

#include <algorithm>
#include <map>
#include <random>
#include <set>

#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/policy_drive.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

PolicyOptions ada_options(int tokens, double safeguard) {
  PolicyOptions o;
  o.budget.tokens = tokens;
  o.params.set("ada_safeguard", safeguard);
  return o;
}

SequenceShape two_heads(int length, int prefill) {
  SequenceShape shape;
  shape.length = length;
  shape.prefill_len = prefill;
  shape.n_q_heads = 2;
  shape.n_kv_heads = 2;
  return shape;
}

// Uniform attention: knorm ignores it.
void flat(int, int, const std::vector<int>& positions, const std::vector<char>*, float* out) {
  for (size_t s = 0; s < positions.size(); ++s) out[s] = 1.0f / positions.size();
}

// The kept positions of each head after one compression of a 10-token prefill.
std::vector<std::vector<int>> kept_after_prefill(const std::string& policy, int tokens, double safeguard,
                                                 const test::KeyNormFn& norm) {
  auto p = make_policy(policy, ada_options(tokens, safeguard));
  const SequenceShape shape = two_heads(10, 10);
  LayerStates states = p->as_realisable()->make_layer_states(0, shape);
  auto trace = test::drive_layer_states(states, shape, flat, norm);
  return trace.positions.back();
}

}  // namespace

TEST_CASE("ada+knorm: the layer keeps the uniform total, chosen across heads", "[policies][ada]") {
  // knorm keeps low key norms. Head 0's keys all have lower norms than head 1's.
  const auto norm = [](int kv, int position) { return kv == 0 ? 1.0f + 0.25f * position : 8.0f + position; };
  using Kept = std::vector<std::vector<int>>;
  // Uniform knorm: four each.
  CHECK(kept_after_prefill("knorm", 4, 0.2, norm) == Kept{{0, 1, 2, 3}, {0, 1, 2, 3}});
  // No safeguard: the layer's 8 best keys are all head 0's.
  CHECK(kept_after_prefill("ada+knorm", 4, 0.0, norm) == Kept{{0, 1, 2, 3, 4, 5, 6, 7}, {}});
  // Safeguard 0.5: head 1 keeps its best int(0.5 * 4) = 2, head 0 the other 6 places.
  CHECK(kept_after_prefill("ada+knorm", 4, 0.5, norm) == Kept{{0, 1, 2, 3, 4, 5}, {0, 1}});
  // Safeguard 1: every head keeps its own budget, as the uniform policy.
  CHECK(kept_after_prefill("ada+knorm", 4, 1.0, norm) == Kept{{0, 1, 2, 3}, {0, 1, 2, 3}});
  // Equal scores everywhere: the more recent position, then the lower head.
  const auto same = [](int, int) { return 2.0f; };
  CHECK(kept_after_prefill("ada+knorm", 3, 0.0, same) == Kept{{7, 8, 9}, {7, 8, 9}});
  CHECK(kept_after_prefill("ada+knorm", 3, 0.0, [](int kv, int p) { return p == 9 && kv == 1 ? 3.0f : 2.0f; }) ==
        Kept{{6, 7, 8, 9}, {7, 8}});
}

TEST_CASE("ada+knorm: the kept set is the brute-force global top set", "[policies][ada]") {
  std::mt19937 rng(7);
  std::uniform_int_distribution<int> pick(1, 6);  // few values: many ties
  for (int trial = 0; trial < 50; ++trial) {
    float norms[2][10];
    for (auto& head : norms)
      for (float& n : head) n = static_cast<float>(pick(rng));
    const double safeguard = trial % 5 * 0.25;
    const int tokens = 2 + trial % 4;
    const auto kept = kept_after_prefill("ada+knorm", tokens, safeguard,
                                         [&](int kv, int position) { return norms[kv][position]; });
    // Brute force: each head's best int(safeguard * tokens) first, then the rest by
    // (norm ascending, position descending, head ascending) up to 2 * tokens.
    struct Key {
      bool guarded;
      float norm;
      int position, head;
    };
    std::vector<Key> all;
    for (int h = 0; h < 2; ++h) {
      std::vector<int> order(10);
      for (int p = 0; p < 10; ++p) order[p] = p;
      std::sort(order.begin(), order.end(), [&](int a, int b) {
        return norms[h][a] != norms[h][b] ? norms[h][a] < norms[h][b] : a > b;
      });
      const int guard = static_cast<int>(safeguard * tokens);
      for (int i = 0; i < 10; ++i) all.push_back({i < guard, norms[h][order[i]], order[i], h});
    }
    std::sort(all.begin(), all.end(), [](const Key& a, const Key& b) {
      if (a.guarded != b.guarded) return a.guarded;
      if (a.norm != b.norm) return a.norm < b.norm;
      if (a.position != b.position) return a.position > b.position;
      return a.head < b.head;
    });
    std::vector<std::vector<int>> expected(2);
    for (int i = 0; i < 2 * tokens; ++i) expected[all[i].head].push_back(all[i].position);
    for (auto& e : expected) std::sort(e.begin(), e.end());
    INFO("trial " << trial << " safeguard " << safeguard << " tokens " << tokens);
    CHECK(kept == expected);
  }
}

TEST_CASE("ada+h2o under streaming attention: totals, safeguards and windows hold at every step",
          "[policies][ada]") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> unit(0.01f, 1.0f);
  const int L = 40, tokens = 8;
  const SequenceShape shape = two_heads(L, 0);
  // Head 0 attends sharply to a few keys, head 1 almost evenly.
  std::vector<float> sharp(L);
  for (float& x : sharp) x = unit(rng);
  auto attention = [&](int q_head, int, const std::vector<int>& positions, const std::vector<char>*, float* out) {
    float sum = 0;
    for (size_t s = 0; s < positions.size(); ++s)
      sum += out[s] = q_head == 0 ? std::pow(sharp[positions[s]], 8.0f) : 1.0f + 0.01f * sharp[positions[s]];
    for (size_t s = 0; s < positions.size(); ++s) out[s] /= sum;
  };
  auto policy = make_policy("ada+h2o", ada_options(tokens, 0.25));
  const Budget budget = policy->layer_budget(0, shape);
  REQUIRE(budget.recent > 0);
  LayerStates states = policy->as_realisable()->make_layer_states(0, shape);
  auto trace = test::drive_layer_states(states, shape, attention, [](int, int) { return 1.0f; });
  bool differed = false;
  for (int i = 0; i < L; ++i) {
    const auto& heads = trace.positions[i];
    const int total = static_cast<int>(heads[0].size() + heads[1].size());
    INFO("step " << i);
    CHECK(total == std::min(2 * (i + 1), 2 * tokens));
    for (const auto& kept : heads) {
      CHECK(static_cast<int>(kept.size()) >= std::min(i + 1, static_cast<int>(0.25 * tokens)));
      // The recent window stays in every head.
      for (int p = std::max(0, i - budget.recent + 1); p <= i; ++p)
        CHECK(std::find(kept.begin(), kept.end(), p) != kept.end());
    }
    differed = differed || heads[0].size() != heads[1].size();
  }
  CHECK(differed);
}

TEST_CASE("ada+POLICY: sim and decode agree with ragged heads, and the heads differ on stories260K",
          "[policies][ada][sim-decode]") {
  ModelOptions options;
  options.dtype = "float64";
  auto model = Model::load(test::data("models/stories260K-hf"), options);
  const auto tokens = test::golden_tokens();
  const int T = static_cast<int>(tokens.size());
  for (const std::string name : {"ada+snapkv", "ada+h2o", "ada+tova", "ada+pyramidkv"}) {
    for (int prefill : {0, T / 2}) {
      PolicyOptions o;
      o.budget.ratio = 0.2;
      auto policy = make_policy(name, o);
      auto sim = score_sequence(*model, *policy, Mode::Sim, tokens, prefill);
      auto decode = score_sequence(*model, *policy, Mode::Decode, tokens, prefill);
      INFO(name << " prefill " << prefill);
      CHECK(test::max_diff(sim.next_token_logprob, decode.next_token_logprob) < 1e-9);
      CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
      // Each layer holds the uniform policy's total; some layer splits it unevenly.
      SequenceShape shape = shape_for(*model, T, prefill);
      bool uneven = false;
      for (int l = 0; l < shape.n_layers; ++l) {
        const auto& heads = decode.kv.kept_per_head[l];
        int total = 0;
        for (int n : heads) total += n;
        CHECK(total == shape.n_kv_heads * policy->layer_budget(l, shape).capacity);
        uneven = uneven || *std::min_element(heads.begin(), heads.end()) != *std::max_element(heads.begin(), heads.end());
      }
      CHECK(uneven);
    }
  }
}

TEST_CASE("ada+ refuses what it cannot wrap, and its safeguard's range", "[policies][ada][errors]") {
  for (const std::string name : {"ada+full", "ada+sparse-strided", "ada+h2o-paper", "ada+h2o+sparse-strided"}) {
    INFO(name);
    CHECK_THROWS_WITH(make_policy(name, ada_options(4, 0.2)), Catch::Contains("not a scored eviction policy"));
  }
  CHECK_THROWS_WITH(make_policy("ada+nothing", ada_options(4, 0.2)), Catch::Contains("unknown policy \"nothing\""));
  PolicyOptions o;
  CHECK_THROWS_WITH(o.params.set("ada_safeguard", "1.5"), Catch::Contains("<= 1"));
  CHECK_THROWS_WITH(o.params.set("ada_safeguard", "-0.1"), Catch::Contains(">= 0"));
  CHECK(make_policy("ada+snapkv", ada_options(4, 0.2))->name() == "ada+snapkv");
}
