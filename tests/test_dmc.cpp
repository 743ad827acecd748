// Dynamic Memory Compression (harness/model/dmc.h, harness/runtime/dmc_attention.h): the
// merge state on hand-made tensors against the spec written out (GQA importance, the
// window, slot counts), tools/ref_dmc.py's golden in both modes and both precisions, the
// all-append limit against plain attention with dimension D-1 zeroed, sim == decode on a
// GQA model, bf16 weights, and what DMC refuses.
#include <cmath>
#include <cstring>
#include <filesystem>
#include <tuple>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>
#include <random>

#include "harness/analysis/analyze.h"
#include "harness/common/errors.h"
#include "harness/model/dmc.h"
#include "harness/model/model.h"
#include "harness/runtime/attention.h"
#include "harness/runtime/scorer.h"
#include "notebooks-export/results_csv.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;
namespace fs = std::filesystem;
using nlohmann::json;

using kvevict::test::error_of;

namespace {

using test::max_diff;

const char* kFixture = "models/tiny-random-llama-dmc";

std::unique_ptr<Policy> full_policy() { return make_policy("full", PolicyOptions{}); }

std::unique_ptr<Model> load(const std::string& dir, const std::string& dtype) {
  ModelOptions options = test::model_options();
  options.dtype = dtype;
  return Model::load(dir, options);
}

// A copy of a model folder with config.json merge-patched (null deletes a key) and the
// weights either linked or replaced by `weights` (the bytes of a model.safetensors).
std::string patched_model(const std::string& name, const std::string& base, const json& patch,
                          const std::string& weights = "") {
  const std::string dir = test::temp_dir(name);
  json config = test::read_json(base + "/config.json");
  config.merge_patch(patch);
  std::ofstream(dir + "/config.json") << config.dump(2);
  if (weights.empty())
    fs::create_symlink(fs::absolute(base + "/model.safetensors"), dir + "/model.safetensors");
  else
    std::ofstream(dir + "/model.safetensors", std::ios::binary) << weights;
  return dir;
}

// An F32 safetensors file, split into its header and its data, with the float tensors
// editable in place and written back in the same layout or re-encoded as BF16.
struct SafetensorsF32 {
  json header;
  std::string data;
  explicit SafetensorsF32(const std::string& path) {
    std::ifstream in(path, std::ios::binary);
    uint64_t length = 0;
    in.read(reinterpret_cast<char*>(&length), 8);
    std::string text(length, '\0');
    in.read(&text[0], length);
    header = json::parse(text);
    data.assign(std::istreambuf_iterator<char>(in), {});
  }
  float* tensor(const std::string& name) {
    REQUIRE(header[name]["dtype"] == "F32");
    return reinterpret_cast<float*>(&data[header[name]["data_offsets"][0].get<size_t>()]);
  }
  std::string bytes() const { return frame(header.dump(), data); }
  // Every tensor as BF16 (round to nearest even, as torch does).
  std::string bf16_bytes() const {
    json h;
    std::string out;
    for (auto& [name, info] : header.items()) {
      if (name == "__metadata__") continue;
      const size_t begin = info["data_offsets"][0], end = info["data_offsets"][1];
      const auto floats = torch::from_blob(const_cast<char*>(data.data()) + begin,
                                           {static_cast<int64_t>((end - begin) / 4)}, torch::kFloat32);
      const auto halves = floats.to(torch::kBFloat16).contiguous();
      h[name] = {{"dtype", "BF16"}, {"shape", info["shape"]}, {"data_offsets", {out.size(), out.size() + halves.nbytes()}}};
      out.append(static_cast<const char*>(halves.data_ptr()), halves.nbytes());
    }
    return frame(h.dump(), out);
  }
  // This file's tensors rounded to BF16 and widened back, in F32.
  std::string bf16_rounded_f32_bytes() const {
    std::string rounded = data;
    for (auto& [name, info] : header.items()) {
      if (name == "__metadata__") continue;
      const size_t begin = info["data_offsets"][0], end = info["data_offsets"][1];
      auto floats = torch::from_blob(&rounded[begin], {static_cast<int64_t>((end - begin) / 4)}, torch::kFloat32);
      floats.copy_(floats.to(torch::kBFloat16).to(torch::kFloat32));
    }
    return frame(header.dump(), rounded);
  }
  static std::string frame(std::string text, const std::string& body) {
    while ((8 + text.size()) % 8) text += ' ';
    const uint64_t length = text.size();
    std::string out(reinterpret_cast<const char*>(&length), 8);
    return out + text + body;
  }
};

std::vector<double> logprobs_of(const torch::Tensor& logits, const std::vector<int>& tokens) {
  const auto lp = torch::log_softmax(logits.to(torch::kFloat64), -1);
  std::vector<double> out;
  for (size_t i = 0; i + 1 < tokens.size(); ++i) out.push_back(lp[i][tokens[i + 1]].item<double>());
  return out;
}

// Plain causal attention whose keys have dimension D-1 zeroed after RoPE: the reference
// for DMC that never merges.
class ZeroedLastKeyDim : public FullAttention {
 public:
  torch::Tensor attend(int layer, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       int64_t start) override {
    auto zeroed = k.clone();
    zeroed.select(2, k.size(2) - 1).zero_();
    return FullAttention::attend(layer, q, zeroed, v, start);
  }
};

}  // namespace

