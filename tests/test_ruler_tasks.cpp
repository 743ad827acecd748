// The long-context tasks (tasks/long_context.h): RULER's synthetic tasks and the classic
// needle in a haystack. Prompts are checked against RULER's templates (restated in issue
// 30 and in scripts/data/synthetic/constants.py), fitted with real tokenizers
// (stories260K's SentencePiece and GPT-NeoX-20B's BPE), and scored against RULER's two
// metric functions; the expected scores below are what RULER's postprocess_pred,
// string_match_all and string_match_part (scripts/eval/) return for the same inputs
// under Python 3.11.
#include "tests/catch.h"

#include <algorithm>
#include <cmath>
#include <map>
#include <memory>
#include <regex>
#include <string>
#include <vector>

#include "harness/common/errors.h"
#include "harness/tokenizers/tokenizer.h"
#include "tasks/long_context.h"
#include "tasks/python_text.h"
#include "tasks/task.h"
#include "tests/test_support.h"

using namespace kvevict;

namespace {

// A string literal's bytes, embedded NULs included.
template <size_t N>
std::string bytes(const char (&literal)[N]) {
  return std::string(literal, N - 1);
}

const Tokenizer& stories_tokenizer() {
  static const auto tokenizer = load_tokenizer_for_model(test::data("models/stories260K-hf"));
  return *tokenizer;
}

const Tokenizer& neox_tokenizer() {
  static const auto tokenizer = load_bpe_tokenizer_json(test::data("tokenizers/gpt-neox-20b/tokenizer.json"));
  return *tokenizer;
}

const std::vector<std::string> kRulerTasks = {
    "ruler_niah_single_1", "ruler_niah_single_2",   "ruler_niah_single_3",   "ruler_niah_multikey_1",
    "ruler_niah_multikey_2", "ruler_niah_multikey_3", "ruler_niah_multivalue", "ruler_niah_multiquery",
    "ruler_vt",            "ruler_cwe",             "ruler_fwe"};

std::vector<std::string> all_tasks() {
  std::vector<std::string> tasks = kRulerTasks;
  tasks.push_back("niah");
  return tasks;
}

TaskOptions options_for(const std::string& task, int length, int seed = 42) {
  TaskOptions options;
  options.data_dir = test::data("");
  options.length = length;
  options.seed = seed;
  if (task == "niah") options.depth = 0.5;
  return options;
}

std::unique_ptr<LongContextGenerator> generator(const std::string& task, int length, const Tokenizer& tokenizer,
                                                int seed = 42) {
  return make_long_context_generator(task, options_for(task, length, seed), tokenizer);
}

size_t count_of(const std::string& text, const std::string& what) {
  size_t count = 0;
  for (size_t at = text.find(what); at != std::string::npos; at = text.find(what, at + 1)) ++count;
  return count;
}

int tokens(const Tokenizer& tokenizer, const std::string& text) {
  return static_cast<int>(tokenizer.encode(text).size());
}

std::vector<std::string> split(const std::string& text, char separator) {
  std::vector<std::string> parts;
  size_t start = 0;
  for (size_t at = text.find(separator); at != std::string::npos; at = text.find(separator, start)) {
    parts.push_back(text.substr(start, at - start));
    start = at + 1;
  }
  parts.push_back(text.substr(start));
  return parts;
}

// The haystack between the RULER niah header line and the context's final "\n".
std::string niah_haystack(const LongContextItem& item, size_t* begin) {
  *begin = item.context.find('\n') + 1;
  return item.context.substr(*begin, item.context.size() - 1 - *begin);
}

bool is_needle_at(const LongContextItem& item, size_t offset) {
  for (const Needle& needle : item.needles)
    if (needle.offset == offset) return true;
  return false;
}

}  // namespace

TEST_CASE("the long-context tasks are registered generation tasks", "[ruler]") {
  const auto names = task_names();
  for (const auto& task : all_tasks()) {
    INFO(task);
    CHECK(std::find(names.begin(), names.end(), task) != names.end());
    const auto made = make_task(task);
    CHECK(made->kind() == TaskKind::Generation);
    CHECK(made->metric_names() == (task == "niah" ? std::vector<std::string>{"rouge1_x10", "substring_recall"}
                                                  : std::vector<std::string>{"string_match_all", "string_match_part"}));
  }
}

