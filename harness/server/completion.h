// One /v1/completions request answered under a policy: the server's only call into the
// model. A prompt is scored as `kvevict eval` scores a joint request (joint_score_request's
// pass as a ScoreStream, the same code path) and continued with `generate`'s
// GenerationStream, so a served log-prob or generation is the one the CLI computes for the
// same tokens, policy and mode, at any batch size.
#pragma once
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/config/eval_config.h"
#include "harness/model/model.h"
#include "harness/runtime/scorer.h"
#include "harness/runtime/stream_batcher.h"
#include "harness/server/request.h"
#include "policies/policy.h"
#include "policies/registry.h"

namespace kvevict::server {

// What the server was started with: how every request is run unless its "kvevict" object
// says otherwise.
struct CompletionSettings {
  Mode mode = Mode::Sim;
  Protocol protocol = Protocol::Stream;
  std::string policy = reference_policy_name();
  PolicyOptions policy_options;
  RequestLimits limits;
  // Above 1: every request's model calls (score passes, generation steps) join one
  // StreamBatcher, up to this many sequences per forward_batch(), so concurrent requests
  // run together; 1: each request runs its calls alone on its own worker's thread.
  int batch_size = 1;
};

// One choice: its text and, when logprobs were asked, one entry per token (the prompt's
// with echo, then the generated ones, including an EOS that ended generation).
struct Choice {
  std::string text;
  std::string finish_reason;  // "stop" or "length"
  bool has_logprobs = false;
  std::vector<std::string> tokens;                      // [entries] each token's text
  std::vector<double> token_logprobs;                   // [entries] NaN: none (the first prompt token)
  std::vector<std::vector<std::pair<std::string, double>>> top_logprobs;  // [entries] empty: none
  std::vector<int64_t> text_offset;                     // [entries]
  int prompt_tokens = 0, completion_tokens = 0;
  double kv_tokens_kept = 0, kv_tokens_full = 0;  // mean over layers at the end; the tokens a full cache holds
};

// Text as it is generated, for streaming: (choice index, text to append). False: the
// client has gone, stop.
using TextSink = std::function<bool(int, const std::string&)>;

class Completer {
 public:
  // Makes the server's policy once (checked against the model's context); throws
  // kvevict::Error for a bad one.
  Completer(const Model& model, CompletionSettings settings);
  ~Completer();
  const CompletionSettings& settings() const { return settings_; }
  const Model& model() const { return model_; }
  // The batcher's counters; none at batch size 1.
  std::optional<StreamBatcher::Stats> batch_stats() const;

  // A request made ready to run: its policy and its prompts' token ids. Throws
  // RequestError for one the model cannot serve as asked (a prompt too long, a sim-only
  // policy asked to generate, prefill-compress without the context's length).
  struct Prepared {
    const CompletionRequest* request = nullptr;
    std::shared_ptr<const Policy> policy;
    std::vector<std::vector<int>> prompts;
  };
  Prepared prepare(const CompletionRequest& request) const;

  // Answers a prepared request (throws RequestError for what a policy refuses on a
  // sequence, e.g. a token budget longer than the prompt). Safe to call from several
  // threads at once: the model and the policies are only read, and each request's streams
  // (its caches and policy states) are its own, whether they run alone or in a batch.
  std::vector<Choice> complete(const Prepared& prepared, const TextSink& sink = {}) const;

 private:
  // prompt_score: the prompt's scoring pass when it ran already (shared with the request's
  // other prompts); null: run it here.
  Choice complete_one(const Policy& policy, const CompletionRequest& request, const std::vector<int>& prompt,
                      int index, const TextSink& sink, const SequenceScore* prompt_score) const;
  // Runs a stream to its end: in the batch, or alone at batch size 1.
  void run(BatchStream& stream) const;
  const Model& model_;
  CompletionSettings settings_;
  std::shared_ptr<const Policy> policy_;
  std::unique_ptr<StreamBatcher> batcher_;  // null at batch size 1
};

// A log-prob as the JSON writer may see it: finite, at least -9999 (NaN: -9999).
double json_safe_logprob(double logprob);

}  // namespace kvevict::server
