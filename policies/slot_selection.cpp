#include "policies/slot_selection.h"

#include <algorithm>
#include <cmath>

namespace kvevict {
namespace {

struct Split {
  int n_sink = 0, n_recent = 0, n_heavy = 0, n_candidates = 0;
};

// The slots [n_sink, n_sink + n_candidates) compete for n_heavy places.
Split split_slots(const std::vector<int>& positions, const Budget& budget) {
  const int n = static_cast<int>(positions.size());
  Split split;
  while (split.n_sink < n && positions[split.n_sink] < budget.sink) ++split.n_sink;
  split.n_recent = std::min(budget.recent, n - split.n_sink);
  split.n_candidates = n - split.n_sink - split.n_recent;
  split.n_heavy = std::min(std::max(0, budget.capacity - split.n_sink - split.n_recent), split.n_candidates);
  return split;
}

}  // namespace

void select_kept_slots(const std::vector<int>& positions, const float* scores, const Budget& budget,
                       std::vector<int>* kept, std::vector<int>* candidates) {
  const int n = static_cast<int>(positions.size());
  const Split split = split_slots(positions, budget);
  kept->clear();
  for (int s = 0; s < split.n_sink; ++s) kept->push_back(s);
  candidates->clear();
  for (int s = split.n_sink; s < n - split.n_recent; ++s) candidates->push_back(s);
  std::partial_sort(candidates->begin(), candidates->begin() + split.n_heavy, candidates->end(),
                    [&](int a, int b) {
                      if (scores[a] != scores[b]) return scores[a] > scores[b];
                      return a > b;
                    });
  candidates->resize(split.n_heavy);
  std::sort(candidates->begin(), candidates->end());
  kept->insert(kept->end(), candidates->begin(), candidates->end());
  for (int s = n - split.n_recent; s < n; ++s) kept->push_back(s);
}

int single_evicted_slot(const std::vector<int>& positions, const float* scores, const Budget& budget) {
  const Split split = split_slots(positions, budget);
  if (split.n_candidates - split.n_heavy != 1) return -1;
  // The last candidate in the selection's order: the lowest score, the oldest among
  // equals (the scan keeps the first minimum).
  const int first = split.n_sink, end = split.n_sink + split.n_candidates;
  int worst = first;
  for (int s = first; s < end; ++s) {
    if (std::isnan(scores[s])) return -1;
    if (scores[s] < scores[worst]) worst = s;
  }
  return worst;
}

}  // namespace kvevict
