// The LLaMA-family config keys: what is read (rope scaling, windows, head_dim) and the
// one-line refusal of every math-changing key that is not implemented. Numbers against
// the references are in test_model.cpp ("LLaMA-family variants ...").
#include <cmath>
#include <filesystem>
#include <fstream>

#include "harness/runtime/attention.h"
#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "harness/model/rope.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;
namespace fs = std::filesystem;

namespace {

// A model directory whose config.json is the fixture's with `edit` applied; the weights
// are symlinked, not copied.
std::string edited_model(const std::string& fixture, const std::string& name,
                         const std::function<void(nlohmann::json&)>& edit) {
  const auto dir = test::temp_dir("arch_" + name);
  const fs::path source = test::data("models/" + fixture);
  for (auto& entry : fs::directory_iterator(source))
    if (entry.path().filename() != "config.json")
      fs::create_symlink(fs::absolute(entry.path()), fs::path(dir) / entry.path().filename());
  auto config = test::read_json((source / "config.json").string());
  edit(config);
  std::ofstream(fs::path(dir) / "config.json") << config.dump(2);
  return dir;
}

std::string load_error(const std::string& dir) {
  try {
    Model::load(dir);
  } catch (const Error& e) {
    return e.what();
  }
  return "";
}

// The error is one line and names config.json and the key.
void check_refused(const std::string& fixture, const std::string& key,
                   const std::function<void(nlohmann::json&)>& edit) {
  const auto message = load_error(edited_model(fixture, key, edit));
  INFO(fixture << " " << key << ": " << message);
  CHECK_THAT(message, Catch::Contains("config.json") && Catch::Contains(key));
  CHECK(message.find('\n') == std::string::npos);
}

}  // namespace

TEST_CASE("math-changing config keys that are not implemented are refused, naming the key",
          "[arch][errors]") {
  check_refused("tiny-random-llama3", "yarn", [](auto& c) { c["rope_scaling"]["rope_type"] = "yarn"; });
  check_refused("tiny-random-llama3", "rope_type", [](auto& c) { c["rope_scaling"]["rope_type"] = "longrope"; });
  check_refused("tiny-random-llama3", "rope_scaling.low_freq_factor",
                [](auto& c) { c["rope_scaling"].erase("low_freq_factor"); });
  check_refused("tiny-random-llama3", "rope_scaling.factor", [](auto& c) {
    c["rope_scaling"] = {{"type", "linear"}};
  });
  check_refused("tiny-random-phi3", "rope_scaling", [](auto& c) {
    c["rope_scaling"] = {{"type", "longrope"}, {"short_factor", {1, 1}}, {"long_factor", {1, 1}}};
  });
  check_refused("tiny-random-phi3", "rope_scaling", [](auto& c) { c["rope_scaling"] = {{"type", "su"}}; });
  check_refused("tiny-random-llama3", "mlp_bias", [](auto& c) { c["mlp_bias"] = true; });
  check_refused("tiny-random-mistral", "attention_bias", [](auto& c) { c["attention_bias"] = true; });
  check_refused("tiny-random-phi3", "attention_bias", [](auto& c) { c["attention_bias"] = true; });
  check_refused("tiny-random-qwen2", "use_sliding_window", [](auto& c) {
    c["use_sliding_window"] = true;
    c["sliding_window"] = 4;
    c["max_window_layers"] = 1;
  });
  check_refused("tiny-random-qwen3", "use_sliding_window", [](auto& c) { c["use_sliding_window"] = true; });
  check_refused("tiny-random-qwen3", "layer_types",
                [](auto& c) { c["layer_types"] = {"full_attention", "sliding_attention"}; });
  check_refused("tiny-random-llama3", "partial_rotary_factor", [](auto& c) { c["partial_rotary_factor"] = 0.5; });
  check_refused("tiny-random-qwen2", "hidden_act", [](auto& c) { c["hidden_act"] = "gelu"; });
  check_refused("tiny-random-mistral", "final_logit_softcapping", [](auto& c) { c["final_logit_softcapping"] = 30.0; });
  check_refused("tiny-random-mistral", "sliding_window", [](auto& c) { c["sliding_window"] = 0; });

  SECTION("the CLI prints the one line and exits non-zero") {
    auto dir = edited_model("tiny-random-llama3", "cli_yarn", [](auto& c) { c["rope_scaling"]["rope_type"] = "yarn"; });
    auto r = test::run_kvevict("perplexity --model " + dir + " --tokens-file " + dir + "/config.json");
    CHECK(r.exit_code != 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, Catch::Contains("rope_scaling.rope_type \"yarn\" is not implemented"));
  }
}

