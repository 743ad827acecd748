#include "policies/float_exp.h"

#include <cmath>
#include <cstdint>
#include <cstring>
#include <vector>

#include "harness/common/cpu_isa.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVEVICT_FLOAT_EXP_AVX2 1
#endif

namespace kvevict {
namespace {

#ifdef KVEVICT_FLOAT_EXP_AVX2
#define AVX2_FMA __attribute__((target("avx2,fma")))

// 2^(i/32), correctly rounded, i = 0..31.
constexpr double kTwoToIOver32[32] = {
    0x1.0000000000000p+0, 0x1.059b0d3158574p+0, 0x1.0b5586cf9890fp+0, 0x1.11301d0125b51p+0, 0x1.172b83c7d517bp+0,
    0x1.1d4873168b9aap+0, 0x1.2387a6e756238p+0, 0x1.29e9df51fdee1p+0, 0x1.306fe0a31b715p+0, 0x1.371a7373aa9cbp+0,
    0x1.3dea64c123422p+0, 0x1.44e086061892dp+0, 0x1.4bfdad5362a27p+0, 0x1.5342b569d4f82p+0, 0x1.5ab07dd485429p+0,
    0x1.6247eb03a5585p+0, 0x1.6a09e667f3bcdp+0, 0x1.71f75e8ec5f74p+0, 0x1.7a11473eb0187p+0, 0x1.82589994cce13p+0,
    0x1.8ace5422aa0dbp+0, 0x1.93737b0cdc5e5p+0, 0x1.9c49182a3f090p+0, 0x1.a5503b23e255dp+0, 0x1.ae89f995ad3adp+0,
    0x1.b7f76f2fb5e47p+0, 0x1.c199bdd85529cp+0, 0x1.cb720dcef9069p+0, 0x1.d5818dcfba487p+0, 0x1.dfc97337b9b5fp+0,
    0x1.ea4afa2a490dap+0, 0x1.f50765b6e4540p+0};
// glibc's expf constants: 32/ln 2, its cubic for 2^(r/32) (scaled), the rounding shift.
constexpr double kInvLn2TimesN = 0x1.71547652b82fep+5;
constexpr double kC0 = 0x1.c6af84b912394p-20, kC1 = 0x1.ebfce50fac4f3p-13, kC2 = 0x1.62e42ff0c52d6p-6;
constexpr double kShift = 0x1.8p+52;

// The table as expf indexes it: the bits of 2^(i/32) less i << 47, so that adding
// k << 47 puts k / 32 into the exponent.
struct ScaleTable {
  int64_t bits[32];
  ScaleTable() {
    for (int i = 0; i < 32; ++i) {
      std::memcpy(&bits[i], &kTwoToIOver32[i], sizeof(double));
      bits[i] -= int64_t{i} << 47;
    }
  }
};
const ScaleTable kScaleTable;

// Four floats through expf's main path (|x| < 2^7): every step as the FMA build of
// glibc's expf computes it.
AVX2_FMA inline __m128 expf_main_path(__m128 x) {
  const __m256d xd = _mm256_cvtps_pd(x);
  const __m256d inv_ln2_n = _mm256_set1_pd(kInvLn2TimesN), shift = _mm256_set1_pd(kShift);
  __m256d kd = _mm256_fmadd_pd(inv_ln2_n, xd, shift);  // k rounded to an integer in the low bits
  const __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, shift);
  const __m256d r = _mm256_fmsub_pd(inv_ln2_n, xd, kd);  // x * 32 / ln 2 - k
  const __m256i index = _mm256_and_si256(ki, _mm256_set1_epi64x(31));
  __m256i scale_bits = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kScaleTable.bits), index, 8);
  scale_bits = _mm256_add_epi64(scale_bits, _mm256_slli_epi64(ki, 47));
  const __m256d scale = _mm256_castsi256_pd(scale_bits);  // 2^(k/32)
  const __m256d z = _mm256_fmadd_pd(r, _mm256_set1_pd(kC0), _mm256_set1_pd(kC1));
  const __m256d r2 = _mm256_mul_pd(r, r);
  __m256d y = _mm256_fmadd_pd(r, _mm256_set1_pd(kC2), _mm256_set1_pd(1.0));
  y = _mm256_fmadd_pd(z, r2, y);
  return _mm256_cvtpd_ps(_mm256_mul_pd(y, scale));
}

