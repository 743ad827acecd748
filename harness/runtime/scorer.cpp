#include "harness/runtime/scorer.h"

#include <algorithm>
#include <exception>
#include <mutex>
#include <limits>

#include "harness/common/enum_names.h"
#include "harness/common/errors.h"
#include "harness/common/limits.h"
#include "harness/model/rope.h"
#include "harness/runtime/attention.h"
#include "harness/runtime/prepass.h"

namespace kvevict {

namespace {

// Whether two model calls compute the same thing: the same tokens at the same positions.
bool same_call(const BatchSegment& a, const BatchSegment& b) { return a.tokens == b.tokens && a.start == b.start; }

// Tokens [begin, end) of the prefill as the cache's model calls: one block, or, for a
// policy that compresses inside the prefill (RealisablePolicy::prefill_block), blocks cut
// where its blocks end, so no compression falls inside a call.
void push_prefill_blocks(const Policy& policy, const std::vector<int>& tokens, int begin, int end,
                         CacheAttention* cache, std::vector<BatchSegment>* pieces) {
  const RealisablePolicy* realisable = policy.as_realisable();
  const int block = realisable ? realisable->prefill_block() : 0;
  for (int from = begin; from < end;) {
    const int to = block > 0 ? std::min(end, (from / block + 1) * block) : end;
    pieces->push_back({std::vector<int>(tokens.begin() + from, tokens.begin() + to), from, cache});
    from = to;
  }
}

// The pre-pass's cost (SequenceShape::observed), in the statistics of the sequence it ran for.
void add_prepass_cost(const SequenceShape& shape, KvStats* kv) {
  if (!shape.observed || shape.observed->kind != Prepass::ContextReconstruction) return;
  kv->prepass_tokens = shape.observed->tokens;
  kv->prepass_context = shape.observed->positions;
  kv->prepass_seconds = shape.observed->seconds;
}

}  // namespace

SequenceShape shape_for(const Model& model, int length, int prefill_len) {
  SequenceShape shape;
  shape.length = length;
  shape.prefill_len = prefill_len;
  shape.n_layers = static_cast<int>(model.arch().n_layers);
  shape.n_q_heads = static_cast<int>(model.arch().n_heads);
  shape.n_kv_heads = static_cast<int>(model.arch().n_kv_heads);
  shape.head_dim = static_cast<int>(model.arch().head_dim);
  // The frequencies the model rotates this sequence's queries and keys by (dynamic NTK's
  // are those of a pass of `length` tokens; within the trained context, its only ones),
  // in the table type the model computes them in.
  if (model.arch().positions == PositionKind::Rotary) {
    const auto table = model.dtype() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
    const auto inv_freq = rope_inv_freq(model.arch(), std::max(length, 1), table).to(torch::kFloat64).contiguous();
    shape.rope_inv_freq.assign(inv_freq.data_ptr<double>(), inv_freq.data_ptr<double>() + inv_freq.numel());
  }
  return shape;
}

void check_policy_for_model(const Policy& policy, const Model& model) {
  const int64_t context = std::min<int64_t>(model.arch().max_positions, kMaxModelPositions);
  policy.check_keeps_a_token(context);
  const KvQuantSpec& quant = policy.options().kv_quant;
  check_kv_quant_head_dim(quant, model.arch().head_dim);
  if (quant.enabled() && quant.residual > context)
    throw Error(std::string(quant.keys->residual) + " " + std::to_string(quant.residual) +
                " is longer than the model's context of " + std::to_string(context) +
                " tokens: no key would ever be quantized");
  // A byte budget that keeps no token of a request of the whole context keeps none of any.
  if (quant.memory > 0 && !policy.keeps_everything() && !model.arch().dmc.enabled())
    policy.layer_budget(0, shape_for(model, static_cast<int>(context), 0));
  check_prepass_for_model(policy, model);
  if (model.arch().dmc.enabled()) {
    const SequenceShape shape = shape_for(model, static_cast<int>(context), 0);
    check_dmc_policy(policy, &shape);
  }
}

std::vector<TokenLogprob> top_logprobs(const double* logprobs, int vocab, int k) {
  std::vector<int> ids(vocab);
  for (int v = 0; v < vocab; ++v) ids[v] = v;
  k = std::clamp(k, 0, vocab);
  auto higher = [&](int a, int b) { return logprobs[a] > logprobs[b] || (logprobs[a] == logprobs[b] && a < b); };
  std::partial_sort(ids.begin(), ids.begin() + k, ids.end(), higher);
  std::vector<TokenLogprob> top(k);
  for (int i = 0; i < k; ++i) top[i] = {ids[i], logprobs[ids[i]]};
  return top;
}

void run_continuous(const Model& model, int batch_size, const std::function<JoiningStream(bool idle)>& join,
                    const std::function<void(int, BatchStream&)>& finished,
                    const std::function<void(int segments)>& ran) {
  if (batch_size < 1) throw Error("batch size " + std::to_string(batch_size) + " must be at least 1");
  std::vector<JoiningStream> active;  // [<= batch_size]
  auto retire_finished = [&] {
    std::vector<JoiningStream> still;
    for (const JoiningStream& entry : active) {
      if (entry.stream->done())
        finished(entry.id, *entry.stream);
      else
        still.push_back(entry);
    }
    active = std::move(still);
  };
  for (;;) {
    while (static_cast<int>(active.size()) < batch_size) {
      const JoiningStream joining = join(active.empty());
      if (!joining.stream) break;
      active.push_back(joining);
    }
    if (active.empty()) return;  // join gave nothing while idle: the run is over
    retire_finished();           // a stream with nothing to run (none today) ends at once
    if (active.empty()) continue;
    std::vector<BatchSegment> segments;  // [active]
    for (const JoiningStream& entry : active) segments.push_back(entry.stream->next());
    const std::vector<torch::Tensor> logits = model.forward_batch(segments);
    for (size_t i = 0; i < active.size(); ++i) active[i].stream->take(logits[i]);
    if (ran) ran(static_cast<int>(segments.size()));
    retire_finished();
  }
}

void run_batched(const Model& model, int count, int batch_size,
                 const std::function<std::unique_ptr<BatchStream>(int)>& make,
                 const std::function<void(int, BatchStream&)>& finished) {
  std::vector<std::unique_ptr<BatchStream>> made(count);  // [count]: each stream while it runs
  int waiting = 0;                                        // the next stream to join
  std::mutex mutex;                                       // make, finished and the two above
  std::exception_ptr error;                               // the first a worker met
  auto run_one_batch = [&] {
    run_continuous(
        model, batch_size,
        [&](bool) {
          std::lock_guard<std::mutex> lock(mutex);
          if (error || waiting >= count) return JoiningStream{};
          made[waiting] = make(waiting);
          ++waiting;
          return JoiningStream{waiting - 1, made[waiting - 1].get()};
        },
        [&](int i, BatchStream& stream) {
          std::lock_guard<std::mutex> lock(mutex);
          finished(i, stream);
          made[i].reset();
        });
  };
  // A model that runs each op on one thread (Model::request_workers) runs one continuous
  // batch on each of its request threads, taking the waiting streams in turn: a batch on
  // one thread left the other idle, so batch 8 was slower than batch 1's two requests at
  // once. A stream's numbers do not depend on its neighbours, so none moves.
  const int workers = std::max(1, std::min(model.request_workers(), (count + batch_size - 1) / batch_size));
  if (workers == 1) return run_one_batch();
#pragma omp parallel num_threads(workers)
  {
    try {
      run_one_batch();
    } catch (...) {
      std::lock_guard<std::mutex> lock(mutex);
      if (!error) error = std::current_exception();
    }
  }
  if (error) std::rethrow_exception(error);
}

void run_alone(const Model& model, BatchStream& stream) {
  while (!stream.done()) {
    const BatchSegment segment = stream.next();
    stream.take(model.forward(segment.tokens, segment.start, *segment.attention));
  }
}

ScoreStream::ScoreStream(const Model& model, const Policy& policy, Mode mode, ScoreRequest request)
    : request_(std::move(request)) {
  const std::vector<int>& tokens = request_.tokens;
  if (tokens.empty()) throw Error("nothing to score: the token sequence is empty");
  const int T = static_cast<int>(tokens.size());
  const int prefill_len = request_.prefill_len;
  shape_ = shape_for(model, request_.budget_length > 0 ? request_.budget_length : T, prefill_len);
  attach_prepass(model, policy, tokens, prefill_len, &shape_);
  const SequenceShape& shape = shape_;
  policy.validate(shape);
  check_kv_quant_head_dim(policy.options().kv_quant, model.arch().head_dim);
  if (!policy.realisable() && prefill_len > 0)
    throw Error("policy " + policy.name() + " is a whole-sequence simulation: it supports only the stream protocol");
  if (mode == Mode::Sim) {
    sim_ = std::make_unique<SimAttention>(model, policy, shape);
    pieces_.push_back({tokens, 0, sim_.get()});
    return;
  }
  cache_ = std::make_unique<CacheAttention>(model, policy, shape);
  int done = 0;
  // A block is only valid while nothing is evicted: the prefill, or everything
  // when the policy keeps the full cache.
  // A quantized cache flushes between tokens, so it takes blocks only for the prefill too.
  const bool whole = policy.keeps_everything() && !policy.options().kv_quant.enabled();
  const int block = whole ? T : std::min(prefill_len, T);
  if (block > 1) {
    push_prefill_blocks(policy, tokens, 0, block, cache_.get(), &pieces_);
    done = block;
  }
  for (; done < T; ++done) pieces_.push_back({{tokens[done]}, done, cache_.get()});
}

void ScoreStream::take(const torch::Tensor& logits) {
  rows_.push_back(logits);
  ++next_;
}

bool ScoreStream::continue_from(const ScoreStream& context) {
  if (!context.cache_ || !cache_ || next_ != 0 || context.next_ > pieces_.size())
    throw Error("internal: continue_from needs two decode-mode streams, this one not started");
  for (size_t i = 0; i < context.next_; ++i)
    if (!same_call(pieces_[i], context.pieces_[i]))
      throw Error("internal: continue_from a context whose model calls differ");
  std::unique_ptr<CacheAttention> fork = context.cache_->fork(shape_);
  if (!fork) return false;
  cache_ = std::move(fork);
  for (BatchSegment& piece : pieces_) piece.attention = cache_.get();
  rows_ = context.rows_;  // the context's logits, read, never written
  next_ = context.next_;
  return true;
}

SequenceScore ScoreStream::result() {
  if (!done()) throw Error("internal: result() of an unfinished score");
  const std::vector<int>& tokens = request_.tokens;
  const int T = static_cast<int>(tokens.size());
  torch::Tensor logits = rows_.size() == 1 ? rows_.front() : torch::cat(rows_, 0);
  rows_.clear();
  SequenceScore result;
  result.kv = sim_ ? sim_->stats() : cache_->stats();
  add_prepass_cost(shape_, &result.kv);
  // argmax, log-softmax, targets and top-k run where the logits are; only per-row results
  // ([T], [T, top_k]) come to the host, never the [T, vocab] logits of a device run.
  auto argmax = logits.argmax(-1).to(torch::kCPU).contiguous();
  const int64_t* best = argmax.data_ptr<int64_t>();
  result.argmax.assign(best, best + T);
  // Log-softmax in float64, a block of rows at a time: a float64 copy of all T x vocab
  // logits would be the largest buffer of a long sequence.
  result.next_token_logprob.assign(T - 1, std::numeric_limits<double>::quiet_NaN());
  const int top_k = request_.top_k;
  if (top_k > 0) result.top.resize(T);
  constexpr int kRowsPerBlock = 256;
  for (int r0 = std::clamp(request_.first_logprob, 0, T - 1); r0 < T; r0 += kRowsPerBlock) {
    const int rows = std::min(kRowsPerBlock, T - r0);
    auto logprobs = torch::log_softmax(logits.narrow(0, r0, rows).to(torch::kFloat64), -1).contiguous();
    if (!logprobs.device().is_cpu()) {
      read_logprob_rows(logprobs, r0, tokens, request_.final_target, top_k, result);
      continue;
    }
    auto acc = logprobs.accessor<double, 2>();
    const int vocab = static_cast<int>(logprobs.size(1));
    for (int i = r0; i < r0 + rows; ++i) {
      if (top_k > 0) result.top[i] = top_logprobs(&acc[i - r0][0], vocab, top_k);
      if (i + 1 < T) result.next_token_logprob[i] = acc[i - r0][tokens[i + 1]];
      else if (request_.final_target >= 0) result.next_token_logprob.push_back(acc[i - r0][request_.final_target]);
    }
  }
  return result;
}

void read_logprob_rows(const torch::Tensor& logprobs, int r0, const std::vector<int>& tokens, int final_target,
                       int top_k, SequenceScore& result) {
  const int T = static_cast<int>(tokens.size()), rows = static_cast<int>(logprobs.size(0));
  // Row i's target: the next token, or the final target after the last row.
  std::vector<int64_t> targets, target_rows;
  for (int i = r0; i < r0 + rows; ++i) {
    const int target = i + 1 < T ? tokens[i + 1] : final_target;
    if (target < 0) continue;
    target_rows.push_back(i - r0);
    targets.push_back(target);
  }
  if (!targets.empty()) {
    const auto on_device = [&](const std::vector<int64_t>& v) { return torch::tensor(v, torch::kLong).to(logprobs.device()); };
    const auto picked = logprobs.index({on_device(target_rows), on_device(targets)}).to(torch::kCPU).contiguous();
    const double* values = picked.data_ptr<double>();
    for (size_t j = 0; j < targets.size(); ++j) {
      const int i = r0 + static_cast<int>(target_rows[j]);
      if (i + 1 < T) result.next_token_logprob[i] = values[j];
      else result.next_token_logprob.push_back(values[j]);
    }
  }
  if (top_k <= 0) return;
  const int k = std::min<int>(top_k, static_cast<int>(logprobs.size(1)));
  // A stable descending sort keeps equal values in id order: the host's rule (lower id
  // first), which topk does not promise.
  const auto [sorted, order] = torch::sort(logprobs, /*stable=*/true, /*dim=*/-1, /*descending=*/true);
  const auto values_host = sorted.narrow(1, 0, k).to(torch::kCPU).contiguous();
  const auto ids_host = order.narrow(1, 0, k).to(torch::kCPU).contiguous();
  const auto values = values_host.accessor<double, 2>();
  const auto ids = ids_host.accessor<int64_t, 2>();
  for (int i = 0; i < rows; ++i) {
    std::vector<TokenLogprob>& top = result.top[r0 + i];
    top.resize(k);
    for (int j = 0; j < k; ++j) top[j] = {static_cast<int>(ids[i][j]), values[i][j]};
  }
}

namespace {

// 0 .. n-1 ordered by length(i), longest first, equal lengths in index order (lm-eval's order).
std::vector<int> longest_first(int n, const std::function<size_t(int)>& length) {
  std::vector<int> order(n);
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return length(a) > length(b); });
  return order;
}

}  // namespace

