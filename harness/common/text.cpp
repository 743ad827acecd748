#include "harness/common/text.h"

#include <cctype>

namespace kvevict {

std::string file_name_part(const std::string& text, std::string_view also_kept) {
  std::string clean;
  for (char c : text) {
    bool safe = std::isalnum(static_cast<unsigned char>(c)) || c == '.' || c == '_' || c == '-' ||
                also_kept.find(c) != std::string_view::npos;
    clean += safe ? c : '_';
  }
  // A leading dot would hide the file; ".." would climb out of the folder.
  while (!clean.empty() && clean.front() == '.') clean.front() = '_';
  return clean.empty() ? "unnamed" : clean;
}

}  // namespace kvevict
