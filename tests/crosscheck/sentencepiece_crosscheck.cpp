// Cross-check of harness/sentencepiece_tokenizer.cpp against the real libsentencepiece.
//
// This is its own program because the two cannot share a process with LibTorch:
// libsentencepiece embeds protobuf-lite 3.14 and LibTorch loads libprotobuf 3.21. It
// links only the harness's tokenizer sources, the library and Catch2, and compares
// encode() ids and decode() text on real task data and hand-written edge cases, for
// every SentencePiece model in the data directory.
#include <sentencepiece_processor.h>
#include <unistd.h>

#include <algorithm>
#include "tests/catch.h"
#include <cstdint>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <functional>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <string>
#include <vector>

#include "harness/common/data_dir.h"
#include "harness/tokenizers/tokenizer.h"

namespace {

struct Corpus {
  std::string name;
  std::vector<std::string> texts;
};

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::stringstream contents;
  contents << in.rdbuf();
  return contents.str();
}

// The first `limit` records of a JSON-lines file (all of them when limit is 0).
std::vector<nlohmann::json> read_jsonl(const std::string& path, size_t limit = 0) {
  std::ifstream in(path);
  if (!in) throw std::runtime_error("cannot open " + path);
  std::vector<nlohmann::json> records;
  for (std::string line; std::getline(in, line) && (limit == 0 || records.size() < limit);)
    if (!line.empty()) records.push_back(nlohmann::json::parse(line));
  return records;
}

std::vector<std::string> split_lines(const std::string& text) {
  std::vector<std::string> lines;
  std::istringstream in(text);
  for (std::string line; std::getline(in, line);) lines.push_back(line);
  return lines;
}

std::string trim(const std::string& text) {
  const auto first = text.find_first_not_of(" \t\r\n");
  if (first == std::string::npos) return "";
  return text.substr(first, text.find_last_not_of(" \t\r\n") - first + 1);
}

// Rough sentence split: after . ! or ? followed by whitespace, and at line breaks.
std::vector<std::string> split_sentences(const std::string& text) {
  std::vector<std::string> sentences;
  std::string current;
  const auto flush = [&] {
    if (auto sentence = trim(current); !sentence.empty()) sentences.push_back(sentence);
    current.clear();
  };
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c == '\n') {
      flush();
      continue;
    }
    current += c;
    const bool next_is_space = i + 1 == text.size() || text[i + 1] == ' ' || text[i + 1] == '\n';
    if ((c == '.' || c == '!' || c == '?') && next_is_space) flush();
  }
  flush();
  return sentences;
}

