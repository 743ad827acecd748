#include "tasks/python_text.h"

#include "harness/common/utf8.h"

namespace kvevict {
namespace {

bool is_continuation_byte(unsigned char c) { return (c & 0xC0) == 0x80; }

// Decodes the code point starting at s[i]; returns its byte length in `len`.
// Malformed bytes decode as themselves (one byte), which no whitespace test matches.
char32_t decode_at(const std::string& s, size_t i, size_t& len) {
  const Utf8Char c = decode_utf8_at(s, i);
  len = c.valid ? c.length : 1;
  return c.valid ? c.value : static_cast<unsigned char>(s[i]);
}

// str.isspace(): Unicode categories Zs plus bidi classes WS, B and S.
bool is_python_space(char32_t cp) {
  return (cp >= 0x09 && cp <= 0x0D) || (cp >= 0x1C && cp <= 0x20) || cp == 0x85 || cp == 0xA0 ||
         cp == 0x1680 || (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 ||
         cp == 0x202F || cp == 0x205F || cp == 0x3000;
}

// Byte offset of the code point that ends at `end` (exclusive).
size_t start_of_last_char(const std::string& s, size_t end) {
  size_t i = end - 1;
  while (i > 0 && is_continuation_byte(static_cast<unsigned char>(s[i])) && end - i < 4) --i;
  return i;
}

}  // namespace

size_t python_len(const std::string& utf8) {
  size_t n = 0;
  for (size_t i = 0, len = 0; i < utf8.size(); i += len, ++n) decode_at(utf8, i, len);
  return n;
}

std::string python_strip(const std::string& utf8) {
  size_t begin = 0, len = 0;
  while (begin < utf8.size() && is_python_space(decode_at(utf8, begin, len))) begin += len;
  size_t end = utf8.size();
  while (end > begin) {
    const size_t start = start_of_last_char(utf8, end);
    if (!is_python_space(decode_at(utf8, start, len)) || start + len != end) break;
    end = start;
  }
  return utf8.substr(begin, end - begin);
}

std::vector<std::pair<size_t, size_t>> python_split_spans(const std::string& utf8) {
  std::vector<std::pair<size_t, size_t>> spans;
  size_t word_start = std::string::npos, len = 0;
  for (size_t i = 0; i < utf8.size(); i += len) {
    const bool space = is_python_space(decode_at(utf8, i, len));
    if (space && word_start != std::string::npos) {
      spans.emplace_back(word_start, i);
      word_start = std::string::npos;
    } else if (!space && word_start == std::string::npos) {
      word_start = i;
    }
  }
  if (word_start != std::string::npos) spans.emplace_back(word_start, utf8.size());
  return spans;
}

std::vector<std::string> python_split(const std::string& utf8) {
  std::vector<std::string> words;
  for (const auto& [begin, end] : python_split_spans(utf8)) words.push_back(utf8.substr(begin, end - begin));
  return words;
}

std::string python_drop_last_char(const std::string& utf8) {
  if (utf8.empty()) return utf8;
  return utf8.substr(0, start_of_last_char(utf8, utf8.size()));
}

std::string python_lower_first_char(const std::string& utf8) {
  std::string out = utf8;
  if (!out.empty() && out[0] >= 'A' && out[0] <= 'Z')
    out[0] = static_cast<char>(out[0] - 'A' + 'a');
  return out;
}

}  // namespace kvevict
