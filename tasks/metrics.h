// Turning per-choice log-likelihoods into predictions and metrics, the way
// lm-evaluation-harness 0.3 does (and the H2O pipeline's per-token-mean variant).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "tasks/task.h"

namespace kvevict {

// Sum: lm-eval's log-likelihood (sum over continuation tokens).
// Mean: the H2O pipeline's mean per-token log-prob; acc_norm then divides it again by
// the choice's character length.
enum class ScoreMode { Sum, Mean };

// One choice's score under `mode` (Error for Mean with no scored tokens).
double choice_score(const LoglikelihoodResult& result, ScoreMode mode);

struct ChoicePrediction {
  int predicted = 0;       // argmax of the scores (first on ties, as np.argmax)
  int predicted_norm = 0;  // argmax of score / len(choice_texts[i]) in characters (acc_norm)
  double chosen_loglikelihood = 0;  // score of `predicted`
};

// `results` holds one result per request of `doc`, in order.
ChoicePrediction predict_choice(const MultipleChoiceDoc& doc,
                                const std::vector<LoglikelihoodResult>& results, ScoreMode mode);

// Mean and lm-eval's standard error (sample stddev with n-1, over sqrt(n); 0 when n < 2).
MetricValue mean_metric(const std::string& name, const std::vector<double>& per_doc);

// "acc" and/or "acc_norm" (in the order of `names`) over parallel docs and predictions.
std::vector<MetricValue> multiple_choice_metrics(const std::vector<MultipleChoiceDoc>& docs,
                                                 const std::vector<ChoicePrediction>& predictions,
                                                 const std::vector<std::string>& names);

// Fraction of documents where two runs predicted the same choice.
double prediction_agreement(const std::vector<int>& a, const std::vector<int>& b);

// Mean |chosen_loglikelihood(policy) - chosen_loglikelihood(full)| over documents.
double mean_abs_loglikelihood_change(const std::vector<ChoicePrediction>& policy,
                                     const std::vector<ChoicePrediction>& full);

// Generation diversity, on rouge_score's tokens without stemming (lowercase, runs of
// [a-z0-9]). distinct-n of one text: distinct n-grams / all n-grams, nullopt when it has
// fewer than n words. repetition: the share of 4-grams that repeat an earlier 4-gram of
// the same text (Welleck et al.'s seq-rep-4, = 1 - distinct-4), nullopt below 4 words.
std::optional<double> distinct_n(const std::string& text, int n);
std::optional<double> repetition(const std::string& text);
// "distinct1", "distinct2", "distinct3", "repetition": means over the generations where
// each is defined (n counts them).
std::vector<MetricValue> diversity_metrics(const std::vector<std::string>& generations);

}  // namespace kvevict
