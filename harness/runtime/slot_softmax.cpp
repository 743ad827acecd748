#include "harness/runtime/slot_softmax.h"

#include <algorithm>
#include <limits>

#include "harness/runtime/double_exp.h"
#include "harness/common/float_row_exp.h"

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#define KVEVICT_SLOT_SOFTMAX_AVX2 1
#endif

namespace kvevict {
namespace {

constexpr double kMinusInf = -std::numeric_limits<double>::infinity();
constexpr float kMinusInfF = -std::numeric_limits<float>::infinity();

// The lanes' sums added up: lane j with lane j + 4, then the pairs (0, 2) and (1, 3),
// then the two: the order an AVX2 register's halves add in.
double add_lanes(const double (&acc)[kSumLanes]) {
  const double t0 = acc[0] + acc[4], t1 = acc[1] + acc[5], t2 = acc[2] + acc[6], t3 = acc[3] + acc[7];
  return (t0 + t2) + (t1 + t3);
}

// std::max(m, x): a NaN x leaves m, as maxps/maxpd with x first do.
template <typename T>
T max_keep(T m, T x) {
  return m < x ? x : m;
}

template <typename Scalar>
double max_scalar(const Scalar* x, int n) {
  Scalar lanes[4] = {Scalar(kMinusInf), Scalar(kMinusInf), Scalar(kMinusInf), Scalar(kMinusInf)};
  int s = 0;
  for (; s + 4 <= n; s += 4)
    for (int j = 0; j < 4; ++j) lanes[j] = max_keep(lanes[j], x[s + j]);
  for (; s < n; ++s) lanes[0] = max_keep(lanes[0], x[s]);
  return max_keep(max_keep(lanes[0], lanes[1]), max_keep(lanes[2], lanes[3]));
}

// Adds x[0 .. n-1] to the lanes, x[0] to lane 0: a run that starts at a multiple of
// kSumLanes continues the lanes of the runs before it.
void lane_add_scalar(const double* x, int n, double (&acc)[kSumLanes]) {
  for (int s = 0; s < n; ++s) acc[s % kSumLanes] += x[s];
}

// out[s] = e[s] * inv as a float.
void scale_scalar(const double* e, int n, double inv, float* out) {
  for (int s = 0; s < n; ++s) out[s] = static_cast<float>(e[s] * inv);
}

#ifdef KVEVICT_SLOT_SOFTMAX_AVX2
#define AVX2 __attribute__((target("avx2")))

AVX2 double max_avx2(const float* x, int n) {
  __m256 lanes = _mm256_set1_ps(-std::numeric_limits<float>::infinity());
  int s = 0;
  for (; s + 8 <= n; s += 8) lanes = _mm256_max_ps(_mm256_loadu_ps(x + s), lanes);
  float rest[8];
  _mm256_storeu_ps(rest, lanes);
  float m = rest[0];
  for (int j = 1; j < 8; ++j) m = max_keep(m, rest[j]);
  for (; s < n; ++s) m = max_keep(m, x[s]);
  return m;
}

AVX2 void lane_add_avx2(const double* x, int n, double (&acc)[kSumLanes]) {
  __m256d low = _mm256_loadu_pd(acc), high = _mm256_loadu_pd(acc + 4);  // lanes 0-3, 4-7
  int s = 0;
  for (; s + kSumLanes <= n; s += kSumLanes) {
    low = _mm256_add_pd(low, _mm256_loadu_pd(x + s));
    high = _mm256_add_pd(high, _mm256_loadu_pd(x + s + 4));
  }
  _mm256_storeu_pd(acc, low);
  _mm256_storeu_pd(acc + 4, high);
  for (int j = 0; s < n; ++s, ++j) acc[j] += x[s];
}

AVX2 void scale_avx2(const double* e, int n, double inv, float* out) {
  const __m256d iv = _mm256_set1_pd(inv);
  int s = 0;
  for (; s + 4 <= n; s += 4) _mm_storeu_ps(out + s, _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_loadu_pd(e + s), iv)));
  scale_scalar(e + s, n - s, inv, out + s);
}
#define AVX512 __attribute__((target("avx512f,avx2")))

