// The model runtime against independent float64 references (golden/README.md).
#include <filesystem>
#include <fstream>
#include <map>
#include <torch/cuda.h>

#include "harness/runtime/attention.h"
#include "harness/common/errors.h"
#include "harness/model/model.h"
#include "harness/model/threads.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "tests/compare.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;
using test::max_diff;
namespace fs = std::filesystem;

namespace {

std::unique_ptr<Policy> full_cache_policy() { return make_policy("full", PolicyOptions{}); }

// A tensor's values as doubles, for max_diff.
std::vector<double> values(const torch::Tensor& t) {
  const auto c = t.to(torch::kCPU, torch::kFloat64).contiguous();
  return {c.data_ptr<double>(), c.data_ptr<double>() + c.numel()};
}

// Greedy continuation by full recompute, as the goldens were made.
std::vector<int> greedy_by_recompute(const Model& model, std::vector<int> tokens, int steps) {
  std::vector<int> out;
  for (int s = 0; s < steps; ++s) {
    FullAttention attention;
    auto logits = model.forward(tokens, 0, attention);
    int next = static_cast<int>(logits[logits.size(0) - 1].argmax().item<int64_t>());
    out.push_back(next);
    tokens.push_back(next);
  }
  return out;
}

void check_golden_model(const std::string& model_dir, const std::string& golden_file) {
  INFO(model_dir);
  auto golden = test::read_json(test::data(golden_file));
  auto model = Model::load(test::data(model_dir), test::model_options());
  auto tokens = golden["tokens"].get<std::vector<int>>();
  auto policy = full_cache_policy();
  auto expected = golden["full"]["next_token_logprob"].get<std::vector<double>>();
  // By recompute (one teacher-forced pass) and with the real cache, token by token.
  for (Mode mode : {Mode::Sim, Mode::Decode}) {
    auto score = score_sequence(*model, *policy, mode, tokens);
    INFO("mode " << mode_name(mode));
    CHECK(max_diff(score.next_token_logprob, expected) < 1e-4);
  }

  // golden/README.md: logits_rows within 1e-4, as the log-probs.
  FullAttention attention;
  auto logits = model->forward(tokens, 0, attention);
  for (auto& [row, want] : golden["full"]["logits_rows"].items()) {
    INFO("logits row " << row);
    CHECK(max_diff(values(logits[std::stoi(row)]), want.get<std::vector<double>>()) < 1e-4);
  }
  if (golden.contains("greedy")) {
    auto prompt = golden["greedy"]["prompt"].get<std::vector<int>>();
    auto want = golden["greedy"]["new_tokens"].get<std::vector<int>>();
    CHECK(greedy_by_recompute(*model, prompt, static_cast<int>(want.size())) == want);
    // The real cache gives the same greedy tokens as recompute.
    GenerateOptions options;
    options.max_new_tokens = static_cast<int>(want.size());
    CHECK(generate(*model, *policy, prompt, options).tokens == want);
  }
}

// A copy of a model directory that a test may damage.
std::string copy_model(const std::string& model_dir, const std::string& name) {
  auto dir = test::temp_dir(name);
  for (auto& entry : fs::directory_iterator(test::data(model_dir)))
    fs::copy_file(entry.path(), fs::path(dir) / entry.path().filename());
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

}  // namespace

TEST_CASE("stories260K full attention matches the float64 reference", "[model][golden]") {
  auto golden = test::read_json(test::data("golden/stories260K_tinystories_T200.json"));
  auto model = Model::load(test::data("models/stories260K-hf"), test::model_options());
  auto tokens = golden["tokens"].get<std::vector<int>>();
  REQUIRE(tokens.size() == 200);
  auto policy = full_cache_policy();
  for (Mode mode : {Mode::Sim, Mode::Decode}) {
    auto score = score_sequence(*model, *policy, mode, tokens);
    auto expected = golden["full"]["next_token_logprob"].get<std::vector<double>>();
    INFO("mode " << mode_name(mode));
    CHECK(max_diff(score.next_token_logprob, expected) < 1e-4);
    double nll = 0;
    for (double logprob : score.next_token_logprob) nll -= logprob;
    CHECK(nll / expected.size() == Approx(golden["full"]["mean_nll"].get<double>()).margin(1e-5));
  }
  // golden/README.md: a float32 implementation matches the logits rows within 1e-4.
  FullAttention attention;
  auto logits = model->forward(tokens, 0, attention);
  for (auto& [row, want] : golden["full"]["logits_rows"].items()) {
    INFO("logits row " << row);
    CHECK(max_diff(values(logits[std::stoi(row)]), want.get<std::vector<double>>()) < 1e-4);
  }
}

TEST_CASE("sim and decode modes give the same numbers on one, two and three threads", "[model][threads]") {
  // Every product is split by its shape only and each piece runs on one thread: the KV
  // heads' attention products (heads_bmm) and the projections' weight tiles
  // (tiled_linear). Where OpenBLAS split a product over the threads itself, its Haswell
  // kernels (AVX2 without AVX-512) changed every log-prob between one thread and two.
  const Model& model = test::stories();
  // 400 tokens: longer products than the golden's 200.
  auto tokens = model.encode(test::read_text(test::data("text/tinystories_sample.txt")), true);
  REQUIRE(tokens.size() >= 400);
  tokens.resize(400);
  PolicyOptions budget;
  budget.budget.ratio = 0.3;
  for (const std::string name : {"full", "h2o", "h2o-paper", "tova"}) {
    auto policy = make_policy(name, name == "full" ? PolicyOptions{} : budget);
    for (Mode mode : {Mode::Sim, Mode::Decode}) {
      if (mode == Mode::Decode && !policy->realisable()) continue;
      set_thread_count(1);
      const auto one = score_sequence(model, *policy, mode, tokens).next_token_logprob;
      for (int threads : {2, 3}) {
        set_thread_count(threads);
        const auto more = score_sequence(model, *policy, mode, tokens).next_token_logprob;
        REQUIRE(more.size() == one.size());
        size_t differ = 0;
        for (size_t i = 0; i < one.size(); ++i) differ += !(one[i] == more[i]);  // a NaN differs
        INFO(name << " " << mode_name(mode) << ": " << differ << " of " << one.size() << " log-probs differ between 1 and "
                  << threads << " threads");
        CHECK(differ == 0);
      }
    }
  }
  set_thread_count(0);
}

TEST_CASE("generate reproduces llama2.c's documented greedy stories260K output", "[model][cli]") {
  auto result = test::run_kvevict("generate --model " + test::data("models/stories260K-hf") +
                                  " --prompt \"\" --max-new-tokens 256");
  REQUIRE(result.exit_code == 0);
  auto expected = test::read_text(test::data("models/stories260K/expected_greedy_t0.txt"));
  while (!expected.empty() && expected.back() == '\n') expected.pop_back();
  CHECK(result.out.substr(0, expected.size()) == expected);
}

TEST_CASE("generate keeps the space before the first new token", "[model][cli]") {
  // The greedy continuation of "Once" is the same text as the prompt "Once upon a time"
  // continues; decoding the new tokens on their own used to print "Onceupon".
  auto short_prompt = test::run_kvevict("generate --model " + test::data("models/stories260K-hf") +
                                        " --prompt Once --max-new-tokens 6");
  REQUIRE(short_prompt.exit_code == 0);
  CHECK(short_prompt.out.rfind("Once upon a time,", 0) == 0);
  auto from_bos = test::run_kvevict("generate --model " + test::data("models/stories260K-hf") +
                                    " --prompt \"\" --max-new-tokens 6");
  REQUIRE(from_bos.exit_code == 0);
  CHECK(from_bos.out.rfind("Once upon a time,", 0) == 0);
}

TEST_CASE("bfloat16 and float16 compute match the float64 golden within their rounding", "[model][dtype][golden]") {
  // The tolerance comes from the dtype's rounding, not from a measurement of this code.
  // bfloat16 keeps 8 significant bits and float16 11: each stored number (a weight, an op's
  // output) is off by at most u = 2^-8 or 2^-11 of itself; sums run in float32 (error far
  // below u). A rounding that acts on the residual stream at its full scale moves the
  // logits by about u * max|z| (the norms keep the stream's scale, so the layers do not
  // amplify it): the embedding, in each layer the attention and MLP outputs and the two
  // residual sums, the final norm and the logits, N = 4 * layers + 3 roundings. Added with
  // the same sign every time, they give the bound |dz| <= N u max|z| for a logits row,
  // and |d log p| <= 2 N u max|z| for a log-prob (log p = z_t - logsumexp(z), each term
  // moving by at most max |dz|). Nothing in it depends on the CPU's kernels (AVX-512 BF16,
  // AVX2 or none). Measured on stories260K (5 layers, N = 23), in the same units on every
  // ATEN_CPU_CAPABILITY: logits rows 3.7 (bfloat16) and 4.5 (float16), log-probs 6.3 and 5.0.
  // And the error must scale with u: float16's mean log-prob error at most a quarter of
  // bfloat16's (their u differ by 8x; measured 0.0029 against 0.0217).
  const auto golden = test::read_json(test::data("golden/stories260K_tinystories_T200.json"));
  const auto tokens = golden["tokens"].get<std::vector<int>>();
  const auto expected = golden["full"]["next_token_logprob"].get<std::vector<double>>();
  auto model32 = Model::load(test::data("models/stories260K-hf"), test::model_options());
  const double roundings = 4.0 * model32->arch().n_layers + 3;
  // Each position's logit scale, max_v |z_iv|, from the float32 model (within 1e-4 of the golden).
  FullAttention full32;
  const auto scale = std::get<0>(model32->forward(tokens, 0, full32).abs().max(-1));
  auto policy = full_cache_policy();
  struct Case {
    const char* dtype;
    double roundoff;  // u
  };
  std::map<std::string, double> mean_error;
  for (const Case c : {Case{"bfloat16", 1.0 / 256}, Case{"float16", 1.0 / 2048}}) {
    INFO("dtype " << c.dtype);
    ModelOptions options = test::model_options();
    options.dtype = c.dtype;
    auto model = Model::load(test::data("models/stories260K-hf"), options);
    FullAttention attention;
    const auto logits = model->forward(tokens, 0, attention);
    for (auto& [row, want] : golden["full"]["logits_rows"].items()) {
      INFO("logits row " << row);
      const double bound = roundings * c.roundoff * scale[std::stoi(row)].item<double>();
      CHECK(max_diff(values(logits[std::stoi(row)]), want.get<std::vector<double>>()) <= bound);
    }
    for (Mode mode : {Mode::Sim, Mode::Decode}) {
      INFO("mode " << mode_name(mode));
      const auto got = score_sequence(*model, *policy, mode, tokens).next_token_logprob;
      max_diff(got, expected);  // same size, finite everywhere
      size_t outside = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        const double error = std::abs(got[i] - expected[i]);
        outside += !(error <= 2 * roundings * c.roundoff * scale[i].item<double>());
        mean_error[c.dtype] += error / (2 * got.size());
      }
      CHECK(outside == 0);
    }
  }
  INFO("mean |log-prob error|: bfloat16 " << mean_error["bfloat16"] << ", float16 " << mean_error["float16"]);
  CHECK(mean_error["float16"] <= mean_error["bfloat16"] / 4);
  CHECK(mean_error["float16"] > 0);  // it really computed in float16
}

