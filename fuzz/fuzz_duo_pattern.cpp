// DuoAttention's pattern file (policies/duo_attention.cpp): TSV, CSV or JSON head scores,
// read when `duo-attention` is made with `pattern_file`, as `kvevict eval --pattern-file`
// and a sweep's policy_options do (a leading '[' picks the JSON reader, else rows of
// tab- or comma-separated numbers).
#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "policies/registry.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  kvevict::PolicyOptions options;
  options.budget.ratio = 0.5;
  options.params.set("pattern_file", kvevict::fuzz::scratch_file("heads.tsv", data, size));
  try {
    auto policy = kvevict::make_policy("duo-attention", options);
    kvevict::SequenceShape shape;
    shape.length = 64;
    shape.n_layers = 2;
    shape.n_q_heads = shape.n_kv_heads = 2;
    policy->validate(shape);
    policy->as_realisable()->make_layer_states(0, shape);
  } catch (const kvevict::Error&) {
  }
  return 0;
}
