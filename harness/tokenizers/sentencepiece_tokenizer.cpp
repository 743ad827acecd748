// SentencePiece tokenizer written from scratch: it reads tokenizer.model (a serialized
// sentencepiece.ModelProto) without a protobuf library and encodes/decodes the way
// libsentencepiece 0.1.97 does. Why not the library: Debian's libsentencepiece embeds
// protobuf-lite 3.14 and exports its symbols, while LibTorch loads libprotobuf 3.21;
// the two in one process crash at start-up. tests/crosscheck/ compares this code
// with the real library on thousands of strings.
//
// Supported: BPE models (LLaMA, stories260K) with an identity normaliser (no
// precompiled charsmap), user-defined symbols, unused pieces and byte fallback.
// Unigram/word/char models and NFKC-style charsmaps raise an Error instead of
// tokenising differently from the library.
#include <algorithm>
#include <array>
#include <cstdint>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <queue>
#include <string>
#include <string_view>
#include <unordered_map>
#include <unordered_set>
#include <utility>
#include <vector>

#include "harness/common/errors.h"
#include "harness/tokenizers/tokenizer.h"

namespace kvevict {
namespace {

// U+2581 LOWER ONE EIGHTH BLOCK: SentencePiece's visible stand-in for a space.
constexpr std::string_view kSpaceSymbol = "\xe2\x96\x81";
// U+FFFD REPLACEMENT CHARACTER, substituted for each byte of malformed UTF-8.
constexpr std::string_view kReplacementCharacter = "\xef\xbf\xbd";
// What the library prints for <unk> when the model does not set unk_surface (U+2047).
constexpr std::string_view kDefaultUnknownSurface = " \xe2\x81\x87 ";

// ---------------------------------------------------------------------------
// Protobuf wire format (https://protobuf.dev/programming-guides/encoding/).

enum class WireType { kVarint = 0, kFixed64 = 1, kLengthDelimited = 2, kFixed32 = 5 };

// Reads one serialized message; every read is bounds-checked so a truncated or corrupt
// file ends in an Error naming the file, never in a crash.
class WireReader {
 public:
  WireReader(std::string_view bytes, const std::string& file, std::string message)
      : bytes_(bytes), file_(file), message_(std::move(message)) {}

  bool at_end() const { return position_ == bytes_.size(); }

  // Reads the next field's tag.
  std::pair<uint32_t, WireType> next_field() {
    const uint64_t tag = varint();
    const uint64_t field = tag >> 3;
    const uint64_t wire_type = tag & 7;
    if (field == 0 || field > 0x1fffffff) fail("invalid field number");
    if (wire_type != 0 && wire_type != 1 && wire_type != 2 && wire_type != 5)
      fail("unsupported wire type " + std::to_string(wire_type) + " for field " +
           std::to_string(field));
    return {static_cast<uint32_t>(field), static_cast<WireType>(wire_type)};
  }

  uint64_t varint() {
    uint64_t value = 0;
    for (int shift = 0; shift < 64; shift += 7) {
      if (position_ >= bytes_.size()) fail("truncated varint");
      const auto byte = static_cast<uint8_t>(bytes_[position_++]);
      value |= static_cast<uint64_t>(byte & 0x7f) << shift;
      if ((byte & 0x80) == 0) return value;
    }
    fail("varint longer than 10 bytes");
  }

  std::string_view length_delimited() {
    const uint64_t length = varint();
    if (length > bytes_.size() - position_) fail("truncated length-delimited field");
    const std::string_view value = bytes_.substr(position_, length);
    position_ += length;
    return value;
  }

  float fixed32_float() {
    if (bytes_.size() - position_ < 4) fail("truncated fixed32 field");
    // The wire format is little-endian, as is every machine this harness runs on.
    static_assert(sizeof(float) == 4);
    uint32_t bits = 0;
    for (int i = 3; i >= 0; --i) bits = (bits << 8) | static_cast<uint8_t>(bytes_[position_ + i]);
    position_ += 4;
    float value;
    std::memcpy(&value, &bits, sizeof value);
    return value;
  }