TEST_CASE("the command line runs --dtype float16 and bfloat16", "[model][dtype][cli]") {
  const std::string tokens = test::temp_dir("dtype_cli") + "/tokens.txt";
  {
    std::ofstream out(tokens);
    for (int id : test::golden_tokens()) out << id << " ";
  }
  const auto expected = test::read_json(test::data("golden/stories260K_tinystories_T200.json"))["full"]["mean_nll"].get<double>();
  for (const std::string dtype : {"float16", "bfloat16"}) {
    for (const std::string mode : {"sim", "decode"}) {
      auto r = test::run_kvevict("perplexity --tokens-file " + tokens + " --dtype " + dtype + " --mode " + mode +
                                 " --format json");
      INFO(dtype << " " << mode << ": " << r.err);
      REQUIRE(r.exit_code == 0);
      // The mean over 199 tokens: well inside the per-token bound of the test above.
      CHECK(std::abs(nlohmann::json::parse(r.out)["mean_nll"].get<double>() - expected) < 0.01);
    }
    auto generated = test::run_kvevict("generate --prompt Once --max-new-tokens 8 --dtype " + dtype);
    CHECK(generated.exit_code == 0);
    CHECK_THAT(generated.out, Catch::StartsWith("Once upon a time"));
  }
}

TEST_CASE("architectures match their float64 references", "[model][golden][arch]") {
  check_golden_model("models/tiny-random-llama-gqa", "golden/tiny_models/tiny-random-llama-gqa.json");
  check_golden_model("models/tiny-random-llama-gqa-sharded", "golden/tiny_models/tiny-random-llama-gqa.json");
  check_golden_model("models/tiny-random-opt", "golden/tiny_models/tiny-random-opt.json");
  check_golden_model("models/tiny-random-opt-proj", "golden/tiny_models/tiny-random-opt-proj.json");
  check_golden_model("models/tiny-random-opt-postln", "golden/tiny_models/tiny-random-opt-postln.json");
  check_golden_model("models/tiny-random-gptneox", "golden/tiny_models/tiny-random-gptneox.json");
  check_golden_model("models/tiny-random-gptneox-seq", "golden/tiny_models/tiny-random-gptneox-seq.json");
}