TEST_CASE("keys that do not change the math, or that are off, load", "[arch]") {
  // Released configs carry these: Qwen2.5's sliding_window with use_sliding_window false,
  // Mistral v0.3's null window, Phi-3's null rope_scaling, explicit default RoPE.
  auto qwen = edited_model("tiny-random-qwen2", "qwen_off", [](auto& c) {
    c["use_sliding_window"] = false;
    c["sliding_window"] = 4;
    c["max_window_layers"] = 1;
  });
  CHECK(Model::load(qwen)->arch().sliding_window == 0);
  auto mistral = edited_model("tiny-random-mistral", "mistral_null", [](auto& c) { c["sliding_window"] = nullptr; });
  CHECK(Model::load(mistral)->arch().sliding_window == 0);
  auto llama = edited_model("tiny-random-llama3", "llama_default", [](auto& c) { c["rope_scaling"] = {{"rope_type", "default"}}; });
  CHECK(Model::load(llama)->arch().rope_scaling.type == "default");
  // Qwen2.5-7B style tied head: no lm_head.weight stored, the embedding is the head.
  CHECK(Model::load(test::data("models/tiny-random-qwen2"))->arch().tied_head);
}

TEST_CASE("rope scaling follows Hugging Face's formulas", "[arch]") {
  ArchSpec a;
  a.rotary_dim = 16;
  a.rope_theta = 500000;
  a.max_positions = 64;
  auto plain = rope_inv_freq(a, 10);
  SECTION("linear divides every frequency by the factor") {
    a.rope_scaling.type = "linear";
    a.rope_scaling.factor = 4;
    CHECK(torch::allclose(rope_inv_freq(a, 10), plain / 4));
  }
  SECTION("llama3 keeps high frequencies, divides low ones and blends the band between") {
    a.rope_scaling = {"llama3", 8, 1, 4, 64};
    auto scaled = rope_inv_freq(a, 10);
    const double pi = 3.14159265358979323846;
    int kept = 0, divided = 0, blended = 0;
    for (int i = 0; i < 8; ++i) {
      const double f = plain[i].item<double>(), wavelen = 2 * pi / f, got = scaled[i].item<double>();
      if (wavelen < 16) {
        CHECK(got == Approx(f));
        ++kept;
      } else if (wavelen > 64) {
        CHECK(got == Approx(f / 8));
        ++divided;
      } else {
        const double s = (64 / wavelen - 1) / 3;
        CHECK(got == Approx((1 - s) * f / 8 + s * f));
        ++blended;
      }
    }
    CHECK(kept > 0);  // the fixture's shape reaches all three regimes
    CHECK(divided > 0);
    CHECK(blended > 0);
  }
  SECTION("dynamic NTK changes nothing within the context and raises the base beyond it") {
    a.rope_scaling.type = "dynamic";
    a.rope_scaling.factor = 2;
    CHECK(torch::equal(rope_inv_freq(a, 64), plain));
    auto longer = rope_inv_freq(a, 128);
    const double base = 500000 * std::pow(2.0 * 128 / 64 - 1, 16.0 / 14);
    CHECK(longer[1].item<double>() == Approx(std::pow(base, -2.0 / 16)).epsilon(1e-5));
  }
}

TEST_CASE("RoPE's cos and sin: Hugging Face's float32 angles, each cos and sin rounded once, a row per position",
          "[arch]") {
  ArchSpec a;
  a.rotary_dim = 64;
  a.rope_theta = 10000;
  a.max_positions = 4096;
  const auto inv_freq = rope_inv_freq(a, 10);  // [32] float32
  const int64_t start = 3000, t = 37;
  const auto [cos, sin] = rope_cos_sin(inv_freq, start, t, torch::kFloat32, torch::kCPU);
  REQUIRE(cos.sizes() == torch::IntArrayRef({t, 1, 64}));
  // The angles as Hugging Face computes them (float32 products), the functions in float64.
  const auto freqs = torch::outer(torch::arange(start, start + t, torch::kFloat32), inv_freq);
  const auto angles = torch::cat({freqs, freqs}, -1).to(torch::kFloat64).unsqueeze(1);
  CHECK(torch::equal(cos, angles.cos().to(torch::kFloat32)));
  CHECK(torch::equal(sin, angles.sin().to(torch::kFloat32)));
  // Within an ulp or two of ATen's float32 cos (Sleef's, within 1 ulp): a test that the angles are the same.
  CHECK(torch::allclose(cos, angles.to(torch::kFloat32).cos(), 0, 3e-7));
  // Position 3010's row alone is the block's row, on any thread count and in bfloat16 too.
  const auto [one_cos, one_sin] = rope_cos_sin(inv_freq, start + 10, 1, torch::kFloat32, torch::kCPU);
  CHECK(torch::equal(one_cos[0], cos[10]));
  CHECK(torch::equal(one_sin[0], sin[10]));
  const auto [bf_cos, bf_sin] = rope_cos_sin(inv_freq, start, t, torch::kBFloat16, torch::kCPU);
  CHECK(torch::equal(bf_cos, cos.to(torch::kBFloat16)));
  CHECK(torch::equal(bf_sin, sin.to(torch::kBFloat16)));
  // float64 reference runs: the angles and the functions in float64 (std::cos against
  // ATen's, each within an ulp).
  const auto inv64 = rope_inv_freq(a, 10, torch::kFloat64);
  const auto [cos64, sin64] = rope_cos_sin(inv64, start, t, torch::kFloat64, torch::kCPU);
  const auto freqs64 = torch::outer(torch::arange(start, start + t, torch::kFloat64), inv64);
  CHECK(torch::allclose(cos64, torch::cat({freqs64, freqs64}, -1).cos().unsqueeze(1), 0, 1e-15));
  CHECK(torch::allclose(sin64, torch::cat({freqs64, freqs64}, -1).sin().unsqueeze(1), 0, 1e-15));
}

