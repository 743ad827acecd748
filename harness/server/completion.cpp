#include "harness/server/completion.h"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <condition_variable>
#include <mutex>

#include "harness/common/errors.h"
#include "harness/eval/joint_request.h"
#include "policies/registry.h"

namespace kvevict::server {

namespace {

// The text one token adds after `before` (a few tokens of left context are enough for a
// SentencePiece piece's leading space and a multi-byte character's byte pieces).
std::string token_text(const Tokenizer& tokenizer, const std::vector<int>& ids, size_t at, int token) {
  constexpr size_t kContext = 4;
  const size_t from = at > kContext ? at - kContext : 0;
  std::vector<int> window(ids.begin() + from, ids.begin() + at);
  const std::string before = tokenizer.decode(window);
  window.push_back(token);
  const std::string after = tokenizer.decode(window);
  if (after.compare(0, before.size(), before) == 0) return after.substr(before.size());
  return tokenizer.decode({token});
}

// The generated text: detokenize(prompt + new) after detokenize(prompt), so a completion's
// leading space survives; the new tokens decoded alone when the prompt's text is not a prefix.
std::string completion_text(const Tokenizer& tokenizer, const std::vector<int>& prompt, const std::string& prompt_text,
                            const std::vector<int>& generated) {
  if (generated.empty()) return "";
  std::vector<int> joint = prompt;
  joint.insert(joint.end(), generated.begin(), generated.end());
  const std::string text = tokenizer.decode(joint);
  if (text.compare(0, prompt_text.size(), prompt_text) == 0) return text.substr(prompt_text.size());
  return tokenizer.decode(generated);
}

// Cuts `text` before the first stop string; true when one was found.
bool cut_at_stop(std::string& text, const std::vector<std::string>& stop) {
  size_t cut = std::string::npos;
  for (const auto& s : stop) cut = std::min(cut, text.find(s));
  if (cut == std::string::npos) return false;
  text.resize(cut);
  return true;
}

// Sends a growing completion as it is generated: what precedes a stop string already in
// it, else all but what a stop string could still cut (its length - 1 bytes), and never a
// trailing replacement character (a multi-byte character whose next byte piece has not
// come yet). So the pieces sent add up to the plain answer's text.
class StreamedText {
 public:
  StreamedText(const TextSink& sink, int index, const std::vector<std::string>& stop)
      : sink_(sink), index_(index), stop_(stop) {
    for (const auto& s : stop) hold_ = std::max(hold_, s.size() - 1);
  }
  bool update(std::string text, bool final) {
    if (!sink_) return true;
    if (!final) {
      if (!cut_at_stop(text, stop_)) text.resize(text.size() > hold_ ? text.size() - hold_ : 0);
      static const std::string kReplacement = "\xEF\xBF\xBD";
      while (text.size() >= kReplacement.size() && text.compare(text.size() - 3, 3, kReplacement) == 0) text.resize(text.size() - 3);
    }
    if (text.size() <= sent_.size() || text.compare(0, sent_.size(), sent_) != 0) return true;
    const std::string delta = text.substr(sent_.size());
    sent_ = text;
    return sink_(index_, delta);
  }

