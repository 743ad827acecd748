// The eviction policy interface. A policy decides, per layer and per KV head, which
// cached tokens stay. A realisable policy does it through one LayerState per KV head,
// which the policy driver (harness/runtime/policy_driver.h) takes through every query in
// both execution modes (decode: a real cache; sim: one teacher-forced pass masked by the
// current slots). A sim-only policy computes a layer's attention from its logits itself.
//
// Policy code is plain C++ over contiguous float buffers: no LibTorch here.
#pragma once
#include <cstdint>
#include <map>
#include <functional>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/common/kv_quant.h"
#include "policies/budget.h"
#include "policies/head_slots.h"
#include "policies/observed_scores.h"
#include "policies/params.h"

namespace kvevict {

struct PolicyOptions {
  BudgetSpec budget;
  PolicyParams params;  // each policy's own parameters, declared in its file (params.h)
  KvQuantSpec kv_quant;  // the cache's quantization, composed with any realisable policy
};

// GQA: how a KV head aggregates the attention of its query heads (scored and pattern policies).
extern const ParamSpec kGroupReduce;
// Attention-sink tokens a policy always keeps (streamingllm, lagkv).
inline const ParamSpec kSink =
    ParamSpec::integer("n_sink", 4, "streamingllm/lagkv/expected-attention/kvzip: attention-sink tokens always kept").at_least(0);

// What a policy may read of a token as it enters a KV head's cache (LayerState::append):
// its key's L2 norm always, and its key and value vectors (float32, head_dim each; the
// key after RoPE, as the cache stores it, before any KIVI quantization, as the norm is)
// only for a policy whose token_vectors() asks; otherwise they are null. Likewise the
// queries of the KV head's query group at the token's position ([group][head_dim]
// float32, after RoPE, as the model computed them), only for TokenVectors::
// KeysValuesAndQueries.
struct NewToken {
  float key_norm = 0;
  const float* key = nullptr;
  const float* value = nullptr;
  const float* queries = nullptr;
};

// Which vectors of each new token a policy reads (RealisablePolicy::token_vectors): the
// harness copies them to the host for such a policy alone. Ordered: each kind reads
// what the one before it reads.
enum class TokenVectors { None, Keys, KeysAndValues, KeysValuesAndQueries };

// What the policy is applied to.
struct SequenceShape {
  int length = 0;       // tokens the ratio budget refers to (request or prompt length)
  int prefill_len = 0;  // tokens processed with full attention before eviction starts
  // Question-agnostic generation: the question_len tokens after the prefill (the question
  // and answer prefix) enter uncompressed after the prefill's compression (Budget).
  int question_len = 0;
  int n_layers = 1;
  int n_q_heads = 1;
  int n_kv_heads = 1;
  int head_dim = 0;     // what a byte budget (--kv-memory) counts per token; 0: unknown
  // The model's RoPE inverse frequencies (after its rope_scaling), one per rotated pair
  // of a head's dims, rotate-half layout: dim i pairs with dim i + rotary_dim / 2 for
  // i < rotary_dim / 2 = the size; the dims from rotary_dim on do not rotate. Empty: the
  // model has no RoPE (OPT's learned positions), or the shape is not a model's.
  std::vector<double> rope_inv_freq;
  // What the policy's pre-pass observed (Policy::prepass; harness/runtime/prepass.h), made
  // by the runtime before the sequence runs; null for a policy without one.
  std::shared_ptr<const ObservedScores> observed;
  int group() const { return n_q_heads / n_kv_heads; }
};

// One KV head's cache bookkeeping in one layer: the slots it holds, oldest first. Its one
// caller is the policy driver (harness/runtime/policy_driver.h), which for every query, in
// position order, calls append, then visible, then observe, then (after the prefill)
// compress; sim mode, the decode cache and analyze all run through it, so a realisable
// policy cannot tell them apart.
class LayerStateCopies;

// What a compression rewrote in the slots a KV head kept, instead of only choosing them:
// ThinK's pruned key channels, CaM's values merged into kept neighbours. Slot indices
// count the head's slots after the compression (positions() order). The caller carries
// it out on what it holds of those slots (sim mode's teacher-forced keys and values, the
// decode cache's rows) before the next query attends.
struct SlotRewrites {
  // The keys of these slots have the channels zeroed_channels (ascending) set to 0.
  std::vector<int> key_slots;
  std::vector<int> zeroed_channels;
  // value_deltas[i * head_dim ...] (head_dim floats) is added to the value of slot
  // value_slots[i]; a slot may be listed more than once (the additions sum in order).
  std::vector<int> value_slots;
  std::vector<float> value_deltas;
  bool empty() const { return key_slots.empty() && value_slots.empty(); }
  void clear() {
    key_slots.clear();
    zeroed_channels.clear();
    value_slots.clear();
    value_deltas.clear();
  }
};

class LayerState {
 public:
  virtual ~LayerState() = default;
  // A copy that goes on from this state on its own: a fork of the cache, when the choices
  // of a multiple-choice document continue one context (harness/runtime/scorer.h). Objects
  // the layer's heads share are copied once per layer through `copies`. Null: this state
  // cannot be copied, and the harness never forks it.
  virtual std::unique_ptr<LayerState> clone(LayerStateCopies& copies) const { return nullptr; }
  // Token `position` enters as the last slot.
  virtual void append(int position, const NewToken& token) = 0;
  // DMC (docs/DMC.md): token `position` folds into the newest slot, which is the previous
  // token's; the slot now stands for `position` (its position for recency) and its key has
  // changed (token is the new key's). What the policy gathered about the slot stays. Only
  // called on a model that merges.
  virtual void merge(int position, const NewToken& token) = 0;
  // Static sparse patterns keep slots cached that the query at `query_position` must not
  // attend: they fill visible (one 0/1 per slot) and return true. False: the query may
  // attend every slot (the model's sliding window still applies; the driver adds it).
  virtual bool visible(int query_position, std::vector<char>* visible) const { return false; }
  // probs: [group][size()], the attention of this KV head's query heads over its slots.
  virtual void observe(const float* probs) = 0;
  // How many of its latest observations a compression reads: the driver may then replace
  // an observe() that comes more than that many queries before the next compression by
  // skip_observation(). 0: every observation counts, and skip_observation() never comes.
  virtual int observation_window() const { return 0; }
  // A query's observe() that no compression will read: the state counts the query and
  // records nothing.
  virtual void skip_observation() {}
  // Evicts down to the budget. False when nothing was evicted; otherwise keep (if not
  // null) gets the kept slot indices, ascending.
  virtual bool compress(std::vector<int>* keep) = 0;
  // Right after compress (whether or not it evicted): what it rewrote in the kept slots
  // (SlotRewrites), moved into *out, which arrives empty. False: nothing. Only the states
  // of a policy whose rewrites_slots() is true rewrite.
  virtual bool take_rewrites(SlotRewrites* out) { return false; }
  virtual const std::vector<int>& positions() const = 0;
  int size() const { return static_cast<int>(positions().size()); }
};

// While one layer's heads are cloned: the copy of each object they share (SharedScores,
// Ada-KV's layer decision), made at its first request, so the copies share it as the
// originals did. A copy re-attaches its own head to it.
class LayerStateCopies {
 public:
  template <typename T>
  std::shared_ptr<T> copy_of(const std::shared_ptr<T>& original) {
    if (!original) return nullptr;
    auto& copy = copies_[original.get()];
    if (!copy) copy = std::make_shared<T>(*original);
    return std::static_pointer_cast<T>(copy);
  }

