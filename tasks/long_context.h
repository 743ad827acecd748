// Long-context synthetic tasks: RULER's (NVIDIA/RULER, scripts/data/synthetic/) needle,
// variable-tracking and word-frequency tasks ("ruler_*") and the classic needle in a
// haystack ("niah"), generated here, deterministic in (seed, task, length, item index).
//
// Each task is a recipe that writes one item's prompt from the item's seed and a number
// of haystack units (noise paragraphs, distractor needles, essay words, list words). The
// generator fits every item to the requested length as RULER's generate_samples does:
// the largest number of units for which the prompt's tokens, in the model's own
// tokenizer, plus the tokens to generate fit. Every probe of that search redraws the item
// from its own seed, so more units never mean fewer tokens and the result is the same
// whichever other items are generated.
//
// Scoring is RULER's (scripts/eval/evaluate.py, scripts/eval/synthetic/constants.py).
#pragma once
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "tasks/fewshot.h"
#include "tasks/task.h"

namespace kvevict {

class Tokenizer;

// One inserted needle (a RULER needle, a variable-tracking assignment, NIAH's sentence).
struct Needle {
  std::string text;
  size_t offset = 0;     // where it starts in the prompt
  int units_before = 0;  // haystack units before it (essay tasks: sentences)
  double depth = 0;      // where it was asked to go, in [0, 1]
};

// One generated item. The prompt is context + question; the question includes the
// answer prefix (RULER feeds input + answer_prefix to the model).
struct LongContextItem {
  std::string context;
  std::string question;
  std::vector<std::string> references;
  std::vector<Needle> needles;
  int tokens_to_generate = 0;
  int length = 0;          // the requested length
  int prompt_tokens = 0;   // tokens of prompt() without special tokens
  int haystack_units = 0;  // the fitted number of units
  // With TaskOptions::turns: the context's tokens plus each asked question's and
  // tokens_to_generate after each (what a multi-turn conversation holds at most).
  int shared_context_tokens = 0;
  std::optional<double> depth;  // the asked needle's depth, where one needle holds the answer
  std::string haystack;         // "noise", "needle", "xsum", "words", "coded"
  // Recipes whose context holds several keys: one question per key (GenerationDoc::turns).
  std::vector<GenerationTurn> turns;

  std::string prompt() const { return context + question; }
};

// What a recipe is built from.
struct LongContextSetup {
  std::string task;  // the registered name, e.g. "ruler_vt"
  const TaskOptions& options;
  const Tokenizer& tokenizer;
};

// One task's prompt writer. build() is a pure function of (item seed, units).
class LongContextRecipe {
 public:
  virtual ~LongContextRecipe() = default;
  virtual int tokens_to_generate() const = 0;
  // The most tokens of each answer in a shared-context evaluation's turns (one key's
  // values, where tokens_to_generate() is RULER's cap for the whole question).
  virtual int turn_tokens_to_generate() const { return tokens_to_generate(); }
  // The fewest units an item can have (e.g. one position per needle).
  virtual int min_units() const = 0;
  // The most units the data allows; nullopt: no limit (the essay repeats).
  virtual std::optional<int> max_units() const { return std::nullopt; }
  // The data file the units come from, named when a length needs more than max_units().
  virtual std::string units_source() const { return ""; }
  // The least length at which every item fits with the fewest units, whatever its seed
  // draws, and what that item is (for the error); nullopt where it is not known up front
  // (an item that cannot fit is then refused as it is built).
  struct LeastLength {
    int tokens = 0;
    std::string why;
  };
  virtual std::optional<LeastLength> least_length() const { return std::nullopt; }
  // The item with exactly `units` haystack units; prompt_tokens and length are left to
  // the generator.
  virtual LongContextItem build(uint64_t item_seed, int units) const = 0;
};

using LongContextRecipeFactory = std::function<std::unique_ptr<LongContextRecipe>(const LongContextSetup&)>;

// Fits a recipe's items to TaskOptions::length.
class LongContextGenerator {
 public:
  LongContextGenerator(std::string task, std::unique_ptr<LongContextRecipe> recipe, const TaskOptions& options,
                       const Tokenizer& tokenizer);
  // Item `index` with the most units that fit the length.
  LongContextItem item(int index) const;
  // Item `index` with exactly `units` units (one probe of the search), tokens counted.
  LongContextItem item_with_units(int index, int units) const;
  int tokens_to_generate() const { return recipe_->tokens_to_generate(); }