std::vector<std::string> edge_cases() {
  std::vector<std::string> cases = {
      "",
      " ",
      "  ",
      "   ",
      "a",
      " a",
      "a ",
      " a ",
      "  a  b  ",
      "hello world",
      "Hello  world",
      "Hello   world   ",
      "   leading spaces",
      "trailing spaces   ",
      " because",
      "  because",
      "because ",
      " The",
      "The",
      "\t",
      "\tindented",
      "a\tb",
      "a \t b",
      "\n",
      "\n\n",
      "line one\nline two",
      "ends with newline\n",
      "\r\n",
      "windows\r\nline",
      " \n ",
      "1234567890",
      "3.14159",
      "2,000,000",
      "$100.00 and 50%",
      "1st 2nd 3rd 4th",
      "e.g., U.S.A.",
      "!!!???...",
      "(parentheses) [brackets] {braces}",
      "\"double\" 'single' `back`",
      "a-b_c/d\\e|f",
      "@#$%^&*~",
      "<s>",
      "</s>",
      "<unk>",
      "<pad>",
      "<0x41>",
      "café",
      "naïve résumé",
      "Ångström",
      "über straße",
      "e\xcc\x81",
      "Ελληνικά",
      "Русский текст",
      "עברית",
      "العربية",
      "हिन्दी",
      "ไทย",
      "日本語のテキストです。",
      "中文句子。",
      "한국어 문장",
      "混合 mixed テキスト",
      "emoji 😀",
      "👍🏽",
      "👨‍👩‍👧",
      "🇬🇧 flag",
      "\xe2\x96\x81",
      "\xe2\x96\x81\xe2\x96\x81x",
      "a\xe2\x96\x81"
      "b",
      "\xc2\xa0nbsp",
      "ideographic\xe3\x80\x80space",
      "zero\xe2\x80\x8bwidth",
      "\xef\xbf\xbd",
      // Malformed UTF-8: lone continuation, truncated sequences, overlong, surrogate, > U+10FFFF.
      "\xff",
      "a\xff"
      "b",
      "\x80",
      "\xc3",
      "\xc3(",
      "\xe2\x96",
      "\xf0\x9f\x98",
      "\xc0\xaf",
      "\xed\xa0\x80",
      "\xf4\x90\x80\x80",
      "\xe0\x80\x80",
      "\x01\x02\x1f\x7f",
      std::string("nul\0inside", 10),
      std::string("\0", 1),
      std::string(1000, 'a'),
      std::string(300, ' ') + "x",
      "x" + std::string(300, ' '),
      "Supercalifragilisticexpialidocious antidisestablishmentarianism",
      "Once upon a time, there was a little girl named Lily.",
  };
  return cases;
}

std::vector<Corpus> build_corpora() {
  using kvevict::data_path;
  std::vector<Corpus> corpora;

  const std::string stories = read_file(data_path("text/tinystories_sample.txt"));
  corpora.push_back({"tinystories: whole file", {stories}});
  corpora.push_back({"tinystories: lines", split_lines(stories)});
  corpora.push_back({"tinystories: sentences", split_sentences(stories)});

  Corpus xsum_whole{"xsum: document/summary whole", {}};
  Corpus xsum_sentences{"xsum: document/summary sentences", {}};
  for (const auto& record : read_jsonl(data_path("xsum/xsum_test_1000.jsonl"), 200)) {
    for (const char* field : {"document", "summary"}) {
      const std::string text = record.at(field).get<std::string>();
      xsum_whole.texts.push_back(text);
      for (auto& sentence : split_sentences(text)) xsum_sentences.texts.push_back(sentence);
    }
  }
  corpora.push_back(std::move(xsum_whole));
  corpora.push_back(std::move(xsum_sentences));

  Corpus piqa{"piqa: goal/sol1/sol2", {}};
  for (const auto& record : read_jsonl(data_path("piqa/valid.jsonl"), 300))
    for (const char* field : {"goal", "sol1", "sol2"})
      piqa.texts.push_back(record.at(field).get<std::string>());
  corpora.push_back(std::move(piqa));

  Corpus copa{"copa: premise/choices", {}};
  for (const auto& record : read_jsonl(data_path("copa/val.jsonl")))
    for (const char* field : {"premise", "choice1", "choice2"})
      copa.texts.push_back(record.at(field).get<std::string>());
  corpora.push_back(std::move(copa));

  corpora.push_back({"edge cases", edge_cases()});
  return corpora;
}

// Shows a string with control characters and non-ASCII bytes escaped.
std::string printable(const std::string& text) {
  std::string out;
  for (unsigned char c : text) {
    if (c >= 0x20 && c < 0x7f) {
      out += static_cast<char>(c);
    } else {
      char escaped[8];
      std::snprintf(escaped, sizeof escaped, "\\x%02x", c);
      out += escaped;
    }
  }
  return out.size() > 300 ? out.substr(0, 300) + "..." : out;
}

std::string join_ids(const std::vector<int>& ids) {
  std::string out;
  for (size_t i = 0; i < ids.size(); ++i) out += (i ? " " : "") + std::to_string(ids[i]);
  return out.size() > 300 ? out.substr(0, 300) + "..." : out;
}

