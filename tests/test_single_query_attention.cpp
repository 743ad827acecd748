// A decode step's single-query attention (harness/runtime/single_query_attention.h):
// the attention of one query over a cache's rows, model-free, against the same
// attention in float64 through ATen.
#include <ATen/Parallel.h>

#include <cmath>
#include <cstring>
#include <vector>

#include "harness/model/threads.h"
#include "harness/runtime/single_query_attention.h"
#include "tests/test_support.h"
#include "tests/tensor_support.h"
#include "tests/catch_libtorch.h"

using namespace kvevict;

using kvevict::test::ThreadCountGuard;

namespace {

// softmax((q . k) / sqrt(d)) over rows 0 .. n-1, times the values, in float64: [1, Hq * d].
torch::Tensor reference(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values, int64_t n) {
  const int64_t hq = q.size(1), d = q.size(2), group = hq / keys.size(0);
  auto q64 = q.to(torch::kFloat64)[0];                                                        // [Hq, d]
  auto k64 = keys.narrow(1, 0, n).to(torch::kFloat64).repeat_interleave(group, 0);            // [Hq, n, d]
  auto v64 = values.narrow(1, 0, n).to(torch::kFloat64).repeat_interleave(group, 0);          // [Hq, n, d]
  auto logits = torch::bmm(k64, q64.unsqueeze(2)).squeeze(2) / std::sqrt(static_cast<double>(d));  // [Hq, n]
  auto probs = torch::softmax(logits, -1);
  return torch::bmm(probs.unsqueeze(1), v64).reshape({1, hq * d});
}

// The largest absolute difference; NaN where either side has one, so that a comparison fails.
double largest_difference(const torch::Tensor& a, const torch::Tensor& b) {
  return (a - b).abs().max().item<double>();
}

torch::Tensor softmax_of(float* logits, int64_t hq, int64_t n, torch::Tensor& keep) {
  keep = torch::softmax(torch::from_blob(logits, {hq, n}, torch::kFloat32), -1).contiguous();
  return keep;
}

}  // namespace

TEST_CASE("single-query attention equals the float64 attention over the cache's first n rows", "[attention][decode]") {
  torch::manual_seed(21);
  struct CaseShape {
    int64_t hq, hkv, d, capacity, n;
  };
  for (const CaseShape s : {CaseShape{4, 4, 64, 48, 40}, CaseShape{8, 2, 64, 40, 17}, CaseShape{6, 3, 20, 9, 1}, CaseShape{4, 1, 13, 300, 300}})
    for (auto dtype : {torch::kFloat32, torch::kBFloat16}) {
      INFO("Hq " << s.hq << " Hkv " << s.hkv << " d " << s.d << " n " << s.n << " dtype " << dtype);
      auto q = torch::randn({1, s.hq, s.d}).to(dtype);
      auto keys = torch::randn({s.hkv, s.capacity, s.d}).to(dtype);
      auto values = torch::randn({s.hkv, s.capacity, s.d}).to(dtype);
      // Rows past n hold what no probability may reach.
      keys.narrow(1, s.n, s.capacity - s.n).fill_(1e4);
      values.narrow(1, s.n, s.capacity - s.n).fill_(std::nan(""));
      REQUIRE(single_query_supported(q, keys, values));
      torch::Tensor keep;
      auto out = single_query_attention(q, keys, values, s.n, [&](float* logits) {
        return softmax_of(logits, s.hq, s.n, keep).data_ptr<float>();
      });
      REQUIRE(out.scalar_type() == dtype);
      REQUIRE(out.sizes() == torch::IntArrayRef({1, s.hq * s.d}));
      const double tolerance = dtype == torch::kFloat32 ? 1e-5 : 1e-2;  // bfloat16's output rounding: 2^-8
      const auto expected = reference(q, keys, values, s.n);
      CHECK(largest_difference(out.to(torch::kFloat64), expected) < tolerance);
    }
}

TEST_CASE("single-query attention hands the scaled logits to the policy and sums its weights", "[attention][decode]") {
  torch::manual_seed(22);
  const int64_t hq = 2, d = 8, n = 5;
  auto q = torch::randn({1, hq, d}), keys = torch::randn({1, n, d}), values = torch::randn({1, n, d});
  std::vector<float> seen;
  auto out = single_query_attention(q, keys, values, n, [&](float* logits) {
    seen.assign(logits, logits + hq * n);
    // A policy that keeps only key 3: all the weight on it.
    for (int64_t i = 0; i < hq * n; ++i) logits[i] = i % n == 3 ? 1.0f : 0.0f;
    return logits;
  });
  for (int64_t h = 0; h < hq; ++h)
    for (int64_t j = 0; j < n; ++j)
      CHECK(seen[h * n + j] == Approx((q[0][h] * keys[0][j]).sum().item<double>() / std::sqrt(8.0)).epsilon(1e-5));
  CHECK(largest_difference(out.view({hq, d}).to(torch::kFloat64), values[0][3].expand({hq, d}).to(torch::kFloat64)) == 0);
}

