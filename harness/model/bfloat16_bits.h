// bfloat16 as its raw 16 bits, for kernels that read and write it in plain integer and
// float code the compiler vectorizes (matvec.cpp, fused_elementwise.cpp).
#pragma once
#include <cstdint>
#include <cstring>

namespace kvevict {

inline float widen(float value) { return value; }
inline float widen(uint16_t bf16_bits) {  // bfloat16 is the top half of a float32: exact
  const uint32_t bits = static_cast<uint32_t>(bf16_bits) << 16;
  float value;
  std::memcpy(&value, &bits, sizeof value);
  return value;
}

// Round to nearest even, NaN to 0x7FC0: c10::detail::round_to_nearest_even (what ATen
// does when it stores a float result as bfloat16), without its branch.
inline uint16_t bf16_bits(float value) {
  uint32_t u;
  std::memcpy(&u, &value, sizeof u);
  const uint32_t rounded = (u + 0x7FFFu + ((u >> 16) & 1u)) >> 16;
  return value != value ? uint16_t{0x7FC0} : static_cast<uint16_t>(rounded);
}

}  // namespace kvevict
