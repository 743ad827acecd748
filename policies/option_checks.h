// Range checks for the policy parameters every policy receives (PolicyOptions). They
// run when a policy is constructed, so the CLI flags, a sweep config's policy_options
// and the library all get the same one-line error naming the flag, before any work.
#pragma once
#include "policies/policy.h"

namespace kvevict {

// Throws kvevict::Error naming the flag (--kernel, --budget, ...) of the first bad value.
void check_policy_options(const PolicyOptions& options);

}  // namespace kvevict
