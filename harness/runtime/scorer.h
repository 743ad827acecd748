// Scoring and generation under an eviction policy, in either execution mode.
#pragma once
#include <functional>
#include <memory>
#include <random>
#include <string>
#include <vector>

#include "harness/config/eval_config.h"
#include "harness/runtime/attention.h"
#include "harness/model/model.h"
#include "policies/policy.h"

namespace kvevict {

// The policy's view of a sequence on this model.
SequenceShape shape_for(const Model& model, int length, int prefill_len);

// What a policy and its cache settings need of a model, checked once, after the model's
// config is read and before any of its work: a ratio or byte budget that keeps a token
// at the model's whole context, KIVI's group dividing head_dim and its residual within
// the context, and, over a DMC model, a policy that runs on its slots. Throws naming the
// flag or key (the options' `keys`).
void check_policy_for_model(const Policy& policy, const Model& model);

// One entry of a row's most likely tokens: its id and log-prob (float64 log-softmax).
struct TokenLogprob {
  int token = 0;
  double logprob = 0;
};

struct SequenceScore {
  std::vector<double> next_token_logprob;  // [T-1]: log p(tokens[i+1] | tokens[..i])
  std::vector<int> argmax;                 // [T]: argmax of each logits row
  // [T] x top_k with top_k > 0: each row's top_k tokens by log-prob, highest first (ties:
  // lower id first), from the same numbers as next_token_logprob; rows before
  // first_logprob are empty.
  std::vector<std::vector<TokenLogprob>> top;
  KvStats kv;
};

// The `k` most likely tokens of one row of log-probs [vocab], highest first (ties: lower id).
std::vector<TokenLogprob> top_logprobs(const double* logprobs, int vocab, int k);

// What ScoreStream::result reads from a block of log-probs [rows, vocab] (float64) of rows
// r0 .. r0+rows-1, with tensor ops where the block is: each row's target (tokens[i+1], or
// final_target >= 0 after the last token) into next_token_logprob (sized T-1), and with
// top_k > 0 each row's top-k into top (sized T). A device run's path: only [rows] and
// [rows, top_k] results cross to the host. The CPU reads the block in place instead, with
// the same numbers (a test holds them equal).
void read_logprob_rows(const torch::Tensor& logprobs, int r0, const std::vector<int>& tokens, int final_target,
                       int top_k, SequenceScore& result);

// A sequence's model calls as data, so that a batch can interleave several sequences:
// next() says which tokens to run, take() reads their logits. run_batched() drives them.
class BatchStream {
 public:
  virtual ~BatchStream() = default;
  virtual bool done() const = 0;
  // The segment to run next (not done()); its attention is this stream's own backend.
  virtual BatchSegment next() = 0;
  // The logits [t, vocab] of the segment next() gave.
  virtual void take(const torch::Tensor& logits) = 0;
};

// Runs a stream's model calls one after another, each alone (batch 1).
void run_alone(const Model& model, BatchStream& stream);

// Continuous batching over streams that may arrive while it runs: up to batch_size streams
// in each forward_batch(); before each call the free places are offered to join(idle),
// which gives the next waiting stream (its id and the stream, not done(); it stays the
// caller's) or a null stream when none waits now. idle is true when nothing is running:
// join may then wait for a stream, and a null one ends the run. finished(id, stream) is
// called as a stream ends, in the order they end; ran(segments), when given, after each
// model call. An error a model call throws leaves the run (the streams in it are then in
// no known state).
struct JoiningStream {
  int id = -1;
  BatchStream* stream = nullptr;
};
void run_continuous(const Model& model, int batch_size, const std::function<JoiningStream(bool idle)>& join,
                    const std::function<void(int, BatchStream&)>& finished,
                    const std::function<void(int segments)>& ran = {});

// Runs make(i) for i in [0, count) with up to batch_size streams in each forward_batch():
// a stream that is done leaves the batch and the next waiting one joins (continuous
// batching), its first block running in the same forward as the others' steps.
// finished(i, stream) is called as stream i ends, in the order they end, one call at a
// time. A model whose ops run on one thread runs a continuous batch on each of its
// request threads (Model::request_workers), so make and finished may be called from
// several threads, never at once.
void run_batched(const Model& model, int count, int batch_size,
                 const std::function<std::unique_ptr<BatchStream>(int)>& make,
                 const std::function<void(int, BatchStream&)>& finished);

// Teacher-forced log-probs of `tokens`. The first `prefill_len` tokens run with full
// attention (0: eviction from the first token, the "stream" protocol). Ratio budgets
// refer to `budget_length` tokens (0: the whole sequence). With `final_target` >= 0,
// next_token_logprob gains a last entry: log p(final_target | all tokens), as lm-eval
// scores a continuation's last token from (ctx+cont)[:-1]. Entries before
// `first_logprob` are left NaN (a caller that reads only a continuation's log-probs skips
// the context's log-softmax; each row's value is the same either way). With `top_k` > 0
// each row from first_logprob on also gives its top_k tokens (SequenceScore::top).
SequenceScore score_sequence(const Model& model, const Policy& policy, Mode mode,
                             const std::vector<int>& tokens, int prefill_len = 0,
                             int budget_length = 0, int final_target = -1, int first_logprob = 0,
                             int top_k = 0);

// One sequence to score, with score_sequence()'s arguments.
struct ScoreRequest {
  std::vector<int> tokens;
  int prefill_len = 0;
  int budget_length = 0;
  int final_target = -1;
  int first_logprob = 0;
  int top_k = 0;
};

// score_sequence() as a stream: the prefill block (or, in sim mode, the whole sequence),
// then one token at a time in decode mode.
class ScoreStream : public BatchStream {
 public:
  // Checks the request as score_sequence() does (throws kvevict::Error).
  ScoreStream(const Model& model, const Policy& policy, Mode mode, ScoreRequest request);
  bool done() const override { return next_ >= pieces_.size(); }
  BatchSegment next() override { return pieces_.at(next_); }
  void take(const torch::Tensor& logits) override;
  SequenceScore result();

