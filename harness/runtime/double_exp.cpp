#include "harness/runtime/double_exp.h"

#include <gmp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <string>
#include <limits>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVEVICT_DOUBLE_EXP_AVX2 1
#endif

namespace kvevict {
namespace {

#ifdef KVEVICT_DOUBLE_EXP_AVX2
#define AVX2_FMA __attribute__((target("avx2,fma")))

constexpr int kTableBits = 7, kTableSize = 1 << kTableBits;  // 2^(k/128)

uint64_t bits_of(double v) {
  uint64_t b;
  std::memcpy(&b, &v, sizeof b);
  return b;
}

// The double nearest the positive integer q times 2^scale. q is the quotient of integers
// that are each within one unit of exact, so it is within 2^kSlack units of the exact
// value, which is irrational (never a tie). False when q is too short, or when its bits
// between the slack and the rounding bit are all zeros or all ones: the rounding could
// then go either way.
bool nearest_double(const mpz_t q, long scale, double* out) {
  constexpr long kSlack = 80, kMargin = 16;
  const long length = static_cast<long>(mpz_sizeinbase(q, 2)), drop = length - 53;
  if (drop - 1 < kSlack + kMargin) return false;
  mpz_t top, between;
  mpz_init(top);
  mpz_init(between);
  mpz_fdiv_q_2exp(top, q, drop);
  mpz_fdiv_r_2exp(between, q, drop - 1);  // the bits below the rounding bit ...
  mpz_fdiv_q_2exp(between, between, kSlack);  // ... above the slack
  const long width = drop - 1 - kSlack;
  const bool undecided = mpz_sgn(between) == 0 || static_cast<long>(mpz_popcount(between)) == width;
  if (mpz_tstbit(q, drop - 1)) mpz_add_ui(top, top, 1);
  *out = std::ldexp(static_cast<double>(mpz_get_ui(top)), static_cast<int>(drop + scale));
  mpz_clear(top);
  mpz_clear(between);
  return !undecided;
}

// exp's table, by glibc's definition: for k < 128, H = the double nearest 2^(k/128) and
// tail = the double nearest (2^(k/128) - H) / H, stored as tail's bits and as H's bits
// less k << 45 (adding k's multiple of 128 then lands in the exponent).
struct ExpTable {
  uint64_t tail[kTableSize];
  uint64_t scale[kTableSize];
  bool exact = true;
  ExpTable() {
    constexpr long kBits = 200;  // X = floor(2^(200 + k/128)), from an integer 128th root
    mpz_t power, x, h, d, q;
    mpz_inits(power, x, h, d, q, nullptr);
    for (int k = 0; k < kTableSize; ++k) {
      mpz_ui_pow_ui(power, 2, static_cast<unsigned long>(kBits * kTableSize + k));
      mpz_root(x, power, kTableSize);
      // H: X's top 53 bits, rounded to nearest (X lies in [2^200, 2^201)).
      mpz_fdiv_q_2exp(h, x, kBits - 52);
      if (mpz_tstbit(x, kBits - 53)) mpz_add_ui(h, h, 1);
      const double H = std::ldexp(static_cast<double>(mpz_get_ui(h)), -52);
      // tail = (X - H * 2^200) / (H * 2^200), its magnitude to 128 more bits than it has.
      mpz_mul_2exp(d, h, kBits - 52);
      mpz_sub(d, x, d);
      double tail = 0.0;
      if (mpz_sgn(d) != 0) {
        const int sign = mpz_sgn(d);
        mpz_abs(d, d);
        mpz_mul_2exp(d, d, 128);
        mpz_fdiv_q(q, d, h);  // |tail| = q * 2^-(148 + 128)
        exact = nearest_double(q, -(kBits - 52) - 128, &tail) && exact;
        tail = sign < 0 ? -tail : tail;
      }
      this->tail[k] = bits_of(tail);
      scale[k] = bits_of(H) - (static_cast<uint64_t>(k) << 45);
    }
    mpz_clears(power, x, h, d, q, nullptr);
  }
};


const ExpTable& table() {
  static const ExpTable t;
  return t;
}

// glibc's exp constants: 128 / ln 2, ln 2 / 128 in two parts, the quintic's C2..C5, the
// rounding shift.
constexpr double kInvLn2N = 0x1.71547652b82fep+7;
constexpr double kNegLn2HiN = -0x1.62e42fefa0000p-8, kNegLn2LoN = -0x1.cf79abc9e3b3ap-47;
constexpr double kC2 = 0x1.ffffffffffdbdp-2, kC3 = 0x1.555555555543cp-3;
constexpr double kC4 = 0x1.55555cf172b91p-5, kC5 = 0x1.1111167a4d017p-7;
constexpr double kShift = 0x1.8p+52;

// Four doubles through exp's main path: every step as the FMA build of glibc's exp
// computes it. outside: the lanes that path does not cover (exp's own test: the top 12
// bits of |x| less those of 2^-54, unsigned, at least those of 512 less 2^-54).
AVX2_FMA inline __m256d exp_main_path(__m256d x, const ExpTable& t, int* outside) {
  const __m256i top = _mm256_and_si256(_mm256_srli_epi64(_mm256_castpd_si256(x), 52), _mm256_set1_epi64x(0x7ff));
  const __m256i offset = _mm256_sub_epi64(top, _mm256_set1_epi64x(0x3c9));
  // Unsigned offset >= 0x3f: offset > 0x3e signed, or negative.
  const __m256i out_of_path = _mm256_or_si256(_mm256_cmpgt_epi64(offset, _mm256_set1_epi64x(0x3e)),
                                               _mm256_cmpgt_epi64(_mm256_setzero_si256(), offset));
  *outside = _mm256_movemask_pd(_mm256_castsi256_pd(out_of_path));
  const __m256d shift = _mm256_set1_pd(kShift);
  __m256d kd = _mm256_fmadd_pd(x, _mm256_set1_pd(kInvLn2N), shift);
  const __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, shift);
  __m256d r = _mm256_fmadd_pd(kd, _mm256_set1_pd(kNegLn2HiN), x);
  r = _mm256_fmadd_pd(kd, _mm256_set1_pd(kNegLn2LoN), r);
  const __m256i index = _mm256_and_si256(ki, _mm256_set1_epi64x(kTableSize - 1));
  const __m256d tail = _mm256_castsi256_pd(
      _mm256_i64gather_epi64(reinterpret_cast<const long long*>(t.tail), index, 8));
  const __m256i scale_bits = _mm256_add_epi64(
      _mm256_i64gather_epi64(reinterpret_cast<const long long*>(t.scale), index, 8), _mm256_slli_epi64(ki, 45));
  const __m256d c23 = _mm256_fmadd_pd(r, _mm256_set1_pd(kC3), _mm256_set1_pd(kC2));
  const __m256d tail_r = _mm256_add_pd(r, tail);
  const __m256d r2 = _mm256_mul_pd(r, r);
  const __m256d c45 = _mm256_fmadd_pd(r, _mm256_set1_pd(kC5), _mm256_set1_pd(kC4));
  const __m256d low = _mm256_fmadd_pd(c23, r2, tail_r);
  const __m256d tmp = _mm256_fmadd_pd(_mm256_mul_pd(r2, r2), c45, low);
  const __m256d scale = _mm256_castsi256_pd(scale_bits);
  return _mm256_fmadd_pd(scale, tmp, scale);
}

AVX2_FMA void exp_doubles_avx2(const double* x, double* out, int n) {
  const ExpTable& t = table();
  int k = 0;
  for (; k + 4 <= n; k += 4) {
    alignas(32) double in[4];
    const __m256d v = _mm256_loadu_pd(x + k);
    _mm256_store_pd(in, v);
    int outside = 0;
    _mm256_storeu_pd(out + k, exp_main_path(v, t, &outside));
    if (outside != 0)
      for (int lane = 0; lane < 4; ++lane)
        if (outside & (1 << lane)) out[k + lane] = std::exp(in[lane]);
  }
  for (; k < n; ++k) out[k] = std::exp(x[k]);
}

#define AVX512 __attribute__((target("avx512f,avx2,fma")))

// exp_main_path on eight doubles: the same operations in the same order. outside: a bit
// per lane as there.
AVX512 inline __m512d exp_main_path8(__m512d x, const ExpTable& t, __mmask8* outside) {
  const __m512i top = _mm512_and_si512(_mm512_srli_epi64(_mm512_castpd_si512(x), 52), _mm512_set1_epi64(0x7ff));
  *outside = _mm512_cmpge_epu64_mask(_mm512_sub_epi64(top, _mm512_set1_epi64(0x3c9)), _mm512_set1_epi64(0x3f));
  const __m512d shift = _mm512_set1_pd(kShift);
  __m512d kd = _mm512_fmadd_pd(x, _mm512_set1_pd(kInvLn2N), shift);
  const __m512i ki = _mm512_castpd_si512(kd);
  kd = _mm512_sub_pd(kd, shift);
  __m512d r = _mm512_fmadd_pd(kd, _mm512_set1_pd(kNegLn2HiN), x);
  r = _mm512_fmadd_pd(kd, _mm512_set1_pd(kNegLn2LoN), r);
  const __m512i index = _mm512_and_si512(ki, _mm512_set1_epi64(kTableSize - 1));
  const __m512d tail = _mm512_castsi512_pd(_mm512_i64gather_epi64(index, t.tail, 8));
  const __m512i scale_bits = _mm512_add_epi64(_mm512_i64gather_epi64(index, t.scale, 8), _mm512_slli_epi64(ki, 45));
  const __m512d c23 = _mm512_fmadd_pd(r, _mm512_set1_pd(kC3), _mm512_set1_pd(kC2));
  const __m512d tail_r = _mm512_add_pd(r, tail);
  const __m512d r2 = _mm512_mul_pd(r, r);
  const __m512d c45 = _mm512_fmadd_pd(r, _mm512_set1_pd(kC5), _mm512_set1_pd(kC4));
  const __m512d low = _mm512_fmadd_pd(c23, r2, tail_r);
  const __m512d tmp = _mm512_fmadd_pd(_mm512_mul_pd(r2, r2), c45, low);
  const __m512d scale = _mm512_castsi512_pd(scale_bits);
  return _mm512_fmadd_pd(scale, tmp, scale);
}

AVX512 void exp_doubles_avx512(const double* x, double* out, int n) {
  const ExpTable& t = table();
  int k = 0;
  for (; k + 8 <= n; k += 8) {
    alignas(64) double in[8];
    const __m512d v = _mm512_loadu_pd(x + k);
    _mm512_store_pd(in, v);
    __mmask8 outside = 0;
    _mm512_storeu_pd(out + k, exp_main_path8(v, t, &outside));
    if (outside != 0)
      for (int lane = 0; lane < 8; ++lane)
        if (outside & (1 << lane)) out[k + lane] = std::exp(in[lane]);
  }
  exp_doubles_avx2(x + k, out + k, n - k);
}

// exp_differences' loops: exp(double(x[k]) - shift) into out and into the sum lanes.
AVX2_FMA void exp_differences_avx2(const float* x, double shift, double* out, int n, double (&lanes)[kExpSumLanes]) {
  const ExpTable& t = table();
  const __m256d s = _mm256_set1_pd(shift);
  __m256d low = _mm256_loadu_pd(lanes), high = _mm256_loadu_pd(lanes + 4);
  int k = 0;
  for (; k + 8 <= n; k += 8) {
    __m256d halves[2];
    for (int h = 0; h < 2; ++h) {
      const __m256d v = _mm256_sub_pd(_mm256_cvtps_pd(_mm_loadu_ps(x + k + 4 * h)), s);
      int outside = 0;
      halves[h] = exp_main_path(v, t, &outside);
      if (outside != 0) {
        alignas(32) double in[4], e[4];
        _mm256_store_pd(in, v);
        _mm256_store_pd(e, halves[h]);
        for (int lane = 0; lane < 4; ++lane)
          if (outside & (1 << lane)) e[lane] = std::exp(in[lane]);
        halves[h] = _mm256_load_pd(e);
      }
      _mm256_storeu_pd(out + k + 4 * h, halves[h]);
    }
    low = _mm256_add_pd(low, halves[0]);
    high = _mm256_add_pd(high, halves[1]);
  }
  _mm256_storeu_pd(lanes, low);
  _mm256_storeu_pd(lanes + 4, high);
  for (int lane = 0; k < n; ++k, ++lane) lanes[lane] += out[k] = std::exp(static_cast<double>(x[k]) - shift);
}

AVX512 void exp_differences_avx512(const float* x, double shift, double* out, int n,
                                   double (&lanes)[kExpSumLanes]) {
  const ExpTable& t = table();
  const __m512d s = _mm512_set1_pd(shift);
  __m512d sum = _mm512_loadu_pd(lanes);
  int k = 0;
  for (; k + 8 <= n; k += 8) {
    const __m512d v = _mm512_sub_pd(_mm512_cvtps_pd(_mm256_loadu_ps(x + k)), s);
    __mmask8 outside = 0;
    __m512d e = exp_main_path8(v, t, &outside);
    if (outside != 0) {
      alignas(64) double in[8], fixed[8];
      _mm512_store_pd(in, v);
      _mm512_store_pd(fixed, e);
      for (int lane = 0; lane < 8; ++lane)
        if (outside & (1 << lane)) fixed[lane] = std::exp(in[lane]);
      e = _mm512_load_pd(fixed);
    }
    _mm512_storeu_pd(out + k, e);
    sum = _mm512_add_pd(sum, e);
  }
  _mm512_storeu_pd(lanes, sum);
  for (int lane = 0; k < n; ++k, ++lane) lanes[lane] += out[k] = std::exp(static_cast<double>(x[k]) - shift);
}

// Eight lanes where the CPU has AVX-512 and ATEN_CPU_CAPABILITY allows it (avx2 or
// default keep the four-lane loop, as matvec.h's kernels do).
bool use_avx512() {
  static const bool use = [] {
    const char* capability = std::getenv("ATEN_CPU_CAPABILITY");
    const std::string named = capability ? capability : "";
    return __builtin_cpu_supports("avx512f") && named != "avx2" && named != "default";
  }();
  return use;
}
#endif

// The vector loop against std::exp on about a million doubles spread over every binade
// of the main path, the specials and the path's ends: a few milliseconds, once per process.
bool vector_loop_matches_exp() {
#ifdef KVEVICT_DOUBLE_EXP_AVX2
  if (!vector_exp_supported() || !table().exact) return false;
  std::vector<double> in = exp_main_path_doubles(uint64_t{1} << 40, 12345);
  for (double v : {0.0, -0.0, 0x1p-54, -0x1p-54, 0x1.fffffffffffffp-55, 511.9999, 512.0, -512.0, 709.7, 709.8,
                   -745.1, -745.2, std::numeric_limits<double>::infinity(), -std::numeric_limits<double>::infinity(),
                   std::numeric_limits<double>::quiet_NaN()})
    in.push_back(v);
  std::vector<double> vector_out(in.size()), libm_out(in.size());
  exp_doubles_vector(in.data(), vector_out.data(), static_cast<int>(in.size()));
  for (size_t k = 0; k < in.size(); ++k) libm_out[k] = std::exp(in[k]);
  return std::memcmp(vector_out.data(), libm_out.data(), in.size() * sizeof(double)) == 0;
#else
  return false;
#endif
}

}  // namespace