  // Reads a field of the expected wire type, or fails naming the field.
  uint64_t varint_field(WireType type, const char* name) {
    expect(type, WireType::kVarint, name);
    return varint();
  }
  std::string_view bytes_field(WireType type, const char* name) {
    expect(type, WireType::kLengthDelimited, name);
    return length_delimited();
  }
  float float_field(WireType type, const char* name) {
    expect(type, WireType::kFixed32, name);
    return fixed32_float();
  }

  // Skips a field this reader does not use (the format allows unknown fields).
  void skip(WireType type) {
    switch (type) {
      case WireType::kVarint:
        varint();
        break;
      case WireType::kFixed64:
        advance(8);
        break;
      case WireType::kLengthDelimited:
        length_delimited();
        break;
      case WireType::kFixed32:
        advance(4);
        break;
    }
  }

  [[noreturn]] void fail(const std::string& what) const {
    throw Error(file_ + ": malformed SentencePiece model (" + message_ + ": " + what + " at byte " +
                std::to_string(position_) + ")");
  }

 private:
  void advance(size_t count) {
    if (bytes_.size() - position_ < count) fail("truncated fixed-size field");
    position_ += count;
  }
  void expect(WireType actual, WireType expected, const char* name) const {
    if (actual != expected) fail(std::string("field ") + name + " has the wrong wire type");
  }

