// The task runner: turns a task's requests into model calls under a policy, and the
// answers into metrics. Multiple choice is scored by log-likelihood (lm-eval 0.3
// conventions), generation tasks (XSum, CNN/DM) by generation + ROUGE, perplexity by
// mean NLL.
#pragma once
#include <functional>
#include <optional>
#include <string>
#include <vector>

#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "policies/policy.h"
#include "tasks/metrics.h"
#include "tasks/rouge.h"
#include "tasks/task.h"

namespace kvevict {

enum class Protocol { Stream, PrefillCompress };
Protocol parse_protocol(const std::string& name);
std::string protocol_name(Protocol protocol);
ScoreMode parse_score_mode(const std::string& name);
std::string score_mode_name(ScoreMode mode);

struct EvalConfig {
  std::string task;
  TaskOptions task_options;  // data_dir, shots, seed, limit
  std::string policy = "full";
  PolicyOptions policy_options;
  Mode mode = Mode::Sim;
  Protocol protocol = Protocol::Stream;
  ScoreMode score = ScoreMode::Sum;
  std::optional<bool> bos;   // default: no BOS for multiple choice (the paper), BOS for generation
  int max_length = 1024;     // left truncation, as lm-eval (capped at the model's context)
  double temperature = 0;    // generation: 0 is greedy (a request file's own temperature wins)
  bool greedy = false;       // generation: greedy even where the prompt file names a temperature
  uint64_t sample_seed = 0;
  std::string text_file = "text/tinystories_sample.txt";  // perplexity task, relative to data_dir
  bool compare_with_full = true;  // also run the full cache for agreement numbers
};

// Per-document outcome, kept for predictions files and agreement.
struct DocOutcome {
  std::string id;
  int gold = -1;
  ChoicePrediction prediction;          // multiple choice
  std::vector<double> choice_scores;    // multiple choice, under the score mode
  std::string generated, reference;     // generation
  RougeScores rouge{0, 0, 0};           // generation, F in [0, 1]
};

struct EvalResult {
  std::vector<MetricValue> metrics;
  std::optional<double> agreement_with_full;
  std::optional<double> mean_abs_ll_change;
  double kv_tokens_kept = 0;  // mean over requests of the mean over layers, at the end
  int64_t kv_bytes_peak = 0;  // largest over requests
  double seconds = 0;
  int n = 0;
  std::vector<DocOutcome> docs;
};

// Called after each document: (done, total).
using Progress = std::function<void(int, int)>;

// Runs one evaluation. `full_cache` may hold an earlier full-cache run of the same
// task settings (to skip recomputing it for agreement); it is filled when empty.
EvalResult evaluate(const Model& model, const EvalConfig& config, const Progress& progress = {},
                    std::optional<EvalResult>* full_cache = nullptr);

// Writes one JSON object per document.
void write_predictions(const EvalResult& result, const EvalConfig& config, const std::string& path);

}  // namespace kvevict
