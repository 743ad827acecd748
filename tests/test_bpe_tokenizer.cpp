// Byte-level BPE against Hugging Face tokenizers' own output (golden/bpe_*.jsonl, see
// golden/README.md "BPE goldens"), plus the loaders' errors for bad files.
#include "tests/catch.h"
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <string>
#include <vector>

#include "harness/common/errors.h"
#include "harness/tokenizers/tokenizer.h"
#include "tests/test_support.h"

namespace {

using kvevict::Tokenizer;
using kvevict::test::data;

const Tokenizer& gpt2() {
  static const auto tokenizer = kvevict::load_bpe_vocab_merges(data("tokenizers/gpt2/vocab.json"),
                                                               data("tokenizers/gpt2/merges.txt"));
  return *tokenizer;
}

const Tokenizer& gpt_neox() {
  static const auto tokenizer =
      kvevict::load_bpe_tokenizer_json(data("tokenizers/gpt-neox-20b/tokenizer.json"));
  return *tokenizer;
}

const Tokenizer& llama3() {
  static const auto tokenizer = kvevict::load_bpe_tokenizer_json(data("tokenizers/llama3/tokenizer.json"));
  return *tokenizer;
}

const Tokenizer& qwen3() {
  static const auto tokenizer = kvevict::load_bpe_tokenizer_json(data("tokenizers/qwen3/tokenizer.json"));
  return *tokenizer;
}

struct GoldenLine {
  int line_number;
  std::string text;
  std::vector<int> ids;
  bool has_note;  // the text contains special-token text such as <|endoftext|>
};

std::vector<GoldenLine> read_golden(const std::string& file) {
  std::ifstream in(data("golden/" + file));
  REQUIRE(in);
  std::vector<GoldenLine> lines;
  std::string line;
  for (int number = 1; std::getline(in, line); ++number) {
    if (line.empty()) continue;
    const auto object = nlohmann::json::parse(line);
    lines.push_back({number, object.at("text").get<std::string>(),
                     object.at("ids").get<std::vector<int>>(), object.contains("note")});
  }
  return lines;
}

// Checks every golden line: encode gives exactly the ids, decode gives back the text
// (or `decoded_differently[text]` for the texts the tokenizer normalises).
void check_golden(const Tokenizer& tokenizer, const std::string& file,
                  const std::map<std::string, std::string>& decoded_differently = {},
                  size_t expected_lines = 333, int expected_notes = 5) {
  const std::vector<GoldenLine> lines = read_golden(file);
  REQUIRE(lines.size() == expected_lines);
  int encoded_exactly = 0, decoded_back = 0, with_note = 0;
  for (const GoldenLine& golden : lines) {
    INFO(file << " line " << golden.line_number);
    const std::vector<int> ids = tokenizer.encode(golden.text);
    CHECK(ids == golden.ids);
    encoded_exactly += ids == golden.ids;
    with_note += golden.has_note;

    const auto normalised = decoded_differently.find(golden.text);
    const std::string& expected =
        normalised == decoded_differently.end() ? golden.text : normalised->second;
    const std::string decoded = tokenizer.decode(golden.ids);
    CHECK(decoded == expected);
    decoded_back += decoded == expected;
  }
  CHECK(with_note == expected_notes);
  CHECK(encoded_exactly == static_cast<int>(expected_lines));
  CHECK(decoded_back == static_cast<int>(expected_lines));
}

void write_file(const std::string& path, const std::string& content) {
  std::ofstream out(path, std::ios::binary);
  out << content;
}

bool is_one_line(const std::string& message) { return message.find('\n') == std::string::npos; }

}  // namespace

TEST_CASE("GPT-2 BPE matches HF tokenizers on all 333 golden strings", "[bpe]") {
  check_golden(gpt2(), "bpe_gpt2.jsonl");
  CHECK(gpt2().vocab_size() == 50257);
}

TEST_CASE("GPT-NeoX BPE matches HF tokenizers on all 333 golden strings", "[bpe]") {
  // NeoX normalises to NFC, so these two texts decode to their composed forms, written
  // out here rather than computed with the code under test.
  const std::map<std::string, std::string> nfc_of_text = {
      {"cafe\xCC\x81", "caf\xC3\xA9"},                           // e + U+0301 -> U+00E9
      {"\xE2\x84\xABngstr\xC3\xB6m", "\xC3\x85ngstr\xC3\xB6m"},  // U+212B -> U+00C5
  };
  check_golden(gpt_neox(), "bpe_gpt_neox.jsonl", nfc_of_text);
  CHECK(gpt_neox().vocab_size() == 50277);  // 50254 model tokens + 23 runs of spaces
}

