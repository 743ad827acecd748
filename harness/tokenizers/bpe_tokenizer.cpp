// Byte-level BPE tokenizers: GPT-2 / OPT (vocab.json + merges.txt), GPT-NeoX / Pythia,
// Llama-3 and Qwen2/Qwen3 (tokenizer.json). Written from scratch to reproduce Hugging Face
// `tokenizers` id for id; the goldens in ../shared/data/golden/bpe_*.jsonl are that
// library's output.
//
// encode: 1. split out added tokens that match the raw text (special tokens such as
//            <|endoftext|>);
//         2. normalise the rest (NFC by ICU, when the tokenizer has that normaliser);
//         3. split out added tokens that match the normalised text (NeoX's runs of spaces);
//         4. pre-tokenise: the tokenizer's Split regex run by ICU (Llama-3, Qwen) and/or
//            the GPT-2 pattern (a hand-written splitter over ICU's Unicode classes), map
//            each byte to GPT-2's printable stand-in character, and apply merges by rank
//            (lowest rank first; with ignore_merges a piece that is a token stays whole).
// decode: ids -> token strings -> bytes, with invalid UTF-8 replaced by U+FFFD as HF does.

#include <algorithm>
#include <array>
#include <cstdint>
#include <fstream>
#include <functional>
#include <iterator>
#include <filesystem>
#include <map>
#include <memory>
#include <mutex>
#include <optional>
#include <nlohmann/json.hpp>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include <unicode/normalizer2.h>
#include <unicode/regex.h>
#include <unicode/uchar.h>
#include <unicode/unistr.h>

#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/utf8.h"
#include "harness/tokenizers/tokenizer.h"

namespace kvevict {
namespace {

using nlohmann::json;

// ---------------------------------------------------------------------------------------
// UTF-8

// Bytes that are not valid UTF-8 travel as pseudo code points above the Unicode range,
// one per byte, so the tokenizer never drops or alters input bytes.
constexpr char32_t kRawByteBase = 0x110000;
bool is_raw_byte(char32_t c) { return c >= kRawByteBase; }

// Code points of a string with the byte offset of each (offsets has one extra entry: the
// end). Each byte of an invalid sequence becomes a raw-byte pseudo code point.
struct DecodedText {
  std::vector<char32_t> code_points;
  std::vector<size_t> offsets;
};

DecodedText decode_utf8(std::string_view s) {
  DecodedText decoded;
  decoded.code_points.reserve(s.size());
  decoded.offsets.reserve(s.size() + 1);
  for (size_t pos = 0; pos < s.size();) {
    const Utf8Char step = decode_utf8_at(s, pos);
    if (step.valid) {
      decoded.code_points.push_back(step.value);
      decoded.offsets.push_back(pos);
    } else {
      for (size_t k = 0; k < step.length; ++k) {
        decoded.code_points.push_back(kRawByteBase + static_cast<unsigned char>(s[pos + k]));
        decoded.offsets.push_back(pos + k);
      }
    }
    pos += step.length;
  }
  decoded.offsets.push_back(s.size());
  return decoded;
}

// A raw-byte pseudo code point (from invalid input) is written back as its byte.
void append_char(std::string& out, char32_t c) {
  if (is_raw_byte(c))
    out += static_cast<char>(c - kRawByteBase);
  else
    append_utf8(out, c);
}

std::string utf8(char32_t c) {
  std::string out;
  append_char(out, c);
  return out;
}

// Valid UTF-8 from arbitrary bytes: each maximal invalid subpart becomes one U+FFFD.
std::string replace_invalid_utf8(const std::string& bytes) {
  std::string out;
  out.reserve(bytes.size());
  for (size_t pos = 0; pos < bytes.size();) {
    const Utf8Char step = decode_utf8_at(bytes, pos);
    if (step.valid)
      out.append(bytes, pos, step.length);
    else
      out += "\xEF\xBF\xBD";
    pos += step.length;
  }
  return out;
}

// ---------------------------------------------------------------------------------------
// Unicode properties and NFC (ICU). Defined at the end of the file.

enum class CharClass { kLetter, kNumber, kWhitespace, kOther };
CharClass char_class(char32_t c);
std::string nfc(std::string_view text);

// ---------------------------------------------------------------------------------------
// Pre-tokenisation

// Splits text as GPT-2's pattern does in HF (Oniguruma, leftmost alternative first):
//   's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
std::vector<std::string_view> split_gpt2_pattern(std::string_view text) {
  const DecodedText decoded = decode_utf8(text);
  const std::vector<char32_t>& cp = decoded.code_points;
  const size_t n = cp.size();
  std::vector<CharClass> cls(n);
  for (size_t i = 0; i < n; ++i) cls[i] = char_class(cp[i]);

  // End (exclusive) of the match that starts at code point i.
  const auto match_end = [&](size_t i) -> size_t {
    // Contractions; case-sensitive, so "'S" is punctuation followed by a letter.
    if (cp[i] == '\'' && i + 1 < n) {
      const char32_t a = cp[i + 1];
      if (a == 's' || a == 't' || a == 'm' || a == 'd') return i + 2;
      if (i + 2 < n) {
        const char32_t b = cp[i + 2];
        if ((a == 'r' && b == 'e') || (a == 'v' && b == 'e') || (a == 'l' && b == 'l'))
          return i + 3;
      }
    }
    // An optional single space, then a run of letters, of numbers or of other symbols.
    const size_t body = (cp[i] == ' ' && i + 1 < n) ? i + 1 : i;
    if (cls[body] != CharClass::kWhitespace) {
      size_t end = body + 1;
      while (end < n && cls[end] == cls[body]) ++end;
      return end;
    }
    // Whitespace. \s+(?!\S) backs off one character when the run is followed by
    // non-space, leaving that character (usually ' ') to prefix the next word; a single
    // whitespace character before non-space falls through to plain \s+.
    size_t end = i;
    while (end < n && cls[end] == CharClass::kWhitespace) ++end;
    if (end == n || end - i == 1) return end;
    return end - 1;
  };

  std::vector<std::string_view> pieces;
  for (size_t i = 0; i < n;) {
    const size_t end = match_end(i);
    pieces.push_back(text.substr(decoded.offsets[i], decoded.offsets[end] - decoded.offsets[i]));
    i = end;
  }
  return pieces;
}

// A Split pre-tokenizer with behavior "Isolated" (Llama-3, Qwen): every regex match is a
// piece, and so is any text between matches. The pattern is the tokenizer.json's
// Oniguruma regex, run by ICU; only \s and \S are spelled out as the White_Space
// property, which is what Oniguruma's Unicode \s means (ICU's \s omits U+000B, U+0085).
class SplitRegex {
 public:
  SplitRegex(const std::string& pattern, const std::string& where) : where_(where) {
    if (pattern.empty()) throw Error(where + ": pattern.Regex is empty (it would match nothing but empty strings)");
    std::string translated;
    for (size_t i = 0; i < pattern.size(); ++i) {
      if (pattern[i] == '\\' && i + 1 < pattern.size()) {
        const char next = pattern[++i];
        if (next == 's') translated += "\\p{White_Space}";
        else if (next == 'S') translated += "\\P{White_Space}";
        else (translated += '\\') += next;
      } else {
        translated += pattern[i];
      }
    }
    UErrorCode status = U_ZERO_ERROR;
    UParseError parse_error;
    pattern_.reset(icu::RegexPattern::compile(icu::UnicodeString::fromUTF8(translated), 0, parse_error, status));
    if (U_FAILURE(status))
      throw Error(where + ": the Split regex does not compile (" + u_errorName(status) + " at offset " +
                  std::to_string(parse_error.offset) + ")");
  }