TEST_CASE("DMC's merge state follows the spec on hand-made tokens (GQA importance, window, slot count)", "[dmc]") {
  // 4 query heads over 2 KV heads, d = 4, W = 2, c = 0.5.
  ArchSpec arch;
  arch.n_layers = 1;
  arch.n_heads = 4;
  arch.n_kv_heads = 2;
  arch.head_dim = 4;
  arch.dmc.window = 2;
  arch.dmc.init_val = 0.5;
  const int64_t T = 7, d = 4, W = 2;
  const double c = 0.5;
  // Decisions k[D-1] - c: KV head 0 merges at 1, 2, 3 (a run of 4 > W) and 5; KV head 1 at 2, 4, 6.
  const double last_k[2][T] = {{3, 1, 2, 0.9, 0.1, 1.5, -4}, {-1, 0.2, 0.7, 0.0, 0.6, 0.4, 0.51}};
  std::mt19937_64 rng(29);
  std::normal_distribution<double> normal;
  auto q = torch::empty({T, 4, d}, torch::kFloat64), k = torch::empty({T, 2, d}, torch::kFloat64),
       v = torch::empty({T, 2, d}, torch::kFloat64);
  for (auto* t : {&q, &k, &v}) {
    double* p = t->data_ptr<double>();
    for (int64_t i = 0; i < t->numel(); ++i) p[i] = normal(rng);
  }
  for (int64_t i = 0; i < T; ++i)
    for (int h = 0; h < 2; ++h) k[i][h][d - 1] = last_k[h][i];

  DmcMergeState state(arch);
  // Two calls, as decode mode makes them: a prefill block, then the rest.
  DmcSlots first = state.step(0, q.narrow(0, 0, 3), k.narrow(0, 0, 3), v.narrow(0, 0, 3), 0);
  DmcSlots rest = state.step(0, q.narrow(0, 3, T - 3), k.narrow(0, 3, T - 3), v.narrow(0, 3, T - 3), 3);
  const auto merges = torch::cat({first.merges, rest.merges}, 0);
  const auto k_slots = torch::cat({first.k, rest.k}, 0), v_slots = torch::cat({first.v, rest.v}, 0);

  for (int h = 0; h < 2; ++h) {
    // The spec, written out: the run's tokens, each slot the omega-mean of the last W.
    std::vector<int64_t> run;
    int64_t ones = 0;
    for (int64_t i = 0; i < T; ++i) {
      const bool alpha = i > 0 && last_k[h][i] - c > 0;
      CHECK(merges[i][h].item<int>() == static_cast<int>(alpha));
      ones += alpha;
      if (!alpha) run.clear();
      run.push_back(i);
      std::vector<double> want_k(d, 0), want_v(d, 0), everything_k(d, 0);
      double z = 0, z_all = 0;
      for (size_t r = 0; r < run.size(); ++r) {
        const int64_t j = run[r];
        // The group mean of q[D-1] over query heads 2h and 2h+1.
        const double q_mean = (q[j][2 * h][d - 1].item<double>() + q[j][2 * h + 1][d - 1].item<double>()) / 2;
        const double omega = 1 / (1 + std::exp(-(q_mean + c))) + 1.0 / 128;
        for (int64_t x = 0; x < d - 1; ++x) everything_k[x] += omega * k[j][h][x].item<double>();
        z_all += omega;
        if (run.size() - r > static_cast<size_t>(W)) continue;  // dropped: older than the window
        z += omega;
        for (int64_t x = 0; x < d; ++x) {
          if (x < d - 1) want_k[x] += omega * k[j][h][x].item<double>();
          want_v[x] += omega * v[j][h][x].item<double>();
        }
      }
      std::vector<double> got_k(d), got_v(d);
      for (int64_t x = 0; x < d; ++x) {
        want_k[x] /= z;
        want_v[x] /= z;
        everything_k[x] /= z_all;
        got_k[x] = k_slots[i][h][x].item<double>();
        got_v[x] = v_slots[i][h][x].item<double>();
      }
      INFO("KV head " << h << " token " << i << " run length " << run.size());
      CHECK(max_diff(got_k, want_k) < 1e-13);
      CHECK(max_diff(got_v, want_v) < 1e-13);
      CHECK(got_k[d - 1] == 0.0);
      if (run.size() > static_cast<size_t>(W)) CHECK(max_diff(got_k, everything_k) > 1e-3);  // the drop shows
    }
    CHECK(state.merges(0, h) == ones);
    CHECK(state.slots(0, h) == T - ones);
  }
  CHECK(state.merges(0, 0) == 4);
  CHECK(state.merges(0, 1) == 3);
  CHECK(std::abs(state.merge_rate(0) - (4.0 / 6 + 3.0 / 6) / 2) < 1e-15);
  // Queries: dimension D-1 zeroed, the rest untouched.
  const auto q_out = torch::cat({first.q, rest.q}, 0);
  CHECK(q_out.select(2, d - 1).abs().max().item<double>() == 0.0);
  CHECK(torch::equal(q_out.narrow(2, 0, d - 1), q.narrow(2, 0, d - 1)));
  // Continuing at the wrong position is refused.
  CHECK_THAT(error_of([&] { state.step(0, q.narrow(0, 0, 1), k.narrow(0, 0, 1), v.narrow(0, 0, 1), 3); }),
             Catch::Contains("position 3") && Catch::Contains("at 7"));
}

