// KVzip (Kim et al. 2025, "KVzip: Query-Agnostic KV Cache Compression with Context
// Reconstruction", arXiv 2505.23416; kvpress's KVzipPress): query-agnostic. A context KV
// matters by how much the model needs it to repeat the context. After the prefill of the
// context c_1 .. c_C, the model is fed, teacher forced, the repeat prompt
// ("\n\nRepeat the previous context exactly." and the suffix "\n", KVzip's wording for a
// model without a chat template) followed by the context again; for the KV of context
// position j in KV head h of layer l,
//
//   score(l, h, j) = max over reconstruction queries i > C and query heads g of h's group
//                    of softmax_j(q_{l,g,i} . k_{l,h,j} / sqrt(d)),
//
// the attention of row i over every key before it (the context and the reconstruction so
// far), as the model computes it with full attention. The runtime runs that pre-pass
// (harness/runtime/prepass.h: [context, repeat prompt, context], one pass, the
// reconstruction rows then dropped) and hands the table over in SequenceShape::observed;
// this policy only reads it. kvpress reconstructs in chunks of 2048 context tokens, each
// chunk's rows attending the sinks, that chunk and themselves; with a context of at most
// one chunk (and no chat-template prefix) that is this pass's attention exactly; longer
// contexts are reconstructed here in one pass over the whole context.
//
// Each slot's score, at every compression:
//   - positions < n_sink score +inf (kvpress sets the sinks' score to the maximum, 1);
//   - context positions score their table entry;
//   - positions after the context (a question that enters uncompressed, generated tokens)
//     were not reconstructed: they score 2 + (position - C), above every attention (at
//     most 1), the newer higher, so they act as the recent window and displace the context's
//     lowest-scored KVs as the budget holds.
// Each KV head keeps its own top (ada+kvzip ranks the heads of a layer together; kvpress's
// default ranks every layer's heads together, which a per-layer budget does not express).
// No recent window, as kvpress.
#include <limits>
#include <string>

#include "harness/common/errors.h"
#include "policies/policy.h"

namespace kvevict {
namespace {
class KVzipPolicy : public ScoredPolicy {
 public:
  using ScoredPolicy::ScoredPolicy;
  std::string name() const override { return "kvzip"; }
  std::vector<const ParamSpec*> parameters() const override { return {&kSink}; }
  double default_heavy_share() const override { return 1.0; }  // no recent window, as kvpress
  int sink_tokens() const override { return sinks_; }
  Prepass prepass() const override { return Prepass::ContextReconstruction; }

  void validate(const SequenceShape& shape) const override {
    check_table(shape);
    ScoredPolicy::validate(shape);
  }

  // The head's row of the table (its context positions' scores), so a slot's score is
  // set as it enters.
  void on_create(HeadSlots& head, const SequenceShape& shape) const override {
    check_table(shape);
    const ObservedScores& table = *shape.observed;
    head.head_state.resize(table.positions);
    for (int j = 0; j < table.positions; ++j) head.head_state[j] = table.at(head.layer, head.kv_head, j);
  }

  void on_append(HeadSlots& head, float* slot, int position, const NewToken&) const override {
    const int context = static_cast<int>(head.head_state.size());
    if (position < sinks_)
      slot[0] = std::numeric_limits<float>::infinity();
    else if (position < context)
      slot[0] = static_cast<float>(head.head_state[position]);
    else
      slot[0] = 2.0f + static_cast<float>(position - context);
  }

  void score(const HeadSlots& head, float* out) const override {
    for (int s = 0; s < head.size(); ++s) out[s] = head.values[s];
  }

 private:
  void check_table(const SequenceShape& shape) const {
    if (!shape.observed)
      throw Error("policy kvzip scores the context by a reconstruction pre-pass, which this command does not run "
                  "(eval, sweep, serve, generate and perplexity do)");
    const ObservedScores& table = *shape.observed;
    if (table.n_layers != shape.n_layers || table.n_kv_heads != shape.n_kv_heads ||
        table.values.size() != static_cast<size_t>(table.n_layers) * table.n_kv_heads * table.positions)
      throw Error("internal: policy kvzip got a pre-pass table of " + std::to_string(table.n_layers) + " layers x " +
                  std::to_string(table.n_kv_heads) + " KV heads for a model of " + std::to_string(shape.n_layers) +
                  " x " + std::to_string(shape.n_kv_heads));
  }

  const int sinks_ = static_cast<int>(options_.params.integer(kSink));
};
}  // namespace

std::unique_ptr<Policy> make_kvzip_policy(const PolicyOptions& o) { return std::make_unique<KVzipPolicy>(o); }
}  // namespace kvevict