SequenceScore score_sequence(const Model& model, const Policy& policy, Mode mode,
                             const std::vector<int>& tokens, int prefill_len, int budget_length,
                             int final_target, int first_logprob, int top_k) {
  ScoreStream stream(model, policy, mode, {tokens, prefill_len, budget_length, final_target, first_logprob, top_k});
  run_alone(model, stream);
  return stream.result();
}

std::vector<SequenceScore> score_batch(const Model& model, const Policy& policy, Mode mode,
                                       const std::vector<ScoreRequest>& requests, int batch_size,
                                       const std::function<void(int)>& finished) {
  const int n = static_cast<int>(requests.size());
  const std::vector<int> order = longest_first(n, [&](int i) { return requests[i].tokens.size(); });
  std::vector<SequenceScore> results(n);
  run_batched(
      model, n, batch_size,
      [&](int i) { return std::make_unique<ScoreStream>(model, policy, mode, requests[order[i]]); },
      [&](int i, BatchStream& stream) {
        results[order[i]] = static_cast<ScoreStream&>(stream).result();
        if (finished) finished(order[i]);
      });
  return results;
}

namespace {

// How many of their first model calls all of `streams` share (same tokens, same positions).
size_t shared_calls(const std::vector<const ScoreStream*>& streams) {
  size_t k = 0;
  for (;; ++k)
    for (const ScoreStream* s : streams) {
      const auto& a = s->pieces(), & b = streams.front()->pieces();
      if (k >= a.size() || k >= b.size() || !same_call(a[k], b[k])) return k;
    }
}

}  // namespace

