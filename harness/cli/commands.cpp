#include "harness/cli/commands.h"

#include <chrono>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>

#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/text.h"
#include "harness/runtime/scorer.h"

namespace kvevict {
int run_generate(const GenerateArgs& args) {
  auto model = Model::load(args.model, args.runtime.options);
  use_threads_for(*model, args.runtime.options.threads);
  auto policy = args.policy.make();
  check_policy_for_model(*policy, *model);
  std::vector<int> prompt = model->encode(args.prompt, true);
  if (prompt.empty()) throw Error("the prompt is empty and the model has no BOS token to start from");
  GenerateOptions options;
  options.max_new_tokens = args.max_new_tokens;
  options.temperature = args.temperature;
  options.seed = args.seed;
  options.stream = args.stream;
  Generation out = generate(*model, *policy, prompt, options);
  // Decoded alone, the new tokens lose the space a SentencePiece piece carries at the
  // start of a text ("Once" + "upon"); decoded after the prompt they keep it.
  std::string continuation = out.text;
  if (const Tokenizer* tokenizer = model->tokenizer(); tokenizer && !out.tokens.empty()) {
    std::vector<int> context(prompt.begin(), prompt.end());
    if (!context.empty() && context.front() == model->arch().bos_token_id) context.erase(context.begin());
    const std::string before = tokenizer->decode(context);
    context.insert(context.end(), out.tokens.begin(), out.tokens.end());
    const std::string joint = tokenizer->decode(context);
    if (joint.compare(0, before.size(), before) == 0) {
      const std::string tail = joint.substr(before.size());
      // out.text may stop early at a stop sequence: keep only as much as it kept.
      if (tail.size() >= out.text.size() && tail.compare(tail.size() - out.text.size(), out.text.size(), out.text) == 0)
        continuation = tail;
    }
  }
  std::cout << args.prompt << continuation << std::endl;
  return 0;
}

int run_perplexity(const PerplexityArgs& args) {
  // The prefill is a prefix of the scored tokens: one longer than them would be cut unsaid.
  if (args.max_tokens > 0 && args.prefill > args.max_tokens)
    throw Error("--prefill " + std::to_string(args.prefill) + " is longer than the " + std::to_string(args.max_tokens) +
                " tokens scored (--max-tokens)");
  auto model = Model::load(args.model, args.runtime.options);
  use_threads_for(*model, args.runtime.options.threads);
  auto policy = args.policy.make();
  check_policy_for_model(*policy, *model);
  std::vector<int> tokens;
  if (!args.tokens_file.empty()) {
    tokens = read_tokens_file(args.tokens_file);
  } else {
    tokens = model->encode(read_text_file(args.text_file), true);
  }
  if (args.max_tokens > 0 && static_cast<int>(tokens.size()) > args.max_tokens) tokens.resize(args.max_tokens);
  if (tokens.size() < 2) throw Error("need at least 2 tokens to score, got " + std::to_string(tokens.size()));
  if (args.prefill > static_cast<int>(tokens.size()))
    throw Error("--prefill " + std::to_string(args.prefill) + " is longer than the " + std::to_string(tokens.size()) +
                " tokens of the text scored");
  auto t0 = std::chrono::steady_clock::now();
  SequenceScore score = score_sequence(*model, *policy, parse_mode(args.mode), tokens, args.prefill);
  double seconds = seconds_since(t0);
  double total = 0;
  for (double lp : score.next_token_logprob) total -= lp;
  const double mean_nll = total / score.next_token_logprob.size();
  if (args.format == "json") {
    nlohmann::json j;
    j["tokens"] = tokens.size();
    j["mean_nll"] = mean_nll;
    j["ppl"] = std::exp(mean_nll);
    j["policy"] = policy->name();
    j["mode"] = args.mode;
    j["kv_tokens_kept"] = score.kv.kept_per_layer;
    j["kv_tokens_kept_per_head"] = score.kv.kept_per_head;  // [layer][KV head]
    j["kv_tokens_max"] = score.kv.max_per_layer;
    j["kv_bytes_peak"] = score.kv.peak_bytes;
    j["kv_bytes_full"] = score.kv.peak_bytes_full;
    j["kv_bits"] = score.kv.kv_bits;
    j["kv_sliding_window"] = score.kv.sliding_window;  // 0: none
    j["kv_tokens_visible"] = score.kv.visible_per_layer;
    if (!score.kv.dmc_merge_rate.empty()) j["dmc_merge_rate"] = score.kv.dmc_merge_rate;  // [layer], DMC models
    j["seconds"] = seconds;
    if (args.per_token) j["next_token_logprob"] = score.next_token_logprob;
    std::cout << j.dump() << std::endl;
  } else if (args.format == "text") {
    std::cout << "tokens " << tokens.size() << "\nmean_nll " << std::setprecision(8) << mean_nll
              << "\nppl " << std::exp(mean_nll) << "\nkv_bytes_peak " << score.kv.peak_bytes << std::endl;
  } else {
    throw Error("unknown --format \"" + args.format + "\" (use json or text)");
  }
  return 0;
}

}  // namespace kvevict
