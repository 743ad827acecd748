#include "harness/runtime/single_query_attention.h"

#include <ATen/Parallel.h>

#include <cmath>
#include <cstdint>
#include <vector>

#include "harness/model/bfloat16_bits.h"

namespace kvevict {
namespace {

// Below this many multiply-adds a head stays on the calling thread with the others (a
// thread hand-off costs more); a batched step's sequences are already spread over the threads.
constexpr int64_t kHeadsApartMin = int64_t{1} << 16;

// Eight partial sums, element i into sum i % 8, combined in a fixed tree: the compiler
// may vectorise the loop but not reorder it.
template <typename T>
float dot(const float* q, const T* k, int64_t d) {
  float acc[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= d; i += 8)
    for (int lane = 0; lane < 8; ++lane) acc[lane] += q[i + lane] * widen(k[i + lane]);
  float sum = ((acc[0] + acc[1]) + (acc[2] + acc[3])) + ((acc[4] + acc[5]) + (acc[6] + acc[7]));
  for (; i < d; ++i) sum += q[i] * widen(k[i]);
  return sum;
}

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
      for (int64_t j = 0; j < n; ++j) logits[h * n + j] = dot(q.data() + h * d, head_keys + j * d, d) * scale;
    }
  });
  const float* probs = probabilities(logits.data());  // [Hq, n]
  at::parallel_for(0, hq, grain, [&](int64_t begin, int64_t end) {
    std::vector<float> sum(static_cast<size_t>(d));  // [d]: element c sums over the keys in order
    for (int64_t h = begin; h < end; ++h) {
      const T* head_values = values + (h / group) * capacity * d;
      std::fill(sum.begin(), sum.end(), 0.0f);
      for (int64_t j = 0; j < n; ++j) {
        const float p = probs[h * n + j];
        const T* row = head_values + j * d;
        for (int64_t c = 0; c < d; ++c) sum[c] += p * widen(row[c]);
      }
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
