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
#include "policies/scored_slots.h"
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
  Budget budget = split_budget(budget_for(shape), shape.length, sink_tokens(), default_heavy_share(), name());
  budget.question_from = shape.prefill_len;
  budget.question_len = shape.question_len;
  return budget;
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

bool Policy::states_agree(const SequenceShape& a, const SequenceShape& b) const {
  const bool same_but_length = a.prefill_len == b.prefill_len && a.question_len == b.question_len &&
                               a.n_layers == b.n_layers && a.n_q_heads == b.n_q_heads &&
                               a.n_kv_heads == b.n_kv_heads && a.head_dim == b.head_dim;
  if (!same_but_length) return false;
  // A pre-pass's table (SequenceShape::observed) decides as much as the shape does.
  if (a.observed != b.observed &&
      (!a.observed || !b.observed || a.observed->positions != b.observed->positions ||
       a.observed->n_layers != b.observed->n_layers || a.observed->n_kv_heads != b.observed->n_kv_heads ||
       a.observed->values != b.observed->values))
    return false;
  if (a.length == b.length || keeps_everything()) return true;
  return !options_.budget.is_ratio() && options_.kv_quant.memory <= 0;
}

void Policy::check_options_taken(const std::function<std::string(const ParamSpec&)>& param_name) const {
  const std::vector<const ParamSpec*> taken = parameters();
  for (const ParamSpec* spec : all_policy_params()) {
    if (!options_.params.is_set(*spec) || std::find(taken.begin(), taken.end(), spec) != taken.end()) continue;
    std::string list;
    for (const ParamSpec* p : taken) list += (list.empty() ? "" : ", ") + param_name(*p);
    throw Error(param_name(*spec) + " is not a parameter of policy " + name() +
                (list.empty() ? " (it has none)" : " (its parameters: " + list + ")"));
  }
  const BudgetSpec& b = options_.budget;
  const BudgetKeys& k = *b.keys;
  if (keeps_everything()) {
    for (const auto& [given, key] : {std::pair{b.ratio != -1, k.ratio}, {b.tokens != -1, k.tokens},
                                     {b.heavy_share != -1, k.heavy_share}, {b.heavy_ratio != -1, k.heavy_ratio},
                                     {b.recent_ratio != -1, k.recent_ratio}})
      if (given) throw Error(std::string(key) + " does not apply to policy " + name() + ", which keeps every token");
  }
  if (b.heavy_share != -1 && !splits_budget())
    throw Error(std::string(k.heavy_share) + " does not apply to policy " + name() +
                ", whose budget has no heavy-hitter/recent split");
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
  ScoredHeadState(const ScoredPolicy& policy, int layer, int kv_head, Budget budget, const SequenceShape& shape,
                  GroupReduce reduce, std::shared_ptr<SharedScores> shared)
      : policy_(policy), head_(policy, layer, kv_head, shape, reduce), budget_(budget),
        shared_(std::move(shared)) {
    if (shared_) shared_->attach(kv_head, &head_.slots);
  }

  std::unique_ptr<LayerState> clone(LayerStateCopies& copies) const override {
    auto copy = std::make_unique<ScoredHeadState>(*this);
    copy->shared_ = copies.copy_of(shared_);
    if (copy->shared_) copy->shared_->attach(head_.slots.kv_head, &copy->head_.slots);
    return copy;
  }

  void append(int position, const NewToken& token) override { head_.append(position, token); }
  void merge(int position, const NewToken& token) override { head_.merge(position, token); }
  void observe(const float* probs) override { head_.observe(probs); }
  int observation_window() const override { return policy_.observation_window(); }
  void skip_observation() override { head_.slots.steps++; }

  bool compress(std::vector<int>* keep) override {
    const int n = head_.slots.size();
    if (budget_.unlimited || n == 0) return false;
    const int newest = head_.slots.positions.back();
    if (!budget_.compresses_after(newest)) return false;
    Budget budget = budget_;
    budget.capacity = budget_.capacity_after(newest);
    if (n <= budget.capacity) return false;
    const float* scores;
    if (shared_) {
      scores = shared_->scores().data();
    } else {
      scores_.resize(n);
      policy_.score(head_.slots, scores_.data());
      scores = scores_.data();
    }
    // The steady state evicts one slot per step: a scan, an erase in place. Otherwise the
    // general selection and a gather.
    const int evicted = single_evicted_slot(head_.slots.positions, scores, budget);
    if (evicted >= 0) {
      head_.slots.erase(evicted);
      if (keep) {
        keep->resize(n - 1);
        for (int s = 0; s < n - 1; ++s) (*keep)[s] = s < evicted ? s : s + 1;
      }
    } else {
      select_kept_slots(head_.slots.positions, scores, budget, &kept_, &candidates_);
      head_.slots.gather(kept_);
      if (keep) *keep = kept_;
    }
    return true;
  }

  const std::vector<int>& positions() const override { return head_.slots.positions; }

 private:
  const ScoredPolicy& policy_;
  ScoredSlots head_;
  Budget budget_;
  std::shared_ptr<SharedScores> shared_;
  std::vector<float> scores_;
  std::vector<int> kept_, candidates_;
};

}  // namespace

GroupReduce ScoredPolicy::group_reduce() const { return parse_group_reduce(options_.params.text(kGroupReduce)); }

LayerStates ScoredPolicy::make_layer_states(int layer, const SequenceShape& shape) const {
  if (token_vectors() != TokenVectors::None && shape.head_dim <= 0)
    throw Error("internal: policy " + name() + " keeps each key and needs the model's head_dim");
  LayerStates states;
  states.lockstep = states.same_slots = shared_across_heads();
  auto shared = states.lockstep ? std::make_shared<SharedScores>(*this, shape.n_kv_heads) : nullptr;
  const Budget budget = layer_budget(layer, shape);
  const GroupReduce reduce = group_reduce();
  for (int h = 0; h < shape.n_kv_heads; ++h)
    states.heads.push_back(
        std::make_unique<ScoredHeadState>(*this, layer, h, budget, shape, reduce, shared));
  return states;
}

}  // namespace kvevict
