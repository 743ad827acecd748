// Range checks for the budget every policy receives (PolicyOptions::budget). They run
// when a policy is constructed, so the CLI flags, a sweep config and the library all get
// the same one-line error naming the flag, before any work. The policies' own
// parameters are checked by their declarations (policies/params.h).
#pragma once
#include <cstdint>
#include <string>

#include "policies/policy.h"

namespace kvevict {

// Throws kvevict::Error naming the flag (--kernel, --budget, ...) of the first bad value.
void check_policy_options(const PolicyOptions& options);

// A ratio budget becomes int(ratio * T) tokens on a T-token request (the paper), so it may
// round to 0 on a short request; one that keeps 0 tokens even on a request of
// `max_positions` tokens can never keep one. Throws naming the flag (`flag`, e.g.
// "--budget") and the smallest ratio that keeps a token. check_policy_options applies it
// with the longest context any model may declare; the evaluator with the model's own.
void check_budget_keeps_a_token(const Policy& policy, int64_t max_positions, const std::string& flag);
// The model-free part: `ratio` keeps a token on the longest context any model may declare.
void check_budget_ratio_keeps_a_token(double ratio, const std::string& flag);

}  // namespace kvevict