TEST_CASE("the same (seed, task, length, index) gives the same prompt byte for byte", "[ruler]") {
  const Tokenizer& tokenizer = neox_tokenizer();
  for (const auto& task : all_tasks()) {
    INFO(task);
    const std::string prompt = generator(task, 1500, tokenizer)->item(2).prompt();
    // A fresh generator, and the documents of a run of three items, give it again.
    CHECK(generator(task, 1500, tokenizer)->item(2).prompt() == prompt);
    TaskOptions options = options_for(task, 1500);
    options.limit = 3;
    const auto docs = make_task(task)->generation_docs_for(tokenizer, options);
    REQUIRE(docs.size() == 3);
    CHECK(docs[2].prompt == prompt);
    // Any other index, seed or length draws another item.
    CHECK(generator(task, 1500, tokenizer)->item(1).prompt() != prompt);
    CHECK(generator(task, 1500, tokenizer, 43)->item(2).prompt() != prompt);
    CHECK(generator(task, 1400, tokenizer)->item(2).prompt() != prompt);
  }
}

TEST_CASE("every prompt plus its tokens to generate fits the length, and one more unit would not", "[ruler]") {
  struct Case {
    const char* name;
    const Tokenizer& tokenizer;
    int length;
  };
  // stories260K's 512-piece vocabulary spends about three tokens on a word, so vt's
  // one-shot example alone takes several hundred.
  const Case cases[] = {{"stories260K", stories_tokenizer(), 1536}, {"gpt-neox-20b", neox_tokenizer(), 1024}};
  for (const Case& c : cases) {
    for (const auto& task : all_tasks()) {
      INFO(c.name << " " << task << " length " << c.length);
      const auto generate = generator(task, c.length, c.tokenizer);
      for (int index = 0; index < 2; ++index) {
        const LongContextItem item = generate->item(index);
        CHECK(item.length == c.length);
        CHECK(item.prompt_tokens == tokens(c.tokenizer, item.prompt()));
        CHECK(item.prompt_tokens + item.tokens_to_generate <= c.length);
        // Each probe redraws the item from its own seed: the fitted item is the probe.
        CHECK(generate->item_with_units(index, item.haystack_units).prompt() == item.prompt());
        const LongContextItem more = generate->item_with_units(index, item.haystack_units + 1);
        CHECK(more.prompt_tokens == tokens(c.tokenizer, more.prompt()));
        CHECK(more.prompt_tokens + more.tokens_to_generate > c.length);
      }
    }
  }
  SECTION("at 4096 tokens and above (cwe's long lists, 500-token vt example)") {
    for (const char* task : {"ruler_cwe", "ruler_fwe", "ruler_vt", "ruler_niah_multikey_2"}) {
      INFO(task);
      const auto generate = generator(task, 4096, neox_tokenizer());
      const LongContextItem item = generate->item(0);
      CHECK(item.prompt_tokens + item.tokens_to_generate <= 4096);
      const LongContextItem more = generate->item_with_units(0, item.haystack_units + 1);
      CHECK(more.prompt_tokens + more.tokens_to_generate > 4096);
    }
  }
}

