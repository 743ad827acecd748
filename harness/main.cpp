// kvevict: the command-line front door. Each subcommand parses its flags here and
// calls into the harness library; errors become one line on stderr and exit 1.
#include <CLI/CLI.hpp>
#include <chrono>
#include <fstream>
#include <iostream>
#include <nlohmann/json.hpp>
#include <sstream>

#include "harness/analyze.h"
#include "harness/commands.h"
#include "harness/data_dir.h"
#include "harness/errors.h"
#include "harness/sweep.h"
#include "harness/threads.h"

int main(int argc, char** argv) {
  using namespace kvevict;
  CLI::App app{"kvevict: KV-cache eviction policies on real language models"};
  app.require_subcommand(1);
  app.set_version_flag("--version", kvevict_version());
  std::string data_override;
  app.add_option("--data-dir", data_override, "shared data folder (default: $KVEVICT_DATA or ../shared/data)");
  const std::string default_model = "models/stories260K-hf";

  // generate ------------------------------------------------------------------------
  GenerateArgs gen;
  auto* generate_cmd = app.add_subcommand("generate", "generate text (decode mode, real KV cache)");
  generate_cmd->add_option("--model", gen.model, "Hugging Face model directory (default: the bundled stories260K)");
  generate_cmd->add_option("--prompt", gen.prompt, "prompt text; empty starts from BOS")->capture_default_str();
  generate_cmd->add_option("--max-new-tokens", gen.max_new_tokens, "tokens to generate")->capture_default_str();
  generate_cmd->add_option("--temperature", gen.temperature, "0 is greedy")->capture_default_str();
  generate_cmd->add_option("--seed", gen.seed, "sampling seed")->capture_default_str();
  generate_cmd->add_flag("--stream", gen.stream, "evict from the first prompt token instead of prefilling the prompt");
  gen.runtime.add_to(*generate_cmd);
  gen.policy.add_to(*generate_cmd);

  // perplexity ----------------------------------------------------------------------
  PerplexityArgs ppl;
  auto* ppl_cmd = app.add_subcommand("perplexity", "mean NLL of a text under a policy");
  ppl_cmd->add_option("--model", ppl.model, "Hugging Face model directory (default: the bundled stories260K)");
  auto* text_opt = ppl_cmd->add_option("--text-file", ppl.text_file, "text to score (BOS + its tokens)");
  auto* tokens_opt = ppl_cmd->add_option("--tokens-file", ppl.tokens_file, "whitespace-separated token ids, scored as given");
  text_opt->excludes(tokens_opt);
  ppl_cmd->add_option("--max-tokens", ppl.max_tokens, "truncate to this many tokens in total (BOS included)")
      ->capture_default_str();
  ppl_cmd->add_option("--mode", ppl.mode, "sim or decode")->capture_default_str();
  ppl_cmd->add_option("--prefill", ppl.prefill, "tokens run with full attention before eviction starts")->capture_default_str();
  ppl_cmd->add_option("--format", ppl.format, "json or text")->capture_default_str();
  ppl_cmd->add_flag("--per-token", ppl.per_token, "include every token's log-prob in the JSON");
  ppl.runtime.add_to(*ppl_cmd);
  ppl.policy.add_to(*ppl_cmd);

  // bench ---------------------------------------------------------------------------
  BenchArgs bench;
  auto* bench_cmd = app.add_subcommand("bench", "benchmarks that print numbers (load, generate, forward, policies)");
  bench_cmd->add_option("--model", bench.model, "Hugging Face model directory (default: the bundled stories260K)");
  bench_cmd->add_option("--config", bench.config, "benchmark config JSON (configs/bench_*.json)");
  bench_cmd->add_option("--tokens", bench.tokens, "sequence length for forward benchmarks")->capture_default_str();
  bench_cmd->add_option("--new-tokens", bench.new_tokens, "tokens to generate")->capture_default_str();
  bench_cmd->add_option("--repeat", bench.repeat, "repetitions; the best time is reported")->capture_default_str();
  bench.runtime.add_to(*bench_cmd);

  // make-random-model ----------------------------------------------------------------
  RandomModelArgs random_model;
  auto* random_cmd = app.add_subcommand("make-random-model",
      "write a random-weight LLaMA checkpoint of a given shape (Hugging Face layout), for speed tests only");
  random_cmd->add_option("--out", random_model.out, "output directory")->required();
  random_cmd->add_option("--layers", random_model.layers)->capture_default_str();
  random_cmd->add_option("--hidden", random_model.hidden)->capture_default_str();
  random_cmd->add_option("--heads", random_model.heads)->capture_default_str();
  random_cmd->add_option("--kv-heads", random_model.kv_heads)->capture_default_str();
  random_cmd->add_option("--intermediate", random_model.intermediate)->capture_default_str();
  random_cmd->add_option("--vocab", random_model.vocab)->capture_default_str();
  random_cmd->add_option("--max-positions", random_model.max_positions)->capture_default_str();
  random_cmd->add_option("--seed", random_model.seed)->capture_default_str();
  random_cmd->add_option("--arch", random_model.arch, "llama or qwen3 (q/k norm, explicit head_dim)")
      ->check(CLI::IsMember({"llama", "qwen3"}))->capture_default_str();
  random_cmd->add_option("--head-dim", random_model.head_dim, "per-head width (0: hidden / heads)")->capture_default_str();

  register_task_commands(app);
  register_analyze_command(app);

  try {
    app.parse(argc, argv);
  } catch (const CLI::ParseError& e) {
    return app.exit(e);
  }
  try {
    set_thread_count(0);  // all physical cores unless --threads says otherwise
    auto resolve = [&](std::string& model) {
      if (model.empty()) model = data_path(default_model, data_override);
    };
    if (generate_cmd->parsed()) {
      resolve(gen.model);
      return run_generate(gen);
    }
    if (ppl_cmd->parsed()) {
      resolve(ppl.model);
      if (ppl.text_file.empty() && ppl.tokens_file.empty())
        throw Error("perplexity needs --text-file or --tokens-file");
      return run_perplexity(ppl);
    }
    if (bench_cmd->parsed()) {
      bench.model_given = !bench.model.empty();
      resolve(bench.model);
      return run_bench(bench, data_override);
    }
    if (random_cmd->parsed()) return run_make_random_model(random_model);
    if (int rc = run_analyze_if_parsed(data_override); rc >= 0) return rc;
    return run_task_commands(app, data_override);
  } catch (const std::exception& e) {
    std::string msg = e.what();
    for (auto& c : msg)
      if (c == '\n') c = ' ';
    std::cerr << "kvevict: error: " << msg << std::endl;
    return 1;
  }
}
