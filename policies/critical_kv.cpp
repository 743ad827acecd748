#include "policies/critical_kv.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/common/errors.h"
#include "policies/ada_kv.h"
#include "policies/scored_slots.h"
#include "policies/slot_selection.h"
#include "policies/wrapper_policy.h"

namespace kvevict {

void critical_scores(const std::vector<int>& positions, const float* base, const std::vector<float>& value_norms,
                     const Budget& budget, double first_stage_ratio, std::vector<float>* out) {
  const int n = static_cast<int>(positions.size());
  int n_sink = 0;
  while (n_sink < n && positions[n_sink] < budget.sink) ++n_sink;
  const int n_recent = std::min(budget.recent, n - n_sink);
  const int n_candidates = n - n_sink - n_recent;
  const int n_heavy = std::min(std::max(0, budget.capacity - n_sink - n_recent), n_candidates);
  const int first_stage = std::min(
      n_heavy, std::max(0, static_cast<int>(first_stage_ratio * budget.capacity) - n_sink - n_recent));
  const float lowest = -std::numeric_limits<float>::infinity();
  out->resize(n);
  for (int s = 0; s < n; ++s) {
    const double second = (static_cast<double>(base[s]) + kCriticalEpsilon) * value_norms[s];
    (*out)[s] = std::isnan(second) ? lowest : static_cast<float>(second);
  }
  // Stage 1: the best base scores between the windows, the later slot among equals (the
  // order select_kept_slots keeps).
  std::vector<int> candidates;
  for (int s = n_sink; s < n - n_recent; ++s) candidates.push_back(s);
  const auto base_of = [&](int s) { return std::isnan(base[s]) ? lowest : base[s]; };
  std::partial_sort(candidates.begin(), candidates.begin() + first_stage, candidates.end(), [&](int a, int b) {
    return base_of(a) != base_of(b) ? base_of(a) > base_of(b) : a > b;
  });
  for (int i = 0; i < first_stage; ++i) (*out)[candidates[i]] = std::numeric_limits<float>::infinity();
}

namespace {

double value_l1_norm(const NewToken& token, int head_dim) {
  double sum = 0;
  for (int c = 0; c < head_dim; ++c) sum += std::fabs(static_cast<double>(token.value[c]));
  return sum;
}

// One KV head: the inner policy's slots and state, and each slot's value norm beside them.
class CriticalSlots {
 public:
  CriticalSlots(const ScoredPolicy& inner, int layer, int kv_head, const SequenceShape& shape, GroupReduce reduce)
      : head(inner, layer, kv_head, shape, reduce), head_dim_(shape.head_dim) {}

  void append(int position, const NewToken& token) {
    head.append(position, token);
    value_norms.push_back(static_cast<float>(value_l1_norm(token, head_dim_)));
  }
  void merge(int position, const NewToken& token) {
    head.merge(position, token);
    value_norms.back() = static_cast<float>(value_l1_norm(token, head_dim_));
  }
  void gather(const std::vector<int>& kept) {
    head.slots.gather(kept);
    for (size_t i = 0; i < kept.size(); ++i) value_norms[i] = value_norms[kept[i]];
    value_norms.resize(kept.size());
  }

  ScoredSlots head;
  std::vector<float> value_norms;

 private:
  int head_dim_;
};

class CriticalHeadState : public LayerState {
 public:
  CriticalHeadState(const ScoredPolicy& inner, int layer, int kv_head, Budget budget, const SequenceShape& shape,
                    GroupReduce reduce, double first_stage_ratio)
      : inner_(inner), slots_(inner, layer, kv_head, shape, reduce), budget_(budget),
        first_stage_ratio_(first_stage_ratio) {}

  std::unique_ptr<LayerState> clone(LayerStateCopies&) const override {
    return std::make_unique<CriticalHeadState>(*this);
  }
  void append(int position, const NewToken& token) override { slots_.append(position, token); }
  void merge(int position, const NewToken& token) override { slots_.merge(position, token); }
  void observe(const float* probs) override { slots_.head.observe(probs); }

  bool compress(std::vector<int>* keep) override {
    const HeadSlots& head = slots_.head.slots;
    const int n = head.size();
    if (budget_.unlimited || n == 0) return false;
    const int newest = head.positions.back();
    if (!budget_.compresses_after(newest)) return false;
    Budget budget = budget_;
    budget.capacity = budget_.capacity_after(newest);
    if (n <= budget.capacity) return false;
    base_.resize(n);
    inner_.score(head, base_.data());
    critical_scores(head.positions, base_.data(), slots_.value_norms, budget, first_stage_ratio_, &scores_);
    select_kept_slots(head.positions, scores_.data(), budget, &kept_, &candidates_);
    slots_.gather(kept_);
    if (keep) *keep = kept_;
    return true;
  }