TEST_CASE("RULER's niah prompts follow its template, singular for one asked value", "[ruler]") {
  const Tokenizer& tokenizer = neox_tokenizer();
  const std::regex uuid("[0-9a-f]{8}-[0-9a-f]{4}-4[0-9a-f]{3}-[89ab][0-9a-f]{3}-[0-9a-f]{12}");
  const std::regex number("[1-9][0-9]{6}");
  const std::regex word("[^ ,]+-[^ ,]+");  // adjective-noun (either may hold a hyphen)
  struct Expect {
    const char* task;
    const char* haystack;
    const std::regex& key;
    const std::regex& value;
    size_t needles, asked_keys, references;
  };
  const Expect expected[] = {
      {"ruler_niah_single_1", "noise", word, number, 1, 1, 1},
      {"ruler_niah_single_2", "xsum", word, number, 1, 1, 1},
      {"ruler_niah_single_3", "xsum", word, uuid, 1, 1, 1},
      {"ruler_niah_multikey_1", "xsum", word, number, 4, 1, 1},
      {"ruler_niah_multikey_2", "needle", word, number, 1, 1, 1},
      {"ruler_niah_multikey_3", "needle", uuid, uuid, 1, 1, 1},
      {"ruler_niah_multivalue", "xsum", word, number, 4, 1, 4},
      {"ruler_niah_multiquery", "xsum", word, number, 4, 4, 4},
  };
  for (const Expect& e : expected) {
    INFO(e.task);
    const LongContextItem item = generator(e.task, 1200, tokenizer)->item(0);
    CHECK(item.haystack == e.haystack);
    CHECK(item.tokens_to_generate == 128);
    CHECK(item.needles.size() == e.needles);
    REQUIRE(item.references.size() == e.references);
    const bool one = e.references == 1;
    const std::string type = std::string(&e.value == &uuid ? "uuid" : "number") + (one ? "" : "s");
    const std::string header =
        std::string(one ? "A" : "Some") + " special magic " + type + (one ? " is" : " are") +
        " hidden within the following text. Make sure to memorize it. I will quiz you about the " + type +
        " afterwards.\n";
    CHECK(item.context.substr(0, header.size()) == header);
    CHECK(item.context.back() == '\n');
    // The question names the asked keys: "k" or "a, b, c, and d".
    const std::string ask = std::string(one ? "What is the" : "What are all the") + " special magic " + type + " for ";
    REQUIRE(item.question.substr(0, ask.size()) == ask);
    const std::string query = item.question.substr(ask.size(), item.question.find(" mentioned") - ask.size());
    std::vector<std::string> keys;
    if (e.asked_keys == 1) {
      keys = {query};
    } else {
      const size_t last = query.rfind(", and ");
      REQUIRE(last != std::string::npos);
      for (const auto& key : split(query.substr(0, last), ',')) keys.push_back(key.front() == ' ' ? key.substr(1) : key);
      keys.push_back(query.substr(last + 6));
    }
    REQUIRE(keys.size() == e.asked_keys);
    CHECK(item.question == ask + query + " mentioned in the provided text? The special magic " + type + " for " +
                               query + " mentioned in the provided text " + (one ? "is" : "are"));
    for (const auto& key : keys) CHECK(std::regex_match(key, e.key));

    // Every reference is the value of one needle "One of the special magic {types} for
    // {key} is: {value}." that names an asked key, and that needle is where the item says.
    const std::string plural = &e.value == &uuid ? "uuids" : "numbers";
    for (const auto& reference : item.references) {
      CHECK(std::regex_match(reference, e.value));
      CHECK(count_of(item.prompt(), reference) == 1);
      int holders = 0;
      for (const Needle& needle : item.needles) {
        CHECK(item.prompt().compare(needle.offset, needle.text.size(), needle.text) == 0);
        if (needle.text.size() < reference.size() + 2 ||
            needle.text.compare(needle.text.size() - reference.size() - 1, std::string::npos, reference + ".") != 0)
          continue;
        ++holders;
        bool asked = false;
        for (const auto& key : keys) asked |= needle.text == "One of the special magic " + plural + " for " + key + " is: " + reference + ".";
        CHECK(asked);
      }
      CHECK(holders == 1);
    }
    CHECK(item.depth.has_value() == (e.references == 1));
  }
}

