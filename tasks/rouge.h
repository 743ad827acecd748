// ROUGE-1/2/L F-measures with the semantics of google-research's rouge_score
// (RougeScorer(["rouge1", "rouge2", "rougeL"], use_stemmer=True)).
#pragma once
#include <string>
#include <vector>

namespace kvevict {

// rouge_score's tokenizer on UTF-8 text: lowercase, every run of characters outside
// [a-z0-9] becomes a space, split, and (use_stemmer) tokens longer than 3 characters
// are Porter-stemmed (NLTK mode). Empty tokens are dropped.
std::vector<std::string> rouge_tokenize(const std::string& text, bool use_stemmer = true);

struct RougeScores {
  double rouge1;  // F-measures in [0, 1]
  double rouge2;
  double rougeL;
};

// Scores `prediction` against `reference` (rouge_score's target). F = 2PR/(P+R), 0 when
// P+R == 0. ROUGE-N uses clipped n-gram counts and divides by max(count, 1), so an empty
// side gives 0; ROUGE-L is 0 when either side has no tokens.
RougeScores rouge_scores(const std::string& reference, const std::string& prediction);

}  // namespace kvevict
