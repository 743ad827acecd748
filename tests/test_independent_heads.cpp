// The policy driver runs each KV head of a layer whose states are not in lockstep on its
// own thread through a whole block of queries: for such a policy, one head at a time
// through the whole sequence must leave exactly the slots and make exactly the evictions
// that all heads together, query by query, do.
#include "tests/test_support.h"
#include "tests/catch.h"

#include <cmath>
#include <cstdint>
#include <string>
#include <vector>

#include "policies/registry.h"
#include "tests/policy_drive.h"

using namespace kvevict;

namespace {

// A deterministic weight in (0, 1] for (query head, step, key position).
float weight(uint64_t head, uint64_t step, uint64_t position) {
  uint64_t x = (head + 1) * 0x9e3779b97f4a7c15ULL ^ (step + 3) * 0xbf58476d1ce4e5b9ULL ^
               (position + 7) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  x *= 0xd6e8feb86659fd93ULL;
  x ^= x >> 29;
  const float w = (static_cast<float>(x >> 40) + 1.0f) / static_cast<float>(1ULL << 24);
  return w * w * w * w;  // peaked: a few keys take most of the attention
}

// Query head h's attention at `step` over the slots at `positions`, normalised.
void attention_row(int h, int step, const std::vector<int>& positions, float* out) {
  float sum = 0;
  for (size_t s = 0; s < positions.size(); ++s) sum += (out[s] = weight(h, step, positions[s]));
  for (size_t s = 0; s < positions.size(); ++s) out[s] /= sum;
}

float key_norm(int kv_head, int position) { return 0.5f + weight(100 + kv_head, position, 0); }

void attention(int h, int step, const std::vector<int>& positions, const std::vector<char>*, float* out) {
  attention_row(h, step, positions, out);
}

}  // namespace

TEST_CASE("a policy with independent heads, run one KV head at a time, keeps what all heads at once keep",
          "[policies][units][independent]") {
  int independent = 0, shared = 0;
  for (const std::string& name : policy_names()) {
    if (test::needs_pattern_file(name) || test::needs_prepass(name)) continue;  // test_critical_duo, test_kvzip
    for (const std::string& reduce : {"mean", "max"}) {
      for (int prefill : {0, 12}) {
        PolicyOptions options;
        options.budget.ratio = 0.25;
        options.params.set("window", 5);
        options.params.set("group_reduce", reduce);
        auto policy = make_policy(name, options);
        if (!policy->realisable() || policy->keeps_everything()) continue;
        SequenceShape shape;
        shape.length = 70;
        shape.prefill_len = prefill;
        shape.n_layers = 3;
        shape.n_q_heads = 6;
        shape.n_kv_heads = 3;
        shape.head_dim = 4;
        for (int layer = 0; layer < shape.n_layers; ++layer) {
          LayerStates together = policy->as_realisable()->make_layer_states(layer, shape);
          if (together.lockstep) {
            ++shared;
            continue;
          }
          ++independent;
          LayerStates apart = policy->as_realisable()->make_layer_states(layer, shape);
          INFO(name << " group_reduce " << reduce << " prefill " << prefill << " layer " << layer);
          const auto expected = test::drive_layer_states(together, shape, attention, key_norm).positions;
          const auto got = test::drive_layer_states(apart, shape, attention, key_norm, true).positions;
          for (int i = 0; i < shape.length; ++i) {
            INFO("step " << i);
            REQUIRE(got[i] == expected[i]);
          }
          // The budget was reached, so evictions were compared, not only appends (a strided
          // pattern never drops a key: it attends every key again later).
          if (name != "sparse-strided") CHECK(static_cast<int>(expected.back()[0].size()) < shape.length);
        }
      }
    }
  }
  CHECK(independent > 0);
  CHECK(shared > 0);
}

TEST_CASE("the heads of h2o and snapkv are independent, tova's share one decision", "[policies][units][independent]") {
  PolicyOptions options;
  options.budget.ratio = 0.2;
  SequenceShape shape;
  shape.length = 50;
  shape.n_q_heads = shape.n_kv_heads = 2;
  for (const std::string name : {"h2o", "snapkv", "pyramidkv", "scissorhands"})
    CHECK_FALSE(make_policy(name, options)->as_realisable()->make_layer_states(0, shape).lockstep);
  CHECK(make_policy("tova", options)->as_realisable()->make_layer_states(0, shape).lockstep);
}
