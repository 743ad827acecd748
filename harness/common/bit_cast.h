// A value's bits as another type of the same size (C++20's std::bit_cast, for C++17):
// the exponentials' tables and exponent arithmetic (double_exp.h, float_row_exp.h).
#pragma once
#include <cstring>
#include <type_traits>

namespace kvevict {

template <typename To, typename From>
To bit_cast(const From& from) {
  static_assert(sizeof(To) == sizeof(From), "bit_cast between types of different sizes");
  static_assert(std::is_trivially_copyable_v<To> && std::is_trivially_copyable_v<From>, "bit_cast of a non-trivial type");
  To to;
  std::memcpy(&to, &from, sizeof to);
  return to;
}

}  // namespace kvevict