TEST_CASE("PyTorch-pickle checkpoints match their float64 references", "[model][golden][pickle]") {
  // float16 zip with OPTModel's decoder.* keys; legacy (pre-1.6) float32; two float32 zip shards.
  check_golden_model("models/tiny-random-opt-bin", "golden/tiny_models/tiny-random-opt-bin.json");
  check_golden_model("models/tiny-random-opt-bin-legacy", "golden/tiny_models/tiny-random-opt.json");
  check_golden_model("models/tiny-random-gptneox-bin-sharded", "golden/tiny_models/tiny-random-gptneox.json");
}

TEST_CASE("LLaMA-family variants match their float64 references", "[model][golden][arch]") {
  // rope_scaling llama3; sliding_window 8; q/k/v biases; q/k norm with head_dim 32 of
  // hidden 64; fused qkv_proj and gate_up_proj (golden/README.md, LLaMA-family goldens).
  for (std::string name : {"llama3", "mistral", "qwen2", "qwen3", "phi3"})
    check_golden_model("models/tiny-random-" + name, "golden/tiny_models/tiny-random-" + name + ".json");
}

TEST_CASE("bad checkpoints fail with one line naming the file or tensor", "[model][errors]") {
  SECTION("missing config.json") {
    auto dir = copy_model("models/stories260K-hf", "no_config");
    fs::remove(fs::path(dir) / "config.json");
    auto msg = load_error(dir);
    CHECK_THAT(msg, Catch::Contains("config.json") && Catch::Contains("no such file"));
  }
  SECTION("truncated safetensors file") {
    auto dir = copy_model("models/stories260K-hf", "truncated");
    fs::resize_file(fs::path(dir) / "model.safetensors", 4);
    CHECK_THAT(load_error(dir), Catch::Contains("model.safetensors") && Catch::Contains("truncated"));
    fs::resize_file(fs::path(dir) / "model.safetensors", 0);
    CHECK_THAT(load_error(dir), Catch::Contains("truncated"));
  }
  SECTION("tensor data cut short: offsets run past the file") {
    auto dir = copy_model("models/stories260K-hf", "short_data");
    auto file = fs::path(dir) / "model.safetensors";
    fs::resize_file(file, fs::file_size(file) - 1000);
    auto msg = load_error(dir);
    CHECK_THAT(msg, Catch::Contains("model.safetensors") && Catch::Contains("run past"));
  }
  SECTION("header length runs past the file") {
    auto dir = copy_model("models/stories260K-hf", "bad_header_len");
    auto file = (fs::path(dir) / "model.safetensors").string();
    std::fstream f(file, std::ios::in | std::ios::out | std::ios::binary);
    uint64_t huge = 1ull << 40;
    f.write(reinterpret_cast<const char*>(&huge), 8);
    f.close();
    CHECK_THAT(load_error(dir), Catch::Contains("header length") && Catch::Contains("runs past"));
  }
  SECTION("a tensor whose shape disagrees with config.json") {
    auto dir = copy_model("models/stories260K-hf", "wrong_shape");
    auto config = test::read_json(fs::path(dir) / "config.json");
    config["intermediate_size"] = 100;
    std::ofstream(fs::path(dir) / "config.json") << config.dump();
    auto msg = load_error(dir);
    CHECK_THAT(msg, Catch::Contains("mlp.") && Catch::Contains("[172,64]") && Catch::Contains("[100,64]"));
  }
  SECTION("unknown model_type") {
    auto dir = copy_model("models/stories260K-hf", "unknown_type");
    auto config = test::read_json(fs::path(dir) / "config.json");
    config["model_type"] = "mamba";
    std::ofstream(fs::path(dir) / "config.json") << config.dump();
    CHECK_THAT(load_error(dir), Catch::Contains("config.json") && Catch::Contains("unknown model_type \"mamba\""));
  }
  SECTION("the CLI prints one line and exits non-zero") {
    auto dir = copy_model("models/stories260K-hf", "cli_truncated");
    fs::resize_file(fs::path(dir) / "model.safetensors", 4);
    auto r = test::run_kvevict("perplexity --model " + dir + " --text-file " +
                               test::data("text/tinystories_sample.txt"));
    CHECK(r.exit_code != 0);
    CHECK(std::count(r.err.begin(), r.err.end(), '\n') == 1);
    CHECK_THAT(r.err, Catch::StartsWith("kvevict: error: ") && Catch::Contains("model.safetensors"));
  }
}