TEST_CASE("Llama-3 BPE (Split regex, ignore_merges) matches HF tokenizers on all 351 golden strings", "[bpe]") {
  check_golden(llama3(), "bpe_llama3.jsonl", {}, 351, 0);
  CHECK(llama3().vocab_size() == 128256);
}

TEST_CASE("Qwen3 BPE (NFC, Split regex) matches HF tokenizers on all 351 golden strings", "[bpe]") {
  // Qwen3 normalises to NFC, so these texts decode to their composed forms, written out.
  const std::map<std::string, std::string> nfc_of_text = {
      {"cafe\xCC\x81", "caf\xC3\xA9"},
      {"\xE2\x84\xABngstr\xC3\xB6m", "\xC3\x85ngstr\xC3\xB6m"},
      {"caf\xC3\xA9 vs cafe\xCC\x81", "caf\xC3\xA9 vs caf\xC3\xA9"},
  };
  check_golden(qwen3(), "bpe_qwen3.jsonl", nfc_of_text, 351, 0);
}

TEST_CASE("Llama-3 and Qwen split as their regexes say", "[bpe]") {
  // Digits: Llama-3 groups up to three, Qwen splits one by one.
  CHECK(llama3().encode("1234567").size() == 3);
  CHECK(qwen3().encode("1234567").size() == 7);
  // Contractions are case-insensitive ((?i:...)): "'S" is one piece like "'s".
  CHECK(llama3().encode("IT'S").size() == llama3().encode("IT").size() + 1);
  // \s means White_Space (U+0085 and U+000B included), as Oniguruma's Unicode \s.
  CHECK(llama3().decode(llama3().encode("a\xC2\x85\x0B b")) == "a\xC2\x85\x0B b");
  // Invalid UTF-8 keeps its bytes through the ICU split.
  CHECK(qwen3().decode(qwen3().encode("a\xE2\x82 b")) == "a\xEF\xBF\xBD b");
}

TEST_CASE("BOS comes from tokenizer_config.json: Llama-3 <|begin_of_text|>, Qwen none", "[bpe]") {
  CHECK(llama3().declared_bos() == std::optional<int>(128000));
  CHECK(qwen3().declared_bos() == std::optional<int>(-1));
  CHECK_FALSE(gpt_neox().declared_bos().has_value());  // no tokenizer_config.json there
  // Without add_bos_token the tokenizer class's default decides: GPT-NeoX's adds none.
  const std::string dir = kvevict::test::temp_dir("bpe_bos_config");
  std::filesystem::create_symlink(std::filesystem::absolute(data("tokenizers/gpt-neox-20b/tokenizer.json")),
                                  dir + "/tokenizer.json");
  write_file(dir + "/tokenizer_config.json",
             R"({"tokenizer_class": "GPTNeoXTokenizer", "bos_token": "<|endoftext|>"})");
  CHECK(kvevict::load_bpe_tokenizer_json(dir + "/tokenizer.json")->declared_bos() == std::optional<int>(-1));
  write_file(dir + "/tokenizer_config.json",
             R"({"tokenizer_class": "GPTNeoXTokenizer", "bos_token": "<|endoftext|>", "add_bos_token": true})");
  CHECK(kvevict::load_bpe_tokenizer_json(dir + "/tokenizer.json")->declared_bos() == std::optional<int>(0));
}

TEST_CASE("GPT-NeoX applies NFC before BPE", "[bpe]") {
  const Tokenizer& neox = gpt_neox();
  // Canonical reordering: dot below (class 220) sorts before circumflex (230) and both
  // compose with the base into U+1EAD.
  CHECK(neox.encode("a\xCC\xA3\xCC\x82") == neox.encode("\xE1\xBA\xAD"));
  CHECK(neox.encode("a\xCC\x82\xCC\xA3") == neox.encode("\xE1\xBA\xAD"));
  // Hangul jamo compose arithmetically: U+1100 U+1161 U+11A8 -> U+AC01.
  CHECK(neox.encode("\xE1\x84\x80\xE1\x85\xA1\xE1\x86\xA8") == neox.encode("\xEA\xB0\x81"));
  // Kana voicing mark: U+304B U+3099 -> U+304C.
  CHECK(neox.encode("\xE3\x81\x8B\xE3\x82\x99") == neox.encode("\xE3\x81\x8C"));
  // GPT-2 has no normaliser.
  CHECK(gpt2().encode("cafe\xCC\x81") != gpt2().encode("caf\xC3\xA9"));
}

