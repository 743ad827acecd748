// generate, perplexity, bench and make-random-model: their flags (bodies in commands.cpp
// and bench.cpp); check-model, whose checks are harness/model/model_check.h.
#include <iostream>

#include "harness/cli/cli_checks.h"
#include "harness/cli/command.h"
#include "harness/cli/commands.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/model/model_check.h"

namespace kvevict {
namespace {

void resolve_default_model(std::string& model, const std::string& data_override) {
  if (model.empty()) model = data_path("models/stories260K-hf", data_override);
}

void add_generate_flags(CLI::App& cmd, GenerateArgs& gen) {
  cmd.add_option("--model", gen.model, "Hugging Face model directory (default: the bundled stories260K)");
  cmd.add_option("--prompt", gen.prompt, "prompt text; empty starts from BOS")->capture_default_str();
  cmd.add_option("--max-new-tokens", gen.max_new_tokens, "tokens to generate")->check(cli::at_least(1))->capture_default_str();
  cmd.add_option("--temperature", gen.temperature, "0 is greedy")->check(cli::finite_range(0, 1e6))->capture_default_str();
  cli::add_seed_option(cmd, "--seed", gen.seed, "sampling seed");
  cmd.add_flag("--stream", gen.stream, "evict from the first prompt token instead of prefilling the prompt");
  gen.runtime.add_to(cmd);
  gen.policy.add_to(cmd);
}

void add_perplexity_flags(CLI::App& cmd, PerplexityArgs& ppl) {
  cmd.add_option("--model", ppl.model, "Hugging Face model directory (default: the bundled stories260K)");
  auto* text_opt = cmd.add_option("--text-file", ppl.text_file, "text to score (BOS + its tokens)");
  auto* tokens_opt = cmd.add_option("--tokens-file", ppl.tokens_file, "whitespace-separated token ids, scored as given");
  text_opt->excludes(tokens_opt);
  cmd.add_option("--max-tokens", ppl.max_tokens, "truncate to this many tokens in total (BOS included)")
      ->check(cli::at_least(1))->capture_default_str();
  cmd.add_option("--mode", ppl.mode, "sim or decode")->capture_default_str();
  cmd.add_option("--prefill", ppl.prefill, "tokens run with full attention before eviction starts")->check(cli::at_least(0))->capture_default_str();
  cmd.add_option("--format", ppl.format, "json or text")->capture_default_str();
  cmd.add_flag("--per-token", ppl.per_token, "include every token's log-prob in the JSON");
  ppl.runtime.add_to(cmd);
  ppl.policy.add_to(cmd);
}

void add_bench_flags(CLI::App& cmd, BenchArgs& bench) {
  cmd.add_option("--model", bench.model, "Hugging Face model directory (default: the bundled stories260K)");
  cmd.add_option("--config", bench.config, "benchmark config JSON (configs/bench_*.json)");
  cmd.add_option("--tokens", bench.tokens, "sequence length for forward benchmarks")->check(cli::at_least(1))->capture_default_str();
  cmd.add_option("--new-tokens", bench.new_tokens, "tokens to generate")->check(cli::at_least(1))->capture_default_str();
  cmd.add_option("--batch-size", bench.batch_size, "batch benchmarks: the batch size compared with batch 1")
      ->check(cli::at_least(1));
  cmd.add_option("--repeat", bench.repeat, "repetitions; the best time is reported")->check(cli::at_least(1))->capture_default_str();
  bench.runtime.add_to(cmd);
}

void add_random_model_flags(CLI::App& cmd, RandomModelArgs& random_model) {
  cmd.add_option("--out", random_model.out, "output directory")->required();
  cmd.add_option("--layers", random_model.layers)->capture_default_str();
  cmd.add_option("--hidden", random_model.hidden)->capture_default_str();
  cmd.add_option("--heads", random_model.heads)->capture_default_str();
  cmd.add_option("--kv-heads", random_model.kv_heads)->capture_default_str();
  cmd.add_option("--intermediate", random_model.intermediate)->capture_default_str();
  cmd.add_option("--vocab", random_model.vocab)->capture_default_str();
  cmd.add_option("--max-positions", random_model.max_positions)->capture_default_str();
  cli::add_seed_option(cmd, "--seed", random_model.seed, "the weights' seed");
  cmd.add_option("--arch", random_model.arch, "llama or qwen3 (q/k norm, explicit head_dim)")
      ->check(CLI::IsMember({"llama", "qwen3"}))
      ->capture_default_str();
  cmd.add_option("--head-dim", random_model.head_dim, "per-head width (0: hidden / heads)")->capture_default_str();
  cmd.add_option("--tokenizer-from", random_model.tokenizer_from,
                 "copy this model folder's tokenizer files (e.g. the bundled stories260K's), for tasks that need "
                 "a tokenizer; its vocabulary must fit --vocab");
}

struct CheckModelArgs {
  std::string dir;
};

void add_check_model_flags(CLI::App& cmd, CheckModelArgs& check) {
  cmd.add_option("dir", check.dir, "Hugging Face model directory")->required();
}

int run_check_model(CheckModelArgs& args, const Invocation&) {
  const ModelCheck check = check_model(args.dir);
  std::cout << args.dir << ": ok: model_type " << check.model_type << ", " << check.tensors << " tensors ("
            << check.bytes << " bytes in " << check.files << " file" << (check.files == 1 ? "" : "s")
            << ") match config.json; "
            << (check.checksummed_records
                    ? "the CRC-32s of data.pkl and " + std::to_string(check.checksummed_records) + " tensor records match"
                    : std::string("no stored checksums (safetensors or legacy pickle)"))
            << "; "
            << (check.tokenizer_tokens >= 0 ? "tokenizer of " + std::to_string(check.tokenizer_tokens) + " tokens"
                                            : std::string("no tokenizer"))
            << "\n";
  return 0;
}

}  // namespace

void add_model_commands(CLI::App& app, Commands& commands) {
  add_command<GenerateArgs>(commands, app, "generate", "generate text (decode mode, real KV cache)", add_generate_flags,
                            [](GenerateArgs& gen, const Invocation& at) {
                              resolve_default_model(gen.model, at.data_override);
                              return run_generate(gen);
                            });
  add_command<PerplexityArgs>(commands, app, "perplexity", "mean NLL of a text under a policy", add_perplexity_flags,
                              [](PerplexityArgs& ppl, const Invocation& at) {
                                resolve_default_model(ppl.model, at.data_override);
                                if (ppl.text_file.empty() && ppl.tokens_file.empty())
                                  throw Error("perplexity needs --text-file or --tokens-file");
                                return run_perplexity(ppl);
                              });
  add_command<BenchArgs>(commands, app, "bench", "benchmarks that print numbers (load, generate, forward, policies)",
                         add_bench_flags, [](BenchArgs& bench, const Invocation& at) {
                           bench.model_given = !bench.model.empty();
                           resolve_default_model(bench.model, at.data_override);
                           return run_bench(bench, at.data_override);
                         });
  add_command<RandomModelArgs>(
      commands, app, "make-random-model",
      "write a random-weight LLaMA checkpoint of a given shape (Hugging Face layout), for speed tests only",
      add_random_model_flags, [](RandomModelArgs& args, const Invocation&) { return run_make_random_model(args); });
  add_command<CheckModelArgs>(commands, app, "check-model",
                              "check a model folder without running it: config.json, the checkpoint's structure and "
                              "stored CRC-32s, tensor shapes against config.json, the tokenizer's size",
                              add_check_model_flags, run_check_model);
}

}  // namespace kvevict