TEST_CASE("with no CUDA device --device cuda is refused with one line naming the device", "[model][cli][errors][can-skip]") {
  if (torch::cuda::is_available()) {
    KVEVICT_SKIP("this LibTorch sees a CUDA device, so --device cuda is not refused here");
    return;
  }
  const std::string text = " --text-file " + test::data("text/tinystories_sample.txt") + " --max-tokens 20";
  auto one_line = [](const test::CommandResult& r) {
    return std::count(r.err.begin(), r.err.end(), '\n') == 1 && r.err.rfind("kvevict: error: ", 0) == 0;
  };
  for (const std::string device : {"cuda", "cuda:0"}) {
    for (const std::string command : {"perplexity" + text, std::string("generate --prompt Once --max-new-tokens 2")}) {
      auto r = test::run_kvevict(command + " --device " + device);
      INFO(command << " --device " << device << ": " << r.err);
      CHECK(r.exit_code == 1);
      CHECK(one_line(r));
      CHECK_THAT(r.err, Catch::Contains("device " + device + " requested but this LibTorch build sees no CUDA device"));
      CHECK(r.out.empty());
    }
  }
  auto unknown = test::run_kvevict("perplexity" + text + " --device tpu");
  CHECK(unknown.exit_code == 1);
  CHECK(one_line(unknown));
  CHECK_THAT(unknown.err, Catch::Contains("unknown device \"tpu\" (use cpu or cuda)"));
}