// Compares both implementations on one model; every string must match exactly.
void crosscheck(const std::string& model_name, const std::string& model_file) {
  sentencepiece::SentencePieceProcessor reference;
  const auto status = reference.Load(model_file);
  INFO(status.ToString());
  REQUIRE(status.ok());
  const auto ours = kvevict::load_sentencepiece_tokenizer(model_file);
  REQUIRE(ours->vocab_size() == reference.GetPieceSize());

  std::vector<std::string> mismatches;
  size_t total_strings = 0, total_tokens = 0;
  std::cout << "\n" << model_name << " (" << model_file << ")\n";

  for (const auto& corpus : build_corpora()) {
    size_t encode_mismatches = 0, decode_mismatches = 0, tokens = 0;
    for (const auto& text : corpus.texts) {
      std::vector<int> expected_ids;
      REQUIRE(reference.Encode(text, &expected_ids).ok());
      const std::vector<int> ids = ours->encode(text);
      tokens += expected_ids.size();
      if (ids != expected_ids) {
        ++encode_mismatches;
        mismatches.push_back(corpus.name + " encode \"" + printable(text) + "\"\n    library: " +
                             join_ids(expected_ids) + "\n    ours:    " + join_ids(ids));
      }
      std::string expected_text;
      REQUIRE(reference.Decode(expected_ids, &expected_text).ok());
      const std::string decoded = ours->decode(expected_ids);
      if (decoded != expected_text) {
        ++decode_mismatches;
        mismatches.push_back(corpus.name + " decode of [" + join_ids(expected_ids) +
                             "]\n    library: \"" + printable(expected_text) +
                             "\"\n    ours:    \"" + printable(decoded) + "\"");
      }
    }
    std::printf("  %-36s %6zu strings %8zu tokens  %zu encode / %zu decode mismatches\n",
                corpus.name.c_str(), corpus.texts.size(), tokens, encode_mismatches,
                decode_mismatches);
    total_strings += corpus.texts.size();
    total_tokens += tokens;
  }

  // Decoding arbitrary id sequences exercises what encoding never produces: control
  // and unknown ids mid-text, stray byte pieces that form malformed UTF-8, pieces
  // starting with U+2581 right after BOS.
  std::mt19937 random(12345);
  const int vocab = reference.GetPieceSize();
  std::uniform_int_distribution<int> any_id(0, vocab - 1), special_or_byte_id(0, 258),
      length(0, 12);
  const int random_sequences = 3000;
  size_t random_mismatches = 0;
  for (int sequence = 0; sequence < random_sequences; ++sequence) {
    std::vector<int> ids(length(random));
    for (int& id : ids) id = (random() % 2) ? any_id(random) : special_or_byte_id(random);
    std::string expected_text;
    REQUIRE(reference.Decode(ids, &expected_text).ok());
    const std::string decoded = ours->decode(ids);
    if (decoded != expected_text) {
      ++random_mismatches;
      mismatches.push_back("random decode of [" + join_ids(ids) + "]\n    library: \"" +
                           printable(expected_text) + "\"\n    ours:    \"" + printable(decoded) +
                           "\"");
    }
  }
  std::printf("  %-36s %6d sequences             %zu decode mismatches\n", "random id sequences",
              random_sequences, random_mismatches);
  std::printf("  total: %zu strings, %zu tokens, %d random id sequences, %zu mismatches\n",
              total_strings, total_tokens, random_sequences, mismatches.size());

  for (size_t i = 0; i < mismatches.size() && i < 20; ++i)
    std::cout << "  MISMATCH " << mismatches[i] << "\n";
  CHECK(mismatches.empty());
}

// ---------------------------------------------------------------------------
// Model variants. The two real models never exercise some code paths (unused pieces,
// user-defined symbols, no byte fallback, other normaliser flags, score ties), so the
// tests below rewrite the LLaMA model's protobuf and compare on the variants too. The
// rewriting is a minimal wire-format editor written here, independent of the parser
// under test.