SharedContextStream::SharedContextStream(const Model& model, const Policy& policy, Mode mode,
                                         const std::vector<ScoreRequest>& requests, bool reuse) {
  const int n = static_cast<int>(requests.size());
  for (const ScoreRequest& r : requests) streams_.push_back(std::make_unique<ScoreStream>(model, policy, mode, r));
  context_of_.assign(n, 0);
  continuing_.assign(n, {});
  // Groups: each request joins the first group whose first request makes the same first
  // call and whose states agree with its own.
  std::vector<std::vector<int>> groups;
  if (reuse && mode == Mode::Decode && n > 1) {
    for (int i = 0; i < n; ++i) {
      auto group = std::find_if(groups.begin(), groups.end(), [&](const std::vector<int>& g) {
        const ScoreStream& first = *streams_[g.front()];
        return shared_calls({&first, streams_[i].get()}) > 0 &&
               policy.states_agree(first.shape(), streams_[i]->shape());
      });
      if (group == groups.end()) groups.push_back({i});
      else group->push_back(i);
    }
  } else {
    for (int i = 0; i < n; ++i) groups.push_back({i});
  }
  for (const std::vector<int>& group : groups) {
    for (int i : group) order_.push_back(i);
    if (group.size() < 2) continue;
    std::vector<const ScoreStream*> members;
    for (int i : group) members.push_back(streams_[i].get());
    const size_t k = shared_calls(members);
    if (k == 0) continue;
    context_of_[group.front()] = k;
    continuing_[group.front()].assign(group.begin() + 1, group.end());
  }
  skip_finished();
}

