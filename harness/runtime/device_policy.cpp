#include "harness/runtime/device_policy.h"

#include <algorithm>
#include <limits>
#include <numeric>
#include <vector>

#include "harness/common/errors.h"
#include "harness/runtime/slot_softmax.h"

namespace kvevict {
namespace {

// knorm's on_append: the norm rounded to 12 significant bits (round half away from zero,
// as std::round; the scaled mantissa is below 4096, so adding 0.5 is exact).
torch::Tensor rounded_norms(const torch::Tensor& norms) {
  const auto [mantissa, exponent] = torch::frexp(norms);
  return torch::ldexp(torch::floor(mantissa * 4096.0f + 0.5f) / 4096.0f, exponent).to(torch::kFloat32);
}

}  // namespace

std::unique_ptr<DeviceScoredLayer> DeviceScoredLayer::make(const Policy& policy, int layer, const SequenceShape& shape,
                                                           int64_t sliding_window) {
  const auto* scored = dynamic_cast<const ScoredPolicy*>(policy.as_realisable());
  // A policy that rewrites kept slots runs on the host path, which carries the rewrites out.
  if (!scored || scored->score_recipe() == ScoreRecipe::None || policy.options().kv_quant.enabled() ||
      scored->rewrites_slots())
    return nullptr;
  const Budget budget = policy.layer_budget(layer, shape);
  if (budget.unlimited) return nullptr;
  std::unique_ptr<DeviceScoredLayer> made(new DeviceScoredLayer());
  made->policy_ = scored;
  made->recipe_ = scored->score_recipe();
  made->shared_ = scored->shared_across_heads();
  made->layer_ = layer;
  made->length_ = shape.length;
  made->reduce_ = scored->group_reduce();
  made->budget_ = budget;
  made->group_ = shape.group();
  made->n_kv_ = shape.n_kv_heads;
  made->prefill_len_ = shape.prefill_len;
  made->window_ = sliding_window;
  return made;
}

std::unique_ptr<DeviceScoredLayer> DeviceScoredLayer::clone() const {
  std::unique_ptr<DeviceScoredLayer> copy(new DeviceScoredLayer(*this));
  auto cloned = [](const torch::Tensor& t) { return t.defined() ? t.clone() : t; };
  copy->positions_ = cloned(positions_);
  copy->values_ = cloned(values_);
  copy->kept_ = torch::Tensor();
  return copy;
}

int64_t DeviceScoredLayer::last_visible() const {
  return last_seen_.defined() ? last_seen_.item<int64_t>() : last_slots_;
}

torch::Tensor DeviceScoredLayer::rows(const torch::Tensor& logits, int64_t first, int64_t rows,
                                      const torch::Tensor& key_norms) {
  const int64_t n = slots_ + rows;
  if (logits.dim() != 3 || logits.size(0) != n_kv_ || logits.size(1) != group_ * rows || logits.size(2) != n)
    throw Error("internal: the device policy path got logits of another shape than its slots");
  const auto device = logits.device();
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(device);
  kept_ = torch::Tensor();

  // 1. The queries' own keys enter as the newest slots.
  const auto new_positions = torch::arange(first, first + rows, longs).unsqueeze(0).expand({n_kv_, rows});
  torch::Tensor new_values;
  if (recipe_ == ScoreRecipe::NegativeKeyNorm) {
    new_values = rounded_norms(key_norms.to(device, torch::kFloat32).t());
  } else if (recipe_ == ScoreRecipe::PositionDraw) {
    // The draws of positions 0 .. capacity-1, computed on the host and uploaded once per
    // doubling, not once per step.
    if (!draws_.defined() || first + rows > draws_.size(1)) {
      const int64_t capacity = std::max<int64_t>({first + rows, length_, draws_.defined() ? 2 * draws_.size(1) : 0});
      auto table = torch::empty({n_kv_, capacity}, torch::kFloat32);
      float* out = table.data_ptr<float>();
      for (int h = 0; h < n_kv_; ++h)
        for (int64_t p = 0; p < capacity; ++p) out[h * capacity + p] = policy_->position_value(layer_, h, static_cast<int>(p));
      draws_ = table.to(device);
    }
    new_values = draws_.narrow(1, first, rows);
  } else {
    new_values = torch::zeros({n_kv_, rows}, longs.dtype(torch::kFloat32));
  }
  positions_ = slots_ > 0 ? torch::cat({positions_, new_positions}, 1) : new_positions.contiguous();
  values_ = slots_ > 0 ? torch::cat({values_, new_values}, 1) : new_values.contiguous();
  slots_ = n;
  peak_ = std::max(peak_, n);
  last_slots_ = n;

  // 2. What each query sees: causality and the model's sliding window. [Hkv, 1, rows, n]
  const auto query_positions = torch::arange(first, first + rows, longs).view({1, 1, rows, 1});
  const auto slot_positions = positions_.view({n_kv_, 1, 1, n});
  auto seen = slot_positions <= query_positions;
  if (window_ > 0) {
    seen = seen.logical_and(slot_positions > query_positions - window_);
    last_seen_ = seen.select(2, rows - 1).sum({1, 2}).max();
  }

  // 3. The masked softmax, as the host's: exp(l - max) over the seen slots in the logits'
  // precision, times the reciprocal of their sum in double. On the CPU the host's own
  // routine, so its bits; elsewhere as tensor ops, where the device's exp rounds.
  const auto probs = device.is_cpu() && !tensor_softmax_ ? host_softmax(logits, first, rows)
                                                         : tensor_softmax(logits.view({n_kv_, group_, rows, n}), seen);

  // 4. The policy observes each query's attention, reduced over the group head by head
  // and added one query at a time, in float32 (reduce_group, ScoredSlots::observe).
  if (recipe_ == ScoreRecipe::AttentionSum || recipe_ == ScoreRecipe::LatestAttention) {
    const auto observed = probs.to(torch::kFloat32).view({n_kv_, group_, rows, n});
    auto reduced = torch::zeros({n_kv_, rows, n}, observed.options());
    for (int j = 0; j < group_; ++j) {
      const auto member = observed.select(1, j);
      reduced = reduce_ == GroupReduce::Max ? torch::maximum(reduced, member) : reduced + member;
    }
    if (reduce_ == GroupReduce::Mean) reduced = reduced / static_cast<float>(group_);
    if (recipe_ == ScoreRecipe::LatestAttention)
      values_ = reduced.select(1, rows - 1).contiguous();  // each query replaces the last's
    else
      for (int64_t r = 0; r < rows; ++r) values_ = values_ + reduced.select(1, r);
  }

  // 5. After the prefill, the budget: the sinks and the recent window stay, the highest
  // scores take the rest, the newer slot among equal scores (select_kept_slots).
  const int64_t newest = first + rows - 1;
  if (newest >= prefill_len_ - 1 && budget_.compresses_after(static_cast<int>(newest)) &&
      n > budget_.capacity_after(static_cast<int>(newest))) {
    const int64_t capacity = budget_.capacity_after(static_cast<int>(newest));
    // Slot order is position order and the sinks are the first positions, never evicted.
    const int64_t n_sink = std::min<int64_t>(budget_.sink, n);
    const int64_t n_recent = std::min<int64_t>(budget_.recent, n - n_sink);
    const int64_t n_candidates = n - n_sink - n_recent;
    const int64_t n_heavy = std::min(std::max<int64_t>(0, capacity - n_sink - n_recent), n_candidates);
    torch::Tensor scores;
    switch (recipe_) {
      case ScoreRecipe::Position: scores = positions_.to(torch::kFloat32); break;
      case ScoreRecipe::AttentionSum:
      case ScoreRecipe::LatestAttention:
      case ScoreRecipe::PositionDraw: scores = values_; break;
      case ScoreRecipe::NegativeKeyNorm: scores = values_.neg(); break;
      case ScoreRecipe::None: throw Error("internal: a device policy layer without a recipe");
    }
    if (shared_) {
      // One decision for the layer: the heads' scores averaged slot by slot, each divided
      // by the head count and added in head order (SharedScores).
      auto average = torch::zeros({1, n}, scores.options());
      for (int h = 0; h < n_kv_; ++h) average = average + scores.narrow(0, h, 1) / static_cast<float>(n_kv_);
      scores = average.expand({n_kv_, n});
    }
    // Newest candidate first, then a stable sort by score: ties keep the newer slot.
    const auto candidates = scores.narrow(1, n_sink, n_candidates).flip(1);
    const auto order = std::get<1>(torch::sort(candidates, /*stable=*/true, /*dim=*/1, /*descending=*/true));
    const auto heavy =
        std::get<0>(torch::sort((n_candidates - 1 + n_sink) - order.narrow(1, 0, n_heavy), /*dim=*/1));
    kept_ = torch::cat({torch::arange(0, n_sink, longs).unsqueeze(0).expand({n_kv_, n_sink}), heavy,
                        torch::arange(n - n_recent, n, longs).unsqueeze(0).expand({n_kv_, n_recent})},
                       1);
    positions_ = positions_.gather(1, kept_);
    values_ = values_.gather(1, kept_);
    slots_ = kept_.size(1);
  }
  return probs.view(logits.sizes());
}

torch::Tensor DeviceScoredLayer::host_softmax(const torch::Tensor& logits, int64_t first, int64_t rows) const {
  // Slot s sits at column s, the held slots before the block's own, so query r sees a
  // prefix of the slots: every held slot and the block's first r + 1.
  const int64_t n = slots_;
  auto out = logits.contiguous().clone().view({n_kv_, group_, rows, n});
  const auto held = positions_.to(torch::kInt32).contiguous();
  std::vector<int> columns(static_cast<size_t>(n));
  std::iota(columns.begin(), columns.end(), 0);
  std::vector<double> exps(static_cast<size_t>(n));
  std::vector<float> shares(static_cast<size_t>(n));
  for (int kv = 0; kv < n_kv_; ++kv)
    for (int j = 0; j < group_; ++j)
      for (int64_t r = 0; r < rows; ++r) {
        SlotRow at;
        at.positions = held.data_ptr<int>() + kv * n;
        at.columns = columns.data();
        at.slots = static_cast<int>(n - rows + r + 1);
        at.oldest = window_ > 0 ? first + r - window_ + 1 : std::numeric_limits<int64_t>::min();
        auto row = out[kv][j][r];
        if (out.scalar_type() == torch::kFloat64)
          slot_softmax(row.data_ptr<double>(), n, at, exps.data(), shares.data());
        else
          slot_softmax(row.data_ptr<float>(), n, at, exps.data(), shares.data());
      }
  return out;
}

torch::Tensor DeviceScoredLayer::tensor_softmax(const torch::Tensor& logits, const torch::Tensor& seen) const {
  const auto masked = logits.masked_fill(seen.logical_not(), -std::numeric_limits<double>::infinity());
  const auto exps = (masked - std::get<0>(masked.max(-1, /*keepdim=*/true))).exp().to(torch::kFloat64);
  return (exps * exps.sum(-1, /*keepdim=*/true).reciprocal()).to(logits.scalar_type());  // [Hkv, g, rows, n]
}

}  // namespace kvevict
