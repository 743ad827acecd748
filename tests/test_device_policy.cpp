// The device policy path (harness/runtime/device_policy.h) against the host's policy
// driver, the reference: fed the same logits, the two give the same attention and keep
// the same slots at every step, model-free and through a real model's decode cache, on
// the CPU device.
#include <cmath>
#include <functional>
#include <string>
#include <vector>

#include "harness/runtime/attention.h"
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

std::unique_ptr<Policy> policy_with(const std::string& name, int budget_tokens, const std::string& reduce = "mean") {
  PolicyOptions options;
  options.budget.tokens = budget_tokens;
  options.params.set("group_reduce", reduce);
  return make_policy(name, options);
}

// The positions a device layer holds, per KV head.
std::vector<std::vector<int>> positions_of(const DeviceScoredLayer& layer) {
  const auto positions = layer.positions().contiguous();
  std::vector<std::vector<int>> out(positions.size(0));
  for (int64_t h = 0; h < positions.size(0); ++h)
    for (int64_t s = 0; s < positions.size(1); ++s) out[h].push_back(static_cast<int>(positions[h][s].item<int64_t>()));
  return out;
}

struct Case {
  std::string policy;
  int budget, prefill;
  int64_t window;
  std::string reduce;
  int length = 0;  // the shape's length (0: the steps run); random's draw table starts there
};

// Each policy with a recipe at a 40-token budget over stories260K, with no prefill and
// with a 50-token one.
void for_each_model_case(const Model& model, int length,
                         const std::function<void(const Policy&, const SequenceShape&)>& check) {
  for (const std::string name : {"h2o", "local", "streamingllm", "knorm", "tova", "random"})
    for (const int prefill : {0, 50}) {
      INFO(name << " prefill " << prefill);
      const auto policy = policy_with(name, 40);
      check(*policy, shape_for(model, length, prefill));
    }
}

void check_same_stats(const KvStats& device, const KvStats& host, int layer) {
  CHECK(device.kept_per_head[layer] == host.kept_per_head[layer]);
  CHECK(device.max_per_layer[layer] == host.max_per_layer[layer]);
  CHECK(device.visible_per_layer[layer] == host.visible_per_layer[layer]);
}

}  // namespace

TEST_CASE("the device policy path keeps the host driver's slots and gives its attention, step by step", "[device-policy]") {
  // Logits with many exact ties (a coarse grid) and a few large values, so the selection's
  // tie rule and the sinks and windows all matter.
  const int T = 90, n_kv = 2, group = 3, n_q = n_kv * group;
  torch::manual_seed(11);
  const auto all_logits = (torch::randint(-6, 7, {n_q, T, T}).to(torch::kFloat32) * 0.5f).contiguous();  // [h][q][p]
  const auto key_norms = (torch::randint(1, 5, {T, n_kv}).to(torch::kFloat32) * 0.75f).contiguous();    // [p][kv]
  const std::vector<Case> cases = {
      {"h2o", 20, 0, 0, "mean"},          {"h2o", 20, 30, 0, "max"},   {"h2o", 33, 1, 12, "mean"},
      {"local", 16, 0, 0, "mean"},        {"local", 16, 25, 7, "mean"}, {"streamingllm", 18, 0, 0, "mean"},
      {"streamingllm", 18, 40, 0, "max"}, {"knorm", 24, 0, 0, "mean"}, {"knorm", 24, 35, 9, "mean"},
      {"tova", 20, 0, 0, "mean"},         {"tova", 22, 30, 10, "max"}, {"random", 20, 0, 0, "mean"},
      {"random", 26, 35, 8, "mean"},     {"random", 20, 0, 0, "mean", 7},  // its table grows by doubling
  };
  // The softmax as tensor ops (another device's code, run on the CPU): its exp rounds
  // otherwise, so its attention is near the host's, and on these logits the kept slots
  // are the same.
  for (const bool tensor_ops : {false, true})
  for (const Case& c : cases) {
    INFO(c.policy << " budget " << c.budget << " prefill " << c.prefill << " window " << c.window << " " << c.reduce
                  << (tensor_ops ? " tensor ops" : ""));
    const auto policy = policy_with(c.policy, c.budget, c.reduce);
    SequenceShape shape = test::sequence_shape(c.length > 0 ? c.length : T, c.prefill, n_q, n_kv);
    PolicyDriver host(*policy->as_realisable(), 0, shape, c.window, SlotColumns::Positions);
    auto device = DeviceScoredLayer::make(*policy, 0, shape, c.window);
    REQUIRE(device);
    device->use_tensor_softmax(tensor_ops);
    int64_t next = 0;
    while (next < T) {
      // The prefill in two calls, as the blocked attention splits a long one.
      const int64_t rows = next < c.prefill && c.prefill > 1 ? (next == 0 ? c.prefill / 2 : c.prefill - next) : 1;
      // Host: columns are positions, n = next + rows.
      const int64_t n = next + rows;
      auto host_block = all_logits.narrow(1, next, rows).narrow(2, 0, n).contiguous();  // [n_q, rows, n]
      host.rows(next, rows, n, host_block.data_ptr<float>(), key_norms.narrow(0, next, rows).contiguous().data_ptr<float>());
      // Device: columns are its slots (the held positions, then the new ones).
      const int64_t slots = device->slots() + rows;
      auto device_block = torch::empty({n_kv, group * rows, slots});
      const auto held = device->slots() > 0 ? device->positions() : torch::empty({n_kv, 0}, torch::kLong);
      for (int kv = 0; kv < n_kv; ++kv) {
        const auto cols = torch::cat({held[kv], torch::arange(next, next + rows, torch::kLong)});
        for (int j = 0; j < group; ++j)
          device_block[kv].narrow(0, j * rows, rows).copy_(all_logits[kv * group + j].narrow(0, next, rows).index_select(1, cols));
      }
      const auto probs = device->rows(device_block, next, rows, key_norms.narrow(0, next, rows));
      // The attention: the host's at the positions the device's slots stood for.
      for (int kv = 0; kv < n_kv; ++kv) {
        const auto cols = torch::cat({held[kv], torch::arange(next, next + rows, torch::kLong)});
        for (int j = 0; j < group; ++j) {
          const auto expected = host_block[kv * group + j].index_select(1, cols);
          const auto got = probs[kv].narrow(0, j * rows, rows);
          if (tensor_ops)
            REQUIRE(torch::allclose(expected, got, /*rtol=*/1e-6, /*atol=*/1e-7));
          else
            REQUIRE(torch::equal(expected, got));
        }
      }
      next += rows;
      const auto kept = positions_of(*device);
      for (int kv = 0; kv < n_kv; ++kv) {
        INFO("after position " << next - 1 << ", KV head " << kv);
        CHECK(kept[kv] == host.state(kv).positions());
      }
    }
    CHECK(device->peak_slots() == host.peak_head_slots());
  }
}