 private:
  std::map<const void*, std::shared_ptr<void>> copies_;
};

// A layer's states, one per KV head.
struct LayerStates {
  std::vector<std::unique_ptr<LayerState>> heads;
  // The heads share one decision made for the whole layer (TOVA): the driver takes every
  // head through each call of a query before the next call (all append, all observe, all
  // compress). Otherwise no head reads another's state, and the driver may run each head
  // on its own thread through a whole block of queries.
  bool lockstep = false;
  // The heads hold the same slots, slot for slot (a decision shared through SharedScores),
  // so they cannot follow DMC's merges, which each head makes on its own.
  bool same_slots = false;
};

class RealisablePolicy;
class SimOnlyPolicy;

// What every policy has: a name, its parameters, its budget. A policy is either
// realisable (a LayerState that runs on a real cache and in sim mode) or sim-only
// (a whole layer's masked attention from its logits); the two subclasses below.
class Policy {
 public:
  explicit Policy(PolicyOptions options) : options_(std::move(options)) {
    check_budget_spec(options_.budget);
    check_kv_quant_spec(options_.kv_quant);
  }
  virtual ~Policy() = default;
  virtual std::string name() const = 0;
  // The parameters this policy reads (params.h); the CLI and sweeps offer their union.
  virtual std::vector<const ParamSpec*> parameters() const { return {}; }
  // Exactly one of these is not null.
  virtual const RealisablePolicy* as_realisable() const { return nullptr; }
  virtual const SimOnlyPolicy* as_sim_only() const { return nullptr; }
  // False for policies that need information a real cache does not hold.
  bool realisable() const { return as_realisable() != nullptr; }
  // True for the full cache: the harness may skip all bookkeeping, and it is the
  // reference the other policies are compared with.
  virtual bool keeps_everything() const { return false; }
  // False when the budget has no heavy-hitter/recent split, so a heavy share means
  // nothing (sweeps then run one cell per budget, and report no heavy/recent ratios).
  virtual bool splits_budget() const { return !keeps_everything(); }
  virtual double default_heavy_share() const { return 0.5; }
  virtual int sink_tokens() const { return 0; }
  // The pre-pass the runtime runs over a sequence's context before the sequence itself,
  // its table handed over in SequenceShape::observed (observed_scores.h).
  virtual Prepass prepass() const { return Prepass::None; }

