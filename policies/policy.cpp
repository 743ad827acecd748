#include "policies/policy.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <numeric>
#include <stdexcept>

#include "harness/common/errors.h"
#include "harness/common/limits.h"
#include "policies/slot_selection.h"

namespace kvevict {

const ParamSpec kGroupReduce = ParamSpec::choice(
    "group_reduce", {"mean", "max"}, "GQA aggregation over a KV head's query heads");

Budget Policy::layer_budget(int /*layer*/, const SequenceShape& shape) const {
  if (keeps_everything()) {
    Budget budget;
    budget.unlimited = true;
    return budget;
  }
  return split_budget(budget_for(shape), shape.length, sink_tokens(), default_heavy_share(), name());
}

BudgetSpec Policy::budget_for(const SequenceShape& shape) const {
  const KvQuantSpec& quant = options_.kv_quant;
  if (quant.memory <= 0 || keeps_everything()) return options_.budget;
  if (options_.budget.is_set())
    throw Error(std::string(quant.keys->memory) + " sets the token budget: give it or a budget, not both");
  if (shape.head_dim <= 0) throw Error("internal: a memory budget needs the model's head_dim");
  const int64_t tokens = tokens_for_memory(quant, quant.memory, shape.length, shape.head_dim);
  // The bound counts the current token beside the kept ones.
  if (tokens < 2)
    throw Error(std::string(quant.keys->memory) + " " + std::to_string(quant.memory) + " keeps no token of " +
                std::to_string(shape.length) + " at " + std::to_string(quant.bits) + " bits");
  BudgetSpec spec = options_.budget;
  spec.tokens = static_cast<int>(tokens - 1);
  spec.ratio = -1;
  return spec;
}

void Policy::validate(const SequenceShape& shape) const {
  if (keeps_everything()) return;
  check_budget_fits(budget_for(shape), shape.length, sink_tokens(), name());
}

void Policy::check_keeps_a_token(int64_t max_positions) const {
  if (keeps_everything() || !options_.budget.is_ratio() || options_.kv_quant.memory > 0 || max_positions < 1) return;
  SequenceShape shape;
  shape.length = static_cast<int>(std::min<int64_t>(max_positions, kMaxModelPositions));
  shape.prefill_len = shape.length;
  const Budget budget = layer_budget(0, shape);
  if (budget.unlimited || budget.capacity > 0) return;
  refuse_zero_budget(options_.budget, shape.length);
}

void row_softmax(const float* row, int i, const char* keep, float* out) {
  float m = -std::numeric_limits<float>::infinity();
  for (int j = 0; j <= i; ++j)
    if (!keep || keep[j]) m = std::max(m, row[j]);
  float sum = 0;
  for (int j = 0; j <= i; ++j) sum += (out[j] = (!keep || keep[j]) ? std::exp(row[j] - m) : 0.0f);
  for (int j = 0; j <= i; ++j) out[j] /= sum;
}

// ---------------------------------------------------------------------------------
namespace {

// One KV head of a scored policy: its slots, the policy's per-slot state, and the top-k
// selection with the sink and recent windows (slot_selection.h). With a decision shared
// by the layer's heads, the scores come from the layer's SharedScores.
class ScoredHeadState : public LayerState {
 public:
  ScoredHeadState(const ScoredPolicy& policy, int layer, int kv_head, Budget budget, int group, GroupReduce reduce,
                  std::shared_ptr<SharedScores> shared)
      : policy_(policy), budget_(budget), group_(group), reduce_(reduce), shared_(std::move(shared)) {
    slots_.channels = policy.channels();
    slots_.layer = layer;
    slots_.kv_head = kv_head;
    if (shared_) shared_->attach(kv_head, &slots_);
  }

  void append(int position, float key_norm) override {
    float* values = slots_.append(position);
    policy_.on_append(slots_, values, position, key_norm);
  }

  void observe(const float* probs) override {
    reduce_group(probs, group_, slots_.size(), reduce_, &aggregated_);
    policy_.on_observe(slots_, aggregated_.data());
    slots_.steps++;
  }

  bool compress(std::vector<int>* keep) override {
    const int n = slots_.size();
    if (budget_.unlimited || n <= budget_.capacity) return false;
    const float* scores;
    if (shared_) {
      scores = shared_->scores().data();
    } else {
      scores_.resize(n);
      policy_.score(slots_, scores_.data());
      scores = scores_.data();
    }
    // The steady state evicts one slot per step: a scan, an erase in place. Otherwise the
    // general selection and a gather.
    const int evicted = single_evicted_slot(slots_.positions, scores, budget_);
    if (evicted >= 0) {
      slots_.erase(evicted);
      if (keep) {
        keep->resize(n - 1);
        for (int s = 0; s < n - 1; ++s) (*keep)[s] = s < evicted ? s : s + 1;
      }
    } else {
      select_kept_slots(slots_.positions, scores, budget_, &kept_, &candidates_);
      slots_.gather(kept_);
      if (keep) *keep = kept_;
    }
    return true;
  }

  const std::vector<int>& positions() const override { return slots_.positions; }

 private:
  const ScoredPolicy& policy_;
  Budget budget_;
  int group_;
  GroupReduce reduce_;
  std::shared_ptr<SharedScores> shared_;
  HeadSlots slots_;
  std::vector<float> aggregated_, scores_;
  std::vector<int> kept_, candidates_;
};

}  // namespace

LayerStates ScoredPolicy::make_layer_states(int layer, const SequenceShape& shape) const {
  LayerStates states;
  states.lockstep = shared_across_heads();
  auto shared = states.lockstep ? std::make_shared<SharedScores>(*this, shape.n_kv_heads) : nullptr;
  const Budget budget = layer_budget(layer, shape);
  const GroupReduce reduce = parse_group_reduce(options_.params.text(kGroupReduce));
  for (int h = 0; h < shape.n_kv_heads; ++h)
    states.heads.push_back(
        std::make_unique<ScoredHeadState>(*this, layer, h, budget, shape.group(), reduce, shared));
  return states;
}

}  // namespace kvevict
