// RULER's common words extraction, "cwe" (scripts/data/synthetic/common_words_extraction.py
// with freq_cw 30, freq_ucw 3, num_cw 10, one example).
//
// Words come from wonderwords' nouns, adjectives and verbs (sorted, unique). An item
// draws `units` distinct words; the first 10 are the common ones, each listed 30 times,
// the rest 3 times (below 4096 tokens 6 and 1, as RULER does), shuffled and numbered
// "1. w 2. w ...". The prompt opens with one solved example (40 words, 10 and 3 times;
// below 4096 tokens 20 words, 3 and 1) and "\n", then "Below is a numbered list of
// words. In these words, some appear more often than others. Memorize the ones that
// appear most often.\n{context}\nQuestion: What are the 10 most common words in the above
// list?" and the answer prefix " Answer: The top 10 words that appear most often in the
// list are:". Units: distinct words. References: the 10 common words.
#include <algorithm>
#include <memory>

#include "tasks/long_context.h"

namespace kvevict {
namespace {

using namespace long_context;

constexpr int kCommonWords = 10;

struct ListShape {
  int common_repeats, uncommon_repeats;
};

class RulerCwe : public LongContextRecipe {
 public:
  explicit RulerCwe(const LongContextSetup& setup) {
    for (const char* file : {"nounlist.txt", "adjectivelist.txt", "verblist.txt"})
      for (auto& word : read_word_list(setup.options.data_dir, file)) words_.push_back(std::move(word));
    std::sort(words_.begin(), words_.end());
    words_.erase(std::unique(words_.begin(), words_.end()), words_.end());
    const bool short_context = setup.options.length < 4096;
    example_words_ = short_context ? 20 : 40;
    example_shape_ = short_context ? ListShape{3, 1} : ListShape{10, 3};
    shape_ = short_context ? ListShape{6, 1} : ListShape{30, 3};
  }

  int tokens_to_generate() const override { return 120; }
  int min_units() const override { return kCommonWords; }
  std::optional<int> max_units() const override { return static_cast<int>(words_.size()); }

  LongContextItem build(uint64_t seed, int units) const override {
    PythonRandom example_rng = stream(seed, "example");
    std::vector<size_t> example_pick = example_rng.sample(words_.size(), static_cast<size_t>(example_words_));
    const std::vector<std::string> example_common = common_of(example_pick);
    std::string example = task_text(numbered(listed(example_pick, example_shape_, example_rng))) + " " +
                          numbered(example_common);

    // The first `units` of one permutation: one more unit adds one more uncommon word.
    PythonRandom word_rng = stream(seed, "words");
    std::vector<size_t> order(words_.size());
    for (size_t i = 0; i < order.size(); ++i) order[i] = i;
    word_rng.shuffle(order);
    order.resize(static_cast<size_t>(units));
    PythonRandom list_rng = stream(seed, "list");
    const std::string list = numbered(listed(order, shape_, list_rng));

    LongContextItem item;
    item.context = example + "\n" + kIntro + list + "\n";
    item.question = kQuestion;
    item.references = common_of(order);
    item.haystack = "words";
    return item;
  }

 private:
  static constexpr const char* kIntro =
      "Below is a numbered list of words. In these words, some appear more often than others. "
      "Memorize the ones that appear most often.\n";
  static constexpr const char* kQuestion =
      "Question: What are the 10 most common words in the above list?"
      " Answer: The top 10 words that appear most often in the list are:";

  std::vector<std::string> common_of(const std::vector<size_t>& picked) const {
    std::vector<std::string> common;
    for (size_t i = 0; i < static_cast<size_t>(kCommonWords); ++i) common.push_back(words_[picked[i]]);
    return common;
  }

  // common * common_repeats + uncommon * uncommon_repeats, shuffled.
  std::vector<std::string> listed(const std::vector<size_t>& picked, ListShape shape, PythonRandom& rng) const {
    std::vector<std::string> list;
    for (int r = 0; r < shape.common_repeats; ++r)
      for (size_t i = 0; i < static_cast<size_t>(kCommonWords); ++i) list.push_back(words_[picked[i]]);
    for (int r = 0; r < shape.uncommon_repeats; ++r)
      for (size_t i = kCommonWords; i < picked.size(); ++i) list.push_back(words_[picked[i]]);
    rng.shuffle(list);
    return list;
  }

  static std::string numbered(const std::vector<std::string>& words) {
    std::string out;
    for (size_t i = 0; i < words.size(); ++i) out += (i ? " " : "") + std::to_string(i + 1) + ". " + words[i];
    return out;
  }

  static std::string task_text(const std::string& list) { return std::string(kIntro) + list + "\n" + kQuestion; }

  std::vector<std::string> words_;
  int example_words_ = 40;
  ListShape example_shape_{10, 3}, shape_{30, 3};
};

}  // namespace

std::unique_ptr<Task> make_ruler_cwe_task() {
  return make_long_context_task(
      "ruler_cwe", [](const LongContextSetup& setup) { return std::make_unique<RulerCwe>(setup); },
      LongContextScoring::RulerStringMatch);
}

}  // namespace kvevict