  std::string_view bytes_;
  size_t position_ = 0;
  const std::string& file_;
  std::string message_;
};

// ---------------------------------------------------------------------------
// The parts of sentencepiece_model.proto that tokenisation depends on.

enum class PieceType {
  kNormal = 1,
  kUnknown = 2,
  kControl = 3,
  kUserDefined = 4,
  kUnused = 5,
  kByte = 6
};
enum class ModelType { kUnigram = 1, kBpe = 2, kWord = 3, kChar = 4 };

struct Piece {
  std::string text;
  float score = 0.0f;
  PieceType type = PieceType::kNormal;
};

struct ModelProto {
  std::vector<Piece> pieces;
  // TrainerSpec
  ModelType model_type = ModelType::kUnigram;
  bool byte_fallback = false;
  bool treat_whitespace_as_suffix = false;
  bool has_unk_surface = false;
  std::string unk_surface;
  // NormalizerSpec
  std::string normalizer_name;
  std::string precompiled_charsmap;
  bool add_dummy_prefix = true;
  bool remove_extra_whitespaces = true;
  bool escape_whitespaces = true;
  // denormalizer_spec (field 5) only matters when it carries a charsmap.
  std::string denormalizer_charsmap;
};

Piece parse_piece(std::string_view bytes, const std::string& file, size_t index) {
  WireReader reader(bytes, file, "piece " + std::to_string(index));
  Piece piece;
  while (!reader.at_end()) {
    const auto [field, type] = reader.next_field();
    switch (field) {
      case 1:
        piece.text = std::string(reader.bytes_field(type, "piece"));
        break;
      case 2:
        piece.score = reader.float_field(type, "score");
        break;
      case 3: {
        const uint64_t value = reader.varint_field(type, "type");
        if (value < 1 || value > 6) reader.fail("unknown piece type " + std::to_string(value));
        piece.type = static_cast<PieceType>(value);
        break;
      }
      default:
        reader.skip(type);
    }
  }
  return piece;
}

void parse_trainer_spec(std::string_view bytes, const std::string& file, ModelProto& model) {
  WireReader reader(bytes, file, "trainer_spec");
  while (!reader.at_end()) {
    const auto [field, type] = reader.next_field();
    switch (field) {
      case 3: {
        const uint64_t value = reader.varint_field(type, "model_type");
        if (value < 1 || value > 4) reader.fail("unknown model_type " + std::to_string(value));
        model.model_type = static_cast<ModelType>(value);
        break;
      }
      case 24:
        model.treat_whitespace_as_suffix =
            reader.varint_field(type, "treat_whitespace_as_suffix") != 0;
        break;
      case 35:
        model.byte_fallback = reader.varint_field(type, "byte_fallback") != 0;
        break;
      case 44:
        model.has_unk_surface = true;
        model.unk_surface = std::string(reader.bytes_field(type, "unk_surface"));
        break;
      default:
        reader.skip(type);
    }
  }
}

void parse_normalizer_spec(std::string_view bytes, const std::string& file, ModelProto& model) {
  WireReader reader(bytes, file, "normalizer_spec");
  while (!reader.at_end()) {
    const auto [field, type] = reader.next_field();
    switch (field) {
      case 1:
        model.normalizer_name = std::string(reader.bytes_field(type, "name"));
        break;
      case 2:
        model.precompiled_charsmap = std::string(reader.bytes_field(type, "precompiled_charsmap"));
        break;
      case 3:
        model.add_dummy_prefix = reader.varint_field(type, "add_dummy_prefix") != 0;
        break;
      case 4:
        model.remove_extra_whitespaces = reader.varint_field(type, "remove_extra_whitespaces") != 0;
        break;
      case 5:
        model.escape_whitespaces = reader.varint_field(type, "escape_whitespaces") != 0;
        break;
      default:
        reader.skip(type);
    }
  }
}

std::string denormalizer_charsmap(std::string_view bytes, const std::string& file) {
  WireReader reader(bytes, file, "denormalizer_spec");
  std::string charsmap;
  while (!reader.at_end()) {
    const auto [field, type] = reader.next_field();
    if (field == 2)
      charsmap = std::string(reader.bytes_field(type, "precompiled_charsmap"));
    else
      reader.skip(type);
  }
  return charsmap;
}

ModelProto parse_model_proto(std::string_view bytes, const std::string& file) {
  WireReader reader(bytes, file, "ModelProto");
  ModelProto model;
  while (!reader.at_end()) {
    const auto [field, type] = reader.next_field();
    switch (field) {
      case 1:
        model.pieces.push_back(
            parse_piece(reader.bytes_field(type, "pieces"), file, model.pieces.size()));
        break;
      case 2:
        parse_trainer_spec(reader.bytes_field(type, "trainer_spec"), file, model);
        break;
      case 3:
        parse_normalizer_spec(reader.bytes_field(type, "normalizer_spec"), file, model);
        break;
      case 5:
        model.denormalizer_charsmap =
            denormalizer_charsmap(reader.bytes_field(type, "denormalizer_spec"), file);
        break;
      default:
        reader.skip(type);  // self_test_data (4) and anything newer
    }
  }
  return model;
}

// ---------------------------------------------------------------------------
// UTF-8, with the library's exact notion of validity (util.cc DecodeUTF8): shortest
// form only, no surrogates, nothing above U+10FFFF.

bool is_trail_byte(char c) { return (static_cast<uint8_t>(c) & 0xc0) == 0x80; }

// Length of the well-formed UTF-8 character at the start of `text`, or 0 if malformed.
size_t valid_utf8_length(std::string_view text) {
  if (text.empty()) return 0;
  const auto lead = static_cast<uint8_t>(text[0]);
  const auto payload = [&](size_t i) {
    return static_cast<uint32_t>(static_cast<uint8_t>(text[i]) & 0x3f);
  };
  const auto is_scalar = [](uint32_t cp) {
    return cp < 0xd800 || (cp >= 0xe000 && cp <= 0x10ffff);
  };
  if (lead < 0x80) return 1;
  if ((lead & 0xe0) == 0xc0 && text.size() >= 2 && is_trail_byte(text[1])) {
    const uint32_t cp = ((lead & 0x1fu) << 6) | payload(1);
    return cp >= 0x80 ? 2 : 0;
  }
  if ((lead & 0xf0) == 0xe0 && text.size() >= 3 && is_trail_byte(text[1]) &&
      is_trail_byte(text[2])) {
    const uint32_t cp = ((lead & 0x0fu) << 12) | (payload(1) << 6) | payload(2);
    return cp >= 0x800 && is_scalar(cp) ? 3 : 0;
  }
  if ((lead & 0xf8) == 0xf0 && text.size() >= 4 && is_trail_byte(text[1]) &&
      is_trail_byte(text[2]) && is_trail_byte(text[3])) {
    const uint32_t cp =
        ((lead & 0x07u) << 18) | (payload(1) << 12) | (payload(2) << 6) | payload(3);
    return cp >= 0x10000 && is_scalar(cp) ? 4 : 0;
  }
  return 0;
}

// The character length implied by the lead byte alone, clipped to the text; this is how
// the library steps through text it has already normalised to valid UTF-8.
size_t lead_byte_length(std::string_view text) {
  const auto lead = static_cast<uint8_t>(text[0]);
  const size_t length = lead < 0xc0 ? 1 : lead < 0xe0 ? 2 : lead < 0xf0 ? 3 : 4;
  return std::min(length, text.size());
}

bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}
bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// "<0x41>" -> 0x41; -1 for anything that is not exactly a byte piece's spelling.
int byte_piece_value(std::string_view piece) {
  if (piece.size() != 6 || !starts_with(piece, "<0x") || piece[5] != '>') return -1;
  int value = 0;
  for (char c : piece.substr(3, 2)) {
    int digit;
    if (c >= '0' && c <= '9')
      digit = c - '0';
    else if (c >= 'A' && c <= 'F')
      digit = c - 'A' + 10;
    else
      return -1;  // the library spells byte pieces with upper-case hex only
    value = value * 16 + digit;
  }
  return value;
}

// ---------------------------------------------------------------------------

class SentencePieceTokenizer : public Tokenizer {
 public:
  SentencePieceTokenizer(ModelProto model, const std::string& file) : model_(std::move(model)) {
    reject_unsupported(file);
    index_pieces(file);
  }
  SentencePieceTokenizer(const SentencePieceTokenizer&) = delete;
  SentencePieceTokenizer& operator=(const SentencePieceTokenizer&) = delete;

