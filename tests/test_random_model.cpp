// Random weights drawn where the model runs (ModelOptions::random_weights_seed), and the
// bench that uses them for shapes too large to write as a file (configs/bench_gpu_8b.json).
#include <filesystem>
#include <fstream>
#include <string>

#include "harness/model/model.h"
#include "harness/runtime/attention.h"
#include "tests/test_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

TEST_CASE("a model drawn from its config.json has make-random-model's weights for the same seed", "[random-model]") {
  const std::string dir = test::temp_dir("random_model_file");
  auto made = test::run_kvevict("make-random-model --out " + dir +
                                " --layers 2 --hidden 64 --heads 4 --kv-heads 2 --intermediate 96 --vocab 300"
                                " --max-positions 64 --seed 5");
  REQUIRE(made.exit_code == 0);
  const auto from_file = Model::load(dir);
  ModelOptions drawn_options;
  drawn_options.random_weights_seed = 5;
  const auto drawn = Model::load(dir, drawn_options);
  const std::vector<int> tokens = test::tokens_of(20, 3, 300);
  FullAttention a, b;
  CHECK(torch::equal(from_file->forward(tokens, 0, a), drawn->forward(tokens, 0, b)));
  drawn_options.random_weights_seed = 6;
  FullAttention c;
  CHECK_FALSE(torch::equal(from_file->forward(tokens, 0, a), Model::load(dir, drawn_options)->forward(tokens, 0, c)));
}

TEST_CASE("bench with a random_model config prints prefill and decode rates per dtype, context and policy",
          "[random-model][cli]") {
  const std::string dir = test::temp_dir("random_model_bench");
  const std::string config = dir + "/bench.json";
  std::ofstream(config) << R"({"random_model": {"layers": 2, "hidden": 64, "heads": 4, "kv_heads": 2,
      "intermediate": 96, "vocab": 300, "max_positions": 80}, "dtypes": ["float32", "bfloat16"],
      "contexts": [40, 60], "decode_steps": 4, "policies": ["full", "h2o"], "budget": 0.25})";
  auto bench_folders = [] {
    int count = 0;
    for (const auto& entry : std::filesystem::directory_iterator(std::filesystem::temp_directory_path()))
      count += entry.path().filename().string().rfind("kvevict_bench_model_", 0) == 0;
    return count;
  };
  const int folders_before = bench_folders();
  const auto r = test::run_kvevict("bench --config " + config);
  INFO(r.out << r.err);
  REQUIRE(r.exit_code == 0);
  for (const std::string dtype : {"float32", "bfloat16"})
    for (const std::string context : {"40", "60"}) {
      // The full cache holds the context and the steps; h2o its budget of the context, plus the token being added.
      CHECK_THAT(r.out, Catch::Contains(dtype + " context " + context + " policy full prefill_tokens_per_s"));
      CHECK_THAT(r.out, Catch::Contains(dtype + " context " + context + " policy h2o prefill_tokens_per_s"));
    }
  CHECK_THAT(r.out, Catch::Contains("policy full") && Catch::Contains("kept_tokens 44\n"));
  CHECK_THAT(r.out, Catch::Contains("kept_tokens 64\n") && Catch::Contains("kept_tokens 10\n"));
  // The temporary folder of the model's config.json is removed.
  CHECK(bench_folders() == folders_before);

  std::ofstream(config) << R"({"random_model": {"layers": 1, "hidden": 64, "heads": 4, "kv_heads": 2,
      "intermediate": 96, "vocab": 300, "max_positions": 40}, "contexts": [40], "decode_steps": 4})";
  const auto too_long = test::run_kvevict("bench --config " + config);
  CHECK(too_long.exit_code == 1);
  CHECK_THAT(too_long.err, Catch::Contains("\"contexts\"") && Catch::Contains("exceeds random_model.max_positions 40"));
}

