// Reading whole files, with errors that name the file.
#pragma once
#include <nlohmann/json.hpp>
#include <exception>
#include <string>
#include <vector>

namespace kvevict {

// A JSON library error as a reader should see it: the message without the library's
// "[json.exception.parse_error.101] " tag.
std::string json_error_message(const std::exception& error);

// The file's bytes; kvevict::Error "PATH: cannot open file" when it cannot be read.
std::string read_text_file(const std::string& path);
// The file parsed as JSON; kvevict::Error "PATH: malformed JSON: ..." when it is not.
nlohmann::json read_json_file(const std::string& path);
// Whitespace-separated token ids; errors name file:line.
std::vector<int> read_tokens_file(const std::string& path);

}  // namespace kvevict
