#include "tasks/long_context.h"

#include <unicode/locid.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdlib>
#include <cstdio>
#include <limits>
#include <map>
#include <mutex>
#include <utility>

#include "harness/common/errors.h"
#include "harness/tokenizers/tokenizer.h"
#include "tasks/jsonl.h"
#include "tasks/metrics.h"
#include "tasks/python_text.h"
#include "tasks/rouge.h"

namespace kvevict {

namespace long_context {
namespace {

uint64_t fnv1a(const std::string& bytes, uint64_t hash = 0xcbf29ce484222325ULL) {
  for (unsigned char c : bytes) hash = (hash ^ c) * 0x100000001b3ULL;
  return hash;
}

uint64_t splitmix64(uint64_t x) {
  x += 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

std::string strip_trailing_space(std::string text) {
  while (!text.empty() && (text.back() == ' ' || text.back() == '\t' || text.back() == '\r')) text.pop_back();
  return text;
}

}  // namespace

uint64_t item_seed(uint64_t seed, const std::string& task, int length, int index) {
  uint64_t h = fnv1a(task);
  // The seed's own bits: an int seed's items are unchanged since seeds became 64 bits.
  for (uint64_t part : {seed, static_cast<uint64_t>(static_cast<long long>(length)),
                        static_cast<uint64_t>(static_cast<long long>(index))})
    h = splitmix64(h ^ part);
  return h;
}

PythonRandom stream(uint64_t item_seed, const std::string& purpose) {
  // A non-negative 63-bit seed: random.Random(that) in Python draws the same numbers.
  return PythonRandom(static_cast<long long>(splitmix64(item_seed ^ fnv1a(purpose)) >> 1));
}

long long randint(PythonRandom& rng, long long low, long long high) {
  return low + static_cast<long long>(rng.randbelow(static_cast<uint64_t>(high - low + 1)));
}

std::string random_letters(PythonRandom& rng, const std::string& alphabet, int count) {
  // random.choices: population[floor(random() * n)] for each pick.
  std::string out;
  for (int i = 0; i < count; ++i)
    out += alphabet[static_cast<size_t>(std::floor(rng.random() * static_cast<double>(alphabet.size())))];
  return out;
}

std::string random_uuid(PythonRandom& rng) {
  // getrandbits(128) fills 32-bit words from the least significant end.
  uint64_t low = rng.getrandbits(64), high = rng.getrandbits(64);
  high = (high & ~0xf000ULL) | 0x4000ULL;                                  // version 4
  low = (low & ~(0xc000ULL << 48)) | (0x8000ULL << 48);                    // RFC 4122 variant
  char text[40];
  std::snprintf(text, sizeof text, "%08llx-%04llx-%04llx-%04llx-%012llx",
                static_cast<unsigned long long>(high >> 32), static_cast<unsigned long long>((high >> 16) & 0xffff),
                static_cast<unsigned long long>(high & 0xffff), static_cast<unsigned long long>(low >> 48),
                static_cast<unsigned long long>(low & 0xffffffffffffULL));
  return text;
}

std::vector<std::string> read_word_list(const std::string& data_dir, const std::string& file) {
  const std::string path = data_file(data_dir, "wordlists/" + file);
  std::vector<std::string> words;
  for (const TextLine& line : read_text_lines(path)) {
    std::string word = strip_trailing_space(line.text);
    if (!word.empty()) words.push_back(std::move(word));
  }
  if (words.empty()) throw Error(path + ": no words");
  return words;
}

bool ends_sentence(const std::string& word, const std::string& next) {
  size_t end = word.size();
  auto closing = [](char c) { return c == '"' || c == '\'' || c == ')' || c == ']'; };
  // Closing quotes, ASCII or the UTF-8 right quotes (’ ” end in 0x99 / 0x9d after E2 80).
  while (end > 0) {
    if (closing(word[end - 1])) {
      --end;
    } else if (end >= 3 && word.compare(end - 3, 2, "\xE2\x80") == 0 &&
               (word[end - 1] == '\x99' || word[end - 1] == '\x9D')) {
      end -= 3;
    } else {
      break;
    }
  }
  if (end == 0) return false;
  const char last = word[end - 1];
  if (last != '.' && last != '!' && last != '?') return false;
  if (last == '.') {
    std::string stem;
    for (size_t i = 0; i < end; ++i) stem += static_cast<char>(std::tolower(static_cast<unsigned char>(word[i])));
    static const char* const titles[] = {"mr.", "mrs.", "ms.", "dr.", "prof.", "st.", "jr.", "sr.", "rev.",
                                         "gen.", "col.", "lt.", "sgt.", "capt.", "gov.", "sen.", "rep.", "vs.",
                                         "e.g.", "i.e.", "no."};
    for (const char* title : titles)
      if (stem == title) return false;
    if (end == 2 && std::isupper(static_cast<unsigned char>(word[0]))) return false;  // an initial: "J."
  }
  if (next.empty()) return true;
  const unsigned char first = static_cast<unsigned char>(next[0]);
  return std::isupper(first) || std::isdigit(first) || first == '"' || first == '\'' || first == '(' ||
         first == '[' || next.compare(0, 2, "\xE2\x80") == 0;  // a UTF-8 quote mark
}

const Essay& xsum_essay(const std::string& data_dir) {
  static std::mutex mutex;
  static std::map<std::string, std::unique_ptr<Essay>> essays;
  std::lock_guard<std::mutex> lock(mutex);
  auto& slot = essays[data_dir];
  if (slot) return *slot;
  auto essay = std::make_unique<Essay>();
  const std::string path = data_file(data_dir, "xsum/xsum_test_1000.jsonl");
  essay->path = path;
  for (const JsonLine& row : read_jsonl(path)) {
    const std::string document = row.string_field("document");
    if (!essay->text.empty()) essay->text += "\n\n";
    const size_t base = essay->text.size();
    essay->text += document;
    const auto spans = python_split_spans(document);
    if (spans.empty()) row.fail("field \"document\" has no words");
    essay->article_first_word.push_back(essay->word_begin.size());
    for (const auto& [begin, end] : spans) {
      essay->word_begin.push_back(base + begin);
      essay->word_end.push_back(base + end);
    }
  }
  if (essay->word_begin.empty()) throw Error(path + ": no articles");
  const size_t words = essay->word_begin.size();
  auto word = [&](size_t i) {
    return essay->text.substr(essay->word_begin[i], essay->word_end[i] - essay->word_begin[i]);
  };
  essay->sentence_end.resize(words);
  for (size_t i = 0; i < words; ++i) essay->sentence_end[i] = ends_sentence(word(i), word((i + 1) % words));
  slot = std::move(essay);
  return *slot;
}

const std::vector<int>& ruler_depths() {
  static const std::vector<int> depths = [] {
    std::vector<int> out;
    for (int i = 0; i < 40; ++i) out.push_back(static_cast<int>(std::lround(100.0 * i / 39.0)));
    return out;
  }();
  return depths;
}

}  // namespace long_context

// --- Fitting ------------------------------------------------------------------------

LongContextGenerator::LongContextGenerator(std::string task, std::unique_ptr<LongContextRecipe> recipe,
                                           const TaskOptions& options, const Tokenizer& tokenizer)
    : task_(std::move(task)), recipe_(std::move(recipe)), options_(options), tokenizer_(tokenizer) {}

LongContextItem LongContextGenerator::item_with_units(int index, int units) const {
  const uint64_t seed = long_context::item_seed(options_.seed, task_, options_.length, index);
  LongContextItem item = recipe_->build(seed, units);
  item.tokens_to_generate = recipe_->tokens_to_generate();
  item.length = options_.length;
  item.haystack_units = units;
  item.prompt_tokens = static_cast<int>(tokenizer_.encode(item.prompt()).size());
  // Items with fewer questions than asked are refused by the evaluator (a needle haystack's
  // count grows with its units, so a probe of the search may have fewer than the fit).
  const int turns = std::min<int>(options_.turns, static_cast<int>(item.turns.size()));
  for (GenerationTurn& turn : item.turns) turn.max_new_tokens = recipe_->turn_tokens_to_generate();
  if (turns > 0) {
    // The whole conversation fits the length: the context, the asked questions and the
    // most tokens of an answer after each.
    int64_t conversation = static_cast<int64_t>(tokenizer_.encode(item.context).size());
    for (int k = 0; k < turns; ++k)
      conversation += static_cast<int64_t>(tokenizer_.encode(item.turns[k].question).size()) + item.turns[k].max_new_tokens;
    item.shared_context_tokens = static_cast<int>(conversation);
  }
  return item;
}

LongContextItem LongContextGenerator::item(int index) const {
  const int length = options_.length;
  // A length that only some items fit would run those and refuse the rest: refused for
  // all, the same whichever items (--limit, seed) are asked for.
  if (const auto least = recipe_->least_length(); least && length < least->tokens)
    throw Error(task_ + ": length " + std::to_string(length) + " is too short: every item fits from " +
                std::to_string(least->tokens) + " (" + least->why + ")");
  auto fits = [&](const LongContextItem& item) {
    return static_cast<long long>(item.prompt_tokens) + item.tokens_to_generate <= length &&
           item.shared_context_tokens <= length;
  };
  const int min_units = recipe_->min_units();
  const std::optional<int> max_units = recipe_->max_units();
  auto too_long = [&]() {
    const std::string source = recipe_->units_source();
    return Error(task_ + ": length " + std::to_string(length) + " needs more than " + std::to_string(*max_units) +
                 " haystack units, the most its data holds" + (source.empty() ? "" : " (" + source + ")"));
  };
  // Galloping search from `start` for the largest number of units that fits: `best` holds
  // `lo` units and fits, `hi` units do not.
  auto fit_from = [&](int start) {
    start = std::max(start, min_units);
    if (max_units) start = std::min(start, *max_units);
    LongContextItem best = item_with_units(index, start);
    long long lo, hi;
    if (fits(best)) {
      lo = start;
      for (long long step = 1;; step *= 2) {
        if (max_units && lo == *max_units) throw too_long();
        long long candidate = lo + step;
        if (max_units) candidate = std::min<long long>(candidate, *max_units);
        if (candidate > std::numeric_limits<int>::max() / 2)
          throw Error(task_ + ": no number of haystack units fills length " + std::to_string(length));
        LongContextItem probe = item_with_units(index, static_cast<int>(candidate));
        if (!fits(probe)) {
          hi = candidate;
          break;
        }
        lo = candidate;
        best = std::move(probe);
      }
    } else {
      hi = start;
      for (long long step = 1;; step *= 2) {
        if (hi == min_units)
          throw Error(task_ + ": length " + std::to_string(length) + " is too short: with the fewest haystack units (" +
                      std::to_string(min_units) + ") the prompt takes " + std::to_string(best.prompt_tokens) +
                      " tokens and the answer " + std::to_string(best.tokens_to_generate) + " more" +
                      (options_.turns > 0 ? "; the context, --turns " + std::to_string(options_.turns) +
                                                " questions and their answers " +
                                                std::to_string(best.shared_context_tokens)
                                          : std::string()));
        const long long candidate = std::max<long long>(min_units, hi - step);
        LongContextItem probe = item_with_units(index, static_cast<int>(candidate));
        if (fits(probe)) {
          lo = candidate;
          best = std::move(probe);
          break;
        }
        hi = candidate;
        best = std::move(probe);  // keeps the smallest probe's count for the error above
      }
    }
    while (hi - lo > 1) {
      const long long mid = lo + (hi - lo) / 2;
      LongContextItem probe = item_with_units(index, static_cast<int>(mid));
      if (fits(probe)) {
        lo = mid;
        best = std::move(probe);
      } else {
        hi = mid;
      }
    }
    return best;
  };
  if (!search_start_) search_start_ = fit_from(min_units).haystack_units;
  return fit_from(*search_start_);
}

// --- The tasks ----------------------------------------------------------------------

namespace {

// RULER's config_tasks.sh: NUM_SAMPLES=500, the item count when no limit is given.
constexpr int kDefaultItems = 500;

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string out;
  for (size_t i = 0; i < parts.size(); ++i) out += (i ? separator : "") + parts[i];
  return out;
}

MetricValue rounded_mean(const std::string& name, double ruler_value, const std::vector<double>& per_doc) {
  MetricValue metric = mean_metric(name, per_doc);
  metric.value = ruler_value;
  return metric;
}

class LongContextTask : public Task {
 public:
  LongContextTask(std::string name, LongContextRecipeFactory recipe, LongContextScoring scoring)
      : name_(std::move(name)), recipe_(std::move(recipe)), scoring_(scoring) {}