struct WireField {
  uint32_t number;
  int wire_type;        // 0 varint, 1 fixed64, 2 length-delimited, 5 fixed32
  uint64_t varint = 0;  // wire type 0
  std::string bytes;    // the payload of the other wire types
};
using WireMessage = std::vector<WireField>;

uint64_t read_varint(const std::string& data, size_t& position) {
  uint64_t value = 0;
  for (int shift = 0;; shift += 7) {
    const auto byte = static_cast<uint8_t>(data.at(position++));
    value |= static_cast<uint64_t>(byte & 0x7f) << shift;
    if (!(byte & 0x80)) return value;
  }
}

WireMessage parse_message(const std::string& data) {
  WireMessage message;
  for (size_t position = 0; position < data.size();) {
    const uint64_t tag = read_varint(data, position);
    WireField field{static_cast<uint32_t>(tag >> 3), static_cast<int>(tag & 7), 0, {}};
    if (field.wire_type == 0) {
      field.varint = read_varint(data, position);
    } else {
      const size_t size = field.wire_type == 1   ? 8
                          : field.wire_type == 5 ? 4
                                                 : read_varint(data, position);
      field.bytes = data.substr(position, size);
      position += size;
    }
    message.push_back(std::move(field));
  }
  return message;
}

void write_varint(uint64_t value, std::string& out) {
  do {
    out += static_cast<char>((value & 0x7f) | (value >= 0x80 ? 0x80 : 0));
    value >>= 7;
  } while (value);
}

std::string serialize(const WireMessage& message) {
  std::string out;
  for (const auto& field : message) {
    write_varint((static_cast<uint64_t>(field.number) << 3) | field.wire_type, out);
    if (field.wire_type == 0) {
      write_varint(field.varint, out);
    } else {
      if (field.wire_type == 2) write_varint(field.bytes.size(), out);
      out += field.bytes;
    }
  }
  return out;
}

// Sets (or adds) a varint field such as an enum or bool.
void set_varint(WireMessage& message, uint32_t number, uint64_t value) {
  for (auto& field : message)
    if (field.number == number) {
      field.varint = value;
      return;
    }
  message.push_back({number, 0, value, {}});
}

// Rewrites one sub-message (trainer_spec = 2, normalizer_spec = 3) of a ModelProto.
void edit_submessage(WireMessage& model, uint32_t number,
                     const std::function<void(WireMessage&)>& edit) {
  for (auto& field : model)
    if (field.number == number) {
      WireMessage submessage = parse_message(field.bytes);
      edit(submessage);
      field.bytes = serialize(submessage);
    }
}

struct PieceEdit {
  std::string text;
  float score;
  int type;  // 1 normal, 2 unknown, 3 control, 4 user-defined, 5 unused, 6 byte
};

// Lets `edit` change any piece's score or type.
void edit_pieces(WireMessage& model, const std::function<void(int id, PieceEdit&)>& edit) {
  int id = 0;
  for (auto& field : model) {
    if (field.number != 1) continue;
    WireMessage piece = parse_message(field.bytes);
    PieceEdit values{"", 0.0f, 1};
    for (const auto& part : piece) {
      if (part.number == 1) values.text = part.bytes;
      if (part.number == 2) std::memcpy(&values.score, part.bytes.data(), 4);
      if (part.number == 3) values.type = static_cast<int>(part.varint);
    }
    edit(id++, values);
    std::string score_bytes(4, '\0');
    std::memcpy(score_bytes.data(), &values.score, 4);
    field.bytes = serialize({{1, 2, 0, values.text},
                             {2, 5, 0, score_bytes},
                             {3, 0, static_cast<uint64_t>(values.type), {}}});
  }
}

struct Variant {
  std::string name;
  std::function<void(WireMessage&)> edit;
};

