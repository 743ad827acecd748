#include "harness/common/data_dir.h"

#include <cstdlib>
#include <filesystem>

namespace kvevict {

std::string data_dir(const std::string& override_dir) {
  if (!override_dir.empty()) return override_dir;
  if (const char* env = std::getenv("KVEVICT_DATA"); env && *env) return env;
  // KVEVICT_SOURCE_DIR is the repository root baked in at build time; the data sits
  // beside the checkout.
  return (std::filesystem::path(KVEVICT_SOURCE_DIR) / ".." / "shared" / "data")
      .lexically_normal()
      .string();
}

std::string data_path(const std::string& relative, const std::string& override_dir) {
  return (std::filesystem::path(data_dir(override_dir)) / relative).string();
}

}  // namespace kvevict
