// RULER's needle-in-a-haystack family (scripts/data/synthetic/niah.py with the eight
// configurations of scripts/synthetic.yaml).
//
// Needle: "One of the special magic {type} for {key} is: {value}." (type plural).
// Prompt: "Some special magic {type} are hidden within the following text. Make sure to
// memorize it. I will quiz you about the {type} afterwards.\n{context}\nWhat are all the
// special magic {type} for {query} mentioned in the provided text?" then the answer prefix
// " The special magic {type} for {query} mentioned in the provided text are". With one
// asked value RULER replaces Some->A, "are all"->is, are->is in the template and makes the
// type singular.
//
// Haystacks: noise (the five-sentence paragraph, units joined by "\n"), needle (every
// unit a distractor needle with a fresh key and value) and essay (RULER: Paul Graham's
// essays; here the XSum articles, words joined by spaces, needles between sentences at
// depths drawn from round(linspace(0, 100, 40))). Keys: adjective-noun words, 7-digit
// numbers or uuids; values: numbers or uuids. Units: noise paragraphs, distractor
// needles, essay words.
#include <algorithm>
#include <memory>

#include "harness/common/errors.h"
#include "tasks/long_context.h"

namespace kvevict {
namespace {

using namespace long_context;

enum class Haystack { Noise, Needle, Essay };
enum class Draw { Words, Numbers, Uuids };

struct NiahConfig {
  Haystack haystack;
  Draw key;
  Draw value;
  int keys = 1;     // num_needle_k (RULER raises it to num_needle_q)
  int values = 1;   // num_needle_v: needles per key
  int queries = 1;  // num_needle_q: keys asked for
};

std::string replace_all(std::string text, const std::string& from, const std::string& to) {
  for (size_t at = text.find(from); at != std::string::npos; at = text.find(from, at + to.size()))
    text.replace(at, from.size(), to);
  return text;
}

std::string fill(std::string text, const std::string& type, const std::string& query) {
  return replace_all(replace_all(std::move(text), "{type}", type), "{query}", query);
}

class RulerNiah : public LongContextRecipe {
 public:
  RulerNiah(NiahConfig config, const LongContextSetup& setup) : config_(config) {
    config_.keys = std::max(config_.keys, config_.queries);
    if (config_.key == Draw::Words || config_.value == Draw::Words) {
      adjectives_ = sorted_unique(read_word_list(setup.options.data_dir, "adjectivelist.txt"));
      nouns_ = sorted_unique(read_word_list(setup.options.data_dir, "nounlist.txt"));
    }
    if (config_.haystack == Haystack::Essay) essay_ = &xsum_essay(setup.options.data_dir);
  }

  int tokens_to_generate() const override { return 128; }
  // One key's values: 32 tokens per number or word, 64 per uuid (a 7-digit number is 8
  // tokens in Llama-2's digit-by-digit tokenizer, a uuid about 25), so that a conversation
  // of several turns fits where RULER's 128 per question would not.
  int turn_tokens_to_generate() const override {
    return config_.values * (config_.value == Draw::Uuids ? 64 : 32);
  }
  int min_units() const override {
    // Noise and needle haystacks draw one distinct unit position per needle.
    return config_.haystack == Haystack::Essay ? 1 : needle_count();
  }

