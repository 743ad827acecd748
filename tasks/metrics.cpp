#include "tasks/metrics.h"

#include <cmath>
#include <set>

#include "harness/common/errors.h"
#include "tasks/python_text.h"
#include "tasks/rouge.h"

namespace kvevict {
namespace {

size_t argmax(const std::vector<double>& values) {
  size_t best = 0;
  for (size_t i = 1; i < values.size(); ++i)
    if (values[i] > values[best]) best = i;  // strict: the first maximum wins
  return best;
}

void require_same_size(size_t a, size_t b, const std::string& what) {
  if (a != b)
    throw Error(what + ": " + std::to_string(a) + " vs " + std::to_string(b) + " documents");
}

}  // namespace

double choice_score(const LoglikelihoodResult& result, ScoreMode mode) {
  if (mode == ScoreMode::Sum) return result.sum_logprob;
  if (result.num_tokens <= 0) throw Error("mean log-likelihood of a continuation with no tokens");
  return result.sum_logprob / result.num_tokens;
}

ChoicePrediction predict_choice(const MultipleChoiceDoc& doc,
                                const std::vector<LoglikelihoodResult>& results, ScoreMode mode) {
  if (results.size() != doc.requests.size() || results.empty())
    throw Error("document " + doc.id + ": " + std::to_string(results.size()) + " results for " +
                std::to_string(doc.requests.size()) + " choices");
  if (doc.choice_texts.size() != results.size())
    throw Error("document " + doc.id + ": choice_texts and results differ in length");
  std::vector<double> scores, normalised;
  for (size_t i = 0; i < results.size(); ++i) {
    scores.push_back(choice_score(results[i], mode));
    // Python len() counts characters; a zero length divides to +-inf as in numpy.
    normalised.push_back(scores.back() / static_cast<double>(python_len(doc.choice_texts[i])));
  }
  ChoicePrediction p;
  p.predicted = static_cast<int>(argmax(scores));
  p.predicted_norm = static_cast<int>(argmax(normalised));
  p.chosen_loglikelihood = scores[p.predicted];
  return p;
}

MetricValue mean_metric(const std::string& name, const std::vector<double>& per_doc) {
  MetricValue m;
  m.name = name;
  m.n = static_cast<int>(per_doc.size());
  if (per_doc.empty()) return m;
  double sum = 0;
  for (double v : per_doc) sum += v;
  m.value = sum / per_doc.size();
  if (per_doc.size() >= 2) {
    double squares = 0;
    for (double v : per_doc) squares += (v - m.value) * (v - m.value);
    m.stderr_ =
        std::sqrt(squares / (per_doc.size() - 1)) / std::sqrt(static_cast<double>(per_doc.size()));
  }
  return m;
}

std::vector<MetricValue> multiple_choice_metrics(const std::vector<MultipleChoiceDoc>& docs,
                                                 const std::vector<ChoicePrediction>& predictions,
                                                 const std::vector<std::string>& names) {
  require_same_size(docs.size(), predictions.size(), "multiple_choice_metrics");
  std::vector<MetricValue> out;
  for (const auto& name : names) {
    if (name != "acc" && name != "acc_norm")
      throw Error("unknown multiple-choice metric \"" + name + "\"");
    std::vector<double> correct;
    for (size_t i = 0; i < docs.size(); ++i) {
      const int predicted =
          name == "acc" ? predictions[i].predicted : predictions[i].predicted_norm;
      correct.push_back(predicted == docs[i].gold ? 1.0 : 0.0);
    }
    out.push_back(mean_metric(name, correct));
  }
  return out;
}

double prediction_agreement(const std::vector<int>& a, const std::vector<int>& b) {
  require_same_size(a.size(), b.size(), "prediction_agreement");
  if (a.empty()) return 0;
  size_t same = 0;
  for (size_t i = 0; i < a.size(); ++i) same += a[i] == b[i];
  return static_cast<double>(same) / a.size();
}

double mean_abs_loglikelihood_change(const std::vector<ChoicePrediction>& policy,
                                     const std::vector<ChoicePrediction>& full) {
  require_same_size(policy.size(), full.size(), "mean_abs_loglikelihood_change");
  if (policy.empty()) return 0;
  double total = 0;
  for (size_t i = 0; i < policy.size(); ++i)
    total += std::fabs(policy[i].chosen_loglikelihood - full[i].chosen_loglikelihood);
  return total / policy.size();
}

namespace {
// The share of distinct n-grams among a text's n-grams.
std::optional<double> distinct_share(const std::vector<std::string>& words, int n) {
  if (n < 1 || static_cast<int>(words.size()) < n) return std::nullopt;
  std::set<std::vector<std::string>> seen;
  const size_t total = words.size() - n + 1;
  for (size_t i = 0; i < total; ++i) seen.insert(std::vector<std::string>(words.begin() + i, words.begin() + i + n));
  return static_cast<double>(seen.size()) / total;
}
}  // namespace

std::optional<double> distinct_n(const std::string& text, int n) {
  return distinct_share(rouge_tokenize(text, /*use_stemmer=*/false), n);
}

std::optional<double> repetition(const std::string& text) {
  auto distinct4 = distinct_share(rouge_tokenize(text, /*use_stemmer=*/false), 4);
  if (!distinct4) return std::nullopt;
  return 1.0 - *distinct4;
}

std::vector<MetricValue> diversity_metrics(const std::vector<std::string>& generations) {
  std::vector<double> d1, d2, d3, rep;
  for (const auto& text : generations) {
    if (auto v = distinct_n(text, 1)) d1.push_back(*v);
    if (auto v = distinct_n(text, 2)) d2.push_back(*v);
    if (auto v = distinct_n(text, 3)) d3.push_back(*v);
    if (auto v = repetition(text)) rep.push_back(*v);
  }
  return {mean_metric("distinct1", d1), mean_metric("distinct2", d2), mean_metric("distinct3", d3),
          mean_metric("repetition", rep)};
}

}  // namespace kvevict