TEST_CASE("BPE keeps invalid UTF-8 bytes and decodes them to U+FFFD as HF does", "[bpe]") {
  // Bytes reach their byte tokens; decode replaces each maximal invalid subpart (here
  // the truncated E2 82 and the lone FF) with one U+FFFD. NeoX has no token for FF, a
  // byte that never occurs in UTF-8, so it drops it as HF drops unknown characters.
  const std::string text = "a\xE2\x82 b\xFF";
  CHECK(gpt2().decode(gpt2().encode(text)) == "a\xEF\xBF\xBD b\xEF\xBF\xBD");
  CHECK(gpt_neox().decode(gpt_neox().encode(text)) == "a\xEF\xBF\xBD b");
}

TEST_CASE("merges.txt may start with a #version header", "[bpe]") {
  const std::string dir = kvevict::test::temp_dir("bpe_version_header");
  const std::string merges = dir + "/merges.txt";
  write_file(merges,
             "#version: 0.2\n" + kvevict::test::read_text(data("tokenizers/gpt2/merges.txt")));
  const auto with_header =
      kvevict::load_bpe_vocab_merges(data("tokenizers/gpt2/vocab.json"), merges);
  const std::string text = "Hello world, it's 2024 <|endoftext|> caf\xC3\xA9!";
  CHECK(with_header->encode(text) == gpt2().encode(text));
}

TEST_CASE("tokenizer.json that is not byte-level BPE is rejected", "[bpe]") {
  const std::string dir = kvevict::test::temp_dir("bpe_bad_tokenizer_json");
  const std::string path = dir + "/tokenizer.json";

  write_file(path, R"({"model": {"type": "WordPiece", "vocab": {"a": 0}},
                      "pre_tokenizer": {"type": "ByteLevel", "add_prefix_space": false}})");
  CHECK_THROWS_AS(kvevict::load_bpe_tokenizer_json(path), kvevict::Error);
  CHECK_THROWS_WITH(kvevict::load_bpe_tokenizer_json(path),
                    Catch::Contains(path) && Catch::Contains("WordPiece") &&
                        Catch::Predicate<std::string>(is_one_line, "is one line"));

  write_file(path, R"({"model": {"type": "BPE", "vocab": {"a": 0}, "merges": []},
                      "pre_tokenizer": {"type": "Metaspace", "replacement": "_"}})");
  CHECK_THROWS_AS(kvevict::load_bpe_tokenizer_json(path), kvevict::Error);
  CHECK_THROWS_WITH(kvevict::load_bpe_tokenizer_json(path),
                    Catch::Contains(path) && Catch::Contains("Metaspace") &&
                        Catch::Predicate<std::string>(is_one_line, "is one line"));
}

TEST_CASE("a merges.txt line that is not two tokens is rejected with file:line", "[bpe]") {
  const std::string dir = kvevict::test::temp_dir("bpe_bad_merges");
  const std::string vocab = dir + "/vocab.json", merges = dir + "/merges.txt";
  write_file(vocab, R"({"a": 0, "b": 1, "ab": 2})");
  write_file(merges, "#version: 0.2\na b\na b c\n");
  CHECK_THROWS_AS(kvevict::load_bpe_vocab_merges(vocab, merges), kvevict::Error);
  CHECK_THROWS_WITH(
      kvevict::load_bpe_vocab_merges(vocab, merges),
      Catch::Contains(merges + ":3") && Catch::Predicate<std::string>(is_one_line, "is one line"));
}

TEST_CASE("a vocab.json that is not a JSON object is rejected", "[bpe]") {
  const std::string dir = kvevict::test::temp_dir("bpe_bad_vocab");
  const std::string vocab = dir + "/vocab.json", merges = dir + "/merges.txt";
  write_file(vocab, R"(["a", "b"])");
  write_file(merges, "a b\n");
  CHECK_THROWS_AS(kvevict::load_bpe_vocab_merges(vocab, merges), kvevict::Error);
  CHECK_THROWS_WITH(kvevict::load_bpe_vocab_merges(vocab, merges),
                    Catch::Contains(vocab) && Catch::Contains("JSON object") &&
                        Catch::Predicate<std::string>(is_one_line, "is one line"));
}

namespace {

// The GPT-NeoX tokenizer.json, changed by `mutate`, written to a file of its own.
std::string neox_variant(const std::string& name, const std::function<void(nlohmann::json&)>& mutate) {
  static const nlohmann::json neox = kvevict::test::read_json(data("tokenizers/gpt-neox-20b/tokenizer.json"));
  nlohmann::json tokenizer = neox;
  mutate(tokenizer);
  const std::string path = kvevict::test::temp_dir("bpe_" + name) + "/tokenizer.json";
  write_file(path, tokenizer.dump());
  return path;
}

std::string load_error(const std::string& path) {
  try {
    kvevict::load_bpe_tokenizer_json(path)->encode(std::string(40, 'a') + "!");
  } catch (const kvevict::Error& e) {
    CHECK(is_one_line(e.what()));
    return e.what();
  }
  return "";
}

nlohmann::json split_then_byte_level(const std::string& regex) {
  return {{"type", "Sequence"},
          {"pretokenizers",
           {{{"type", "Split"}, {"pattern", {{"Regex", regex}}}, {"behavior", "Isolated"}, {"invert", false}},
            {{"type", "ByteLevel"}, {"add_prefix_space", false}, {"use_regex", false}}}}};
}

}  // namespace

