#include "harness/runtime/causal_softmax.h"

#include <ATen/Parallel.h>
#include <ATen/Version.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <limits>
#include <string>

#if defined(__x86_64__) && defined(__GNUC__) && defined(KVEVICT_HAVE_SLEEF)
#include <immintrin.h>
#define KVEVICT_CAUSAL_SOFTMAX_AVX2 1
// sleef.h declares it only when the whole file is built for AVX; this one function is.
extern "C" __m256 Sleef_expf8_u10(__m256);
#endif

namespace kvevict {
namespace {

constexpr float kHidden = -std::numeric_limits<float>::infinity();

// The keys row r may not see: [0, hidden_before) (the window) and [visible_end, n).
struct RowSpan {
  int64_t hidden_before = 0;
  int64_t visible_end = 0;
};

RowSpan row_span(const CausalRows& mask, int64_t r, int64_t n) {
  const int64_t query = mask.first_query + r % mask.rows;
  RowSpan span;
  span.visible_end = std::min(n, query + 1);
  if (mask.window > 0 && query - mask.window >= 0) span.hidden_before = std::min(n, query - mask.window + 1);
  return span;
}

// Sets the hidden keys of every row to -inf, as contiguous runs (the per-element
// masked_fill_ loop was about a sixth of stories260K's RTE time).
template <typename Scalar>
void fill_hidden(Scalar* logits, int64_t total_rows, int64_t n, const CausalRows& mask) {
  const Scalar hidden = -std::numeric_limits<Scalar>::infinity();
  for (int64_t r = 0; r < total_rows; ++r) {
    const RowSpan span = row_span(mask, r, n);
    Scalar* row = logits + r * n;
    std::fill(row, row + span.hidden_before, hidden);
    std::fill(row + span.visible_end, row + n, hidden);
  }
}

#ifdef KVEVICT_CAUSAL_SOFTMAX_AVX2
#define AVX2_FN __attribute__((target("avx2,fma")))

// ATen's Vectorized<float> (AVX2) operations, one for one.
AVX2_FN inline __m256 load_first(const float* p, int64_t count) {  // loadu(p, count): zeros after
  alignas(32) float lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  std::memcpy(lanes, p, static_cast<size_t>(count) * sizeof(float));
  return _mm256_load_ps(lanes);
}
AVX2_FN inline void store_first(float* p, __m256 v, int64_t count) {  // store(p, count)
  alignas(32) float lanes[8];
  _mm256_store_ps(lanes, v);
  std::memcpy(p, lanes, static_cast<size_t>(count) * sizeof(float));
}
AVX2_FN inline __m256 take_first(__m256 a, __m256 b, int64_t count) {  // set(a, b, count)
  switch (count) {
    case 1: return _mm256_blend_ps(a, b, 1);
    case 2: return _mm256_blend_ps(a, b, 3);
    case 3: return _mm256_blend_ps(a, b, 7);
    case 4: return _mm256_blend_ps(a, b, 15);
    case 5: return _mm256_blend_ps(a, b, 31);
    case 6: return _mm256_blend_ps(a, b, 63);
    case 7: return _mm256_blend_ps(a, b, 127);
  }
  return b;
}
struct Maximum {  // vec::maximum: NaN wins
  AVX2_FN __m256 operator()(__m256 a, __m256 b) const {
    return _mm256_or_ps(_mm256_max_ps(a, b), _mm256_cmp_ps(a, b, _CMP_UNORD_Q));
  }
};
struct Sum {
  AVX2_FN __m256 operator()(__m256 a, __m256 b) const { return _mm256_add_ps(a, b); }
};

// vec::reduce_all: lane k folds elements k, k+8, ... in order; fewer than 8 elements
// fold left to right; otherwise the lanes combine in AVX2's shuffle tree.
template <typename Op>
AVX2_FN float reduce_all(Op op, const float* data, int64_t size) {
  if (size < 8) {
    __m256 acc = load_first(data, size);
    alignas(32) float lanes[8];
    _mm256_store_ps(lanes, acc);
    for (int64_t i = 1; i < size; ++i) {
      alignas(32) float next[8] = {lanes[i], 0, 0, 0, 0, 0, 0, 0};
      acc = op(acc, _mm256_load_ps(next));
    }
    return _mm256_cvtss_f32(acc);
  }
  __m256 acc = _mm256_loadu_ps(data);
  int64_t d = 8;
  for (; d < size - size % 8; d += 8) acc = op(acc, _mm256_loadu_ps(data + d));
  if (size - d > 0) acc = take_first(acc, op(acc, load_first(data + d, size - d)), size - d);
  acc = op(acc, _mm256_permute2f128_ps(acc, acc, 0x1));
  acc = op(acc, _mm256_shuffle_ps(acc, acc, 0x4E));
  acc = op(acc, _mm256_shuffle_ps(acc, acc, 0xB1));
  return _mm256_cvtss_f32(acc);
}

// vec::map: whole vectors, then the rest through a partial load and store.
template <typename Fn>
AVX2_FN void map_in_place(Fn fn, float* data, int64_t size) {
  int64_t d = 0;
  for (; d < size - size % 8; d += 8) _mm256_storeu_ps(data + d, fn(_mm256_loadu_ps(data + d)));
  if (size - d > 0) store_first(data + d, fn(load_first(data + d, size - d)), size - d);
}

struct ExpMinus {  // (x - max).exp(): Sleef, as ATen's Vectorized<float>::exp
  __m256 max;
  AVX2_FN __m256 operator()(__m256 x) const { return Sleef_expf8_u10(_mm256_sub_ps(x, max)); }
};
struct Times {
  __m256 factor;
  AVX2_FN __m256 operator()(__m256 x) const { return _mm256_mul_ps(x, factor); }
};

// ATen's softmax of one row of `size` logits, in place (_vec_softmax_lastdim).
AVX2_FN void softmax_row(float* row, int64_t size, float max) {
  map_in_place(ExpMinus{_mm256_set1_ps(max)}, row, size);
  const float inverse = 1 / reduce_all(Sum{}, row, size);
  map_in_place(Times{_mm256_set1_ps(inverse)}, row, size);
}

// One causal row: ATen's softmax over the row's first `used` logits, where `used` ends
// at an 8-element boundary (or the row's end) past the last visible key, so every lane
// and the reduction shape (ATen picks it by the row's full length) are ATen's. A row whose
// visible maximum is not finite (NaN or an infinite logit) runs whole, as ATen does.
AVX2_FN void causal_row(float* row, int64_t n, const RowSpan& span) {
  std::fill(row, row + span.hidden_before, kHidden);
  const int64_t used = n < 8 ? n : std::min(n, (span.visible_end + 7) / 8 * 8);
  std::fill(row + span.visible_end, row + used, kHidden);
  float max = reduce_all(Maximum{}, row, used);
  if (std::isfinite(max)) {
    softmax_row(row, used, max);
    std::fill(row + used, row + n, 0.0f);  // exp(-inf - max) * (1 / sum) is +0
    return;
  }
  std::fill(row + used, row + n, kHidden);
  softmax_row(row, n, reduce_all(Maximum{}, row, n));
}
#endif

}  // namespace

bool aten_uses_avx2_kernels() {
  // ATen's own choice (CPU features, ATEN_CPU_CAPABILITY), as its public build summary
  // states it in every LibTorch since 1.8 ("CPU capability usage: AVX2").
  static const bool avx2 = [] {
    const std::string config = at::show_config();
    const std::string key = "CPU capability usage: ";
    const size_t at = config.find(key);
    if (at == std::string::npos) return false;
    const size_t end = config.find_first_of("\r\n", at);
    return config.substr(at + key.size(), end == std::string::npos ? std::string::npos : end - at - key.size()) == "AVX2";
  }();
  return avx2;
}

bool causal_softmax_in_place(torch::Tensor& logits, const CausalRows& mask) {
#ifdef KVEVICT_CAUSAL_SOFTMAX_AVX2
  if (!logits.device().is_cpu() || logits.scalar_type() != torch::kFloat32 || !logits.is_contiguous() ||
      logits.dim() == 0 || logits.numel() == 0 || !aten_uses_avx2_kernels())
    return false;
  const int64_t n = logits.size(-1), total_rows = logits.numel() / n;
  float* data = logits.data_ptr<float>();
  // ATen's grain for its softmax rows: about 2K elements per task.
  const int64_t grain = std::max<int64_t>(1, at::internal::GRAIN_SIZE / (16 * n));
  at::parallel_for(0, total_rows, grain, [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) causal_row(data + r * n, n, row_span(mask, r, n));
  });
  return true;
#else
  (void)logits;
  (void)mask;
  return false;
#endif
}