  std::string name() const override { return name_; }
  TaskKind kind() const override { return TaskKind::Generation; }
  bool long_context() const override { return true; }
  bool needle_depth() const override { return scoring_ == LongContextScoring::Niah; }
  std::vector<std::string> metric_names() const override {
    if (scoring_ == LongContextScoring::Niah) return {"rouge1_x10", "substring_recall"};
    return {"string_match_all", "string_match_part"};
  }

  std::vector<GenerationDoc> generation_docs(const TaskOptions&) const override {
    throw Error(name_ + " fits its prompts to a length in the model's own tokens and needs the model's tokenizer");
  }

  std::vector<GenerationDoc> generation_docs_for(const Tokenizer& tokenizer, const TaskOptions& options) const override {
    const auto generator = generator_for(tokenizer, options);
    const int items = options.limit >= 0 ? options.limit : kDefaultItems;
    std::vector<GenerationDoc> docs;
    for (int i = 0; i < items; ++i) {
      LongContextItem item = generator->item(i);
      GenerationDoc doc;
      doc.id = std::to_string(i);
      doc.question_offset = item.context.size();
      doc.prompt = item.prompt();
      // NIAH's ROUGE compares the answer with the needle; RULER's tasks list their strings.
      doc.reference = scoring_ == LongContextScoring::Niah && !item.needles.empty() ? item.needles.front().text
                                                                                   : join(item.references, ", ");
      doc.references = std::move(item.references);
      doc.max_new_tokens = item.tokens_to_generate;
      doc.temperature = 0.0;  // greedy
      doc.length = item.length;
      doc.prompt_tokens = item.prompt_tokens;
      doc.depth = item.depth;
      doc.haystack = item.haystack;
      doc.turns = std::move(item.turns);
      docs.push_back(std::move(doc));
    }
    return docs;
  }