  std::vector<std::string_view> split(std::string_view text) const {
    const DecodedText decoded = decode_utf8(text);
    // UTF-16 for ICU, with the byte offset of every UTF-16 unit; invalid bytes travel as
    // U+FFFD (a symbol) but keep their own bytes in the pieces.
    icu::UnicodeString units;
    std::vector<size_t> byte_at;
    byte_at.reserve(decoded.code_points.size() + 1);
    for (size_t i = 0; i < decoded.code_points.size(); ++i) {
      const char32_t c = is_raw_byte(decoded.code_points[i]) ? 0xFFFD : decoded.code_points[i];
      units.append(static_cast<UChar32>(c));
      byte_at.push_back(decoded.offsets[i]);
      if (c > 0xFFFF) byte_at.push_back(decoded.offsets[i]);
    }
    byte_at.push_back(text.size());
    UErrorCode status = U_ZERO_ERROR;
    std::unique_ptr<icu::RegexMatcher> matcher(pattern_->matcher(units, status));
    // A pattern that backtracks without bound ((a+)+$ on "aaa...!") must not hang the run:
    // ICU's time limit counts ticks of 10,000 backtracking state saves over all the finds
    // on this text, so the work is bounded by the text's length (README, "Reliability").
    const int32_t tick_limit = kRegexBaseTicks + units.length() / kRegexUnitsPerTick;
    if (U_SUCCESS(status)) matcher->setTimeLimit(tick_limit, status);
    if (U_SUCCESS(status)) matcher->setStackLimit(kRegexStackBytes, status);
    std::vector<std::string_view> pieces;
    const auto piece = [&](int32_t from, int32_t to) {
      pieces.push_back(text.substr(byte_at[from], byte_at[to] - byte_at[from]));
    };
    int32_t done = 0;
    while (U_SUCCESS(status) && matcher->find(status)) {
      const int32_t begin = matcher->start(status), end = matcher->end(status);
      if (U_FAILURE(status) || end == begin) continue;
      if (begin > done) piece(done, begin);
      piece(begin, end);
      done = end;
    }
    if (status == U_REGEX_TIME_OUT)
      throw Error(where_ + ": the regex ran past its limit of " + std::to_string(tick_limit) +
                  " x 10,000 backtracking steps on a text of " + std::to_string(units.length()) +
                  " UTF-16 units; the pattern backtracks without bound");
    if (status == U_REGEX_STACK_OVERFLOW)
      throw Error(where_ + ": the regex needs more than " + std::to_string(kRegexStackBytes >> 20) +
                  " MB of backtracking stack on a text of " + std::to_string(units.length()) + " UTF-16 units");
    if (U_FAILURE(status)) throw Error(where_ + ": the regex failed while splitting text: " + u_errorName(status));
    if (done < units.length()) piece(done, units.length());
    return pieces;
  }

 private:
  // The work bound on one text: 100 ticks, plus one per 20 UTF-16 units (the Llama-3 and
  // Qwen patterns need at most about one per 1,000 on any text measured).
  static constexpr int32_t kRegexBaseTicks = 100, kRegexUnitsPerTick = 20;
  static constexpr int32_t kRegexStackBytes = 8 << 20;

