// Shared by SnapKV, PyramidKV and Scissorhands: a ring of the last `window` queries'
// attention per slot (channel = step % window), and pooling along the key axis.
#pragma once
#include <algorithm>
#include <vector>

#include "policies/policy.h"

namespace kvevict {

inline const ParamSpec kWindow =
    ParamSpec::integer("window", 32, "snapkv/pyramidkv/scissorhands: observation window (queries)").at_least(1);

// out[s] = (channel `start_channel` of slot s, or 0 when it is negative) + channels
// first .. last-1, added in channel order. Eight slots at a time: eight independent sums
// instead of one serial chain of adds, each with the rounding of the plain loop.
inline void add_channels(const float* values, size_t n, int stride, int start_channel, int first, int last,
                         float* out) {
  constexpr size_t kLanes = 8;
  auto start = [&](size_t s) { return start_channel < 0 ? 0.0f : values[s * stride + start_channel]; };
  size_t s = 0;
  for (; s + kLanes <= n; s += kLanes) {
    float total[kLanes];
    for (size_t k = 0; k < kLanes; ++k) total[k] = start(s + k);
    for (int c = first; c < last; ++c)
      for (size_t k = 0; k < kLanes; ++k) total[k] += values[(s + k) * stride + c];
    std::copy(total, total + kLanes, out + s);
  }
  for (; s < n; ++s) {
    float total = start(s);
    for (int c = first; c < last; ++c) total += values[s * stride + c];
    out[s] = total;
  }
}

// Sum over the ring per slot, channel 0 first.
inline void window_sum(const HeadSlots& head, int window, float* out) {
  add_channels(head.values.data(), head.positions.size(), window, -1, 0, window, out);
}

// The same ring with one more channel per slot (window + 1 in all): the running sum of
// the ring's channels 0 .. c, c being the channel written last. Channels 0 .. c-1 do not
// change until the ring wraps, so that sum is the plain sum's own partial sum, and a
// score adds only channels c+1 .. window-1: half the adds, the same result bit for bit.
inline int running_window_channels(int window) { return window + 1; }

inline void record_running_window(HeadSlots& head, const float* attention, int window) {
  const int stride = window + 1, channel = head.steps % window;
  for (size_t s = 0; s < head.positions.size(); ++s) {
    float* slot = head.values.data() + s * stride;
    slot[channel] = attention[s];
    slot[window] = (channel == 0 ? 0.0f : slot[window]) + slot[channel];
  }
}

inline void running_window_sum(const HeadSlots& head, int window, float* out) {
  const size_t n = head.positions.size();
  if (head.steps == 0) {  // nothing recorded yet: the plain sum (of zeros)
    add_channels(head.values.data(), n, window + 1, -1, 0, window, out);
    return;
  }
  const int last_written = (head.steps - 1) % window;
  add_channels(head.values.data(), n, window + 1, window, last_written + 1, window, out);
}

// 1-D pooling along the slots with stride 1 and "same" zero padding, like
// torch avg_pool1d(padding=k//2, count_include_pad=True) / max_pool1d.
inline void pool_keys(float* scores, int n, int kernel, bool use_max) {
  if (kernel <= 1) return;
  std::vector<float> in(scores, scores + n);
  const int half = kernel / 2;
  auto pool = [&](int s) {
    float acc = use_max ? in[s] : 0.0f;
    for (int k = s - half; k <= s + half; ++k) {
      if (k < 0 || k >= n) continue;
      acc = use_max ? std::max(acc, in[k]) : acc + in[k];
    }
    scores[s] = use_max ? acc : acc / kernel;
  };
  // The interior, where the whole kernel fits, without bounds checks: the same adds in
  // the same order, and the compiler can overlap the slots' chains.
  const int interior_end = std::max(half, n - half);
  for (int s = 0; s < std::min(half, n); ++s) pool(s);
  if (!use_max)
    for (int s = half; s < interior_end; ++s) {
      float acc = 0.0f;
      for (int k = s - half; k <= s + half; ++k) acc += in[k];
      scores[s] = acc / kernel;
    }
  else
    for (int s = half; s < interior_end; ++s) pool(s);
  for (int s = std::max(interior_end, std::min(half, n)); s < n; ++s) pool(s);
}

}  // namespace kvevict
