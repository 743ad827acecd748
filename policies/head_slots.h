// What the scored and the pattern head states share: one KV head's slots with the
// per-slot floats a scored policy keeps, the GQA reduction of a query group's attention,
// and the layer-level score a decision shared by all heads is made from.
#pragma once
#include <memory>
#include <vector>

namespace kvevict {

class ScoredPolicy;

// One KV head's slots, oldest first, with `channels` floats of policy state each.
struct HeadSlots {
  std::vector<int> positions;
  std::vector<float> values;  // [slots][channels], policy-defined
  int channels = 1;
  int layer = 0;
  int kv_head = 0;
  int steps = 0;  // queries observed so far
  // What a policy keeps of the head as a whole rather than per slot (ScoredPolicy::
  // on_create); evictions leave it alone.
  std::vector<double> head_state;

  int size() const { return static_cast<int>(positions.size()); }
  // Appends a slot with zeroed channels; returns them.
  float* append(int position);
  // The newest slot stands for `position` now (a DMC merge); returns its channels as they are.
  float* renew_last(int position);
  void erase(int slot);
  // Keeps the slots `kept` (ascending), in that order.
  void gather(const std::vector<int>& kept);
};

// How a KV head's query heads' attention becomes one row (sweep key group_reduce).
enum class GroupReduce { Mean, Max };
GroupReduce parse_group_reduce(const std::string& name);

// probs [group][n] -> out [n]: the mean (or maximum) over the group, per slot.
void reduce_group(const float* probs, int group, int n, GroupReduce how, std::vector<float>* out);

// A decision made once per layer for all its heads (TOVA, and any scored policy that
// says shared_across_heads): the heads' scores averaged slot by slot. The heads hold the
// same slots. The driver runs such heads in lockstep, so every head has observed query i
// before any compresses after it; the first head to ask computes the average for that
// step, the others reuse it.
class SharedScores {
 public:
  SharedScores(const ScoredPolicy& policy, int n_heads) : policy_(policy), heads_(n_heads, nullptr) {}
  void attach(int kv_head, const HeadSlots* slots) { heads_[kv_head] = slots; }
  // The average over the heads of policy.score, for the step the heads are at.
  const std::vector<float>& scores();

 private:
  const ScoredPolicy& policy_;
  std::vector<const HeadSlots*> heads_;
  std::vector<float> average_, head_scores_;
  int step_ = -1;
};

}  // namespace kvevict