  std::string where_;
  std::unique_ptr<icu::RegexPattern> pattern_;
};

// GPT-2's bytes_to_unicode: printable Latin-1 bytes stand for themselves; the other 68
// (controls, space, DEL, NBSP, soft hyphen) map in byte order to U+0100, U+0101, ...
std::array<char32_t, 256> make_byte_to_char() {
  std::array<char32_t, 256> table{};
  char32_t next_substitute = 0x100;
  for (int b = 0; b < 256; ++b) {
    const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
    table[b] = printable ? static_cast<char32_t>(b) : next_substitute++;
  }
  return table;
}

const std::array<char32_t, 256>& byte_to_char() {
  static const std::array<char32_t, 256> table = make_byte_to_char();
  return table;
}

// The token string of raw bytes, e.g. " the" -> "Ġthe".
std::string to_byte_level(std::string_view bytes) {
  std::string out;
  for (unsigned char b : bytes) append_char(out, byte_to_char()[b]);
  return out;
}

// The bytes a token stands for. As HF's ByteLevel decoder: if any character is not a
// byte stand-in (added tokens such as "  " or "<|endoftext|>" may contain such), the
// token's own UTF-8 is used instead.
std::string token_bytes(const std::string& token) {
  static const std::unordered_map<char32_t, unsigned char> char_to_byte = [] {
    std::unordered_map<char32_t, unsigned char> inverse;
    for (int b = 0; b < 256; ++b) inverse[byte_to_char()[b]] = static_cast<unsigned char>(b);
    return inverse;
  }();
  std::string bytes;
  for (char32_t c : decode_utf8(token).code_points) {
    const auto it = char_to_byte.find(c);
    if (it == char_to_byte.end()) return token;
    bytes += static_cast<char>(it->second);
  }
  return bytes;
}

// ---------------------------------------------------------------------------------------
// Added tokens

struct AddedToken {
  std::string content;
  int id;
  bool normalized;  // matched in the normalised text rather than the raw text
};

// Finds added tokens in a text: the leftmost match first and, among matches starting
// there, the longest (HF's aho-corasick in LeftmostLongest mode). A byte trie.
class AddedTokenMatcher {
 public:
  struct Segment {
    std::string_view text;
    int id;  // the added token's id, or -1 for ordinary text between matches
  };

  void add(const std::string& content, int id) {
    if (content.empty()) return;
    int node = 0;
    for (unsigned char b : content) {
      auto it = nodes_[node].children.find(b);
      if (it == nodes_[node].children.end()) {
        it = nodes_[node].children.emplace(b, static_cast<int>(nodes_.size())).first;
        nodes_.emplace_back();
      }
      node = it->second;
    }
    nodes_[node].token_id = id;
  }

  std::vector<Segment> split(std::string_view text) const {
    std::vector<Segment> segments;
    size_t ordinary_start = 0;
    for (size_t start = 0; start < text.size();) {
      int node = 0, found_id = -1;
      size_t found_length = 0;
      for (size_t pos = start; pos < text.size(); ++pos) {
        const auto it = nodes_[node].children.find(static_cast<unsigned char>(text[pos]));
        if (it == nodes_[node].children.end()) break;
        node = it->second;
        if (nodes_[node].token_id >= 0) {
          found_id = nodes_[node].token_id;
          found_length = pos + 1 - start;
        }
      }
      if (found_id < 0) {
        ++start;
        continue;
      }
      if (start > ordinary_start)
        segments.push_back({text.substr(ordinary_start, start - ordinary_start), -1});
      segments.push_back({text.substr(start, found_length), found_id});
      start += found_length;
      ordinary_start = start;
    }
    if (ordinary_start < text.size()) segments.push_back({text.substr(ordinary_start), -1});
    return segments;
  }