AVX2_FMA void exp_of_difference_avx2(const float* x, float shift, float* out, int n) {
  const __m256 shift_v = _mm256_set1_ps(shift);
  int k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m256 d = _mm256_sub_ps(_mm256_loadu_ps(x + k), shift_v);
    const __m128 low = expf_main_path(_mm256_castps256_ps128(d)), high = expf_main_path(_mm256_extractf128_ps(d, 1));
    _mm256_storeu_ps(out + k, _mm256_set_m128(high, low));
    // Lanes outside the main path (expf's test: bits 20..30 of x above 0x42a) call expf.
    const __m256i top = _mm256_and_si256(_mm256_srli_epi32(_mm256_castps_si256(d), 20), _mm256_set1_epi32(0x7ff));
    const int outside = _mm256_movemask_ps(_mm256_castsi256_ps(_mm256_cmpgt_epi32(top, _mm256_set1_epi32(0x42a))));
    if (outside != 0)
      for (int lane = 0; lane < 8; ++lane)
        if (outside & (1 << lane)) out[k + lane] = std::exp(x[k + lane] - shift);
  }
  for (; k < n; ++k) out[k] = std::exp(x[k] - shift);
}
#endif

void exp_of_difference_scalar(const float* x, float shift, float* out, int n) {
  for (int k = 0; k < n; ++k) out[k] = std::exp(x[k] - shift);
}

// The vector loop against expf on a million floats spread evenly over the bit patterns
// of [-2^7, 2^7] (every 2048th float there), the specials and the range ends: a few
// milliseconds, once per process.
bool vector_loop_matches_expf() {
#ifdef KVEVICT_FLOAT_EXP_AVX2
  if (!vector_expf_supported()) return false;
  std::vector<float> in = expf_main_range_floats(2048);
  for (float v : {0.0f, -0.0f, 88.7f, 88.8f, -87.3f, -103.9f, -104.0f, 1e30f, -1e30f, INFINITY, -INFINITY, NAN})
    in.push_back(v);
  std::vector<float> vector_out(in.size()), libm_out(in.size());
  exp_of_difference_avx2(in.data(), 0.0f, vector_out.data(), static_cast<int>(in.size()));
  exp_of_difference_scalar(in.data(), 0.0f, libm_out.data(), static_cast<int>(in.size()));
  return std::memcmp(vector_out.data(), libm_out.data(), in.size() * sizeof(float)) == 0;
#else
  return false;
#endif
}

}  // namespace

std::vector<float> expf_main_range_floats(uint32_t stride) {
  std::vector<float> floats;
  for (uint32_t sign : {0u, 0x80000000u})
    for (uint32_t bits = 0; bits <= 0x43000000u; bits += stride) {  // 0x43000000 is 2^7
      float v;
      const uint32_t pattern = bits | sign;
      std::memcpy(&v, &pattern, sizeof v);
      floats.push_back(v);
    }
  return floats;
}

bool vector_expf_supported() {
#ifdef KVEVICT_FLOAT_EXP_AVX2
  return cpu_has_avx2_fma();
#else
  return false;
#endif
}

bool vector_expf_in_use() {
  static const bool in_use = vector_loop_matches_expf();
  return in_use;
}

void exp_of_difference_vector(const float* x, float shift, float* out, int n) {
#ifdef KVEVICT_FLOAT_EXP_AVX2
  if (vector_expf_supported()) return exp_of_difference_avx2(x, shift, out, n);
#endif
  exp_of_difference_scalar(x, shift, out, n);
}

void exp_of_difference(const float* x, float shift, float* out, int n) {
  if (vector_expf_in_use())
    exp_of_difference_vector(x, shift, out, n);
  else
    exp_of_difference_scalar(x, shift, out, n);
}

}  // namespace kvevict
