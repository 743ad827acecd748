// Sparse Transformer baselines as policies (golden mean NLL and kept count), the
// budget -> period mapping, and the composition of a scored policy with a pattern.

#include <random>
#include <set>

#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "policies/static_pattern.h"
#include "tests/policy_drive.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

namespace {

double mean_nll(const SequenceScore& score) {
  double total = 0;
  for (double lp : score.next_token_logprob) total -= lp;
  return total / score.next_token_logprob.size();
}

SequenceShape stories_shape(int length) {
  SequenceShape shape;
  shape.length = length;
  shape.n_layers = 5;
  shape.n_q_heads = 8;
  shape.n_kv_heads = 4;
  return shape;
}

// Runs a layer's states over `length` steps with seeded random attention over the
// visible slots and calls check(i, visible keys per KV head) for every query i.
void drive(LayerStates& states, SequenceShape shape, int length,
           const std::function<void(int, const std::vector<std::set<int>>&)>& check) {
  std::mt19937 rng(7);
  std::uniform_real_distribution<float> uniform(0.0f, 1.0f);
  shape.length = length;
  const test::LayerTrace trace = test::drive_layer_states(
      states, shape,
      [&](int, int, const std::vector<int>& positions, const std::vector<char>* visible, float* out) {
        float sum = 0;
        for (size_t s = 0; s < positions.size(); ++s)
          if (!visible || (*visible)[s]) sum += (out[s] = uniform(rng));
        for (size_t s = 0; s < positions.size(); ++s) out[s] /= sum;
      },
      [](int, int) { return 1.0f; });
  for (int i = 0; i < length; ++i) {
    std::vector<std::set<int>> visible;
    for (const auto& seen : trace.seen[i]) visible.emplace_back(seen.begin(), seen.end());
    check(i, visible);
  }
}

}  // namespace

TEST_CASE("pattern counts agree with the pattern's definition", "[policy][sparse]") {
  for (const std::string name : {"sparse-strided", "sparse-fixed"}) {
    for (int period : {1, 2, 5, 7}) {
      for (int summary : {0, 1, 2}) {
        if (summary > period) continue;
        PolicyOptions o;
        o.params.set("summary", summary);
        auto policy = make_policy(name, o);
        auto pattern = dynamic_cast<const PatternPolicy&>(*policy).make_pattern(period);
        for (int i = 0; i < 60; ++i) {
          int attended = 0, cached = 0;
          for (int j = 0; j <= i; ++j) {
            attended += pattern->attends(i, j);
            bool later = false;
            for (int k = i + 1; k < i + 4 * period + 2; ++k) later |= pattern->attends(k, j);
            cached += later;
            CHECK(pattern->needed_later(i, j) == later);
          }
          INFO(name << " l=" << period << " c=" << summary << " i=" << i);
          CHECK(pattern->attended(i) == attended);
          CHECK(pattern->cached_after(i) == cached);
        }
      }
    }
  }
}

TEST_CASE("sparse-strided and sparse-fixed reproduce the golden masks", "[policy][sparse][golden]") {
  auto golden = test::read_json(test::data("golden/sparse_baselines_stories260K_T200.json"));
  auto tokens = test::golden_tokens();
  REQUIRE(static_cast<int>(tokens.size()) == golden["tokens"].get<int>());
  for (const auto& [name, key] : std::vector<std::pair<std::string, std::string>>{{"sparse-strided", "strided"},
                                                                                 {"sparse-fixed", "fixed"}}) {
    PolicyOptions o;
    o.params.set("stride", golden["stride"].get<int>());
    o.params.set("summary", golden["summary"].get<int>());
    auto policy = make_policy(name, o);
    for (Mode mode : {Mode::Sim, Mode::Decode}) {
      auto score = score_sequence(test::stories(), *policy, mode, tokens);
      INFO(name << " " << mode_name(mode) << " mean_nll " << mean_nll(score));
      CHECK(std::abs(mean_nll(score) - golden[key]["mean_nll"].get<double>()) < 1e-4);
    }
    // The last query attends exactly the golden's key count.
    const SequenceShape shape = stories_shape(static_cast<int>(tokens.size()));
    LayerStates state = policy->as_realisable()->make_layer_states(0, shape);
    int last_row = -1;
    drive(state, shape, shape.length, [&](int i, const std::vector<std::set<int>>& visible) {
      if (i == shape.length - 1) last_row = static_cast<int>(visible[0].size());
    });
    CHECK(last_row == golden[key]["kept_last_row"].get<int>());
  }
}

