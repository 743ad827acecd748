#include "harness/common/float_row_exp.h"

#include <cmath>
#include <cstdint>

#include "harness/common/bit_cast.h"
#include "harness/common/cpu_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVEVICT_FLOAT_ROW_EXP_AVX2 1
#endif

namespace kvevict {
namespace {

// 1 / ln 2; ln 2 in two parts (the high part's 9 low bits zero, so k times it is exact
// for |k| < 2^9); 1/n! for the polynomial; the rounding shift; the lowest d computed.
constexpr float kInvLn2 = 0x1.715476p+0f;
constexpr float kNegLn2Hi = -0x1.62e4p-1f, kNegLn2Lo = -0x1.7f7d1cp-20f;
constexpr float kC2 = 1.0f / 2, kC3 = 1.0f / 6, kC4 = 1.0f / 24, kC5 = 1.0f / 120, kC6 = 1.0f / 720,
                kC7 = 1.0f / 5040;
constexpr float kShift = 0x1.8p+23f;
constexpr float kLowest = -87.0f;

// One difference, in the operations of the vector loops (this file compiles with
// -ffp-contract=off, so each rounds as there).
float exp_scalar(float d) {
  const float c = kLowest > d ? kLowest : d;  // maxps(kLowest, d): NaN stays
  float kf = std::fma(c, kInvLn2, kShift);
  const uint32_t ki = bit_cast<uint32_t>(kf);
  kf = kf - kShift;
  float r = std::fma(kf, kNegLn2Hi, c);
  r = std::fma(kf, kNegLn2Lo, r);
  const float b = std::fma(r, kC3, kC2);
  const float c45 = std::fma(r, kC5, kC4);
  const float c67 = std::fma(r, kC7, kC6);
  const float r2 = r * r;
  const float r4 = r2 * r2;
  const float t = std::fma(r2, c67, c45);
  const float u = std::fma(r2, b, r);
  const float p = 1.0f + std::fma(r4, t, u);
  return d < kLowest ? 0.0f : bit_cast<float>(bit_cast<uint32_t>(p) + (ki << 23));
}

#ifdef KVEVICT_FLOAT_ROW_EXP_AVX2
#define AVX2_FMA __attribute__((target("avx2,fma")))
#define AVX512 __attribute__((target("avx512f,avx2,fma")))

AVX2_FMA inline __m256 exp8(__m256 d) {
  const __m256 lowest = _mm256_set1_ps(kLowest), shift = _mm256_set1_ps(kShift);
  const __m256 c = _mm256_max_ps(lowest, d);
  __m256 kf = _mm256_fmadd_ps(c, _mm256_set1_ps(kInvLn2), shift);
  const __m256i ki = _mm256_castps_si256(kf);
  kf = _mm256_sub_ps(kf, shift);
  __m256 r = _mm256_fmadd_ps(kf, _mm256_set1_ps(kNegLn2Hi), c);
  r = _mm256_fmadd_ps(kf, _mm256_set1_ps(kNegLn2Lo), r);
  const __m256 b = _mm256_fmadd_ps(r, _mm256_set1_ps(kC3), _mm256_set1_ps(kC2));
  const __m256 c45 = _mm256_fmadd_ps(r, _mm256_set1_ps(kC5), _mm256_set1_ps(kC4));
  const __m256 c67 = _mm256_fmadd_ps(r, _mm256_set1_ps(kC7), _mm256_set1_ps(kC6));
  const __m256 r2 = _mm256_mul_ps(r, r);
  const __m256 r4 = _mm256_mul_ps(r2, r2);
  const __m256 t = _mm256_fmadd_ps(r2, c67, c45);
  const __m256 u = _mm256_fmadd_ps(r2, b, r);
  const __m256 p = _mm256_add_ps(_mm256_set1_ps(1.0f), _mm256_fmadd_ps(r4, t, u));
  const __m256 e = _mm256_castsi256_ps(_mm256_add_epi32(_mm256_castps_si256(p), _mm256_slli_epi32(ki, 23)));
  return _mm256_andnot_ps(_mm256_cmp_ps(d, lowest, _CMP_LT_OQ), e);
}

AVX512 inline __m512 exp16(__m512 d) {
  const __m512 lowest = _mm512_set1_ps(kLowest), shift = _mm512_set1_ps(kShift);
  const __m512 c = _mm512_max_ps(lowest, d);
  __m512 kf = _mm512_fmadd_ps(c, _mm512_set1_ps(kInvLn2), shift);
  const __m512i ki = _mm512_castps_si512(kf);
  kf = _mm512_sub_ps(kf, shift);
  __m512 r = _mm512_fmadd_ps(kf, _mm512_set1_ps(kNegLn2Hi), c);
  r = _mm512_fmadd_ps(kf, _mm512_set1_ps(kNegLn2Lo), r);
  const __m512 b = _mm512_fmadd_ps(r, _mm512_set1_ps(kC3), _mm512_set1_ps(kC2));
  const __m512 c45 = _mm512_fmadd_ps(r, _mm512_set1_ps(kC5), _mm512_set1_ps(kC4));
  const __m512 c67 = _mm512_fmadd_ps(r, _mm512_set1_ps(kC7), _mm512_set1_ps(kC6));
  const __m512 r2 = _mm512_mul_ps(r, r);
  const __m512 r4 = _mm512_mul_ps(r2, r2);
  const __m512 t = _mm512_fmadd_ps(r2, c67, c45);
  const __m512 u = _mm512_fmadd_ps(r2, b, r);
  const __m512 p = _mm512_add_ps(_mm512_set1_ps(1.0f), _mm512_fmadd_ps(r4, t, u));
  const __mmask16 kept = _mm512_cmp_ps_mask(d, lowest, _CMP_NLT_UQ);
  return _mm512_castsi512_ps(_mm512_maskz_add_epi32(kept, _mm512_castps_si512(p), _mm512_slli_epi32(ki, 23)));
}

AVX2_FMA void exp_row_differences_avx2(const float* x, float shift, float* out, int n,
                                       double (&lanes)[kRowSumLanes]) {
  const __m256 s = _mm256_set1_ps(shift);
  __m256d low = _mm256_loadu_pd(lanes), high = _mm256_loadu_pd(lanes + 4);
  int k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 e = exp8(_mm256_sub_ps(_mm256_loadu_ps(x + k), s));
    _mm256_storeu_ps(out + k, e);
    low = _mm256_add_pd(low, _mm256_cvtps_pd(_mm256_castps256_ps128(e)));
    high = _mm256_add_pd(high, _mm256_cvtps_pd(_mm256_extractf128_ps(e, 1)));
  }
  _mm256_storeu_pd(lanes, low);
  _mm256_storeu_pd(lanes + 4, high);
  for (int lane = 0; k < n; ++k, ++lane) {
    out[k] = exp_scalar(x[k] - shift);
    lanes[lane] += static_cast<double>(out[k]);
  }
}

AVX512 void exp_row_differences_avx512(const float* x, float shift, float* out, int n,
                                       double (&lanes)[kRowSumLanes]) {
  const __m512 s = _mm512_set1_ps(shift);
  __m512d sum = _mm512_loadu_pd(lanes);
  int k = 0;
  for (; k + 16 <= n; k += 16) {
    const __m512 e = exp16(_mm512_sub_ps(_mm512_loadu_ps(x + k), s));
    _mm512_storeu_ps(out + k, e);
    // Slots k .. k+7, then k+8 .. k+15: each lane in slot order.
    sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm512_castps512_ps256(e)));
    sum = _mm512_add_pd(sum, _mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(e), 1))));
  }
  _mm512_storeu_pd(lanes, sum);
  exp_row_differences_avx2(x + k, shift, out + k, n - k, lanes);  // k is a multiple of 8: lane 0 next
}