 private:
  struct Node {
    std::map<unsigned char, int> children;
    int token_id = -1;
  };
  std::vector<Node> nodes_{1};
};

// ---------------------------------------------------------------------------------------
// The BPE model

using Vocab = std::unordered_map<std::string, int>;  // token string -> id

struct MergeResult {
  int rank;       // position in the merges list; lower ranks merge first
  int merged_id;  // id of the concatenated token
};
using MergeTable = std::unordered_map<uint64_t, MergeResult>;  // keyed by (left, right) ids

uint64_t pair_key(int left, int right) {
  return (static_cast<uint64_t>(static_cast<uint32_t>(left)) << 32) | static_cast<uint32_t>(right);
}

// Adds the merge `left right` with the given rank. `where` names the merge for messages.
void add_merge(MergeTable& merges, const Vocab& vocab, const std::string& left,
               const std::string& right, int rank, const std::function<std::string()>& where) {
  const auto left_it = vocab.find(left), right_it = vocab.find(right),
             merged_it = vocab.find(left + right);
  if (left_it == vocab.end() || right_it == vocab.end() || merged_it == vocab.end())
    throw Error(where() + ": merge \"" + left + " " + right +
                "\" uses a token that is not in the vocabulary");
  merges[pair_key(left_it->second, right_it->second)] = {rank, merged_it->second};
}

struct PipelineOptions {
  bool nfc = false;               // normalizer NFC
  bool add_prefix_space = false;  // ByteLevel pre-tokenizer option
  bool use_regex = true;          // ByteLevel pre-tokenizer option
  bool ignore_merges = false;     // BPE option: whole words found in the vocab skip merging
  std::shared_ptr<const SplitRegex> split;  // Split pre-tokenizer before ByteLevel (Llama-3, Qwen)
};

class ByteLevelBpeTokenizer final : public Tokenizer {
 public:
  ByteLevelBpeTokenizer(const std::string& source, Vocab vocab, MergeTable merges,
                        const std::vector<AddedToken>& added_tokens, PipelineOptions options)
      : options_(options), vocab_(std::move(vocab)), merges_(std::move(merges)) {
    // Bytes that never occur in valid UTF-8 (C0, C1, F5-FF) may lack a token, as in
    // NeoX; such bytes in invalid input are dropped, as HF drops unknown characters
    // when there is no unk token. Any other missing byte means a wrong vocabulary.
    for (int b = 0; b < 256; ++b) {
      const auto it = vocab_.find(utf8(byte_to_char()[b]));
      const bool occurs_in_utf8 = b != 0xC0 && b != 0xC1 && b < 0xF5;
      if (it == vocab_.end() && occurs_in_utf8)
        throw Error(source + ": not a byte-level vocabulary: no token for byte " +
                    std::to_string(b));
      byte_ids_[b] = it == vocab_.end() ? -1 : it->second;
    }
    int max_id = -1;
    for (const auto& [token, id] : vocab_) max_id = std::max(max_id, id);
    for (const AddedToken& added : added_tokens) max_id = std::max(max_id, added.id);
    vocab_size_ = max_id + 1;
    id_bytes_.resize(vocab_size_);
    for (const auto& [token, id] : vocab_) id_bytes_[id] = token_bytes(token);
    // Added tokens come second: like HF's id_to_token, they win over the model's vocab.
    for (const AddedToken& added : added_tokens) {
      id_bytes_[added.id] = token_bytes(added.content);
      if (added.normalized)
        normalized_matcher_.add(options_.nfc ? nfc(added.content) : added.content, added.id);
      else
        raw_matcher_.add(added.content, added.id);
    }
  }

  std::vector<int> encode(const std::string& text) const override {
    std::vector<int> ids;
    for (const auto& raw : raw_matcher_.split(text)) {
      if (raw.id >= 0) {
        ids.push_back(raw.id);
        continue;
      }
      const std::string normalized = options_.nfc ? nfc(raw.text) : std::string(raw.text);
      for (const auto& part : normalized_matcher_.split(normalized)) {
        if (part.id >= 0)
          ids.push_back(part.id);
        else
          encode_ordinary_text(part.text, ids);
      }
    }
    return ids;
  }

  std::string decode(const std::vector<int>& ids) const override {
    std::string bytes;
    for (int id : ids)
      if (id >= 0 && id < vocab_size_) bytes += id_bytes_[id];  // unknown ids: skipped, as HF
    return replace_invalid_utf8(bytes);
  }

  int vocab_size() const override { return vocab_size_; }
  std::optional<int> declared_bos() const override { return declared_bos_; }
  void set_declared_bos(std::optional<int> bos) { declared_bos_ = bos; }

 private:
  // Text with no added tokens in it: pre-tokenise, then BPE each piece.
  void encode_ordinary_text(std::string_view text, std::vector<int>& ids) const {
    std::string prefixed;
    if (options_.add_prefix_space && text.front() != ' ') {
      prefixed = " " + std::string(text);
      text = prefixed;
    }
    if (options_.split) {
      for (std::string_view piece : options_.split->split(text)) {
        if (!options_.use_regex) {
          encode_word(piece, ids);
          continue;
        }
        for (std::string_view word : split_gpt2_pattern(piece)) encode_word(word, ids);
      }
      return;
    }
    if (!options_.use_regex) {
      encode_word(text, ids);
      return;
    }
    for (std::string_view word : split_gpt2_pattern(text)) encode_word(word, ids);
  }

  // Most words recur, so their merge results are cached (bounded, like HF's cache).
  void encode_word(std::string_view word, std::vector<int>& ids) const {
    static constexpr size_t kCacheCapacity = 100000, kMaxCachedWordBytes = 256;
    std::string key(word);
    {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      const auto it = cache_.find(key);
      if (it != cache_.end()) {
        ids.insert(ids.end(), it->second.begin(), it->second.end());
        return;
      }
    }
    std::vector<int> word_ids = merge_word(word);
    ids.insert(ids.end(), word_ids.begin(), word_ids.end());
    if (word.size() <= kMaxCachedWordBytes) {
      std::lock_guard<std::mutex> lock(cache_mutex_);
      if (cache_.size() < kCacheCapacity) cache_.emplace(std::move(key), std::move(word_ids));
    }
  }