 private:
  const TextSink& sink_;
  int index_;
  const std::vector<std::string>& stop_;
  size_t hold_ = 0;
  std::string sent_;
};

// A generation run in the batch whose new tokens reach on_token on this (the request's)
// thread: the batcher's thread only queues them, so a slow client never holds up its batch
// neighbours. Once on_token says false (the client has gone) the stream stops at its next
// token and leaves the batch.
Generation generate_in_batch(StreamBatcher& batcher, const Model& model, const Policy& policy,
                             const std::vector<int>& prompt, GenerateOptions options,
                             const std::function<bool(int)>& on_token) {
  struct Channel {
    std::mutex mutex;
    std::condition_variable changed;
    std::vector<int> tokens;  // made, not yet handed to on_token
    bool ended = false;
    std::exception_ptr error;
    std::atomic<bool> cancelled{false};
  } channel;
  // Notified under the lock: once it is released the request thread may return and end
  // the channel.
  options.on_token = [&channel](int token) {
    std::lock_guard<std::mutex> lock(channel.mutex);
    channel.tokens.push_back(token);
    channel.changed.notify_one();
    return !channel.cancelled.load();
  };
  GenerationStream stream(model, policy, prompt, std::move(options));
  batcher.submit(stream, [&channel](std::exception_ptr error) {
    std::lock_guard<std::mutex> lock(channel.mutex);
    channel.ended = true;
    channel.error = error;
    channel.changed.notify_one();
  });
  for (bool ended = false; !ended;) {
    std::vector<int> tokens;
    {
      std::unique_lock<std::mutex> lock(channel.mutex);
      channel.changed.wait(lock, [&] { return channel.ended || !channel.tokens.empty(); });
      tokens.swap(channel.tokens);
      ended = channel.ended;
    }
    for (int token : tokens)
      if (!channel.cancelled && !on_token(token)) channel.cancelled = true;
  }
  if (channel.error) std::rethrow_exception(channel.error);
  return stream.result();
}

}  // namespace

double json_safe_logprob(double logprob) {
  if (std::isnan(logprob)) return -9999;
  if (std::isinf(logprob)) return logprob > 0 ? 0 : -9999;
  return std::max(logprob, -9999.0);
}

Completer::Completer(const Model& model, CompletionSettings settings)
    : model_(model), settings_(std::move(settings)) {
  std::shared_ptr<Policy> policy = make_policy(settings_.policy, settings_.policy_options);
  policy->check_options_taken([](const ParamSpec& p) { return p.cli_flag(); });
  check_policy_for_model(*policy, model_);
  policy_ = std::move(policy);
  model_.require_tokenizer();
  if (settings_.batch_size < 1) throw Error("--batch-size must be at least 1");
  if (settings_.batch_size > 1) batcher_ = std::make_unique<StreamBatcher>(model_, settings_.batch_size);
}

Completer::~Completer() = default;

std::optional<StreamBatcher::Stats> Completer::batch_stats() const {
  if (!batcher_) return std::nullopt;
  return batcher_->stats();
}

void Completer::run(BatchStream& stream) const {
  if (batcher_)
    batcher_->run(stream);
  else
    run_alone(model_, stream);
}

Completer::Prepared Completer::prepare(const CompletionRequest& request) const {
  const Tokenizer& tokenizer = model_.require_tokenizer();
  Prepared prepared;
  prepared.request = &request;
  prepared.policy = policy_;
  // The request's own policy, checked as the server's was.
  if (request.policy.replaces_policy) {
    const std::string name = request.policy.name.empty() ? settings_.policy : request.policy.name;
    try {
      std::shared_ptr<Policy> own = make_policy(name, request.policy.options);
      own->check_options_taken([](const ParamSpec& p) { return "kvevict." + p.key(); });
      check_policy_for_model(*own, model_);
      prepared.policy = std::move(own);
    } catch (const Error& e) {
      throw RequestError(400, e.what(), "kvevict");
    }
  }
  if (request.policy.context_tokens >= 0 && settings_.protocol != Protocol::PrefillCompress)
    throw RequestError(400,
                       "\"kvevict.context_tokens\" applies only under --protocol prefill-compress; this server runs "
                       "stream, which compresses from the prompt's first token",
                       "kvevict.context_tokens");
  const bool prompt_logprobs = request.echo && request.logprobs >= 0;
  const bool scores_only = prompt_logprobs && (request.max_tokens == 0 || (request.max_tokens == 1 && request.temperature == 0));
  if (request.max_tokens > 0 && !scores_only && !prepared.policy->realisable())
    throw RequestError(400,
                       "policy " + prepared.policy->name() +
                           " is a whole-sequence simulation: it scores prompts (echo with logprobs and max_tokens 0, "
                           "or 1 at temperature 0) but cannot generate",
                       "max_tokens");
  if (request.stream && request.logprobs >= 0)
    throw RequestError(400, "\"logprobs\" with \"stream\" is not supported: ask without stream", "stream");
  for (size_t i = 0; i < request.prompts.size(); ++i) {
    const Prompt& p = request.prompts[i];
    std::vector<int> ids = p.is_text ? tokenizer.encode(p.text) : p.ids;
    if (ids.empty())
      throw RequestError(400, "prompt[" + std::to_string(i) + "] encodes to no tokens: there is nothing to score", "prompt");
    check_prompt_length(static_cast<int>(ids.size()), static_cast<int>(i), request.max_tokens, settings_.limits);
    if (prompt_logprobs && settings_.protocol == Protocol::PrefillCompress) {
      if (request.policy.context_tokens < 0)
        throw RequestError(400,
                           "the server runs --protocol prefill-compress, which needs the context's length: give "
                           "\"kvevict\": {\"context_tokens\": n}",
                           "kvevict.context_tokens");
      if (request.policy.context_tokens >= static_cast<int>(ids.size()))
        throw RequestError(400,
                           "\"kvevict.context_tokens\" " + std::to_string(request.policy.context_tokens) +
                               " must be less than prompt[" + std::to_string(i) + "]'s " + std::to_string(ids.size()) +
                               " tokens",
                           "kvevict.context_tokens");
    }
    prepared.prompts.push_back(std::move(ids));
  }
  return prepared;
}

std::vector<Choice> Completer::complete(const Prepared& prepared, const TextSink& sink) const {
  const CompletionRequest& request = *prepared.request;
  // Prompts that are scored (lm-eval's loglikelihood requests: a document's choices in one
  // request) share their context in decode mode, as eval's do (SharedContextStream): the
  // same numbers, the common calls run once. A prompt the policy refuses is scored alone
  // below, where its error names it.
  // In sim mode, with a batcher, the prompts' passes join the batch together instead.
  std::vector<SequenceScore> scored;
  const bool scores_prompts = request.echo && request.logprobs >= 0 && prepared.prompts.size() > 1;
  if (scores_prompts && (settings_.mode == Mode::Decode || batcher_)) {
    const int context_tokens = settings_.protocol == Protocol::PrefillCompress ? request.policy.context_tokens : 0;
    std::vector<ScoreRequest> passes;
    for (const std::vector<int>& prompt : prepared.prompts)
      passes.push_back(joint_score_request(model_, settings_.protocol, prompt, context_tokens, 0,
                                           std::max(1, request.logprobs)));
    try {
      if (settings_.mode == Mode::Decode) {
        SharedContextStream shared(model_, *prepared.policy, settings_.mode, passes, true);
        run(shared);
        scored = shared.results();
      } else {
        std::vector<std::unique_ptr<ScoreStream>> streams;  // [prompts]
        std::vector<BatchStream*> running;
        for (const ScoreRequest& pass : passes) {
          streams.push_back(std::make_unique<ScoreStream>(model_, *prepared.policy, settings_.mode, pass));
          running.push_back(streams.back().get());
        }
        batcher_->run(running);
        for (auto& stream : streams) scored.push_back(stream->result());
      }
    } catch (const Error&) {
      scored.clear();
    }
  }
  std::vector<Choice> choices;
  for (size_t i = 0; i < prepared.prompts.size(); ++i) {
    try {
      choices.push_back(complete_one(*prepared.policy, request, prepared.prompts[i], static_cast<int>(i), sink,
                                     scored.empty() ? nullptr : &scored[i]));
    } catch (const Error& e) {
      // What the policy refuses for this sequence (a token budget longer than the prompt, ...).
      throw RequestError(400, "prompt[" + std::to_string(i) + "]: " + e.what(), "kvevict");
    }
  }
  return choices;
}

Choice Completer::complete_one(const Policy& policy, const CompletionRequest& request, const std::vector<int>& prompt,
                               int index, const TextSink& sink, const SequenceScore* prompt_score) const {
  const Tokenizer& tokenizer = model_.require_tokenizer();
  const int T = static_cast<int>(prompt.size());
  const int eos = model_.arch().eos_token_id;
  if (request.policy.context_tokens >= 0 && settings_.protocol != Protocol::PrefillCompress)
    throw RequestError(400,
                       "\"kvevict.context_tokens\" applies only under --protocol prefill-compress; this server runs "
                       "stream, which compresses from the prompt's first token",
                       "kvevict.context_tokens");
  const bool prompt_logprobs = request.echo && request.logprobs >= 0;
  const int top_k = std::max(1, request.logprobs);
  Choice choice;
  choice.prompt_tokens = T;
  choice.has_logprobs = request.logprobs >= 0;
  const std::string prompt_text = tokenizer.decode(prompt);
  StreamedText streamed(sink, index, request.stop);
  if (request.echo && sink && !sink(index, prompt_text)) return choice;

  // Entries: the token, its log-prob (NaN: none) and its row's top tokens.
  std::vector<int> entry_ids;
  std::vector<double> entry_logprobs;
  std::vector<std::vector<TokenLogprob>> entry_tops;
  SequenceScore scored;
  if (prompt_logprobs) {
    const int context_tokens = settings_.protocol == Protocol::PrefillCompress ? request.policy.context_tokens : 0;
    if (prompt_score) {
      scored = *prompt_score;
    } else {
      ScoreStream pass(model_, policy, settings_.mode,
                       joint_score_request(model_, settings_.protocol, prompt, context_tokens, 0, top_k));
      run(pass);
      scored = pass.result();
    }
    choice.kv_tokens_full = T;
    double kept = 0;
    for (int k : scored.kv.kept_per_layer) kept += k;
    choice.kv_tokens_kept = scored.kv.kept_per_layer.empty() ? 0 : kept / scored.kv.kept_per_layer.size();
    for (int i = 0; i < T; ++i) {
      entry_ids.push_back(prompt[i]);
      entry_logprobs.push_back(i == 0 ? std::nan("") : scored.next_token_logprob[i - 1]);
      entry_tops.push_back(i == 0 ? std::vector<TokenLogprob>{} : scored.top[i - 1]);
    }
  }

  std::vector<int> generated;  // without an EOS that ended generation
  bool stopped = false, ended_at_eos = false;
  if (request.max_tokens > 0 && prompt_logprobs && request.max_tokens == 1 && request.temperature == 0) {
    // The scoring pass's last row already holds the next token's distribution: the greedy
    // token and its log-prob come from the same numbers as the prompt's (lm-eval's
    // loglikelihood request asks exactly this).
    const TokenLogprob best = scored.top[T - 1].front();
    entry_ids.push_back(best.token);
    entry_logprobs.push_back(best.logprob);
    entry_tops.push_back(scored.top[T - 1]);
    if (best.token == eos && eos >= 0)
      stopped = ended_at_eos = true;
    else
      generated.push_back(best.token);
  } else if (request.max_tokens > 0) {
    GenerateOptions options;
    options.max_new_tokens = request.max_tokens;
    options.temperature = request.temperature;
    options.seed = request.seed;
    options.stop = request.stop;
    options.stream = settings_.protocol == Protocol::Stream;
    options.top_logprobs = request.logprobs >= 0 ? top_k : -1;
    std::vector<int> so_far;
    auto send = [&](int token) {
      so_far.push_back(token);
      return streamed.update(completion_text(tokenizer, prompt, prompt_text, so_far), false);
    };
    Generation g;
    if (batcher_ && sink) {
      g = generate_in_batch(*batcher_, model_, policy, prompt, std::move(options), send);
    } else {
      if (sink) options.on_token = send;
      GenerationStream stream(model_, policy, prompt, std::move(options));
      run(stream);
      g = stream.result();
    }
    generated = g.tokens;
    stopped = g.finish == FinishReason::Eos || g.finish == FinishReason::Stop;
    ended_at_eos = g.finish == FinishReason::Eos;
    if (choice.kv_tokens_full == 0) {
      choice.kv_tokens_full = T + static_cast<double>(g.tokens.size());
      double kept = 0;
      for (int k : g.kv.kept_per_layer) kept += k;
      choice.kv_tokens_kept = g.kv.kept_per_layer.empty() ? 0 : kept / g.kv.kept_per_layer.size();
    }
    for (size_t j = 0; j < g.chosen.size(); ++j) {
      entry_ids.push_back(g.chosen[j].token);
      entry_logprobs.push_back(g.chosen[j].logprob);
      entry_tops.push_back(g.top[j]);
    }
  }
  // Generated tokens, counting an EOS that ended generation.
  choice.completion_tokens = static_cast<int>(generated.size()) + (ended_at_eos ? 1 : 0);
  std::string completion = completion_text(tokenizer, prompt, prompt_text, generated);
  if (cut_at_stop(completion, request.stop)) stopped = true;
  choice.finish_reason = stopped ? "stop" : "length";
  streamed.update(completion, true);
  choice.text = request.echo ? prompt_text + completion : completion;

  if (choice.has_logprobs) {
    // Token texts over the whole sequence (prompt, then generated), so each one's leading
    // space is decided by what precedes it.
    std::vector<int> all = prompt;
    const size_t first_entry = prompt_logprobs ? 0 : prompt.size();
    for (size_t e = prompt_logprobs ? prompt.size() : 0; e < entry_ids.size(); ++e) all.push_back(entry_ids[e]);
    int64_t offset = prompt_logprobs ? 0 : static_cast<int64_t>(prompt_text.size());
    for (size_t e = 0; e < entry_ids.size(); ++e) {
      const size_t at = first_entry + e;
      const std::string text = token_text(tokenizer, all, at, entry_ids[e]);
      choice.tokens.push_back(text);
      choice.token_logprobs.push_back(entry_logprobs[e]);
      choice.text_offset.push_back(offset);
      offset += static_cast<int64_t>(text.size());
      std::vector<std::pair<std::string, double>> top;
      if (!std::isnan(entry_logprobs[e])) {
        // The top-k and the actual token, from the same row; two tokens with one text keep the
        // higher value (the first, as the list is sorted).
        auto add = [&](int token, double logprob) {
          const std::string key = token == entry_ids[e] ? text : token_text(tokenizer, all, at, token);
          for (const auto& kv : top)
            if (kv.first == key) return;
          top.emplace_back(key, logprob);
        };
        for (int r = 0; r < std::min<int>(request.logprobs, static_cast<int>(entry_tops[e].size())); ++r)
          add(entry_tops[e][r].token, entry_tops[e][r].logprob);
        add(entry_ids[e], entry_logprobs[e]);
      }
      choice.top_logprobs.push_back(std::move(top));
    }
  }
  return choice;
}

}  // namespace kvevict::server
