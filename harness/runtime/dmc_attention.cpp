#include "harness/runtime/dmc_attention.h"

#include <algorithm>
#include <cmath>
#include <limits>

#include "harness/model/threads.h"

namespace kvevict {

std::vector<std::vector<int64_t>> dmc_final_versions(const torch::Tensor& merges) {
  const int64_t t = merges.size(0), n_kv = merges.size(1);
  const auto m = merges.contiguous();
  const uint8_t* mp = m.data_ptr<uint8_t>();
  std::vector<std::vector<int64_t>> kept(n_kv);
  for (int64_t h = 0; h < n_kv; ++h)
    for (int64_t j = 0; j < t; ++j)
      if (j == t - 1 || mp[(j + 1) * n_kv + h] == 0) kept[h].push_back(j);
  return kept;
}

torch::Tensor dmc_block_attention(const torch::Tensor& q, const std::vector<torch::Tensor>& keys,
                                  const std::vector<torch::Tensor>& values, const std::vector<int64_t>& held,
                                  const torch::Tensor& merges) {
  const int64_t t = q.size(0), hq = q.size(1), d = q.size(2), n_kv = static_cast<int64_t>(keys.size()), g = hq / n_kv;
  const auto acc = q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto m = merges.contiguous();
  const uint8_t* mp = m.data_ptr<uint8_t>();
  auto out = torch::empty({t, hq, d}, q.options().dtype(acc));
  BlasOnThisThread one_thread;  // a product split over threads would round differently (threads.h)
  for (int64_t h = 0; h < n_kv; ++h) {
    const int64_t n_held = held.empty() ? 0 : held[h], n = n_held + t;
    torch::Tensor visible;  // [t, n]: every held slot; of the block's versions, the query's own and the final ones before it
    if (t > 1) {
      std::vector<char> final_version(t);  // token j+1 appended
      for (int64_t j = 0; j + 1 < t; ++j) final_version[j] = mp[(j + 1) * n_kv + h] == 0;
      visible = torch::zeros({t, n}, torch::kBool);
      bool* vp = visible.data_ptr<bool>();
      for (int64_t i = 0; i < t; ++i) {
        std::fill_n(vp + i * n, n_held, true);
        for (int64_t j = 0; j < i; ++j) vp[i * n + n_held + j] = final_version[j];
        vp[i * n + n_held + i] = true;
      }
    }
    const auto head_keys = keys[h].narrow(0, 0, n), head_values = values[h].narrow(0, 0, n);
    // The group's queries [g * t, d], head-major.
    auto queries = q.narrow(1, h * g, g).permute({1, 0, 2}).reshape({g * t, d}).to(acc);
    auto logits = queries.mm(head_keys.to(acc).t()).mul_(scale).view({g, t, n});
    if (t > 1)
      logits.masked_fill_(visible.to(q.device()).logical_not().unsqueeze(0), -std::numeric_limits<double>::infinity());
    auto probs = torch::softmax(logits, -1).view({g * t, n});
    out.narrow(1, h * g, g).copy_(probs.mm(head_values.to(acc)).view({g, t, d}).permute({1, 0, 2}));
  }
  return out.view({t, hq * d}).to(q.scalar_type());
}

torch::Tensor dmc_policy_attention(const torch::Tensor& q, const std::vector<torch::Tensor>& keys,
                                   const std::vector<torch::Tensor>& values, const torch::Tensor& merges,
                                   PolicyDriver& driver, int64_t first, const BlockTokens& tokens) {
  const int64_t t = q.size(0), hq = q.size(1), d = q.size(2), n_kv = static_cast<int64_t>(keys.size()), g = hq / n_kv;
  const auto acc = q.scalar_type() == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto m = merges.contiguous();
  const uint8_t* mp = m.data_ptr<uint8_t>();
  std::vector<int64_t> held(n_kv);
  int64_t most = 0;
  for (int64_t h = 0; h < n_kv; ++h) most = std::max<int64_t>(most, held[h] = driver.slots(h));
  std::vector<torch::Tensor> keys_t(n_kv), values_acc(n_kv);  // [d, held + t], [held + t, d]
  for (int64_t h = 0; h < n_kv; ++h) {
    keys_t[h] = keys[h].narrow(0, 0, held[h] + t).to(torch::kCPU, acc).t();
    values_acc[h] = values[h].narrow(0, 0, held[h] + t).to(torch::kCPU, acc);
  }
  const auto queries = q.to(torch::kCPU, acc);
  auto out = torch::empty({t, hq, d}, queries.options());
  // Query rows per block: about 2M logits; a block's rows see the versions up to its last.
  const int64_t block = std::max<int64_t>(1, (int64_t{1} << 21) / std::max<int64_t>(1, hq * (most + t)));
  BlasOnThisThread one_thread;  // a product split over threads would round differently (threads.h)
  for (int64_t r0 = 0; r0 < t; r0 += block) {
    const int64_t rows = std::min(block, t - r0), n = most + r0 + rows;
    auto logits = torch::empty({hq, rows, n}, queries.options());  // columns past a head's own stay unread
    for (int64_t h = 0; h < n_kv; ++h) {
      const int64_t cols = held[h] + r0 + rows;
      auto group = queries.narrow(0, r0, rows).narrow(1, h * g, g).permute({1, 0, 2}).reshape({g * rows, d});
      logits.narrow(0, h * g, g).narrow(2, 0, cols).copy_(
          group.mm(keys_t[h].narrow(1, 0, cols)).mul_(scale).view({g, rows, cols}));
    }
    if (acc == torch::kFloat64)
      driver.rows(first + r0, rows, n, logits.data_ptr<double>(), tokens.from_row(r0, static_cast<int>(n_kv)), nullptr,
                  mp + r0 * n_kv);
    else
      driver.rows(first + r0, rows, n, logits.data_ptr<float>(), tokens.from_row(r0, static_cast<int>(n_kv)), nullptr,
                  mp + r0 * n_kv);
    for (int64_t h = 0; h < n_kv; ++h) {
      const int64_t cols = held[h] + r0 + rows;
      auto probs = logits.narrow(0, h * g, g).narrow(2, 0, cols).reshape({g * rows, cols});
      out.narrow(0, r0, rows).narrow(1, h * g, g).copy_(
          probs.mm(values_acc[h].narrow(0, 0, cols)).view({g, rows, d}).permute({1, 0, 2}));
    }
  }
  return out.view({t, hq * d}).to(q.device(), q.scalar_type());
}

}  // namespace kvevict