  // Starts from one symbol per byte and repeatedly applies the lowest-ranked merge among
  // adjacent pairs, leftmost first on ties: the order HF's BPE uses. A heap of candidate
  // pairs over a linked list of symbols keeps long words O(n log n).
  std::vector<int> merge_word(std::string_view word) const {
    if (word.empty()) return {};
    if (options_.ignore_merges) {
      const auto it = vocab_.find(to_byte_level(word));
      if (it != vocab_.end()) return {it->second};
    }
    std::vector<int> symbol;
    symbol.reserve(word.size());
    for (unsigned char b : word)
      if (byte_ids_[b] >= 0) symbol.push_back(byte_ids_[b]);
    const int n = static_cast<int>(symbol.size());
    if (n == 0) return {};
    std::vector<int> prev(n), next(n);
    std::vector<bool> alive(n, true);
    for (int i = 0; i < n; ++i) {
      prev[i] = i - 1;
      next[i] = i + 1 < n ? i + 1 : -1;
    }
    struct Candidate {
      int rank, position;  // position: the left symbol of the pair
      bool operator>(const Candidate& other) const {
        return rank != other.rank ? rank > other.rank : position > other.position;
      }
    };
    std::priority_queue<Candidate, std::vector<Candidate>, std::greater<Candidate>> queue;
    const auto push_candidate = [&](int left) {
      const auto it = merges_.find(pair_key(symbol[left], symbol[next[left]]));
      if (it != merges_.end()) queue.push({it->second.rank, left});
    };
    for (int i = 0; i + 1 < n; ++i) push_candidate(i);

    while (!queue.empty()) {
      const Candidate top = queue.top();
      queue.pop();
      const int left = top.position, right = alive[left] ? next[left] : -1;
      if (right < 0) continue;
      // A stale candidate: one of its symbols has merged since it was queued. Ranks are
      // unique per pair, so an equal rank means the pair is still the one queued.
      const auto it = merges_.find(pair_key(symbol[left], symbol[right]));
      if (it == merges_.end() || it->second.rank != top.rank) continue;
      symbol[left] = it->second.merged_id;
      alive[right] = false;
      next[left] = next[right];
      if (next[left] >= 0) prev[next[left]] = left;
      if (prev[left] >= 0) push_candidate(prev[left]);
      if (next[left] >= 0) push_candidate(left);
    }
    std::vector<int> ids;
    for (int i = 0; i >= 0; i = next[i]) ids.push_back(symbol[i]);
    return ids;
  }

