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
