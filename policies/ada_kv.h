// Ada-KV (Feng et al., arXiv 2407.11550; kvpress's AdaKVPress): head-adaptive budgets
// over any scored policy, written "ada+POLICY" (ada+snapkv, ada+h2o, ...).
//
// A layer keeps the same number of slots as the uniform policy, H x capacity over its H
// KV heads, but chooses them across heads: each head first keeps its top
// int(safeguard x capacity) slots (its sink and recent windows count, as kvpress scores
// SnapKV's window with the largest float), then the layer keeps the best slots of all
// its heads until H x capacity are kept. Scores are the inner policy's, per head. Heads
// then hold different numbers of slots; the decode cache keeps them ragged.
#pragma once
#include <memory>

#include "policies/policy.h"

namespace kvevict {

inline const ParamSpec kAdaSafeguard =
    ParamSpec::real("ada_safeguard", 0.2, "ada+POLICY: share of a head's budget it keeps whatever the other heads score")
        .at_least(0)
        .at_most(1);

// The prefix that asks for Ada-KV budgets over a scored policy.
inline constexpr const char* kAdaPrefix = "ada+";

// Wraps `scored` (a ScoredPolicy that evicts); kvevict::Error naming the policy otherwise.
std::unique_ptr<Policy> make_ada_kv(std::unique_ptr<Policy> scored, const PolicyOptions& options);

}  // namespace kvevict
