// A task turns a real data file into scoring requests and turns the model's answers
// back into metrics. Tasks know nothing about models: the harness scores requests.
#pragma once
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <vector>

namespace kvevict {

class Tokenizer;

// Which request pipeline builds and scores the requests: lm-evaluation-harness 0.3's own
// (and HELM's for generation), or the H2O repository's adaptor (ftfy, joint
// tokenisation, mean score; its prompt files as they are).
enum class Pipeline { LmEval, H2O };

struct TaskOptions {
  Pipeline pipeline = Pipeline::LmEval;
  std::string data_dir;  // the shared data folder (already resolved)
  int shots = 0;         // few-shot examples per request
  uint64_t seed = 42;    // few-shot sampling seed (lm-eval 0.3 uses 42); long-context items' seed
  int limit = -1;        // evaluate only the first `limit` documents in evaluation order (-1: all)
  // lm-eval 0.3 shuffles the evaluation documents with the seeded generator before
  // `limit` and before drawing few-shot examples; false keeps file order.
  bool lm_eval_shuffle = true;
  // XSum: false uses the articles exactly as H2O's xsum_0shot.jsonl has them (not
  // truncated); true applies HELM's cleaning (newlines to spaces, whitespace runs
  // collapsed, first 512 words) to articles and summaries.
  bool xsum_helm_truncate = false;
  // Long-context tasks (ruler_*, niah): the length in tokens that each prompt plus its
  // tokens to generate fits (prompt tokens counted without special tokens, as RULER
  // does), and niah's needle depth in [0, 1] (the other tasks draw their depths).
  int length = 0;
  std::optional<double> depth;
  // Shared-context evaluation (SCBench): the questions asked of each context, from
  // GenerationDoc::turns; every item is fitted so that its context, these questions and
  // their answers fit `length`. 0: the task's one question.
  int turns = 0;
};

// One log-likelihood request: score `continuation` given `context`
// (lm-eval: the two strings are tokenised separately and concatenated).
struct LoglikelihoodRequest {
  std::string context;
  std::string continuation;
};

// A multiple-choice document: one request per choice.
struct MultipleChoiceDoc {
  std::string id;
  std::vector<LoglikelihoodRequest> requests;
  // Text whose character length normalises acc_norm (lm-eval: the choice string).
  std::vector<std::string> choice_texts;
  int gold = 0;
};

// One of several questions asked of one context (SCBench's shared-context setting): the
// text that follows the context (question and answer prefix) and what its answer should
// contain.
struct GenerationTurn {
  std::string question;
  std::vector<std::string> references;
  int max_new_tokens = 0;  // its answer's most tokens
};

// A generation document (XSum): prompt in, text out, scored against `reference`.
struct GenerationDoc {
  std::string id;
  std::string prompt;
  std::string reference;
  std::vector<std::string> stop;  // generation ends before any of these
  int max_new_tokens = 64;
  // The request file's sampling temperature (H2O-pipeline prompt files carry one);
  // unset: the run's EvalConfig::temperature.
  std::optional<double> temperature;

  // Long-context tasks (ruler_*, niah) fill these; `reference` then joins `references`.
  std::vector<std::string> references;  // every string the answer should contain
  // prompt[0, question_offset) is the context, the rest the question and the answer
  // prefix: the query-agnostic protocol compresses the context before the question is
  // seen. Unset: the task has no such split.
  std::optional<size_t> question_offset;
  int length = 0;                // the requested length in tokens
  int prompt_tokens = 0;         // tokens of `prompt` under the tokenizer it was fitted with
  std::optional<double> depth;   // in [0, 1], where the answer sits in one needle
  std::string haystack;          // what fills the context: "noise", "needle", "xsum", ...
  // The long-context tasks whose context holds several keys (ruler_niah_*): one question
  // per key, the asked keys first, each to follow prompt[0, question_offset).
  std::vector<GenerationTurn> turns;
};

// The model's answer to one log-likelihood request.
struct LoglikelihoodResult {
  double sum_logprob = 0;  // sum of the continuation's token log-probs
  int num_tokens = 0;      // continuation tokens scored
  bool is_greedy = false;  // every continuation token was the argmax
};

struct MetricValue {
  std::string name;  // "acc", "acc_norm", "rouge1", ...
  double value = 0;
  double stderr_ = 0;  // standard error of the mean
  int n = 0;
  std::optional<int> turn;  // shared-context evaluation: the turn (1-based) it is of
};

enum class TaskKind { MultipleChoice, Generation, Perplexity };

// A task's own scores of its generations: one per document, and the metrics.
struct GenerationScores {
  std::vector<double> per_doc;
  std::vector<MetricValue> metrics;  // in metric_names() order
};

class Task {
 public:
  virtual ~Task() = default;
  virtual std::string name() const = 0;
  virtual TaskKind kind() const = 0;
  // The metric names this task reports, in order.
  virtual std::vector<std::string> metric_names() const = 0;
  // Whether the task's prompts are fitted to TaskOptions::length (ruler_*, niah), with a
  // context/question split (GenerationDoc::question_offset).
  virtual bool long_context() const { return false; }
  // Whether it places its one needle at TaskOptions::depth (niah).
  virtual bool needle_depth() const { return false; }
  // Multiple-choice tasks override this.
  virtual std::vector<MultipleChoiceDoc> multiple_choice_docs(const TaskOptions&) const {
    return {};
  }
  // Generation tasks override this.
  virtual std::vector<GenerationDoc> generation_docs(const TaskOptions&) const { return {}; }
  // Generation tasks whose prompts are fitted to TaskOptions::length in the model's own
  // tokens (the long-context tasks) override this instead; the default ignores the tokenizer.
  virtual std::vector<GenerationDoc> generation_docs_for(const Tokenizer&, const TaskOptions& options) const {
    return generation_docs(options);
  }
  // Generation tasks that score their own answers (the long-context tasks: RULER's string
  // match, NIAH's ROUGE; mathqa_cot's answer letter) override this; nullopt leaves
  // scoring to the evaluator's ROUGE.
  // `predictions` are the generated texts, one per document, in order.
  virtual std::optional<GenerationScores> score_generations(const std::vector<GenerationDoc>&,
                                                            const std::vector<std::string>&) const {
    return std::nullopt;
  }
};

// "copa", "piqa", "winogrande", "openbookqa", "rte", "mathqa", "mathqa_cot", "xsum", "cnndm",
// "perplexity", the RULER-style "ruler_*" tasks and "niah".
std::unique_ptr<Task> make_task(const std::string& name);
std::vector<std::string> task_names();

}  // namespace kvevict
