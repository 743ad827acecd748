// decoding+POLICY (kvpress's DecodingPress, CompressionRatioDecodingPress and, with a
// budget, PrefillDecodingPress) and block+POLICY (BlockPress, a chunked prefill): model-free,
// exactly when each compresses and what it keeps (a hand-made schedule, h2o's scores in
// closed form), the budget/target at every step, layer and head, the one-line refusals,
// and sim == decode on stories260K.
#include <algorithm>
#include <cstdint>
#include <numeric>
#include <set>
#include <string>
#include <vector>

#include "harness/common/errors.h"
#include "harness/config/sweep_grid.h"
#include "harness/eval/evaluator.h"
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

// A weight in [0.1, 1.1) per (KV head, position).
double decoding_weight(int kv, int position) {
  uint64_t x = (static_cast<uint64_t>(kv) * 1000003 + position) * 0x9e3779b97f4a7c15ULL + 12345;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  x ^= x >> 31;
  return 0.1 + static_cast<double>(x >> 11) / static_cast<double>(1ULL << 53);
}

// Every query gives the slot of position p the weight of p (each query head alike), so
// h2o's score of p after query i, p never evicted, is weight(p) x (i - p + 1).
test::LayerTrace decoding_drive(const Policy& policy, const SequenceShape& shape, int layer = 0) {
  LayerStates states = policy.as_realisable()->make_layer_states(layer, shape);
  return test::drive_layer_states(
      states, shape,
      [&](int q_head, int, const std::vector<int>& positions, const std::vector<char>*, float* out) {
        const int kv = q_head / shape.group();
        for (size_t s = 0; s < positions.size(); ++s) out[s] = static_cast<float>(decoding_weight(kv, positions[s]));
      },
      [](int, int position) { return 1.0f + 0.01f * position; }, false, policy.as_realisable()->prefill_block());
}

// The hand computation: the slots after each query when the cache is cut to keep[i]
// tokens after query i (-1: no compression there), h2o keeping the highest
// weight(p) x (i - p + 1) (sign -1: the lowest, the score negated).
std::vector<std::vector<int>> decoding_expected(int length, const std::vector<int>& keep, int sign = 1) {
  std::vector<std::vector<int>> after(length);
  std::vector<int> slots;
  for (int i = 0; i < length; ++i) {
    slots.push_back(i);
    if (keep[i] >= 0 && static_cast<int>(slots.size()) > keep[i]) {
      std::vector<int> order = slots;
      auto score = [&](int p) { return sign * decoding_weight(0, p) * (i - p + 1); };
      std::sort(order.begin(), order.end(), [&](int a, int b) { return score(a) > score(b); });
      order.resize(keep[i]);
      std::sort(order.begin(), order.end());
      slots = order;
    }
    after[i] = slots;
  }
  return after;
}

std::vector<int> decoding_sizes(const test::LayerTrace& trace, int kv = 0) {
  std::vector<int> sizes;
  for (const auto& step : trace.positions) sizes.push_back(static_cast<int>(step[kv].size()));
  return sizes;
}

PolicyOptions decoding_options(int interval, int target) {
  PolicyOptions o;
  o.budget.heavy_share = 1;  // h2o keeps its heavy hitters alone: no recent window
  o.params.set("decode_interval", interval);
  if (target > 0) o.params.set("decode_target", target);
  return o;
}

}  // namespace

TEST_CASE("decoding+h2o compresses every decode_interval generated tokens to decode_target by h2o's scores",
          "[policies][decoding]") {
  // 6 prefill tokens, then decoding: step k is position 5 + k; compressions after steps 4,
  // 8 and 12 (positions 9, 13, 17), each to 5 tokens. The prefill stays whole.
  const SequenceShape shape = test::sequence_shape(20, 6);
  auto policy = make_policy("decoding+h2o", decoding_options(4, 5));
  CHECK(policy->name() == "decoding+h2o");
  const auto trace = decoding_drive(*policy, shape);
  CHECK(decoding_sizes(trace) == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7});
  std::vector<int> keep(20, -1);
  keep[9] = keep[13] = keep[17] = 5;
  const auto expected = decoding_expected(20, keep);
  for (int i = 0; i < 20; ++i) {
    INFO("step " << i);
    CHECK(trace.positions[i][0] == expected[i]);
  }
  // The negated score keeps other tokens: the check above reads the score's sign.
  CHECK(decoding_expected(20, keep, -1)[9] != expected[9]);
  // h2o alone with a budget of 5 evicts at every token from the prefill's end on.
  PolicyOptions alone;
  alone.budget.tokens = 5;
  alone.budget.heavy_share = 1;
  CHECK(decoding_sizes(decoding_drive(*make_policy("h2o", alone), shape))[6] == 5);
}

