// The one UTF-8 decoder and encoder. Strict, as Unicode defines well-formed UTF-8: shortest
// form only, no surrogates, nothing above U+10FFFF (what Python's and SentencePiece's
// decoders accept).
#pragma once
#include <cstddef>
#include <string>
#include <string_view>

namespace kvevict {

struct Utf8Char {
  char32_t value;      // 0 when invalid
  std::size_t length;  // bytes consumed; for an invalid sequence, its "maximal subpart"
  bool valid;
};

// Decodes the character starting at text[pos] (pos < text.size()). An invalid sequence
// reports how many bytes form its longest valid-looking prefix: the unit that U+FFFD
// replaces (Unicode ch. 3, and Rust's String::from_utf8_lossy, which HF's decode uses).
Utf8Char decode_utf8_at(std::string_view text, std::size_t pos);

// Appends the UTF-8 encoding of a code point below 0x110000.
void append_utf8(std::string& out, char32_t code_point);

}  // namespace kvevict