  PipelineOptions options_;
  Vocab vocab_;
  MergeTable merges_;
  std::array<int, 256> byte_ids_{};       // id of each byte's token, -1 if it has none
  std::vector<std::string> id_bytes_;     // what each id decodes to ("" where no token)
  AddedTokenMatcher raw_matcher_;         // added tokens with normalized: false
  AddedTokenMatcher normalized_matcher_;  // added tokens with normalized: true
  int vocab_size_ = 0;
  std::optional<int> declared_bos_;
  mutable std::mutex cache_mutex_;
  mutable std::unordered_map<std::string, std::vector<int>> cache_;
};

// ---------------------------------------------------------------------------------------
// Loading

// An id as a tokenizer file may write it: a JSON integer in [0, 2^31 - 2] (so that the
// id table's size, the largest id plus one, is an int), nullopt otherwise. The JSON
// library would turn 2^32 + 5 into 5 and 2^31 into a negative int.
std::optional<int> strict_token_id(const json& id) {
  if (!id.is_number_unsigned() || id.get<uint64_t>() >= static_cast<uint64_t>(INT32_MAX)) return std::nullopt;
  return static_cast<int>(id.get<uint64_t>());
}

// A token string quoted for a one-line message (control characters escaped).
std::string quoted_token(const std::string& token) {
  return json(token).dump(-1, ' ', false, json::error_handler_t::replace);
}

Vocab parse_vocab(const json& object, const std::string& where) {
  if (!object.is_object())
    throw Error(where + ": the vocabulary must be a JSON object of token -> id, found " +
                std::string(object.type_name()));
  Vocab vocab;
  vocab.reserve(object.size());
  for (const auto& [token, id] : object.items()) {
    const std::optional<int> checked = strict_token_id(id);
    if (!checked)
      throw Error(where + ": token " + quoted_token(token) + " has id " + id.dump() +
                  ", not an integer in [0, 2147483646]");
    vocab.emplace(token, *checked);
  }
  return vocab;
}

// "ByteLevel", "null" or the JSON type, for messages about a pipeline component.
std::string component_type(const json& component) {
  if (component.is_null()) return "null";
  if (component.is_object() && component.contains("type") && component["type"].is_string())
    return component["type"].get<std::string>();
  return std::string("a JSON ") + component.type_name() + " without a type";
}

// Whether the normalizer is NFC; throws for any normalizer this loader cannot apply.
bool read_normalizer(const json& normalizer, const std::string& path) {
  const std::string type = component_type(normalizer);
  if (type == "null") return false;
  if (type == "NFC") return true;
  if (type == "Sequence" && normalizer.value("normalizers", json::array()).is_array()) {
    bool uses_nfc = false;
    for (const json& inner : normalizer["normalizers"]) uses_nfc |= read_normalizer(inner, path);
    return uses_nfc;
  }
  throw Error(path + ": normalizer " + type + " is not supported (only NFC or none)");
}

const json& member_or_null(const json& object, const char* key) {
  static const json null_json;
  return object.is_object() && object.contains(key) ? object[key] : null_json;
}

// Checks that the file is a byte-level BPE this loader supports (pre-tokenizer, decoder,
// no affixes or dropout) and reads its pipeline options.
PipelineOptions read_pipeline_options(const json& root, const json& model, const std::string& path) {
  // ByteLevel alone (GPT-2, NeoX) or Sequence [Split (Isolated), ByteLevel] (Llama-3, Qwen).
  const json* byte_level = &member_or_null(root, "pre_tokenizer");
  const json* split = nullptr;
  const std::string pre_tokenizer_type = component_type(*byte_level);
  if (pre_tokenizer_type == "Sequence") {
    const json& steps = member_or_null(*byte_level, "pretokenizers");
    if (!steps.is_array() || steps.size() != 2 || component_type(steps[0]) != "Split" ||
        component_type(steps[1]) != "ByteLevel")
      throw Error(path + ": pre_tokenizer Sequence must be [Split, ByteLevel]; no other is supported");
    split = &steps[0];
    byte_level = &steps[1];
  } else if (pre_tokenizer_type != "ByteLevel") {
    throw Error(path + ": pre_tokenizer is " + pre_tokenizer_type +
                "; only ByteLevel (optionally after a Split) is supported");
  }
  const json& pre_tokenizer = *byte_level;
  const std::string decoder_type = component_type(member_or_null(root, "decoder"));
  if (decoder_type != "ByteLevel" && decoder_type != "null")
    throw Error(path + ": decoder is " + decoder_type + "; only ByteLevel is supported");
  for (const char* key : {"continuing_subword_prefix", "end_of_word_suffix"}) {
    const json& affix = member_or_null(model, key);
    if (!affix.is_null() && affix != "")
      throw Error(path + ": model." + key + " is set; byte-level BPE does not use it");
  }
  const json& dropout = member_or_null(model, "dropout");
  if (!dropout.is_null() && !(dropout.is_number() && dropout.get<double>() == 0.0))
    throw Error(path + ": model.dropout is set; BPE dropout is not supported");

  PipelineOptions options;
  options.nfc = read_normalizer(member_or_null(root, "normalizer"), path);
  options.add_prefix_space = pre_tokenizer.value("add_prefix_space", true);
  options.use_regex = pre_tokenizer.value("use_regex", true);
  options.ignore_merges = model.value("ignore_merges", false);
  if (split) {
    const json& pattern = member_or_null(member_or_null(*split, "pattern"), "Regex");
    if (!pattern.is_string())
      throw Error(path + ": pre_tokenizer Split needs a pattern.Regex string");
    if (split->value("behavior", std::string()) != "Isolated" || split->value("invert", false))
      throw Error(path + ": pre_tokenizer Split behavior must be \"Isolated\" without invert");
    if (options.add_prefix_space)
      throw Error(path + ": ByteLevel add_prefix_space after a Split is not supported");
    options.split = std::make_shared<SplitRegex>(pattern.get<std::string>(), path + ": pre_tokenizer Split");
  }
  return options;
}

// model.merges in either spelling, ranked by position.
MergeTable read_merges(const json& model, const Vocab& vocab, const std::string& path) {
  const json& merge_list = member_or_null(model, "merges");
  if (!merge_list.is_array()) throw Error(path + ": model.merges is not a list");
  MergeTable merges;
  merges.reserve(merge_list.size());
  for (size_t i = 0; i < merge_list.size(); ++i) {
    const auto where = [&] { return path + ": model.merges[" + std::to_string(i) + "]"; };
    // Two spellings exist: "left right" (older files) and ["left", "right"].
    const json& entry = merge_list[i];
    std::string left, right;
    if (entry.is_string()) {
      const std::string text = entry.get<std::string>();
      const size_t space = text.find(' ');
      if (space == std::string::npos || text.find(' ', space + 1) != std::string::npos)
        throw Error(where() + ": \"" + text + "\" is not two tokens separated by a space");
      left = text.substr(0, space);
      right = text.substr(space + 1);
    } else if (entry.is_array() && entry.size() == 2 && entry[0].is_string() &&
               entry[1].is_string()) {
      left = entry[0].get<std::string>();
      right = entry[1].get<std::string>();
    } else {
      throw Error(where() + ": not a pair of tokens");
    }
    add_merge(merges, vocab, left, right, static_cast<int>(i), where);
  }
  return merges;
}

std::vector<AddedToken> read_added_tokens(const json& root, const std::string& path) {
  std::vector<AddedToken> added_tokens;
  const json& list = member_or_null(root, "added_tokens");
  if (!list.is_null() && !list.is_array()) throw Error(path + ": added_tokens must be a list");
  for (size_t i = 0; i < list.size(); ++i) {
    const json& entry = list[i];
    const std::string where = path + ": added_tokens[" + std::to_string(i) + "]";
    if (!entry.is_object() || !entry.contains("content") || !entry["content"].is_string())
      throw Error(where + " has no string \"content\"");
    const std::string content = entry["content"].get<std::string>();
    const std::string named = where + " " + quoted_token(content);
    if (content.empty()) throw Error(where + ": the content is empty (an added token must match some text)");
    const std::optional<int> id = entry.contains("id") ? strict_token_id(entry["id"]) : std::nullopt;
    if (!id)
      throw Error(named + ": \"id\" must be an integer in [0, 2147483646], not " +
                  (entry.contains("id") ? entry["id"].dump() : std::string("missing")));
    // An absent or null flag takes its default; any other non-boolean is an error, not a
    // JSON-library exception (found by fuzz_bpe_json).
    auto flag_or = [&](const char* flag, bool fallback) {
      if (!entry.contains(flag) || entry[flag].is_null()) return fallback;
      if (!entry[flag].is_boolean())
        throw Error(path + ": added token \"" + content + "\": \"" + flag + "\" must be true or false, not " +
                    entry[flag].dump());
      return entry[flag].get<bool>();
    };
    for (const char* flag : {"single_word", "lstrip", "rstrip"})
      if (flag_or(flag, false))
        throw Error(path + ": added token \"" + content + "\" uses " + flag +
                    ", which this loader does not support");
    const bool special = flag_or("special", false);
    added_tokens.push_back({content, *id, flag_or("normalized", !special)});
  }
  return added_tokens;
}

// Checks that the ids of the vocabulary and the added tokens are what Hugging Face's
// tokenizers makes of the file, so that an id means one token and no id is left to chance:
// it keeps a vocabulary token's own id for an added token with the same content, and gives
// every other added token the next id after the vocabulary (it only warns when the file
// says otherwise). So ids are unique and below the number of distinct tokens, N; an added
// token names one id, and an id one added token. `source` names the file in errors.
void check_token_ids(const Vocab& vocab, const std::vector<AddedToken>& added_tokens, const std::string& source,
                     const std::string& vocab_key) {
  size_t distinct = vocab.size();
  for (const AddedToken& added : added_tokens) distinct += vocab.count(added.content) ? 0 : 1;
  const auto counts = [&] {
    return "[0, " + std::to_string(distinct) + "): the file holds " + std::to_string(vocab.size()) +
           " vocabulary tokens and " + std::to_string(distinct - vocab.size()) + " added ones";
  };
  std::vector<const std::string*> vocab_token(distinct, nullptr);  // id -> its vocabulary token
  for (const auto& [token, id] : vocab) {
    if (static_cast<size_t>(id) >= distinct)
      throw Error(source + ": " + vocab_key + " token " + quoted_token(token) + " has id " + std::to_string(id) +
                  ", outside " + counts());
    if (vocab_token[id])
      throw Error(source + ": " + vocab_key + " tokens " + quoted_token(*vocab_token[id]) + " and " +
                  quoted_token(token) + " both have id " + std::to_string(id));
    vocab_token[id] = &token;
  }
  std::unordered_map<std::string, size_t> by_content;
  std::unordered_map<int, size_t> by_id;
  for (size_t i = 0; i < added_tokens.size(); ++i) {
    const AddedToken& added = added_tokens[i];
    const std::string where = source + ": added_tokens[" + std::to_string(i) + "] " + quoted_token(added.content);
    const auto in_vocab = vocab.find(added.content);
    if (in_vocab != vocab.end() && in_vocab->second != added.id)
      throw Error(where + " has id " + std::to_string(added.id) + ", but the vocabulary gives it id " +
                  std::to_string(in_vocab->second));
    if (in_vocab == vocab.end()) {
      if (static_cast<size_t>(added.id) >= distinct)
        throw Error(where + " has id " + std::to_string(added.id) + ", outside " + counts());
      if (vocab_token[added.id])
        throw Error(where + " has id " + std::to_string(added.id) + ", the id of vocabulary token " +
                    quoted_token(*vocab_token[added.id]));
    }
    const auto [same_content, fresh_content] = by_content.emplace(added.content, i);
    if (!fresh_content && added_tokens[same_content->second].id != added.id)
      throw Error(where + " has id " + std::to_string(added.id) + ", but added_tokens[" +
                  std::to_string(same_content->second) + "] gives the same content id " +
                  std::to_string(added_tokens[same_content->second].id));
    const auto [same_id, fresh_id] = by_id.emplace(added.id, i);
    if (!fresh_id && added_tokens[same_id->second].content != added.content)
      throw Error(where + " has id " + std::to_string(added.id) + ", which added_tokens[" +
                  std::to_string(same_id->second) + "] " + quoted_token(added_tokens[same_id->second].content) +
                  " already has");
  }
}

// The BOS id to prepend: -1 when tokenizer_config.json says none is added, nullopt when it
// does not say (the model decides).
std::optional<int> read_declared_bos(const std::string& path, const std::vector<AddedToken>& added_tokens,
                                     const Vocab& vocab) {
  // BOS comes from tokenizer_config.json (HF's tokenizer class adds it, not tokenizer.json):
  // its bos_token, when add_bos_token (or the class's default) says so.
  std::optional<int> declared_bos;
  const auto config_path = std::filesystem::path(path).parent_path() / "tokenizer_config.json";
  if (std::filesystem::exists(config_path)) {
    const json config = read_json_file(config_path.string());
    const json& bos = member_or_null(config, "bos_token");
    const std::string bos_text = bos.is_string() ? bos.get<std::string>()
                                 : bos.is_object() ? bos.value("content", std::string()) : std::string();
    // add_bos_token when given; otherwise the default of the tokenizer class HF would
    // build: LLaMA's and Llama-3's (PreTrainedTokenizerFast with a BOS template) add it,
    // GPT-2's, GPT-NeoX's and Qwen's do not; for any other class the model decides.
    const std::string tokenizer_class = config.value("tokenizer_class", std::string());
    std::optional<bool> add_bos;
    if (config.contains("add_bos_token") && config["add_bos_token"].is_boolean())
      add_bos = config["add_bos_token"].get<bool>();
    else if (tokenizer_class == "PreTrainedTokenizerFast" || tokenizer_class.rfind("LlamaTokenizer", 0) == 0)
      add_bos = true;
    else if (tokenizer_class.rfind("GPT2Tokenizer", 0) == 0 || tokenizer_class.rfind("GPTNeoXTokenizer", 0) == 0 ||
             tokenizer_class.rfind("Qwen2Tokenizer", 0) == 0)
      add_bos = false;
    if (add_bos) declared_bos = -1;
    if (add_bos && *add_bos && !bos_text.empty()) {
      for (const AddedToken& added : added_tokens)
        if (added.content == bos_text) declared_bos = added.id;
      if (*declared_bos < 0 && vocab.count(bos_text)) declared_bos = vocab.at(bos_text);
      if (*declared_bos < 0)
        throw Error(config_path.string() + ": bos_token \"" + bos_text + "\" is not a token of " + path);
    }
  }
  return declared_bos;
}

}  // namespace

std::unique_ptr<Tokenizer> load_bpe_tokenizer_json(const std::string& tokenizer_json) {
  const std::string& path = tokenizer_json;
  const json root = read_json_file(path);
  const json& model = member_or_null(root, "model");
  const std::string model_type = component_type(model);
  if (model_type != "BPE")
    throw Error(path + ": model.type is " + model_type + "; only byte-level BPE is supported");
  const PipelineOptions options = read_pipeline_options(root, model, path);
  Vocab vocab = parse_vocab(member_or_null(model, "vocab"), path + ": model.vocab");
  const std::vector<AddedToken> added_tokens = read_added_tokens(root, path);
  check_token_ids(vocab, added_tokens, path, "model.vocab");
  MergeTable merges = read_merges(model, vocab, path);
  const std::optional<int> declared_bos = read_declared_bos(path, added_tokens, vocab);
  auto tokenizer = std::make_unique<ByteLevelBpeTokenizer>(path, std::move(vocab), std::move(merges),
                                                           added_tokens, options);
  tokenizer->set_declared_bos(declared_bos);
  return tokenizer;
}

std::unique_ptr<Tokenizer> load_bpe_vocab_merges(const std::string& vocab_json,
                                                 const std::string& merges_txt) {
  Vocab vocab = parse_vocab(read_json_file(vocab_json), vocab_json);
  check_token_ids(vocab, {}, vocab_json, "the vocabulary's");

  std::ifstream in(merges_txt, std::ios::binary);
  if (!in) throw Error(merges_txt + ": cannot open");
  MergeTable merges;
  std::string line;
  int rank = 0;
  for (int line_number = 1; std::getline(in, line); ++line_number) {
    if (!line.empty() && line.back() == '\r') line.pop_back();
    // Some files start with a "#version: 0.2" header; blank lines carry nothing.
    if (line.empty() || (line_number == 1 && line.rfind("#version", 0) == 0)) continue;
    const auto where = [&] { return merges_txt + ":" + std::to_string(line_number); };
    const size_t space = line.find(' ');
    if (space == 0 || space == std::string::npos || space + 1 == line.size() ||
        line.find(' ', space + 1) != std::string::npos)
      throw Error(where() + ": expected two tokens separated by one space, found \"" + line + "\"");
    add_merge(merges, vocab, line.substr(0, space), line.substr(space + 1), rank++, where);
  }

  // GPT-2's end-of-text token is split out of raw text, as HF's converted GPT-2 does.
  std::vector<AddedToken> added_tokens;
  const auto end_of_text = vocab.find("<|endoftext|>");
  if (end_of_text != vocab.end())
    added_tokens.push_back({end_of_text->first, end_of_text->second, /*normalized=*/false});
  return std::make_unique<ByteLevelBpeTokenizer>(vocab_json, std::move(vocab), std::move(merges),
                                                 added_tokens, PipelineOptions{});
}

// ---------------------------------------------------------------------------------------
// Unicode properties and NFC from ICU.
namespace {

CharClass char_class(char32_t c) {
  if (c < 0x80) {
    if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) return CharClass::kLetter;
    if (c >= '0' && c <= '9') return CharClass::kNumber;
    if (c == ' ' || (c >= 0x09 && c <= 0x0D)) return CharClass::kWhitespace;
    return CharClass::kOther;
  }
  if (is_raw_byte(c)) return CharClass::kOther;
  // Oniguruma's Unicode \s, as HF tokenizers uses it, is the White_Space property.
  if (u_hasBinaryProperty(static_cast<UChar32>(c), UCHAR_WHITE_SPACE)) return CharClass::kWhitespace;
  const uint32_t category = U_GET_GC_MASK(static_cast<UChar32>(c));
  if (category & U_GC_L_MASK) return CharClass::kLetter;
  if (category & U_GC_N_MASK) return CharClass::kNumber;
  return CharClass::kOther;
}

std::string nfc(std::string_view text) {
  const DecodedText decoded = decode_utf8(text);
  // Below U+0300 every character is already NFC and composes with nothing that follows.
  if (std::all_of(decoded.code_points.begin(), decoded.code_points.end(),
                  [](char32_t c) { return c < 0x300 || is_raw_byte(c); }))
    return std::string(text);
  UErrorCode status = U_ZERO_ERROR;
  const icu::Normalizer2* normalizer = icu::Normalizer2::getNFCInstance(status);
  std::string out;
  out.reserve(text.size());
  icu::UnicodeString run;
  // Invalid bytes pass through unchanged; the valid runs between them are normalised.
  const auto flush = [&] {
    if (run.isEmpty() || U_FAILURE(status)) return;
    normalizer->normalize(run, status).toUTF8String(out);
    run.remove();
  };
  for (char32_t c : decoded.code_points) {
    if (is_raw_byte(c)) {
      flush();
      append_char(out, c);
    } else {
      run.append(static_cast<UChar32>(c));
    }
  }
  flush();
  if (U_FAILURE(status)) throw Error(std::string("ICU NFC normalisation failed: ") + u_errorName(status));
  return out;
}

}  // namespace
}  // namespace kvevict