TEST_CASE("DMC reproduces tools/ref_dmc.py's golden in float64 and float32, sim and decode", "[dmc][golden]") {
  const auto golden = test::read_json(test::data("golden/dmc_tiny_T120.json"));
  const std::vector<int> tokens = golden["tokens"].get<std::vector<int>>();
  const std::vector<double> want = golden["dmc_on"]["next_token_logprob"].get<std::vector<double>>();
  const auto& layers = golden["dmc_on"]["layers"];
  auto policy = full_policy();
  for (const auto& [dtype, tolerance] : {std::pair<std::string, double>{"float64", 1e-9}, {"float32", 1e-4}}) {
    auto model = load(test::data(kFixture), dtype);
    REQUIRE(model->arch().dmc.window == 12);
    REQUIRE(model->arch().dmc.init_val == 5.0);
    for (const auto& [mode, prefill] : {std::pair<Mode, int>{Mode::Sim, 0}, {Mode::Decode, 0}, {Mode::Decode, 50}}) {
      INFO(dtype << (mode == Mode::Sim ? " sim" : " decode") << " prefill " << prefill);
      auto score = score_sequence(*model, *policy, mode, tokens, prefill);
      CHECK(max_diff(score.next_token_logprob, want) < tolerance);
      CHECK(score.argmax == golden["dmc_on"]["argmax"].get<std::vector<int>>());
      REQUIRE(score.kv.dmc_merge_rate.size() == 2);
      for (int l = 0; l < 2; ++l) {
        double rate = 0;
        for (int h = 0; h < 4; ++h) {
          const auto& head = layers[l]["kv_heads"][h];
          CHECK(score.kv.kept_per_head[l][h] == head["final_slots"].get<int>());
          const std::string alpha = head["alpha"];
          const auto ones = std::count(alpha.begin(), alpha.end(), '1');
          CHECK(score.kv.kept_per_head[l][h] == 120 - ones);
          rate += static_cast<double>(ones) / 119 / 4;
          CHECK(std::abs(static_cast<double>(ones) / 119 - head["alpha_fraction"].get<double>()) < 1e-9);
        }
        CHECK(std::abs(score.kv.dmc_merge_rate[l] - rate) < 1e-15);
      }
    }
    // Every decision, per position: the merge state after a sim pass, replayed in decode steps.
    CacheAttention cache(*model, *policy, shape_for(*model, 120, 0));
    for (size_t i = 0; i < tokens.size(); ++i) {
      model->forward({tokens[i]}, static_cast<int64_t>(i), cache);
      for (int l = 0; l < 2; ++l)
        for (int h = 0; h < 4; ++h) {
          const std::string alpha = layers[l]["kv_heads"][h]["alpha"];
          const auto ones = std::count(alpha.begin(), alpha.begin() + i + 1, '1');
          REQUIRE(cache.dmc_state()->merges(l, h) == ones);
        }
    }
  }
}

