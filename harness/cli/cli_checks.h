// CLI11 validators for numeric flags: ranges that also refuse NaN and infinities
// (CLI::Range lets NaN through, since every comparison with it is false).
#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <limits>
#include <string>

namespace kvevict::cli {

// A finite number in [low, high] (or (low, high] when low_open).
inline CLI::Validator finite_range(double low, double high, bool low_open = false) {
  const std::string description = std::string(low_open ? "(" : "[") + CLI::detail::to_string(low) + ", " +
                                  CLI::detail::to_string(high) + "]";
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        double value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "\"" + text + "\" is not a number";
        const bool above = low_open ? value > low : value >= low;
        if (!std::isfinite(value) || !above || value > high) return text + " is outside " + description;
        return std::string();
      },
      "in " + description);
}

// An integer >= low.
inline CLI::Validator at_least(long long low) {
  return CLI::Validator(
      [=](std::string& text) -> std::string {
        long long value = 0;
        if (!CLI::detail::lexical_cast(text, value)) return "\"" + text + "\" is not an integer";
        if (value < low) return text + " must be at least " + std::to_string(low);
        return std::string();
      },
      ">= " + std::to_string(low));
}

}  // namespace kvevict::cli
