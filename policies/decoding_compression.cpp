#include "policies/decoding_compression.h"

#include <algorithm>

#include "policies/scored_slots.h"
#include "policies/slot_selection.h"
#include "policies/wrapper_policy.h"

namespace kvevict {
namespace {

// When and to what the heads of one layer compress; shared by value by its heads.
struct DecodingSchedule {
  int first_step_position = 0;  // the position of decoding step 1 (prefill_len + question_len)
  int interval = 512;
  int target = 2048;            // tokens kept (decode_target); unused with a ratio
  double ratio = -1;            // decode_ratio when given, else -1
  bool prefill_compressed = false;
  Budget prefill;               // the prefill's budget when a budget was given
  int prefill_last = -1;        // the prefill's last position
  int sink = 0;
  double heavy_share = 0.5;
  BudgetSpec spec;              // for the target's split (its heavy share)
  std::string policy_name;

  // The budget to compress to after the query at `newest`; false when no compression is due.
  bool due(int newest, Budget* budget) const {
    if (prefill_compressed && newest == prefill_last) {
      *budget = prefill;
      budget->question_len = 0;  // the question has not entered yet
      return true;
    }
    const int step = newest - first_step_position + 1;
    if (step < 1 || step % interval != 0) return false;
    BudgetSpec tokens = spec;
    tokens.ratio = -1;
    tokens.heavy_ratio = tokens.recent_ratio = -1;
    tokens.tokens = ratio >= 0 ? std::max(1, static_cast<int>((newest + 1) * ratio)) : target;
    *budget = split_budget(tokens, newest + 1, sink, heavy_share, policy_name);
    return true;
  }
};

// One KV head: the wrapped policy's slots and scores, compressed on the schedule above.
class DecodingHeadState : public LayerState {
 public:
  DecodingHeadState(const ScoredPolicy& scored, const DecodingSchedule& schedule, int layer, int kv_head,
                    const SequenceShape& shape, GroupReduce reduce, std::shared_ptr<SharedScores> shared)
      : scored_(scored), schedule_(schedule), head_(scored, layer, kv_head, shape, reduce),
        shared_(std::move(shared)) {
    if (shared_) shared_->attach(kv_head, &head_.slots);
  }

  std::unique_ptr<LayerState> clone(LayerStateCopies& copies) const override {
    auto copy = std::make_unique<DecodingHeadState>(*this);
    copy->shared_ = copies.copy_of(shared_);
    if (copy->shared_) copy->shared_->attach(head_.slots.kv_head, &copy->head_.slots);
    return copy;
  }

  void append(int position, const NewToken& token) override { head_.append(position, token); }
  void merge(int position, const NewToken& token) override { head_.merge(position, token); }
  void observe(const float* probs) override { head_.observe(probs); }

  bool compress(std::vector<int>* keep) override {
    const int n = head_.slots.size();
    Budget budget;
    if (n == 0 || !schedule_.due(head_.slots.positions.back(), &budget) || n <= budget.capacity) return false;
    const float* scores;
    if (shared_) {
      scores = shared_->scores().data();
    } else {
      scores_.resize(n);
      scored_.score(head_.slots, scores_.data());
      scores = scores_.data();
    }
    select_kept_slots(head_.slots.positions, scores, budget, &kept_, &candidates_);
    head_.slots.gather(kept_);
    if (keep) *keep = kept_;
    return true;
  }

  const std::vector<int>& positions() const override { return head_.slots.positions; }

 private:
  const ScoredPolicy& scored_;
  DecodingSchedule schedule_;
  ScoredSlots head_;
  std::shared_ptr<SharedScores> shared_;
  std::vector<float> scores_;
  std::vector<int> kept_, candidates_;
};

class DecodingCompressionPolicy : public WrapperPolicy<RealisablePolicy> {
 public:
  DecodingCompressionPolicy(std::unique_ptr<Policy> inner, const ScoredPolicy& scored, const PolicyOptions& options)
      : WrapperPolicy(std::move(inner), scored, options, kDecodingPrefix, kDecodeInterval) {
    const PolicyParams& params = options_.params;
    if (params.is_set(kDecodeTarget) && params.is_set(kDecodeRatio))
      throw Error("decode_target and decode_ratio are exclusive: give policy " + name() + "'s target one way");
    if (!params.is_set(kDecodeRatio) && params.integer(kDecodeTarget) < scored_.sink_tokens())
      throw Error("decode_target " + std::to_string(params.integer(kDecodeTarget)) + " is smaller than the " +
                  std::to_string(scored_.sink_tokens()) + " sink tokens of " + name());
  }

  std::vector<const ParamSpec*> parameters() const override {
    std::vector<const ParamSpec*> params = WrapperPolicy::parameters();
    params.push_back(&kDecodeTarget);
    params.push_back(&kDecodeRatio);
    return params;
  }

  // A budget is optional: it compresses the prefill (PrefillDecodingPress).
  void validate(const SequenceShape& shape) const override {
    if (!compresses_prefill()) return;
    if (shape.prefill_len < 1)
      throw Error((options_.budget.is_set() ? budget_text(options_.budget) : options_.kv_quant.keys->memory) +
                  " compresses the prefill under policy " + name() +
                  ", and this run has none (the stream protocol): leave the budget out");
    inner_->validate(shape);
  }

  LayerStates make_layer_states(int layer, const SequenceShape& shape) const override {
    const PolicyParams& params = options_.params;
    DecodingSchedule schedule;
    schedule.first_step_position = shape.prefill_len + shape.question_len;
    schedule.interval = static_cast<int>(params.integer(kDecodeInterval));
    schedule.target = static_cast<int>(params.integer(kDecodeTarget));
    schedule.ratio = params.is_set(kDecodeRatio) ? params.real(kDecodeRatio) : -1;
    schedule.prefill_compressed = compresses_prefill() && shape.prefill_len > 0;
    if (schedule.prefill_compressed) schedule.prefill = inner_->layer_budget(layer, shape);
    schedule.prefill_last = shape.prefill_len - 1;
    schedule.sink = scored_.sink_tokens();
    schedule.heavy_share = scored_.default_heavy_share();
    schedule.spec = options_.budget;
    schedule.policy_name = name();
    LayerStates states;
    states.lockstep = states.same_slots = scored_.shared_across_heads();
    auto shared = states.lockstep ? std::make_shared<SharedScores>(scored_, shape.n_kv_heads) : nullptr;
    const GroupReduce reduce = scored_.group_reduce();
    for (int h = 0; h < shape.n_kv_heads; ++h)
      states.heads.push_back(std::make_unique<DecodingHeadState>(scored_, schedule, layer, h, shape, reduce, shared));
    return states;
  }

 private:
  bool compresses_prefill() const { return options_.budget.is_set() || options_.kv_quant.memory > 0; }
};

}  // namespace

std::unique_ptr<Policy> make_decoding_compression(std::unique_ptr<Policy> inner, const PolicyOptions& options) {
  const ScoredPolicy& scored = wrapped_scored_policy(*inner, kDecodingPrefix);
  return std::make_unique<DecodingCompressionPolicy>(std::move(inner), scored, options);
}

}  // namespace kvevict