TEST_CASE("the device policy path refuses what it cannot run", "[device-policy]") {
  const SequenceShape shape = test::sequence_shape(64, 0, 4, 2);
  CHECK_FALSE(DeviceScoredLayer::make(*policy_with("scissorhands", 16), 0, shape, 0));  // no recipe
  CHECK_FALSE(DeviceScoredLayer::make(*policy_with("snapkv", 16), 0, shape, 0));
  PolicyOptions ada;
  ada.budget.tokens = 16;
  CHECK_FALSE(DeviceScoredLayer::make(*make_policy("ada+h2o", ada), 0, shape, 0));
  CHECK(DeviceScoredLayer::make(*policy_with("h2o", 16), 0, shape, 0));
}

TEST_CASE("a decode cache on the device policy path gives the host path's log-probs and kept slots", "[device-policy]") {
  const Model& model = test::stories();
  const std::vector<int> tokens = test::golden_tokens();
  const int T = static_cast<int>(tokens.size());
  for_each_model_case(model, T, [&](const Policy& policy, const SequenceShape& shape) {
    CacheAttention host(model, policy, shape), device(model, policy, shape);
    device.use_device_policy_path(true);
    std::vector<double> host_logprobs, device_logprobs;
    int64_t next = 0;
    while (next < T) {
      const int64_t t = next == 0 && shape.prefill_len > 1 ? shape.prefill_len : 1;
      const std::vector<int> piece(tokens.begin() + next, tokens.begin() + next + t);
      const auto a = torch::log_softmax(model.forward(piece, next, host).to(torch::kFloat64), -1);
      const auto b = torch::log_softmax(model.forward(piece, next, device).to(torch::kFloat64), -1);
      for (int64_t r = 0; r < t && next + r + 1 < T; ++r) {
        host_logprobs.push_back(a[r][tokens[next + r + 1]].item<double>());
        device_logprobs.push_back(b[r][tokens[next + r + 1]].item<double>());
      }
      next += t;
    }
    // The same slots, in other cache rows: the host moves each kept row into a freed row
    // below it, this path gathers them in slot order, so the values are summed in another
    // order (measured: at most 6.7e-6 over these cases).
    CHECK(test::max_diff(host_logprobs, device_logprobs) <= 2e-5);
    for (int layer = 0; layer < shape.n_layers; ++layer) {
      INFO("layer " << layer);
      CHECK(device.kept_positions(layer) == host.kept_positions(layer));
      check_same_stats(device.stats(), host.stats(), layer);
    }
    CHECK(device.stats().peak_bytes == host.stats().peak_bytes);
  });
}

TEST_CASE("a teacher-forced pass on the device policy path gives the host path's log-probs and kept slots",
          "[device-policy]") {
  const Model& model = test::stories();
  const std::vector<int> tokens = test::golden_tokens();
  const int T = static_cast<int>(tokens.size());
  for_each_model_case(model, T, [&](const Policy& policy, const SequenceShape& shape) {
    SimAttention host(model, policy, shape), device(model, policy, shape);
    device.use_device_policy_path(true);
    const auto a = torch::log_softmax(model.forward(tokens, 0, host).to(torch::kFloat64), -1);
    const auto b = torch::log_softmax(model.forward(tokens, 0, device).to(torch::kFloat64), -1);
    std::vector<double> host_logprobs, device_logprobs;
    for (int i = 0; i + 1 < T; ++i) {
      host_logprobs.push_back(a[i][tokens[i + 1]].item<double>());
      device_logprobs.push_back(b[i][tokens[i + 1]].item<double>());
    }
    // The same attention at the same columns: the same numbers.
    CHECK(test::max_diff(host_logprobs, device_logprobs) == 0.0);
    for (int layer = 0; layer < shape.n_layers; ++layer) {
      INFO("layer " << layer);
      check_same_stats(device.stats(), host.stats(), layer);
    }
    CHECK(device.stats().peak_bytes == host.stats().peak_bytes);
  });
}