void SharedContextStream::take(const torch::Tensor& logits) {
  const int i = order_[current_];
  ScoreStream& stream = *streams_[i];
  stream.take(logits);
  if (context_of_[i] > 0 && stream.pieces_taken() == context_of_[i]) {
    // The shared calls have run: the rest of the group continues from here.
    for (int j : continuing_[i])
      if (streams_[j]->continue_from(stream)) calls_saved_ += static_cast<int64_t>(context_of_[i]);
  }
  skip_finished();
}

void SharedContextStream::skip_finished() {
  while (current_ < order_.size() && streams_[order_[current_]]->done()) ++current_;
}

std::vector<SequenceScore> SharedContextStream::results() {
  if (!done()) throw Error("internal: results() of an unfinished document");
  std::vector<SequenceScore> out;
  for (auto& stream : streams_) out.push_back(stream->result());
  return out;
}

std::vector<SequenceScore> score_shared_context(const Model& model, const Policy& policy, Mode mode,
                                                const std::vector<ScoreRequest>& requests, bool reuse,
                                                int64_t* calls_saved) {
  SharedContextStream stream(model, policy, mode, requests, reuse);
  run_alone(model, stream);
  if (calls_saved) *calls_saved += stream.calls_saved();
  return stream.results();
}

std::vector<std::vector<SequenceScore>> score_documents(const Model& model, const Policy& policy, Mode mode,
                                                        const std::vector<std::vector<ScoreRequest>>& documents,
                                                        int batch_size, bool reuse,
                                                        const std::function<void(int)>& finished,
                                                        int64_t* calls_saved) {
  const int n = static_cast<int>(documents.size());
  const std::vector<int> order = longest_first(n, [&](int d) {  // by each document's longest request
    size_t most = 0;
    for (const ScoreRequest& r : documents[d]) most = std::max(most, r.tokens.size());
    return most;
  });
  std::vector<std::vector<SequenceScore>> results(n);
  run_batched(
      model, n, batch_size,
      [&](int i) { return std::make_unique<SharedContextStream>(model, policy, mode, documents[order[i]], reuse); },
      [&](int i, BatchStream& stream) {
        auto& document = static_cast<SharedContextStream&>(stream);
        results[order[i]] = document.results();
        if (calls_saved) *calls_saved += document.calls_saved();
        if (finished) finished(order[i]);
      });
  return results;
}

