// The from-scratch SentencePiece tokenizer (harness/sentencepiece_tokenizer.cpp): the
// stories260K golden tokens, decode round trips, a hand-built model whose ids can be
// worked out by hand, and errors for bad or unsupported model files. The comparison
// with the real libsentencepiece lives in tests/crosscheck/ because that library cannot
// be loaded next to LibTorch.
#include "tests/catch.h"
#include <cstdint>
#include <cstring>
#include <fstream>
#include <string>
#include <vector>

#include "harness/common/errors.h"
#include "harness/tokenizers/tokenizer.h"
#include "tests/test_support.h"

namespace {

using kvevict::test::data;

const kvevict::Tokenizer& stories260k() {
  static const auto tokenizer =
      kvevict::load_sentencepiece_tokenizer(data("models/stories260K-hf/tokenizer.model"));
  return *tokenizer;
}

const kvevict::Tokenizer& llama() {
  static const auto tokenizer =
      kvevict::load_sentencepiece_tokenizer(data("tokenizers/llama/tokenizer.model"));
  return *tokenizer;
}

void write_file(const std::string& path, const std::string& bytes) {
  std::ofstream(path, std::ios::binary) << bytes;
}

// --- A tiny protobuf writer for hand-built ModelProto files. ---

std::string varint(uint64_t value) {
  std::string out;
  do {
    out += static_cast<char>((value & 0x7f) | (value >= 0x80 ? 0x80 : 0));
    value >>= 7;
  } while (value);
  return out;
}
std::string varint_field(int number, uint64_t value) {
  return varint(uint64_t(number) << 3) + varint(value);
}
std::string bytes_field(int number, const std::string& payload) {
  return varint((uint64_t(number) << 3) | 2) + varint(payload.size()) + payload;
}
std::string float_field(int number, float value) {
  std::string bits(4, '\0');
  std::memcpy(bits.data(), &value, 4);
  return varint((uint64_t(number) << 3) | 5) + bits;
}
std::string piece(const std::string& text, float score, int type) {
  return bytes_field(1, bytes_field(1, text) + float_field(2, score) + varint_field(3, type));
}

const std::string kSpace = "\xe2\x96\x81";  // U+2581, SentencePiece's space

struct TinyModelOptions {
  int model_type = 2;  // BPE
  std::string precompiled_charsmap;
};

// Pieces: 0 <unk>, 1 <s>, 2 </s>, 3 "▁", 4 "a", 5 "b", 6 "ab" (-0.5), 7 "▁ab" (-0.25); no
// byte fallback. Unknown fields of every wire type are sprinkled in: they must be skipped.
std::string tiny_model(const TinyModelOptions& options = {}) {
  const std::string unknown_fields = varint_field(99, 12345) + varint((100 << 3) | 1) +
                                     std::string(8, 'x') + varint((101 << 3) | 5) +
                                     std::string(4, 'y') + bytes_field(102, "zzz");
  std::string trainer_spec =
      varint_field(3, options.model_type) + unknown_fields + varint_field(35, 0);
  std::string normalizer_spec =
      bytes_field(1, options.precompiled_charsmap.empty() ? "identity" : "nmt_nfkc") +
      varint_field(3, 1) + varint_field(4, 0);
  if (!options.precompiled_charsmap.empty())
    normalizer_spec += bytes_field(2, options.precompiled_charsmap);
  return piece("<unk>", 0, 2) + piece("<s>", 0, 3) + piece("</s>", 0, 3) + piece(kSpace, -1, 1) +
         piece("a", -2, 1) + piece("b", -3, 1) + piece("ab", -0.5f, 1) +
         piece(kSpace + "ab", -0.25f, 1) + unknown_fields + bytes_field(2, trainer_spec) +
         bytes_field(3, normalizer_spec);
}

std::string write_tiny_model(const std::string& name, const TinyModelOptions& options = {}) {
  const std::string path = kvevict::test::temp_dir("sentencepiece_" + name) + "/tokenizer.model";
  write_file(path, tiny_model(options));
  return path;
}

}  // namespace

TEST_CASE("SentencePiece reproduces the stories260K golden tokens", "[sentencepiece]") {
  const auto golden = kvevict::test::read_json(data("golden/stories260K_tinystories_T200.json"));
  REQUIRE(golden.at("model") == "stories260K-hf");
  const auto expected = golden.at("tokens").get<std::vector<int>>();

  std::vector<int> tokens = {1};  // BOS
  const auto text_ids =
      stories260k().encode(kvevict::test::read_text(data(golden.at("text_file"))));
  tokens.insert(tokens.end(), text_ids.begin(), text_ids.end());
  REQUIRE(tokens.size() >= expected.size());
  tokens.resize(expected.size());
  CHECK(tokens == expected);
  CHECK(stories260k().vocab_size() == 512);
}