std::vector<Variant> llama_variants() {
  const auto normalizer_flags = [](int add_dummy_prefix, int remove_extra_whitespaces,
                                   int escape_whitespaces) {
    return [=](WireMessage& model) {
      edit_submessage(model, 3, [&](WireMessage& spec) {
        set_varint(spec, 3, add_dummy_prefix);
        set_varint(spec, 4, remove_extra_whitespaces);
        set_varint(spec, 5, escape_whitespaces);
      });
    };
  };
  return {
      {"remove_extra_whitespaces", normalizer_flags(1, 1, 1)},
      {"no add_dummy_prefix", normalizer_flags(0, 0, 1)},
      {"no add_dummy_prefix, remove_extra_whitespaces", normalizer_flags(0, 1, 1)},
      {"no escape_whitespaces", normalizer_flags(1, 1, 0)},
      {"no byte_fallback (byte pieces made control)",
       [](WireMessage& model) {
         edit_submessage(model, 2, [](WireMessage& spec) { set_varint(spec, 35, 0); });
         edit_pieces(model, [](int, PieceEdit& piece) {
           if (piece.type == 6) piece.type = 3;
         });
       }},
      {"every 5th multi-character piece unused",
       [](WireMessage& model) {
         edit_pieces(model, [](int id, PieceEdit& piece) {
           if (piece.type == 1 && piece.text.size() > 3 && id % 5 == 0) piece.type = 5;
         });
       }},
      {"user-defined symbols",
       [](WireMessage& model) {
         const std::vector<std::string> symbols = {"\xe2\x96\x81the",
                                                   "\xe2\x96\x81"
                                                   "a",
                                                   "\xe2\x96\x81"
                                                   "an",
                                                   "\xe2\x96\x81"
                                                   "and",
                                                   "ing",
                                                   "ould",
                                                   ".",
                                                   "1",
                                                   "<",
                                                   "The"};
         edit_pieces(model, [&](int, PieceEdit& piece) {
           if (std::find(symbols.begin(), symbols.end(), piece.text) != symbols.end())
             piece.type = 4;
         });
       }},
      {"all scores equal (ties go leftmost)",
       [](WireMessage& model) {
         edit_pieces(model, [](int, PieceEdit& piece) { piece.score = 0.0f; });
       }},
      {"scores in blocks of 100 (partial ties)",
       [](WireMessage& model) {
         edit_pieces(model, [](int id, PieceEdit& piece) {
           piece.score = static_cast<float>(-(id / 100));
         });
       }},
  };
}

std::string write_variant(const std::string& base_model, const Variant& variant, int index) {
  WireMessage model = parse_message(read_file(base_model));
  variant.edit(model);
  const auto path = std::filesystem::temp_directory_path() /
                    ("kvevict_spm_variant_" + std::to_string(::getpid()) + "_" +
                     std::to_string(index) + ".model");
  std::ofstream(path, std::ios::binary) << serialize(model);
  return path.string();
}

}  // namespace

TEST_CASE("stories260K tokenizer matches libsentencepiece", "[sentencepiece][crosscheck]") {
  crosscheck("stories260K", kvevict::data_path("models/stories260K-hf/tokenizer.model"));
}

TEST_CASE("LLaMA tokenizer matches libsentencepiece", "[sentencepiece][crosscheck]") {
  crosscheck("LLaMA", kvevict::data_path("tokenizers/llama/tokenizer.model"));
}

TEST_CASE("LLaMA model variants match libsentencepiece", "[sentencepiece][crosscheck]") {
  const std::string llama = kvevict::data_path("tokenizers/llama/tokenizer.model");
  const auto variants = llama_variants();
  for (size_t i = 0; i < variants.size(); ++i) {
    SECTION(variants[i].name) {
      const std::string file = write_variant(llama, variants[i], static_cast<int>(i));
      crosscheck("LLaMA variant: " + variants[i].name, file);
      std::filesystem::remove(file);
    }
  }
}
