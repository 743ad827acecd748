// tokenizer.json's added tokens and Split pre-tokenizer, reached directly: the input is
// FLAGS REGEX \0 ADDED_TOKENS \0 TEXT, spliced into a small byte-level BPE (the 256 byte
// tokens and four merges). FLAGS bit 0: a Sequence [Split REGEX, ByteLevel] pre-tokenizer
// (else ByteLevel alone); bit 1: the NFC normalizer. ADDED_TOKENS is the raw JSON of the
// "added_tokens" list (ids, contents, flags); TEXT is encoded and decoded again.
#include <algorithm>
#include <nlohmann/json.hpp>
#include <string>

#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "harness/tokenizers/tokenizer.h"

namespace {

std::string utf8(char32_t c) {
  std::string out;
  if (c < 0x80) {
    out += static_cast<char>(c);
  } else {
    out += static_cast<char>(0xC0 | (c >> 6));
    out += static_cast<char>(0x80 | (c & 0x3F));
  }
  return out;
}

// The model part of the file: GPT-2's byte stand-ins as ids 0..255, then four merges.
const std::string& model_json() {
  static const std::string text = [] {
    nlohmann::json vocab = nlohmann::json::object();
    char32_t next = 0x100;
    for (int b = 0; b < 256; ++b) {
      const bool printable = (b >= 0x21 && b <= 0x7E) || (b >= 0xA1 && b <= 0xAC) || b >= 0xAE;
      vocab[utf8(printable ? static_cast<char32_t>(b) : next++)] = b;
    }
    const std::string space = utf8(0x120);  // "Ġ"
    vocab[space + "t"] = 256;
    vocab["he"] = 257;
    vocab[space + "the"] = 258;
    vocab["aa"] = 259;
    nlohmann::json merges = {space + " t", "h e", space + "t he", "a a"};
    return nlohmann::json{{"type", "BPE"}, {"vocab", vocab}, {"merges", merges}}.dump();
  }();
  return text;
}

}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const uint8_t flags = data[0];
  const std::string rest(reinterpret_cast<const char*>(data + 1), size - 1);
  const size_t first = rest.find('\0');
  const size_t second = first == std::string::npos ? std::string::npos : rest.find('\0', first + 1);
  const std::string regex = rest.substr(0, first);
  const std::string added = first == std::string::npos ? "[]" : rest.substr(first + 1, second - first - 1);
  const std::string text = second == std::string::npos ? "Once upon a time <|x|> aaaa!" : rest.substr(second + 1);

  const nlohmann::json byte_level = {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", true}};
  nlohmann::json pre_tokenizer = byte_level;
  if (flags & 1)
    pre_tokenizer = {{"type", "Sequence"},
                     {"pretokenizers",
                      {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
                       byte_level}}};
  const nlohmann::json normalizer = (flags & 2) ? nlohmann::json{{"type", "NFC"}} : nlohmann::json();
  const auto dump = [](const nlohmann::json& j) { return j.dump(-1, ' ', false, nlohmann::json::error_handler_t::replace); };
  const std::string file = "{\"version\":\"1.0\",\"added_tokens\":" + added + ",\"normalizer\":" + dump(normalizer) +
                           ",\"pre_tokenizer\":" + dump(pre_tokenizer) +
                           ",\"decoder\":{\"type\":\"ByteLevel\"},\"model\":" + model_json() + "}";
  const std::string path =
      kvevict::fuzz::scratch_file("tokenizer.json", reinterpret_cast<const uint8_t*>(file.data()), file.size());
  try {
    auto tokenizer = kvevict::load_bpe_tokenizer_json(path);
    auto ids = tokenizer->encode(text);
    for (int id : ids)
      if (id < 0 || id >= tokenizer->vocab_size()) __builtin_trap();  // an id the tokenizer does not have
    tokenizer->decode(ids);
    tokenizer->decode({0, tokenizer->vocab_size() - 1, -1, tokenizer->vocab_size()});
  } catch (const kvevict::Error&) {
  }
  return 0;
}
