#include "tasks/rouge.h"

#include <algorithm>
#include <cstdint>
#include <unordered_map>

#include "tasks/porter_stemmer.h"

namespace kvevict {
namespace {

// Decodes one UTF-8 sequence at text[pos]; returns the code point and advances pos.
// Malformed bytes decode to U+FFFD, one byte at a time; they only ever act as separators.
uint32_t next_code_point(const std::string& text, size_t& pos) {
  auto byte = [&](size_t i) { return static_cast<unsigned char>(text[i]); };
  unsigned char lead = byte(pos);
  int length = lead < 0x80 ? 1 : (lead >> 5) == 0x6 ? 2 : (lead >> 4) == 0xE ? 3
                                 : (lead >> 3) == 0x1E ? 4 : 0;
  if (length == 0 || pos + length > text.size()) {
    ++pos;
    return 0xFFFD;
  }
  uint32_t cp = length == 1 ? lead : lead & (0x7F >> length);
  for (int k = 1; k < length; ++k) {
    unsigned char b = byte(pos + k);
    if ((b & 0xC0) != 0x80) {
      ++pos;
      return 0xFFFD;
    }
    cp = (cp << 6) | (b & 0x3F);
  }
  pos += length;
  // An overlong encoding must not smuggle in an ASCII letter; Python would reject it.
  if (length > 1 && cp < 0x80) return 0xFFFD;
  return cp;
}

// The harmonic mean in rouge_score's operation order, so results agree to the last bit.
double fmeasure(double precision, double recall) {
  if (precision + recall > 0) return 2 * precision * recall / (precision + recall);
  return 0.0;
}

std::unordered_map<std::string, int> count_ngrams(const std::vector<std::string>& tokens,
                                                  size_t n) {
  std::unordered_map<std::string, int> counts;
  for (size_t i = 0; i + n <= tokens.size(); ++i) {
    // Tokens hold only [a-z0-9], so a space joins them without ambiguity.
    std::string key = tokens[i];
    for (size_t k = 1; k < n; ++k) key.append(" ").append(tokens[i + k]);
    ++counts[key];
  }
  return counts;
}

double rouge_n_fmeasure(const std::vector<std::string>& reference,
                        const std::vector<std::string>& prediction, size_t n) {
  auto reference_counts = count_ngrams(reference, n);
  auto prediction_counts = count_ngrams(prediction, n);
  long overlap = 0, reference_total = 0, prediction_total = 0;
  for (const auto& [ngram, count] : reference_counts) {
    reference_total += count;
    auto found = prediction_counts.find(ngram);
    if (found != prediction_counts.end()) overlap += std::min(count, found->second);
  }
  for (const auto& entry : prediction_counts) prediction_total += entry.second;
  // rouge_score divides by max(total, 1): no n-grams on a side gives 0, not NaN.
  double precision = static_cast<double>(overlap) / std::max(prediction_total, 1L);
  double recall = static_cast<double>(overlap) / std::max(reference_total, 1L);
  return fmeasure(precision, recall);
}

size_t lcs_length(const std::vector<std::string>& a, const std::vector<std::string>& b) {
  std::vector<size_t> previous(b.size() + 1, 0), current(b.size() + 1, 0);
  for (size_t i = 1; i <= a.size(); ++i) {
    for (size_t j = 1; j <= b.size(); ++j) {
      current[j] = a[i - 1] == b[j - 1] ? previous[j - 1] + 1
                                        : std::max(previous[j], current[j - 1]);
    }
    std::swap(previous, current);
  }
  return previous[b.size()];
}

double rouge_l_fmeasure(const std::vector<std::string>& reference,
                        const std::vector<std::string>& prediction) {
  if (reference.empty() || prediction.empty()) return 0.0;
  double lcs = static_cast<double>(lcs_length(reference, prediction));
  return fmeasure(lcs / static_cast<double>(prediction.size()),
                  lcs / static_cast<double>(reference.size()));
}

}  // namespace

std::vector<std::string> rouge_tokenize(const std::string& text, bool use_stemmer) {
  std::vector<std::string> tokens;
  std::string current;
  auto finish_token = [&]() {
    if (current.empty()) return;
    tokens.push_back(use_stemmer && current.size() > 3 ? porter_stem(current) : current);
    current.clear();
  };
  size_t pos = 0;
  while (pos < text.size()) {
    uint32_t cp = next_code_point(text, pos);
    if (cp >= 'A' && cp <= 'Z') cp += 'a' - 'A';
    // Python's str.lower() maps exactly two non-ASCII code points into [a-z0-9]:
    // KELVIN SIGN -> "k", and LATIN CAPITAL I WITH DOT -> "i" + U+0307 (a separator).
    if (cp == 0x212A) cp = 'k';
    if (cp == 0x0130) {
      current.push_back('i');
      finish_token();
      continue;
    }
    if ((cp >= 'a' && cp <= 'z') || (cp >= '0' && cp <= '9')) {
      current.push_back(static_cast<char>(cp));
    } else {
      finish_token();
    }
  }
  finish_token();
  return tokens;
}

RougeScores rouge_scores(const std::string& reference, const std::string& prediction) {
  std::vector<std::string> reference_tokens = rouge_tokenize(reference);
  std::vector<std::string> prediction_tokens = rouge_tokenize(prediction);
  RougeScores scores;
  scores.rouge1 = rouge_n_fmeasure(reference_tokens, prediction_tokens, 1);
  scores.rouge2 = rouge_n_fmeasure(reference_tokens, prediction_tokens, 2);
  scores.rougeL = rouge_l_fmeasure(reference_tokens, prediction_tokens);
  return scores;
}

}  // namespace kvevict