  std::optional<GenerationScores> score_generations(const std::vector<GenerationDoc>& docs,
                                                    const std::vector<std::string>& predictions) const override {
    if (docs.size() != predictions.size())
      throw Error(name_ + ": " + std::to_string(predictions.size()) + " predictions for " +
                  std::to_string(docs.size()) + " documents");
    GenerationScores scores;
    if (scoring_ == LongContextScoring::Niah) {
      std::vector<double> recall;
      for (size_t i = 0; i < docs.size(); ++i) {
        const std::string answer = ruler_postprocess(predictions[i]);
        scores.per_doc.push_back(10 * rouge_scores(docs[i].reference, answer).rouge1);
        recall.push_back(100 * string_match_all_fraction(answer, docs[i].references));
      }
      scores.metrics = {mean_metric("rouge1_x10", scores.per_doc), mean_metric("substring_recall", recall)};
      return scores;
    }
    std::vector<std::string> answers;
    std::vector<std::vector<std::string>> references;
    std::vector<double> part;
    for (size_t i = 0; i < docs.size(); ++i) {
      answers.push_back(ruler_postprocess(predictions[i]));
      references.push_back(docs[i].references);
      scores.per_doc.push_back(100 * string_match_all_fraction(answers.back(), references.back()));
      part.push_back(100 * string_match_part_fraction(answers.back(), references.back()));
    }
    scores.metrics = {rounded_mean("string_match_all", string_match_all(answers, references), scores.per_doc),
                      rounded_mean("string_match_part", string_match_part(answers, references), part)};
    return scores;
  }

