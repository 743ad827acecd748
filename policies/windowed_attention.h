// Shared by SnapKV, PyramidKV and Scissorhands: a ring of the last `window` queries'
// attention per slot (channel = step % window), and pooling along the key axis.
#pragma once
#include <algorithm>
#include <vector>

#include "policies/policy.h"

namespace kvevict {

inline const ParamSpec kWindow =
    ParamSpec::integer("window", 32, "snapkv/pyramidkv/scissorhands: observation window (queries)").at_least(1);

// Writes this step's attention into its ring channel for every slot.
inline void record_window(HeadSlots& head, const float* attention, int window) {
  const int channel = head.steps % window;
  for (size_t s = 0; s < head.positions.size(); ++s) head.values[s * window + channel] = attention[s];
}

// Sum over the ring per slot, channel 0 first. Eight slots at a time: eight independent
// sums instead of one serial chain of adds, each still in channel order (same rounding).
inline void window_sum(const HeadSlots& head, int window, float* out) {
  constexpr size_t kLanes = 8;
  const size_t n = head.positions.size();
  const float* values = head.values.data();
  size_t s = 0;
  for (; s + kLanes <= n; s += kLanes) {
    float total[kLanes] = {};
    for (int c = 0; c < window; ++c)
      for (size_t k = 0; k < kLanes; ++k) total[k] += values[(s + k) * window + c];
    std::copy(total, total + kLanes, out + s);
  }
  for (; s < n; ++s) {
    float total = 0;
    for (int c = 0; c < window; ++c) total += values[s * window + c];
    out[s] = total;
  }
}

// 1-D pooling along the slots with stride 1 and "same" zero padding, like
// torch avg_pool1d(padding=k//2, count_include_pad=True) / max_pool1d.
inline void pool_keys(float* scores, int n, int kernel, bool use_max) {
  if (kernel <= 1) return;
  std::vector<float> in(scores, scores + n);
  const int half = kernel / 2;
  for (int s = 0; s < n; ++s) {
    float acc = use_max ? in[s] : 0.0f;
    for (int k = s - half; k <= s + half; ++k) {
      if (k < 0 || k >= n) continue;
      acc = use_max ? std::max(acc, in[k]) : acc + in[k];
    }
    scores[s] = use_max ? acc : acc / kernel;
  }
}

}  // namespace kvevict