TEST_CASE("RULER's needles sit at their depths", "[ruler]") {
  const Tokenizer& tokenizer = neox_tokenizer();
  SECTION("essay: between sentences, int(sentences * depth / 100) of them before the needle") {
    for (const char* task : {"ruler_niah_single_2", "ruler_niah_single_3", "ruler_niah_multikey_1",
                             "ruler_niah_multivalue", "ruler_niah_multiquery"}) {
      for (int index = 0; index < 3; ++index) {
        INFO(task << " item " << index);
        const LongContextItem item = generator(task, 2048, tokenizer)->item(index);
        size_t begin = 0;
        const std::string haystack = niah_haystack(item, &begin);
        // The essay's words with the needles taken out, and how many words precede each needle.
        std::vector<Needle> needles = item.needles;
        std::sort(needles.begin(), needles.end(), [](const Needle& a, const Needle& b) { return a.offset < b.offset; });
        std::vector<std::string> words;
        std::vector<size_t> words_before;
        size_t at = 0;
        for (const Needle& needle : needles) {
          const size_t local = needle.offset - begin;
          for (const auto& w : split(haystack.substr(at, local - at), ' '))
            if (!w.empty()) words.push_back(w);
          words_before.push_back(words.size());
          at = local + needle.text.size();
        }
        for (const auto& w : split(haystack.substr(at), ' '))
          if (!w.empty()) words.push_back(w);
        CHECK(static_cast<int>(words.size()) == item.haystack_units);
        std::vector<size_t> sentence_ends;  // word counts at which a sentence ends
        for (size_t i = 0; i < words.size(); ++i)
          if (i + 1 == words.size() || long_context::ends_sentence(words[i], words[i + 1])) sentence_ends.push_back(i + 1);
        const auto& depths = long_context::ruler_depths();
        for (size_t n = 0; n < needles.size(); ++n) {
          const int percent = static_cast<int>(std::lround(needles[n].depth * 100));
          CHECK(std::find(depths.begin(), depths.end(), percent) != depths.end());
          const auto expected = static_cast<size_t>(static_cast<double>(sentence_ends.size()) * (percent / 100.0));
          CHECK(needles[n].units_before == static_cast<int>(expected));
          // The needle follows exactly `expected` sentences (a sentence end, or the start).
          const size_t before = words_before[n];
          CHECK((before == 0 ? 0 : std::count_if(sentence_ends.begin(), sentence_ends.end(),
                                                 [&](size_t end) { return end <= before; })) == static_cast<long>(expected));
          CHECK((before == 0 || std::find(sentence_ends.begin(), sentence_ends.end(), before) != sentence_ends.end()));
        }
        if (item.depth) CHECK(std::count_if(needles.begin(), needles.end(), [&](const Needle& n) { return n.depth == *item.depth; }) >= 1);
      }
    }
  }
  SECTION("noise and needle haystacks: the drawn index of units before the needle") {
    const std::string noise = "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";
    for (const char* task : {"ruler_niah_single_1", "ruler_niah_multikey_2", "ruler_niah_multikey_3"}) {
      for (int index = 0; index < 3; ++index) {
        INFO(task << " item " << index);
        const LongContextItem item = generator(task, 2048, tokenizer)->item(index);
        size_t begin = 0;
        const std::string haystack = niah_haystack(item, &begin);
        const auto lines = split(haystack, '\n');
        REQUIRE(static_cast<int>(lines.size()) == item.haystack_units + 1);
        size_t offset = begin;
        int units = 0;
        for (const auto& line : lines) {
          if (is_needle_at(item, offset)) {
            const Needle& needle = item.needles.front();
            CHECK(line == needle.text);
            CHECK(needle.units_before == units);
            CHECK(needle.depth == static_cast<double>(units) / item.haystack_units);
            CHECK(item.depth == needle.depth);
          } else {
            ++units;
            if (std::string(task) == "ruler_niah_single_1") CHECK(line == noise);
            else CHECK(line.rfind("One of the special magic ", 0) == 0);
          }
          offset += line.size() + 1;
        }
        CHECK(units == item.haystack_units);
      }
    }
  }
  SECTION("vt: the chain's lines in order among the noise lines, after the example") {
    for (int index = 0; index < 3; ++index) {
      INFO("item " << index);
      const LongContextItem item = generator("ruler_vt", 2048, tokenizer)->item(index);
      const std::string intro = "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n";
      const size_t begin = item.context.rfind(intro) + intro.size();
      REQUIRE(item.context.rfind(intro) > 0);  // the example comes first
      const auto lines = split(item.context.substr(begin, item.context.size() - 1 - begin), '\n');
      REQUIRE(item.needles.size() == 5);
      size_t offset = begin, next = 0;
      int units = 0;
      for (const auto& line : lines) {
        if (next < item.needles.size() && item.needles[next].offset == offset) {
          CHECK(line == item.needles[next].text);
          CHECK(item.needles[next].units_before == units);
          ++next;
        } else {
          CHECK(line == "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.");
          ++units;
        }
        offset += line.size() + 1;
      }
      CHECK(next == 5);
      CHECK(units == item.haystack_units);
    }
  }
  SECTION("niah: at token depth d of the haystack, backed up to the previous sentence end") {
    for (const Tokenizer* t : {&neox_tokenizer(), &stories_tokenizer()}) {
      for (double depth : {0.0, 0.3, 0.5, 0.77, 1.0}) {
        INFO("depth " << depth);
        TaskOptions options = options_for("niah", 1024);
        options.depth = depth;
        const LongContextItem item = make_long_context_generator("niah", options, *t)->item(0);
        const std::string open = "This is a very long story book: <book> ", close = " </book>.\n";
        REQUIRE(item.context.substr(0, open.size()) == open);
        REQUIRE(item.context.substr(item.context.size() - close.size()) == close);
        CHECK(item.question == " Based on the content of the book, Question: What is the best thing to do in San Francisco?\nAnswer:");
        REQUIRE(item.needles.size() == 1);
        const Needle& needle = item.needles.front();
        CHECK(needle.text == "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.");
        CHECK(item.prompt().compare(needle.offset, needle.text.size(), needle.text) == 0);
        CHECK(item.references == std::vector<std::string>{"eat a sandwich and sit in Dolores Park on a sunny day"});
        // The haystack without the needle, and the needle's place in it.
        const std::string inner = item.context.substr(open.size(), item.context.size() - open.size() - close.size());
        const size_t at = needle.offset - open.size();
        std::string before = inner.substr(0, at), after = inner.substr(at + needle.text.size());
        if (at == 0) {
          after = after.substr(1);  // the needle's own space
        } else {
          REQUIRE(before.back() == ' ');
          before.pop_back();
        }
        const std::string haystack = before + after;
        const auto target = static_cast<long long>(tokens(*t, haystack) * depth);
        if (depth == 0) CHECK(at == 0);
        if (depth == 1) CHECK(after.empty());
        if (depth > 0 && depth < 1) {
          REQUIRE(!before.empty());
          CHECK(tokens(*t, before) <= target);
          // The needle follows a sentence end, and the next one lies beyond the target.
          const auto before_words = python_split(before);
          const auto after_spans = python_split_spans(after);
          REQUIRE(!after_spans.empty());
          auto after_word = [&](size_t w) {
            return after.substr(after_spans[w].first, after_spans[w].second - after_spans[w].first);
          };
          CHECK(long_context::ends_sentence(before_words.back(), after_word(0)));
          size_t end = 0;
          for (size_t w = 0; w < after_spans.size(); ++w) {
            end = after_spans[w].second;
            if (w + 1 == after_spans.size() || long_context::ends_sentence(after_word(w), after_word(w + 1))) break;
          }
          CHECK(tokens(*t, before + after.substr(0, end)) > target);
        }
      }
    }
  }
}

