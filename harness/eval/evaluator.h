// The task runner: turns a task's requests into model calls under a policy, and the
// answers into metrics. Multiple choice is scored by log-likelihood (lm-eval 0.3
// conventions), generation tasks (XSum, CNN/DM) by generation + ROUGE, the long-context
// tasks by generation and their own scorers, perplexity by mean NLL.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/config/eval_config.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "policies/registry.h"
#include "tasks/metrics.h"
#include "tasks/rouge.h"
#include "tasks/task.h"

namespace kvevict {

// EvalConfig (what one evaluation is) lives in harness/config/eval_config.h.

// Per-document outcome, kept for predictions files and agreement.
struct DocOutcome {
  std::string id;
  int gold = -1;
  ChoicePrediction prediction;          // multiple choice
  std::vector<double> choice_scores;    // multiple choice, under the score mode
  std::string generated, reference;     // generation
  RougeScores rouge{0, 0, 0};           // generation, F in [0, 1]
  // Long-context tasks: the document as generated and the task's own score of the answer.
  std::optional<GenerationDoc> long_context;
  double score = 0;
  bool task_scored = false;  // `score` is the task's own (Task::score_generations), not ROUGE
  // Shared-context evaluation: each turn's answer and its string_match_all score (score
  // is their mean).
  std::vector<std::string> turn_answers;
  std::vector<double> turn_scores;
};

struct EvalResult {
  std::vector<MetricValue> metrics;
  std::optional<double> agreement_with_full;
  std::optional<double> mean_abs_ll_change;
  double kv_tokens_kept = 0;  // mean over requests of the mean over layers, at the end
  int64_t kv_bytes_peak = 0;  // largest over requests
  int64_t kv_bytes_full = 0;  // that request's fp16 cache of the same tokens
  // A DMC model: the share of merge decisions, mean over requests, layers and KV heads.
  std::optional<double> dmc_merge_rate;
  // A policy's pre-pass (KVzip's reconstruction): the tokens it ran per context token it
  // scored, over all requests (about 2), and its wall time summed over the requests (which
  // may run on several threads at once, so the sum can pass `seconds`).
  std::optional<double> prepass_token_ratio;
  std::optional<double> prepass_seconds;
  double seconds = 0;
  int n = 0;
  std::string haystack;  // long-context tasks: what fills the context
  std::vector<DocOutcome> docs;
};

// The batch size an evaluation uses when its config names none (batch_size 0): from the
// model's size and its device.
int default_batch_size(const Model& model);

// Called after each document: (done, total).
using Progress = std::function<void(int, int)>;

// What an evaluation needs of its model, checked before any of the model's work (evaluate
// runs it; a sweep runs it for every cell before the first): the policy's
// (check_policy_for_model), and a long-context length within the model's context (items
// are fitted to it and never cut). `length_key` names the length where the user wrote it.
void check_eval_for_model(const Model& model, const EvalConfig& config, const std::string& length_key = "--length");

// Runs one evaluation. `full_cache` may hold an earlier full-cache run of the same
// task settings (to skip recomputing it for agreement); it is filled when empty.
EvalResult evaluate(const Model& model, const EvalConfig& config, const Progress& progress = {},
                    std::optional<EvalResult>* full_cache = nullptr);

// Writes one JSON object per document.
void write_predictions(const EvalResult& result, const EvalConfig& config, const std::string& path);

}  // namespace kvevict