TEST_CASE("decoding+h2o with decode_ratio keeps int(tokens seen x ratio) at each compression",
          "[policies][decoding]") {
  const SequenceShape shape = test::sequence_shape(20, 6);
  PolicyOptions o = decoding_options(4, -1);
  o.params.set("decode_ratio", 0.3);
  const auto trace = decoding_drive(*make_policy("decoding+h2o", o), shape);
  // After position 9: int(10 x 0.3) = 3; 13: int(14 x 0.3) = 4; 17: int(18 x 0.3) = 5.
  CHECK(decoding_sizes(trace) == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 3, 4, 5, 6, 4, 5, 6, 7, 5, 6, 7});
  std::vector<int> keep(20, -1);
  keep[9] = 3;
  keep[13] = 4;
  keep[17] = 5;
  const auto expected = decoding_expected(20, keep);
  for (int i = 0; i < 20; ++i) {
    INFO("step " << i);
    CHECK(trace.positions[i][0] == expected[i]);
  }
}

TEST_CASE("decoding+h2o with a budget compresses the prefill once, then every decode_interval tokens",
          "[policies][decoding]") {
  // PrefillDecodingPress: the prefill (positions 0..5) is cut to the budget of 3 after its
  // last token, then the cache grows until each decoding compression to the target of 5.
  const SequenceShape shape = test::sequence_shape(20, 6);
  PolicyOptions o = decoding_options(4, 5);
  o.budget.tokens = 3;
  auto policy = make_policy("decoding+h2o", o);
  policy->validate(shape);
  const auto trace = decoding_drive(*policy, shape);
  CHECK(decoding_sizes(trace) == std::vector<int>{1, 2, 3, 4, 5, 3, 4, 5, 6, 5, 6, 7, 8, 5, 6, 7, 8, 5, 6, 7});
  std::vector<int> keep(20, -1);
  keep[5] = 3;
  keep[9] = keep[13] = keep[17] = 5;
  const auto expected = decoding_expected(20, keep);
  for (int i = 0; i < 20; ++i) {
    INFO("step " << i);
    CHECK(trace.positions[i][0] == expected[i]);
  }
}

TEST_CASE("decoding+ counts its steps after an uncompressed question", "[policies][decoding]") {
  // Prefill 6 and a question of 3 (positions 6..8): decoding step 1 is position 9, so the
  // first compression follows position 12.
  SequenceShape shape = test::sequence_shape(20, 6);
  shape.question_len = 3;
  const auto trace = decoding_drive(*make_policy("decoding+h2o", decoding_options(4, 5)), shape);
  CHECK(decoding_sizes(trace) == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 5, 6, 7, 8, 5, 6, 7, 8});
}

TEST_CASE("block+h2o compresses the prefill to the budget after each block of block_size tokens",
          "[policies][block]") {
  // Prefill of 12 in blocks of 4: compressions after positions 7 and 11 (after 3 nothing
  // is over the budget of 5), then one eviction per token as h2o alone.
  const SequenceShape shape = test::sequence_shape(16, 12);
  PolicyOptions o;
  o.budget.tokens = 5;
  o.budget.heavy_share = 1;
  o.params.set("block_size", 4);
  auto policy = make_policy("block+h2o", o);
  CHECK(policy->name() == "block+h2o");
  CHECK(policy->as_realisable()->prefill_block() == 4);
  const auto trace = decoding_drive(*policy, shape);
  CHECK(decoding_sizes(trace) == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8, 5, 5, 5, 5, 5});
  std::vector<int> keep(16, 5);
  for (int i : {0, 1, 2, 4, 5, 6, 8, 9, 10}) keep[i] = -1;
  const auto expected = decoding_expected(16, keep);
  for (int i = 0; i < 16; ++i) {
    INFO("step " << i);
    CHECK(trace.positions[i][0] == expected[i]);
  }
  CHECK(decoding_expected(16, keep, -1)[7] != expected[7]);
  // The chunked prefill keeps another set than one compression at the prefill's end.
  o.params = {};
  const auto whole = decoding_drive(*make_policy("h2o", o), shape);
  CHECK(decoding_sizes(whole)[10] == 11);
  CHECK(whole.positions[11][0] != trace.positions[11][0]);
}

