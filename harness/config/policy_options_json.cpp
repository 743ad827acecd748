#include "harness/config/policy_options_json.h"

#include <cstdint>

#include "harness/common/errors.h"

namespace kvevict {

PolicyParams read_policy_options(const nlohmann::json& options, const std::string& path) {
  if (!options.is_object()) throw Error(path + ": \"policy_options\" must be an object");
  PolicyParams params;
  for (const auto& [key, value] : options.items()) {
    const ParamSpec* spec = find_policy_param(key);
    if (!spec) {
      std::string known;
      for (const ParamSpec* p : all_policy_params())
        if (!p->takes_run_seed()) known += (known.empty() ? "" : ", ") + p->key();
      throw Error(path + ": policy_options: unknown key \"" + key + "\" (known: " + known + ")");
    }
    if (spec->takes_run_seed())
      throw Error(path + ": policy_options: \"" + key + "\" is set per cell from \"seeds\"");
    const bool choice = spec->kind() == ParamSpec::Kind::Choice || spec->kind() == ParamSpec::Kind::Text;
    if (choice ? !value.is_string() : !value.is_number())
      throw Error(path + ": key \"policy_options." + key + "\" must be " + (choice ? "a string" : "a number") +
                  ", not " + value.dump());
    params.set(*spec, choice ? value.get<std::string>() : value.dump(),
               path + ": policy_options." + key + " (" + spec->cli_flag() + ")");
  }
  return params;
}

void set_run_seed(PolicyParams& params, const std::vector<const ParamSpec*>& policy_params, std::uint64_t seed) {
  for (const ParamSpec* spec : policy_params)
    if (spec->takes_run_seed()) params.set(*spec, std::to_string(seed), "seed");
}

}  // namespace kvevict