  std::vector<int> encode(const std::string& text) const override {
    const std::string normalized = normalize(text);
    std::vector<int> ids;
    bool previous_was_unknown = false;
    for (const auto& [piece, id] : bpe_segment(normalized)) {
      const bool is_unknown = id == unk_id_;
      if (is_unknown && model_.byte_fallback) {
        // Characters outside the vocabulary are spelled as their UTF-8 bytes.
        for (char byte : piece) ids.push_back(byte_piece_ids_[static_cast<uint8_t>(byte)]);
      } else if (!(is_unknown && previous_was_unknown)) {
        // Without byte fallback the library folds a run of unknown characters into one <unk>.
        ids.push_back(id);
      }
      previous_was_unknown = is_unknown;
    }
    return ids;
  }

  std::string decode(const std::vector<int>& ids) const override {
    std::string text;
    std::string pending_bytes;  // a run of byte pieces, turned into UTF-8 as a whole
    // The dummy prefix is one U+2581 at the very start: it is stripped from the first
    // piece that starts with one while nothing visible has been output yet.
    bool dummy_prefix_pending = model_.add_dummy_prefix || model_.remove_extra_whitespaces;
    for (int id : ids) {
      if (id < 0 || id >= vocab_size())
        throw Error("SentencePiece decode: token id " + std::to_string(id) +
                    " is outside the vocabulary of " + std::to_string(vocab_size()));
      const Piece& piece = model_.pieces[id];
      if (piece.type == PieceType::kByte) {
        pending_bytes.push_back(static_cast<char>(byte_piece_value(piece.text)));
        continue;
      }
      append_bytes_as_utf8(pending_bytes, text);
      pending_bytes.clear();
      if (!text.empty()) dummy_prefix_pending = false;
      append_piece_surface(piece, dummy_prefix_pending, text);
    }
    append_bytes_as_utf8(pending_bytes, text);
    return text;
  }

  int vocab_size() const override { return static_cast<int>(model_.pieces.size()); }

