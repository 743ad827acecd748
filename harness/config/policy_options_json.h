// A sweep config's "policy_options" object, read through the policies' own parameter
// declarations (policies/params.h): every key must be a declared parameter.
#pragma once
#include <nlohmann/json.hpp>
#include <string>

#include "policies/params.h"

namespace kvevict {

// Throws kvevict::Error naming `path` and the key for an unknown key, a parameter set
// per run (the seed: use "seeds"), or a value outside the parameter's range.
PolicyParams read_policy_options(const nlohmann::json& options, const std::string& path);

// Sets every parameter of `policy_params` that takes the run's seed.
void set_run_seed(PolicyParams& params, const std::vector<const ParamSpec*>& policy_params, std::uint64_t seed);

}  // namespace kvevict
