// RULER's frequent words extraction, "fwe" (scripts/data/synthetic/freq_words_extraction.py
// with alpha 2, coded words of 6 letters).
//
// A vocabulary of (length - 50) // 50 random 6-letter lowercase words (sorted, unique,
// shuffled); the first is replaced by "..." as noise. With scale n, the word of rank k
// appears int(n * k^-2 / zeta(2)) times; the words are shuffled and joined by spaces.
// Prompt: "Read the following coded text and track the frequency of each coded word.
// Find the three most frequently appeared coded words. {context}\nQuestion: Do not provide
// any explanation. Please ignore the dots '....'. What are the three most frequently
// appeared words in the above coded text?" and the answer prefix " Answer: According to
// the coded text above, the three most frequently appeared words are:". Units: the scale
// n. References: the words of ranks 2 to 4.
#include <algorithm>
#include <cmath>
#include <memory>
#include <set>

#include "harness/common/errors.h"
#include "tasks/long_context.h"

namespace kvevict {
namespace {

using namespace long_context;

constexpr int kTokensToGenerate = 50;
constexpr int kWordLength = 6;
constexpr int kAnswers = 3;
constexpr double kZeta2 = 1.6449340668482264;  // scipy.special.zeta(2.0) = pi^2 / 6

class RulerFwe : public LongContextRecipe {
 public:
  explicit RulerFwe(const LongContextSetup& setup) : vocab_size_((setup.options.length - kTokensToGenerate) / 50) {
    if (vocab_size_ < kAnswers + 1)
      throw Error(setup.task + ": length " + std::to_string(setup.options.length) + " gives a vocabulary of " +
                  std::to_string(vocab_size_) + " coded words ((length - 50) // 50, as RULER); it needs at least " +
                  std::to_string(kAnswers + 1));
    // The smallest scale at which ranks 2-4 appear and outnumber rank 5: below it the
    // three most frequent words are not defined.
    min_units_ = 1;
    auto defined = [&](int n) {
      const int fourth = count(n, kAnswers + 1);
      return fourth >= 1 && (vocab_size_ <= kAnswers + 1 || fourth > count(n, kAnswers + 2));
    };
    while (!defined(min_units_)) ++min_units_;
  }

  int tokens_to_generate() const override { return kTokensToGenerate; }
  int min_units() const override { return min_units_; }

  LongContextItem build(uint64_t seed, int units) const override {
    PythonRandom vocab_rng = stream(seed, "vocab");
    std::set<std::string> drawn;
    while (drawn.size() < static_cast<size_t>(vocab_size_))
      drawn.insert(random_letters(vocab_rng, "abcdefghijklmnopqrstuvwxyz", kWordLength));
    std::vector<std::string> vocab(drawn.begin(), drawn.end());  // sorted
    vocab_rng.shuffle(vocab);
    vocab[0] = "...";  // the top rank is noise

    std::vector<const std::string*> words;
    for (int k = 1; k <= vocab_size_; ++k)
      for (int c = count(units, k); c > 0; --c) words.push_back(&vocab[static_cast<size_t>(k - 1)]);
    PythonRandom text_rng = stream(seed, "text");
    text_rng.shuffle(words);

    LongContextItem item;
    item.context =
        "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
        "appeared coded words. ";
    for (size_t i = 0; i < words.size(); ++i) item.context += (i ? " " : "") + *words[i];
    item.context += "\n";
    item.question =
        "Question: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently "
        "appeared words in the above coded text? Answer: According to the coded text above, the three most "
        "frequently appeared words are:";
    item.references.assign(vocab.begin() + 1, vocab.begin() + 1 + kAnswers);
    item.haystack = "coded";
    return item;
  }

 private:
  // numpy: (num_words * (k ** -alpha) / zeta(alpha)).astype(int).
  static int count(int n, int rank) {
    return static_cast<int>(static_cast<double>(n) * std::pow(static_cast<double>(rank), -2.0) / kZeta2);
  }

  int vocab_size_;
  int min_units_ = 1;
};

}  // namespace

std::unique_ptr<Task> make_ruler_fwe_task() {
  return make_long_context_task(
      "ruler_fwe", [](const LongContextSetup& setup) { return std::make_unique<RulerFwe>(setup); },
      LongContextScoring::RulerStringMatch);
}

}  // namespace kvevict