 private:
  void reject_unsupported(const std::string& file) const {
    if (model_.model_type != ModelType::kBpe) {
      const char* names[] = {"", "unigram", "BPE", "word", "char"};
      throw Error(file + ": SentencePiece " + names[static_cast<int>(model_.model_type)] +
                  " models are not supported yet (only BPE models such as LLaMA's)");
    }
    if (!model_.precompiled_charsmap.empty() || !model_.denormalizer_charsmap.empty())
      throw Error(
          file + ": SentencePiece models with a precompiled normalisation charsmap (normalizer '" +
          model_.normalizer_name + "') are not supported yet; only 'identity' normalisation is");
    if (model_.treat_whitespace_as_suffix)
      throw Error(file +
                  ": SentencePiece models with treat_whitespace_as_suffix are not supported yet");
  }

  // The library's ModelInterface::InitializePieces, including the checks it makes.
  void index_pieces(const std::string& file) {
    byte_piece_ids_.fill(-1);
    for (size_t i = 0; i < model_.pieces.size(); ++i) {
      const Piece& piece = model_.pieces[i];
      const int id = static_cast<int>(i);
      if (piece.text.empty())
        throw Error(file + ": SentencePiece piece " + std::to_string(i) + " is empty");
      if (piece.text.find('\0') != std::string::npos)
        throw Error(file + ": SentencePiece piece " + std::to_string(i) +
                    " contains a NUL character");
      if (!piece_ids_.emplace(piece.text, id).second)
        throw Error(file + ": SentencePiece piece '" + piece.text + "' is defined twice");
      // Only these may be produced by merging; control, unknown and byte pieces never are.
      if (piece.type == PieceType::kNormal || piece.type == PieceType::kUserDefined ||
          piece.type == PieceType::kUnused)
        mergeable_piece_ids_.emplace(piece.text, id);
      if (piece.type == PieceType::kUserDefined) {
        user_defined_symbols_.insert(piece.text);
        longest_user_defined_symbol_ = std::max(longest_user_defined_symbol_, piece.text.size());
      }
      if (piece.type == PieceType::kUnknown) {
        if (unk_id_ >= 0)
          throw Error(file + ": SentencePiece model defines more than one unknown piece");
        unk_id_ = id;
      }
      if (piece.type == PieceType::kByte) {
        if (!model_.byte_fallback)
          throw Error(file + ": SentencePiece byte piece " + piece.text +
                      " found although byte_fallback is off");
        const int value = byte_piece_value(piece.text);
        if (value < 0)
          throw Error(file + ": SentencePiece byte piece '" + piece.text + "' is invalid");
        byte_piece_ids_[value] = id;
      }
    }
    if (unk_id_ < 0) throw Error(file + ": SentencePiece model has no unknown (<unk>) piece");
    if (model_.byte_fallback &&
        std::find(byte_piece_ids_.begin(), byte_piece_ids_.end(), -1) != byte_piece_ids_.end())
      throw Error(file + ": SentencePiece model has byte_fallback on but not all 256 byte pieces");
  }

  // Length of the longest user-defined symbol that `text` starts with, or 0.
  size_t user_defined_prefix(std::string_view text) const {
    for (size_t length = std::min(longest_user_defined_symbol_, text.size()); length > 0; --length)
      if (user_defined_symbols_.count(text.substr(0, length))) return length;
    return 0;
  }