  LongContextItem build(uint64_t seed, int units) const override {
    PythonRandom needle_rng = stream(seed, "needles");
    std::vector<std::string> keys;
    std::vector<std::vector<std::string>> values;
    struct Placed {
      std::string text;
      int key;
    };
    std::vector<Placed> needles;
    for (int k = 0; k < config_.keys; ++k) {
      std::string key = draw(needle_rng, config_.key);
      while (std::find(keys.begin(), keys.end(), key) != keys.end()) key = draw(needle_rng, config_.key);
      keys.push_back(key);
      values.emplace_back();
      for (int v = 0; v < config_.values; ++v) {
        values.back().push_back(draw(needle_rng, config_.value));
        needles.push_back({needle_text(key, values.back().back()), k});
      }
    }
    needle_rng.shuffle(needles);
    std::vector<size_t> asked = needle_rng.sample(keys.size(), static_cast<size_t>(config_.queries));

    // The context as a list of pieces; needle pieces carry their needle's index.
    struct Piece {
      std::string text;
      int needle = -1;
    };
    std::vector<Piece> pieces;
    std::vector<Needle> placed(needles.size());
    std::vector<std::pair<std::string, std::string>> distractors;  // needle haystack: (key, value), in context order
    PythonRandom position_rng = stream(seed, "positions");
    std::string separator;
    if (config_.haystack == Haystack::Essay) {
      separator = " ";
      const size_t essay_words = essay_->word_begin.size();
      std::vector<std::string> sentences;
      std::string sentence;
      for (int w = 0; w < units; ++w) {
        const size_t i = static_cast<size_t>(w) % essay_words;  // RULER repeats the essay as needed
        if (!sentence.empty()) sentence += ' ';
        sentence.append(essay_->text, essay_->word_begin[i], essay_->word_end[i] - essay_->word_begin[i]);
        if (essay_->sentence_end[i] || w + 1 == units) sentences.push_back(std::move(sentence)), sentence.clear();
      }
      std::vector<int> depths;
      for (size_t pick : position_rng.sample(ruler_depths().size(), needles.size()))
        depths.push_back(ruler_depths()[pick]);
      std::sort(depths.begin(), depths.end());
      const int count = static_cast<int>(sentences.size());
      size_t next_sentence = 0;
      for (size_t n = 0; n <= needles.size(); ++n) {
        // int(len(document_sents) * (depth / 100)), in RULER's floating point.
        const size_t until =
            n < needles.size() ? static_cast<size_t>(count * (depths[n] / 100.0)) : sentences.size();
        std::string run;
        for (; next_sentence < until; ++next_sentence) run += (run.empty() ? "" : " ") + sentences[next_sentence];
        if (!run.empty()) pieces.push_back({run});
        if (n < needles.size()) {
          pieces.push_back({needles[n].text, static_cast<int>(n)});
          placed[n].units_before = static_cast<int>(until);
          placed[n].depth = depths[n] / 100.0;
        }
      }
    } else {
      separator = "\n";
      PythonRandom haystack_rng = stream(seed, "haystack");
      distractors.reserve(static_cast<size_t>(units));
      for (int u = 0; u < units; ++u) {
        if (config_.haystack == Haystack::Noise) {
          pieces.push_back({kNoiseParagraph});
          continue;
        }
        std::string key = draw(haystack_rng, config_.key);
        // A distractor never shares a key with a real needle: the question stays unambiguous.
        while (std::find(keys.begin(), keys.end(), key) != keys.end()) key = draw(haystack_rng, config_.key);
        std::string value = draw(haystack_rng, config_.value);
        pieces.push_back({needle_text(key, value)});
        distractors.push_back({std::move(key), std::move(value)});
      }
      // random.sample(range(units), needles), inserted from the largest index down, so
      // needle n ends up with exactly index[n] haystack units before it.
      std::vector<size_t> index = position_rng.sample(static_cast<size_t>(units), needles.size());
      std::vector<size_t> order(needles.size());
      for (size_t n = 0; n < order.size(); ++n) order[n] = n;
      std::sort(order.begin(), order.end(), [&](size_t a, size_t b) { return index[a] > index[b]; });
      for (size_t n : order) {
        pieces.insert(pieces.begin() + static_cast<long>(index[n]), Piece{needles[n].text, static_cast<int>(n)});
        placed[n].units_before = static_cast<int>(index[n]);
        placed[n].depth = static_cast<double>(index[n]) / units;
      }
    }

    const bool one_answer = config_.queries * config_.values == 1;
    std::string plural = draw_name(config_.value);
    std::string type = one_answer ? plural.substr(0, plural.size() - 1) : plural;
    std::string header =
        "Some special magic {type} are hidden within the following text. Make sure to memorize it. "
        "I will quiz you about the {type} afterwards.\n";
    std::string question =
        "What are all the special magic {type} for {query} mentioned in the provided text?"
        " The special magic {type} for {query} mentioned in the provided text are";
    if (one_answer) {
      for (std::string* text : {&header, &question})
        *text = replace_all(replace_all(replace_all(*text, "Some", "A"), "are all", "is"), "are", "is");
    }
    std::vector<std::string> asked_keys;
    for (size_t k : asked) asked_keys.push_back(keys[k]);
    std::string query = asked_keys.back();
    if (asked_keys.size() > 1) {
      query.clear();
      for (size_t q = 0; q + 1 < asked_keys.size(); ++q) query += (q ? ", " : "") + asked_keys[q];
      query += ", and " + asked_keys.back();
    }

    LongContextItem item;
    item.context = fill(header, type, query);
    for (size_t p = 0; p < pieces.size(); ++p) {
      if (p) item.context += separator;
      if (pieces[p].needle >= 0) {
        Needle& needle = placed[static_cast<size_t>(pieces[p].needle)];
        needle.text = pieces[p].text;
        needle.offset = item.context.size();
      }
      item.context += pieces[p].text;
    }
    item.context += "\n";
    item.question = fill(question, type, query);
    for (size_t k : asked)
      for (const auto& value : values[k]) item.references.push_back(value);
    // Shared-context evaluation (SCBench): one question per key, in RULER's one-key form
    // (singular with one value per key): the asked keys first, then the other needles'
    // keys, then (a needle haystack, SCBench's key-value retrieval) each distractor's key
    // in context order, its one value the answer (a key drawn twice is asked once).
    std::vector<size_t> turn_keys = asked;
    for (size_t k = 0; k < keys.size(); ++k)
      if (std::find(asked.begin(), asked.end(), k) == asked.end()) turn_keys.push_back(k);
    const std::string singular = plural.substr(0, plural.size() - 1);
    auto one_key_question = [&](bool one_value, const std::string& key) {
      std::string text = question;
      if (!one_answer && one_value) text = replace_all(replace_all(text, "are all", "is"), "are", "is");
      if (one_answer && !one_value) throw Error("internal: a one-answer question for several values");
      return fill(text, one_value ? singular : plural, key);
    };
    std::vector<std::string> turn_key_names;
    for (size_t k : turn_keys) {
      item.turns.push_back({one_key_question(config_.values == 1, keys[k]), values[k]});
      turn_key_names.push_back(keys[k]);
    }
    for (const auto& [key, value] : distractors) {
      if (std::count(turn_key_names.begin(), turn_key_names.end(), key) > 0) continue;
      item.turns.push_back({one_key_question(true, key), {value}});
      turn_key_names.push_back(key);
    }
    item.needles = placed;
    if (one_answer)
      for (size_t n = 0; n < needles.size(); ++n)
        if (needles[n].key == static_cast<int>(asked.front())) item.depth = placed[n].depth;
    item.haystack = config_.haystack == Haystack::Noise ? "noise" : config_.haystack == Haystack::Needle ? "needle" : "xsum";
    return item;
  }

