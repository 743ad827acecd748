// A policy's pre-pass (Policy::prepass, policies/observed_scores.h): the model runs once
// more with full attention over a prompt of the policy's kind, an observer reduces the
// attention to a table per (layer, KV head, position), and the table goes to the policy
// in SequenceShape::observed, the same for sim mode and decode mode.
#pragma once
#include <cstdint>
#include <memory>
#include <vector>

#include "harness/model/model.h"
#include "policies/observed_scores.h"
#include "policies/policy.h"

namespace kvevict {

// KVzip's repeat prompt for a model without a chat template, as kvpress builds it: the
// request "\n\nRepeat the previous context exactly." and the suffix "\n", each encoded
// without special tokens.
std::vector<int> kvzip_repeat_prompt(const Tokenizer& tokenizer);

// KVzip's context reconstruction: one full-attention pass over [context, repeat_prompt,
// context]; entry (l, h, j) is the most attention any row after the context (the prompt's
// and the repeated context's) pays key j < C, over the query heads of KV head h's group.
// The table's cost is the pass's tokens (2 C + prompt) and its wall time.
std::shared_ptr<const ObservedScores> reconstruction_scores(const Model& model, const std::vector<int>& context,
                                                            const std::vector<int>& repeat_prompt);

// DuoAttention's calibration prompt: a passkey hidden at half depth in filler text, then
// the question; the needle's and the question's token spans.
struct PasskeyPrompt {
  std::vector<int> tokens;
  int needle_begin = 0, needle_end = 0;  // the needle sentence's tokens [begin, end)
  int question_begin = 0;                // the question's tokens run to the end
};
// About target_tokens tokens (at least two filler units), the passkey drawn from seed.
PasskeyPrompt passkey_prompt(const Tokenizer& tokenizer, int bos_token, int target_tokens, uint64_t seed);

// One full-attention pass over the prompt; entry (l, h, 0) is the attention the question's
// rows pay the needle's tokens (summed over the needle), mean over those rows and the query
// heads of KV head h's group.
std::shared_ptr<const ObservedScores> retrieval_scores(const Model& model, const PasskeyPrompt& prompt);

// The calibration table of a model (its folder, dtype and device), made at the first call
// and kept for the process: the prompt of kCalibrationTokens tokens (fewer on a model with
// a shorter context) and seed 0.
constexpr int kCalibrationTokens = 1024;
std::shared_ptr<const ObservedScores> calibration_scores(const Model& model);

// The policy's pre-pass over the context tokens[0, context_len) of a sequence, its table
// put in shape->observed; nothing for a policy without one. Throws kvevict::Error (one
// line) where it cannot run: no context (the stream protocol), a DMC model, a pass longer
// than the model's context.
void attach_prepass(const Model& model, const Policy& policy, const std::vector<int>& tokens, int context_len,
                    SequenceShape* shape);

// Refuses, before any work, a pre-pass the model cannot run (a DMC model, a model without
// a tokenizer); the message names the policy.
void check_prepass_for_model(const Policy& policy, const Model& model);

}  // namespace kvevict
