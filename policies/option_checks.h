// Range checks for the budget every policy receives (PolicyOptions::budget). They run
// when a policy is constructed, so the CLI flags, a sweep config and the library all get
// the same one-line error naming the flag, before any work. The policies' own
// parameters are checked by their declarations (policies/params.h).
#pragma once
#include "policies/policy.h"

namespace kvevict {

// Throws kvevict::Error naming the flag (--kernel, --budget, ...) of the first bad value.
void check_policy_options(const PolicyOptions& options);

}  // namespace kvevict
