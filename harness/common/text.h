// Small string helpers that several libraries need.
#pragma once
#include <chrono>
#include <cstdio>
#include <cstddef>
#include <string>
#include <string_view>

namespace kvevict {

inline bool starts_with(std::string_view text, std::string_view prefix) {
  return text.substr(0, prefix.size()) == prefix;
}
inline bool ends_with(std::string_view text, std::string_view suffix) {
  return text.size() >= suffix.size() && text.substr(text.size() - suffix.size()) == suffix;
}

// "[2,3,4]": a tensor shape in error messages (any sequence of integers: a vector, an
// IntArrayRef).
template <typename Shape>
std::string shape_string(const Shape& shape) {
  std::string s = "[";
  for (std::size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

// Text made safe as one file name: [A-Za-z0-9._-] and the characters of `also_kept`
// kept, anything else '_'; never hidden (no leading dot), never empty.
std::string file_name_part(const std::string& text, std::string_view also_kept = "");

// A number as short as "%g" writes it (0.5, 1e-06, 32000): limits in error messages.
inline std::string short_number(double value) {
  char text[32];
  std::snprintf(text, sizeof text, "%g", value);
  return text;
}

inline double seconds_since(std::chrono::steady_clock::time_point start) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
}

}  // namespace kvevict