GenerationStream::GenerationStream(const Model& model, const Policy& policy, std::vector<int> prompt,
                                   GenerateOptions options)
    : model_(model), options_(std::move(options)), rng_(options_.seed) {
  if (prompt.empty()) throw Error("generation needs at least one prompt token (BOS)");
  const int P = static_cast<int>(prompt.size());
  const bool evicting = !policy.keeps_everything() || policy.options().kv_quant.enabled();  // between tokens
  const int Q = options_.question_tokens;
  if (Q < 0 || Q >= P || (Q > 0 && options_.stream))
    throw Error("a question of " + std::to_string(Q) + " tokens cannot follow the compressed part of a " +
                std::to_string(P) + "-token prompt" + (options_.stream ? " under the stream protocol" : ""));
  SequenceShape& shape = shape_;
  shape = shape_for(model, P - Q, options_.stream ? 0 : P - Q);
  shape.question_len = Q;
  attach_prepass(model, policy, prompt, options_.stream ? 0 : P - Q, &shape);
  policy.validate(shape);
  check_kv_quant_head_dim(policy.options().kv_quant, model.arch().head_dim);
  attention_ = std::make_unique<CacheAttention>(model, policy, shape);
  if (options_.stream && evicting) {
    for (int i = 0; i < P; ++i) prefill_.push_back({{prompt[i]}, i, attention_.get()});
  } else if (Q > 0) {
    // The context is compressed after its last row; the question's rows then attend the
    // compressed cache and enter it uncompressed.
    push_prefill_blocks(policy, prompt, 0, P - Q, attention_.get(), &prefill_);
    prefill_.push_back({std::vector<int>(prompt.end() - Q, prompt.end()), P - Q, attention_.get()});
  } else {
    push_prefill_blocks(policy, prompt, 0, P, attention_.get(), &prefill_);
  }
  position_ = P;
}