// The maximum is exact, so its order does not matter: the lanes, then the last 0-15 slots.
AVX512 double max_avx512(const float* x, int n) {
  __m512 lanes = _mm512_set1_ps(-std::numeric_limits<float>::infinity());
  int s = 0;
  for (; s + 16 <= n; s += 16) lanes = _mm512_max_ps(_mm512_loadu_ps(x + s), lanes);
  return max_keep(static_cast<double>(_mm512_reduce_max_ps(lanes)), max_avx2(x + s, n - s));
}

// out[s] = float(double(e[s]) * inv), and row[s] too where row is not null; e may be row.
AVX2 void scale_floats_avx2(const float* e, int n, double inv, float* out, float* row) {
  const __m256d iv = _mm256_set1_pd(inv);
  int s = 0;
  for (; s + 4 <= n; s += 4) {
    const __m128 p = _mm256_cvtpd_ps(_mm256_mul_pd(_mm256_cvtps_pd(_mm_loadu_ps(e + s)), iv));
    _mm_storeu_ps(out + s, p);
    if (row) _mm_storeu_ps(row + s, p);
  }
  for (; s < n; ++s) {
    out[s] = static_cast<float>(static_cast<double>(e[s]) * inv);
    if (row) row[s] = out[s];
  }
}

AVX512 void scale_floats_avx512(const float* e, int n, double inv, float* out, float* row) {
  const __m512d iv = _mm512_set1_pd(inv);
  int s = 0;
  for (; s + 8 <= n; s += 8) {
    const __m256 p = _mm512_cvtpd_ps(_mm512_mul_pd(_mm512_cvtps_pd(_mm256_loadu_ps(e + s)), iv));
    _mm256_storeu_ps(out + s, p);
    if (row) _mm256_storeu_ps(row + s, p);
  }
  scale_floats_avx2(e + s, n - s, inv, out + s, row ? row + s : nullptr);
}
#endif

bool use_avx2() {
#ifdef KVEVICT_SLOT_SOFTMAX_AVX2
  static const bool use = __builtin_cpu_supports("avx2");
  return use;
#else
  return false;
#endif
}

double max_of(const float* x, int n) {
#ifdef KVEVICT_SLOT_SOFTMAX_AVX2
  if (use_avx512()) return max_avx512(x, n);
  if (use_avx2()) return max_avx2(x, n);
#endif
  return max_scalar(x, n);
}

void lane_add(const double* x, int n, double (&acc)[kSumLanes]) {
#ifdef KVEVICT_SLOT_SOFTMAX_AVX2
  if (use_avx2()) return lane_add_avx2(x, n, acc);
#endif
  lane_add_scalar(x, n, acc);
}

void scale_floats(const float* e, int n, double inv, float* out, float* row) {
#ifdef KVEVICT_SLOT_SOFTMAX_AVX2
  if (use_avx512()) return scale_floats_avx512(e, n, inv, out, row);
  if (use_avx2()) return scale_floats_avx2(e, n, inv, out, row);
#endif
  for (int s = 0; s < n; ++s) {
    out[s] = static_cast<float>(static_cast<double>(e[s]) * inv);
    if (row) row[s] = out[s];
  }
}

void scale(const double* e, int n, double inv, float* out) {
#ifdef KVEVICT_SLOT_SOFTMAX_AVX2
  if (use_avx2()) return scale_avx2(e, n, inv, out);
#endif
  scale_scalar(e, n, inv, out);
}

// Whether every slot is seen, and whether slot s sits at column s for every s.
void row_shape(const SlotRow& at, bool* all_seen, bool* in_order) {
  *all_seen = !at.vis;
  if (at.oldest > std::numeric_limits<int64_t>::min())
    for (int s = 0; s < at.slots && *all_seen; ++s) *all_seen = at.positions[s] >= at.oldest;
  int out_of_order = 0;  // no early exit: the loop vectorises
  for (int s = 0; s < at.slots; ++s) out_of_order |= at.columns[s] ^ s;
  *in_order = out_of_order == 0;
}

bool seen(const SlotRow& at, int s) { return at.positions[s] >= at.oldest && (!at.vis || at.vis[s]); }