TEST_CASE("DMC decode: greedy tokens and final slots match the golden", "[dmc][golden]") {
  const auto golden = test::read_json(test::data("golden/dmc_tiny_T120.json"));
  const std::vector<int> prompt = golden["greedy"]["prompt"].get<std::vector<int>>();
  const std::vector<int> want = golden["greedy"]["new_tokens"].get<std::vector<int>>();
  auto model = load(test::data(kFixture), "float32");
  auto policy = full_policy();
  GenerateOptions options;
  options.max_new_tokens = 16;
  CHECK(generate(*model, *policy, prompt, options).tokens == want);
  // The same steps by hand, so the cache can be read after the last new token is fed.
  CacheAttention cache(*model, *policy, shape_for(*model, 32, 16));
  torch::Tensor logits = model->forward(prompt, 0, cache);
  std::vector<int> got;
  for (int step = 0; step < 16; ++step) {
    got.push_back(static_cast<int>(logits[logits.size(0) - 1].argmax().item<int64_t>()));
    logits = model->forward({got.back()}, 16 + step, cache);
  }
  CHECK(got == want);
  CHECK(cache.stats().kept_per_head ==
        golden["greedy"]["final_slots"].get<std::vector<std::vector<int>>>());
  CHECK(cache.cached_tokens(1) == 30);
}

TEST_CASE("the DMC fixture with its two keys removed is plain LLaMA (the golden's dmc_off)", "[dmc][golden]") {
  const auto golden = test::read_json(test::data("golden/dmc_tiny_T120.json"));
  const std::vector<int> tokens = golden["tokens"].get<std::vector<int>>();
  const std::string dir = patched_model("dmc_off", test::data(kFixture), {{"dmc_window_size", nullptr}, {"dmc_init_val", nullptr}});
  auto model = load(dir, "float32");
  CHECK_FALSE(model->arch().dmc.enabled());
  auto score = score_sequence(*model, *full_policy(), Mode::Sim, tokens);
  CHECK(max_diff(score.next_token_logprob, golden["dmc_off"]["next_token_logprob"].get<std::vector<double>>()) < 1e-4);
  CHECK(score.kv.dmc_merge_rate.empty());
}

TEST_CASE("DMC that never merges equals plain attention with D-1 zeroed before and after RoPE", "[dmc]") {
  const auto golden = test::read_json(test::data("golden/dmc_tiny_T120.json"));
  const std::vector<int> tokens = golden["tokens"].get<std::vector<int>>();
  const std::string base = test::data(kFixture);
  // c huge: no decision is 1, every importance the same.
  const std::string never = patched_model("dmc_never", base, {{"dmc_init_val", 1e6}});
  // The plain reference: rows D-1 of every head's q_proj and k_proj (weights and biases) zeroed, no DMC keys.
  SafetensorsF32 weights(base + "/model.safetensors");
  const int64_t hidden = 64, heads = 4, d = 16;
  for (int l = 0; l < 2; ++l)
    for (const char* proj : {"q_proj", "k_proj"}) {
      const std::string p = "model.layers." + std::to_string(l) + ".self_attn." + proj;
      float* w = weights.tensor(p + ".weight");
      float* b = weights.tensor(p + ".bias");
      for (int64_t h = 0; h < heads; ++h) {
        std::fill_n(w + (h * d + d - 1) * hidden, hidden, 0.0f);
        b[h * d + d - 1] = 0;
      }
    }
  const std::string zeroed =
      patched_model("dmc_zeroed_plain", base, {{"dmc_window_size", nullptr}, {"dmc_init_val", nullptr}}, weights.bytes());
  auto dmc_model = load(never, "float64");
  auto plain_model = load(zeroed, "float64");
  ZeroedLastKeyDim reference;
  const auto want = logprobs_of(plain_model->forward(tokens, 0, reference), tokens);
  FullAttention zeroed_before_only;
  const auto before_only = logprobs_of(plain_model->forward(tokens, 0, zeroed_before_only), tokens);
  for (Mode mode : {Mode::Sim, Mode::Decode}) {
    auto score = score_sequence(*dmc_model, *full_policy(), mode, tokens);
    CHECK(max_diff(score.next_token_logprob, want) < 1e-9);
    // Zeroing only before RoPE is a different model (the golden's self-check: ~7e-4).
    CHECK(max_diff(score.next_token_logprob, before_only) > 1e-4);
    for (int l = 0; l < 2; ++l) CHECK(score.kv.kept_per_head[l] == std::vector<int>(4, 120));
    CHECK(score.kv.dmc_merge_rate == std::vector<double>{0, 0});
  }
}

