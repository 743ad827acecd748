#include "harness/attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/errors.h"

namespace kvevict {
namespace {

// q [t, Hq, d] -> [Hkv, g*t, d], grouping query heads by their KV head
// (query head h uses KV head h / g, as Hugging Face's repeat_kv).
torch::Tensor group_queries(const torch::Tensor& q, int64_t n_kv) {
  const int64_t t = q.size(0), hq = q.size(1), d = q.size(2);
  return q.permute({1, 0, 2}).reshape({n_kv, (hq / n_kv) * t, d});
}

// [Hkv, g*t, d] -> [t, Hq*d]
torch::Tensor ungroup_output(const torch::Tensor& out, int64_t t, int64_t hq) {
  const int64_t d = out.size(2);
  return out.reshape({hq, t, d}).permute({1, 0, 2}).reshape({t, hq * d});
}

int64_t element_bytes(torch::ScalarType type) { return static_cast<int64_t>(c10::elementSize(type)); }

// Attention scores, softmax and the weighted sum of values accumulate in float64 for
// float32 models (float32 for half types). The modes sum in different orders (a
// T x T matrix against a gathered cache); at float32 that alone moves log-probs by
// ~1e-5, which would hide the policy effects the sim == decode check looks for.
torch::ScalarType accumulation_type(torch::ScalarType compute) {
  return compute == torch::kFloat32 || compute == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

}  // namespace

torch::Tensor FullAttention::attend(int, const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, int64_t) {
  const int64_t t = q.size(0), hq = q.size(1), n_kv = k.size(1);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  const auto acc = accumulation_type(q.scalar_type());
  auto logits = torch::bmm(group_queries(q, n_kv).to(acc), k.permute({1, 2, 0}).to(acc)) * scale;  // [Hkv, g*t, t]
  auto causal = torch::ones({t, t}, torch::kBool).triu(1).to(q.device());
  logits = logits.view({n_kv, hq / n_kv, t, t}).masked_fill(causal, -std::numeric_limits<double>::infinity());
  auto probs = torch::softmax(logits, -1).view({n_kv, (hq / n_kv) * t, t});
  return ungroup_output(torch::bmm(probs, v.permute({1, 0, 2}).to(acc)), t, hq).to(q.scalar_type());
}

// ---------------------------------------------------------------------------------
SimAttention::SimAttention(const Model& model, const Policy& policy, SequenceShape shape)
    : model_(model), policy_(policy), shape_(shape) {
  stats_.kept_per_layer.assign(shape.n_layers, 0);
  stats_.max_per_layer.assign(shape.n_layers, 0);
}

torch::Tensor SimAttention::attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, int64_t start) {
  if (start != 0) throw Error("sim mode runs one teacher-forced pass; it cannot continue a sequence");
  const int64_t T = q.size(0), hq = q.size(1), n_kv = k.size(1), d = q.size(2), g = hq / n_kv;
  const int64_t kv_bytes = 2 * n_kv * d * element_bytes(k.scalar_type());
  if (policy_.keeps_everything()) {
    stats_.kept_per_layer[layer] = stats_.max_per_layer[layer] = static_cast<int>(T);
    stats_.peak_bytes += T * kv_bytes;
    return FullAttention().attend(layer, q, k, v, start);
  }
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto acc = accumulation_type(q.scalar_type());
  // All T x T logits once per layer, on the CPU as one contiguous buffer; the policy
  // work below is a tight loop over it. Kept in double so that sim mode sees the same
  // numbers as decode mode's float64 scores.
  auto logits = (torch::bmm(group_queries(q, n_kv).to(acc), k.permute({1, 2, 0}).to(acc)) * scale)
                    .to(torch::kCPU, torch::kFloat64).contiguous();  // [Hq, T, T]
  torch::Tensor probs;

  if (!policy_.realisable()) {
    // Sim-only policies work on float32 buffers, as the paper's code does.
    auto logits32 = logits.to(torch::kFloat32).contiguous();
    auto probs32 = torch::zeros({hq, T, T}, torch::kFloat32);
    policy_.simulate_layer(layer, shape_, static_cast<int>(T), logits32.data_ptr<float>(), probs32.data_ptr<float>());
    probs = probs32;
    const Budget b = policy_.layer_budget(layer, shape_);
    stats_.kept_per_layer[layer] = stats_.max_per_layer[layer] = std::min<int>(T, b.capacity + 1);
  } else {
    probs = torch::zeros({hq, T, T}, torch::kFloat64);
    const double* L = logits.data_ptr<double>();
    double* P = probs.data_ptr<double>();
    auto norms = k.to(torch::kCPU, torch::kFloat32).norm(2, -1).contiguous();  // [T, Hkv]
    const float* key_norms = norms.data_ptr<float>();
    auto state = policy_.make_layer_state(layer, shape_);
    std::vector<float> row;  // what the policy observes: [Hq][slots]
    std::vector<double> exps(T);
    int max_slots = 0;
    for (int64_t i = 0; i < T; ++i) {
      state->append(static_cast<int>(i), key_norms + i * n_kv);
      const int n = state->size();
      max_slots = std::max(max_slots, n);
      row.resize(static_cast<size_t>(hq) * n);
      for (int64_t h = 0; h < hq; ++h) {
        const std::vector<int>& pos = state->positions(static_cast<int>(h / g));
        const double* logit_row = L + (h * T + i) * T;
        double m = -std::numeric_limits<double>::infinity();
        for (int s = 0; s < n; ++s) m = std::max(m, logit_row[pos[s]]);
        double sum = 0;
        for (int s = 0; s < n; ++s) sum += (exps[s] = std::exp(logit_row[pos[s]] - m));
        const double inv = 1.0 / sum;
        double* prob_row = P + (h * T + i) * T;
        float* out = row.data() + h * n;
        for (int s = 0; s < n; ++s) out[s] = static_cast<float>(prob_row[pos[s]] = exps[s] * inv);
      }
      state->observe(row.data());
      if (i >= shape_.prefill_len - 1) state->compress(nullptr);
    }
    stats_.kept_per_layer[layer] = state->size();
    stats_.max_per_layer[layer] = max_slots;
  }
  stats_.peak_bytes += stats_.max_per_layer[layer] * kv_bytes;
  auto p = probs.to(q.device(), acc).view({n_kv, g * T, T});  // acc: see above
  return ungroup_output(torch::bmm(p, v.permute({1, 0, 2}).to(acc)), T, hq).to(q.scalar_type());
}

// ---------------------------------------------------------------------------------
CacheAttention::CacheAttention(const Model& model, const Policy& policy, SequenceShape shape)
    : model_(model), policy_(policy), shape_(shape), layers_(shape.n_layers) {
  if (!policy.realisable())
    throw Error("policy " + policy.name() + " is sim-only (it needs what a real cache does not "
                "hold); use --mode sim");
  if (!policy.keeps_everything())
    for (int l = 0; l < shape.n_layers; ++l) layers_[l].state = policy.make_layer_state(l, shape);
  stats_.kept_per_layer.assign(shape.n_layers, 0);
  stats_.max_per_layer.assign(shape.n_layers, 0);
}

int64_t CacheAttention::cached_tokens(int layer) const {
  return layers_[layer].keys.defined() ? layers_[layer].keys.size(1) : 0;
}

torch::Tensor CacheAttention::attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, int64_t start) {
  LayerCache& cache = layers_[layer];
  const int64_t t = q.size(0), hq = q.size(1), n_kv = k.size(1), d = q.size(2), g = hq / n_kv;
  const bool evicting = cache.state != nullptr;
  if (t > 1 && evicting && start + t > std::max<int64_t>(shape_.prefill_len, 1))
    throw Error("a block of several tokens can only be the prefill: eviction happens between tokens");

  auto new_keys = k.permute({1, 0, 2});  // [Hkv, t, d]
  auto new_values = v.permute({1, 0, 2});
  cache.keys = cache.keys.defined() ? torch::cat({cache.keys, new_keys}, 1) : new_keys.contiguous();
  cache.values = cache.values.defined() ? torch::cat({cache.values, new_values}, 1) : new_values.contiguous();
  const int64_t n = cache.keys.size(1), n_prev = n - t;

  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto acc = accumulation_type(q.scalar_type());
  auto logits = (torch::bmm(group_queries(q, n_kv).to(acc), cache.keys.transpose(1, 2).to(acc)) * scale)
                    .view({n_kv, g, t, n});
  if (t > 1) {
    // Row r of the block sees the old slots and new tokens up to itself.
    auto causal = torch::ones({t, n}, torch::kBool).triu(n_prev + 1).to(q.device());
    logits = logits.masked_fill(causal, -std::numeric_limits<double>::infinity());
  }
  auto probs = torch::softmax(logits, -1);
  auto out = ungroup_output(torch::bmm(probs.view({n_kv, g * t, n}), cache.values.to(acc)), t, hq)
                 .to(q.scalar_type());

  stats_.max_per_layer[layer] = std::max<int>(stats_.max_per_layer[layer], static_cast<int>(n));
  if (evicting) {
    auto probs_cpu = probs.to(torch::kCPU, torch::kFloat32).contiguous();  // [Hkv, g, t, n]
    auto norms = k.to(torch::kCPU, torch::kFloat32).norm(2, -1).contiguous();  // [t, Hkv]
    const float* P = probs_cpu.data_ptr<float>();
    const float* key_norms = norms.data_ptr<float>();
    for (int64_t r = 0; r < t; ++r) {
      cache.state->append(static_cast<int>(start + r), key_norms + r * n_kv);
      const int64_t m = n_prev + r + 1;  // slots this row can see
      row_buffer_.resize(static_cast<size_t>(hq) * m);
      for (int64_t h = 0; h < hq; ++h)
        std::copy_n(P + ((h * t) + r) * n, m, row_buffer_.data() + h * m);
      cache.state->observe(row_buffer_.data());
    }
    std::vector<std::vector<int>> keep;
    if (start + t - 1 >= shape_.prefill_len - 1 && cache.state->compress(&keep)) {
      std::vector<int64_t> flat;
      for (const auto& head : keep) flat.insert(flat.end(), head.begin(), head.end());
      const int64_t kept = static_cast<int64_t>(keep[0].size());
      auto index = torch::tensor(flat, torch::kLong).view({n_kv, kept, 1}).expand({n_kv, kept, d}).to(q.device());
      cache.keys = cache.keys.gather(1, index);
      cache.values = cache.values.gather(1, index);
    }
  }
  stats_.kept_per_layer[layer] = static_cast<int>(cache.keys.size(1));
  int64_t peak = 0;
  for (int l = 0; l < shape_.n_layers; ++l)
    peak += static_cast<int64_t>(stats_.max_per_layer[l]) * 2 * n_kv * d * element_bytes(k.scalar_type());
  stats_.peak_bytes = peak;
  return out;
}

}  // namespace kvevict
