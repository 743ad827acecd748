#include "harness/eval/result_rows.h"

#include "harness/common/version.h"
#include "harness/eval/h2o_adaptor.h"
#include "policies/registry.h"

namespace kvevict {
std::vector<ResultRow> eval_rows(const std::string& model, const EvalConfig& config, const EvalResult& result) {
  std::vector<ResultRow> rows;
  for (const auto& m : result.metrics) {
    ResultRow row = identity_row(model, config);
    row.metric = m.name;
    row.turn = m.turn;
    row.value = m.value;
    if (m.name != "ppl") row.stderr_ = m.stderr_;  // exp(mean NLL) has no standard error here
    row.n = m.n;
    if (result.agreement_with_full) row.agreement_with_full = *result.agreement_with_full;
    if (result.mean_abs_ll_change) row.mean_abs_ll_change = *result.mean_abs_ll_change;
    row.kv_tokens_kept = result.kv_tokens_kept;
    row.kv_bytes_peak = result.kv_bytes_peak;
    row.kv_bytes_full = result.kv_bytes_full;
    row.dmc_merge_rate = result.dmc_merge_rate;
    row.prepass_token_ratio = result.prepass_token_ratio;
    row.seconds = result.seconds;
    row.haystack = result.haystack;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace kvevict