TEST_CASE("DMC that always merges keeps one slot per head, and the decode cache shrinks to it", "[dmc]") {
  const auto golden = test::read_json(test::data("golden/dmc_tiny_T120.json"));
  const std::vector<int> tokens = golden["tokens"].get<std::vector<int>>();
  const std::string always = patched_model("dmc_always", test::data(kFixture), {{"dmc_init_val", -1e6}});
  auto model = load(always, "float32");
  auto policy = full_policy();
  auto sim = score_sequence(*model, *policy, Mode::Sim, tokens);
  auto decode = score_sequence(*model, *policy, Mode::Decode, tokens);
  CHECK(max_diff(sim.next_token_logprob, decode.next_token_logprob) < 1e-5);
  for (int l = 0; l < 2; ++l) CHECK(sim.kv.kept_per_head[l] == std::vector<int>(4, 1));
  CHECK(sim.kv.dmc_merge_rate == std::vector<double>{1, 1});
  // A 120-token prefill block leaves one slot per head: the buffers shrink from the
  // block's 120 rows to the slot, the next token's row and 16 to grow into.
  CacheAttention block(*model, *policy, shape_for(*model, 120, 120));
  model->forward(tokens, 0, block);
  CHECK(block.cached_tokens(0) == 1);
  CHECK(block.held_bytes() == 2 * 2 * 4 * (1 + 1 + 16) * 16 * 4);  // layers x K,V x heads x rows x d x float
  // Decode steps after it grow the rows back only as the slots need.
  model->forward({7}, 120, block);
  CHECK(block.held_bytes() == 2 * 2 * 4 * (1 + 1 + 16) * 16 * 4);
}

TEST_CASE("dmc_init_val of +-1e308 loads and means never / always merge (any finite c is well defined)", "[dmc]") {
  const auto golden = test::read_json(test::data("golden/dmc_tiny_T120.json"));
  const std::vector<int> tokens = golden["tokens"].get<std::vector<int>>();
  for (const auto& [c, rate, slots] : {std::tuple<double, double, int>{1e308, 0.0, 120}, {-1e308, 1.0, 1}}) {
    INFO("dmc_init_val " << c);
    auto model = load(patched_model(c > 0 ? "dmc_init_huge" : "dmc_init_tiny", test::data(kFixture), {{"dmc_init_val", c}}),
                      "float64");
    const auto score = score_sequence(*model, *full_policy(), Mode::Decode, tokens);
    CHECK(score.kv.dmc_merge_rate == std::vector<double>{rate, rate});
    for (int l = 0; l < 2; ++l) CHECK(score.kv.kept_per_head[l] == std::vector<int>(4, slots));
    for (double lp : score.next_token_logprob) CHECK(std::isfinite(lp));
  }
}

TEST_CASE("DMC on a GQA model: sim == decode, slots = tokens - merges", "[dmc]") {
  const std::string random = test::temp_dir("dmc_gqa_random");
  auto made = test::run_kvevict("make-random-model --out " + random +
                                " --layers 2 --hidden 64 --heads 8 --kv-heads 2 --intermediate 64 --vocab 128 --seed 3");
  REQUIRE(made.exit_code == 0);
  // Random weights put k[D-1] near 0: c = 0 makes about half the decisions merges; W = 3 cuts long runs.
  const std::string dir = patched_model("dmc_gqa", random, {{"dmc_window_size", 3}, {"dmc_init_val", 0.0}});
  std::vector<int> tokens;
  std::mt19937 rng(5);
  for (int i = 0; i < 90; ++i) tokens.push_back(static_cast<int>(rng() % 128));
  for (const std::string dtype : {"float32", "float64"}) {
    auto model = load(dir, dtype);
    REQUIRE(model->arch().n_kv_heads == 2);
    auto policy = full_policy();
    auto sim = score_sequence(*model, *policy, Mode::Sim, tokens);
    auto decode = score_sequence(*model, *policy, Mode::Decode, tokens);
    auto prefilled = score_sequence(*model, *policy, Mode::Decode, tokens, 40);
    INFO(dtype);
    CHECK(max_diff(sim.next_token_logprob, decode.next_token_logprob) < (dtype == "float32" ? 1e-5 : 1e-12));
    CHECK(max_diff(sim.next_token_logprob, prefilled.next_token_logprob) < (dtype == "float32" ? 1e-5 : 1e-12));
    CHECK(sim.kv.kept_per_head == decode.kv.kept_per_head);
    CHECK(sim.kv.kept_per_head == prefilled.kv.kept_per_head);
    CHECK(sim.kv.dmc_merge_rate == decode.kv.dmc_merge_rate);
    CHECK(sim.kv.peak_bytes == decode.kv.peak_bytes);
    SimAttention attention(*model, *policy, shape_for(*model, 90, 0));
    model->forward(tokens, 0, attention);
    for (int l = 0; l < 2; ++l)
      for (int h = 0; h < 2; ++h) {
        const int64_t merges = attention.dmc_state()->merges(l, h);
        CHECK(merges > 20);
        CHECK(merges < 70);
        CHECK(sim.kv.kept_per_head[l][h] == 90 - merges);
      }
  }
}