TEST_CASE("vt, cwe and fwe put their references where RULER does", "[ruler]") {
  const Tokenizer& tokenizer = neox_tokenizer();
  SECTION("vt: VAR r0 = value, then VAR r[j+1] = VAR r[j], once each") {
    const LongContextItem item = generator("ruler_vt", 1500, tokenizer)->item(0);
    REQUIRE(item.references.size() == 5);
    const std::string asked = "Question: Find all variables that are assigned the value ";
    REQUIRE(item.question.substr(0, asked.size()) == asked);
    const std::string value = item.question.substr(asked.size(), 5);
    CHECK(std::regex_match(value, std::regex("[1-9][0-9]{4}")));
    CHECK(item.question == asked + value +
                               " in the text above. Answer: According to the chain(s) of variable assignment in the "
                               "text above, 5 variables are assigned the value " + value + ", they are: ");
    CHECK(count_of(item.prompt(), "VAR " + item.references[0] + " = " + value + "\n") == 1);
    for (size_t j = 0; j + 1 < 5; ++j)
      CHECK(count_of(item.prompt(), "VAR " + item.references[j + 1] + " = VAR " + item.references[j] + " \n") == 1);
    for (const auto& name : item.references) CHECK(std::regex_match(name, std::regex("[A-Z]{5}")));
    // The one-shot example: 3-letter names, answered after the prefix.
    const size_t answer = item.context.find("they are:  ");
    REQUIRE(answer != std::string::npos);
    const size_t example_end = item.context.find("\n\nMemorize", answer);
    REQUIRE(example_end != std::string::npos);
    CHECK(std::regex_match(item.context.substr(answer + 11, example_end - answer - 11),
                           std::regex("[A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3} [A-Z]{3}")));
  }
  SECTION("cwe: the 10 common words 6 times each below 4096 tokens, 30 at 4096; the rest 1 and 3 times") {
    for (int length : {1500, 4096}) {
      INFO("length " << length);
      const LongContextItem item = generator("ruler_cwe", length, tokenizer)->item(0);
      const std::string intro =
          "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
          "that appear most often.\n";
      CHECK(item.question ==
            "Question: What are the 10 most common words in the above list? Answer: The top 10 words that appear most "
            "often in the list are:");
      REQUIRE(item.context.find(intro) == 0);  // the example first
      const size_t begin = item.context.rfind(intro) + intro.size();
      const std::string list = item.context.substr(begin, item.context.size() - 1 - begin);
      // "1. w 2. w ...": entries are cut at the next " k. ".
      std::map<std::string, int> counts;
      size_t at = 0;
      for (int k = 1;; ++k) {
        const std::string number = std::to_string(k) + ". ";
        REQUIRE(list.compare(at, number.size(), number) == 0);
        const size_t next = list.find(" " + std::to_string(k + 1) + ". ", at);
        const size_t end = next == std::string::npos ? list.size() : next;
        ++counts[list.substr(at + number.size(), end - at - number.size())];
        if (next == std::string::npos) break;
        at = next + 1;
      }
      const int common = length < 4096 ? 6 : 30, uncommon = length < 4096 ? 1 : 3;
      REQUIRE(item.references.size() == 10);
      for (const auto& word : item.references) CHECK(counts[word] == common);
      CHECK(static_cast<int>(counts.size()) == item.haystack_units);
      for (const auto& [word, count] : counts)
        if (std::find(item.references.begin(), item.references.end(), word) == item.references.end())
          CHECK(count == uncommon);
      // The example's answer lists its own common words, numbered.
      const size_t answer = item.context.find(item.question + " ");
      REQUIRE(answer != std::string::npos);
      const size_t example_end = item.context.find("\n" + intro, answer);
      REQUIRE(example_end != std::string::npos);
      const size_t from = answer + item.question.size() + 1;
      CHECK(std::regex_match(item.context.substr(from, example_end - from),
                             std::regex("1\\. [^0-9]+( [2-9]\\. [^0-9]+){8} 10\\. [^0-9]+")));
    }
  }
  SECTION("fwe: the references are the three most frequent coded words after the dots") {
    for (int index = 0; index < 3; ++index) {
      const LongContextItem item = generator("ruler_fwe", 1500, tokenizer)->item(index);
      const std::string intro =
          "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
          "appeared coded words. ";
      REQUIRE(item.context.substr(0, intro.size()) == intro);
      std::map<std::string, int> counts;
      for (const auto& word : split(item.context.substr(intro.size(), item.context.size() - 1 - intro.size()), ' '))
        ++counts[word];
      std::vector<std::pair<int, std::string>> ranked;
      for (const auto& [word, count] : counts) {
        if (word == "...") continue;
        CHECK(std::regex_match(word, std::regex("[a-z]{6}")));
        ranked.emplace_back(count, word);
      }
      std::sort(ranked.rbegin(), ranked.rend());
      REQUIRE(ranked.size() > 3);
      REQUIRE(item.references.size() == 3);
      for (int r = 0; r < 3; ++r) CHECK(item.references[static_cast<size_t>(r)] == ranked[static_cast<size_t>(r)].second);
      CHECK(ranked[2].first > ranked[3].first);
      CHECK(counts["..."] > ranked[0].first);  // rank 1 is the noise
    }
  }
}

