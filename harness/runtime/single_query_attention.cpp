#include "harness/runtime/single_query_attention.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <vector>

#if defined(__x86_64__) && defined(__GNUC__)
#include <immintrin.h>
#endif

#include "harness/model/bfloat16_bits.h"

namespace kvevict {
namespace {

// Below this many multiply-adds a head stays on the calling thread with the others (a
// thread hand-off costs more); a batched step's sequences are already spread over the threads.
constexpr int64_t kHeadsApartMin = int64_t{1} << 16;

// Each logit and each weighted value is a chain of fused multiply-adds in a fixed order:
// the logit's eight partial sums take elements i, i+8, ... in turn and combine in a fixed
// tree; a value element sums over the keys in key order. An FMA rounds once, so the AVX2
// build of these loops and the portable one (std::fma) give the same bits.

// logits[j] = (q . keys[j]) * scale for j < n; keys [n, d].
template <typename T>
void portable_head_logits(const float* q, const T* keys, int64_t n, int64_t d, float scale, float* logits) {
  for (int64_t j = 0; j < n; ++j) {
    const T* k = keys + j * d;
    float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
    int64_t i = 0;
    for (; i + 8 <= d; i += 8)
      for (int lane = 0; lane < 8; ++lane) acc[lane] = std::fma(q[i + lane], widen(k[i + lane]), acc[lane]);
    float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
    for (; i < d; ++i) sum = std::fma(q[i], widen(k[i]), sum);
    logits[j] = sum * scale;
  }
}

// sum[c] = the sum over j < n of probs[j] * values[j][c]; values [n, d]. The compiler
// vectorises it over c as it is, so the AVX2 build is the same loop.
#define KVEVICT_HEAD_VALUES(NAME, ATTRIBUTES)                                                          \
  template <typename T>                                                                               \
  ATTRIBUTES void NAME(const float* probs, const T* values, int64_t n, int64_t d, float* sum) {       \
    for (int64_t c = 0; c < d; ++c) sum[c] = 0.0f;                                                    \
    for (int64_t j = 0; j < n; ++j)                                                                   \
      for (int64_t c = 0; c < d; ++c) sum[c] = std::fma(probs[j], widen(values[j * d + c]), sum[c]); \
  }
KVEVICT_HEAD_VALUES(portable_head_values, )

#if defined(__x86_64__) && defined(__GNUC__)
KVEVICT_HEAD_VALUES(avx2_head_values_loop, __attribute__((target("avx2,fma"))))

__attribute__((target("avx2,fma"))) inline __m256 load8(const float* p) { return _mm256_loadu_ps(p); }
__attribute__((target("avx2,fma"))) inline __m256 load8(const uint16_t* p) {
  const __m128i bits = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(bits), 16));
}

// Columns col .. col+8C-1 of portable_head_values, their sums held in C registers over
// all n keys (the loop above, which may not assume that sum and values do not overlap,
// loaded and stored every sum at every key).
template <int C, typename T>
__attribute__((target("avx2,fma"))) void head_value_columns(const float* probs, const T* values, int64_t n, int64_t d,
                                                            int64_t col, float* sum) {
  __m256 acc[C];  // [8-column group]
  for (int c = 0; c < C; ++c) acc[c] = _mm256_setzero_ps();
  for (int64_t j = 0; j < n; ++j) {
    const __m256 p = _mm256_set1_ps(probs[j]);
    const T* row = values + j * d + col;
    for (int c = 0; c < C; ++c) acc[c] = _mm256_fmadd_ps(p, load8(row + 8 * c), acc[c]);
  }
  for (int c = 0; c < C; ++c) _mm256_storeu_ps(sum + col + 8 * c, acc[c]);
}

