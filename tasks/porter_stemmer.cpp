// NLTK PorterStemmer, NLTK_EXTENSIONS mode. The structure follows NLTK's own: each step
// is an ordered list of (suffix, replacement, condition) rules and only the FIRST rule
// whose suffix matches is considered; if its condition fails the word is left alone and
// later rules are not tried. Several NLTK results depend on that (e.g. "ement" blocking
// "ment"/"ent" in step 4), so do not "simplify" it into trying every rule.
#include "tasks/porter_stemmer.h"

#include <string_view>
#include <unordered_map>
#include <vector>

#include "harness/common/text.h"

namespace kvevict {
namespace {

using StemCondition = bool (*)(const std::string& stem);

struct SuffixRule {
  std::string_view suffix;
  std::string_view replacement;
  StemCondition condition;  // nullptr: unconditional
};

bool is_vowel_letter(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

// Porter's consonant: anything but a,e,i,o,u, and 'y' only when it starts the word or
// follows a vowel. NLTK defines this recursively; a run of y's alternates, so count it.
bool is_consonant(const std::string& word, size_t i) {
  if (is_vowel_letter(word[i])) return false;
  if (word[i] != 'y') return true;
  size_t run_start = i;
  while (run_start > 0 && word[run_start - 1] == 'y') --run_start;
  bool first_y_is_consonant = run_start == 0 || is_vowel_letter(word[run_start - 1]);
  return ((i - run_start) % 2 == 0) ? first_y_is_consonant : !first_y_is_consonant;
}

// m in [C](VC){m}[V]: the number of vowel->consonant transitions.
int measure(const std::string& stem) {
  int m = 0;
  for (size_t i = 1; i < stem.size(); ++i) {
    if (!is_consonant(stem, i - 1) && is_consonant(stem, i)) ++m;
  }
  return m;
}

bool has_positive_measure(const std::string& stem) { return measure(stem) > 0; }
bool measure_greater_than_one(const std::string& stem) { return measure(stem) > 1; }

bool contains_vowel(const std::string& stem) {
  for (size_t i = 0; i < stem.size(); ++i) {
    if (!is_consonant(stem, i)) return true;
  }
  return false;
}

bool ends_double_consonant(const std::string& word) {
  size_t n = word.size();
  return n >= 2 && word[n - 1] == word[n - 2] && is_consonant(word, n - 1);
}

// Condition *o, plus NLTK's extension that a 2-letter vowel-consonant word also counts
// (so "are", "ice", "use" keep their final e).
bool ends_cvc(const std::string& word) {
  size_t n = word.size();
  if (n >= 3 && is_consonant(word, n - 3) && !is_consonant(word, n - 2) &&
      is_consonant(word, n - 1) && word[n - 1] != 'w' && word[n - 1] != 'x' &&
      word[n - 1] != 'y') {
    return true;
  }
  return n == 2 && !is_consonant(word, 0) && is_consonant(word, 1);
}

std::string apply_first_matching_rule(const std::string& word,
                                      const std::vector<SuffixRule>& rules) {
  for (const SuffixRule& rule : rules) {
    if (!ends_with(word, rule.suffix)) continue;
    std::string stem = word.substr(0, word.size() - rule.suffix.size());
    if (rule.condition == nullptr || rule.condition(stem)) {
      return stem.append(rule.replacement);
    }
    return word;
  }
  return word;
}

std::string step1a(const std::string& word) {
  // NLTK: a 4-letter "-ies" word keeps "ie" ("dies" -> "die", but "flies" -> "fli").
  if (word.size() == 4 && ends_with(word, "ies")) return word.substr(0, 1) + "ie";
  static const std::vector<SuffixRule> rules = {
      {"sses", "ss", nullptr},
      {"ies", "i", nullptr},
      {"ss", "ss", nullptr},
      {"s", "", nullptr},
  };
  return apply_first_matching_rule(word, rules);
}

std::string step1b(const std::string& word) {
  // NLTK: "-ied" always goes, to "ie" for 4-letter words ("died" -> "die") and to "i"
  // otherwise ("spied" -> "spi"); the usual ed/ing tail rules are not applied after it.
  if (ends_with(word, "ied")) {
    return word.substr(0, word.size() - 3) + (word.size() == 4 ? "ie" : "i");
  }
  if (ends_with(word, "eed")) {
    std::string stem = word.substr(0, word.size() - 3);
    return measure(stem) > 0 ? stem + "ee" : word;
  }

  std::string stem;
  bool removed_ed_or_ing = false;
  for (std::string_view suffix : {std::string_view("ed"), std::string_view("ing")}) {
    if (ends_with(word, suffix)) {
      std::string candidate = word.substr(0, word.size() - suffix.size());
      if (contains_vowel(candidate)) {
        stem = std::move(candidate);
        removed_ed_or_ing = true;
        break;
      }
    }
  }
  if (!removed_ed_or_ing) return word;

  if (ends_with(stem, "at") || ends_with(stem, "bl") || ends_with(stem, "iz")) return stem + "e";
  if (ends_double_consonant(stem)) {
    // A double consonant is undoubled unless it is l, s or z; either way the
    // final "add e" rule is not tried.
    char last = stem.back();
    if (last != 'l' && last != 's' && last != 'z') stem.pop_back();
    return stem;
  }
  if (measure(stem) == 1 && ends_cvc(stem)) return stem + "e";
  return stem;
}

bool consonant_before_final_y(const std::string& stem) {
  return stem.size() > 1 && is_consonant(stem, stem.size() - 1);
}

std::string step1c(const std::string& word) {
  // NLTK: y -> i only after a consonant that is not the whole stem ("happy" -> "happi",
  // "enjoy" and "by" unchanged, "cry" -> "cri").
  static const std::vector<SuffixRule> rules = {{"y", "i", consonant_before_final_y}};
  return apply_first_matching_rule(word, rules);
}

// NLTK's "logi" -> "log" keeps the 'l' with the stem when measuring ("geologi" -> "geolog").
bool positive_measure_with_l(const std::string& stem) { return has_positive_measure(stem + "l"); }

std::string step2(const std::string& word) {
  // NLTK applies alli -> al first and then runs step 2 again on the result.
  if (ends_with(word, "alli")) {
    std::string stem = word.substr(0, word.size() - 4);
    if (has_positive_measure(stem)) return step2(stem + "al");
  }
  static const std::vector<SuffixRule> rules = {
      {"ational", "ate", has_positive_measure},
      {"tional", "tion", has_positive_measure},
      {"enci", "ence", has_positive_measure},
      {"anci", "ance", has_positive_measure},
      {"izer", "ize", has_positive_measure},
      {"bli", "ble", has_positive_measure},  // NLTK/Martin: "bli", not the paper's "abli"
      {"alli", "al", has_positive_measure},
      {"entli", "ent", has_positive_measure},
      {"eli", "e", has_positive_measure},
      {"ousli", "ous", has_positive_measure},
      {"ization", "ize", has_positive_measure},
      {"ation", "ate", has_positive_measure},
      {"ator", "ate", has_positive_measure},
      {"alism", "al", has_positive_measure},
      {"iveness", "ive", has_positive_measure},
      {"fulness", "ful", has_positive_measure},
      {"ousness", "ous", has_positive_measure},
      {"aliti", "al", has_positive_measure},
      {"iviti", "ive", has_positive_measure},
      {"biliti", "ble", has_positive_measure},
      {"fulli", "ful", has_positive_measure},  // NLTK extension
      {"logi", "log", positive_measure_with_l},  // NLTK extension
  };
  return apply_first_matching_rule(word, rules);
}

std::string step3(const std::string& word) {
  static const std::vector<SuffixRule> rules = {
      {"icate", "ic", has_positive_measure}, {"ative", "", has_positive_measure},
      {"alize", "al", has_positive_measure}, {"iciti", "ic", has_positive_measure},
      {"ical", "ic", has_positive_measure},  {"ful", "", has_positive_measure},
      {"ness", "", has_positive_measure},
  };
  return apply_first_matching_rule(word, rules);
}

bool removable_ion(const std::string& stem) {
  return measure(stem) > 1 && (stem.back() == 's' || stem.back() == 't');
}

std::string step4(const std::string& word) {
  static const std::vector<SuffixRule> rules = {
      {"al", "", measure_greater_than_one},   {"ance", "", measure_greater_than_one},
      {"ence", "", measure_greater_than_one}, {"er", "", measure_greater_than_one},
      {"ic", "", measure_greater_than_one},   {"able", "", measure_greater_than_one},
      {"ible", "", measure_greater_than_one}, {"ant", "", measure_greater_than_one},
      {"ement", "", measure_greater_than_one}, {"ment", "", measure_greater_than_one},
      {"ent", "", measure_greater_than_one},  {"ion", "", removable_ion},
      {"ou", "", measure_greater_than_one},   {"ism", "", measure_greater_than_one},
      {"ate", "", measure_greater_than_one},  {"iti", "", measure_greater_than_one},
      {"ous", "", measure_greater_than_one},  {"ive", "", measure_greater_than_one},
      {"ize", "", measure_greater_than_one},
  };
  return apply_first_matching_rule(word, rules);
}

std::string step5a(const std::string& word) {
  // Unlike the other steps, both conditions are tried for the same suffix.
  if (!ends_with(word, "e")) return word;
  std::string stem = word.substr(0, word.size() - 1);
  int m = measure(stem);
  if (m > 1 || (m == 1 && !ends_cvc(stem))) return stem;
  return word;
}

// NLTK measures "-ll" words with one 'l' kept (word[:-1]), i.e. stem + "l".
bool measure_with_l_greater_than_one(const std::string& stem) { return measure(stem + "l") > 1; }

std::string step5b(const std::string& word) {
  static const std::vector<SuffixRule> rules = {{"ll", "l", measure_with_l_greater_than_one}};
  return apply_first_matching_rule(word, rules);
}

// NLTK's irregular forms: these words bypass the steps entirely.
const std::unordered_map<std::string, std::string>& irregular_forms() {
  static const std::unordered_map<std::string, std::string> table = {
      {"sky", "sky"},         {"skies", "sky"},       {"dying", "die"},
      {"lying", "lie"},       {"tying", "tie"},       {"news", "news"},
      {"innings", "inning"},  {"inning", "inning"},   {"outings", "outing"},
      {"outing", "outing"},   {"cannings", "canning"}, {"canning", "canning"},
      {"howe", "howe"},       {"proceed", "proceed"}, {"exceed", "exceed"},
      {"succeed", "succeed"},
  };
  return table;
}

}  // namespace

std::string porter_stem(const std::string& word) {
  std::string lowered = word;
  for (char& c : lowered) {
    if (c >= 'A' && c <= 'Z') c = static_cast<char>(c - 'A' + 'a');
  }
  // NLTK looks the table up with the word before lowercasing ("Sky" is stemmed normally).
  auto irregular = irregular_forms().find(word);
  if (irregular != irregular_forms().end()) return irregular->second;
  if (word.size() <= 2) return lowered;

  std::string stem = step1a(lowered);
  stem = step1b(stem);
  stem = step1c(stem);
  stem = step2(stem);
  stem = step3(stem);
  stem = step4(stem);
  stem = step5a(stem);
  stem = step5b(stem);
  return stem;
}

}  // namespace kvevict
