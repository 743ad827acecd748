#include "harness/runtime/prepass.h"

#include <algorithm>
#include <chrono>
#include <map>
#include <mutex>
#include <random>
#include <tuple>
#include <string>

#include "harness/common/errors.h"
#include "harness/common/limits.h"
#include "harness/runtime/attention.h"

namespace kvevict {

std::vector<int> kvzip_repeat_prompt(const Tokenizer& tokenizer) {
  std::vector<int> prompt = tokenizer.encode("\n\nRepeat the previous context exactly.");
  const std::vector<int> suffix = tokenizer.encode("\n");
  prompt.insert(prompt.end(), suffix.begin(), suffix.end());
  return prompt;
}

std::shared_ptr<const ObservedScores> reconstruction_scores(const Model& model, const std::vector<int>& context,
                                                            const std::vector<int>& repeat_prompt) {
  const auto started = std::chrono::steady_clock::now();
  const int C = static_cast<int>(context.size());
  const int n_layers = static_cast<int>(model.arch().n_layers);
  const int n_kv = static_cast<int>(model.arch().n_kv_heads);
  const int n_q = static_cast<int>(model.arch().n_heads);
  std::vector<int> pass = context;
  pass.insert(pass.end(), repeat_prompt.begin(), repeat_prompt.end());
  pass.insert(pass.end(), context.begin(), context.end());
  // Per layer, the running maximum [Hkv, C] on the model's device, in the attention's type.
  std::vector<torch::Tensor> best(n_layers);
  const AttentionObserver observer = [&](int layer, int64_t first, int64_t rows, int64_t, const torch::Tensor&,
                                         const torch::Tensor&, const torch::Tensor&, const torch::Tensor& probs) {
    const int64_t from = std::max<int64_t>(first, C);  // the first reconstruction row of the block
    if (from >= first + rows) return;
    const torch::Tensor seen = probs.narrow(1, from - first, first + rows - from).narrow(2, 0, C);
    const torch::Tensor most = seen.reshape({n_kv, n_q / n_kv, seen.size(1), C}).amax({1, 2});
    best[layer] = best[layer].defined() ? torch::maximum(best[layer], most) : most;
  };
  FullAttention attention(observer, 0);
  model.forward(pass, 0, attention);
  auto table = std::make_shared<ObservedScores>();
  table->kind = Prepass::ContextReconstruction;
  table->n_layers = n_layers;
  table->n_kv_heads = n_kv;
  table->positions = C;
  table->values.reserve(static_cast<size_t>(n_layers) * n_kv * C);
  for (int l = 0; l < n_layers; ++l) {
    if (!best[l].defined()) throw Error("internal: KVzip's pre-pass saw no reconstruction row in layer " + std::to_string(l));
    const torch::Tensor host = best[l].to(torch::kCPU, torch::kFloat32).contiguous();
    table->values.insert(table->values.end(), host.data_ptr<float>(), host.data_ptr<float>() + host.numel());
  }
  table->tokens = static_cast<int64_t>(pass.size());
  table->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return table;
}

// ---------------------------------------------------------------------------------
// DuoAttention's calibration.

namespace {

// The passkey prompt's parts (Mohtashami and Jaggi 2023's passkey retrieval, the synthetic
// task DuoAttention's heads are trained on), each encoded alone so the needle's token span
// is known.
const char* const kPasskeyIntro =
    "There is an important info hidden inside a lot of irrelevant text. Find it and memorize it. I will quiz you "
    "about the important information there.";
const char* const kPasskeyFiller = " The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
const char* const kPasskeyQuestion = " What is the pass key? The pass key is";

}  // namespace

PasskeyPrompt passkey_prompt(const Tokenizer& tokenizer, int bos_token, int target_tokens, uint64_t seed) {
  std::mt19937_64 rng(seed);
  const std::string key = std::to_string(10000 + rng() % 90000);
  const std::string needle = " The pass key is " + key + ". Remember it. " + key + " is the pass key.";
  const std::vector<int> intro = tokenizer.encode(kPasskeyIntro), filler = tokenizer.encode(kPasskeyFiller),
                         needle_tokens = tokenizer.encode(needle), question = tokenizer.encode(kPasskeyQuestion);
  PasskeyPrompt prompt;
  if (bos_token >= 0) prompt.tokens.push_back(bos_token);
  prompt.tokens.insert(prompt.tokens.end(), intro.begin(), intro.end());
  const int fixed = static_cast<int>(prompt.tokens.size() + needle_tokens.size() + question.size());
  const int units = std::max(2, (target_tokens - fixed) / std::max<int>(1, static_cast<int>(filler.size())));
  for (int u = 0; u < units; ++u) {
    if (u == units / 2) {  // the needle at half depth
      prompt.needle_begin = static_cast<int>(prompt.tokens.size());
      prompt.tokens.insert(prompt.tokens.end(), needle_tokens.begin(), needle_tokens.end());
      prompt.needle_end = static_cast<int>(prompt.tokens.size());
    }
    prompt.tokens.insert(prompt.tokens.end(), filler.begin(), filler.end());
  }
  prompt.question_begin = static_cast<int>(prompt.tokens.size());
  prompt.tokens.insert(prompt.tokens.end(), question.begin(), question.end());
  return prompt;
}

std::shared_ptr<const ObservedScores> retrieval_scores(const Model& model, const PasskeyPrompt& prompt) {
  const auto started = std::chrono::steady_clock::now();
  const int n_layers = static_cast<int>(model.arch().n_layers);
  const int n_kv = static_cast<int>(model.arch().n_kv_heads);
  const int n_q = static_cast<int>(model.arch().n_heads), group = n_q / n_kv;
  const int T = static_cast<int>(prompt.tokens.size()), rows_total = T - prompt.question_begin;
  std::vector<torch::Tensor> sums(n_layers);  // [Hkv]: the needle's attention summed over rows and the group
  const AttentionObserver observer = [&](int layer, int64_t first, int64_t rows, int64_t, const torch::Tensor&,
                                         const torch::Tensor&, const torch::Tensor&, const torch::Tensor& probs) {
    const int64_t from = std::max<int64_t>(first, prompt.question_begin);
    if (from >= first + rows) return;
    const torch::Tensor on_needle = probs.narrow(1, from - first, first + rows - from)
                                        .narrow(2, prompt.needle_begin, prompt.needle_end - prompt.needle_begin)
                                        .to(torch::kFloat64)
                                        .sum({1, 2})
                                        .reshape({n_kv, group})
                                        .sum(1);
    sums[layer] = sums[layer].defined() ? sums[layer] + on_needle : on_needle;
  };
  FullAttention attention(observer, 0);
  model.forward(prompt.tokens, 0, attention);
  auto table = std::make_shared<ObservedScores>();
  table->kind = Prepass::PasskeyRetrieval;
  table->n_layers = n_layers;
  table->n_kv_heads = n_kv;
  table->positions = 1;
  for (int l = 0; l < n_layers; ++l) {
    const torch::Tensor host = (sums[l] / static_cast<double>(rows_total * group)).to(torch::kCPU).contiguous();
    for (int h = 0; h < n_kv; ++h) table->values.push_back(static_cast<float>(host.data_ptr<double>()[h]));
  }
  table->tokens = T;
  table->seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return table;
}

std::shared_ptr<const ObservedScores> calibration_scores(const Model& model) {
  // Two models from the same folder in the same dtype on the same device compute the same
  // attention: the table is theirs alike.
  using Key = std::tuple<std::string, int, std::string>;
  static std::mutex mutex;
  static std::map<Key, std::shared_ptr<const ObservedScores>> tables;
  const Key key{model.dir(), static_cast<int>(model.dtype()), model.device().str()};
  std::lock_guard<std::mutex> lock(mutex);
  auto& table = tables[key];
  if (!table) {
    const int64_t context = std::min<int64_t>(model.arch().max_positions, kMaxModelPositions);
    const int target = static_cast<int>(std::min<int64_t>(kCalibrationTokens, context));
    const PasskeyPrompt prompt =
        passkey_prompt(model.require_tokenizer(), static_cast<int>(model.arch().bos_token_id), target, 0);
    if (static_cast<int64_t>(prompt.tokens.size()) > context)
      throw Error("duo-attention's passkey calibration prompt takes " + std::to_string(prompt.tokens.size()) +
                  " tokens, past the model's context of " + std::to_string(context));
    table = retrieval_scores(model, prompt);
  }
  return table;
}

void check_prepass_for_model(const Policy& policy, const Model& model) {
  if (policy.prepass() == Prepass::None) return;
  if (model.arch().dmc.enabled())
    throw Error("policy " + policy.name() +
                " observes a full-attention pre-pass, which a DMC model's merged slots do not have");
  if (!model.tokenizer())
    throw Error("policy " + policy.name() + " writes its pre-pass's prompt with the model's tokenizer, and " +
                model.dir() + " has none");
}

void attach_prepass(const Model& model, const Policy& policy, const std::vector<int>& tokens, int context_len,
                    SequenceShape* shape) {
  switch (policy.prepass()) {
    case Prepass::None:
      return;
    case Prepass::ContextReconstruction: {
      check_prepass_for_model(policy, model);
      if (context_len <= 0)
        throw Error("policy " + policy.name() +
                    " scores the context by reconstructing it, and the stream protocol has none (no prefill); use a "
                    "protocol with a prefill");
      const std::vector<int> prompt = kvzip_repeat_prompt(model.require_tokenizer());
      const int64_t pass = 2 * static_cast<int64_t>(context_len) + static_cast<int64_t>(prompt.size());
      const int64_t limit = std::min<int64_t>(model.arch().max_positions, kMaxModelPositions);
      if (pass > limit)
        throw Error("policy " + policy.name() + "'s reconstruction pre-pass runs 2 x " + std::to_string(context_len) +
                    " context tokens + " + std::to_string(prompt.size()) + " prompt tokens = " + std::to_string(pass) +
                    ", past the model's context of " + std::to_string(limit));
      shape->observed =
          reconstruction_scores(model, std::vector<int>(tokens.begin(), tokens.begin() + context_len), prompt);
      return;
    }
    case Prepass::PasskeyRetrieval:
      check_prepass_for_model(policy, model);
      shape->observed = calibration_scores(model);
      return;
  }
}

}  // namespace kvevict
