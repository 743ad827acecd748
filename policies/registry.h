#pragma once
#include <memory>
#include <string>
#include <vector>

#include "policies/policy.h"

namespace kvevict {

// Throws kvevict::Error naming the known policies when `name` is unknown.
std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyOptions& options);
std::vector<std::string> policy_names();
// The known names and the composition syntax, for --policy's help.
std::string policy_help();
// The full cache: the default policy and the reference others are compared with.
std::string reference_policy_name();
// The eviction policy that stands for all where a default is needed (bench's profile
// and its full-vs-evicting comparisons): H2O, the one the paper studies.
std::string default_eviction_policy_name();
// True when `name` is a known policy that keeps everything (false for any other name,
// so results files from other versions read fine).
bool is_reference_policy(const std::string& name);
// The policies `kvevict analyze` measures attention recall for by default.
std::vector<std::string> default_recall_policies();

}  // namespace kvevict
