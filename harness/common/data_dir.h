// Where the real data lives: --data-dir, else $KVEVICT_DATA, else ../shared/data
// relative to the repository root.
#pragma once
#include <string>

namespace kvevict {

// Returns the data directory; `override_dir` wins when non-empty.
std::string data_dir(const std::string& override_dir = "");

// Joins a path relative to the data directory.
std::string data_path(const std::string& relative, const std::string& override_dir = "");

}  // namespace kvevict