  // The budget of one layer for a sequence (PyramidKV overrides it): split_budget of
  // policies/budget.h with this policy's sinks and default heavy share.
  virtual Budget layer_budget(int layer, const SequenceShape& shape) const;
  // Throws kvevict::Error when the budget does not fit the sequence (check_budget_fits).
  virtual void validate(const SequenceShape& shape) const;
  // Whether the states made for shape `a` decide as those made for `b` over every token the
  // two sequences share, so that a context run under `a` may continue as `b` (shared-context
  // reuse, harness/runtime/scorer.h). The default: the shapes differ at most in their
  // length, and the budget does not read the length (no ratio, no --kv-memory). A policy
  // whose states read the length in another way overrides it.
  virtual bool states_agree(const SequenceShape& a, const SequenceShape& b) const;
  // Throws when a ratio budget keeps no token even on a request of `max_positions`
  // tokens (the model's whole context), so it can never keep one.
  void check_keeps_a_token(int64_t max_positions) const;
  // Throws kvevict::Error naming the first option this policy would ignore: a parameter it
  // does not declare (named by `param_name`), a heavy share on a budget with no
  // heavy/recent split, or any budget for the full cache.
  void check_options_taken(const std::function<std::string(const ParamSpec&)>& param_name) const;
  // The heavy-hitter and recent ratios of the budget (policies/budget.h).
  std::pair<double, double> heavy_recent_ratios() const {
    return kvevict::heavy_recent_ratios(options_.budget, default_heavy_share());
  }

  const PolicyOptions& options() const { return options_; }

