#include "harness/runtime/scorer.h"

#include <algorithm>
#include <limits>

#include "harness/common/enum_names.h"
#include "harness/common/errors.h"

namespace kvevict {

SequenceShape shape_for(const Model& model, int length, int prefill_len) {
  SequenceShape shape;
  shape.length = length;
  shape.prefill_len = prefill_len;
  shape.n_layers = static_cast<int>(model.arch().n_layers);
  shape.n_q_heads = static_cast<int>(model.arch().n_heads);
  shape.n_kv_heads = static_cast<int>(model.arch().n_kv_heads);
  shape.head_dim = static_cast<int>(model.arch().head_dim);
  return shape;
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

void run_batched(const Model& model, int count, int batch_size,
                 const std::function<std::unique_ptr<BatchStream>(int)>& make,
                 const std::function<void(int, BatchStream&)>& finished) {
  if (batch_size < 1) throw Error("batch size " + std::to_string(batch_size) + " must be at least 1");
  std::vector<std::pair<int, std::unique_ptr<BatchStream>>> active;  // [<= batch_size]: index, stream
  int waiting = 0;  // the next stream to join
  auto retire_finished = [&] {
    std::vector<std::pair<int, std::unique_ptr<BatchStream>>> still;
    for (auto& entry : active) {
      if (entry.second->done())
        finished(entry.first, *entry.second);
      else
        still.push_back(std::move(entry));
    }
    active = std::move(still);
  };
  while (waiting < count || !active.empty()) {
    while (static_cast<int>(active.size()) < batch_size && waiting < count) {
      active.emplace_back(waiting, make(waiting));
      ++waiting;
    }
    retire_finished();  // a stream with nothing to run (none today) ends at once
    if (active.empty()) continue;
    std::vector<BatchSegment> segments;  // [active]
    for (auto& entry : active) segments.push_back(entry.second->next());
    const std::vector<torch::Tensor> logits = model.forward_batch(segments);
    for (size_t i = 0; i < active.size(); ++i) active[i].second->take(logits[i]);
    retire_finished();
  }
}

ScoreStream::ScoreStream(const Model& model, const Policy& policy, Mode mode, ScoreRequest request)
    : request_(std::move(request)) {
  const std::vector<int>& tokens = request_.tokens;
  if (tokens.empty()) throw Error("nothing to score: the token sequence is empty");
  const int T = static_cast<int>(tokens.size());
  const int prefill_len = request_.prefill_len;
  SequenceShape shape = shape_for(model, request_.budget_length > 0 ? request_.budget_length : T, prefill_len);
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
    pieces_.push_back({std::vector<int>(tokens.begin(), tokens.begin() + block), 0, cache_.get()});
    done = block;
  }
  for (; done < T; ++done) pieces_.push_back({{tokens[done]}, done, cache_.get()});
}

void ScoreStream::take(const torch::Tensor& logits) {
  rows_.push_back(logits);
  ++next_;
}

SequenceScore ScoreStream::result() {
  if (!done()) throw Error("internal: result() of an unfinished score");
  const std::vector<int>& tokens = request_.tokens;
  const int T = static_cast<int>(tokens.size());
  torch::Tensor logits = rows_.size() == 1 ? rows_.front() : torch::cat(rows_, 0);
  rows_.clear();
  SequenceScore result;
  result.kv = sim_ ? sim_->stats() : cache_->stats();
  auto argmax = logits.argmax(-1).contiguous();
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

SequenceScore score_sequence(const Model& model, const Policy& policy, Mode mode,
                             const std::vector<int>& tokens, int prefill_len, int budget_length,
                             int final_target, int first_logprob, int top_k) {
  ScoreStream stream(model, policy, mode, {tokens, prefill_len, budget_length, final_target, first_logprob, top_k});
  while (!stream.done()) {
    const BatchSegment segment = stream.next();
    stream.take(model.forward(segment.tokens, segment.start, *segment.attention));
  }
  return stream.result();
}

std::vector<SequenceScore> score_batch(const Model& model, const Policy& policy, Mode mode,
                                       const std::vector<ScoreRequest>& requests, int batch_size,
                                       const std::function<void(int)>& finished) {
  const int n = static_cast<int>(requests.size());
  std::vector<int> order(n);  // longest first; equal lengths in request order
  for (int i = 0; i < n; ++i) order[i] = i;
  std::stable_sort(order.begin(), order.end(),
                   [&](int a, int b) { return requests[a].tokens.size() > requests[b].tokens.size(); });
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
  SequenceShape shape = shape_for(model, P - Q, options_.stream ? 0 : P - Q);
  shape.question_len = Q;
  policy.validate(shape);
  check_kv_quant_head_dim(policy.options().kv_quant, model.arch().head_dim);
  attention_ = std::make_unique<CacheAttention>(model, policy, shape);
  if (options_.stream && evicting) {
    for (int i = 0; i < P; ++i) prefill_.push_back({{prompt[i]}, i, attention_.get()});
  } else if (Q > 0) {
    // The context is compressed after its last row; the question's rows then attend the
    // compressed cache and enter it uncompressed.
    prefill_.push_back({std::vector<int>(prompt.begin(), prompt.end() - Q), 0, attention_.get()});
    prefill_.push_back({std::vector<int>(prompt.end() - Q, prompt.end()), P - Q, attention_.get()});
  } else {
    prefill_.push_back({prompt, 0, attention_.get()});
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

void GenerationStream::choose(const torch::Tensor& row) {
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
  return out_;
}

Generation generate(const Model& model, const Policy& policy, const std::vector<int>& prompt,
                    const GenerateOptions& options) {
  GenerationStream stream(model, policy, prompt, options);
  while (!stream.done()) {
    const BatchSegment segment = stream.next();
    stream.take(model.forward(segment.tokens, segment.start, *segment.attention));
  }
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
