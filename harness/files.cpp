#include "harness/files.h"

#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/errors.h"

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

}  // namespace kvevict