TEST_CASE("a DMC checkpoint stored in bf16 widens exactly", "[dmc]") {
  const auto golden = test::read_json(test::data("golden/dmc_tiny_T120.json"));
  const std::vector<int> tokens = golden["tokens"].get<std::vector<int>>();
  const std::string base = test::data(kFixture);
  SafetensorsF32 weights(base + "/model.safetensors");
  const std::string bf16 = patched_model("dmc_bf16", base, {{"torch_dtype", "bfloat16"}}, weights.bf16_bytes());
  const std::string rounded = patched_model("dmc_bf16_as_f32", base, json::object(), weights.bf16_rounded_f32_bytes());
  for (Mode mode : {Mode::Sim, Mode::Decode}) {
    auto from_bf16 = score_sequence(*load(bf16, "float32"), *full_policy(), mode, tokens);
    auto from_f32 = score_sequence(*load(rounded, "float32"), *full_policy(), mode, tokens);
    CHECK(max_diff(from_bf16.next_token_logprob, from_f32.next_token_logprob) == 0.0);
    CHECK(from_bf16.kv.kept_per_head == from_f32.kv.kept_per_head);
  }
}

TEST_CASE("DMC refuses what it does not implement: one decision for every head, sim-only, --kv-quant", "[dmc]") {
  auto model = load(test::data(kFixture), "float32");
  const std::vector<int> tokens = {1, 5, 9, 13, 200, 7, 7, 7};
  PolicyOptions o;
  o.budget.tokens = 4;
  for (Mode mode : {Mode::Sim, Mode::Decode}) {
    // TOVA's heads keep the same slots; DMC's heads merge on their own.
    CHECK_THAT(error_of([&] { score_sequence(*model, *make_policy("tova", o), mode, tokens); }),
               Catch::Contains("tova") && Catch::Contains("DMC") && Catch::Contains("dmc_window_size"));
    PolicyOptions kivi = o;
    kivi.kv_quant.bits = 2;
    kivi.kv_quant.group = 4;
    kivi.kv_quant.residual = 8;
    CHECK_THAT(error_of([&] { score_sequence(*model, *make_policy("h2o", kivi), mode, tokens); }),
               Catch::Contains("--kv-quant") && Catch::Contains("dmc_window_size"));
  }
  CHECK_THAT(error_of([&] { score_sequence(*model, *make_policy("h2o-paper", o), Mode::Sim, tokens); }),
             Catch::Contains("h2o-paper") && Catch::Contains("sim-only") && Catch::Contains("DMC"));
  FullAttention observed([](int, int64_t, int64_t, int64_t, const torch::Tensor&, const torch::Tensor&,
                            const torch::Tensor&, const torch::Tensor&) {},
                         0);
  CHECK_THAT(error_of([&] { model->forward(tokens, 0, observed); }), Catch::Contains("DMC"));
  // A decode step that skips a position is refused by the merge state.
  auto full = full_policy();  // the backend holds a reference
  CacheAttention cache(*model, *full, shape_for(*model, 8, 0));
  model->forward({1, 5}, 0, cache);
  CHECK_THAT(error_of([&] { model->forward({9}, 3, cache); }), Catch::Contains("DMC") && Catch::Contains("position 3"));
}