 private:
  static std::vector<std::string> sorted_unique(std::vector<std::string> words) {
    std::sort(words.begin(), words.end());
    words.erase(std::unique(words.begin(), words.end()), words.end());
    return words;
  }

  int needle_count() const { return config_.keys * config_.values; }

  static std::string draw_name(Draw what) {
    return what == Draw::Words ? "words" : what == Draw::Numbers ? "numbers" : "uuids";
  }

  std::string needle_text(const std::string& key, const std::string& value) const {
    return "One of the special magic " + draw_name(config_.value) + " for " + key + " is: " + value + ".";
  }

  std::string draw(PythonRandom& rng, Draw what) const {
    switch (what) {
      case Draw::Numbers:
        return std::to_string(randint(rng, 1000000, 9999999));
      case Draw::Uuids:
        return random_uuid(rng);
      case Draw::Words: {
        // random.choice over the sorted adjective-noun pairs.
        const uint64_t pick = rng.randbelow(static_cast<uint64_t>(adjectives_.size()) * nouns_.size());
        return adjectives_[pick / nouns_.size()] + "-" + nouns_[pick % nouns_.size()];
      }
    }
    throw Error("internal: unknown needle draw");
  }

  NiahConfig config_;
  std::vector<std::string> adjectives_, nouns_;
  const Essay* essay_ = nullptr;
};

std::unique_ptr<Task> ruler_niah_task(const std::string& name, NiahConfig config) {
  return make_long_context_task(
      name, [config](const LongContextSetup& setup) { return std::make_unique<RulerNiah>(config, setup); },
      LongContextScoring::RulerStringMatch);
}

}  // namespace

std::unique_ptr<Task> make_ruler_niah_single_1_task() {
  return ruler_niah_task("ruler_niah_single_1", {Haystack::Noise, Draw::Words, Draw::Numbers});
}
std::unique_ptr<Task> make_ruler_niah_single_2_task() {
  return ruler_niah_task("ruler_niah_single_2", {Haystack::Essay, Draw::Words, Draw::Numbers});
}
std::unique_ptr<Task> make_ruler_niah_single_3_task() {
  return ruler_niah_task("ruler_niah_single_3", {Haystack::Essay, Draw::Words, Draw::Uuids});
}
std::unique_ptr<Task> make_ruler_niah_multikey_1_task() {
  return ruler_niah_task("ruler_niah_multikey_1", {Haystack::Essay, Draw::Words, Draw::Numbers, 4});
}
std::unique_ptr<Task> make_ruler_niah_multikey_2_task() {
  return ruler_niah_task("ruler_niah_multikey_2", {Haystack::Needle, Draw::Words, Draw::Numbers});
}
std::unique_ptr<Task> make_ruler_niah_multikey_3_task() {
  return ruler_niah_task("ruler_niah_multikey_3", {Haystack::Needle, Draw::Uuids, Draw::Uuids});
}
std::unique_ptr<Task> make_ruler_niah_multivalue_task() {
  return ruler_niah_task("ruler_niah_multivalue", {Haystack::Essay, Draw::Words, Draw::Numbers, 1, 4});
}
std::unique_ptr<Task> make_ruler_niah_multiquery_task() {
  return ruler_niah_task("ruler_niah_multiquery", {Haystack::Essay, Draw::Words, Draw::Numbers, 1, 1, 4});
}

}  // namespace kvevict