BatchSegment GenerationStream::next() {
  if (done_) throw Error("internal: next() on a finished generation");
  if (prefill_next_ < prefill_.size()) return prefill_[prefill_next_];
  return {{out_.tokens.back()}, position_ - 1, attention_.get()};
}

void GenerationStream::take(const torch::Tensor& logits) {
  if (prefill_next_ < prefill_.size()) {
    if (++prefill_next_ < prefill_.size()) return;
    prefill_.clear();  // the prompt's tokens are in the cache now
    prefill_next_ = 0;
  }
  if (step_ >= options_.max_new_tokens) {
    done_ = true;
    return;
  }
  choose(logits[logits.size(0) - 1]);
}

void GenerationStream::choose(const torch::Tensor& device_row) {
  // Greedy decoding reads one id from a device; sampling and log-probs read the row.
  const bool reads_row = options_.temperature > 0 || options_.top_logprobs >= 0;
  const torch::Tensor row = reads_row ? device_row.to(torch::kCPU) : device_row;
  int next;
  if (options_.temperature > 0) {
    auto p = torch::softmax(row.to(torch::kFloat64) / options_.temperature, -1).contiguous();
    std::uniform_real_distribution<double> uniform(0.0, 1.0);
    double u = uniform(rng_), cumulative = 0;
    const double* probs = p.data_ptr<double>();
    next = static_cast<int>(p.size(0)) - 1;
    for (int64_t v = 0; v < p.size(0); ++v)
      if ((cumulative += probs[v]) >= u) {
        next = static_cast<int>(v);
        break;
      }
  } else {
    next = static_cast<int>(row.argmax().item<int64_t>());
  }
  if (options_.top_logprobs >= 0) {
    auto logprobs = torch::log_softmax(row.to(torch::kFloat64), -1).contiguous();
    const double* values = logprobs.data_ptr<double>();
    out_.chosen.push_back({next, values[next]});
    out_.top.push_back(top_logprobs(values, static_cast<int>(logprobs.size(0)), std::max(1, options_.top_logprobs)));
  }
  done_ = true;  // unless this step goes on below
  if (next == model_.arch().eos_token_id && model_.arch().eos_token_id >= 0) {
    out_.finish = FinishReason::Eos;
    return;
  }
  out_.tokens.push_back(next);
  if (options_.on_token && !options_.on_token(next)) {
    out_.finish = FinishReason::Cancelled;
    return;
  }
  const Tokenizer* tokenizer = model_.tokenizer();
  if (tokenizer && !options_.stop.empty()) {
    std::string text = tokenizer->decode(out_.tokens);
    for (const auto& s : options_.stop)
      if (text.find(s) != std::string::npos) {
        out_.finish = FinishReason::Stop;
        return;
      }
  }
  if (++step_ == options_.max_new_tokens) return;
  if (model_.arch().positions == PositionKind::Learned && position_ + 1 > model_.arch().max_positions) return;
  ++position_;  // next() runs the chosen token at position_ - 1
  done_ = false;
}