// A float row: its exponentials in float (float_row_exp.h), their sum in double lanes.
int softmax(float* row, int64_t n, const SlotRow& at, double* seen_flags, float* out) {
  const int slots = at.slots;
  bool all_seen = false, in_order = false;
  row_shape(at, &all_seen, &in_order);
  double acc[kSumLanes] = {};
  if (all_seen) {
    // In order, in place: the row's first `slots` columns become the exponentials, then
    // the shares. Out of order, the same in out, gathered first and scattered after.
    float* x = row;
    if (!in_order) {
      x = out;
      for (int s = 0; s < slots; ++s) x[s] = row[at.columns[s]];
    }
    exp_row_differences(x, static_cast<float>(max_of(x, slots)), x, slots, acc);
    scale_floats(x, slots, 1.0 / add_lanes(acc), out, in_order ? row : nullptr);
    if (in_order) {
      std::fill(row + slots, row + n, 0.0f);
    } else {
      std::fill(row, row + n, 0.0f);
      for (int s = 0; s < slots; ++s) row[at.columns[s]] = out[s];
    }
    return slots;
  }
  // out holds the differences from the maximum (a stand-in on the path for the unseen),
  // then the exponentials, then the shares.
  float lanes[4] = {kMinusInfF, kMinusInfF, kMinusInfF, kMinusInfF};
  for (int s = 0; s < slots; ++s) {
    seen_flags[s] = seen(at, s);
    out[s] = row[at.columns[s]];
    if (seen_flags[s] != 0.0) lanes[s & 3] = max_keep(lanes[s & 3], out[s]);
  }
  const float m = max_keep(max_keep(lanes[0], lanes[1]), max_keep(lanes[2], lanes[3]));
  for (int s = 0; s < slots; ++s) out[s] = seen_flags[s] != 0.0 ? out[s] - m : -1.0f;
  exp_floats(out, out, slots);
  int count = 0;
  for (int s = 0; s < slots; ++s) {
    const bool is_seen = seen_flags[s] != 0.0;
    out[s] = is_seen ? out[s] : 0.0f;
    acc[s % kSumLanes] += static_cast<double>(out[s]);
    count += is_seen;
  }
  scale_floats(out, slots, 1.0 / add_lanes(acc), out, nullptr);
  std::fill(row, row + n, 0.0f);
  for (int s = 0; s < slots; ++s) row[at.columns[s]] = out[s];
  return count;
}

// A double row (float64 reference runs): its exponentials in double (double_exp.h).
int softmax(double* row, int64_t n, const SlotRow& at, double* e, float* out) {
  const int slots = at.slots;
  bool all_seen = false, in_order = false;
  row_shape(at, &all_seen, &in_order);
  double lanes[4] = {kMinusInf, kMinusInf, kMinusInf, kMinusInf};
  for (int s = 0; s < slots; ++s) {
    const double x = row[in_order ? s : at.columns[s]];
    out[s] = all_seen || seen(at, s);  // whether each slot is seen, until the shares
    e[s] = x;
    if (out[s] != 0.0f) lanes[s & 3] = max_keep(lanes[s & 3], x);
  }
  const double m = max_keep(max_keep(lanes[0], lanes[1]), max_keep(lanes[2], lanes[3]));
  for (int s = 0; s < slots; ++s) e[s] = out[s] != 0.0f ? e[s] - m : -1.0;
  exp_doubles(e, e, slots);
  int count = 0;
  for (int s = 0; s < slots; ++s) {
    const bool is_seen = out[s] != 0.0f;
    e[s] = is_seen ? e[s] : 0.0;
    count += is_seen;
  }
  double acc[kSumLanes] = {};
  lane_add(e, slots, acc);
  const double inv = 1.0 / add_lanes(acc);
  scale(e, slots, inv, out);
  std::fill(row, row + n, 0.0);
  for (int s = 0; s < slots; ++s) row[in_order ? s : at.columns[s]] = e[s] * inv;
  return count;
}

}  // namespace

double lane_sum_scalar(const double* x, int n) {
  double acc[kSumLanes] = {};
  lane_add_scalar(x, n, acc);
  return add_lanes(acc);
}

double lane_sum(const double* x, int n) {
  double acc[kSumLanes] = {};
  lane_add(x, n, acc);
  return add_lanes(acc);
}

int slot_softmax(float* row, int64_t n, const SlotRow& at, double* exps, float* out) {
  return softmax(row, n, at, exps, out);
}

int slot_softmax(double* row, int64_t n, const SlotRow& at, double* exps, float* out) {
  return softmax(row, n, at, exps, out);
}

}  // namespace kvevict
