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
#include <vector>

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

// Ada-KV's allocation over one layer's KV heads, ranked together: heads[h]'s slots with
// scores[h] (the inner policy's, one per slot). Each head's sink and recent windows (the
// budget's) come first, then each head's `safeguard` best slots, then the layer's best
// until `layer_capacity` slots are kept; ties go to the more recent position, then the
// lower head. kept[h]: head h's kept slot indices, ascending. CriticalAdaKV
// (critical_kv.h) uses it for its per-head counts.
void ada_allocate(const std::vector<const HeadSlots*>& heads, const std::vector<std::vector<float>>& scores,
                  const Budget& budget, int safeguard, int layer_capacity, std::vector<std::vector<int>>* kept);

}  // namespace kvevict
