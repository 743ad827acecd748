// Reading whole files, with errors that name the file.
#pragma once
#include <nlohmann/json.hpp>
#include <cstdint>
#include <exception>
#include <string>
#include <string_view>
#include <vector>

namespace kvevict {

// A JSON library error as a reader should see it: the message without the library's
// "[json.exception.parse_error.101] " tag.
std::string json_error_message(const std::exception& error);

// A JSON value that must be an integer in [low, high]. The JSON library converts numbers
// silently (2.5 becomes 2, 4294967338 becomes 42) and casting 1e45 is undefined behaviour
// (found by the fuzzers); kvevict::Error "WHERE: key \"KEY\" ..." otherwise.
long long json_int(const nlohmann::json& value, const std::string& where, const std::string& key, long long low,
                   long long high);

// A seed: every seed kvevict reads (CLI flags, sweep keys) is an unsigned 64-bit decimal
// integer, 0 .. 2^64 - 1, read strictly: a sign, a fraction, an exponent or a number
// past 2^64 - 1 is refused naming `name`, never wrapped or clamped (CLI11 read "-1" as
// 2^64 - 1 and "1e23" as 2^64 - 1).
std::uint64_t parse_seed(const std::string& text, const std::string& name);
// The same rule for a JSON value: "WHERE: key \"KEY\": ...".
std::uint64_t json_seed(const nlohmann::json& value, const std::string& where, const std::string& key);

// Removes `path` and everything under it, following no symbolic link; true when nothing of
// it is left (also when there was nothing). Not std::filesystem::remove_all: a PyTorch
// wheel's libtorch.so exports a copy of it (from the manylinux toolchain's static
// libstdc++ part) that the dynamic linker bound first and that called a null pointer
// (seen on PyTorch 2.11's wheel, at the end of every run that removed a folder).
bool remove_tree(const std::string& path);

// The file's bytes; kvevict::Error "PATH: cannot open file" when it cannot be read.
std::string read_text_file(const std::string& path);
// JSON text parsed strictly: a key given twice in one object is an error (the JSON library
// would keep the last one silently). Errors are one line naming `where` (a file, or
// file:line), never the library's own text: "WHERE: malformed JSON: ..." or
// "WHERE: key \"K\" appears twice in OBJECT" (OBJECT: "the top-level object" or a path
// such as model.vocab or added_tokens[3]).
nlohmann::json parse_json(std::string_view text, const std::string& where);
// The file parsed by parse_json.
nlohmann::json read_json_file(const std::string& path);
// Whitespace-separated token ids; errors name file:line.
std::vector<int> read_tokens_file(const std::string& path);

}  // namespace kvevict
