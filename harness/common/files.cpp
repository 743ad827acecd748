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

}  // namespace kvevict
