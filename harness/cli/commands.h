// The model commands' arguments and bodies (model_commands.cpp wires flags to these).
#pragma once
#include <CLI/CLI.hpp>
#include <string>

#include "harness/model/model.h"
#include "harness/cli/policy_flags.h"

namespace kvevict {

inline void add_runtime_flags(CLI::App& app, ModelOptions& options) {
  app.add_option("--device", options.device, "cpu or cuda")->capture_default_str();
  app.add_option("--dtype", options.dtype, "float32, bfloat16, float16 or float64 (reference runs)")->capture_default_str();
  // 1024: beyond any machine this runs on; a typo's 100000 would make that many OpenMP threads.
  app.add_option("--threads", options.threads, "CPU threads (0, the default: all physical cores)")
      ->check(CLI::Range(0, 1024))->capture_default_str();
}

struct RuntimeFlags {
  ModelOptions options;
  void add_to(CLI::App& app) { add_runtime_flags(app, options); }
};

struct GenerateArgs {
  std::string model, prompt;
  int max_new_tokens = 64;
  double temperature = 0;
  uint64_t seed = 0;
  bool stream = false;
  RuntimeFlags runtime;
  PolicyFlags policy;
};
int run_generate(const GenerateArgs& args);

struct PerplexityArgs {
  std::string model, text_file, tokens_file, mode = "sim", format = "json";
  int max_tokens = 512, prefill = 0;
  bool per_token = false;
  RuntimeFlags runtime;
  PolicyFlags policy;
};
int run_perplexity(const PerplexityArgs& args);

struct BenchArgs {
  std::string model, config;
  int tokens = 256, new_tokens = 128, repeat = 3;
  int batch_size = 0;        // --batch-size: the batch compared with batch 1 (0: the config's)
  bool model_given = false;  // --model was passed: it overrides a config's "model"
  RuntimeFlags runtime;
};
int run_bench(const BenchArgs& args, const std::string& data_override);

struct RandomModelArgs {
  std::string out;
  int layers = 12, hidden = 768, heads = 12, kv_heads = 12, intermediate = 2048, vocab = 32000,
      max_positions = 2048;
  uint64_t seed = 0;
  std::string arch = "llama";  // "llama" or "qwen3" (explicit head_dim, q/k norm)
  int head_dim = 0;            // 0: hidden / heads
  std::string tokenizer_from;  // a model folder whose tokenizer files are copied (long-context tasks need one)
};
int run_make_random_model(const RandomModelArgs& args);



}  // namespace kvevict