Generation GenerationStream::result() {
  if (!done_) throw Error("internal: result() of an unfinished generation");
  if (const Tokenizer* tokenizer = model_.tokenizer()) {
    out_.text = tokenizer->decode(out_.tokens);
    size_t cut = std::string::npos;
    for (const auto& s : options_.stop) cut = std::min(cut, out_.text.find(s));
    if (cut != std::string::npos) out_.text = out_.text.substr(0, cut);
  }
  out_.kv = attention_->stats();
  add_prepass_cost(shape_, &out_.kv);
  return out_;
}

void GenerationStream::ask(const std::vector<int>& question, GenerateOptions options) {
  if (!done_) throw Error("internal: ask() before the previous answer is done");
  if (question.empty()) throw Error("a turn's question encodes to no tokens");
  // Every chosen token but the last has run; an EOS was chosen but never enters.
  std::vector<int> feed;
  if (out_.finish != FinishReason::Eos && !out_.tokens.empty()) feed.push_back(out_.tokens.back());
  feed.insert(feed.end(), question.begin(), question.end());
  if (model_.arch().positions == PositionKind::Learned && position_ + static_cast<int64_t>(feed.size()) > model_.arch().max_positions)
    throw Error("a turn's question of " + std::to_string(question.size()) + " tokens at position " +
                std::to_string(position_) + " passes the model's context of " +
                std::to_string(model_.arch().max_positions) + " tokens");
  prefill_.clear();
  for (size_t i = 0; i < feed.size(); ++i) prefill_.push_back({{feed[i]}, position_ + static_cast<int>(i), attention_.get()});
  prefill_next_ = 0;
  position_ += static_cast<int>(feed.size());
  options.question_tokens = 0;
  options.stream = false;
  options_ = std::move(options);
  rng_.seed(options_.seed);
  out_ = Generation{};
  step_ = 0;
  done_ = false;
}

