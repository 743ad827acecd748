#include "harness/eval/evaluator.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/common/enum_names.h"
#include "harness/common/atomic_file.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/eval/h2o_adaptor.h"
#include "harness/eval/joint_request.h"
#include "harness/eval/request_workers.h"
#include "tasks/long_context.h"
#include "policies/registry.h"

namespace kvevict {

namespace {

struct Usage {
  double kept_sum = 0;
  int requests = 0;
  int64_t peak = 0;
  int64_t peak_full = 0;  // the fp16 bytes of the request with the largest peak
  double merge_rate_sum = 0;  // DMC: each request's mean over layers
  int merge_rate_requests = 0;
  int64_t prepass_tokens = 0, prepass_context = 0;  // a policy's pre-pass, summed over requests
  double prepass_seconds = 0;
  void add(const KvStats& kv) {
    prepass_tokens += kv.prepass_tokens;
    prepass_context += kv.prepass_context;
    prepass_seconds += kv.prepass_seconds;
    if (!kv.dmc_merge_rate.empty()) {
      double rate = 0;
      for (double r : kv.dmc_merge_rate) rate += r;
      merge_rate_sum += rate / kv.dmc_merge_rate.size();
      ++merge_rate_requests;
    }
    double mean = 0;
    for (int k : kv.kept_per_layer) mean += k;
    kept_sum += kv.kept_per_layer.empty() ? 0 : mean / kv.kept_per_layer.size();
    ++requests;
    if (kv.peak_bytes > peak) peak_full = kv.peak_bytes_full;
    peak = std::max(peak, kv.peak_bytes);
  }
};

// lm-eval 0.3 loglikelihood: context and continuation encoded separately, one pass
// over (ctx+cont)[-(max_length+1):][:-1], the continuation's log-probs summed.
struct PreparedRequest {
  std::vector<int> whole;  // context + continuation, left-truncated
  int n_cont = 0;          // scored continuation tokens (the last n_cont of whole)
  ScoreRequest pass;       // the pass under the protocol
};

PreparedRequest prepare_request(const Model& model, const EvalConfig& config, const LoglikelihoodRequest& request,
                                bool bos) {
  const Tokenizer& tokenizer = model.require_tokenizer();
  std::vector<int> context = model.encode(request.context, bos);
  std::vector<int> continuation = tokenizer.encode(request.continuation);
  if (continuation.empty()) throw Error("continuation \"" + request.continuation + "\" encodes to no tokens");
  if (context.empty()) {
    // lm-eval scores an empty context after the end-of-text token.
    const int eot = model.arch().eos_token_id >= 0 ? model.arch().eos_token_id : model.arch().bos_token_id;
    context.push_back(eot);
  }
  PreparedRequest prepared;
  std::vector<int>& whole = prepared.whole;
  whole = context;
  whole.insert(whole.end(), continuation.begin(), continuation.end());
  if (static_cast<int>(whole.size()) > config.max_length + 1)
    whole.erase(whole.begin(), whole.end() - (config.max_length + 1));
  const int input = static_cast<int>(whole.size()) - 1;
  // A continuation longer than the window is scored on its last max_length tokens.
  prepared.n_cont = std::min<int>(static_cast<int>(continuation.size()), input);
  const int n_ctx = input - prepared.n_cont + 1;  // input tokens before the first scored one
  // Only the continuation's log-probs are read (entries first - 1 on, see below).
  const int first_logprob = static_cast<int>(whole.size()) - prepared.n_cont - 1;
  prepared.pass = joint_score_request(model, config.protocol, whole, n_ctx, first_logprob);
  return prepared;
}

LoglikelihoodResult loglikelihood_of(const PreparedRequest& prepared, const SequenceScore& score) {
  const std::vector<int>& whole = prepared.whole;
  LoglikelihoodResult result;
  result.num_tokens = prepared.n_cont;
  result.is_greedy = true;
  // Log-prob of whole[i+1] given whole[..i] is next_token_logprob[i] (the last one from
  // final_target); the continuation occupies the last n_cont positions of `whole`.
  const int first = static_cast<int>(whole.size()) - prepared.n_cont;
  for (int j = first; j < static_cast<int>(whole.size()); ++j) {
    result.sum_logprob += score.next_token_logprob[j - 1];
    if (score.argmax[j - 1] != whole[j]) result.is_greedy = false;
  }
  return result;
}

LoglikelihoodResult score_request(const Model& model, const Policy& policy, const EvalConfig& config,
                                  const LoglikelihoodRequest& request, bool bos, KvStats* kv) {
  const PreparedRequest prepared = prepare_request(model, config, request, bos);
  const ScoreRequest& p = prepared.pass;
  SequenceScore score = score_sequence(model, policy, config.mode, p.tokens, p.prefill_len, p.budget_length,
                                       p.final_target, p.first_logprob, p.top_k);
  *kv = score.kv;
  return loglikelihood_of(prepared, score);
}

// The H2O adaptor has no BOS and evicts from the first token of the joint request
// (multiple choice) or prefills the prompt (XSum): say so instead of running something else.
void check_pipeline(const EvalConfig& config, TaskKind kind) {
  if (config.task_options.pipeline != Pipeline::H2O) return;
  if (config.bos.value_or(false)) throw Error("--pipeline h2o runs without BOS (the adaptor's add_special_tokens=False); drop --bos");
  if (kind == TaskKind::MultipleChoice && config.protocol != Protocol::Stream)
    throw Error("--pipeline h2o scores multiple choice with the stream protocol (budgets from the joint length); "
                "--protocol prefill-compress needs --pipeline lm-eval");
  if (kind == TaskKind::Perplexity) throw Error("--pipeline h2o has no perplexity task; use --pipeline lm-eval");
}

// Lengths, depths and the question mode belong to the long-context tasks; the agnostic
// protocol is a way to prefill and compress.
void check_long_context(const EvalConfig& config, const Task& task) {
  const TaskOptions& o = config.task_options;
  if (!task.long_context()) {
    if (o.length > 0) throw Error("--length applies to the long-context tasks (ruler_*, niah), not " + config.task);
    if (o.depth) throw Error("--depth applies to niah, not " + config.task);
    if (config.question != QuestionMode::Aware)
      throw Error("--question agnostic needs a task that separates its context from its question (ruler_*, niah); " +
                  config.task + " does not");
    return;
  }
  if (config.question == QuestionMode::Agnostic && config.protocol != Protocol::PrefillCompress)
    throw Error("--question agnostic compresses the context before the question is seen: it needs --protocol "
                "prefill-compress");
}

// SCBench's shared-context evaluation: several questions of one compressed context.
void check_shared_context(const EvalConfig& config, const Task& task) {
  const int turns = config.task_options.turns;
  const bool shared = config.shared_context != SharedContext::None;
  if (turns < 0) throw Error("--turns " + std::to_string(turns) + " must be at least 1");
  if (turns == 0 && !shared) return;
  if (turns == 0) throw Error("--shared-context needs --turns N: the questions to ask of each context");
  if (!shared) throw Error("--turns needs --shared-context multi-turn or multi-request");
  if (!task.long_context() || task.kind() != TaskKind::Generation)
    throw Error("--turns asks several questions of one long context: it applies to the ruler_niah_* tasks, not " +
                config.task);
  if (config.question != QuestionMode::Agnostic || config.protocol != Protocol::PrefillCompress)
    throw Error("--shared-context compresses the context once, before any question is seen: it needs --protocol "
                "prefill-compress --question agnostic");
  if (config.task_options.pipeline == Pipeline::H2O)
    throw Error("--shared-context runs the lm-eval pipeline's prompts; drop --pipeline h2o");
}

// Each document's turns under config.shared_context (generate_turns), one document at a
// time per request worker: RULER's string match per turn, and over every turn.
void run_turns(const Model& model, const Policy& policy, const EvalConfig& config, const std::vector<GenerationDoc>& docs, bool bos, const Progress& progress, EvalResult& result,
               Usage& usage) {
  const int turns = config.task_options.turns;
  for (const GenerationDoc& doc : docs)
    if (static_cast<int>(doc.turns.size()) < turns)
      throw Error("--turns " + std::to_string(turns) + ": " + config.task + " item " + doc.id + " asks " +
                  std::to_string(doc.turns.size()) + " question" + (doc.turns.size() == 1 ? "" : "s") +
                  " of its context");
  std::vector<std::vector<Generation>> answers(docs.size());
  for_each_request(static_cast<int>(docs.size()), model.request_workers(), [&](int d) {
    const GenerationDoc& doc = docs[d];
    const std::string context_text = doc.prompt.substr(0, *doc.question_offset);
    const std::vector<int> context = model.encode(context_text, bos);
    TurnsRequest request;
    int64_t conversation = 0;
    for (int k = 0; k < turns; ++k) {
      // A question's tokens start where its prompt stops sharing the context's alone, as
      // the single-question agnostic protocol splits a prompt (run()'s prepare).
      const std::vector<int> prompt = model.encode(context_text + doc.turns[k].question, bos);
      size_t shared = 0;
      while (shared < context.size() && shared < prompt.size() && context[shared] == prompt[shared]) ++shared;
      shared = std::max<size_t>(shared, 1);
      if (k == 0) request.context.assign(prompt.begin(), prompt.begin() + shared);
      if (!std::equal(request.context.begin(), request.context.end(), prompt.begin(), prompt.begin() + shared) ||
          shared != request.context.size())
        throw Error(config.task + " item " + doc.id + ": question " + std::to_string(k + 1) +
                    " changes the tokens of the context it follows; its questions cannot share one context");
      request.questions.emplace_back(prompt.begin() + shared, prompt.end());
      GenerateOptions options;
      options.max_new_tokens = doc.turns[k].max_new_tokens;
      options.stop = doc.stop;
      options.temperature = config.greedy ? 0 : doc.temperature.value_or(config.temperature);
      options.seed = config.sample_seed + d;
      request.options.push_back(options);
      conversation += static_cast<int64_t>(request.questions.back().size()) + options.max_new_tokens;
    }
    conversation += static_cast<int64_t>(request.context.size());
    const int64_t limit = model.arch().max_positions;
    if (config.shared_context == SharedContext::MultiTurn && conversation > limit)
      throw Error(config.task + " item " + doc.id + ": its " + std::to_string(turns) + " turns take up to " +
                  std::to_string(conversation) + " tokens, beyond the model's context of " + std::to_string(limit) +
                  " tokens (--length " + std::to_string(config.task_options.length) + ")");
    answers[d] = generate_turns(model, policy, request, config.shared_context);
  }, [&](int done) { if (progress) progress(done, static_cast<int>(docs.size())); });

  std::vector<std::vector<double>> all_turns(turns), part_turns(turns);
  std::vector<double> all, part;
  for (size_t d = 0; d < docs.size(); ++d) {
    DocOutcome outcome;
    outcome.id = docs[d].id;
    outcome.long_context = docs[d];
    double sum = 0;
    for (int k = 0; k < turns; ++k) {
      const Generation& g = answers[d][k];
      // The multi-turn cache's last counts are the whole conversation's; each request's its own.
      if (config.shared_context == SharedContext::MultiRequest || k + 1 == turns) usage.add(g.kv);
      const std::string answer = ruler_postprocess(g.text);
      const std::vector<std::string>& references = docs[d].turns[k].references;
      const double score = 100 * string_match_all_fraction(answer, references);
      all_turns[k].push_back(score);
      part_turns[k].push_back(100 * string_match_part_fraction(answer, references));
      all.push_back(score);
      part.push_back(part_turns[k].back());
      sum += score;
      outcome.turn_answers.push_back(g.text);
      outcome.turn_scores.push_back(score);
      // Agreement with the full cache: every turn's answer the same.
      outcome.generated += (k ? "\n" : "") + g.text;
    }
    outcome.score = sum / turns;
    result.docs.push_back(outcome);
  }
  result.metrics = {mean_metric("string_match_all", all), mean_metric("string_match_part", part)};
  for (int k = 0; k < turns; ++k)
    for (MetricValue metric : {mean_metric("string_match_all", all_turns[k]),
                               mean_metric("string_match_part", part_turns[k])}) {
      metric.turn = k + 1;
      result.metrics.push_back(metric);
    }
  if (!docs.empty()) result.haystack = docs.front().haystack;
  result.n = static_cast<int>(docs.size());
}

EvalResult run(const Model& model, const EvalConfig& config, const Progress& progress) {
  auto started = std::chrono::steady_clock::now();
  auto task = make_task(config.task);
  auto policy = make_policy(config.policy, config.policy_options);
  EvalResult result;
  Usage usage;

  check_pipeline(config, task->kind());
  check_shared_context(config, *task);
  check_long_context(config, *task);
  const int batch = config.batch_size > 0 ? config.batch_size : default_batch_size(model);
  if (task->kind() == TaskKind::MultipleChoice) {
    const bool bos = config.bos.value_or(false);
    auto docs = task->multiple_choice_docs(config.task_options);
    // Each document is scored into its own slot (possibly on several threads), then
    // everything is gathered in document order, as a serial loop would.
    std::vector<std::vector<LoglikelihoodResult>> doc_answers(docs.size());
    std::vector<std::vector<KvStats>> doc_kv(docs.size());
    const bool h2o = config.task_options.pipeline == Pipeline::H2O;
    // Reuse shares model calls, which only decode mode makes one at a time.
    const bool reuse = config.context_reuse && config.mode == Mode::Decode && !h2o;
    if (reuse) {
      // A document's choices run as one SharedContextStream: their shared context once.
      std::vector<std::vector<PreparedRequest>> prepared(docs.size());
      std::vector<std::vector<ScoreRequest>> passes(docs.size());
      auto prepare_doc = [&](int d) {
        for (const auto& request : docs[d].requests) {
          prepared[d].push_back(prepare_request(model, config, request, bos));
          passes[d].push_back(prepared[d].back().pass);
        }
      };
      auto gather = [&](int d, const std::vector<SequenceScore>& scores) {
        for (size_t i = 0; i < scores.size(); ++i) {
          doc_answers[d].push_back(loglikelihood_of(prepared[d][i], scores[i]));
          doc_kv[d].push_back(scores[i].kv);
        }
      };
      if (batch > 1) {
        for (size_t d = 0; d < docs.size(); ++d) prepare_doc(static_cast<int>(d));
        int docs_done = 0;
        const auto scores = score_documents(model, *policy, config.mode, passes, batch, true, [&](int) {
          if (progress) progress(++docs_done, static_cast<int>(docs.size()));
        });
        for (size_t d = 0; d < docs.size(); ++d) gather(static_cast<int>(d), scores[d]);
      } else {
        for_each_request(static_cast<int>(docs.size()), model.request_workers(), [&](int d) {
          prepare_doc(d);
          gather(d, score_shared_context(model, *policy, config.mode, passes[d], true));
        }, [&](int done) { if (progress) progress(done, static_cast<int>(docs.size())); });
      }
    } else if (batch > 1 && !h2o) {
      // Every choice of every document is one sequence of the batch (score_batch: longest
      // first); a document is done when its last choice is.
      std::vector<PreparedRequest> prepared;
      std::vector<ScoreRequest> passes;
      std::vector<int> doc_of, left(docs.size());  // [requests]; [docs]: choices still running
      for (size_t d = 0; d < docs.size(); ++d)
        for (const auto& request : docs[d].requests) {
          prepared.push_back(prepare_request(model, config, request, bos));
          passes.push_back(prepared.back().pass);
          doc_of.push_back(static_cast<int>(d));
          ++left[d];
        }
      int docs_done = 0;
      for (size_t d = 0; d < docs.size(); ++d)
        if (left[d] == 0 && progress) progress(++docs_done, static_cast<int>(docs.size()));
      const std::vector<SequenceScore> scores = score_batch(model, *policy, config.mode, passes, batch, [&](int i) {
        if (--left[doc_of[i]] == 0 && progress) progress(++docs_done, static_cast<int>(docs.size()));
      });
      for (size_t i = 0; i < passes.size(); ++i) {
        doc_answers[doc_of[i]].push_back(loglikelihood_of(prepared[i], scores[i]));
        doc_kv[doc_of[i]].push_back(scores[i].kv);
      }
    } else
    for_each_request(static_cast<int>(docs.size()), model.request_workers(), [&](int d) {
      for (const auto& request : docs[d].requests) {
        KvStats kv;
        if (config.task_options.pipeline == Pipeline::H2O) {
          H2OScoredRequest scored = score_h2o_request(model, *policy, config.mode, request);
          kv = scored.kv;
          doc_answers[d].push_back(scored.result);
        } else {
          doc_answers[d].push_back(score_request(model, *policy, config, request, bos, &kv));
        }
        doc_kv[d].push_back(kv);
      }
    }, [&](int done) { if (progress) progress(done, static_cast<int>(docs.size())); });
    std::vector<ChoicePrediction> predictions;
    for (size_t d = 0; d < docs.size(); ++d) {
      for (const KvStats& kv : doc_kv[d]) usage.add(kv);
      const std::vector<LoglikelihoodResult>& answers = doc_answers[d];
      DocOutcome outcome;
      outcome.id = docs[d].id;
      outcome.gold = docs[d].gold;
      outcome.prediction = predict_choice(docs[d], answers, config.score);
      for (const auto& a : answers) outcome.choice_scores.push_back(choice_score(a, config.score));
      predictions.push_back(outcome.prediction);
      result.docs.push_back(outcome);
    }
    result.metrics = multiple_choice_metrics(docs, predictions, task->metric_names());
    result.n = static_cast<int>(docs.size());
  } else if (task->kind() == TaskKind::Generation && config.task_options.turns > 0) {
    if (!policy->realisable())
      throw Error("policy " + policy->name() + " is sim-only; generation needs a real cache");
    const bool bos = config.bos.value_or(true);
    const auto docs = task->generation_docs_for(model.require_tokenizer(), config.task_options);
    run_turns(model, *policy, config, docs, bos, progress, result, usage);
  } else if (task->kind() == TaskKind::Generation) {
    if (!policy->realisable())
      throw Error("policy " + policy->name() + " is sim-only; generation needs a real cache");
    const bool h2o = config.task_options.pipeline == Pipeline::H2O;
    const bool bos = config.bos.value_or(!h2o);
    const bool long_context = task->long_context();
    const bool agnostic = config.question == QuestionMode::Agnostic;
    auto docs = task->generation_docs_for(model.require_tokenizer(), config.task_options);
    // Sampling draws from a per-document seed, so documents can run on several threads
    // or in one batch.
    std::vector<Generation> generations(docs.size());
    std::vector<std::vector<int>> prompts(docs.size());
    std::vector<GenerateOptions> generate_options(docs.size());
    if (config.max_new_tokens > 0)
      for (GenerationDoc& doc : docs) doc.max_new_tokens = config.max_new_tokens;
    auto prepare = [&](int d) {
      std::vector<int> prompt = model.encode(docs[d].prompt, bos);
      int question_tokens = 0;
      if (long_context) {
        // A fitted prompt is never cut (a cut haystack would lose its needles), so the
        // limit is the model's context, not lm-eval's --max-length.
        const int64_t context = model.arch().max_positions;
        if (static_cast<int64_t>(prompt.size()) + docs[d].max_new_tokens > context)
          throw Error(config.task + " item " + docs[d].id + ": " + std::to_string(prompt.size()) + " prompt tokens plus " +
                      std::to_string(docs[d].max_new_tokens) + " to generate exceed the model's context of " +
                      std::to_string(context) + " tokens (--length " + std::to_string(config.task_options.length) + ")");
        // The question starts after the tokens the prompt shares with its context alone,
        // so both question modes run the same tokens.
        if (agnostic) {
          const std::vector<int> context = model.encode(docs[d].prompt.substr(0, *docs[d].question_offset), bos);
          size_t shared = 0;
          while (shared < context.size() && shared < prompt.size() && context[shared] == prompt[shared]) ++shared;
          question_tokens = static_cast<int>(prompt.size() - std::max<size_t>(shared, 1));
        }
      } else {
        const int room = config.max_length - docs[d].max_new_tokens;
        if (room < 1) throw Error("--max-length " + std::to_string(config.max_length) + " leaves no room for the prompt");
        if (static_cast<int>(prompt.size()) > room) prompt.erase(prompt.begin(), prompt.end() - room);
      }
      GenerateOptions options;
      options.question_tokens = question_tokens;
      options.max_new_tokens = docs[d].max_new_tokens;
      options.stop = docs[d].stop;
      options.temperature = docs[d].temperature.value_or(config.temperature);
      options.seed = config.sample_seed + d;
      options.stream = config.protocol == Protocol::Stream;
      if (h2o) {
        // utils_hh: the prompt runs with full attention, eviction only while decoding.
        options.stream = false;
      }
      if (config.greedy) options.temperature = 0;
      prompts[d] = std::move(prompt);
      generate_options[d] = std::move(options);
    };
    if (batch > 1) {
      for (size_t d = 0; d < docs.size(); ++d) prepare(static_cast<int>(d));
      int done = 0;
      generations = generate_batch(model, *policy, prompts, generate_options, batch, [&](int) {
        if (progress) progress(++done, static_cast<int>(docs.size()));
      });
    } else {
      for_each_request(static_cast<int>(docs.size()), model.request_workers(), [&](int d) {
        prepare(d);
        generations[d] = generate(model, *policy, prompts[d], generate_options[d]);
      }, [&](int done) { if (progress) progress(done, static_cast<int>(docs.size())); });
    }
    std::vector<std::string> generated;
    for (const Generation& generation : generations) generated.push_back(generation.text);
    // The long-context tasks score their answers themselves (RULER's string match, NIAH).
    const std::optional<GenerationScores> own = task->score_generations(docs, generated);
    std::vector<double> r1, r2, rl;
    for (size_t d = 0; d < docs.size(); ++d) {
      const Generation& generation = generations[d];
      usage.add(generation.kv);
      DocOutcome outcome;
      outcome.id = docs[d].id;
      outcome.generated = generation.text;
      outcome.reference = docs[d].reference;
      if (own) {
        outcome.score = own->per_doc.at(d);
        outcome.task_scored = true;
        if (long_context) outcome.long_context = docs[d];
      } else {
        outcome.rouge = rouge_scores(docs[d].reference, generation.text);
        r1.push_back(100 * outcome.rouge.rouge1);
        r2.push_back(100 * outcome.rouge.rouge2);
        rl.push_back(100 * outcome.rouge.rougeL);
      }
      result.docs.push_back(outcome);
    }
    if (own) {
      result.metrics = own->metrics;
      if (!docs.empty()) result.haystack = docs.front().haystack;
    } else {
      result.metrics = {mean_metric("rouge1", r1), mean_metric("rouge2", r2), mean_metric("rougeL", rl)};
      for (auto& m : diversity_metrics(generated)) result.metrics.push_back(m);
    }
    result.n = static_cast<int>(docs.size());
  } else {
    const std::string text = read_text_file(config.task_options.data_dir + "/" + config.text_file);
    std::vector<int> tokens = model.encode(text, config.bos.value_or(true));
    if (static_cast<int>(tokens.size()) > config.max_length) tokens.resize(config.max_length);
    const int prefill = config.protocol == Protocol::PrefillCompress ? static_cast<int>(tokens.size()) / 2 : 0;
    SequenceScore score = score_sequence(model, *policy, config.mode, tokens, prefill, prefill);
    usage.add(score.kv);
    std::vector<double> nll;
    for (size_t i = std::max(0, prefill - 1); i < score.next_token_logprob.size(); ++i)
      nll.push_back(-score.next_token_logprob[i]);
    MetricValue mean = mean_metric("mean_nll", nll);
    result.metrics = {mean, MetricValue{"ppl", std::exp(mean.value), 0, mean.n}};
    result.n = mean.n;
    if (progress) progress(1, 1);
  }
  result.kv_tokens_kept = usage.requests ? usage.kept_sum / usage.requests : 0;
  result.kv_bytes_peak = usage.peak;
  result.kv_bytes_full = usage.peak_full;
  if (usage.merge_rate_requests > 0) result.dmc_merge_rate = usage.merge_rate_sum / usage.merge_rate_requests;
  if (usage.prepass_context > 0) {
    result.prepass_token_ratio = static_cast<double>(usage.prepass_tokens) / static_cast<double>(usage.prepass_context);
    result.prepass_seconds = usage.prepass_seconds;
  }
  result.seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return result;
}

}  // namespace

int default_batch_size(const Model& model) {
  // A model that runs each op on one thread already runs whole requests on the threads
  // (request_workers); a bigger one on the CPU reads its weights once per step for 8 rows,
  // where the weight pass stops being bound by the memory bandwidth on the machines we
  // measured (README, Speed); a GPU takes more.
  if (model.runs_ops_on_one_thread()) return 1;
  return model.device().is_cpu() ? 8 : 32;
}

void check_eval_for_model(const Model& model, const EvalConfig& config, const std::string& length_key) {
  check_policy_for_model(*make_policy(config.policy, config.policy_options), model);
  const int64_t context = model.arch().max_positions;
  if (make_task(config.task)->long_context() && config.task_options.length > context)
    throw Error(length_key + " " + std::to_string(config.task_options.length) + " for " + config.task +
                " is longer than the model's context of " + std::to_string(context) +
                " tokens (config.json max_position_embeddings): a fitted prompt is never cut");
}

EvalResult evaluate(const Model& model, const EvalConfig& requested, const Progress& progress,
                    std::optional<EvalResult>* full_cache) {
  // Requests never exceed the model's context, as lm-eval's max_length.
  EvalConfig config = requested;
  if (config.max_length < 2)
    throw Error("max length " + std::to_string(config.max_length) + " must be at least 2 tokens");
  config.max_length = std::min<int>(config.max_length, static_cast<int>(model.arch().max_positions));
  // No request is longer than the model's context, so a ratio that keeps 0 tokens there never keeps one.
  check_eval_for_model(model, config);
  const int limit = config.task_options.limit;
  if (limit == 0 || limit < -1)
    throw Error("limit must be a positive number of documents (or -1 for all), got " + std::to_string(limit));
  EvalResult result = run(model, config, progress);
  // An accuracy over no documents is not a number to report.
  if (result.n == 0) throw Error("task " + config.task + " has no documents to evaluate");
  const TaskKind kind = make_task(config.task)->kind();
  if (is_reference_policy(config.policy) || !config.compare_with_full || kind == TaskKind::Perplexity) return result;
  std::optional<EvalResult> local;
  std::optional<EvalResult>& full = full_cache ? *full_cache : local;
  if (!full) {
    EvalConfig reference = config;
    reference.policy = reference_policy_name();
    reference.policy_options = PolicyOptions{};
    full = run(model, reference, {});
  }
  const auto& a = result.docs;
  const auto& b = full->docs;
  if (a.size() != b.size()) throw Error("internal: full-cache reference has a different document count");
  int same = 0;
  double change = 0;
  for (size_t i = 0; i < a.size(); ++i) {
    if (kind == TaskKind::MultipleChoice) {
      same += a[i].prediction.predicted == b[i].prediction.predicted;
      change += std::abs(a[i].prediction.chosen_loglikelihood - b[i].prediction.chosen_loglikelihood);
    } else {
      same += a[i].generated == b[i].generated;
    }
  }
  if (!a.empty()) {
    result.agreement_with_full = static_cast<double>(same) / a.size();
    if (kind == TaskKind::MultipleChoice) result.mean_abs_ll_change = change / a.size();
  }
  return result;
}

// Atomically: a reader never sees half the lines, and a symbolic link at `path` is
// replaced rather than written through.
void write_predictions(const EvalResult& result, const EvalConfig& config, const std::string& path) {
  std::string out;
  for (const auto& d : result.docs) {
    nlohmann::json j;
    j["task"] = config.task;
    j["policy"] = config.policy;
    j["id"] = d.id;
    if (d.gold >= 0) {
      j["gold"] = d.gold;
      j["predicted"] = d.prediction.predicted;
      j["predicted_norm"] = d.prediction.predicted_norm;
      j["scores"] = d.choice_scores;
      j["chosen_loglikelihood"] = d.prediction.chosen_loglikelihood;
    } else if (d.long_context) {
      const GenerationDoc& doc = *d.long_context;
      j["length"] = doc.length;
      if (doc.depth) j["depth"] = *doc.depth;
      j["haystack"] = doc.haystack;
      j["prompt_tokens"] = doc.prompt_tokens;
      j["prompt"] = doc.prompt;
      if (doc.question_offset) j["question"] = doc.prompt.substr(*doc.question_offset);
      j["references"] = doc.references;
      j["prediction"] = d.generated;
      j["score"] = d.score;
      for (size_t k = 0; k < d.turn_answers.size(); ++k)
        j["turns"].push_back({{"question", doc.turns.at(k).question},
                              {"references", doc.turns.at(k).references},
                              {"prediction", d.turn_answers[k]},
                              {"score", d.turn_scores[k]}});
    } else {
      j["prediction"] = d.generated;
      j["reference"] = d.reference;
      if (d.task_scored) {
        j["score"] = d.score;  // mathqa_cot: 1 when the answer letter is right
      } else {
        j["rouge1"] = d.rouge.rouge1;
        j["rouge2"] = d.rouge.rouge2;
        j["rougeL"] = d.rouge.rougeL;
      }
    }
    out += j.dump() + "\n";
  }
  write_file_atomically(path, out);
}

}  // namespace kvevict