TEST_CASE("a budget maps to the shortest period that fits", "[policy][sparse]") {
  const int length = 200;
  for (const std::string name : {"sparse-strided", "sparse-fixed"}) {
    for (double budget : {0.2, 0.3, 0.5}) {
      PolicyOptions o;
      o.budget.ratio = budget;
      auto policy = make_policy(name, o);
      const auto& pattern_policy = dynamic_cast<const PatternPolicy&>(*policy);
      const int tokens = static_cast<int>(budget * length);
      auto chosen = pattern_policy.pattern_for(tokens, length);
      INFO(name << " budget " << budget << " period " << chosen->period());
      CHECK(pattern_max_kept(*chosen, length) <= tokens);
      if (chosen->period() > 1)
        CHECK(pattern_max_kept(*pattern_policy.make_pattern(chosen->period() - 1), length) > tokens);
    }
  }
  // stride 5 at 200 tokens keeps 43 besides the query: the smallest budget it fits is 43.
  PolicyOptions o;
  auto strided = make_policy("sparse-strided", o);
  CHECK(dynamic_cast<const PatternPolicy&>(*strided).pattern_for(43, length)->period() == 5);
  // Below about 2*sqrt(T) no period fits: the shortest with the smallest count (27) is used.
  CHECK(dynamic_cast<const PatternPolicy&>(*strided).pattern_for(10, length)->period() == 12);
}

TEST_CASE("h2o on a static pattern keeps at most B*L keys and always the pattern", "[policy][sparse][compose]") {
  const int length = 200;
  const SequenceShape shape = stories_shape(length);
  for (const std::string pattern_name : {"sparse-strided", "sparse-fixed"}) {
    for (double budget : {0.2, 0.3, 0.5}) {
      PolicyOptions o;
      o.budget.ratio = budget;
      auto composed = make_policy("h2o+" + pattern_name, o);
      CHECK(composed->name() == "h2o+" + pattern_name);
      // The pattern alone at the composition's pattern share (h2o: half the budget).
      auto alone = make_policy(pattern_name, o);
      auto pattern = dynamic_cast<const PatternPolicy&>(*alone).pattern_for(static_cast<int>(budget * length) / 2 +
                                                                              static_cast<int>(budget * length) % 2,
                                                                          length);
      const int capacity = static_cast<int>(budget * length);
      LayerStates state = composed->as_realisable()->make_layer_states(0, shape);
      int most = 0, heavy_seen = 0;
      drive(state, shape, length, [&](int i, const std::vector<std::set<int>>& visible) {
        for (const auto& keys : visible) {
          INFO(pattern_name << " budget " << budget << " query " << i);
          REQUIRE(keys.count(i) == 1);
          CHECK(static_cast<int>(keys.size()) - 1 <= capacity);  // B*L besides the query itself
          for (int j = 0; j <= i; ++j)
            if (pattern->attends(i, j)) REQUIRE(keys.count(j) == 1);
          int extra = 0;
          for (int j : keys) extra += !pattern->attends(i, j);
          heavy_seen = std::max(heavy_seen, extra);
          most = std::max(most, static_cast<int>(keys.size()) - 1);
        }
      });
      INFO(pattern_name << " budget " << budget << " most " << most << " heavy " << heavy_seen);
      CHECK(heavy_seen > 0);      // heavy hitters were added on top of the pattern
      CHECK(most >= capacity - 2);  // and the budget is used
    }
  }
}

TEST_CASE("composed policies: sim == decode and bad combinations", "[policy][sparse][compose][sim-decode]") {
  ModelOptions f64 = test::model_options();
  f64.dtype = "float64";
  auto model = Model::load(test::data("models/stories260K-hf"), f64);
  auto tokens = test::golden_tokens();
  for (const std::string name : {"h2o+sparse-strided", "h2o+sparse-fixed", "tova+sparse-fixed", "snapkv+sparse-strided"}) {
    for (int prefill : {0, 100}) {
      PolicyOptions o;
      o.budget.ratio = 0.3;
      o.params.set("window", 8);
      auto policy = make_policy(name, o);
      auto sim = score_sequence(*model, *policy, Mode::Sim, tokens, prefill);
      auto decode = score_sequence(*model, *policy, Mode::Decode, tokens, prefill);
      INFO(name << " prefill " << prefill);
      CHECK(test::max_diff(sim.next_token_logprob, decode.next_token_logprob) < 1e-9);
      CHECK(sim.kv.kept_per_layer == decode.kv.kept_per_layer);
    }
  }
  auto error_of = [](const std::string& name) {
    try {
      make_policy(name, {});
    } catch (const Error& e) {
      return std::string(e.what());
    }
    return std::string();
  };
  CHECK_THAT(error_of("h2o+local"), Catch::Contains("not a static pattern"));
  CHECK_THAT(error_of("full+sparse-fixed"), Catch::Contains("not a scored eviction policy"));
  CHECK_THAT(error_of("h2o+nope"), Catch::Contains("unknown policy \"nope\""));
  PolicyOptions bad;
  bad.params.set("stride", 3);
  bad.params.set("summary", 4);
  CHECK_THAT(([&] {
               try {
                 score_sequence(test::stories(), *make_policy("sparse-fixed", bad), Mode::Sim, test::golden_tokens());
               } catch (const Error& e) {
                 return std::string(e.what());
               }
               return std::string();
             })(),
             Catch::Contains("--summary 4"));
}
