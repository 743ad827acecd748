#include "policies/registry.h"

#include "harness/common/errors.h"
#include "policies/static_pattern.h"

namespace kvevict {

#define KVEVICT_POLICY(name, factory) std::unique_ptr<Policy> factory(const PolicyOptions&);
#include "policies/policy_list.h"
#undef KVEVICT_POLICY

namespace {
struct Entry {
  const char* name;
  std::unique_ptr<Policy> (*factory)(const PolicyOptions&);
};
const Entry kPolicies[] = {
#define KVEVICT_POLICY(name, factory) {name, factory},
#include "policies/policy_list.h"
#undef KVEVICT_POLICY
};
}  // namespace

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const auto& e : kPolicies) names.push_back(e.name);
  return names;
}

std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyOptions& options) {
  // "scored+pattern": heavy hitters of a scored policy on top of a static pattern.
  const size_t plus = name.find('+');
  if (plus != std::string::npos)
    return compose_with_pattern(make_policy(name.substr(0, plus), options), make_policy(name.substr(plus + 1), options));
  for (const auto& e : kPolicies)
    if (name == e.name) return e.factory(options);
  std::string known;
  for (const auto& n : policy_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown policy \"" + name + "\" (known: " + known + ")");
}

}  // namespace kvevict
