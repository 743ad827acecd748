#include "tasks/ftfy.h"

#include <unicode/normalizer2.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include <algorithm>
#include <array>
#include <map>
#include <optional>
#include <unordered_set>
#include <vector>

#include "harness/common/errors.h"

namespace kvevict {
namespace {

using Text = std::u32string;
using Bytes = std::string;

// ---------------------------------------------------------------- UTF-8 <-> code points

// Python's strict UTF-8 decoder (no overlongs, no surrogates, nothing past U+10FFFF).
// With `variants`, also ftfy's utf-8-variants: CESU-8 surrogate pairs and C0 80 for NUL.
std::optional<Text> decode_utf8(const Bytes& bytes, bool variants) {
  Text out;
  const size_t n = bytes.size();
  auto byte = [&](size_t i) { return static_cast<unsigned char>(bytes[i]); };
  auto cont = [&](size_t i) { return i < n && (byte(i) & 0xC0) == 0x80; };
  for (size_t i = 0; i < n;) {
    const unsigned char b = byte(i);
    if (b < 0x80) {
      out.push_back(b);
      ++i;
    } else if (variants && b == 0xC0 && i + 1 < n && byte(i + 1) == 0x80) {
      out.push_back(0);
      i += 2;
    } else if (b >= 0xC2 && b <= 0xDF && cont(i + 1)) {
      out.push_back(((b & 0x1F) << 6) | (byte(i + 1) & 0x3F));
      i += 2;
    } else if (b >= 0xE0 && b <= 0xEF && cont(i + 1) && cont(i + 2)) {
      const char32_t c = ((b & 0x0F) << 12) | ((byte(i + 1) & 0x3F) << 6) | (byte(i + 2) & 0x3F);
      if (c < 0x800) return std::nullopt;
      if (c >= 0xD800 && c <= 0xDBFF && variants && i + 5 < n + 0 && byte(i + 3) == 0xED &&
          cont(i + 4) && cont(i + 5)) {
        const char32_t low = ((byte(i + 4) & 0x3F) << 6 | (byte(i + 5) & 0x3F)) | 0xD000;
        if (low >= 0xDC00 && low <= 0xDFFF) {
          out.push_back(0x10000 + ((c - 0xD800) << 10) + (low - 0xDC00));
          i += 6;
          continue;
        }
      }
      if (c >= 0xD800 && c <= 0xDFFF) return std::nullopt;
      out.push_back(c);
      i += 3;
    } else if (b >= 0xF0 && b <= 0xF4 && cont(i + 1) && cont(i + 2) && cont(i + 3)) {
      const char32_t c = ((b & 0x07) << 18) | ((byte(i + 1) & 0x3F) << 12) |
                         ((byte(i + 2) & 0x3F) << 6) | (byte(i + 3) & 0x3F);
      if (c < 0x10000 || c > 0x10FFFF) return std::nullopt;
      out.push_back(c);
      i += 4;
    } else {
      return std::nullopt;
    }
  }
  return out;
}

std::string encode_utf8(const Text& text) {
  std::string out;
  for (char32_t c : text) {
    if (c < 0x80) {
      out.push_back(static_cast<char>(c));
    } else if (c < 0x800) {
      out.push_back(static_cast<char>(0xC0 | (c >> 6)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else if (c < 0x10000) {
      out.push_back(static_cast<char>(0xE0 | (c >> 12)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    } else {
      out.push_back(static_cast<char>(0xF0 | (c >> 18)));
      out.push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
      out.push_back(static_cast<char>(0x80 | (c & 0x3F)));
    }
  }
  return out;
}

// ------------------------------------------------------------- single-byte encodings

// windows-1252 for bytes 0x80..0x9F (0: undefined in the standard codec).
constexpr std::array<char32_t, 32> kCp1252High = {
    0x20AC, 0, 0x201A, 0x0192, 0x201E, 0x2026, 0x2020, 0x2021, 0x02C6, 0x2030, 0x0160,
    0x2039, 0x0152, 0, 0x017D, 0, 0, 0x2018, 0x2019, 0x201C, 0x201D, 0x2022,
    0x2013, 0x2014, 0x02DC, 0x2122, 0x0161, 0x203A, 0x0153, 0, 0x017E, 0x0178};

// ftfy's "sloppy" windows-1252: the undefined bytes decode to the C1 character of the
// same number, and byte 0x1A stands for U+FFFD.
char32_t sloppy_1252_char(unsigned char b) {
  if (b == 0x1A) return 0xFFFD;
  if (b >= 0x80 && b <= 0x9F) return kCp1252High[b - 0x80] ? kCp1252High[b - 0x80] : b;
  return b;
}

const std::map<char32_t, unsigned char>& sloppy_1252_bytes() {
  static const std::map<char32_t, unsigned char> table = [] {
    std::map<char32_t, unsigned char> t;
    for (int b = 0; b < 256; ++b) t[sloppy_1252_char(static_cast<unsigned char>(b))] = static_cast<unsigned char>(b);
    return t;
  }();
  return table;
}

std::optional<Bytes> encode_latin1(const Text& text) {
  Bytes out;
  for (char32_t c : text) {
    if (c > 0xFF) return std::nullopt;
    out.push_back(static_cast<char>(c));
  }
  return out;
}

std::optional<Bytes> encode_sloppy_1252(const Text& text) {
  const auto& table = sloppy_1252_bytes();
  Bytes out;
  for (char32_t c : text) {
    auto it = table.find(c);
    if (it == table.end()) return std::nullopt;
    out.push_back(static_cast<char>(it->second));
  }
  return out;
}

// ------------------------------------------------------------------ badness rules

struct CharSet {
  std::unordered_set<char32_t> chars;
  CharSet(std::initializer_list<char32_t> singles, std::initializer_list<std::pair<char32_t, char32_t>> ranges = {})
      : chars(singles) {
    for (auto [a, b] : ranges)
      for (char32_t c = a; c <= b; ++c) chars.insert(c);
  }
  bool operator()(char32_t c) const { return chars.count(c) != 0; }
};

// ftfy 6.1's character categories for UTF-8 mojibake (badness.py MOJIBAKE_CATEGORIES).
const CharSet kCommon{{0xA0, 0xAD, 0xB7, 0xB4, 0x2013, 0x2014, 0x2015, 0x2026, 0x2019}};
const CharSet kBad{{0xA6, 0xA4, 0xA8, 0xAC, 0xAF, 0xB6, 0xA7, 0xB8, 0x192, 0x2C6, 0x2C7, 0x2D8,
                    0x2DB, 0x2DC, 0x2020, 0x2021, 0x2030, 0x2310, 0x25CA, 0xFFFD, 0xAA, 0xBA}};
const CharSet kCurrency{{0xA2, 0xA3, 0xA5, 0x20A7, 0x20AC}};
const CharSet kStartPunct{{0xA1, 0xAB, 0xBF, 0xA9, 0x384, 0x385, 0x2018, 0x201A, 0x201C, 0x201E,
                           0x2022, 0x2039, 0xF8FF}};
const CharSet kEndPunct{{0xAE, 0xBB, 0x2DD, 0x201D, 0x203A, 0x2122}};
const CharSet kNumeric{{0xB2, 0xB3, 0xB9, 0xB1, 0xBC, 0xBD, 0xBE, 0xD7, 0xB5, 0xF7, 0x2044, 0x2202,
                        0x2206, 0x220F, 0x2211, 0x221A, 0x221E, 0x2229, 0x222B, 0x2248, 0x2260,
                        0x2261, 0x2264, 0x2265, 0x2116}};
const CharSet kKaomoji{{0x150, 0xB0}, {{0xD2, 0xD6}, {0xD9, 0xDC}, {0xF2, 0xF6}, {0xF8, 0xFC}}};
const CharSet kUpperAccented{{0xD8, 0xDC, 0xDD, 0x102, 0x104, 0x106, 0x10C, 0x10E, 0x110, 0x118,
                              0x11A, 0x11E, 0x130, 0x139, 0x13D, 0x141, 0x143, 0x147, 0x152, 0x158,
                              0x15A, 0x15E, 0x160, 0x162, 0x164, 0x16E, 0x170, 0x178, 0x179, 0x17B,
                              0x17D, 0x490},
                             {{0xC0, 0xD1}}};
const CharSet kLowerAccented{{0xDF, 0x103, 0x105, 0x107, 0x10D, 0x10F, 0x111, 0x119, 0x11B, 0x11F,
                              0x13A, 0x13E, 0x142, 0x153, 0x155, 0x15B, 0x15F, 0x161, 0x165, 0xFC,
                              0x17A, 0x17C, 0x17E, 0x491, 0xFB01, 0xFB02},
                             {{0xE0, 0xF1}}};
const CharSet kUpperCommon{{0xDE, 0x386, 0x388, 0x389, 0x38A, 0x38C, 0x38E, 0x38F, 0x3AA, 0x3AB},
                           {{0x391, 0x3A9}, {0x401, 0x42F}}};
const CharSet kLowerCommon{{0x3AC, 0x3AD, 0x3AE, 0x3AF, 0x3B0}, {{0x3B1, 0x3C9}, {0x430, 0x45F}}};
const CharSet kBox{{0x2502, 0x250C, 0x2510, 0x2518, 0x251C, 0x2524, 0x252C, 0x253C, 0x2580, 0x2584,
                    0x2588, 0x258C, 0x2590, 0x2591, 0x2592, 0x2593},
                   {{0x2550, 0x256C}}};

bool is_c1(char32_t c) { return c >= 0x80 && c <= 0x9F; }
bool ascii_letter(char32_t c) { return (c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z'); }
bool ascii_lower(char32_t c) { return c >= 'a' && c <= 'z'; }
// Python's re \s and \w on str patterns.
bool py_space(char32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x1F) || c == 0x85 || u_isUWhiteSpace(c) ||
         u_charType(c) == U_SPACE_SEPARATOR;
}
bool py_word(char32_t c) {
  if (c == '_') return true;
  const int8_t type = u_charType(c);
  return u_isalpha(c) || type == U_DECIMAL_DIGIT_NUMBER || type == U_LETTER_NUMBER || type == U_OTHER_NUMBER;
}

// One alternative of BADNESS_RE: a sequence of per-position predicates.
using Pred = bool (*)(char32_t);
#define KV_ANY(...) [](char32_t c) { return __VA_ARGS__; }

bool any_of_chars(char32_t c, std::initializer_list<char32_t> list) {
  return std::find(list.begin(), list.end(), c) != list.end();
}

const std::vector<std::vector<Pred>>& badness_rules() {
  static const std::vector<std::vector<Pred>> rules = {
      {KV_ANY(is_c1(c))},
      {KV_ANY(kBad(c) || kLowerAccented(c) || kUpperAccented(c) || kBox(c) || kStartPunct(c) || kEndPunct(c) ||
              kCurrency(c) || kNumeric(c)),
       KV_ANY(kBad(c))},
      {KV_ANY(ascii_letter(c)), KV_ANY(kLowerCommon(c) || kUpperCommon(c)), KV_ANY(kBad(c))},
      {KV_ANY(kBad(c)), KV_ANY(kLowerAccented(c) || kUpperAccented(c) || kBox(c) || kStartPunct(c) ||
                               kEndPunct(c) || kCurrency(c) || kNumeric(c))},
      {KV_ANY(kLowerAccented(c) || kLowerCommon(c) || kBox(c) || kEndPunct(c) || kCurrency(c) || kNumeric(c)),
       KV_ANY(kUpperAccented(c))},
      {KV_ANY(kBox(c) || kEndPunct(c) || kCurrency(c) || kNumeric(c)), KV_ANY(kLowerAccented(c))},
      {KV_ANY(kLowerAccented(c) || kBox(c) || kEndPunct(c)), KV_ANY(kCurrency(c))},
      {KV_ANY(py_space(c)), KV_ANY(kUpperAccented(c)), KV_ANY(kCurrency(c))},
      {KV_ANY(kUpperAccented(c) || kBox(c)), KV_ANY(kNumeric(c))},
      {KV_ANY(kLowerAccented(c) || kUpperAccented(c) || kBox(c) || kCurrency(c) || kEndPunct(c)),
       KV_ANY(kStartPunct(c)), KV_ANY(kNumeric(c))},
      {KV_ANY(kLowerAccented(c) || kUpperAccented(c) || kCurrency(c) || kNumeric(c) || kBox(c)),
       KV_ANY(kEndPunct(c)), KV_ANY(kStartPunct(c))},
      {KV_ANY(kCurrency(c) || kNumeric(c) || kBox(c)), KV_ANY(kStartPunct(c))},
      {KV_ANY(ascii_lower(c)), KV_ANY(kUpperAccented(c)), KV_ANY(kStartPunct(c) || kCurrency(c))},
      {KV_ANY(kBox(c)), KV_ANY(kKaomoji(c))},
      {KV_ANY(kLowerAccented(c) || kUpperAccented(c) || kCurrency(c) || kNumeric(c) || kStartPunct(c) ||
              kEndPunct(c)),
       KV_ANY(kBox(c))},
      {KV_ANY(kBox(c)), KV_ANY(kEndPunct(c))},
      {KV_ANY(kLowerAccented(c) || kUpperAccented(c)), KV_ANY(kEndPunct(c)), KV_ANY(py_word(c))},
      // The ligature oe when not followed by an unaccented Latin letter.
      {KV_ANY(c == 0x152 || c == 0x153), KV_ANY(!ascii_letter(c))},
      // Common windows-1252 two-character mojibake.
      {KV_ANY(any_of_chars(c, {0xC2, 0xC3, 0xCE, 0xD0})),
       KV_ANY(any_of_chars(c, {0x20AC, 0x160, 0x161, 0xA2, 0xA3, 0x178, 0x17E, 0xA0, 0xAD, 0xAE, 0xA9, 0xB0, 0xB7,
                               0xBB, 0x2013, 0x2014, 0xB4}) ||
              kStartPunct(c) || kEndPunct(c))},
      {KV_ANY(c == 0xD7), KV_ANY(c == 0xB2 || c == 0xB3)},
      // Arabic windows-1252 mojibake: four characters.
      {KV_ANY(c == 0xD8 || c == 0xD9),
       KV_ANY(kCommon(c) || kCurrency(c) || kBad(c) || kNumeric(c) || kStartPunct(c) ||
              any_of_chars(c, {0x178, 0x160, 0xAE, 0xB0, 0xB5, 0xBB})),
       KV_ANY(c == 0xD8 || c == 0xD9),
       KV_ANY(kCommon(c) || kCurrency(c) || kBad(c) || kNumeric(c) || kStartPunct(c) ||
              any_of_chars(c, {0x178, 0x160, 0xAE, 0xB0, 0xB5, 0xBB}))},
      {KV_ANY(c == 0xE0), KV_ANY(any_of_chars(c, {0xB2, 0xB5, 0xB9, 0xBC, 0xBD, 0xBE}))},
      // MacRoman mojibake.
      {KV_ANY(c == 0x221A),
       KV_ANY(any_of_chars(c, {0xB1, 0x2202, 0x2020, 0x2260, 0xAE, 0x2122, 0xB4, 0x2264, 0x2265, 0xA5, 0xB5, 0xF8}))},
      {KV_ANY(c == 0x2248), KV_ANY(c == 0xB0 || c == 0xA2)},
      {KV_ANY(c == 0x201A), KV_ANY(c == 0xC4),
       KV_ANY(any_of_chars(c, {0xEC, 0xEE, 0xEF, 0xF2, 0xF4, 0xFA, 0xF9, 0xFB, 0x2020, 0xB0, 0xA2, 0x3C0}))},
      {KV_ANY(c == 0x201A), KV_ANY(c == 0xE2 || c == 0xF3), KV_ANY(any_of_chars(c, {0xE0, 0xE4, 0xB0, 0xEA}))},
      // windows-1251 mojibake.
      {KV_ANY(c == 0x432), KV_ANY(c == 0x402)},
      {KV_ANY(any_of_chars(c, {0x412, 0x413, 0x420, 0x421})),
       KV_ANY(is_c1(c) || kBad(c) || kStartPunct(c) || kEndPunct(c) || kCurrency(c) || c == 0xB0 || c == 0xB5),
       KV_ANY(any_of_chars(c, {0x412, 0x413, 0x420, 0x421}))},
      {KV_ANY(c == 0x413), KV_ANY(c == 0x45E), KV_ANY(c == 0x412), KV_ANY(c == 0x402), KV_ANY(c == 0x412),
       KV_ANY(c != '\n'), KV_ANY(ascii_letter(c) || c == ' ')},
      // windows-1252 encodings of a-grave, a-acute and NBSP itself.
      {KV_ANY(c == 0xC3), KV_ANY(c == 0xA0 || c == 0xA1)},
      {KV_ANY(ascii_lower(c)), KV_ANY(c == 0xC3 || c == 0xC2), KV_ANY(c == ' ')},
      {KV_ANY(ascii_lower(c)), KV_ANY(py_space(c)), KV_ANY(c == 0xC3 || c == 0xC2), KV_ANY(c == ' ')},
      {KV_ANY((c >= 'a' && c <= 'z') || c == '.' || c == ',' || c == '?' || c == '!' || kEndPunct(c)),
       KV_ANY(c == 0xC2), KV_ANY(c == ' ' || kStartPunct(c) || kEndPunct(c))},
      // windows-1253 mojibake.
      {KV_ANY(c == 0x3B2), KV_ANY(c == 0x20AC), KV_ANY(any_of_chars(c, {0x2122, 0xA0, 0x386, 0xAD, 0xAE, 0xB0}))},
      {KV_ANY(any_of_chars(c, {0x392, 0x393, 0x39E, 0x39F})),
       KV_ANY(is_c1(c) || kBad(c) || kStartPunct(c) || kEndPunct(c) || kCurrency(c) || c == 0xB0),
       KV_ANY(any_of_chars(c, {0x392, 0x393, 0x39E, 0x39F}))},
  };
  return rules;
}
#undef KV_ANY

bool matches_at(const Text& text, size_t i, const std::vector<Pred>& rule) {
  if (i + rule.size() > text.size()) return false;
  for (size_t k = 0; k < rule.size(); ++k)
    if (!rule[k](text[i + k])) return false;
  return true;
}

// badness.is_bad: any BADNESS_RE match.
bool is_bad(const Text& text) {
  for (size_t i = 0; i < text.size(); ++i) {
    for (const auto& rule : badness_rules())
      if (matches_at(text, i, rule)) return true;
    // ^[ÃÂ][ ] only at the start.
    if (i == 0 && text.size() >= 2 && (text[0] == 0xC3 || text[0] == 0xC2) && text[1] == ' ') return true;
  }
  return false;
}

// ------------------------------------------------------------------ mojibake repair

// ftfy's restore_byte_a0: a space in a place where UTF-8 needed byte 0xA0 (which some
// software turns into a space) is put back.
Bytes restore_byte_a0(const Bytes& in) {
  Bytes b = in;
  auto at = [&](size_t i) { return static_cast<unsigned char>(b[i]); };
  auto cont = [](unsigned char x) { return x >= 0x80 && x <= 0xBF; };
  auto cont_not_a0_85 = [](unsigned char x) {
    return (x >= 0x80 && x <= 0x84) || (x >= 0x86 && x <= 0x9F) || (x >= 0xA1 && x <= 0xBF);
  };
  for (size_t i = 0; i < b.size();) {
    const unsigned char x = at(i);
    const size_t n = b.size();
    if ((x == 0xC2 || x == 0xC3 || x == 0xC5 || x == 0xCE || x == 0xD0 || x == 0xD9) && i + 1 < n && b[i + 1] == ' ') {
      b[i + 1] = static_cast<char>(0xA0);
      i += 2;
    } else if ((x == 0xE2 || x == 0xE3) && i + 2 < n && b[i + 1] == ' ' && cont_not_a0_85(at(i + 2))) {
      b[i + 1] = static_cast<char>(0xA0);
      i += 3;
    } else if (x >= 0xE0 && x <= 0xE3 && i + 2 < n && cont_not_a0_85(at(i + 1)) && b[i + 2] == ' ') {
      b[i + 2] = static_cast<char>(0xA0);
      i += 3;
    } else if (x == 0xF0 && i + 3 < n && ((b[i + 1] == ' ' && cont(at(i + 2)) && cont(at(i + 3))) ||
                                          (cont(at(i + 1)) && b[i + 2] == ' ' && cont(at(i + 3))) ||
                                          (cont(at(i + 1)) && cont(at(i + 2)) && b[i + 3] == ' '))) {
      for (size_t k = 1; k <= 3; ++k)
        if (b[i + k] == ' ') b[i + k] = static_cast<char>(0xA0);
      i += 4;
    } else {
      ++i;
    }
  }
  return b;
}

std::optional<Text> try_utf8(Bytes bytes) {
  bytes = restore_byte_a0(bytes);
  const bool variants = bytes.find('\xED') != Bytes::npos || bytes.find('\xC0') != Bytes::npos;
  return decode_utf8(bytes, variants);
}

Text fix_c1_controls(const Text& text) {
  Text out = text;
  for (char32_t& c : out)
    if (is_c1(c)) c = sloppy_1252_char(static_cast<unsigned char>(c));
  return out;
}

bool all_ascii(const Text& text) {
  return std::all_of(text.begin(), text.end(), [](char32_t c) { return c < 0x80; });
}

Text fix_encoding(Text text);

// decode_inconsistent_utf8: UTF-8-shaped runs of windows-1252 characters inside text that
// as a whole does not re-decode are fixed one by one, when they look bad on their own.
Text decode_inconsistent_utf8(const Text& text) {
  auto byte_of = [](char32_t c) -> int {
    const auto& table = sloppy_1252_bytes();
    auto it = table.find(c);
    return it == table.end() ? -1 : it->second;
  };
  auto is_cont = [&](size_t i) {
    const int b = i < text.size() ? byte_of(text[i]) : -1;
    return b >= 0x80 && b <= 0xBF;
  };
  Text out;
  for (size_t i = 0; i < text.size();) {
    const int b = byte_of(text[i]);
    size_t len = 0;
    if (b >= 0xC2 && b <= 0xDF && is_cont(i + 1)) len = 2;
    else if (b >= 0xE0 && b <= 0xEF && is_cont(i + 1) && is_cont(i + 2)) len = 3;
    else if (b >= 0xF0 && b <= 0xF4 && is_cont(i + 1) && is_cont(i + 2) && is_cont(i + 3)) len = 4;
    if (len == 0) {
      out.push_back(text[i++]);
      continue;
    }
    const Text piece = text.substr(i, len);
    out += (piece.size() < text.size() && is_bad(piece)) ? fix_encoding(piece) : piece;
    i += len;
  }
  return out;
}

// One step of fix_encoding_and_explain.
Text fix_encoding_one_step(const Text& text) {
  if (text.empty() || all_ascii(text) || !is_bad(text)) return text;
  const auto latin1 = encode_latin1(text);
  if (latin1)
    if (auto fixed = try_utf8(*latin1)) return *fixed;
  if (auto sloppy = encode_sloppy_1252(text))
    if (auto fixed = try_utf8(*sloppy)) return *fixed;
  const Text inconsistent = decode_inconsistent_utf8(text);
  if (inconsistent != text) return inconsistent;
  // Latin-1 characters that windows-1252 reads differently are C1 controls: nobody
  // wants those, so read them as windows-1252 (when every byte is defined there).
  if (latin1) {
    bool defined = true;
    Text fixed;
    for (unsigned char b : *latin1) {
      const char32_t c = (b >= 0x80 && b <= 0x9F) ? kCp1252High[b - 0x80] : b;
      if (c == 0) defined = false;
      fixed.push_back(c);
    }
    if (defined && fixed != text) return fixed;
  }
  if (std::any_of(text.begin(), text.end(), is_c1)) return fix_c1_controls(text);
  return text;
}

Text fix_encoding(Text text) {
  while (true) {
    Text next = fix_encoding_one_step(text);
    if (next == text) return text;
    text = std::move(next);
  }
}

// ------------------------------------------------------------------ the other fixes

// The HTML5 entities ftfy decodes most often in web text (ftfy decodes all of them).
const std::map<std::u32string, char32_t>& html_entities() {
  static const std::map<std::u32string, char32_t> table = [] {
    const std::vector<std::pair<const char*, char32_t>> names = {
        {"amp", '&'}, {"lt", '<'}, {"gt", '>'}, {"quot", '"'}, {"apos", '\''}, {"nbsp", 0xA0},
        {"iexcl", 0xA1}, {"cent", 0xA2}, {"pound", 0xA3}, {"curren", 0xA4}, {"yen", 0xA5},
        {"brvbar", 0xA6}, {"sect", 0xA7}, {"uml", 0xA8}, {"copy", 0xA9}, {"ordf", 0xAA},
        {"laquo", 0xAB}, {"not", 0xAC}, {"shy", 0xAD}, {"reg", 0xAE}, {"macr", 0xAF}, {"deg", 0xB0},
        {"plusmn", 0xB1}, {"sup2", 0xB2}, {"sup3", 0xB3}, {"acute", 0xB4}, {"micro", 0xB5},
        {"para", 0xB6}, {"middot", 0xB7}, {"cedil", 0xB8}, {"sup1", 0xB9}, {"ordm", 0xBA},
        {"raquo", 0xBB}, {"frac14", 0xBC}, {"frac12", 0xBD}, {"frac34", 0xBE}, {"iquest", 0xBF},
        {"Agrave", 0xC0}, {"Aacute", 0xC1}, {"Acirc", 0xC2}, {"Atilde", 0xC3}, {"Auml", 0xC4},
        {"Aring", 0xC5}, {"AElig", 0xC6}, {"Ccedil", 0xC7}, {"Egrave", 0xC8}, {"Eacute", 0xC9},
        {"Ecirc", 0xCA}, {"Euml", 0xCB}, {"Igrave", 0xCC}, {"Iacute", 0xCD}, {"Icirc", 0xCE},
        {"Iuml", 0xCF}, {"ETH", 0xD0}, {"Ntilde", 0xD1}, {"Ograve", 0xD2}, {"Oacute", 0xD3},
        {"Ocirc", 0xD4}, {"Otilde", 0xD5}, {"Ouml", 0xD6}, {"times", 0xD7}, {"Oslash", 0xD8},
        {"Ugrave", 0xD9}, {"Uacute", 0xDA}, {"Ucirc", 0xDB}, {"Uuml", 0xDC}, {"Yacute", 0xDD},
        {"THORN", 0xDE}, {"szlig", 0xDF}, {"agrave", 0xE0}, {"aacute", 0xE1}, {"acirc", 0xE2},
        {"atilde", 0xE3}, {"auml", 0xE4}, {"aring", 0xE5}, {"aelig", 0xE6}, {"ccedil", 0xE7},
        {"egrave", 0xE8}, {"eacute", 0xE9}, {"ecirc", 0xEA}, {"euml", 0xEB}, {"igrave", 0xEC},
        {"iacute", 0xED}, {"icirc", 0xEE}, {"iuml", 0xEF}, {"eth", 0xF0}, {"ntilde", 0xF1},
        {"ograve", 0xF2}, {"oacute", 0xF3}, {"ocirc", 0xF4}, {"otilde", 0xF5}, {"ouml", 0xF6},
        {"divide", 0xF7}, {"oslash", 0xF8}, {"ugrave", 0xF9}, {"uacute", 0xFA}, {"ucirc", 0xFB},
        {"uuml", 0xFC}, {"yacute", 0xFD}, {"thorn", 0xFE}, {"yuml", 0xFF}, {"ndash", 0x2013},
        {"mdash", 0x2014}, {"lsquo", 0x2018}, {"rsquo", 0x2019}, {"sbquo", 0x201A}, {"ldquo", 0x201C},
        {"rdquo", 0x201D}, {"bdquo", 0x201E}, {"dagger", 0x2020}, {"Dagger", 0x2021}, {"bull", 0x2022},
        {"hellip", 0x2026}, {"permil", 0x2030}, {"lsaquo", 0x2039}, {"rsaquo", 0x203A},
        {"euro", 0x20AC}, {"trade", 0x2122}, {"AMP", '&'}, {"LT", '<'}, {"GT", '>'}, {"QUOT", '"'},
        {"COPY", 0xA9}, {"REG", 0xAE}};
    std::map<std::u32string, char32_t> t;
    for (const auto& [name, c] : names) {
      std::u32string key(name, name + std::char_traits<char>::length(name));
      t[key] = c;
    }
    // ftfy also decodes an all-uppercase spelling of a lowercase name when that spelling
    // is not itself an entity ("&EACUTE;" -> "É").
    std::map<std::u32string, char32_t> upper;
    for (const auto& [name, c] : t) {
      bool lower = std::all_of(name.begin(), name.end(), [](char32_t x) { return !(x >= 'A' && x <= 'Z'); });
      if (!lower) continue;
      std::u32string up = name;
      for (auto& x : up)
        if (x >= 'a' && x <= 'z') x -= 32;
      if (!t.count(up)) upper[up] = u_toupper(c);
    }
    t.insert(upper.begin(), upper.end());
    return t;
  }();
  return table;
}

// Python's html.unescape on one "&#...;" reference; nullopt when it leaves it as it is.
std::optional<Text> unescape_numeric(const Text& digits_in) {
  Text digits = digits_in;
  int base = 10;
  if (!digits.empty() && (digits[0] == 'x' || digits[0] == 'X')) {
    base = 16;
    digits.erase(0, 1);
  }
  if (digits.empty()) return std::nullopt;
  unsigned long long value = 0;
  for (char32_t c : digits) {
    int d = -1;
    if (c >= '0' && c <= '9') d = c - '0';
    else if (base == 16 && c >= 'a' && c <= 'f') d = c - 'a' + 10;
    else if (base == 16 && c >= 'A' && c <= 'F') d = c - 'A' + 10;
    if (d < 0) return std::nullopt;
    value = std::min<unsigned long long>(value * base + d, 0x7FFFFFFFULL);
  }
  if (value >= 0x80 && value <= 0x9F && kCp1252High[value - 0x80]) return Text(1, kCp1252High[value - 0x80]);
  if (value == 0x0D) return Text(1, 0x0D);
  if (value == 0 || (value >= 0xD800 && value <= 0xDFFF) || value > 0x10FFFF) return Text(1, 0xFFFD);
  const bool invalid = (value >= 0x1 && value <= 0x8) || value == 0xB || (value >= 0xE && value <= 0x1F) ||
                       (value >= 0x7F && value <= 0x9F) || (value >= 0xFDD0 && value <= 0xFDEF) ||
                       (value & 0xFFFE) == 0xFFFE;
  if (invalid) return Text();
  return Text(1, static_cast<char32_t>(value));
}

// ftfy's unescape_html: "&#?[0-9A-Za-z]{1,24};" references that are known entities or
// whole numeric references.
Text unescape_html(const Text& text) {
  Text out;
  auto alnum = [](char32_t c) { return (c >= '0' && c <= '9') || ascii_letter(c); };
  for (size_t i = 0; i < text.size();) {
    if (text[i] == '&') {
      size_t j = i + 1;
      const bool numeric = j < text.size() && text[j] == '#';
      if (numeric) ++j;
      const size_t start = j;
      while (j < text.size() && alnum(text[j]) && j - start < 24) ++j;
      if (j > start && j < text.size() && text[j] == ';') {
        const Text name = text.substr(start, j - start);
        std::optional<Text> replacement;
        if (!numeric) {
          auto it = html_entities().find(name);
          if (it != html_entities().end()) replacement = Text(1, it->second);
        } else {
          replacement = unescape_numeric(name);
        }
        if (replacement) {
          out += *replacement;
          i = j + 1;
          continue;
        }
        out += text.substr(i, j + 1 - i);
        i = j + 1;
        continue;
      }
    }
    out.push_back(text[i++]);
  }
  return out;
}

// "\x1b[...m"-style terminal escapes.
Text remove_terminal_escapes(const Text& text) {
  Text out;
  for (size_t i = 0; i < text.size();) {
    if (text[i] == 0x1B && i + 1 < text.size() && text[i + 1] == '[') {
      size_t j = i + 2;
      while (j < text.size() && ((text[j] >= '0' && text[j] <= '9') || text[j] == ';')) ++j;
      if (j < text.size() && ascii_letter(text[j])) {
        i = j + 1;
        continue;
      }
    }
    out.push_back(text[i++]);
  }
  return out;
}

Text fix_latin_ligatures(const Text& text) {
  static const std::map<char32_t, Text> ligatures = {
      {0x132, U"IJ"}, {0x133, U"ij"}, {0x149, U"\u02BCn"}, {0x1F1, U"DZ"}, {0x1F2, U"Dz"}, {0x1F3, U"dz"},
      {0x1C4, U"D\u017D"}, {0x1C5, U"D\u017E"}, {0x1C6, U"d\u017E"}, {0x1C7, U"LJ"}, {0x1C8, U"Lj"},
      {0x1C9, U"lj"}, {0x1CA, U"NJ"}, {0x1CB, U"Nj"}, {0x1CC, U"nj"}, {0xFB00, U"ff"}, {0xFB01, U"fi"},
      {0xFB02, U"fl"}, {0xFB03, U"ffi"}, {0xFB04, U"ffl"}, {0xFB05, U"\u017Ft"}, {0xFB06, U"st"}};
  Text out;
  for (char32_t c : text) {
    auto it = ligatures.find(c);
    if (it == ligatures.end()) out.push_back(c);
    else out += it->second;
  }
  return out;
}

Text nfkc(const Text& text) {
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFKCInstance(status);
  if (U_FAILURE(status)) throw Error(std::string("ICU NFKC normaliser unavailable: ") + u_errorName(status));
  icu::UnicodeString in = icu::UnicodeString::fromUTF32(reinterpret_cast<const UChar32*>(text.data()),
                                                        static_cast<int32_t>(text.size()));
  icu::UnicodeString out = normalizer->normalize(in, status);
  if (U_FAILURE(status)) throw Error(std::string("ICU NFKC normalisation failed: ") + u_errorName(status));
  Text result(static_cast<size_t>(out.countChar32()), 0);
  UErrorCode status2 = U_ZERO_ERROR;
  const int32_t n = out.toUTF32(reinterpret_cast<UChar32*>(result.data()), static_cast<int32_t>(result.size()), status2);
  if (U_FAILURE(status2)) throw Error(std::string("ICU UTF-32 conversion failed: ") + u_errorName(status2));
  result.resize(static_cast<size_t>(n));
  return result;
}

// Width: fullwidth and halfwidth forms and U+3000 become their NFKC forms (the NFKC step
// after it would do the same; kept so the fix order is ftfy's).
Text fix_character_width(const Text& text) {
  Text out;
  for (char32_t c : text) {
    if (c == 0x3000 || (c >= 0xFF01 && c <= 0xFFEF)) out += nfkc(Text(1, c));
    else out.push_back(c);
  }
  return out;
}

Text uncurl_quotes(const Text& text) {
  Text out = text;
  for (char32_t& c : out) {
    if (c == 0x2BC || (c >= 0x2018 && c <= 0x201B)) c = '\'';
    else if (c >= 0x201C && c <= 0x201F) c = '"';
  }
  return out;
}

Text fix_line_breaks(const Text& text) {
  Text out;
  for (size_t i = 0; i < text.size(); ++i) {
    const char32_t c = text[i];
    if (c == '\r') {
      out.push_back('\n');
      if (i + 1 < text.size() && text[i + 1] == '\n') ++i;
    } else if (c == 0x2028 || c == 0x2029 || c == 0x85) {
      out.push_back('\n');
    } else {
      out.push_back(c);
    }
  }
  return out;
}

Text fix_surrogates(const Text& text) {
  Text out;
  for (size_t i = 0; i < text.size(); ++i) {
    const char32_t c = text[i];
    if (c >= 0xD800 && c <= 0xDBFF && i + 1 < text.size() && text[i + 1] >= 0xDC00 && text[i + 1] <= 0xDFFF) {
      out.push_back(0x10000 + ((c - 0xD800) << 10) + (text[i + 1] - 0xDC00));
      ++i;
    } else if (c >= 0xD800 && c <= 0xDFFF) {
      out.push_back(0xFFFD);
    } else {
      out.push_back(c);
    }
  }
  return out;
}

// Control characters other than TAB, LF, FF and CR, plus the deprecated format
// characters, the BOM and the interlinear annotation characters.
Text remove_control_chars(const Text& text) {
  Text out;
  for (char32_t c : text) {
    const bool control = c <= 0x08 || c == 0x0B || (c >= 0x0E && c <= 0x1F) || c == 0x7F ||
                         (c >= 0x206A && c <= 0x206F) || c == 0xFEFF || (c >= 0xFFF9 && c <= 0xFFFC);
    if (!control) out.push_back(c);
  }
  return out;
}

// fix_and_explain on one segment: every fix in order, repeated until stable.
Text fix_segment(Text text, bool unescape) {
  while (true) {
    const Text before = text;
    if (unescape) text = unescape_html(text);
    text = remove_terminal_escapes(text);
    text = fix_encoding(text);
    text = fix_c1_controls(text);
    text = fix_latin_ligatures(text);
    text = fix_character_width(text);
    text = uncurl_quotes(text);
    text = fix_line_breaks(text);
    text = fix_surrogates(text);
    text = remove_control_chars(text);
    text = nfkc(text);
    if (text == before) return text;
  }
}

}  // namespace

std::string ftfy_fix_text_nfkc(const std::string& utf8) {
  const auto decoded = decode_utf8(utf8, false);
  if (!decoded) throw Error("ftfy: the text is not valid UTF-8");
  const Text& text = *decoded;
  Text out;
  // One line at a time (each keeps its "\n"); once a line has a "<", HTML entities are
  // left alone from there on, as ftfy's "auto" setting does.
  bool unescape = true;
  for (size_t pos = 0; pos < text.size();) {
    size_t end = text.find(U'\n', pos);
    end = end == Text::npos ? text.size() : end + 1;
    const Text segment = text.substr(pos, end - pos);
    if (segment.find(U'<') != Text::npos) unescape = false;
    out += fix_segment(segment, unescape);
    pos = end;
  }
  return encode_utf8(out);
}

}  // namespace kvevict