torch::Tensor causal_softmax(torch::Tensor logits, const CausalRows& mask) {
  if (causal_softmax_in_place(logits, mask)) return logits;
  return causal_softmax_aten(logits, mask);
}

torch::Tensor causal_softmax_aten(torch::Tensor logits, const CausalRows& mask) {
  const int64_t n = logits.size(-1);
  const auto type = logits.scalar_type();
  if (logits.device().is_cpu() && logits.is_contiguous() && (type == torch::kFloat32 || type == torch::kFloat64)) {
    if (type == torch::kFloat32)
      fill_hidden(logits.data_ptr<float>(), logits.numel() / n, n, mask);
    else
      fill_hidden(logits.data_ptr<double>(), logits.numel() / n, n, mask);
    return torch::softmax(logits, -1);
  }
  // The mask is made where the logits are: nothing crosses to a device.
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(logits.device());
  auto query = torch::arange(mask.first_query, mask.first_query + mask.rows, longs).unsqueeze(1);
  auto key = torch::arange(0, n, longs).unsqueeze(0);
  auto hidden = key > query;
  if (mask.window > 0) hidden = hidden.logical_or(key <= query - mask.window);
  logits.view({-1, mask.rows, n}).masked_fill_(hidden, -std::numeric_limits<double>::infinity());
  return torch::softmax(logits, -1);
}

}  // namespace kvevict
