#include "harness/eval/result_rows.h"

#include "harness/common/version.h"
#include "harness/eval/h2o_adaptor.h"
#include "policies/registry.h"

namespace kvevict {
// Policies whose budget has no heavy/recent split.
bool uses_heavy_share(const std::string& policy) {
  return policy != "full" && policy != "local" && policy != "streamingllm";
}

ResultRow identity_row(const std::string& model, const EvalConfig& c) {
  ResultRow row;
  row.model = model;
  row.task = c.task;
  row.policy = c.policy;
  const BudgetSpec& b = c.policy_options.budget;
  if (c.policy != "full") {
    if (b.ratio > 0) row.budget = b.ratio;
    if (b.tokens > 0) row.budget_tokens = b.tokens;
    if (b.heavy_share >= 0) row.heavy_share = b.heavy_share;
    if (b.ratio > 0) {
      double share = b.heavy_share >= 0 ? b.heavy_share : make_policy(c.policy, c.policy_options)->default_heavy_share();
      if (!uses_heavy_share(c.policy)) share = 0;
      row.heavy_ratio = b.ratio * share;
      row.recent_ratio = b.ratio * (1 - share);
    }
  }
  row.protocol = protocol_name(c.protocol);
  row.mode = mode_name(c.mode);
  row.score = score_mode_name(c.score);
  row.pipeline = pipeline_name(c.task_options.pipeline);
  row.shots = c.task_options.shots;
  row.seed = c.task_options.seed;
  if (c.task_options.limit >= 0) row.limit = c.task_options.limit;
  row.version = kvevict_version();
  return row;
}

std::vector<ResultRow> eval_rows(const std::string& model, const EvalConfig& config, const EvalResult& result) {
  std::vector<ResultRow> rows;
  for (const auto& m : result.metrics) {
    ResultRow row = identity_row(model, config);
    row.metric = m.name;
    row.value = m.value;
    if (m.name != "ppl") row.stderr_ = m.stderr_;  // exp(mean NLL) has no standard error here
    row.n = m.n;
    if (result.agreement_with_full) row.agreement_with_full = *result.agreement_with_full;
    if (result.mean_abs_ll_change) row.mean_abs_ll_change = *result.mean_abs_ll_change;
    row.kv_tokens_kept = result.kv_tokens_kept;
    row.kv_bytes_peak = result.kv_bytes_peak;
    row.seconds = result.seconds;
    rows.push_back(row);
  }
  return rows;
}

}  // namespace kvevict