TEST_CASE("the documents carry the context/question split, references, length and depth", "[ruler]") {
  const Tokenizer& tokenizer = neox_tokenizer();
  for (const auto& task : all_tasks()) {
    INFO(task);
    TaskOptions options = options_for(task, 1200);
    options.limit = 2;
    const auto made = make_task(task);
    const auto docs = made->generation_docs_for(tokenizer, options);
    REQUIRE(docs.size() == 2);
    const auto generate = generator(task, 1200, tokenizer);
    for (size_t i = 0; i < docs.size(); ++i) {
      const GenerationDoc& doc = docs[i];
      const LongContextItem item = generate->item(static_cast<int>(i));
      CHECK(doc.id == std::to_string(i));
      CHECK(doc.prompt == item.prompt());
      REQUIRE(doc.question_offset.has_value());
      CHECK(doc.prompt.substr(0, *doc.question_offset) == item.context);
      CHECK(doc.prompt.substr(*doc.question_offset) == item.question);
      CHECK(doc.references == item.references);
      CHECK(doc.max_new_tokens == item.tokens_to_generate);
      REQUIRE(doc.temperature.has_value());
      CHECK(*doc.temperature == 0.0);
      CHECK(doc.stop.empty());
      CHECK(doc.length == 1200);
      CHECK(doc.prompt_tokens == tokens(tokenizer, doc.prompt));
      CHECK(doc.depth == item.depth);
      CHECK(doc.haystack == item.haystack);
    }
    const std::map<std::string, int> to_generate = {{"ruler_vt", 30}, {"ruler_cwe", 120}, {"ruler_fwe", 50}, {"niah", 30}};
    CHECK(docs[0].max_new_tokens == (to_generate.count(task) ? to_generate.at(task) : 128));
  }
}