// portable_head_values in AVX2: each element's chain of FMAs over the keys, in key order.
template <typename T>
__attribute__((target("avx2,fma"))) void avx2_head_values(const float* probs, const T* values, int64_t n, int64_t d,
                                                          float* sum) {
  if (d % 8 != 0) return avx2_head_values_loop(probs, values, n, d, sum);
  int64_t col = 0;
  for (; col + 64 <= d; col += 64) head_value_columns<8>(probs, values, n, d, col, sum);
  switch ((d - col) / 8) {
    case 7: head_value_columns<7>(probs, values, n, d, col, sum); break;
    case 6: head_value_columns<6>(probs, values, n, d, col, sum); break;
    case 5: head_value_columns<5>(probs, values, n, d, col, sum); break;
    case 4: head_value_columns<4>(probs, values, n, d, col, sum); break;
    case 3: head_value_columns<3>(probs, values, n, d, col, sum); break;
    case 2: head_value_columns<2>(probs, values, n, d, col, sum); break;
    case 1: head_value_columns<1>(probs, values, n, d, col, sum); break;
    default: break;
  }
}

// portable_head_logits with the eight partial sums as the lanes of one register (the
// compiler left them scalar): the same FMAs in the same order, so the same bits. Eight
// keys at a time: one key's chain of d/8 dependent FMAs left the FMA units idle (the
// logits of a batch-32 float32 decode step ran at about 2 multiply-adds a cycle).
// Their eight registers are transposed, so that lane j of each add in the tree below is
// key j's scalar add of the same partial sums.
template <typename T>
__attribute__((target("avx2,fma"))) void avx2_head_logits(const float* q, const T* keys, int64_t n, int64_t d,
                                                          float scale, float* logits) {
  constexpr int kKeys = 8;
  const int64_t whole = d / 8 * 8;
  int64_t j = 0;
  if (whole == d)
    for (; j + kKeys <= n; j += kKeys) {
      __m256 acc[kKeys];  // [key]: its eight partial sums
      for (int k = 0; k < kKeys; ++k) acc[k] = _mm256_setzero_ps();
      for (int64_t i = 0; i < d; i += 8) {
        const __m256 qv = _mm256_loadu_ps(q + i);
        for (int k = 0; k < kKeys; ++k) acc[k] = _mm256_fmadd_ps(qv, load8(keys + (j + k) * d + i), acc[k]);
      }
      // Transpose: part[p] holds partial sum p of the eight keys (lane k: key j+k).
      const __m256 t0 = _mm256_unpacklo_ps(acc[0], acc[1]), t1 = _mm256_unpackhi_ps(acc[0], acc[1]);
      const __m256 t2 = _mm256_unpacklo_ps(acc[2], acc[3]), t3 = _mm256_unpackhi_ps(acc[2], acc[3]);
      const __m256 t4 = _mm256_unpacklo_ps(acc[4], acc[5]), t5 = _mm256_unpackhi_ps(acc[4], acc[5]);
      const __m256 t6 = _mm256_unpacklo_ps(acc[6], acc[7]), t7 = _mm256_unpackhi_ps(acc[6], acc[7]);
      const __m256 u0 = _mm256_shuffle_ps(t0, t2, 0x44), u1 = _mm256_shuffle_ps(t0, t2, 0xEE);
      const __m256 u2 = _mm256_shuffle_ps(t1, t3, 0x44), u3 = _mm256_shuffle_ps(t1, t3, 0xEE);
      const __m256 u4 = _mm256_shuffle_ps(t4, t6, 0x44), u5 = _mm256_shuffle_ps(t4, t6, 0xEE);
      const __m256 u6 = _mm256_shuffle_ps(t5, t7, 0x44), u7 = _mm256_shuffle_ps(t5, t7, 0xEE);
      const __m256 part[8] = {_mm256_permute2f128_ps(u0, u4, 0x20), _mm256_permute2f128_ps(u1, u5, 0x20),
                              _mm256_permute2f128_ps(u2, u6, 0x20), _mm256_permute2f128_ps(u3, u7, 0x20),
                              _mm256_permute2f128_ps(u0, u4, 0x31), _mm256_permute2f128_ps(u1, u5, 0x31),
                              _mm256_permute2f128_ps(u2, u6, 0x31), _mm256_permute2f128_ps(u3, u7, 0x31)};
      const __m256 sum = _mm256_add_ps(_mm256_add_ps(_mm256_add_ps(part[0], part[1]), _mm256_add_ps(part[2], part[3])),
                                       _mm256_add_ps(_mm256_add_ps(part[4], part[5]), _mm256_add_ps(part[6], part[7])));
      _mm256_storeu_ps(logits + j, _mm256_mul_ps(sum, _mm256_set1_ps(scale)));
    }
  for (; j < n; ++j) {
    const T* k = keys + j * d;
    __m256 acc = _mm256_setzero_ps();
    int64_t i = 0;
    for (; i + 8 <= d; i += 8) acc = _mm256_fmadd_ps(_mm256_loadu_ps(q + i), load8(k + i), acc);
    float a[8];
    _mm256_storeu_ps(a, acc);
    float sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
    for (; i < d; ++i) sum = std::fma(q[i], widen(k[i]), sum);
    logits[j] = sum * scale;
  }
}

