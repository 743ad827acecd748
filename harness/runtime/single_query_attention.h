// A decode step's attention: one query token over a cache, on the CPU. ATen's path (a
// grouped bmm, a scale, a softmax, a second bmm and the reshapes around them) cost
// about 100 us a layer on 40 cached tokens, nearly all of it per-op dispatch, which a
// batched step paid once per sequence. Here the two products are plain loops in a fixed
// order (so the same bits on any x86-64 and any thread count), the query heads split
// over the threads only when a head's keys are many.
#pragma once
#include <functional>

#include "harness/model/tensor.h"

namespace kvevict {

// Whether single_query_attention() takes q [1, Hq, d] over cache buffers like `keys`:
// CPU, q and the buffers all float32 or all bfloat16, contiguous buffers [Hkv, capacity, d].
bool single_query_supported(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values);

// q [1, Hq, d] over rows 0 .. n-1 of keys and values [Hkv, capacity, d] (query head h reads
// KV head h / (Hq / Hkv), as Hugging Face's repeat_kv). The logits, [Hq, n] float32 with
// logit (h, j) = (q_h . k_j) * float(1 / sqrt(d)), go to probabilities(logits), which turns
// them into the attention weights, in place or elsewhere, and returns them ([Hq, n]
// float32). Returns [1, Hq * d] in q's dtype: the weighted sum of the values, in float32.
torch::Tensor single_query_attention(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                                     int64_t n, const std::function<const float*(float* logits)>& probabilities);

}  // namespace kvevict