TEST_CASE("long-context options are checked with clear errors", "[ruler]") {
  const Tokenizer& tokenizer = neox_tokenizer();
  TaskOptions options = options_for("ruler_vt", 0);
  CHECK_THROWS_WITH(make_long_context_generator("ruler_vt", options, tokenizer),
                    Catch::Contains("ruler_vt needs a length in tokens"));
  options.length = 300;
  CHECK_THROWS_WITH(make_long_context_generator("ruler_vt", options, tokenizer)->item(0),
                    Catch::Contains("ruler_vt: length 300 is too short") && Catch::Contains("30 more"));
  options.length = 2000;
  options.depth = 0.5;
  CHECK_THROWS_WITH(make_long_context_generator("ruler_vt", options, tokenizer),
                    Catch::Contains("a depth applies only to niah"));
  TaskOptions niah = options_for("niah", 2000);
  niah.depth.reset();
  CHECK_THROWS_WITH(make_long_context_generator("niah", niah, tokenizer), Catch::Contains("niah needs a needle depth"));
  niah.depth = 1.5;
  CHECK_THROWS_WITH(make_long_context_generator("niah", niah, tokenizer), Catch::Contains("is not in [0, 1]"));
  CHECK_THROWS_WITH(make_long_context_generator("ruler_fwe", options_for("ruler_fwe", 200), tokenizer),
                    Catch::Contains("gives a vocabulary of 3 coded words"));
  TaskOptions shots = options_for("ruler_cwe", 2000);
  shots.shots = 2;
  CHECK_THROWS_WITH(make_long_context_generator("ruler_cwe", shots, tokenizer), Catch::Contains("takes no few-shot examples"));
  TaskOptions h2o = options_for("niah", 2000);
  h2o.pipeline = Pipeline::H2O;
  CHECK_THROWS_WITH(make_long_context_generator("niah", h2o, tokenizer), Catch::Contains("lm-eval pipeline only"));
  CHECK_THROWS_WITH(make_task("ruler_cwe")->generation_docs(options_for("ruler_cwe", 2000)),
                    Catch::Contains("needs the model's tokenizer"));
  CHECK_THROWS_WITH(make_long_context_generator("xsum", options_for("xsum", 2000), tokenizer),
                    Catch::Contains("not a long-context task"));
}

