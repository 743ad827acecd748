// One KV head's slots as a scored policy keeps them: the slots with the policy's per-slot
// state, fed by append (the policy's on_append) and observe (the GQA reduction of the
// query group's attention, then on_observe). ScoredPolicy's head state and Ada-KV's share
// it; they differ only in how they compress.
#pragma once
#include <vector>

#include "policies/policy.h"

namespace kvevict {

class ScoredSlots {
 public:
  ScoredSlots(const ScoredPolicy& policy, int layer, int kv_head, const SequenceShape& shape, GroupReduce reduce)
      : policy_(policy), group_(shape.group()), reduce_(reduce) {
    slots.channels = policy.channels(shape.head_dim);
    slots.layer = layer;
    slots.kv_head = kv_head;
    policy.on_create(slots, shape);
  }

  void append(int position, const NewToken& token) {
    float* values = slots.append(position);
    policy_.on_append(slots, values, position, token);
  }

  // The newest slot now stands for `position` (LayerState::merge). The policy's on_append
  // runs again over the slot's values as they are, so what it reads from the key and the
  // position follows the new key, and what observe accumulated stays.
  void merge(int position, const NewToken& token) {
    policy_.on_append(slots, slots.renew_last(position), position, token);
  }

  // probs: [group][slots], the attention of the head's query heads.
  void observe(const float* probs) {
    // One query head per KV head: its row is the mean and the maximum, bit for bit.
    if (group_ == 1) {
      policy_.on_observe(slots, probs);
    } else {
      reduce_group(probs, group_, slots.size(), reduce_, &aggregated_);
      policy_.on_observe(slots, aggregated_.data());
    }
    slots.steps++;
  }

  HeadSlots slots;

 private:
  const ScoredPolicy& policy_;
  int group_;
  GroupReduce reduce_;
  std::vector<float> aggregated_;  // [slots]
};

}  // namespace kvevict
