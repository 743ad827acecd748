// The classic needle in a haystack, "niah", as Kamradt's test (gkamradt/LLMTest_NeedleInAHaystack)
// and KVCache-Factory's run_needle_in_haystack.py run it, over a depth x length grid.
//
// Needle "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park
// on a sunny day.", question "What is the best thing to do in San Francisco?". The
// haystack is the XSum essay as written (articles joined by blank lines), from the
// article the item's seed draws, cut after a whole number of words (the units; after the
// essay's last word it goes on from its first, and never past the essay's length). The
// needle goes in at token depth d of the haystack, backed up to the previous sentence end
// (the end at depth 1), as its own sentence. KVCache-Factory's prompt for base models,
// without its "<|im_start|> " opener: "This is a very long story book: <book> {context}
// </book>.\n Based on the content of the book, Question: {question}\nAnswer:"; 30 tokens
// to generate (its max_new_tokens). Scores: ROUGE-1 F x 10 of the needle against the
// answer (KVCache-Factory's score) and whether the answer holds the needle's fact.
#include <memory>

#include "harness/tokenizers/tokenizer.h"
#include "tasks/long_context.h"

namespace kvevict {
namespace {

using namespace long_context;

const char* const kNeedle = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";
const char* const kFact = "eat a sandwich and sit in Dolores Park on a sunny day";
const char* const kQuestion = "What is the best thing to do in San Francisco?";

class ClassicNiah : public LongContextRecipe {
 public:
  explicit ClassicNiah(const LongContextSetup& setup)
      : essay_(xsum_essay(setup.options.data_dir)), depth_(*setup.options.depth), tokenizer_(setup.tokenizer) {}

  int tokens_to_generate() const override { return 30; }
  int min_units() const override { return 1; }
  // Every word of the essay once at most: a haystack that starts over would repeat its
  // text to fill a length the data cannot fill.
  std::optional<int> max_units() const override { return static_cast<int>(essay_.word_begin.size()); }
  std::string units_source() const override {
    return essay_.path + ": " + std::to_string(essay_.word_begin.size()) + " words";
  }

  // The items with one word of haystack differ only in the article they start at: the
  // longest of them is the least length every item fits.
  std::optional<LeastLength> least_length() const override {
    if (!least_) {
      LeastLength least;
      for (size_t first : essay_.article_first_word) {
        const LongContextItem item = build_from(first, 1);
        const int tokens = static_cast<int>(tokenizer_.encode(item.prompt()).size()) + tokens_to_generate();
        if (tokens > least.tokens)
          least = {tokens, "the longest one-word haystack of " + essay_.path + ", " +
                               essay_.text.substr(essay_.word_begin[first], essay_.word_end[first] - essay_.word_begin[first]) +
                               ", makes a prompt of " + std::to_string(tokens - tokens_to_generate()) +
                               " tokens and the answer takes " + std::to_string(tokens_to_generate()) + " more"};
      }
      least_ = least;
    }
    return least_;
  }

  LongContextItem build(uint64_t seed, int units) const override {
    PythonRandom start_rng = stream(seed, "start");
    return build_from(essay_.article_first_word[start_rng.randbelow(essay_.article_first_word.size())], units);
  }

 private:
  // The item whose haystack is `units` words from essay word `first` on.
  LongContextItem build_from(size_t first, int units) const {
    const size_t essay_words = essay_.word_begin.size();
    // The haystack with the essay's own spacing; after its last word it goes on from the
    // first (max_units: no word twice).
    std::string haystack;
    struct SentenceEnd {
      size_t offset;
      int words;
    };
    std::vector<SentenceEnd> ends;
    for (int k = 0; k < units; ++k) {
      const size_t i = (first + static_cast<size_t>(k)) % essay_words;
      if (k > 0) {
        if (i == 0)
          haystack += "\n\n";
        else
          haystack.append(essay_.text, essay_.word_end[i - 1], essay_.word_begin[i] - essay_.word_end[i - 1]);
      }
      haystack.append(essay_.text, essay_.word_begin[i], essay_.word_end[i] - essay_.word_begin[i]);
      if (essay_.sentence_end[i] || k + 1 == units) ends.push_back({haystack.size(), k + 1});
    }

    // The last sentence end whose prefix holds at most int(tokens * depth) tokens.
    SentenceEnd at{0, 0};
    if (depth_ >= 1) {
      at = ends.back();
    } else {
      const auto target = static_cast<long long>(static_cast<double>(tokenizer_.encode(haystack).size()) * depth_);
      size_t lo = 0, hi = ends.size();  // ends[0, lo) fit; ends[hi, ...) do not
      while (lo < hi) {
        const size_t mid = lo + (hi - lo) / 2;
        const auto tokens = static_cast<long long>(tokenizer_.encode(haystack.substr(0, ends[mid].offset)).size());
        if (tokens <= target)
          lo = mid + 1;
        else
          hi = mid;
      }
      if (lo > 0) at = ends[lo - 1];
    }

    LongContextItem item;
    item.context = "This is a very long story book: <book> ";
    Needle needle;
    needle.text = kNeedle;
    needle.units_before = at.words;
    needle.depth = depth_;
    if (at.offset == 0) {
      needle.offset = item.context.size();
      item.context += needle.text + " " + haystack;
    } else {
      item.context += haystack.substr(0, at.offset) + " ";
      needle.offset = item.context.size();
      item.context += needle.text + haystack.substr(at.offset);
    }
    item.context += " </book>.\n";
    item.question = std::string(" Based on the content of the book, Question: ") + kQuestion + "\nAnswer:";
    item.references = {kFact};
    item.needles = {needle};
    item.depth = depth_;
    item.haystack = "xsum";
    return item;
  }

  const Essay& essay_;
  double depth_;
  const Tokenizer& tokenizer_;
  mutable std::optional<LeastLength> least_;
};

}  // namespace

std::unique_ptr<Task> make_niah_task() {
  return make_long_context_task(
      "niah", [](const LongContextSetup& setup) { return std::make_unique<ClassicNiah>(setup); },
      LongContextScoring::Niah);
}

}  // namespace kvevict