TEST_CASE("eviction over DMC's slots: every realisable policy the same in sim and decode, within its budget",
          "[dmc][policies]") {
  const auto golden = test::read_json(test::data("golden/dmc_tiny_T120.json"));
  const std::vector<int> tokens = golden["tokens"].get<std::vector<int>>();
  auto model = load(test::data(kFixture), "float32");
  const auto alone = score_sequence(*model, *full_policy(), Mode::Sim, tokens);
  int policies_run = 0;
  for (std::string name : policy_names()) {
    PolicyOptions o;
    o.budget.tokens = 24;
    auto policy = make_policy(name, test::runnable_on(name, *model, o));
    if (!policy->realisable() || policy->keeps_everything()) continue;
    if (test::needs_prepass(name)) {  // DMC's merged slots have no full-attention pre-pass
      INFO("policy " << name);
      CHECK_THAT(error_of([&] { score_sequence(*model, *policy, Mode::Sim, tokens, 50); }),
                 Catch::Contains("policy " + name) && Catch::Contains("DMC"));
      continue;
    }
    if (policy->as_realisable()->make_layer_states(0, shape_for(*model, 120, 0)).same_slots) continue;  // refused above
    INFO("policy " << name);
    const auto sim = score_sequence(*model, *policy, Mode::Sim, tokens);
    for (int prefill : {0, 50}) {
      INFO("prefill " << prefill);
      const auto decode = score_sequence(*model, *policy, Mode::Decode, tokens, prefill);
      const auto sim_prefill = prefill ? score_sequence(*model, *policy, Mode::Sim, tokens, prefill) : sim;
      CHECK(max_diff(sim_prefill.next_token_logprob, decode.next_token_logprob) < 1e-5);
      CHECK(sim_prefill.kv.kept_per_head == decode.kv.kept_per_head);
      CHECK(sim_prefill.kv.dmc_merge_rate == decode.kv.dmc_merge_rate);
      CHECK(sim_prefill.kv.peak_bytes == decode.kv.peak_bytes);
    }
    // The first layer's decisions come from the tokens alone; the policy changes what the
    // second layer sees, so its decisions may move.
    CHECK(sim.kv.dmc_merge_rate[0] == alone.kv.dmc_merge_rate[0]);
    CHECK(max_diff(sim.next_token_logprob, alone.next_token_logprob) > 1e-3);  // it evicted
    ++policies_run;
    if (name.rfind("sparse-", 0) == 0) continue;  // a static pattern's budget counts the keys a query sees
    int heads = 0, within = 0;
    for (int l = 0; l < 2; ++l)
      for (int kept : sim.kv.kept_per_head[l]) {
        ++heads;
        within += kept <= policy->layer_budget(l, shape_for(*model, 120, 0)).capacity;
      }
    // duo-attention's retrieval heads keep every slot; its streaming heads hold the budget.
    if (test::needs_pattern_file(name))
      CHECK(within > 0);
    else
      CHECK(within == heads);
  }
  CHECK(policies_run >= 6);
}

TEST_CASE("a policy whose budget holds every DMC slot is DMC alone", "[dmc][policies]") {
  const auto golden = test::read_json(test::data("golden/dmc_tiny_T120.json"));
  const std::vector<int> tokens = golden["tokens"].get<std::vector<int>>();
  PolicyOptions o;
  o.budget.tokens = 120;  // the whole sequence
  for (const auto& [dtype, tolerance] : {std::pair<std::string, double>{"float64", 1e-12}, {"float32", 1e-5}}) {
    auto model = load(test::data(kFixture), dtype);
    for (const std::string name : {"h2o", "local", "snapkv"}) {
      auto policy = make_policy(name, o);
      for (Mode mode : {Mode::Sim, Mode::Decode}) {
        INFO(dtype << " " << name << (mode == Mode::Sim ? " sim" : " decode"));
        const auto under = score_sequence(*model, *policy, mode, tokens);
        const auto alone = score_sequence(*model, *full_policy(), mode, tokens);
        CHECK(max_diff(under.next_token_logprob, alone.next_token_logprob) < tolerance);
        CHECK(under.kv.kept_per_head == alone.kv.kept_per_head);
        CHECK(under.kv.dmc_merge_rate == alone.kv.dmc_merge_rate);
      }
    }
  }
}