  // The policy's view of this sequence.
  const SequenceShape& shape() const { return shape_; }
  // The model calls, in order, and how many have run.
  const std::vector<BatchSegment>& pieces() const { return pieces_; }
  size_t pieces_taken() const { return next_; }
  // Goes on from where `context` stands instead of running those calls itself: `context`
  // (decode mode) took its first pieces_taken() calls, and this stream's first calls are
  // the same (tokens and positions). Its cache is forked (CacheAttention::fork) and their
  // logits rows shared. False, with nothing changed, when the cache cannot be forked to
  // this shape; the stream then runs from its start as usual.
  bool continue_from(const ScoreStream& context);

 private:
  ScoreRequest request_;
  SequenceShape shape_;
  std::unique_ptr<SimAttention> sim_;
  std::unique_ptr<CacheAttention> cache_;
  std::vector<BatchSegment> pieces_;  // the model calls, in order
  size_t next_ = 0;
  std::vector<torch::Tensor> rows_;   // [pieces taken]: each [t, vocab]
};

// The requests of one multiple-choice document (its choices) as one stream, the requests
// one after another. With `reuse` (decode mode only), requests whose first model call is
// the same and whose policy states agree (Policy::states_agree) form a group, which shares
// the calls all of them make: those run once, for the group's first request, and the
// others continue a fork of its cache (ScoreStream::continue_from). Requests of several
// documents may come in one list (a server request's prompts): each joins the first group
// it shares a call with. Each result equals score_sequence() of its request
// alone, bit for bit: the calls are the same ones. (The full cache runs each request as
// one block, which shares no call: see docs/ARCHITECTURE.md.)
class SharedContextStream : public BatchStream {
 public:
  SharedContextStream(const Model& model, const Policy& policy, Mode mode, const std::vector<ScoreRequest>& requests,
                      bool reuse);
  bool done() const override { return current_ >= order_.size(); }
  BatchSegment next() override { return streams_[order_[current_]]->next(); }
  void take(const torch::Tensor& logits) override;
  // One per request, in request order, once done().
  std::vector<SequenceScore> results();
  // Model calls the requests did not run themselves, having continued a shared context.
  int64_t calls_saved() const { return calls_saved_; }

