// CLI11 validators for numeric flags: ranges that also refuse NaN and infinities
// (CLI::Range lets NaN through, since every comparison with it is false).
#pragma once
#include <CLI/CLI.hpp>
#include <cmath>
#include <cstdint>
#include <limits>
#include <string>
#include <type_traits>

#include "harness/common/errors.h"
#include "harness/common/files.h"

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

// A seed flag, read by parse_seed (harness/common/files.h): CLI11's own conversion read
// "-1" and "1e23" as 2^64 - 1 and wrapped numbers past it.
template <typename Seed>
CLI::Option* add_seed_option(CLI::App& app, const std::string& flag, Seed& seed, const std::string& help) {
  static_assert(std::is_same_v<Seed, std::uint64_t>, "a seed is an unsigned 64-bit integer");
  return app
      .add_option_function<std::string>(
          flag,
          [&seed, flag](const std::string& text) {
            try {
              seed = parse_seed(text, flag);
            } catch (const Error& e) {
              throw CLI::ValidationError(e.what());
            }
          },
          help)
      ->default_str(std::to_string(seed))
      ->type_name("UINT64");
}

}  // namespace kvevict::cli
