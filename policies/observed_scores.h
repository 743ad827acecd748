// What a pre-pass of the model observed, as plain data a policy reads: the runtime runs
// the model once more over a prompt of the policy's kind with full attention, reduces the
// attention it sees to one number per (layer, KV head, position) and hands the table to
// the policy's states through SequenceShape::observed (harness/runtime/prepass.h). Both
// execution modes get the same table, so sim mode and decode mode decide alike.
#pragma once
#include <cstddef>
#include <cstdint>
#include <vector>

namespace kvevict {

// Which pre-pass a policy needs before a sequence runs (Policy::prepass).
enum class Prepass {
  None,
  // KVzip: the model repeats the context; a context KV's score is the most attention any
  // reconstruction query of its KV head's group pays it (policies/kvzip.cpp).
  ContextReconstruction,
  // DuoAttention's calibration: a KV head's score is the attention its query group pays a
  // passkey's needle from the question's rows (policies/duo_attention.cpp); one table per
  // model, positions 1.
  PasskeyRetrieval,
};

struct ObservedScores {
  Prepass kind = Prepass::None;
  int n_layers = 0;
  int n_kv_heads = 0;
  int positions = 0;          // the table covers positions 0 .. positions-1
  std::vector<float> values;  // [layer][KV head][position]
  // The pre-pass's cost, for reports: tokens it ran through the model, and its wall time
  // (a sequence's own pass; a calibration runs once per model and counts in none).
  int64_t tokens = 0;
  double seconds = 0;

  float at(int layer, int kv_head, int position) const {
    return values[(static_cast<size_t>(layer) * n_kv_heads + kv_head) * positions + position];
  }
};

}  // namespace kvevict
