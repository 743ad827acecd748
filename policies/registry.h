#pragma once
#include <memory>
#include <string>
#include <vector>

#include "policies/policy.h"

namespace kvevict {

// Throws kvevict::Error naming the known policies when `name` is unknown.
std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyOptions& options);
std::vector<std::string> policy_names();

}  // namespace kvevict
