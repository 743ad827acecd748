// The eviction policy interface. A policy decides, per layer and per KV head, which
// cached tokens stay. The same LayerState drives both execution modes:
//   decode: a real cache; the harness gathers K/V with the kept slot indices;
//   sim:    one teacher-forced pass; the harness masks each logits row with the
//           current slots.
// Both call append -> observe -> (compress) once per token, in position order, so a
// realisable policy cannot tell the modes apart.
//
// Policy code is plain C++ over contiguous float buffers: no LibTorch here.
#pragma once
#include <cstdint>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "policies/params.h"

namespace kvevict {

// How big the cache may be. Exactly one of ratio / tokens / (heavy_ratio, recent_ratio)
// is normally set; unset fields are negative.
struct BudgetSpec {
  double ratio = -1;         // fraction of the sequence length (the paper's convention)
  int tokens = -1;           // absolute token count
  double heavy_share = -1;   // share of the budget for heavy hitters (-1: policy default)
  double heavy_ratio = -1;   // the paper's own parameters, as fractions of the length
  double recent_ratio = -1;
  bool is_set() const { return ratio > 0 || tokens > 0 || heavy_ratio >= 0 || recent_ratio >= 0; }
};

struct PolicyOptions {
  BudgetSpec budget;
  PolicyParams params;  // each policy's own parameters, declared in its file (params.h)
};

// GQA: how a KV head aggregates the attention of its query heads (scored and pattern policies).
extern const ParamSpec kGroupReduce;

// What the policy is applied to.
struct SequenceShape {
  int length = 0;       // tokens the ratio budget refers to (request or prompt length)
  int prefill_len = 0;  // tokens processed with full attention before eviction starts
  int n_layers = 1;
  int n_q_heads = 1;
  int n_kv_heads = 1;
  int group() const { return n_q_heads / n_kv_heads; }
};

// A resolved per-layer budget, in tokens.
struct Budget {
  bool unlimited = false;
  int capacity = 0;  // tokens kept after each step (sinks + heavy + recent)
  int recent = 0;    // the most recent tokens, always kept
  int sink = 0;      // the first tokens, always kept
};

// One layer's cache bookkeeping for all its KV heads. Every head holds the same number
// of slots; slots are in insertion (position) order.
class LayerState {
 public:
  virtual ~LayerState() = default;
  // Token `position` enters every head's cache as the last slot.
  // key_norms: [n_kv_heads] L2 norms of its keys.
  virtual void append(int position, const float* key_norms) = 0;
  // The attention of the newest query over the current slots: [n_q_heads][size()],
  // query head h belongs to KV head h / group.
  virtual void observe(const float* probs) = 0;
  // Evicts down to the budget. Returns false when nothing was evicted; otherwise fills
  // keep (if not null) with the kept slot indices per KV head, ascending.
  virtual bool compress(std::vector<std::vector<int>>* keep) = 0;
  virtual int size() const = 0;
  virtual const std::vector<int>& positions(int kv_head) const = 0;
  // Static sparse patterns keep keys cached that a later query attends again but the
  // query at `query_position` must not see. They fill visible (one 0/1 per current slot
  // of kv_head) and return true; false (the default) means every slot is attended. A
  // query always attends its own key, whether or not it is a slot yet.
  virtual bool visible_slots(int kv_head, int query_position, std::vector<char>* visible) const {
    return false;
  }
  // True when no head ever reads another head's state: then a KV head can be driven on
  // its own (sim mode gives each thread its own heads for a whole block of queries,
  // with no synchronisation per query), by the three calls below. For that head they
  // do exactly what append, observe and compress do, in the same order; different
  // heads may run on different threads at once.
  virtual bool independent_heads() const { return false; }
  virtual void append_head(int kv_head, int position, float key_norm) {}
  // probs: [group][slots of kv_head], the attention of the KV head's query heads.
  virtual void observe_head(int kv_head, const float* probs) {}
  virtual void compress_head(int kv_head) {}
};

void check_policy_options(const PolicyOptions& options);  // policies/option_checks.h

class RealisablePolicy;
class SimOnlyPolicy;

// What every policy has: a name, its parameters, its budget. A policy is either
// realisable (a LayerState that runs on a real cache and in sim mode) or sim-only
// (a whole layer's masked attention from its logits); the two subclasses below.
class Policy {
 public:
  explicit Policy(PolicyOptions options) : options_(std::move(options)) { check_policy_options(options_); }
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

  // The budget of one layer for a sequence (PyramidKV overrides it).
  virtual Budget layer_budget(int layer, const SequenceShape& shape) const;
  // Throws kvevict::Error when the budget does not fit the sequence.
  virtual void validate(const SequenceShape& shape) const;
  // The heavy-hitter and recent ratios of the budget, however it was asked for
  // (--heavy-ratio/--recent-ratio, or --budget B with heavy share S as S*B and (1-S)*B),
  // each snapped to the decimal it stands for, so 0.5*0.2 is the paper's 0.1.
  // Negative when the budget was given in tokens.
  std::pair<double, double> heavy_recent_ratios() const;

  const PolicyOptions& options() const { return options_; }

 protected:
  // The total budget in tokens before any split.
  int total_budget(const SequenceShape& shape) const;
  // The paper's split for the H2O simulations: heavy = int(h*L) and recent = int(r*L)
  // separately (L = shape.length), for every way of asking; a token budget splits as
  // int(share*B) heavy and the rest recent.
  Budget paper_split_budget(const SequenceShape& shape) const;
  PolicyOptions options_;
};

// Runs on a real cache (decode mode) and, the same way, in sim mode.
class RealisablePolicy : public Policy {
 public:
  using Policy::Policy;
  const RealisablePolicy* as_realisable() const final { return this; }
  // The per-layer state driving both modes.
  virtual std::unique_ptr<LayerState> make_layer_state(int layer, const SequenceShape& shape) const = 0;
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
struct HeadSlots {
  std::vector<int> positions;
  std::vector<float> values;  // channels() floats per slot, policy-defined
  int layer = 0;
  int kv_head = 0;
  int steps = 0;  // queries observed so far
};

class ScoredPolicy : public RealisablePolicy {
 public:
  using RealisablePolicy::RealisablePolicy;
  std::vector<const ParamSpec*> parameters() const override { return {&kGroupReduce}; }
  std::unique_ptr<LayerState> make_layer_state(int layer,
                                               const SequenceShape& shape) const override;

  // Floats of state per slot.
  virtual int channels() const { return 1; }
  // Initialises a newly appended slot's channels (already zeroed).
  virtual void on_append(HeadSlots& head, float* slot_values, int position, float key_norm) const {}
  // attention: the newest query's attention over the head's slots, aggregated over
  // the head's query group. Called before head.steps is incremented.
  virtual void on_observe(HeadSlots& head, const float* attention) const {}
  // Higher keeps. out has one float per slot.
  virtual void score(const HeadSlots& head, float* out) const = 0;
  // True when one decision is shared by all heads of a layer (scores are averaged).
  virtual bool shared_across_heads() const { return false; }
};

}  // namespace kvevict
