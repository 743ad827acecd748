// One joint request (context + continuation as one token sequence) scored under a
// protocol: the pass `kvevict eval` runs for a multiple-choice request and `kvevict serve`
// runs for a prompt, so both give the same log-probs for the same tokens.
#pragma once
#include <vector>

#include "harness/config/eval_config.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "policies/policy.h"

namespace kvevict {

// Teacher-forced log-probs of `whole` under `protocol`: stream evicts from the first token
// and ratio budgets refer to the joint length |whole| (the paper's mask); prefill-compress
// runs the first max(1, context_tokens) tokens with full attention and its budgets refer
// to them. next_token_logprob[i] is log p(whole[i+1] | whole[..i]) for i >= first_logprob
// (see score_sequence); with top_k > 0 each such row also gives its top_k tokens.
// The same pass as data, for score_batch(): score_joint_request() is score_sequence() of it.
ScoreRequest joint_score_request(const Model& model, Protocol protocol, const std::vector<int>& whole,
                                 int context_tokens, int first_logprob, int top_k = 0);

SequenceScore score_joint_request(const Model& model, const Policy& policy, Mode mode, Protocol protocol,
                                  const std::vector<int>& whole, int context_tokens, int first_logprob,
                                  int top_k = 0);

}  // namespace kvevict
