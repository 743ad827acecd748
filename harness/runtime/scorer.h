// Scoring and generation under an eviction policy, in either execution mode.
#pragma once
#include <functional>
#include <string>
#include <vector>

#include "harness/config/eval_config.h"
#include "harness/runtime/attention.h"
#include "harness/model/model.h"
#include "policies/policy.h"

namespace kvevict {

// The policy's view of a sequence on this model.
SequenceShape shape_for(const Model& model, int length, int prefill_len);

// One entry of a row's most likely tokens: its id and log-prob (float64 log-softmax).
struct TokenLogprob {
  int token = 0;
  double logprob = 0;
};

struct SequenceScore {
  std::vector<double> next_token_logprob;  // [T-1]: log p(tokens[i+1] | tokens[..i])
  std::vector<int> argmax;                 // [T]: argmax of each logits row
  // [T] x top_k with top_k > 0: each row's top_k tokens by log-prob, highest first (ties:
  // lower id first), from the same numbers as next_token_logprob; rows before
  // first_logprob are empty.
  std::vector<std::vector<TokenLogprob>> top;
  KvStats kv;
};

// The `k` most likely tokens of one row of log-probs [vocab], highest first (ties: lower id).
std::vector<TokenLogprob> top_logprobs(const double* logprobs, int vocab, int k);

// Teacher-forced log-probs of `tokens`. The first `prefill_len` tokens run with full
// attention (0: eviction from the first token, the "stream" protocol). Ratio budgets
// refer to `budget_length` tokens (0: the whole sequence). With `final_target` >= 0,
// next_token_logprob gains a last entry: log p(final_target | all tokens), as lm-eval
// scores a continuation's last token from (ctx+cont)[:-1]. Entries before
// `first_logprob` are left NaN (a caller that reads only a continuation's log-probs skips
// the context's log-softmax; each row's value is the same either way). With `top_k` > 0
// each row from first_logprob on also gives its top_k tokens (SequenceScore::top).
SequenceScore score_sequence(const Model& model, const Policy& policy, Mode mode,
                             const std::vector<int>& tokens, int prefill_len = 0,
                             int budget_length = 0, int final_target = -1, int first_logprob = 0,
                             int top_k = 0);

struct GenerateOptions {
  int max_new_tokens = 64;
  double temperature = 0;  // 0: greedy
  uint64_t seed = 0;
  std::vector<std::string> stop;  // generation ends before the first of these
  bool stream = false;            // true: evict from the first prompt token; false: prefill the prompt
  // Question-agnostic prefill (stream false): the prompt's last question_tokens tokens
  // (question and answer prefix) are fed after the rest was prefilled and compressed,
  // and are not compressed themselves; ratio budgets then refer to the rest. 0: the
  // whole prompt is prefilled and compressed together (question-aware).
  int question_tokens = 0;
  // >= 0: record each chosen token's log-prob and its row's top max(1, k) tokens
  // (Generation::steps); -1: record nothing.
  int top_logprobs = -1;
  // Called with each new token (not the EOS that ends generation); false stops generating
  // (e.g. the client that asked has gone).
  std::function<bool(int)> on_token;
};

enum class FinishReason { Length, Eos, Stop, Cancelled };

struct Generation {
  std::vector<int> tokens;  // new tokens only
  std::string text;         // decoded, cut before any stop string
  // With top_logprobs >= 0: one entry per chosen token, including an EOS that ended
  // generation (which `tokens` leaves out): its log-prob (float64 log-softmax of its row)
  // and the row's top tokens.
  std::vector<TokenLogprob> chosen;
  std::vector<std::vector<TokenLogprob>> top;
  FinishReason finish = FinishReason::Length;
  KvStats kv;
};

// Decode mode with a real cache; ratio budgets refer to the prompt length (H2O's
// summarisation convention), without the question when it is fed uncompressed.
Generation generate(const Model& model, const Policy& policy, const std::vector<int>& prompt,
                    const GenerateOptions& options);

}  // namespace kvevict
