#include "harness/files.h"

#include <fstream>
#include <sstream>

#include "harness/errors.h"

namespace kvevict {

std::string read_text_file(const std::string& path) {
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
    throw Error(path + ": malformed JSON: " + e.what());
  }
}

}  // namespace kvevict