TEST_CASE("make-random-model writes a loadable Qwen3-shaped checkpoint", "[arch][cli]") {
  const auto dir = test::temp_dir("random_qwen3");
  auto r = test::run_kvevict("make-random-model --out " + dir + " --arch qwen3 --layers 2 --hidden 64 --heads 4"
                             " --kv-heads 2 --head-dim 32 --intermediate 96 --vocab 300 --max-positions 64");
  REQUIRE(r.exit_code == 0);
  auto model = Model::load(dir);
  CHECK(model->arch().model_type == "qwen3");
  CHECK(model->arch().head_dim == 32);  // heads x head_dim = 128, not hidden 64
  FullAttention attention;
  auto logits = model->forward({1, 2, 3}, 0, attention);
  CHECK(logits.size(0) == 3);
  CHECK(logits.size(1) == 300);
  CHECK(torch::isfinite(logits).all().item<bool>());
}

TEST_CASE("perplexity's KV accounting reports Mistral's window", "[arch][cli]") {
  auto golden = test::read_json(test::data("golden/tiny_models/tiny-random-mistral.json"));
  const auto dir = test::temp_dir("mistral_tokens");
  std::ofstream out(dir + "/tokens.txt");
  for (int id : golden["tokens"].get<std::vector<int>>()) out << id << " ";
  out.close();
  auto r = test::run_kvevict("perplexity --model " + test::data("models/tiny-random-mistral") + " --tokens-file " +
                             dir + "/tokens.txt --policy h2o --budget-tokens 20 --mode decode --format json");
  REQUIRE(r.exit_code == 0);
  auto j = nlohmann::json::parse(r.out);
  CHECK(j["kv_sliding_window"] == 8);
  CHECK(j["kv_tokens_kept"] == nlohmann::json({20, 20}));
  CHECK(j["kv_tokens_visible"] == nlohmann::json({8, 8}));
}

TEST_CASE("dynamic NTK RoPE past max_position_embeddings: the CLI's log-probs are those of the raised base",
          "[arch][cli]") {
  // Hugging Face's dynamic NTK recomputes the base for each forward pass of seq_len
  // tokens beyond max_position_embeddings M: base * (factor * seq_len / M - (factor - 1))
  // ^ (dim / (dim - 2)). One teacher-forced pass of all 40 golden tokens with M = 24 and
  // factor 2 is therefore the plain model with rope_theta raised by that formula, written
  // out here; within M tokens it is the plain model.
  const auto golden = test::read_json(test::data("golden/tiny_models/tiny-random-llama-gqa.json"));
  const auto tokens = golden["tokens"].get<std::vector<int>>();
  REQUIRE(tokens.size() == 40);
  const auto dir = test::temp_dir("dynamic_ntk");
  const std::string tokens_file = dir + "/tokens.txt";
  {
    std::ofstream out(tokens_file);
    for (int id : tokens) out << id << " ";
  }
  const double theta = 500000, factor = 2, dim = 8, trained = 24, length = 40;
  const auto dynamic = edited_model("tiny-random-llama-gqa", "dynamic", [&](auto& c) {
    REQUIRE(c["rope_theta"].template get<double>() == theta);
    REQUIRE(c["head_dim"].template get<double>() == dim);
    c["max_position_embeddings"] = static_cast<int>(trained);
    c["rope_scaling"] = {{"rope_type", "dynamic"}, {"factor", factor}};
  });
  const auto raised = edited_model("tiny-random-llama-gqa", "raised", [&](auto& c) {
    c["rope_theta"] = theta * std::pow(factor * length / trained - (factor - 1), dim / (dim - 2));
  });
  const auto plain = test::data("models/tiny-random-llama-gqa");
  auto logprobs = [&](const std::string& model, int max_tokens) {
    auto r = test::run_kvevict("perplexity --model " + model + " --tokens-file " + tokens_file + " --max-tokens " +
                               std::to_string(max_tokens) + " --mode sim --per-token --format json");
    INFO(r.err);
    REQUIRE(r.exit_code == 0);
    return nlohmann::json::parse(r.out)["next_token_logprob"].get<std::vector<double>>();
  };
  const auto past = logprobs(dynamic, 40);
  REQUIRE(past.size() == 39);
  CHECK(test::max_diff(past, logprobs(raised, 40)) < 1e-6);
  CHECK(test::max_diff(past, logprobs(plain, 40)) > 1e-3);  // the base really changed
  CHECK(test::max_diff(logprobs(dynamic, 24), logprobs(plain, 24)) == 0);
}
