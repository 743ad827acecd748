#include "harness/common/files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/common/errors.h"

namespace kvevict {

std::string json_error_message(const std::exception& error) {
  std::string message = error.what();
  if (message.rfind("[json.exception.", 0) == 0) {
    const size_t end = message.find("] ");
    if (end != std::string::npos) message.erase(0, end + 2);
  }
  return message;
}

std::string read_text_file(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw Error(path + ": is a folder, not a file");
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open file");
  std::stringstream bytes;
  bytes << in.rdbuf();
  return bytes.str();
}

nlohmann::json read_json_file(const std::string& path) {
  const std::string text = read_text_file(path);
  try {
    return nlohmann::json::parse(text);
  } catch (const nlohmann::json::exception& e) {
    throw Error(path + ": malformed JSON: " + json_error_message(e));
  }
}

std::vector<int> read_tokens_file(const std::string& path) {
  if (std::filesystem::is_directory(path)) throw Error(path + ": is a folder, not a file");
  std::ifstream in(path);
  if (!in) throw Error(path + ": cannot open file");
  std::vector<int> ids;
  std::string line;
  for (int line_no = 1; std::getline(in, line); ++line_no) {
    std::istringstream words(line);
    std::string word;
    while (words >> word) {
      try {
        size_t used = 0;
        int id = std::stoi(word, &used);
        if (used != word.size() || id < 0) throw std::invalid_argument(word);
        ids.push_back(id);
      } catch (const std::exception&) {
        throw Error(path + ":" + std::to_string(line_no) + ": \"" + word + "\" is not a token id");
      }
    }
  }
  return ids;
}


long long json_int(const nlohmann::json& v, const std::string& where, const std::string& key, long long low,
                   long long high) {
  if (!v.is_number_integer())
    throw Error(where + ": key \"" + key + "\" has the wrong type (an integer is needed, not " + v.dump() + ")");
  // Non-negative integers are stored unsigned and may exceed long long.
  const bool fits = v.is_number_unsigned()
                        ? high >= 0 && v.get<unsigned long long>() <= static_cast<unsigned long long>(high) &&
                              (low <= 0 || v.get<unsigned long long>() >= static_cast<unsigned long long>(low))
                        : v.get<long long>() >= low && v.get<long long>() <= high;
  if (!fits)
    throw Error(where + ": key \"" + key + "\": " + v.dump() + " is outside [" + std::to_string(low) + ", " +
                std::to_string(high) + "]");
  return v.get<long long>();
}

}  // namespace kvevict
