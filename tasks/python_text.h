// Python `str` semantics on UTF-8 std::strings, where lm-eval and HELM rely on them:
// len() counts code points (acc_norm), strip()/split() use Unicode whitespace.
#pragma once
#include <string>
#include <utility>
#include <vector>

namespace kvevict {

// len(s): the number of code points.
size_t python_len(const std::string& utf8);

// s.strip(): leading and trailing Unicode whitespace removed.
std::string python_strip(const std::string& utf8);

// s.split(): runs of Unicode whitespace separate words; no empty words.
std::vector<std::string> python_split(const std::string& utf8);

// s.split() as [begin, end) byte ranges of the words in `utf8`.
std::vector<std::pair<size_t, size_t>> python_split_spans(const std::string& utf8);

// s[:-1]: everything but the last code point.
std::string python_drop_last_char(const std::string& utf8);

// s[0].lower() + s[1:] for an ASCII first letter; other first characters are kept
// (the shipped COPA choices all start with ASCII letters).
std::string python_lower_first_char(const std::string& utf8);

}  // namespace kvevict