TEST_CASE("bench with peer_rows prints the machine's limits and each decode and prefill row with its costs",
          "[random-model][cli][peer]") {
  // bench/peer.py's kvevict side (issue 41); llama.cpp is not needed here.
  const std::string dir = test::temp_dir("peer_rows_bench");
  REQUIRE(test::run_kvevict("make-random-model --out " + dir + "/model --layers 2 --hidden 64 --heads 4 --kv-heads 2"
                            " --intermediate 96 --vocab 300 --max-positions 128")
              .exit_code == 0);
  const std::string config = dir + "/bench.json";
  auto field = [](const std::string& out, const std::string& kind, const std::string& key) {
    const size_t line = out.find("peer_row " + kind);
    if (line == std::string::npos) return -1.0;
    const size_t at = out.find(" " + key + " ", line);
    if (at == std::string::npos || at > out.find('\n', line)) return -1.0;
    return std::stod(out.substr(at + key.size() + 2));
  };
  for (const std::string dtype : {"float32", "bfloat16"}) {
    std::ofstream(config) << R"({"model": ")" << dir << R"(/model", "dtype": ")" << dtype << R"(", "peer_rows": [
        {"limits": true, "bandwidth_MiB": 16}, {"decode_batch": 3, "prompt": 8, "tokens": 5},
        {"decode_batch": 2, "prompt": 8, "tokens": 5, "policy": "h2o", "budget": 0.25},
        {"prefill": 40}, {"prefill": 40, "policy": "h2o", "budget": 0.25},
        {"prefill": 40, "policy": "h2o", "budget": 0.25, "protocol": "stream"}]})";
    const auto r = test::run_kvevict("bench --threads 2 --config " + config);
    INFO(r.out << r.err);
    REQUIRE(r.exit_code == 0);
    CHECK(field(r.out, "limits", "read_GB_per_s") > 0);
    CHECK(field(r.out, "limits", "fma_f32_GFLOP_per_s") > 0);
    CHECK_THAT(r.out, Catch::Contains("peer_row decode dtype " + dtype +
                                      " B 3 prompt 8 tokens 5 policy full kept_tokens 13 tokens_per_s"));
    // h2o at 25% of the 13 tokens: 3 kept after the prompt, and at every step after.
    CHECK_THAT(r.out, Catch::Contains("peer_row decode dtype " + dtype +
                                      " B 2 prompt 8 tokens 5 policy h2o kept_tokens 3 tokens_per_s"));
    CHECK(field(r.out, "decode", "tokens_per_s") > 0);
    // The costs by hand: per layer q, o 64x64, k, v 32x64, the MLP 3 x 64x96 and two
    // norms of 64; the final norm, the LM head 300x64 and one embedding row.
    const double elements = 2 * (2 * 4096 + 2 * 2048 + 3 * 6144 + 128) + 64 + 19200 + 64;
    CHECK(field(r.out, "decode", "weight_bytes") == elements * (dtype == "float32" ? 4 : 2));
    CHECK(field(r.out, "decode", "kv_bytes_per_token") == 2 * 2 * 2 * 16 * (dtype == "float32" ? 4 : 2));
    CHECK(field(r.out, "decode", "linear_flops_per_token") == 2.0 * (2 * (2 * 4096 + 2 * 2048 + 3 * 6144) + 19200));
    CHECK(field(r.out, "decode", "attention_flops_per_pair") == 2 * 2 * 4 * 16 * 2);
    CHECK_THAT(r.out, Catch::Contains("peer_row prefill dtype " + dtype +
                                      " T 40 policy full protocol prefill-compress tokens_per_s"));
    CHECK_THAT(r.out, Catch::Contains("peer_row prefill dtype " + dtype +
                                      " T 40 policy h2o protocol prefill-compress tokens_per_s"));
    CHECK_THAT(r.out, Catch::Contains("peer_row prefill dtype " + dtype + " T 40 policy h2o protocol stream tokens_per_s"));
    // The full cache holds the prompt; h2o compresses it to its budget of 25%, after the
    // prefill or, streaming, from its first token on (the attention is then cheaper).
    auto line_of = [&](const std::string& what) {
      const size_t at = r.out.find(what);
      return at == std::string::npos ? std::string() : r.out.substr(at, r.out.find('\n', at) - at);
    };
    CHECK(line_of("T 40 policy full").find(" kept_tokens 40 ") != std::string::npos);
    CHECK(line_of("policy h2o protocol prefill-compress").find(" kept_tokens 10 ") != std::string::npos);
    CHECK(line_of("policy h2o protocol stream").find(" kept_tokens 10 ") != std::string::npos);
    CHECK(field(r.out, "prefill", "flops") == 40 * 161280.0 + 512.0 * 40 * 41 / 2);
  }
  std::ofstream(config) << R"({"peer_rows": [{"limits": true, "prefill": 40}]})";
  const auto two_kinds = test::run_kvevict("bench --config " + config);
  CHECK(two_kinds.exit_code == 1);
  CHECK_THAT(two_kinds.err, Catch::Contains("\"peer_rows\" row 0: give exactly one of"));
  std::ofstream(config) << R"({"model": ")" << dir << R"(/model", "peer_rows": [{"prefill": 8, "protocol": "flow"}]})";
  const auto bad_protocol = test::run_kvevict("bench --config " + config);
  CHECK(bad_protocol.exit_code == 1);
  CHECK_THAT(bad_protocol.err, Catch::Contains("\"protocol\"") && Catch::Contains("flow"));
  std::ofstream(config) << R"({"peer_rows": [{"decode_batch": 2}]})";
  const auto no_model = test::run_kvevict("bench --config " + config);
  CHECK(no_model.exit_code == 1);
  CHECK_THAT(no_model.err, Catch::Contains("\"model\" is required by decode and prefill rows"));
}