 protected:
  // The budget as asked, or, with --kv-memory, the token budget whose cache at the chosen
  // bits fits that fraction of the fp16 cache of shape.length tokens (kv_quant.h's bound,
  // counted with the current token).
  BudgetSpec budget_for(const SequenceShape& shape) const;
  // The total budget in tokens before any split.
  int total_budget(const SequenceShape& shape) const {
    return total_budget_tokens(budget_for(shape), shape.length, name());
  }
  // The paper's split for the H2O simulations (policies/budget.h).
  Budget paper_split_budget(const SequenceShape& shape) const {
    return kvevict::paper_split_budget(budget_for(shape), shape.length, default_heavy_share(), name());
  }
  PolicyOptions options_;
};

// Runs on a real cache (decode mode) and, the same way, in sim mode.
class RealisablePolicy : public Policy {
 public:
  using Policy::Policy;
  const RealisablePolicy* as_realisable() const final { return this; }
  // One layer's states (one per KV head), driving both modes.
  virtual LayerStates make_layer_states(int layer, const SequenceShape& shape) const = 0;
  // The vectors its states read of each new token (NewToken); the shape's head_dim is
  // then that of the model.
  virtual TokenVectors token_vectors() const { return TokenVectors::None; }
  // Block prefill (block+POLICY): the prefill enters in blocks of this many tokens and the
  // driver lets the states compress after each block's last token, not only after the
  // prefill's; the decode cache then feeds the prefill in those blocks. 0: the prefill is
  // one block, compressed at its end.
  virtual int prefill_block() const { return 0; }
  // Its states rewrite kept slots (LayerState::take_rewrites): a backend carries the
  // rewrites out or refuses the policy, never drops them.
  virtual bool rewrites_slots() const { return false; }
};

// A causal sim-only policy's pass over one layer, fed the logits a block of query rows at
// a time as the harness computes them, so no [n_q][T][T] logits buffer is made and each
// block is read while it is still in cache.
class SimLayerRows {
 public:
  virtual ~SimLayerRows() = default;
  // Query rows r0 .. r0+rows-1 of every head, blocks in order from r0 = 0: logits
  // [n_q][rows][n] with n = r0 + rows keys (entries above the diagonal ignored) into
  // those rows of probs [n_q][T][T] (which arrives zeroed).
  virtual void rows(int r0, int rows, int n, const float* logits, float* probs) = 0;
};

// Needs what a real cache does not hold (the unmasked softmax, future queries): sim mode only.
class SimOnlyPolicy : public Policy {
 public:
  using Policy::Policy;
  const SimOnlyPolicy* as_sim_only() const final { return this; }
  // What it needs that a real cache does not hold, for the error a decode run gets.
  virtual std::string needs() const = 0;
  // The attention probabilities [n_q][T][T] of one layer from its unmasked causal
  // logits [n_q][T][T] (entries above the diagonal are ignored; probs arrives zeroed).
  // Budgets refer to shape.length.
  virtual void simulate_layer(int layer, const SequenceShape& shape, int T, const float* logits,
                              float* probs) const = 0;
  // Causal policies (no row's mask depends on a later row) may also run block by block:
  // the same probabilities as simulate_layer. Null: the harness calls simulate_layer.
  virtual std::unique_ptr<SimLayerRows> layer_rows(int layer, const SequenceShape& shape, int T) const {
    return nullptr;
  }
};

// Softmax over keys 0..i of one logits row, only the kept ones when `keep` is given
// (float32, as the paper's simulation computes it). Used by the sim-only policies.
void row_softmax(const float* row, int i, const char* keep, float* out);

// ---------------------------------------------------------------------------------
// Most policies are a score function over ScoredPolicy, which owns the slots, the
// sink and recent windows and the top-k selection (the kvpress "ScorerPress" idea).

// A scored policy's state and score as data: what a path that runs the policy with tensor
// ops on the model's device (harness/runtime/device_policy.h) computes in place of
// on_append, on_observe and score, each kind restating those functions exactly. The host
// functions stay the reference; tests hold the two paths' kept sets equal.
enum class ScoreRecipe {
  None,               // host only
  Position,           // score = the slot's position: the newest stay (local, streamingllm)
  AttentionSum,       // value += the group-reduced attention of each query; score = value (h2o)
  NegativeKeyNorm,    // value = the key's L2 norm rounded to 12 significant bits; score = -value (knorm)
  LatestAttention,    // value = the group-reduced attention of the latest query; score = value (tova)
  PositionDraw,       // value = position_value(layer, KV head, position), on the host; score = value (random)
};

class ScoredPolicy : public RealisablePolicy {
 public:
  using RealisablePolicy::RealisablePolicy;
  std::vector<const ParamSpec*> parameters() const override { return {&kGroupReduce}; }
  LayerStates make_layer_states(int layer, const SequenceShape& shape) const override;

  // Floats of state per slot; head_dim is the model's (a policy that keeps each key, as
  // token_vectors() asks, keeps head_dim floats of it).
  virtual int channels(int head_dim) const { return 1; }
  // Initialises a KV head's own state (head.head_state, not per slot) for a sequence of
  // `shape`, when its states are made.
  virtual void on_create(HeadSlots& head, const SequenceShape& shape) const {}
  // Initialises a newly appended slot's channels (already zeroed).
  virtual void on_append(HeadSlots& head, float* slot_values, int position, const NewToken& token) const {}
  // attention: the newest query's attention over the head's slots, aggregated over
  // the head's query group. Called before head.steps is incremented.
  virtual void on_observe(HeadSlots& head, const float* attention) const {}
  // Higher keeps. out has one float per slot.
  virtual void score(const HeadSlots& head, float* out) const = 0;
  // How many of the latest on_observe calls score() reads (LayerState::observation_window);
  // 0: all of them. The calls before those may not come (head.steps still counts them).
  virtual int observation_window() const { return 0; }
  // True when one decision is shared by all heads of a layer (scores are averaged).
  virtual bool shared_across_heads() const { return false; }
  // The functions above as data, where one recipe states them (ScoreRecipe).
  virtual ScoreRecipe score_recipe() const { return ScoreRecipe::None; }
  // ScoreRecipe::PositionDraw: a slot's value, a function of where it is alone.
  virtual float position_value(int layer, int kv_head, int position) const { return 0; }
  // How a KV head's query group's attention becomes one row (the group_reduce parameter).
  GroupReduce group_reduce() const;
};

}  // namespace kvevict
