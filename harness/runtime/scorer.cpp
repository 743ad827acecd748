#include "harness/runtime/scorer.h"

#include <algorithm>
#include <limits>
#include <random>

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

SequenceScore score_sequence(const Model& model, const Policy& policy, Mode mode,
                             const std::vector<int>& tokens, int prefill_len, int budget_length,
                             int final_target, int first_logprob, int top_k) {
  if (tokens.empty()) throw Error("nothing to score: the token sequence is empty");
  const int T = static_cast<int>(tokens.size());
  SequenceShape shape = shape_for(model, budget_length > 0 ? budget_length : T, prefill_len);
  policy.validate(shape);
  check_kv_quant_head_dim(policy.options().kv_quant, model.arch().head_dim);
  if (!policy.realisable() && prefill_len > 0)
    throw Error("policy " + policy.name() + " is a whole-sequence simulation: it supports only the stream protocol");

  torch::Tensor logits;
  SequenceScore result;
  if (mode == Mode::Sim) {
    SimAttention attention(model, policy, shape);
    logits = model.forward(tokens, 0, attention);
    result.kv = attention.stats();
  } else {
    CacheAttention attention(model, policy, shape);
    std::vector<torch::Tensor> rows;
    int done = 0;
    // A block is only valid while nothing is evicted: the prefill, or everything
    // when the policy keeps the full cache.
    // A quantized cache flushes between tokens, so it takes blocks only for the prefill too.
    const bool whole = policy.keeps_everything() && !policy.options().kv_quant.enabled();
    int block = whole ? T : std::min(prefill_len, T);
    if (block > 1) {
      rows.push_back(model.forward(std::vector<int>(tokens.begin(), tokens.begin() + block), 0, attention));
      done = block;
    }
    for (; done < T; ++done) rows.push_back(model.forward({tokens[done]}, done, attention));
    logits = torch::cat(rows, 0);
    result.kv = attention.stats();
  }
  auto argmax = logits.argmax(-1).contiguous();
  const int64_t* best = argmax.data_ptr<int64_t>();
  result.argmax.assign(best, best + T);
  // Log-softmax in float64, a block of rows at a time: a float64 copy of all T x vocab
  // logits would be the largest buffer of a long sequence.
  result.next_token_logprob.assign(T - 1, std::numeric_limits<double>::quiet_NaN());
  if (top_k > 0) result.top.resize(T);
  constexpr int kRowsPerBlock = 256;
  for (int r0 = std::clamp(first_logprob, 0, T - 1); r0 < T; r0 += kRowsPerBlock) {
    const int rows = std::min(kRowsPerBlock, T - r0);
    auto logprobs = torch::log_softmax(logits.narrow(0, r0, rows).to(torch::kFloat64), -1).contiguous();
    auto acc = logprobs.accessor<double, 2>();
    const int vocab = static_cast<int>(logprobs.size(1));
    for (int i = r0; i < r0 + rows; ++i) {
      if (top_k > 0) result.top[i] = top_logprobs(&acc[i - r0][0], vocab, top_k);
      if (i + 1 < T) result.next_token_logprob[i] = acc[i - r0][tokens[i + 1]];
      else if (final_target >= 0) result.next_token_logprob.push_back(acc[i - r0][final_target]);
    }
  }
  return result;
}

Generation generate(const Model& model, const Policy& policy, const std::vector<int>& prompt,
                    const GenerateOptions& options) {
  if (prompt.empty()) throw Error("generation needs at least one prompt token (BOS)");
  const int P = static_cast<int>(prompt.size());
  const bool evicting = !policy.keeps_everything() || policy.options().kv_quant.enabled();  // between tokens
  const int Q = options.question_tokens;
  if (Q < 0 || Q >= P || (Q > 0 && options.stream))
    throw Error("a question of " + std::to_string(Q) + " tokens cannot follow the compressed part of a " +
                std::to_string(P) + "-token prompt" + (options.stream ? " under the stream protocol" : ""));
  SequenceShape shape = shape_for(model, P - Q, options.stream ? 0 : P - Q);
  shape.question_len = Q;
  policy.validate(shape);
  check_kv_quant_head_dim(policy.options().kv_quant, model.arch().head_dim);
  CacheAttention attention(model, policy, shape);

  torch::Tensor last;
  if (options.stream && evicting) {
    for (int i = 0; i < P; ++i) last = model.forward({prompt[i]}, i, attention);
  } else if (Q > 0) {
    // The context is compressed after its last row; the question's rows then attend the
    // compressed cache and enter it uncompressed.
    model.forward(std::vector<int>(prompt.begin(), prompt.end() - Q), 0, attention);
    last = model.forward(std::vector<int>(prompt.end() - Q, prompt.end()), P - Q, attention);
  } else {
    last = model.forward(prompt, 0, attention);
  }
  std::mt19937_64 rng(options.seed);
  Generation out;
  const Tokenizer* tokenizer = model.tokenizer();
  int position = P;
  for (int step = 0; step < options.max_new_tokens; ++step) {
    auto row = last[last.size(0) - 1];
    int next;
    if (options.temperature > 0) {
      auto p = torch::softmax(row.to(torch::kFloat64) / options.temperature, -1).contiguous();
      std::uniform_real_distribution<double> uniform(0.0, 1.0);
      double u = uniform(rng), cumulative = 0;
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
    if (options.top_logprobs >= 0) {
      auto logprobs = torch::log_softmax(row.to(torch::kFloat64), -1).contiguous();
      const double* values = logprobs.data_ptr<double>();
      out.chosen.push_back({next, values[next]});
      out.top.push_back(top_logprobs(values, static_cast<int>(logprobs.size(0)), std::max(1, options.top_logprobs)));
    }
    if (next == model.arch().eos_token_id && model.arch().eos_token_id >= 0) {
      out.finish = FinishReason::Eos;
      break;
    }
    out.tokens.push_back(next);
    if (options.on_token && !options.on_token(next)) {
      out.finish = FinishReason::Cancelled;
      break;
    }
    if (tokenizer && !options.stop.empty()) {
      std::string text = tokenizer->decode(out.tokens);
      bool stopped = false;
      for (const auto& s : options.stop)
        if (text.find(s) != std::string::npos) stopped = true;
      if (stopped) {
        out.finish = FinishReason::Stop;
        break;
      }
    }
    if (step + 1 == options.max_new_tokens) break;
    if (model.arch().positions == PositionKind::Learned && position + 1 > model.arch().max_positions) break;
    last = model.forward({next}, position++, attention);
  }
  if (tokenizer) {
    out.text = tokenizer->decode(out.tokens);
    size_t cut = std::string::npos;
    for (const auto& s : options.stop) cut = std::min(cut, out.text.find(s));
    if (cut != std::string::npos) out.text = out.text.substr(0, cut);
  }
  out.kv = attention.stats();
  return out;
}

}  // namespace kvevict