  // Identity normalisation (normalizer.cc without a charsmap): malformed UTF-8 bytes
  // become U+FFFD, spaces become U+2581, optional dummy-prefix space and whitespace
  // squeezing. User-defined symbols pass through as single units.
  std::string normalize(std::string_view input) const {
    std::string normalized;
    if (input.empty()) return normalized;

    // Returns the next unit of input as normalised text, and how many input bytes it used.
    const auto next_unit = [this](std::string_view rest) -> std::pair<std::string_view, size_t> {
      if (const size_t length = user_defined_prefix(rest)) return {rest.substr(0, length), length};
      const size_t length = valid_utf8_length(rest);
      if (length == 0) return {kReplacementCharacter, 1};
      return {rest.substr(0, length), length};
    };

    if (model_.remove_extra_whitespaces) {
      while (!input.empty()) {
        const auto [unit, consumed] = next_unit(input);
        if (unit != " ") break;
        input.remove_prefix(consumed);
      }
      if (input.empty()) return normalized;
    }

    const auto append_space = [&] { normalized += model_.escape_whitespaces ? kSpaceSymbol : " "; };
    if (model_.add_dummy_prefix) append_space();

    bool previous_ends_in_space = model_.remove_extra_whitespaces;
    while (!input.empty()) {
      auto [unit, consumed] = next_unit(input);
      input.remove_prefix(consumed);
      // Squeezes runs of spaces to one when remove_extra_whitespaces is on.
      while (previous_ends_in_space && starts_with(unit, " ")) unit.remove_prefix(1);
      if (!unit.empty()) {
        for (char c : unit) {
          if (c == ' ')
            append_space();
          else
            normalized += c;
        }
        previous_ends_in_space = ends_with(unit, " ");
      }
      if (!model_.remove_extra_whitespaces) previous_ends_in_space = false;
    }

    if (model_.remove_extra_whitespaces) {
      const std::string_view space = model_.escape_whitespaces ? kSpaceSymbol : " ";
      while (ends_with(normalized, space)) normalized.resize(normalized.size() - space.size());
    }
    return normalized;
  }

  // BPE over normalised text (bpe_model.cc): start from single characters (user-defined
  // symbols whole and never merged), then keep merging the adjacent pair whose
  // concatenation is the highest-scoring piece, leftmost first on ties. Returns
  // (piece, id) pairs; pieces outside the vocabulary get unk_id_.
  std::vector<std::pair<std::string_view, int>> bpe_segment(std::string_view normalized) const {
    struct Symbol {
      std::string_view text;  // empty once merged into its left neighbour
      int prev;               // -1 at the start
      int next;               // -1 at the end
      bool frozen;            // user-defined symbols are never merged
    };
    struct Candidate {
      float score;
      int left;
      int right;
      size_t merged_size;  // lets a stale candidate be recognised after either side changed
    };
    const auto lower_priority = [](const Candidate& a, const Candidate& b) {
      return a.score < b.score || (a.score == b.score && a.left > b.left);
    };

    std::vector<Symbol> symbols;
    for (std::string_view rest = normalized; !rest.empty();) {
      size_t length = user_defined_prefix(rest);
      const bool frozen = length > 0;
      if (!frozen) length = lead_byte_length(rest);
      const int index = static_cast<int>(symbols.size());
      symbols.push_back(
          {rest.substr(0, length), index - 1, length == rest.size() ? -1 : index + 1, frozen});
      rest.remove_prefix(length);
    }
    if (symbols.empty()) return {};

    std::priority_queue<Candidate, std::vector<Candidate>, decltype(lower_priority)> candidates(
        lower_priority);
    // Unused pieces take part in merging but may not appear in the output; the library
    // splits them back into the two parts they were last formed from.
    std::unordered_map<std::string_view, std::pair<std::string_view, std::string_view>>
        unused_parts;

    const auto consider_pair = [&](int left, int right) {
      if (left < 0 || right < 0 || symbols[left].frozen || symbols[right].frozen) return;
      // Adjacent symbols are contiguous in `normalized`, so the merge is a longer view.
      const std::string_view merged(symbols[left].text.data(),
                                    symbols[left].text.size() + symbols[right].text.size());
      const auto found = mergeable_piece_ids_.find(merged);
      if (found == mergeable_piece_ids_.end()) return;
      candidates.push({model_.pieces[found->second].score, left, right, merged.size()});
      if (model_.pieces[found->second].type == PieceType::kUnused)
        unused_parts[merged] = {symbols[left].text, symbols[right].text};
    };

    for (size_t i = 1; i < symbols.size(); ++i)
      consider_pair(static_cast<int>(i) - 1, static_cast<int>(i));

    while (!candidates.empty()) {
      const Candidate best = candidates.top();
      candidates.pop();
      Symbol& left = symbols[best.left];
      Symbol& right = symbols[best.right];
      if (left.text.empty() || right.text.empty() ||
          left.text.size() + right.text.size() != best.merged_size)
        continue;  // one side has been merged elsewhere since this candidate was queued
      left.text = std::string_view(left.text.data(), best.merged_size);
      left.next = right.next;
      if (right.next >= 0) symbols[right.next].prev = best.left;
      right.text = {};
      consider_pair(left.prev, best.left);
      consider_pair(best.left, left.next);
    }

    std::vector<std::pair<std::string_view, int>> output;
    // The library's PieceToId: any piece (control and byte ones too), else unknown.
    const auto piece_id = [this](std::string_view piece) {
      const auto found = piece_ids_.find(piece);
      return found == piece_ids_.end() ? unk_id_ : found->second;
    };
    const auto emit = [&](std::string_view piece, const auto& self) -> void {
      const int id = piece_id(piece);
      if (model_.pieces[id].type == PieceType::kUnused) {
        const auto parts = unused_parts.find(piece);
        if (parts != unused_parts.end()) {
          self(parts->second.first, self);
          self(parts->second.second, self);
          return;
        }
      }
      output.emplace_back(piece, id);
    };
    for (int index = 0; index != -1; index = symbols[index].next) emit(symbols[index].text, emit);
    return output;
  }

