// The H2O repository's request adaptor for multiple choice (h2o_hf: tasks/eval_harness.py,
// run_lm_eval_harness.py, evaluate_task_result.py): context and continuation are
// ftfy-fixed (NFKC); the model runs on the JOINT tokenisation of context+continuation, no
// BOS, never truncated, with ratio budgets sized on that joint length L; the scored
// positions come from the SEPARATE tokenisations inside its 1024-token window: with
// n_all = min(|ctx ids| + |cont ids|, 1024), every position i with
// n_all - |cont ids| - 2 < i < n_all - 1 scores joint token i+1, stopping at the end of
// the joint sequence. The request's log-likelihood is the mean over those positions
// (LoglikelihoodResult holds their sum and count; ScoreMode::Mean divides).
#pragma once
#include <string>

#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "policies/policy.h"
#include "tasks/task.h"

namespace kvevict {

constexpr int kH2OWindow = 1024;  // evaluate_task_result.py: seq = 1024

struct H2OScoredRequest {
  LoglikelihoodResult result;
  KvStats kv;
  int joint_length = 0;  // L: the sequence the model ran on and the budgets refer to
};

H2OScoredRequest score_h2o_request(const Model& model, const Policy& policy, Mode mode,
                                   const LoglikelihoodRequest& request);

}  // namespace kvevict