TEST_CASE("the policy driver compresses block+'s prefill after each block, and refuses a call that a block end cuts",
          "[policies][block]") {
  // The driver's own schedule (the model-free cases above use policy_drive.h's copy of it).
  const SequenceShape shape = test::sequence_shape(16, 12);
  PolicyOptions o;
  o.budget.tokens = 5;
  o.params.set("block_size", 4);
  auto policy = make_policy("block+h2o", o);
  for (SlotColumns columns : {SlotColumns::Positions, SlotColumns::CacheRows}) {
    PolicyDriver driver(*policy->as_realisable(), 0, shape, 0, columns);
    std::vector<int> sizes;
    const std::vector<float> norms(1, 1.0f);
    for (int i = 0; i < shape.length; ++i) {
      const int n = columns == SlotColumns::Positions ? i + 1 : driver.slots(0) + 1;
      std::vector<float> logits(n, 0.0f);
      driver.rows(i, 1, n, logits.data(), norms.data());
      driver.take_moves();
      sizes.push_back(driver.slots(0));
    }
    CHECK(sizes == std::vector<int>{1, 2, 3, 4, 5, 6, 7, 5, 6, 7, 8, 5, 5, 5, 5, 5});
  }
  // Rows 2..5 of the cache in one call would cross the compression after position 3.
  PolicyDriver driver(*policy->as_realisable(), 0, shape, 0, SlotColumns::CacheRows);
  std::vector<float> logits(4 * 6, 0.0f), norms(4, 1.0f);
  CHECK_THAT(test::error_of([&] { driver.rows(2, 4, 6, logits.data(), norms.data()); }),
             Catch::Contains("runs past position 3"));
  // Over a head's slots and the block's keys (sim mode's held slots) nothing moves: one call
  // may cross the compressions, and the columns kept are the block's own.
  PolicyDriver versions(*policy->as_realisable(), 0, shape, 0, SlotColumns::Versions);
  versions.start_block(0);
  std::vector<float> all(16 * 16, 0.0f), all_norms(16, 1.0f);
  versions.rows(0, 16, 16, all.data(), all_norms.data());
  CHECK(versions.slots(0) == 5);
  CHECK(versions.columns(0) == versions.state(0).positions());
  CHECK(versions.take_moves().empty());
}

TEST_CASE("decoding+ and block+ hold the target and the budget at every step, layer and head",
          "[policies][decoding][block]") {
  const SequenceShape shape = test::sequence_shape(70, 30, 4, 2, 3, 6);
  for (const std::string inner : {"h2o", "snapkv", "tova", "keydiff", "pyramidkv", "chunk+knorm"}) {
    PolicyOptions o;
    o.params.set("decode_interval", 7);
    o.params.set("decode_target", 12);
    o.params.set("window", 4);
    o.params.set("chunk_length", 3);
    auto decoding = make_policy("decoding+" + inner, o);
    for (int layer = 0; layer < shape.n_layers; ++layer) {
      const auto trace = decoding_drive(*decoding, shape, layer);
      for (int i = 0; i < shape.length; ++i)
        for (int h = 0; h < shape.n_kv_heads; ++h) {
          INFO("decoding+" << inner << " layer " << layer << " step " << i << " head " << h);
          const int size = static_cast<int>(trace.positions[i][h].size());
          const int step = i - shape.prefill_len + 1;  // decoding step
          if (step < 7) REQUIRE(size == i + 1);  // the prefill stays whole until the first compression
          else REQUIRE(size == 12 + step % 7);   // the target, then one more slot per token
        }
    }
    o.budget.ratio = 0.2;
    o.params.set("block_size", 8);
    auto block = make_policy("block+" + inner, o);
    for (int layer = 0; layer < shape.n_layers; ++layer) {
      const int capacity = block->layer_budget(layer, shape).capacity;
      const auto trace = decoding_drive(*block, shape, layer);
      for (int i = 0; i < shape.length; ++i)
        for (int h = 0; h < shape.n_kv_heads; ++h) {
          INFO("block+" << inner << " layer " << layer << " step " << i << " head " << h);
          const int size = static_cast<int>(trace.positions[i][h].size());
          REQUIRE(size <= capacity + 8);  // the peak during the prefill: the budget plus one block
          if ((i + 1) % 8 == 0 || i >= shape.prefill_len - 1) REQUIRE(size == std::min(i + 1, capacity));
        }
    }
  }
}