TEST_CASE("SentencePiece decode inverts encode", "[sentencepiece]") {
  const std::vector<std::string> texts = {
      "Once upon a time, there was a little girl named Lily.",
      "Hello  world, with  double spaces and a trailing space ",
      " because it starts with a space",
      "tabs\tand\nnewlines\n",
      "digits 1234567890 and punctuation: !?.,;'\"()",
      "accents café naïve, CJK 日本語, emoji 😀👍🏽",
  };
  for (const auto* tokenizer : {&stories260k(), &llama()}) {
    for (const auto& text : texts) {
      INFO(text);
      const auto ids = tokenizer->encode(text);
      CHECK(tokenizer->decode(ids) == text);
      // BOS and EOS decode to nothing.
      std::vector<int> with_specials = {1};
      with_specials.insert(with_specials.end(), ids.begin(), ids.end());
      with_specials.push_back(2);
      CHECK(tokenizer->decode(with_specials) == text);
    }
  }
  CHECK(stories260k().encode("").empty());
  CHECK(stories260k().decode({}).empty());
  // Byte fallback: a newline is not a piece, so it is spelled as the byte piece <0x0A>.
  CHECK(stories260k().encode("\n") == std::vector<int>{410, 13});  // "▁", <0x0A>
}

TEST_CASE("SentencePiece BPE on a hand-built model", "[sentencepiece]") {
  const auto tokenizer = kvevict::load_sentencepiece_tokenizer(write_tiny_model("tiny"));
  CHECK(tokenizer->vocab_size() == 8);
  // "▁ab▁ab": a+b merge first (-0.5 beats nothing else), then ▁+ab (-0.25) on the left
  // before the right-hand a+b (-0.5), and so on.
  CHECK(tokenizer->encode("ab ab") == std::vector<int>{7, 7});
  CHECK(tokenizer->encode("ba") == std::vector<int>{3, 5, 4});
  // No byte fallback: an unknown character becomes <unk>, and a run of them one <unk>.
  CHECK(tokenizer->encode("abc") == std::vector<int>{7, 0});
  CHECK(tokenizer->encode("cc") == std::vector<int>{3, 0});
  CHECK(tokenizer->decode({1, 7, 7, 2}) == "ab ab");
  CHECK(tokenizer->decode({7, 0}) == "ab \xe2\x81\x87 ");  // <unk> shows as " ⁇ "
  CHECK(tokenizer->decode({3, 3, 4}) == " a");             // only the first ▁ is the dummy prefix
  CHECK_THROWS_AS(tokenizer->decode({8}), kvevict::Error);
}

TEST_CASE("SentencePiece rejects truncated and unsupported model files", "[sentencepiece]") {
  const std::string model = kvevict::test::read_text(data("models/stories260K-hf/tokenizer.model"));
  const std::string path = kvevict::test::temp_dir("sentencepiece_truncated") + "/tokenizer.model";
  for (size_t length : {size_t(1), size_t(2), size_t(100), model.size() / 2, model.size() - 1}) {
    INFO("truncated to " << length << " of " << model.size() << " bytes");
    write_file(path, model.substr(0, length));
    CHECK_THROWS_AS(kvevict::load_sentencepiece_tokenizer(path), kvevict::Error);
    CHECK_THROWS_WITH(kvevict::load_sentencepiece_tokenizer(path), Catch::Contains(path));
  }
  write_file(path, "");
  CHECK_THROWS_WITH(kvevict::load_sentencepiece_tokenizer(path), Catch::Contains(path));
  CHECK_THROWS_WITH(kvevict::load_sentencepiece_tokenizer(path + ".missing"),
                    Catch::Contains(path + ".missing"));

  const std::string unigram = write_tiny_model("unigram", {1, ""});
  CHECK_THROWS_WITH(
      kvevict::load_sentencepiece_tokenizer(unigram),
      Catch::Contains(unigram) && Catch::Contains("unigram") && Catch::Contains("not supported"));
  const std::string nfkc = write_tiny_model("nfkc", {2, std::string("\x04\x00\x00\x00 trie", 9)});
  CHECK_THROWS_WITH(
      kvevict::load_sentencepiece_tokenizer(nfkc),
      Catch::Contains(nfkc) && Catch::Contains("charsmap") && Catch::Contains("not supported"));
}