AVX2_FMA void exp_floats_avx2(const float* d, float* out, int n) {
  int k = 0;
  for (; k + 8 <= n; k += 8) _mm256_storeu_ps(out + k, exp8(_mm256_loadu_ps(d + k)));
  for (; k < n; ++k) out[k] = exp_scalar(d[k]);
}

AVX512 void exp_floats_avx512(const float* d, float* out, int n) {
  int k = 0;
  for (; k + 16 <= n; k += 16) _mm512_storeu_ps(out + k, exp16(_mm512_loadu_ps(d + k)));
  exp_floats_avx2(d + k, out + k, n - k);
}
#endif

}  // namespace

void exp_floats_scalar(const float* d, float* out, int n) {
  for (int k = 0; k < n; ++k) out[k] = exp_scalar(d[k]);
}

void exp_floats(const float* d, float* out, int n) {
#ifdef KVEVICT_FLOAT_ROW_EXP_AVX2
  if (cpu_has_avx2_fma()) return use_avx512() ? exp_floats_avx512(d, out, n) : exp_floats_avx2(d, out, n);
#endif
  exp_floats_scalar(d, out, n);
}

void exp_row_differences(const float* x, float shift, float* out, int n, double (&lanes)[kRowSumLanes]) {
#ifdef KVEVICT_FLOAT_ROW_EXP_AVX2
  if (cpu_has_avx2_fma()) {
    if (use_avx512()) return exp_row_differences_avx512(x, shift, out, n, lanes);
    return exp_row_differences_avx2(x, shift, out, n, lanes);
  }
#endif
  for (int k = 0; k < n; ++k) {
    out[k] = exp_scalar(x[k] - shift);
    lanes[k % kRowSumLanes] += static_cast<double>(out[k]);
  }
}

}  // namespace kvevict
