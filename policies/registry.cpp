#include "policies/registry.h"

#include "harness/common/errors.h"
#include "policies/ada_kv.h"
#include "policies/block_prefill.h"
#include "policies/cam.h"
#include "policies/chunk_kv.h"
#include "policies/critical_kv.h"
#include "policies/decoding_compression.h"
#include "policies/static_pattern.h"
#include "policies/think.h"

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

// Wrappers over any scored policy, written PREFIX+POLICY.
struct Wrapper {
  const char* prefix;
  std::unique_ptr<Policy> (*wrap)(std::unique_ptr<Policy>, const PolicyOptions&);
  std::vector<const ParamSpec*> parameters;  // the wrapper's own
};
// critical+ada+ before critical+: the longer prefix names CriticalAdaKV.
const Wrapper kWrappers[] = {{kAdaPrefix, make_ada_kv, {&kAdaSafeguard}},
                             {kChunkPrefix, make_chunk_kv, {&kChunkLength}},
                             {kCriticalAdaPrefix, make_critical_ada_kv, {&kCriticalFirstStage}},
                             {kCriticalPrefix, make_critical_kv, {&kCriticalFirstStage}},
                             {kDecodingPrefix, make_decoding_compression, {&kDecodeInterval, &kDecodeTarget, &kDecodeRatio}},
                             {kBlockPrefix, make_block_prefill, {&kBlockSize}},
                             {kThinkPrefix, make_think, {&kKeyChannelRatio, &kThinkWindow}},
                             {kCamPrefix, make_cam, {&kMergeBudget, &kMergeSeed}}};

const ParamSpec* find_if_key(const std::vector<const ParamSpec*>& params, const std::string& key) {
  for (const ParamSpec* p : params)
    if (p->key() == key) return p;
  return nullptr;
}
}  // namespace

std::string policy_help() {
  std::string known;
  for (const auto& n : policy_names()) known += (known.empty() ? "" : ", ") + n;
  return known + "; SCORED+PATTERN (e.g. h2o+sparse-strided) adds a scored policy's heavy hitters to a static pattern; "
                 "ada+SCORED (e.g. ada+snapkv) gives a scored policy Ada-KV's head-adaptive budgets; "
                 "chunk+SCORED (e.g. chunk+snapkv) keeps a scored policy's best chunks of contiguous tokens (ChunkKV); "
                 "decoding+SCORED (e.g. decoding+h2o) compresses every decode_interval generated tokens to decode_target "
                 "or decode_ratio (DecodingPress), the prefill whole unless a budget is given; "
                 "block+SCORED (e.g. block+keydiff) compresses the prefill to the budget after each block of block_size "
                 "tokens (BlockPress); "
                 "critical+SCORED (e.g. critical+snapkv) selects in CriticalKV's two stages, by the score and then "
                 "the score x the value's norm; critical+ada+SCORED does so within Ada-KV's head budgets (CriticalAdaKV); "
                 "think+POLICY (e.g. think+snapkv) zeroes each KV head's key channels of lowest query-key magnitude "
                 "at the end of the prefill (ThinK); "
                 "cam+POLICY (e.g. cam+h2o) merges each evicted token's value into the merge_budget kept tokens "
                 "after it, with CaM's merge probability (CaM)";
}

std::string reference_policy_name() {
  for (const auto& e : kPolicies)
    if (e.factory({})->keeps_everything()) return e.name;
  throw Error("internal: no full-cache policy is registered");
}

std::string default_eviction_policy_name() { return "h2o"; }

bool is_reference_policy(const std::string& name) {
  for (const auto& e : kPolicies)
    if (name == e.name) return e.factory({})->keeps_everything();
  return false;
}

std::vector<std::string> default_recall_policies() {
  return {"local", "h2o", "sparse-strided", "sparse-fixed", "h2o+sparse-strided"};
}

const std::vector<const ParamSpec*>& all_policy_params() {
  static const std::vector<const ParamSpec*> params = [] {
    std::vector<const ParamSpec*> all;
    std::vector<const ParamSpec*> declared;
    for (const auto& e : kPolicies)
      for (const ParamSpec* p : e.factory({})->parameters()) declared.push_back(p);
    for (const Wrapper& w : kWrappers) declared.insert(declared.end(), w.parameters.begin(), w.parameters.end());
    for (const ParamSpec* p : declared) {
      const ParamSpec* known = find_if_key(all, p->key());
      if (!known) all.push_back(p);
      else if (known != p) throw Error("internal: policy parameter \"" + p->key() + "\" is declared twice");
    }
    return all;
  }();
  return params;
}

const ParamSpec* find_policy_param(const std::string& key) { return find_if_key(all_policy_params(), key); }

namespace {
const ParamSpec& declared(const std::string& key) {
  const ParamSpec* spec = find_policy_param(key);
  if (!spec) throw Error("unknown policy parameter \"" + key + "\"");
  return *spec;
}
}  // namespace

void PolicyParams::set(const std::string& key, double value) { set(declared(key), value); }
void PolicyParams::set(const std::string& key, const std::string& text) { set(declared(key), text, key); }

std::vector<std::string> policy_names() {
  std::vector<std::string> names;
  for (const auto& e : kPolicies) names.push_back(e.name);
  return names;
}

namespace {
std::unique_ptr<Policy> make_named_policy(const std::string& name, const PolicyOptions& options) {
  for (const Wrapper& w : kWrappers)
    if (name.rfind(w.prefix, 0) == 0)
      return w.wrap(make_named_policy(name.substr(std::string(w.prefix).size()), options), options);
  // "scored+pattern": heavy hitters of a scored policy on top of a static pattern.
  const size_t plus = name.find('+');
  if (plus != std::string::npos)
    return compose_with_pattern(make_named_policy(name.substr(0, plus), options),
                                make_named_policy(name.substr(plus + 1), options));
  for (const auto& e : kPolicies)
    if (name == e.name) return e.factory(options);
  std::string known;
  for (const auto& n : policy_names()) known += (known.empty() ? "" : ", ") + n;
  throw Error("unknown policy \"" + name + "\" (known: " + known + ")");
}
}  // namespace

std::unique_ptr<Policy> make_policy(const std::string& name, const PolicyOptions& options) {
  auto policy = make_named_policy(name, options);
  // Cache settings the policy has no use for are refused, not ignored: every front end
  // (CLI, sweep cells, server) makes its policies here.
  const KvQuantSpec& quant = options.kv_quant;
  if (quant.memory > 0 && policy->keeps_everything())
    throw Error(std::string(quant.keys->memory) + " picks the token budget of an evicting policy; policy " +
                policy->name() + " keeps every token");
  if (quant.memory > 0 && !policy->realisable())
    throw Error(std::string(quant.keys->memory) + " is a byte budget of a cache; policy " + policy->name() +
                " is sim-only and holds none (give it a budget)");
  if (quant.enabled() && policy->realisable() && policy->as_realisable()->rewrites_slots())
    throw Error("policy " + policy->name() + " rewrites the keys or values of kept slots, which " + quant.keys->quant +
                " kivi holds quantized; that is not implemented");
  if (quant.enabled() && !policy->realisable())
    throw Error("policy " + policy->name() + " is sim-only: it cannot run with " + quant.keys->quant +
                " kivi, which quantizes a cache a realisable policy evicts from");
  return policy;
}

}  // namespace kvevict
