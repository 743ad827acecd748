// Catch2 for every test file: version 2 (Debian 12) or 3 (Debian 13, found by CMake,
// which defines KVEVICT_CATCH_MAJOR). The tests are written against version 2's names;
// for version 3 this is the one place that maps them.
#pragma once
#if KVEVICT_CATCH_MAJOR >= 3
#include <catch2/catch_all.hpp>

#include <string>

namespace Catch {
using Matchers::EndsWith;
using Matchers::Predicate;
using Matchers::StartsWith;
// Version 3 calls the substring matcher ContainsSubstring; its Contains is for ranges.
inline Matchers::StringContainsMatcher Contains(const std::string& text,
                                                CaseSensitive sensitivity = CaseSensitive::Yes) {
  return Matchers::ContainsSubstring(text, sensitivity);
}
}  // namespace Catch
using Catch::Approx;
#else
#include <catch2/catch.hpp>
#endif
