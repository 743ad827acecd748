// Which slots a scored policy keeps at a compression step (ScoredPolicy's top-k with
// its sink and recent windows), in two forms that must agree: the general selection,
// and the steady state's single eviction, which is an O(n) scan instead of a sort.
#pragma once
#include <vector>

#include "policies/policy.h"

namespace kvevict {

// Sinks (positions < budget.sink, a prefix of the slots) and the last budget.recent
// slots stay; the rest of the capacity goes to the highest-scoring slots in between.
// Among equal scores the more recent slot stays. Fills kept with ascending slot indices.
// candidates is scratch space.
void select_kept_slots(const std::vector<int>& positions, const float* scores, const Budget& budget,
                       std::vector<int>* kept, std::vector<int>* candidates);

// The one slot the selection above evicts when it evicts exactly one (the lowest score;
// among equal scores the older slot), else -1: more or fewer than one slot to evict, or
// a NaN score among the candidates (the general selection decides those).
int single_evicted_slot(const std::vector<int>& positions, const float* scores, const Budget& budget);

}  // namespace kvevict