  // Appends decoded bytes, replacing each byte of malformed UTF-8 with U+FFFD.
  static void append_bytes_as_utf8(std::string_view bytes, std::string& text) {
    while (!bytes.empty()) {
      const size_t length = valid_utf8_length(bytes);
      if (length == 0) {
        text += kReplacementCharacter;
        bytes.remove_prefix(1);
      } else {
        text += bytes.substr(0, length);
        bytes.remove_prefix(length);
      }
    }
  }

  void append_piece_surface(const Piece& piece, bool& dummy_prefix_pending,
                            std::string& text) const {
    if (piece.type == PieceType::kControl) return;  // <s>, </s> have no surface
    if (piece.type == PieceType::kUnknown) {
      text +=
          model_.has_unk_surface ? std::string_view(model_.unk_surface) : kDefaultUnknownSurface;
      return;
    }
    std::string_view surface = piece.text;
    if (dummy_prefix_pending && starts_with(surface, kSpaceSymbol)) {
      surface.remove_prefix(kSpaceSymbol.size());
      // With remove_extra_whitespaces the input never had leading spaces, so every
      // leading U+2581 up to the first visible character is dropped, not just one.
      if (!model_.remove_extra_whitespaces) dummy_prefix_pending = false;
    }
    for (size_t position = 0; position < surface.size();) {
      if (starts_with(surface.substr(position), kSpaceSymbol)) {
        text += ' ';
        position += kSpaceSymbol.size();
      } else {
        text += surface[position++];
      }
    }
  }

  ModelProto model_;
  // Keys of these three are views into model_.pieces, which never changes after
  // construction (hence the deleted copy constructor).
  std::unordered_map<std::string_view, int> piece_ids_;  // every piece
  // Normal, user-defined and unused pieces: the ones BPE merges may produce.
  std::unordered_map<std::string_view, int> mergeable_piece_ids_;
  std::unordered_set<std::string_view> user_defined_symbols_;
  size_t longest_user_defined_symbol_ = 0;
  std::array<int, 256> byte_piece_ids_{};
  int unk_id_ = -1;
};

}  // namespace

std::unique_ptr<Tokenizer> load_sentencepiece_tokenizer(const std::string& model_file) {
  if (!std::filesystem::exists(model_file)) throw Error(model_file + ": no such file");
  std::ifstream in(model_file, std::ios::binary);
  if (!in) throw Error(model_file + ": cannot open SentencePiece model");
  const std::string bytes((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  if (bytes.empty()) throw Error(model_file + ": SentencePiece model file is empty");
  return std::make_unique<SentencePieceTokenizer>(parse_model_proto(bytes, model_file), model_file);
}

}  // namespace kvevict