TEST_CASE("single-query attention gives the same bits on one thread and on two", "[attention][decode][threads]") {
  // 4096 keys of 64: each head's product is past the size at which heads go to threads.
  ThreadCountGuard guard;
  torch::manual_seed(23);
  auto q = torch::randn({1, 8, 64}), keys = torch::randn({4, 4096, 64}), values = torch::randn({4, 4096, 64});
  auto run = [&] {
    torch::Tensor keep;
    return single_query_attention(q, keys, values, 4000, [&](float* logits) {
      return softmax_of(logits, 8, 4000, keep).data_ptr<float>();
    });
  };
  set_thread_count(1);
  const auto one = run();
  set_thread_count(2);
  CHECK(test::same_bits(run(), one));
}

TEST_CASE("single-query attention sums in its documented order, bit for bit", "[attention][decode]") {
  // The order single_query_attention.cpp states, written out in scalar code: a logit's
  // eight partial sums take elements i, i+8, ... (one FMA each), combine in a fixed tree,
  // then the d % 8 tail; a value element is one FMA chain over the keys in key order.
  // n and d with and without whole groups of 8 keys, 8 columns and 64 columns.
  torch::manual_seed(24);
  for (int64_t d : {8, 20, 64, 80, 128})
    for (int64_t n : {1, 8, 19}) {
      INFO("d " << d << " n " << n);
      const int64_t hq = 4, hkv = 2, capacity = n + 3;
      auto q = torch::randn({1, hq, d});
      auto keys = torch::randn({hkv, capacity, d}), values = torch::randn({hkv, capacity, d});
      std::vector<float> logits_seen;
      torch::Tensor keep;
      auto out = single_query_attention(q, keys, values, n, [&](float* logits) {
        logits_seen.assign(logits, logits + hq * n);
        return softmax_of(logits, hq, n, keep).data_ptr<float>();
      });
      const float* qp = q.data_ptr<float>();
      const float* kp = keys.data_ptr<float>();
      const float* vp = values.data_ptr<float>();
      const float* probs = keep.data_ptr<float>();
      const float scale = static_cast<float>(1.0 / std::sqrt(static_cast<double>(d)));
      int64_t logit_mismatches = 0, value_mismatches = 0;
      for (int64_t h = 0; h < hq; ++h) {
        const float* key_rows = kp + (h / (hq / hkv)) * capacity * d;
        const float* value_rows = vp + (h / (hq / hkv)) * capacity * d;
        for (int64_t j = 0; j < n; ++j) {
          float a[8] = {0, 0, 0, 0, 0, 0, 0, 0};
          int64_t i = 0;
          for (; i + 8 <= d; i += 8)
            for (int lane = 0; lane < 8; ++lane)
              a[lane] = std::fma(qp[h * d + i + lane], key_rows[j * d + i + lane], a[lane]);
          float sum = ((a[0] + a[1]) + (a[2] + a[3])) + ((a[4] + a[5]) + (a[6] + a[7]));
          for (; i < d; ++i) sum = std::fma(qp[h * d + i], key_rows[j * d + i], sum);
          const float logit = sum * scale;
          logit_mismatches += std::memcmp(&logits_seen[h * n + j], &logit, sizeof(float)) != 0;
        }
        for (int64_t c = 0; c < d; ++c) {
          float sum = 0.0f;
          for (int64_t j = 0; j < n; ++j) sum = std::fma(probs[h * n + j], value_rows[j * d + c], sum);
          value_mismatches += std::memcmp(out.data_ptr<float>() + h * d + c, &sum, sizeof(float)) != 0;
        }
      }
      CHECK(logit_mismatches == 0);
      CHECK(value_mismatches == 0);
    }
}

TEST_CASE("single-query attention refuses what it does not take", "[attention][decode]") {
  auto q = torch::randn({1, 4, 8}), keys = torch::randn({2, 10, 8});
  CHECK(single_query_supported(q, keys, keys));
  CHECK_FALSE(single_query_supported(torch::randn({2, 4, 8}), keys, keys));                     // two queries
  CHECK_FALSE(single_query_supported(q.to(torch::kFloat64), keys.to(torch::kFloat64), keys.to(torch::kFloat64)));
  CHECK_FALSE(single_query_supported(q, keys.to(torch::kBFloat16), keys.to(torch::kBFloat16)));  // mixed dtypes
  CHECK_FALSE(single_query_supported(torch::randn({1, 3, 8}), keys, keys));                     // 3 heads over 2
  CHECK_FALSE(single_query_supported(q, keys.transpose(1, 2).contiguous().transpose(1, 2), keys));  // not contiguous
  CHECK_FALSE(single_query_supported(q, keys, torch::randn({2, 11, 8})));                       // keys and values differ
}