TEST_CASE("analyze reports a DMC model's per-head compression (tokens / slots)", "[dmc]") {
  const auto golden = test::read_json(test::data("golden/dmc_tiny_T120.json"));
  const std::vector<int> tokens = golden["tokens"].get<std::vector<int>>();
  auto model = load(test::data(kFixture), "float32");
  const std::vector<int> prefix(tokens.begin(), tokens.begin() + 60);
  const AttentionAnalysis analysis = analyze_attention(*model, {tokens, prefix}, AnalyzeOptions{});
  CHECK(analysis.sequences == 2);
  CHECK(analysis.tokens == 180);
  REQUIRE(analysis.layers.size() == 2);
  for (int l = 0; l < 2; ++l) {
    const std::vector<double> ratios = analysis.layers[l].dmc_compression();
    REQUIRE(ratios.size() == 4);
    for (int h = 0; h < 4; ++h) {
      const std::string alpha = golden["dmc_on"]["layers"][l]["kv_heads"][h]["alpha"];
      const auto slots = 120 - std::count(alpha.begin(), alpha.end(), '1') + 60 -
                         std::count(alpha.begin(), alpha.begin() + 60, '1');
      CHECK(ratios[h] == 180.0 / static_cast<double>(slots));
    }
  }
  const json j = analysis.to_json(AnalyzeOptions{});
  CHECK(j["layers"][1]["dmc_compression"].size() == 4);
  CHECK_THAT(analysis.to_csv(AnalyzeOptions{}), Catch::Contains("1,3,dmc_compression,,,,"));
}

TEST_CASE("results files from before dmc_merge_rate still read, and an append upgrades them", "[dmc][results]") {
  ResultRow row;
  row.model = "m";
  row.task = "copa";
  row.policy = "full";
  row.metric = "acc";
  row.value = 0.5;
  row.n = 10;
  const std::string path = test::write_older_results("pre-dmc-results", {"dmc_merge_rate"}, row);
  auto rows = read_results_csv(path);
  REQUIRE(rows.size() == 1);
  CHECK(!rows[0].dmc_merge_rate);
  row.dmc_merge_rate = 0.25;
  append_rows_durably(path, {row});
  std::ifstream in(path);
  std::string header;
  std::getline(in, header);
  CHECK(header == result_header());
  rows = read_results_csv(path);
  REQUIRE(rows.size() == 2);
  CHECK(!rows[0].dmc_merge_rate);
  CHECK(rows[1].dmc_merge_rate == 0.25);
}

TEST_CASE("dmc_merge_rate in perplexity --format json and in eval's result rows", "[dmc][cli]") {
  const auto golden = test::read_json(test::data("golden/dmc_tiny_T120.json"));
  const std::string dir = test::temp_dir("dmc_cli");
  std::ofstream out(dir + "/tokens.txt");
  for (int id : golden["tokens"].get<std::vector<int>>()) out << id << " ";
  out.close();
  for (const char* mode : {"sim", "decode"}) {
    auto r = test::run_kvevict("perplexity --model " + test::data(kFixture) + " --tokens-file " + dir +
                               "/tokens.txt --mode " + mode + " --format json");
    REQUIRE(r.exit_code == 0);
    const auto j = json::parse(r.out);
    CHECK(std::abs(j["mean_nll"].get<double>() - golden["dmc_on"]["mean_nll"].get<double>()) < 1e-4);
    REQUIRE(j["dmc_merge_rate"].size() == 2);
    for (int l = 0; l < 2; ++l) {
      double rate = 0;
      for (const auto& head : golden["dmc_on"]["layers"][l]["kv_heads"]) rate += head["alpha_fraction"].get<double>() / 4;
      CHECK(std::abs(j["dmc_merge_rate"][l].get<double>() - rate) < 1e-9);
      std::vector<int> slots;
      for (const auto& head : golden["dmc_on"]["layers"][l]["kv_heads"]) slots.push_back(head["final_slots"]);
      CHECK(j["kv_tokens_kept_per_head"][l] == slots);
    }
  }
  // eval's rows (a sweep appends the same rows): the fixture's vocabulary is stories260K's 512 tokens.
  const std::string model = patched_model("dmc_with_tokenizer", test::data(kFixture), json::object());
  fs::create_symlink(test::data("models/stories260K-hf/tokenizer.model"), model + "/tokenizer.model");
  auto r = test::run_kvevict("eval --task copa --limit 3 --model " + model + " --format csv");
  REQUIRE(r.exit_code == 0);
  const auto lines = r.out.substr(0, r.out.find('\n'));
  CHECK(lines == result_header());
  const std::string path = dir + "/rows.csv";
  std::ofstream(path) << r.out;
  const auto rows = read_results_csv(path);
  REQUIRE(!rows.empty());
  for (const ResultRow& row : rows) {
    REQUIRE(row.dmc_merge_rate);
    CHECK(*row.dmc_merge_rate > 0.3);
    CHECK(*row.dmc_merge_rate < 0.8);
  }
  auto plain = test::run_kvevict("eval --task copa --limit 1 --format json");
  REQUIRE(plain.exit_code == 0);
  CHECK(!json::parse(plain.out).contains("dmc_merge_rate"));
}