TEST_CASE("decoding+ and block+ refuse what cannot run, in one line naming the key", "[policies][decoding][block]") {
  PolicyOptions both = decoding_options(4, 5);
  both.params.set("decode_ratio", 0.5);
  CHECK(test::error_of([&] { make_policy("decoding+h2o", both); }) ==
        "decode_target and decode_ratio are exclusive: give policy decoding+h2o's target one way");
  CHECK(test::error_of([&] { make_policy("decoding+streamingllm", decoding_options(4, 2)); }) ==
        "decode_target 2 is smaller than the 4 sink tokens of decoding+streamingllm");
  PolicyOptions budget = decoding_options(4, 5);
  budget.budget.ratio = 0.5;
  CHECK_THAT(test::error_of([&] { make_policy("decoding+h2o", budget)->validate(test::sequence_shape(20, 0)); }),
             Catch::Contains("--budget 0.5 compresses the prefill under policy decoding+h2o"));
  // Without a budget nothing is refused: the prefill stays whole.
  make_policy("decoding+h2o", decoding_options(4, 5))->validate(test::sequence_shape(20, 0));
  for (const std::string bad : {"decoding+full", "decoding+ada+h2o", "decoding+sparse-fixed", "block+full",
                                "block+decoding+h2o", "decoding+block+h2o", "block+h2o-paper"})
    CHECK_THAT(test::error_of([&] { make_policy(bad, budget); }), Catch::Contains("not a scored eviction policy"));
  PolicyOptions none;
  CHECK_THAT(test::error_of([&] { make_policy("block+h2o", none)->validate(test::sequence_shape(20, 10)); }),
             Catch::Contains("needs a budget"));
  std::vector<std::string> keys;
  for (const ParamSpec* p : make_policy("decoding+snapkv", none)->parameters()) keys.push_back(p->key());
  for (const std::string key : {"decode_interval", "decode_target", "decode_ratio", "window"})
    CHECK(std::find(keys.begin(), keys.end(), key) != keys.end());
  CHECK(find_policy_param("block_size") != nullptr);
  CHECK_THAT(policy_help(), Catch::Contains("decoding+SCORED") && Catch::Contains("block+SCORED"));
  // The wrappers have no device recipe: they run on the host path.
  const SequenceShape shape = test::sequence_shape(40, 20, 2, 1, 1, 8);
  CHECK(DeviceScoredLayer::make(*make_policy("decoding+h2o", budget), 0, shape, 0) == nullptr);
  CHECK(DeviceScoredLayer::make(*make_policy("block+h2o", budget), 0, shape, 0) == nullptr);
}

