#include "policies/head_slots.h"

#include <algorithm>

#include "harness/common/errors.h"
#include "policies/policy.h"

namespace kvevict {

float* HeadSlots::append(int position) {
  positions.push_back(position);
  values.resize(values.size() + channels, 0.0f);
  return values.data() + values.size() - channels;
}

float* HeadSlots::renew_last(int position) {
  positions.back() = position;
  return values.data() + values.size() - channels;
}

void HeadSlots::erase(int slot) {
  positions.erase(positions.begin() + slot);
  const auto first = values.begin() + static_cast<ptrdiff_t>(slot) * channels;
  values.erase(first, first + channels);
}

void HeadSlots::gather(const std::vector<int>& kept) {
  std::vector<int> kept_positions(kept.size());
  std::vector<float> kept_values(kept.size() * channels);
  for (size_t i = 0; i < kept.size(); ++i) {
    kept_positions[i] = positions[kept[i]];
    std::copy_n(values.begin() + static_cast<size_t>(kept[i]) * channels, channels, kept_values.begin() + i * channels);
  }
  positions.swap(kept_positions);
  values.swap(kept_values);
}

GroupReduce parse_group_reduce(const std::string& name) {
  if (name == "mean") return GroupReduce::Mean;
  if (name == "max") return GroupReduce::Max;
  throw Error("group_reduce \"" + name + "\" is not one of mean, max");
}

void reduce_group(const float* probs, int group, int n, GroupReduce how, std::vector<float>* out) {
  out->assign(n, 0.0f);
  float* row_out = out->data();
  for (int j = 0; j < group; ++j) {
    const float* row = probs + static_cast<size_t>(j) * n;
    if (how == GroupReduce::Max)
      for (int s = 0; s < n; ++s) row_out[s] = std::max(row_out[s], row[s]);
    else
      for (int s = 0; s < n; ++s) row_out[s] += row[s];
  }
  if (how == GroupReduce::Mean)
    for (int s = 0; s < n; ++s) row_out[s] /= group;
}

const std::vector<float>& SharedScores::scores() {
  const HeadSlots& first = *heads_[0];
  if (step_ == first.steps) return average_;
  step_ = first.steps;
  const int n = first.size();
  average_.assign(n, 0.0f);
  head_scores_.resize(n);
  for (const HeadSlots* head : heads_) {
    if (head->size() != n) throw Error("internal: heads of a shared decision hold different slots");
    policy_.score(*head, head_scores_.data());
    for (int s = 0; s < n; ++s) average_[s] += head_scores_[s] / heads_.size();
  }
  return average_;
}

}  // namespace kvevict