TEST_CASE("RULER's scoring: postprocess, string_match_all and string_match_part", "[ruler][scoring]") {
  CHECK(ruler_postprocess(" The special magic number is 1234567.\n\n") == "The special magic number is 1234567.");
  // strip() keeps the leading control characters; they become "\n" and the second strip() drops them.
  CHECK(ruler_postprocess(bytes("\x00\x07 \xC3\x84pfel\x1f" "and\x1b" "Birnen \t")) == "\xC3\x84pfel\nand\nBirnen");
  CHECK(ruler_postprocess("\x1c\x1dX\x1e\x1f") == "X");                // Python's strip() counts \x1c-\x1f as space
  CHECK(ruler_postprocess("\xE2\x80\xA8 ok \x0b") == "ok");            // U+2028 and \v too
  CHECK(python_lower("\xC3\x84PFEL ABC") == "\xC3\xA4pfel abc");

  const std::vector<std::string> raw = {" The special magic number is 1234567.\n\n", "VAR abcde, VAR FGHIJ",
                                        "nothing here", bytes("\x00\x07 \xC3\x84pfel\x1f" "and\x1b" "Birnen \t")};
  const std::vector<std::vector<std::string>> references = {
      {"1234567"}, {"ABCDE", "FGHIJ", "KLMNO"}, {"x1", "y2"}, {"\xC3\xA4pfel", "BIRNEN", "\xC3\xA4pfel\nand", "\xC3\xA4pfel and"}};
  std::vector<std::string> processed;
  for (const auto& p : raw) processed.push_back(ruler_postprocess(p));
  // Python: string_match_all(pp, refs) == 60.42, string_match_part == 75.0; unprocessed 54.17 and 75.0.
  CHECK(string_match_all(processed, references) == 60.42);
  CHECK(string_match_part(processed, references) == 75.0);
  CHECK(string_match_all(raw, references) == 54.17);
  CHECK(string_match_part(raw, references) == 75.0);
  CHECK(string_match_all({"a b"}, {{"A", "B", "C"}}) == 66.67);
  CHECK(string_match_part({"a"}, {{"A", "B", "C"}}) == 100.0);
  const std::vector<std::vector<std::string>> abc(6, {"a", "b", "c"});
  CHECK(string_match_all({"ab", "a", "", "abc", "x", "y"}, abc) == 33.33);
  CHECK(string_match_part({"ab", "a", "", "abc", "x", "y"}, abc) == 50.0);
  CHECK(string_match_all_fraction("ZZ the Abc", {"abc", "zz", "q"}) == Approx(2.0 / 3));
  CHECK_THROWS_AS(string_match_all({}, {}), Error);
  CHECK_THROWS_AS(string_match_all({"a"}, {{}}), Error);

  SECTION("a RULER task scores its documents with them") {
    const auto task = make_task("ruler_niah_multivalue");
    std::vector<GenerationDoc> docs(2);
    docs[0].references = {"1111111", "2222222", "3333333", "4444444"};
    docs[1].references = {"5555555", "6666666", "7777777", "8888888"};
    const auto scores = task->score_generations(docs, {" 1111111, 2222222\x01 and 4444444.", "\n\n8888888"});
    REQUIRE(scores.has_value());
    CHECK(scores->per_doc == std::vector<double>{75.0, 25.0});
    REQUIRE(scores->metrics.size() == 2);
    CHECK(scores->metrics[0].name == "string_match_all");
    CHECK(scores->metrics[0].value == 50.0);
    CHECK(scores->metrics[0].n == 2);
    CHECK(scores->metrics[0].stderr_ == Approx(25.0));  // sample sd 35.36 / sqrt(2)
    CHECK(scores->metrics[1].name == "string_match_part");
    CHECK(scores->metrics[1].value == 100.0);
    CHECK_THROWS_AS(task->score_generations(docs, {"only one"}), Error);
  }
  SECTION("niah: ROUGE-1 F x 10 of the needle, and substring recall") {
    const auto task = make_task("niah");
    GenerationDoc doc;
    doc.reference = "The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.";
    doc.references = {"eat a sandwich and sit in Dolores Park on a sunny day"};
    const std::vector<GenerationDoc> docs(3, doc);
    const auto scores = task->score_generations(
        docs, {" The best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.",
               "Eat a sandwich and sit in Dolores Park on a sunny day", ""});
    REQUIRE(scores.has_value());
    REQUIRE(scores->per_doc.size() == 3);
    CHECK(scores->per_doc[0] == Approx(10.0));
    // 12 of the needle's 21 words, all of the answer's: F = 2 * (12/21) / (1 + 12/21) = 24/33.
    CHECK(scores->per_doc[1] == Approx(10.0 * 24 / 33).epsilon(1e-12));
    CHECK(scores->per_doc[2] == 0.0);
    CHECK(scores->metrics[0].name == "rouge1_x10");
    CHECK(scores->metrics[1].name == "substring_recall");
    CHECK(scores->metrics[1].value == Approx(200.0 / 3));
  }
}