bool use_avx2() {
  static const bool has = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma");
  return has;
}
#else
bool use_avx2() { return false; }
#define avx2_head_logits portable_head_logits
#define avx2_head_values portable_head_values
#endif
#undef KVEVICT_HEAD_VALUES

// T: the cache's element (float or bfloat16 bits); Out likewise for the output.
template <typename T, typename Out>
void attend(const T* q_in, const T* keys, const T* values, int64_t hq, int64_t hkv, int64_t capacity, int64_t d,
            int64_t n, const std::function<const float*(float*)>& probabilities, Out* out) {
  const int64_t group = hq / hkv;
  const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
  std::vector<float> q(static_cast<size_t>(hq * d));  // [Hq, d] in float32
  for (int64_t i = 0; i < hq * d; ++i) q[i] = widen(q_in[i]);
  std::vector<float> logits(static_cast<size_t>(hq * n));  // [Hq, n]
  const int64_t grain = std::max<int64_t>(1, kHeadsApartMin / std::max<int64_t>(1, n * d));
  at::parallel_for(0, hq, grain, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      const T* head_keys = keys + (h / group) * capacity * d;
      if (use_avx2())
        avx2_head_logits(q.data() + h * d, head_keys, n, d, scale, logits.data() + h * n);
      else
        portable_head_logits(q.data() + h * d, head_keys, n, d, scale, logits.data() + h * n);
    }
  });
  const float* probs = probabilities(logits.data());  // [Hq, n]
  at::parallel_for(0, hq, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(static_cast<size_t>(d));  // [d]: element c sums over the keys in order
    for (int64_t h = begin; h < end; ++h) {
      const T* head_values = values + (h / group) * capacity * d;
      if (use_avx2())
        avx2_head_values(probs + h * n, head_values, n, d, sum.data());
      else
        portable_head_values(probs + h * n, head_values, n, d, sum.data());
      for (int64_t c = 0; c < d; ++c) {
        if constexpr (std::is_same_v<Out, float>)
          out[h * d + c] = sum[c];
        else
          out[h * d + c] = bf16_bits(sum[c]);
      }
    }
  });
}

}  // namespace

bool single_query_supported(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values) {
  const auto type = q.scalar_type();
  if (type != torch::kFloat32 && type != torch::kBFloat16) return false;
  if (!q.device().is_cpu() || q.dim() != 3 || q.size(0) != 1 || !q.is_contiguous()) return false;
  for (const torch::Tensor* buffer : {&keys, &values})
    if (buffer->scalar_type() != type || !buffer->device().is_cpu() || buffer->dim() != 3 || !buffer->is_contiguous() ||
        buffer->size(2) != q.size(2))
      return false;
  return keys.size(0) > 0 && q.size(1) % keys.size(0) == 0 && keys.sizes() == values.sizes();
}

torch::Tensor single_query_attention(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                                     int64_t n, const std::function<const float*(float* logits)>& probabilities) {
  const int64_t hq = q.size(1), d = q.size(2), hkv = keys.size(0), capacity = keys.size(1);
  auto out = torch::empty({1, hq * d}, q.options());
  if (q.scalar_type() == torch::kFloat32) {
    attend(q.data_ptr<float>(), keys.data_ptr<float>(), values.data_ptr<float>(), hq, hkv, capacity, d, n,
           probabilities, out.data_ptr<float>());
  } else {
    auto bits = [](const torch::Tensor& t) { return reinterpret_cast<const uint16_t*>(t.data_ptr<at::BFloat16>()); };
    attend(bits(q), bits(keys), bits(values), hq, hkv, capacity, d, n, probabilities,
           reinterpret_cast<uint16_t*>(out.data_ptr<at::BFloat16>()));
  }
  return out;
}

}  // namespace kvevict
