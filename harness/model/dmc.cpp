#include "harness/model/dmc.h"

#include <cmath>

#include "harness/common/errors.h"

namespace kvevict {

// The constant Megatron-LM adds to every importance, so a slot's weights never sum to 0.
constexpr double kImportanceEps = 1.0 / 128;

DmcMergeState::DmcMergeState(const ArchSpec& arch)
    : dmc_(arch.dmc), n_heads_(arch.n_heads), n_kv_(arch.n_kv_heads), d_(arch.head_dim),
      heads_(arch.n_layers), next_position_(arch.n_layers, 0) {
  if (!dmc_.enabled()) throw Error("DmcMergeState: the model has no DMC keys");
  for (auto& layer : heads_) {
    layer.resize(n_kv_);
    for (Run& run : layer) {
      run.omega.assign(dmc_.window, 0);
      run.keys.assign(dmc_.window * d_, 0);
      run.values.assign(dmc_.window * d_, 0);
    }
  }
}

double DmcMergeState::merge_rate(int layer) const {
  const int64_t decisions = tokens(layer) - 1;
  if (decisions <= 0) return 0;
  double sum = 0;
  for (const Run& run : heads_[layer]) sum += static_cast<double>(run.merges) / decisions;
  return sum / n_kv_;
}

DmcSlots DmcMergeState::step(int layer, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                             int64_t start) {
  if (start == 0) {
    next_position_[layer] = 0;
    for (Run& run : heads_[layer]) run.length = run.merges = 0;
  } else if (start != next_position_[layer]) {
    throw Error("DMC: layer " + std::to_string(layer) + " continues at position " + std::to_string(start) +
                " but its merge state is at " + std::to_string(next_position_[layer]));
  }
  const int64_t t = q.size(0), d = d_, W = dmc_.window, group = n_heads_ / n_kv_;
  const double c = dmc_.init_val;
  // The arithmetic runs in double on the CPU (W * d multiply-adds per token and head), and
  // the slots are rounded once to the model's dtype.
  const auto q64 = q.to(torch::kCPU, torch::kFloat64).contiguous();  // [t, Hq, d]
  const auto k64 = k.to(torch::kCPU, torch::kFloat64).contiguous();  // [t, Hkv, d]
  const auto v64 = v.to(torch::kCPU, torch::kFloat64).contiguous();
  auto k_slots = torch::empty({t, n_kv_, d}, torch::kFloat64);
  auto v_slots = torch::empty({t, n_kv_, d}, torch::kFloat64);
  auto merges = torch::zeros({t, n_kv_}, torch::kUInt8);
  const double* qp = q64.data_ptr<double>();
  const double* kp = k64.data_ptr<double>();
  const double* vp = v64.data_ptr<double>();
  double* ks = k_slots.data_ptr<double>();
  double* vs = v_slots.data_ptr<double>();
  uint8_t* mp = merges.data_ptr<uint8_t>();
  for (int64_t i = 0; i < t; ++i) {
    const int64_t position = start + i;
    for (int64_t h = 0; h < n_kv_; ++h) {
      Run& run = heads_[layer][h];
      const double* key = kp + (i * n_kv_ + h) * d;
      const double* value = vp + (i * n_kv_ + h) * d;
      const bool merge = position > 0 && key[d - 1] - c > 0;
      double q_last = 0;  // the mean of dimension D-1 over the group's query heads
      for (int64_t g = 0; g < group; ++g) q_last += qp[(i * n_heads_ + h * group + g) * d + d - 1];
      q_last /= group;
      const double omega = 1.0 / (1.0 + std::exp(-(q_last + c))) + kImportanceEps;
      run.length = merge ? run.length + 1 : 1;
      run.merges += merge;
      mp[i * n_kv_ + h] = merge;
      // The run's newest token takes ring entry (length - 1) mod W, over its oldest.
      const int64_t entry = (run.length - 1) % W;
      run.omega[entry] = omega;
      for (int64_t x = 0; x < d; ++x) {
        run.keys[entry * d + x] = x == d - 1 ? 0.0 : key[x];
        run.values[entry * d + x] = value[x];
      }
      // The slot: the omega-weighted mean of the run's last min(length, W) tokens.
      const int64_t held = std::min(run.length, W);
      double z = 0;
      double* slot_k = ks + (i * n_kv_ + h) * d;
      double* slot_v = vs + (i * n_kv_ + h) * d;
      std::fill_n(slot_k, d, 0.0);
      std::fill_n(slot_v, d, 0.0);
      for (int64_t e = 0; e < held; ++e) {
        const double w = run.omega[e];
        z += w;
        for (int64_t x = 0; x < d; ++x) {
          slot_k[x] += w * run.keys[e * d + x];
          slot_v[x] += w * run.values[e * d + x];
        }
      }
      for (int64_t x = 0; x < d; ++x) {
        slot_k[x] /= z;
        slot_v[x] /= z;
      }
    }
  }
  next_position_[layer] = start + t;
  DmcSlots out;
  out.q = q.clone();
  out.q.select(2, d - 1).zero_();
  out.k = k_slots.to(k.device(), k.scalar_type());
  out.v = v_slots.to(v.device(), v.scalar_type());
  out.merges = merges;
  return out;
}

}  // namespace kvevict