TEST_CASE("decoding+ and block+: sim mode and decode mode agree on stories260K",
          "[policies][decoding][block][sim-decode]") {
  const auto tokens = test::golden_tokens();
  const int prefill = static_cast<int>(tokens.size()) / 2;
  const auto full = score_sequence(test::stories(), *make_policy("full", {}), Mode::Sim, tokens, prefill);
  const std::vector<std::pair<std::string, double>> tolerances = {{"float64", 1e-9}, {"float32", 5e-5}};
  for (const auto& [dtype, tolerance] : tolerances) {
    ModelOptions options = test::model_options();
    options.dtype = dtype;
    auto model = Model::load(test::data("models/stories260K-hf"), options);
    for (const std::string name : {"decoding+h2o", "decoding+keydiff", "decoding+tova", "block+h2o", "block+keydiff",
                                   "block+snapkv"})
      for (bool with_budget : {false, true}) {
        PolicyOptions o;
        if (with_budget || name.rfind("block+", 0) == 0) o.budget.ratio = 0.3;
        o.params.set("decode_interval", 8);
        o.params.set("decode_target", prefill / 3);
        o.params.set("block_size", 7);
        o.params.set("window", 4);
        if (name.rfind("decoding+", 0) != 0) o.params = {};
        if (name.rfind("block+", 0) == 0) o.params.set("block_size", with_budget ? 7 : 16);
        auto policy = make_policy(name, o);
        const auto sim = score_sequence(*model, *policy, Mode::Sim, tokens, prefill);
        const auto decode = score_sequence(*model, *policy, Mode::Decode, tokens, prefill);
        INFO(dtype << " policy " << name << " budget " << with_budget);
        CHECK(test::max_diff(sim.next_token_logprob, decode.next_token_logprob) < tolerance);
        CHECK(sim.kv.kept_per_layer == decode.kv.kept_per_layer);
        CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
        CHECK(sim.kv.max_per_layer == decode.kv.max_per_layer);
        if (dtype == "float32") CHECK(test::max_diff(sim.next_token_logprob, full.next_token_logprob) > 1e-3);
      }
  }
}

TEST_CASE("block+h2o generates with the prefill in blocks: the cache never holds more than budget plus block",
          "[policies][block]") {
  const auto tokens = test::golden_tokens();
  const std::vector<int> prompt(tokens.begin(), tokens.begin() + 60);
  PolicyOptions o;
  o.budget.tokens = 12;
  o.params.set("block_size", 10);
  GenerateOptions g;
  g.max_new_tokens = 5;
  const Generation blocks = generate(test::stories(), *make_policy("block+h2o", o), prompt, g);
  o.params = {};
  const Generation whole = generate(test::stories(), *make_policy("h2o", o), prompt, g);
  for (int most : blocks.kv.max_per_layer) CHECK(most <= 12 + 10);
  for (int most : whole.kv.max_per_layer) CHECK(most == 60);
  CHECK(blocks.tokens.size() == 5);
  // In a batch beside other prompts (their blocks interleaved), each generation is its own.
  o.params.set("block_size", 10);
  auto policy = make_policy("block+h2o", o);
  const std::vector<std::vector<int>> prompts = {prompt, std::vector<int>(tokens.begin() + 20, tokens.begin() + 95),
                                                 std::vector<int>(tokens.begin(), tokens.begin() + 33)};
  const auto batch = generate_batch(test::stories(), *policy, prompts, std::vector<GenerateOptions>(3, g), 3);
  for (size_t i = 0; i < prompts.size(); ++i) {
    INFO("prompt " << i);
    CHECK(batch[i].tokens == generate(test::stories(), *policy, prompts[i], g).tokens);
    CHECK(batch[i].kv.max_per_layer == generate(test::stories(), *policy, prompts[i], g).kv.max_per_layer);
  }
  CHECK(batch[0].tokens == blocks.tokens);
}

TEST_CASE("max_new_tokens sets the generation tasks' length, in a sweep and in an evaluation", "[decoding][eval]") {
  const nlohmann::json config = nlohmann::json::parse(R"({
    "tasks": ["xsum"], "policies": ["decoding+h2o"], "budget_tokens": [512], "max_new_tokens": 7, "limit": 1})");
  const SweepPlan plan = expand_sweep(config, "cfg.json", test::data(""));
  REQUIRE(plan.cells.size() == 1);
  CHECK(plan.cells[0].eval.max_new_tokens == 7);
  CHECK_THAT(test::error_of([&] {
               expand_sweep(nlohmann::json::parse(R"({"tasks": ["xsum"], "max_new_tokens": 0})"), "cfg.json", "");
             }),
             Catch::Contains("max_new_tokens"));
  // The evaluation reads it: 600 new tokens leave stories260K's 512-token context no room
  // for the prompt, the task's own 64 do.
  EvalConfig e;
  e.task = "xsum";
  e.task_options.data_dir = test::data("");
  e.task_options.limit = 1;
  e.mode = Mode::Decode;
  e.compare_with_full = false;
  e.max_new_tokens = 600;
  CHECK_THAT(test::error_of([&] { evaluate(test::stories(), e); }), Catch::Contains("leaves no room for the prompt"));
  e.max_new_tokens = 0;
  CHECK(evaluate(test::stories(), e).n == 1);
}