  const std::vector<int>& positions() const override { return slots_.head.slots.positions; }

 private:
  const ScoredPolicy& inner_;
  CriticalSlots slots_;
  Budget budget_;
  double first_stage_ratio_;
  std::vector<float> base_, scores_;
  std::vector<int> kept_, candidates_;
};

// CriticalAdaKV's layer decision: Ada-KV's count per head from the inner scores (the
// allocation of ada_kv.cpp: windows first, then each head's safeguard, then the layer's
// best), then each head's two stages within its count. The heads run in lockstep; the
// first to compress after a query decides for all.
class CriticalAdaLayer {
 public:
  CriticalAdaLayer(const ScoredPolicy& inner, Budget budget, int n_heads, double safeguard, double first_stage_ratio)
      : inner_(inner), budget_(budget), heads_(n_heads, nullptr), kept_(n_heads), pending_(n_heads, 0),
        guard_(static_cast<int>(safeguard * budget.capacity)), first_stage_ratio_(first_stage_ratio) {}
  void attach(int kv_head, const CriticalSlots* slots) { heads_[kv_head] = slots; }

  bool take(int kv_head, std::vector<int>* keep) {
    if (!pending_[kv_head]) decide();
    pending_[kv_head] = 0;
    if (static_cast<int>(kept_[kv_head].size()) == heads_[kv_head]->head.slots.size()) return false;
    *keep = kept_[kv_head];
    return true;
  }

 private:
  void decide() {
    const int H = static_cast<int>(heads_.size());
    std::fill(pending_.begin(), pending_.end(), 1);
    int total = 0;
    for (const CriticalSlots* head : heads_) total += head->head.slots.size();
    const HeadSlots& first = heads_[0]->head.slots;
    const int newest = first.positions.empty() ? 0 : first.positions.back();
    const int layer_capacity = budget_.capacity_after(newest) * H;
    for (auto& kept : kept_) kept.clear();
    if (budget_.unlimited || !budget_.compresses_after(newest) || total <= layer_capacity) {
      for (int h = 0; h < H; ++h)
        for (int s = 0; s < heads_[h]->head.slots.size(); ++s) kept_[h].push_back(s);
      return;
    }
    // Ada-KV's allocation (ada_kv.h): how many slots each head keeps.
    base_.resize(H);
    slots_of_heads_.resize(H);
    for (int h = 0; h < H; ++h) {
      const HeadSlots& head = heads_[h]->head.slots;
      slots_of_heads_[h] = &head;
      base_[h].resize(head.size());
      inner_.score(head, base_[h].data());
    }
    ada_allocate(slots_of_heads_, base_, budget_, guard_, layer_capacity, &allocation_);
    counts_.assign(H, 0);
    for (int h = 0; h < H; ++h) counts_[h] = static_cast<int>(allocation_[h].size());
    // Each head's two stages within its count; its windows stay (the windows' tier put
    // them in the count, up to the count itself).
    for (int h = 0; h < H; ++h) {
      const CriticalSlots& head = *heads_[h];
      Budget budget = budget_;
      budget.capacity = counts_[h];
      critical_scores(head.head.slots.positions, base_[h].data(), head.value_norms, budget, first_stage_ratio_,
                      &scores_);
      select_kept_slots(head.head.slots.positions, scores_.data(), budget, &kept_[h], &scratch_);
    }
  }

  const ScoredPolicy& inner_;
  Budget budget_;
  std::vector<const CriticalSlots*> heads_;
  std::vector<std::vector<int>> kept_;
  std::vector<char> pending_;
  int guard_;
  double first_stage_ratio_;
  std::vector<const HeadSlots*> slots_of_heads_;
  std::vector<std::vector<float>> base_;        // [head][slot]: the inner policy's scores
  std::vector<std::vector<int>> allocation_;    // [head]: the slots Ada-KV's allocation keeps
  std::vector<int> counts_, scratch_;
  std::vector<float> scores_;
};

class CriticalAdaHeadState : public LayerState {
 public:
  CriticalAdaHeadState(const ScoredPolicy& inner, int layer, int kv_head, const SequenceShape& shape, GroupReduce reduce,
                       std::shared_ptr<CriticalAdaLayer> decision)
      : slots_(inner, layer, kv_head, shape, reduce), kv_head_(kv_head), decision_(std::move(decision)) {
    decision_->attach(kv_head, &slots_);
  }

