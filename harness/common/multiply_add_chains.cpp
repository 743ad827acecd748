#include "harness/common/multiply_add_chains.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include <algorithm>
#include <chrono>

namespace kvevict {

float fma_chains_portable(int64_t n) {
  float acc[kMultiplyAddChains];
  for (int k = 0; k < kMultiplyAddChains; ++k) acc[k] = 1.0f + k * 1e-3f;
  for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 16
    for (int k = 0; k < kMultiplyAddChains; ++k) acc[k] = acc[k] * 0.999999f + 1e-6f;
  float sum = 0;
  for (float a : acc) sum += a;
  return sum;
}

#if defined(__x86_64__) && defined(__GNUC__)
__attribute__((target("avx2,fma"))) float fma_chains_avx2(int64_t n) {
  __m256 acc[kMultiplyAddChains];
  for (int k = 0; k < kMultiplyAddChains; ++k) acc[k] = _mm256_set1_ps(1.0f + k * 1e-3f);
  const __m256 m = _mm256_set1_ps(0.999999f), c = _mm256_set1_ps(1e-6f);
  for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 16
    for (int k = 0; k < kMultiplyAddChains; ++k) acc[k] = _mm256_fmadd_ps(acc[k], m, c);
  alignas(32) float lanes[8];
  __m256 sum = acc[0];
  for (int k = 1; k < kMultiplyAddChains; ++k) sum = _mm256_add_ps(sum, acc[k]);
  _mm256_store_ps(lanes, sum);
  return lanes[0] + lanes[1] + lanes[2] + lanes[3] + lanes[4] + lanes[5] + lanes[6] + lanes[7];
}

__attribute__((target("avx512f"))) float fma_chains_avx512(int64_t n) {
  __m512 acc[kMultiplyAddChains];
  for (int k = 0; k < kMultiplyAddChains; ++k) acc[k] = _mm512_set1_ps(1.0f + k * 1e-3f);
  const __m512 m = _mm512_set1_ps(0.999999f), c = _mm512_set1_ps(1e-6f);
  for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 16
    for (int k = 0; k < kMultiplyAddChains; ++k) acc[k] = _mm512_fmadd_ps(acc[k], m, c);
  __m512 sum = acc[0];
  for (int k = 1; k < kMultiplyAddChains; ++k) sum = _mm512_add_ps(sum, acc[k]);
  return _mm512_reduce_add_ps(sum);
}

// vdpbf16ps: per float32 lane, acc += a0 * b0 + a1 * b1 (two bfloat16 pairs: 4 FLOPs).
// a = 1, b = 2^-20: the chains grow by about 2^-19 a step, far from overflow.
__attribute__((target("avx512f,avx512bf16"))) float bf16_dot_chains(int64_t n) {
  __m512 acc[kMultiplyAddChains];
  for (int k = 0; k < kMultiplyAddChains; ++k) acc[k] = _mm512_set1_ps(1.0f + k * 1e-3f);
  const __m512bh a = _mm512_cvtne2ps_pbh(_mm512_set1_ps(1.0f), _mm512_set1_ps(1.0f));
  const __m512bh b = _mm512_cvtne2ps_pbh(_mm512_set1_ps(0x1p-20f), _mm512_set1_ps(0x1p-20f));
  for (int64_t i = 0; i < n; ++i)
#pragma GCC unroll 16
    for (int k = 0; k < kMultiplyAddChains; ++k) acc[k] = _mm512_dpbf16_ps(acc[k], a, b);
  __m512 sum = acc[0];
  for (int k = 1; k < kMultiplyAddChains; ++k) sum = _mm512_add_ps(sum, acc[k]);
  return _mm512_reduce_add_ps(sum);
}
#endif


#if defined(__x86_64__) && defined(__GNUC__)
bool bf16_dot_outruns_fma() {
  static const bool outruns = [] {
    if (!__builtin_cpu_supports("avx512f") || !__builtin_cpu_supports("avx512bf16")) return false;
    // A chain step of vdpbf16ps does 12 x 32 multiply-adds, of float32 FMAs 12 x 16: the
    // same work takes twice the FMA steps. About 0.1 ms in all; the best of five each, taken
    // in turns, so a busy moment slows both.
    constexpr int64_t kSteps = 2000;
    auto seconds = [](float (*chains)(int64_t), int64_t steps) {
      const auto start = std::chrono::steady_clock::now();
      volatile float sink = chains(steps);
      (void)sink;
      return std::chrono::duration<double>(std::chrono::steady_clock::now() - start).count();
    };
    fma_chains_avx512(kSteps);  // the core leaves its low-power state for wide vectors
    double dot = 1e9, fma = 1e9;
    for (int round = 0; round < 5; ++round) {
      dot = std::min(dot, seconds(bf16_dot_chains, kSteps));
      fma = std::min(fma, seconds(fma_chains_avx512, 2 * kSteps));
    }
    return dot < fma;
  }();
  return outruns;
}
#else
bool bf16_dot_outruns_fma() { return false; }
#endif

}  // namespace kvevict
