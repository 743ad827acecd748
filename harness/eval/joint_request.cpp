#include "harness/eval/joint_request.h"

#include <algorithm>

namespace kvevict {

ScoreRequest joint_score_request(const Model& model, Protocol protocol, const std::vector<int>& whole,
                                 int context_tokens, int first_logprob, int top_k) {
  int prefill = 0, budget_length = static_cast<int>(whole.size());
  if (protocol == Protocol::PrefillCompress) {
    prefill = std::max(1, context_tokens);
    budget_length = prefill;
  }
  // The pass covers all L rows where the model can place them, so a non-causal policy
  // (h2o-global) sees the last row too; its logits are not used.
  const bool whole_fits = model.arch().positions != PositionKind::Learned ||
                          static_cast<int64_t>(whole.size()) <= model.arch().max_positions;
  if (whole_fits) return {whole, prefill, budget_length, -1, first_logprob, top_k};
  return {std::vector<int>(whole.begin(), whole.end() - 1), prefill, budget_length, whole.back(), first_logprob, top_k};
}

SequenceScore score_joint_request(const Model& model, const Policy& policy, Mode mode, Protocol protocol,
                                  const std::vector<int>& whole, int context_tokens, int first_logprob, int top_k) {
  const ScoreRequest r = joint_score_request(model, protocol, whole, context_tokens, first_logprob, top_k);
  return score_sequence(model, policy, mode, r.tokens, r.prefill_len, r.budget_length, r.final_target,
                        r.first_logprob, r.top_k);
}

}  // namespace kvevict