  std::unique_ptr<LongContextGenerator> generator_for(const Tokenizer& tokenizer, const TaskOptions& options) const {
    if (options.length <= 0)
      throw Error(name_ + " needs a length in tokens (got " + std::to_string(options.length) + ")");
    if (options.shots != 0)
      throw Error(name_ + " takes no few-shot examples (got " + std::to_string(options.shots) +
                  " shots); RULER's tasks carry their own");
    if (options.pipeline != Pipeline::LmEval)
      throw Error(name_ + " has no H2O prompt file; it runs on the lm-eval pipeline only");
    if (scoring_ == LongContextScoring::Niah) {
      if (!options.depth) throw Error(name_ + " needs a needle depth in [0, 1]");
      if (!(*options.depth >= 0 && *options.depth <= 1))
        throw Error(name_ + ": depth " + std::to_string(*options.depth) + " is not in [0, 1]");
    } else if (options.depth) {
      throw Error(name_ + " draws its needles' depths as RULER does; a depth applies only to niah");
    }
    LongContextSetup setup{name_, options, tokenizer};
    return std::make_unique<LongContextGenerator>(name_, recipe_(setup), options, tokenizer);
  }

 private:
  std::string name_;
  LongContextRecipeFactory recipe_;
  LongContextScoring scoring_;
};

}  // namespace

std::unique_ptr<Task> make_long_context_task(std::string name, LongContextRecipeFactory recipe,
                                             LongContextScoring scoring) {
  return std::make_unique<LongContextTask>(std::move(name), std::move(recipe), scoring);
}

std::unique_ptr<LongContextGenerator> make_long_context_generator(const std::string& task,
                                                                  const TaskOptions& options,
                                                                  const Tokenizer& tokenizer) {
  const std::unique_ptr<Task> made = make_task(task);
  const auto* long_context = dynamic_cast<const LongContextTask*>(made.get());
  if (!long_context) throw Error("task " + task + " is not a long-context task");
  return long_context->generator_for(tokenizer, options);
}

// --- RULER's scoring ----------------------------------------------------------------

std::string ruler_subtask_name(const std::string& task) {
  const std::string prefix = "ruler_";
  if (task.rfind(prefix, 0) != 0) return "";
  const auto names = task_names();
  if (std::find(names.begin(), names.end(), task) == names.end()) return "";
  return task.substr(prefix.size());
}

std::string ruler_postprocess(const std::string& prediction) {
  std::string text = python_strip(prediction);
  for (char& c : text)
    if (static_cast<unsigned char>(c) < 0x20) c = '\n';
  return python_strip(text);
}

std::string python_lower(const std::string& utf8) {
  std::string out;
  icu::UnicodeString::fromUTF8(utf8).toLower(icu::Locale::getRoot()).toUTF8String(out);
  return out;
}

namespace {

std::vector<bool> contained(const std::string& prediction, const std::vector<std::string>& references) {
  const std::string haystack = python_lower(prediction);
  std::vector<bool> found;
  for (const auto& reference : references) found.push_back(haystack.find(python_lower(reference)) != std::string::npos);
  return found;
}

// Python's round(x, 2): the correctly rounded decimal, as printf writes it.
double round2(double value) {
  char text[64];
  std::snprintf(text, sizeof text, "%.2f", value);
  return std::strtod(text, nullptr);
}

template <typename PerItem>
double ruler_metric(const char* name, const std::vector<std::string>& predictions,
                    const std::vector<std::vector<std::string>>& references, PerItem per_item) {
  if (predictions.empty() || predictions.size() != references.size())
    throw Error(std::string(name) + ": " + std::to_string(predictions.size()) + " predictions for " +
                std::to_string(references.size()) + " reference lists");
  double sum = 0;
  for (size_t i = 0; i < predictions.size(); ++i) sum += per_item(predictions[i], references[i]);
  return round2(sum / static_cast<double>(predictions.size()) * 100);
}

}  // namespace

double string_match_all_fraction(const std::string& prediction, const std::vector<std::string>& references) {
  if (references.empty()) throw Error("string_match_all: an item has no reference strings");
  double hits = 0;
  for (bool found : contained(prediction, references)) hits += found ? 1.0 : 0.0;
  return hits / static_cast<double>(references.size());
}

double string_match_part_fraction(const std::string& prediction, const std::vector<std::string>& references) {
  if (references.empty()) throw Error("string_match_part: an item has no reference strings");
  double best = 0;
  for (bool found : contained(prediction, references)) best = std::max(best, found ? 1.0 : 0.0);
  return best;
}

double string_match_all(const std::vector<std::string>& predictions,
                        const std::vector<std::vector<std::string>>& references) {
  return ruler_metric("string_match_all", predictions, references, string_match_all_fraction);
}

double string_match_part(const std::vector<std::string>& predictions,
                         const std::vector<std::vector<std::string>>& references) {
  return ruler_metric("string_match_part", predictions, references, string_match_part_fraction);
}

}  // namespace kvevict