  std::unique_ptr<LayerState> clone(LayerStateCopies& copies) const override {
    auto copy = std::make_unique<CriticalAdaHeadState>(*this);
    copy->decision_ = copies.copy_of(decision_);
    copy->decision_->attach(kv_head_, &copy->slots_);
    return copy;
  }
  void append(int position, const NewToken& token) override { slots_.append(position, token); }
  void merge(int position, const NewToken& token) override { slots_.merge(position, token); }
  void observe(const float* probs) override { slots_.head.observe(probs); }
  bool compress(std::vector<int>* keep) override {
    if (!decision_->take(kv_head_, &kept_)) return false;
    slots_.gather(kept_);
    if (keep) *keep = kept_;
    return true;
  }
  const std::vector<int>& positions() const override { return slots_.head.slots.positions; }

 private:
  CriticalSlots slots_;
  int kv_head_;
  std::shared_ptr<CriticalAdaLayer> decision_;
  std::vector<int> kept_;
};

// The inner scored policy of `prefix` + its name, each of whose heads decides alone.
const ScoredPolicy& critical_inner(const Policy& inner, const char* prefix) {
  const ScoredPolicy& scored = wrapped_scored_policy(inner, prefix);
  if (scored.shared_across_heads())
    throw Error("policy " + std::string(prefix) + inner.name() + ": \"" + inner.name() +
                "\" decides once for all heads of a layer; CriticalKV weighs each head's values (e.g. " + prefix +
                "snapkv)");
  return scored;
}

class CriticalKVPolicy : public WrapperPolicy<RealisablePolicy> {
 public:
  CriticalKVPolicy(std::unique_ptr<Policy> inner, const ScoredPolicy& scored, const PolicyOptions& options,
                   bool adaptive)
      : WrapperPolicy(std::move(inner), scored, options, adaptive ? kCriticalAdaPrefix : kCriticalPrefix,
                      kCriticalFirstStage),
        adaptive_(adaptive) {}

  std::vector<const ParamSpec*> parameters() const override {
    std::vector<const ParamSpec*> params = WrapperPolicy::parameters();
    if (adaptive_) params.push_back(&kAdaSafeguard);
    return params;
  }
  // The values' norms, and whatever the inner policy reads.
  // The values' norms, and whatever the inner policy reads (the kinds are ordered).
  TokenVectors token_vectors() const override { return std::max(TokenVectors::KeysAndValues, scored_.token_vectors()); }

  LayerStates make_layer_states(int layer, const SequenceShape& shape) const override {
    if (shape.head_dim <= 0) throw Error("internal: policy " + name() + " reads each value and needs the model's head_dim");
    LayerStates states;
    const Budget budget = layer_budget(layer, shape);
    const GroupReduce reduce = parse_group_reduce(options_.params.text(kGroupReduce));
    const double first_stage = options_.params.real(kCriticalFirstStage);
    std::shared_ptr<CriticalAdaLayer> decision;
    if (adaptive_) {
      states.lockstep = true;  // one allocation across the layer's heads
      decision = std::make_shared<CriticalAdaLayer>(scored_, budget, shape.n_kv_heads,
                                                    options_.params.real(kAdaSafeguard), first_stage);
    }
    for (int h = 0; h < shape.n_kv_heads; ++h) {
      if (adaptive_)
        states.heads.push_back(std::make_unique<CriticalAdaHeadState>(scored_, layer, h, shape, reduce, decision));
      else
        states.heads.push_back(std::make_unique<CriticalHeadState>(scored_, layer, h, budget, shape, reduce, first_stage));
    }
    return states;
  }

 private:
  bool adaptive_;
};

}  // namespace

std::unique_ptr<Policy> make_critical_kv(std::unique_ptr<Policy> inner, const PolicyOptions& options) {
  const ScoredPolicy& scored = critical_inner(*inner, kCriticalPrefix);
  return std::make_unique<CriticalKVPolicy>(std::move(inner), scored, options, false);
}

std::unique_ptr<Policy> make_critical_ada_kv(std::unique_ptr<Policy> inner, const PolicyOptions& options) {
  const ScoredPolicy& scored = critical_inner(*inner, kCriticalAdaPrefix);
  return std::make_unique<CriticalKVPolicy>(std::move(inner), scored, options, true);
}

}  // namespace kvevict