 private:
  void skip_finished();
  std::vector<std::unique_ptr<ScoreStream>> streams_;  // [requests]
  std::vector<int> order_;          // the streams in the order they run: each group's first one, then the rest
  std::vector<size_t> context_of_;  // [requests]: a group's first stream: its shared calls (0: none)
  std::vector<std::vector<int>> continuing_;  // [requests]: a group's first stream: the others of its group
  size_t current_ = 0;
  int64_t calls_saved_ = 0;
};

// One document's requests through a SharedContextStream run alone (batch 1).
std::vector<SequenceScore> score_shared_context(const Model& model, const Policy& policy, Mode mode,
                                                const std::vector<ScoreRequest>& requests, bool reuse,
                                                int64_t* calls_saved = nullptr);

// Every document's requests (documents[d]) scored by a SharedContextStream each, up to
// batch_size documents at a time (run_batched), longest first. Result [d][i] equals
// score_sequence() of documents[d][i] alone, bit for bit.
// finished(d) is called as document d ends; calls_saved, when given, adds up the model
// calls that reuse saved.
std::vector<std::vector<SequenceScore>> score_documents(const Model& model, const Policy& policy, Mode mode,
                                                        const std::vector<std::vector<ScoreRequest>>& documents,
                                                        int batch_size, bool reuse,
                                                        const std::function<void(int)>& finished = {},
                                                        int64_t* calls_saved = nullptr);

// score_sequence() of every request, up to batch_size at a time (run_batched), longest
// first as lm-eval orders them; result i equals score_sequence() of request i alone.
// finished(i) is called as request i ends.
std::vector<SequenceScore> score_batch(const Model& model, const Policy& policy, Mode mode,
                                       const std::vector<ScoreRequest>& requests, int batch_size,
                                       const std::function<void(int)>& finished = {});

struct GenerateOptions {
  int max_new_tokens = 64;
  double temperature = 0;  // 0: greedy
  uint64_t seed = 0;
  std::vector<std::string> stop;  // generation ends before the first of these
  bool stream = false;            // true: evict from the first prompt token; false: prefill the prompt
  // Question-agnostic prefill (stream false): the prompt's last question_tokens tokens
  // (question and answer prefix) are fed after the rest was prefilled and compressed,
  // and are not compressed themselves; ratio budgets then refer to the rest. 0: the
  // whole prompt is prefilled and compressed together (question-aware).
  int question_tokens = 0;
  // >= 0: record each chosen token's log-prob and its row's top max(1, k) tokens
  // (Generation::steps); -1: record nothing.
  int top_logprobs = -1;
  // Called with each new token (not the EOS that ends generation); false stops generating
  // (e.g. the client that asked has gone).
  std::function<bool(int)> on_token;
};

enum class FinishReason { Length, Eos, Stop, Cancelled };

struct Generation {
  std::vector<int> tokens;  // new tokens only
  std::string text;         // decoded, cut before any stop string
  // With top_logprobs >= 0: one entry per chosen token, including an EOS that ended
  // generation (which `tokens` leaves out): its log-prob (float64 log-softmax of its row)
  // and the row's top tokens.
  std::vector<TokenLogprob> chosen;
  std::vector<std::vector<TokenLogprob>> top;
  FinishReason finish = FinishReason::Length;
  KvStats kv;
};

// Decode mode with a real cache; ratio budgets refer to the prompt length (H2O's
// summarisation convention), without the question when it is fed uncompressed.
Generation generate(const Model& model, const Policy& policy, const std::vector<int>& prompt,
                    const GenerateOptions& options);

// One generation as a sequence of model calls, so that a batch can interleave several:
// next() says which tokens to run (the prompt's blocks, then each new token), take()
// reads their logits and chooses the next token. generate() runs one alone;
// generate_batch() runs several in one forward_batch() per step. Each owns its cache and
// its policy's state, so budgets (a ratio of its own prompt) and evictions are its own.
class GenerationStream : public BatchStream {
 public:
  // Checks the prompt and options as generate() does (throws kvevict::Error).
  GenerationStream(const Model& model, const Policy& policy, std::vector<int> prompt, GenerateOptions options);
  bool done() const override { return done_; }
  BatchSegment next() override;
  void take(const torch::Tensor& logits) override;
  // The outcome, once done().
  Generation result();