bool GenerationStream::continue_from(const GenerationStream& context) {
  if (prefill_next_ != 0 || step_ != 0 || context.prefill_next_ != 1 || prefill_.size() != 2 ||
      context.prefill_.size() != 2)
    throw Error("internal: continue_from needs a context stream that ran its context block only, this one not started");
  if (!same_call(prefill_[0], context.prefill_[0]))
    throw Error("internal: continue_from a context whose model calls differ");
  std::unique_ptr<CacheAttention> fork = context.attention_->fork(shape_);
  if (!fork) return false;
  attention_ = std::move(fork);
  for (BatchSegment& piece : prefill_) piece.attention = attention_.get();
  prefill_next_ = 1;  // the context block's logits are not read: the answer starts after the question
  return true;
}

std::vector<Generation> generate_turns(const Model& model, const Policy& policy, const TurnsRequest& request,
                                       SharedContext protocol,
                                       const std::function<void(int, const GenerationStream&)>& after_turn,
                                       int64_t* calls_saved) {
  const size_t turns = request.questions.size();
  if (turns == 0) throw Error("a shared-context request needs at least one question");
  if (request.options.size() != turns) throw Error("internal: generate_turns needs one options entry per question");
  if (protocol == SharedContext::None) throw Error("internal: generate_turns needs multi-turn or multi-request");
  auto prompt_of = [&](size_t k) {
    if (request.questions[k].empty()) throw Error("question " + std::to_string(k + 1) + " encodes to no tokens");
    std::vector<int> prompt = request.context;
    prompt.insert(prompt.end(), request.questions[k].begin(), request.questions[k].end());
    return prompt;
  };
  auto options_of = [&](size_t k) {
    GenerateOptions options = request.options[k];
    options.question_tokens = static_cast<int>(request.questions[k].size());
    options.stream = false;
    return options;
  };
  std::vector<Generation> out;
  if (protocol == SharedContext::MultiTurn) {
    GenerationStream stream(model, policy, prompt_of(0), options_of(0));
    for (size_t k = 0; k < turns; ++k) {
      if (k > 0) stream.ask(request.questions[k], request.options[k]);
      run_alone(model, stream);
      if (after_turn) after_turn(static_cast<int>(k), stream);
      out.push_back(stream.result());
    }
    return out;
  }
  std::vector<std::unique_ptr<GenerationStream>> streams;
  for (size_t k = 0; k < turns; ++k)
    streams.push_back(std::make_unique<GenerationStream>(model, policy, prompt_of(k), options_of(k)));
  std::vector<char> started(turns, 0);
  for (size_t k = 0; k < turns; ++k) {
    GenerationStream& stream = *streams[k];
    if (!started[k]) {
      // The context block alone, then every later question of the group forks its cache.
      const BatchSegment segment = stream.next();
      stream.take(model.forward(segment.tokens, segment.start, *segment.attention));
      for (size_t j = k + 1; j < turns; ++j)
        if (!started[j] && streams[j]->continue_from(stream)) {
          started[j] = 1;
          if (calls_saved) ++*calls_saved;
        }
    }
    run_alone(model, stream);
    if (after_turn) after_turn(static_cast<int>(k), stream);
    out.push_back(stream.result());
  }
  return out;
}

Generation generate(const Model& model, const Policy& policy, const std::vector<int>& prompt,
                    const GenerateOptions& options) {
  GenerationStream stream(model, policy, prompt, options);
  run_alone(model, stream);
  return stream.result();
}

std::vector<Generation> generate_batch(const Model& model, const Policy& policy,
                                       const std::vector<std::vector<int>>& prompts,
                                       const std::vector<GenerateOptions>& options, int batch_size,
                                       const std::function<void(int)>& finished) {
  if (prompts.size() != options.size()) throw Error("internal: generate_batch needs one options entry per prompt");
  std::vector<Generation> results(prompts.size());
  run_batched(
      model, static_cast<int>(prompts.size()), batch_size,
      [&](int i) { return std::make_unique<GenerationStream>(model, policy, prompts[i], options[i]); },
      [&](int i, BatchStream& stream) {
        results[i] = static_cast<GenerationStream&>(stream).result();
        if (finished) finished(i);
      });
  return results;
}

}  // namespace kvevict