 private:
  std::string task_;
  std::unique_ptr<LongContextRecipe> recipe_;
  TaskOptions options_;
  const Tokenizer& tokenizer_;
  // Where every item's search starts: item 0's fitted units, found once. It depends only
  // on (seed, task, length), so an item's result never depends on which others ran.
  mutable std::optional<int> search_start_;
};

// The generator of a registered long-context task; Error for any other task name.
std::unique_ptr<LongContextGenerator> make_long_context_generator(const std::string& task,
                                                                  const TaskOptions& options,
                                                                  const Tokenizer& tokenizer);

// How a long-context task scores its answers.
enum class LongContextScoring {
  RulerStringMatch,  // string_match_all (RULER's metric for these tasks), then string_match_part
  Niah,              // ROUGE-1 F x 10 of the needle, then substring recall
};

// A registered long-context task: its docs are the generator's items.
std::unique_ptr<Task> make_long_context_task(std::string name, LongContextRecipeFactory recipe,
                                             LongContextScoring scoring);

// RULER's own name for a registered ruler_* task (niah_single_1, vt, cwe, fwe: the
// folder names of RULER's and kvpress's data); "" for any other task, niah included.
std::string ruler_subtask_name(const std::string& task);

// --- RULER's scoring ---------------------------------------------------------------

// postprocess_pred: strip(), every character in [\x00-\x1f] becomes "\n", strip().
std::string ruler_postprocess(const std::string& prediction);
// Python's str.lower() (full Unicode case mapping).
std::string python_lower(const std::string& utf8);
// One item: the fraction of references contained in the prediction, case-insensitively
// (all), or whether any one is (part); in [0, 1]. The prediction as given (postprocess
// it first, as RULER's evaluator does).
double string_match_all_fraction(const std::string& prediction, const std::vector<std::string>& references);
double string_match_part_fraction(const std::string& prediction, const std::vector<std::string>& references);
// RULER's metric functions: the mean over items x 100, rounded to 2 decimals.
double string_match_all(const std::vector<std::string>& predictions,
                        const std::vector<std::vector<std::string>>& references);
double string_match_part(const std::vector<std::string>& predictions,
                         const std::vector<std::vector<std::string>>& references);

// --- Machinery the recipes share ---------------------------------------------------

namespace long_context {

// The item's seed: a hash of (seed, task, length, index).
uint64_t item_seed(uint64_t seed, const std::string& task, int length, int index);
// A generator for one purpose within an item ("needles", "haystack", "positions", ...),
// so that drawing more haystack leaves the needles and their depths as they were.
PythonRandom stream(uint64_t item_seed, const std::string& purpose);

// random.randint(low, high), random.choice over n, random.choices(alphabet, k).
long long randint(PythonRandom& rng, long long low, long long high);
std::string random_letters(PythonRandom& rng, const std::string& alphabet, int count);
// str(uuid.UUID(int=random.getrandbits(128), version=4)).
std::string random_uuid(PythonRandom& rng);

// wonderwords' lists in ../shared/data/wordlists (lines, trailing whitespace removed).
std::vector<std::string> read_word_list(const std::string& data_dir, const std::string& file);

// The essay haystack: the staged XSum articles in file order, joined by blank lines.
struct Essay {
  std::string path;  // the file it was read from, for errors
  std::string text;
  // Each whitespace-separated word of `text`: where it starts and ends.
  std::vector<size_t> word_begin, word_end;
  // Whether a sentence ends with word i (see ends_sentence).
  std::vector<bool> sentence_end;
  // Where each article's first word is.
  std::vector<size_t> article_first_word;
};
const Essay& xsum_essay(const std::string& data_dir);  // read once per data folder

// Whether `word` ends a sentence when `next` follows it (empty at the end): it ends in
// . ! or ? (closing quotes and brackets after it allowed), is not a common title or an
// initial, and the next word starts with a capital, a digit or an opening quote or
// bracket. A stand-in for NLTK's punkt, which RULER uses.
bool ends_sentence(const std::string& word, const std::string& next);

// RULER's noise haystack unit (niah "noise" and variable tracking): one repeated paragraph.
inline constexpr const char* kNoiseParagraph =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

// The depths RULER draws needle positions from: round(linspace(0, 100, 40)), percent.
const std::vector<int>& ruler_depths();

}  // namespace long_context

}  // namespace kvevict