  // SCBench's multi-turn protocol (harness/runtime/scorer.h, generate_turns): once done(),
  // the next question enters this same cache and a new answer is generated under
  // `options` (its question_tokens and stream are not read). The answer's last chosen
  // token, which no call has run yet (none after an EOS), then the question's tokens run
  // one per model call, each compressed by the policy as a decode step is (a block of
  // several tokens is allowed only where nothing is evicted: the prefill and the first
  // question, Budget::question_len). result() then gives this turn's answer alone; its kv
  // counts the cache since its start.
  void ask(const std::vector<int>& question, GenerateOptions options);
  // SCBench's multi-request protocol: goes on from `context`'s cache right after its
  // context block (the prompt's part before question_tokens), which `context` ran as its
  // only call so far; this stream, not started, has the same context block (tokens and
  // positions). Its cache is a fork (CacheAttention::fork). False, with nothing changed,
  // when the policy's states for this shape do not agree with `context`'s
  // (Policy::states_agree: e.g. another question length) or cannot be cloned: the stream
  // then runs its context itself. Either way its answer is generate()'s, bit for bit.
  bool continue_from(const GenerationStream& context);
  // The cache (for the tests: positions held, tokens cached).
  const CacheAttention& cache() const { return *attention_; }

 private:
  void choose(const torch::Tensor& row);  // one decode step's choice from the last row's logits
  const Model& model_;
  GenerateOptions options_;
  SequenceShape shape_;
  std::unique_ptr<CacheAttention> attention_;
  std::vector<BatchSegment> prefill_;  // the prompt's blocks still to run
  size_t prefill_next_ = 0;
  std::mt19937_64 rng_;
  Generation out_;
  int position_ = 0;  // the position of the next token to run
  int step_ = 0;
  bool done_ = false;
};

// SCBench's shared-context setting (Li et al. 2024, "SCBench: A KV Cache-Centric Analysis
// of Long-Context Methods", arXiv 2412.10319): one context, several questions asked of it.
// `context` holds the context's tokens (BOS first where the prompt has one), questions[k]
// turn k's question tokens (with its answer prefix): context + questions[k] is the
// single-question prompt of question k, whose question enters after the context was
// prefilled and compressed (GenerateOptions::question_tokens). options[k] are turn k's
// (max_new_tokens, stop, temperature, seed; question_tokens and stream are set here).
//
// MultiRequest: each question against its own copy of the compressed context. Turn k is
// generate(context + questions[k]) with question_tokens = |questions[k]|, bit for bit; the
// context's call runs once for each group of questions whose policy states agree
// (Policy::states_agree: the same question length) and the others of the group fork its
// cache (GenerationStream::continue_from).
// MultiTurn: one cache for the whole conversation. Turn 1 is generate(context +
// questions[0]) as above; every later turn's tokens (the previous answer's last token,
// its question) enter the same cache one per call under the policy (GenerationStream::ask),
// so turn k sees the compressed context plus what the policy kept of the earlier turns.
// after_turn(k, stream), when given, is called as turn k's answer is chosen (before the
// next question enters); `calls_saved` adds the model calls forks saved.
struct TurnsRequest {
  std::vector<int> context;
  std::vector<std::vector<int>> questions;
  std::vector<GenerateOptions> options;
};
std::vector<Generation> generate_turns(const Model& model, const Policy& policy, const TurnsRequest& request,
                                       SharedContext protocol,
                                       const std::function<void(int, const GenerationStream&)>& after_turn = {},
                                       int64_t* calls_saved = nullptr);

// Generates for every prompt (prompts[i] with options[i]) with up to batch_size of them
// decoding together: a request that stops (EOS, stop string, max tokens) leaves the batch
// and the next waiting one joins, its prompt running in the same forward as the others'
// steps (continuous batching). Each result equals generate() of that request alone.
// finished(i) is called as request i ends (in the order they end).
std::vector<Generation> generate_batch(const Model& model, const Policy& policy,
                                       const std::vector<std::vector<int>>& prompts,
                                       const std::vector<GenerateOptions>& options, int batch_size,
                                       const std::function<void(int)>& finished = {});

}  // namespace kvevict
