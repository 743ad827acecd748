// What one evaluation is, as data: the task, the policy and its options, the execution
// mode, the protocol, the score and pipeline, and the identity columns it gets in
// results.csv. No LibTorch, so sweep configs can be read and expanded (and fuzzed)
// without a model.
#pragma once
#include <cstdint>
#include <optional>
#include <string>

#include "notebooks-export/results_csv.h"
#include "policies/registry.h"
#include "tasks/metrics.h"
#include "tasks/task.h"

namespace kvevict {

// Sim: the full forward pass with attention masked by the policy; decode: a real cache.
enum class Mode { Sim, Decode };
Mode parse_mode(const std::string& name);
std::string mode_name(Mode mode);

enum class Protocol { Stream, PrefillCompress };
Protocol parse_protocol(const std::string& name);
std::string protocol_name(Protocol protocol);
ScoreMode parse_score_mode(const std::string& name);
std::string score_mode_name(ScoreMode mode);

// Long-context tasks under prefill-compress: the question is compressed with the context
// (aware) or fed uncompressed after the context was compressed (agnostic, kvpress's default).
enum class QuestionMode { Aware, Agnostic };
QuestionMode parse_question_mode(const std::string& name);
std::string question_mode_name(QuestionMode mode);
// SCBench's shared-context evaluation (arXiv 2412.10319) of a long-context task's several
// questions of one context (TaskOptions::turns): none (the task's one question),
// multi-turn (one cache: each question and answer enters the cache the earlier turns
// left) or multi-request (each question against its own fork of the compressed context).
enum class SharedContext { None, MultiTurn, MultiRequest };
SharedContext parse_shared_context(const std::string& name);
std::string shared_context_name(SharedContext protocol);  // "" for None
// "lm-eval" or "h2o" (the --pipeline flag and the results column).
Pipeline parse_pipeline(const std::string& name);
std::string pipeline_name(Pipeline pipeline);

struct EvalConfig {
  std::string task;
  TaskOptions task_options;  // data_dir, shots, seed, limit
  std::string policy = reference_policy_name();
  PolicyOptions policy_options;
  Mode mode = Mode::Sim;
  Protocol protocol = Protocol::Stream;
  QuestionMode question = QuestionMode::Aware;  // long-context tasks only
  ScoreMode score = ScoreMode::Sum;
  std::optional<bool> bos;   // default: no BOS for multiple choice (the paper), BOS for generation
  int max_length = 1024;     // left truncation, as lm-eval (capped at the model's context)
  // Generation tasks: tokens to generate per document (0: the task's own, XSum 64, CNN/DM
  // 128); long generations for decoding-time compression (decoding+POLICY).
  int max_new_tokens = 0;
  double temperature = 0;    // generation: 0 is greedy (a request file's own temperature wins)
  bool greedy = false;       // generation: greedy even where the prompt file names a temperature
  uint64_t sample_seed = 0;
  std::string text_file = "text/tinystories_sample.txt";  // perplexity task, relative to data_dir
  bool compare_with_full = true;  // also run the full cache for agreement numbers
  // Sequences run together (0: default_batch_size()). Not part of the identity: every
  // number is the same at any batch size.
  int batch_size = 0;
  // Multiple choice in decode mode: a document's choices share the calls of their common
  // context (SharedContextStream, harness/runtime/scorer.h). Not part of the identity:
  // every number is the same either way.
  bool context_reuse = true;
  // With task_options.turns > 0: how the turns share the context (generate_turns).
  SharedContext shared_context = SharedContext::None;
};

// A long-context item is fitted to its length and never cut (max_length does not apply
// to it), so a max_length given below the length would be ignored: refused, naming both.
void check_max_length_holds_length(int max_length, int length, const std::string& max_length_key,
                                   const std::string& length_key);

// The identity columns of a configuration (outcome columns empty).
ResultRow identity_row(const std::string& model, const EvalConfig& config);

}  // namespace kvevict
