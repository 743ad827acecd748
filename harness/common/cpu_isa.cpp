#include "harness/common/cpu_isa.h"

#include <cstdlib>
#include <string>

namespace kvevict {

bool cpu_has_avx2_fma() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
#else
  return false;
#endif
}

bool use_avx512() {
#if defined(__x86_64__) && defined(__GNUC__)
  static const bool use = [] {
    const char* capability = std::getenv("ATEN_CPU_CAPABILITY");
    const std::string named = capability ? capability : "";
    return cpu_has_avx2_fma() && __builtin_cpu_supports("avx512f") && named != "avx2" && named != "default";
  }();
  return use;
#else
  return false;
#endif
}

}  // namespace kvevict
