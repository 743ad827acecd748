// One exception type for every bad input. The CLI prints what() on one line and
// exits non-zero, so messages must name the file, line or tensor at fault.
#pragma once
#include <stdexcept>
#include <string>

namespace kvevict {

struct Error : std::runtime_error {
  explicit Error(const std::string& message) : std::runtime_error(message) {}
};

}  // namespace kvevict