std::vector<double> exp_main_path_doubles(uint64_t stride, uint64_t offset) {
  std::vector<double> doubles;
  constexpr uint64_t kMantissa = (uint64_t{1} << 52) - 1;
  for (uint64_t sign : {uint64_t{0}, uint64_t{1} << 63})
    for (uint64_t exponent = 0x3c9; exponent < 0x408; ++exponent)  // binades 2^-54 .. 2^8
      for (uint64_t mantissa = offset % stride; mantissa <= kMantissa; mantissa += stride) {
        const uint64_t pattern = sign | exponent << 52 | mantissa;
        double v;
        std::memcpy(&v, &pattern, sizeof v);
        doubles.push_back(v);
      }
  return doubles;
}

bool vector_exp_supported() {
#ifdef KVEVICT_DOUBLE_EXP_AVX2
  static const bool supported = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return supported;
#else
  return false;
#endif
}

bool vector_exp_in_use() {
  static const bool in_use = vector_loop_matches_exp();
  return in_use;
}

void exp_doubles_vector(const double* x, double* out, int n) {
#ifdef KVEVICT_DOUBLE_EXP_AVX2
  if (vector_exp_supported()) return use_avx512() ? exp_doubles_avx512(x, out, n) : exp_doubles_avx2(x, out, n);
#endif
  for (int k = 0; k < n; ++k) out[k] = std::exp(x[k]);
}

void exp_differences(const float* x, double shift, double* out, int n, double (&lanes)[kExpSumLanes]) {
#ifdef KVEVICT_DOUBLE_EXP_AVX2
  if (vector_exp_in_use()) {
    if (use_avx512()) return exp_differences_avx512(x, shift, out, n, lanes);
    return exp_differences_avx2(x, shift, out, n, lanes);
  }
#endif
  for (int k = 0; k < n; ++k) lanes[k % kExpSumLanes] += out[k] = std::exp(static_cast<double>(x[k]) - shift);
}

void exp_doubles(const double* x, double* out, int n) {
  if (vector_exp_in_use())
    exp_doubles_vector(x, out, n);
  else
    for (int k = 0; k < n; ++k) out[k] = std::exp(x[k]);
}

}  // namespace kvevict
