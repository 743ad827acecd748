#include "harness/runtime/double_exp.h"

#include <gmp.h>

#include <cmath>
#include <cstdint>
#include <cstdlib>
#include <string>

#include "harness/common/bit_cast.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVEVICT_DOUBLE_EXP_AVX2 1
#endif

namespace kvevict {
namespace {

constexpr int kTableBits = 4, kTableSize = 1 << kTableBits;  // 2^(j/16)

// The double nearest the positive integer q times 2^scale (q has far more than 53 bits).
double nearest_double(const mpz_t q, long scale) {
  const long drop = static_cast<long>(mpz_sizeinbase(q, 2)) - 53;
  mpz_t top;
  mpz_init(top);
  mpz_fdiv_q_2exp(top, q, drop);
  if (mpz_tstbit(q, drop - 1)) mpz_add_ui(top, top, 1);
  const double out = std::ldexp(static_cast<double>(mpz_get_ui(top)), static_cast<int>(drop + scale));
  mpz_clear(top);
  return out;
}

// The table: for j < 16, H = the double nearest 2^(j/16) and tail = the double nearest
// (2^(j/16) - H) / H, both from integer roots, so exactly rounded. Stored as tail's bits
// and as H's bits less j << 48: adding k << 48 for k = 16 q + j then puts q in H's exponent.
struct ExpTable {
  alignas(64) uint64_t tail[kTableSize];
  alignas(64) uint64_t scale[kTableSize];
  ExpTable() {
    constexpr long kBits = 200;  // X = floor(2^(200 + j/16)), an integer 16th root
    mpz_t power, x, h, d, q;
    mpz_inits(power, x, h, d, q, nullptr);
    for (int j = 0; j < kTableSize; ++j) {
      mpz_ui_pow_ui(power, 2, static_cast<unsigned long>(kBits * kTableSize + j));
      mpz_root(x, power, kTableSize);
      // H: X's top 53 bits, rounded to nearest (X lies in [2^200, 2^201)).
      mpz_fdiv_q_2exp(h, x, kBits - 52);
      if (mpz_tstbit(x, kBits - 53)) mpz_add_ui(h, h, 1);
      const double H = std::ldexp(static_cast<double>(mpz_get_ui(h)), -52);
      // tail = (X - H * 2^200) / (H * 2^200), its magnitude to 128 more bits than it has.
      mpz_mul_2exp(d, h, kBits - 52);
      mpz_sub(d, x, d);
      double t = 0.0;
      if (mpz_sgn(d) != 0) {
        const int sign = mpz_sgn(d);
        mpz_abs(d, d);
        mpz_mul_2exp(d, d, 128);
        mpz_fdiv_q(q, d, h);  // |tail| = q * 2^-(148 + 128)
        t = nearest_double(q, -(kBits - 52) - 128);
        t = sign < 0 ? -t : t;
      }
      tail[j] = bit_cast<uint64_t>(t);
      scale[j] = bit_cast<uint64_t>(H) - (static_cast<uint64_t>(j) << (52 - kTableBits));
    }
    mpz_clears(power, x, h, d, q, nullptr);
  }
};

const ExpTable& table() {
  static const ExpTable t;
  return t;
}

// 16 / ln 2; ln 2 / 16 in two parts (the high part's 32 low bits zero, so k times it is
// exact for |k| < 2^20); 1/n! for the polynomial; the rounding shift.
constexpr double kInvLn2N = 0x1.71547652b82fep+4;
constexpr double kNegLn2HiN = -0x1.62e42fefa0000p-5, kNegLn2LoN = -0x1.cf79abc9e3b3ap-44;
constexpr double kC2 = 1.0 / 2, kC3 = 1.0 / 6, kC4 = 1.0 / 24, kC5 = 1.0 / 120, kC6 = 1.0 / 720, kC7 = 1.0 / 5040;
constexpr double kShift = 0x1.8p+52;
// The path: |x| < 708 keeps 2^(k/16) normal. Outside it (and for NaN) std::exp.
constexpr double kPathEnd = 708.0;

// One double through the path, in the operations the vector loops use, each rounded as
// they round it (this file compiles with -ffp-contract=off).
double exp_on_path(double x) {
  const ExpTable& t = table();
  double kd = std::fma(x, kInvLn2N, kShift);
  const uint64_t ki = bit_cast<uint64_t>(kd);
  kd = kd - kShift;
  double r = std::fma(kd, kNegLn2HiN, x);
  r = std::fma(kd, kNegLn2LoN, r);
  const uint64_t j = ki & (kTableSize - 1);
  const double tail = bit_cast<double>(t.tail[j]);
  const double scale = bit_cast<double>(t.scale[j] + (ki << (52 - kTableBits)));
  const double r2 = r * r;
  const double c23 = std::fma(r, kC3, kC2);
  const double c45 = std::fma(r, kC5, kC4);
  const double c67 = std::fma(r, kC7, kC6);
  const double r4 = r2 * r2;
  const double c47 = std::fma(r2, c67, c45);
  const double low = std::fma(r2, c23, r + tail);
  const double tmp = std::fma(r4, c47, low);
  return std::fma(scale, tmp, scale);
}

double exp_scalar(double x) { return std::fabs(x) < kPathEnd ? exp_on_path(x) : std::exp(x); }

#ifdef KVEVICT_DOUBLE_EXP_AVX2
#define AVX2_FMA __attribute__((target("avx2,fma")))

// exp_on_path on four doubles. outside: a bit per lane off the path.
AVX2_FMA inline __m256d exp_path4(__m256d x, const ExpTable& t, int* outside) {
  const __m256d abs = _mm256_andnot_pd(_mm256_set1_pd(-0.0), x);
  *outside = _mm256_movemask_pd(_mm256_cmp_pd(abs, _mm256_set1_pd(kPathEnd), _CMP_NLT_UQ));
  const __m256d shift = _mm256_set1_pd(kShift);
  __m256d kd = _mm256_fmadd_pd(x, _mm256_set1_pd(kInvLn2N), shift);
  const __m256i ki = _mm256_castpd_si256(kd);
  kd = _mm256_sub_pd(kd, shift);
  __m256d r = _mm256_fmadd_pd(kd, _mm256_set1_pd(kNegLn2HiN), x);
  r = _mm256_fmadd_pd(kd, _mm256_set1_pd(kNegLn2LoN), r);
  const __m256i j = _mm256_and_si256(ki, _mm256_set1_epi64x(kTableSize - 1));
  const __m256d tail = _mm256_i64gather_pd(reinterpret_cast<const double*>(t.tail), j, 8);
  const __m256d scale = _mm256_castsi256_pd(_mm256_add_epi64(
      _mm256_i64gather_epi64(reinterpret_cast<const long long*>(t.scale), j, 8), _mm256_slli_epi64(ki, 52 - kTableBits)));
  const __m256d r2 = _mm256_mul_pd(r, r);
  const __m256d c23 = _mm256_fmadd_pd(r, _mm256_set1_pd(kC3), _mm256_set1_pd(kC2));
  const __m256d c45 = _mm256_fmadd_pd(r, _mm256_set1_pd(kC5), _mm256_set1_pd(kC4));
  const __m256d c67 = _mm256_fmadd_pd(r, _mm256_set1_pd(kC7), _mm256_set1_pd(kC6));
  const __m256d r4 = _mm256_mul_pd(r2, r2);
  const __m256d c47 = _mm256_fmadd_pd(r2, c67, c45);
  const __m256d low = _mm256_fmadd_pd(r2, c23, _mm256_add_pd(r, tail));
  const __m256d tmp = _mm256_fmadd_pd(r4, c47, low);
  return _mm256_fmadd_pd(scale, tmp, scale);
}

// The lanes off the path, from std::exp.
AVX2_FMA inline __m256d fix_outside4(__m256d x, __m256d e, int outside) {
  if (outside == 0) return e;
  alignas(32) double in[4], out[4];
  _mm256_store_pd(in, x);
  _mm256_store_pd(out, e);
  for (int lane = 0; lane < 4; ++lane)
    if (outside & (1 << lane)) out[lane] = std::exp(in[lane]);
  return _mm256_load_pd(out);
}

AVX2_FMA void exp_doubles_avx2(const double* x, double* out, int n) {
  const ExpTable& t = table();
  int k = 0;
  for (; k + 4 <= n; k += 4) {
    const __m256d v = _mm256_loadu_pd(x + k);
    int outside = 0;
    const __m256d e = exp_path4(v, t, &outside);
    _mm256_storeu_pd(out + k, fix_outside4(v, e, outside));
  }
  for (; k < n; ++k) out[k] = exp_scalar(x[k]);
}

#define AVX512 __attribute__((target("avx512f,avx2,fma")))

// exp_path4 on eight doubles: the same operations, the table from two registers.
struct Table8 {
  __m512d tail_low, tail_high;
  __m512i scale_low, scale_high;
};

AVX512 inline Table8 table8(const ExpTable& t) {
  return {_mm512_castsi512_pd(_mm512_load_si512(t.tail)), _mm512_castsi512_pd(_mm512_load_si512(t.tail + 8)),
          _mm512_load_si512(t.scale), _mm512_load_si512(t.scale + 8)};
}

AVX512 inline __m512d exp_path8(__m512d x, const Table8& t, __mmask8* outside) {
  const __m512d abs = _mm512_abs_pd(x);
  *outside = _mm512_cmp_pd_mask(abs, _mm512_set1_pd(kPathEnd), _CMP_NLT_UQ);
  const __m512d shift = _mm512_set1_pd(kShift);
  __m512d kd = _mm512_fmadd_pd(x, _mm512_set1_pd(kInvLn2N), shift);
  const __m512i ki = _mm512_castpd_si512(kd);
  kd = _mm512_sub_pd(kd, shift);
  __m512d r = _mm512_fmadd_pd(kd, _mm512_set1_pd(kNegLn2HiN), x);
  r = _mm512_fmadd_pd(kd, _mm512_set1_pd(kNegLn2LoN), r);
  // Two-register permutes read the index's low four bits: j.
  const __m512d tail = _mm512_permutex2var_pd(t.tail_low, ki, t.tail_high);
  const __m512d scale = _mm512_castsi512_pd(_mm512_add_epi64(_mm512_permutex2var_epi64(t.scale_low, ki, t.scale_high),
                                                             _mm512_slli_epi64(ki, 52 - kTableBits)));
  const __m512d r2 = _mm512_mul_pd(r, r);
  const __m512d c23 = _mm512_fmadd_pd(r, _mm512_set1_pd(kC3), _mm512_set1_pd(kC2));
  const __m512d c45 = _mm512_fmadd_pd(r, _mm512_set1_pd(kC5), _mm512_set1_pd(kC4));
  const __m512d c67 = _mm512_fmadd_pd(r, _mm512_set1_pd(kC7), _mm512_set1_pd(kC6));
  const __m512d r4 = _mm512_mul_pd(r2, r2);
  const __m512d c47 = _mm512_fmadd_pd(r2, c67, c45);
  const __m512d low = _mm512_fmadd_pd(r2, c23, _mm512_add_pd(r, tail));
  const __m512d tmp = _mm512_fmadd_pd(r4, c47, low);
  return _mm512_fmadd_pd(scale, tmp, scale);
}

AVX512 inline __m512d fix_outside8(__m512d x, __m512d e, __mmask8 outside) {
  if (outside == 0) return e;
  alignas(64) double in[8], out[8];
  _mm512_store_pd(in, x);
  _mm512_store_pd(out, e);
  for (int lane = 0; lane < 8; ++lane)
    if (outside & (1 << lane)) out[lane] = std::exp(in[lane]);
  return _mm512_load_pd(out);
}

// Eight lanes a step, the last step's lanes past n masked off.
AVX512 void exp_doubles_avx512(const double* x, double* out, int n) {
  const Table8 t = table8(table());
  for (int k = 0; k < n; k += 8) {
    const __mmask8 lanes = n - k >= 8 ? 0xff : static_cast<__mmask8>((1u << (n - k)) - 1);
    const __m512d v = _mm512_maskz_loadu_pd(lanes, x + k);
    __mmask8 outside = 0;
    const __m512d e = exp_path8(v, t, &outside);
    _mm512_mask_storeu_pd(out + k, lanes, fix_outside8(v, e, outside & lanes));
  }
}

#endif

}  // namespace

std::vector<double> exp_main_path_doubles(uint64_t stride, uint64_t offset) {
  std::vector<double> doubles;
  constexpr uint64_t kMantissa = (uint64_t{1} << 52) - 1;
  for (uint64_t sign : {uint64_t{0}, uint64_t{1} << 63})
    for (uint64_t exponent = 0x3c9; exponent < 0x408; ++exponent)  // binades 2^-54 .. 2^8
      for (uint64_t mantissa = offset % stride; mantissa <= kMantissa; mantissa += stride) {
        const uint64_t pattern = sign | exponent << 52 | mantissa;
        doubles.push_back(bit_cast<double>(pattern));
      }
  return doubles;
}

void exp_doubles_scalar(const double* x, double* out, int n) {
  for (int k = 0; k < n; ++k) out[k] = exp_scalar(x[k]);
}

void exp_doubles(const double* x, double* out, int n) {
#ifdef KVEVICT_DOUBLE_EXP_AVX2
  if (cpu_has_avx2_fma()) return use_avx512() ? exp_doubles_avx512(x, out, n) : exp_doubles_avx2(x, out, n);
#endif
  exp_doubles_scalar(x, out, n);
}

}  // namespace kvevict
