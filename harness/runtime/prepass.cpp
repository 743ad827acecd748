#include "harness/runtime/prepass.h"

#include <algorithm>
#include <chrono>
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
  }
}

}  // namespace kvevict