TEST_CASE("a Split regex that backtracks without bound stops at its limit with the file's name", "[bpe][errors]") {
  const std::string path =
      neox_variant("catastrophic", [](nlohmann::json& t) { t["pre_tokenizer"] = split_then_byte_level("(a+)+$|(\\s*)*x"); });
  CHECK_THAT(load_error(path), Catch::Contains(path + ": pre_tokenizer Split: the regex ran past its limit") &&
                                   Catch::Contains("41 UTF-16 units"));
  const std::string empty =
      neox_variant("empty_regex", [](nlohmann::json& t) { t["pre_tokenizer"] = split_then_byte_level(""); });
  CHECK_THAT(load_error(empty), Catch::Contains(empty + ": pre_tokenizer Split: pattern.Regex is empty"));
}

TEST_CASE("the Llama-3 and Qwen3 regexes stay far inside the limit on long texts", "[bpe]") {
  // The limit is 100 ticks plus one per 20 UTF-16 units; these patterns use about one
  // per 1,000 on their worst text measured (runs of digits, mixed punctuation).
  const std::string mixed = "a1! \n\t's X\xc3\xa9 12345 ...  \xe4\xbd\xa0\xe5\xa5\xbd\r\n";
  std::string long_mixed;
  while (long_mixed.size() < 300000) long_mixed += mixed;
  for (const Tokenizer* tokenizer : {&llama3(), &qwen3()}) {
    for (const std::string& text : {std::string(300000, '7'), std::string(300000, ' '), std::string(300000, '\n'),
                                    std::string(300000, '!'), long_mixed}) {
      CHECK_FALSE(tokenizer->encode(text).empty());
    }
  }
}

TEST_CASE("token ids are checked as Hugging Face's tokenizers assigns them", "[bpe][errors]") {
  // HF keeps a vocabulary token's id for an added token of the same content and numbers
  // the other added tokens after the vocabulary (50254 tokens here, so from 50254 up).
  struct Bad {
    std::string name;
    std::function<void(nlohmann::json&)> mutate;
    std::string named;
  };
  const std::vector<Bad> cases = {
      {"id_2_31", [](nlohmann::json& t) { t["added_tokens"][2]["id"] = 2147483648LL; },
       "added_tokens[2] \"                        \": \"id\" must be an integer in [0, 2147483646], not 2147483648"},
      {"id_negative", [](nlohmann::json& t) { t["added_tokens"][2]["id"] = -1; }, "not -1"},
      {"id_string", [](nlohmann::json& t) { t["added_tokens"][2]["id"] = "50254"; }, "not \"50254\""},
      {"id_past", [](nlohmann::json& t) { t["added_tokens"][2]["id"] = 60000; },
       "has id 60000, outside [0, 50277): the file holds 50254 vocabulary tokens and 23 added ones"},
      {"vocab_id_differs", [](nlohmann::json& t) { t["added_tokens"][0]["id"] = 5; },
       "added_tokens[0] \"<|endoftext|>\" has id 5, but the vocabulary gives it id 0"},
      {"vocab_id_float", [](nlohmann::json& t) { t["model"]["vocab"]["!"] = 2.0; }, "token \"!\" has id 2.0"},
      {"missing_id", [](nlohmann::json& t) { t["added_tokens"][2].erase("id"); }, "not missing"},
      {"added_not_list", [](nlohmann::json& t) { t["added_tokens"] = {{"a", 1}}; }, "added_tokens must be a list"},
  };
  for (const Bad& bad : cases) {
    INFO(bad.name);
    const std::string path = neox_variant(bad.name, bad.mutate);
    CHECK_THAT(load_error(path), Catch::Contains(path + ": ") && Catch::Contains(bad.named));
  }
  // The real files pass: NeoX's two special tokens in its vocabulary, Llama-3's and
  // Qwen3's added tokens numbered after theirs.
  CHECK(gpt_neox().vocab_size() == 50277);
  CHECK(llama3().vocab_size() == 128256);
  CHECK(qwen3().vocab_size() == 151669);
}
