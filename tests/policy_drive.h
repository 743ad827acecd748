// Model-free policy tests: one layer's LayerStates driven the way the policy driver drives
// them (for each query: append, visible, observe, then compress after the prefill), with
// attention the test makes up instead of a model's softmax, so a test can say exactly
// what each KV head observes. The driver itself (softmax, windows, cache rows, threads) is
// tested in test_policy_driver.cpp.
#pragma once
#include <cmath>
#include <cstdint>
#include <functional>
#include <vector>

#include "policies/policy.h"

namespace kvevict::test {

// 64 well-mixed bits from a few integers (splitmix64's finaliser): made-up data a test
// can recompute in its hand computation.
inline uint64_t splitmix_bits(uint64_t a, uint64_t b, uint64_t c, uint64_t d) {
  uint64_t x = ((a * 1000003 + b) * 1000003 + c) * 1000003 + d + 0x9e3779b97f4a7c15ULL;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ULL;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebULL;
  return x ^ (x >> 31);
}

// head_dim: the length of the made-up key and value vectors (drive_layer_states).
inline SequenceShape sequence_shape(int length, int prefill, int n_q = 1, int n_kv = 1, int layers = 1,
                                    int head_dim = 4) {
  SequenceShape shape;
  shape.head_dim = head_dim;
  shape.length = length;
  shape.prefill_len = prefill;
  shape.n_layers = layers;
  shape.n_q_heads = n_q;
  shape.n_kv_heads = n_kv;
  return shape;
}

// out[s]: what query head `q_head` attends at query `step` over its KV head's slots at
// `positions` (visible: the pattern's mask, null when every slot is seen).
using AttentionFn = std::function<void(int q_head, int step, const std::vector<int>& positions,
                                       const std::vector<char>* visible, float* out)>;
// The L2 norm of KV head kv's key at `position`.
using KeyNormFn = std::function<float(int kv, int position)>;
// What KV head kv's policy reads of the token at `position` (its key's norm, and the key
// and value vectors for a policy that reads them).
using NewTokenFn = std::function<NewToken(int kv, int position)>;

struct LayerTrace {
  std::vector<std::vector<std::vector<int>>> positions;  // [step][kv]: slots after the step
  std::vector<std::vector<std::vector<int>>> seen;       // [step][kv]: positions the query saw, itself included
};

// head_major: each KV head through every step before the next head (last head first),
// as the driver may run heads whose states are independent; otherwise step by step.
// prefill_block: the policy's RealisablePolicy::prefill_block, where the driver also
// compresses inside the prefill.
inline LayerTrace drive_layer_tokens(LayerStates& states, const SequenceShape& shape, const AttentionFn& attention,
                                     const NewTokenFn& new_token, bool head_major = false, int prefill_block = 0) {
  const int n_kv = shape.n_kv_heads, group = shape.group();
  LayerTrace trace;
  trace.positions.assign(shape.length, std::vector<std::vector<int>>(n_kv));
  trace.seen.assign(shape.length, std::vector<std::vector<int>>(n_kv));
  std::vector<std::vector<float>> rows(n_kv);
  std::vector<std::vector<char>> masks(n_kv);
  auto append_and_attend = [&](int kv, int i) {
    LayerState& state = *states.heads[kv];
    state.append(i, new_token(kv, i));
    const bool masked = state.visible(i, &masks[kv]);
    const std::vector<int>& positions = state.positions();
    const size_t n = positions.size();
    for (size_t s = 0; s < n; ++s)
      if (!masked || masks[kv][s]) trace.seen[i][kv].push_back(positions[s]);
    rows[kv].assign(group * n, 0.0f);
    for (int j = 0; j < group; ++j)
      attention(kv * group + j, i, positions, masked ? &masks[kv] : nullptr, rows[kv].data() + j * n);
  };
  auto finish = [&](int kv, int i) {
    LayerState& state = *states.heads[kv];
    if (i >= shape.prefill_len - 1 || (prefill_block > 0 && (i + 1) % prefill_block == 0)) state.compress(nullptr);
    trace.positions[i][kv] = state.positions();
  };
  if (head_major) {
    for (int kv = n_kv - 1; kv >= 0; --kv)
      for (int i = 0; i < shape.length; ++i) {
        append_and_attend(kv, i);
        states.heads[kv]->observe(rows[kv].data());
        finish(kv, i);
      }
    return trace;
  }
  for (int i = 0; i < shape.length; ++i) {
    for (int kv = 0; kv < n_kv; ++kv) append_and_attend(kv, i);
    for (int kv = 0; kv < n_kv; ++kv) states.heads[kv]->observe(rows[kv].data());
    for (int kv = 0; kv < n_kv; ++kv) finish(kv, i);
  }
  return trace;
}

// The same with the keys' norms alone given; a policy that reads the vectors gets made-up
// ones of shape.head_dim floats, a fixed function of (kv, position), the key of that norm
// (and its query group's made-up queries, [group][head_dim]).
inline LayerTrace drive_layer_states(LayerStates& states, const SequenceShape& shape, const AttentionFn& attention,
                                     const KeyNormFn& key_norm, bool head_major = false, int prefill_block = 0) {
  const int d = shape.head_dim, group = shape.group();
  std::vector<float> key(d), value(d), queries(static_cast<size_t>(group) * d);
  return drive_layer_tokens(
      states, shape, attention,
      [&](int kv, int position) {
        const float norm = key_norm(kv, position);
        double squares = 0;
        for (int c = 0; c < d; ++c) {
          key[c] = static_cast<float>(std::sin(1.3 * position + 2.1 * c + 0.7 * kv + 0.01 * c * position));
          value[c] = static_cast<float>(std::cos(0.9 * position * (c + 1) + 1.7 * kv));
          squares += static_cast<double>(key[c]) * key[c];
        }
        for (int c = 0; c < d; ++c) key[c] = static_cast<float>(key[c] * norm / std::sqrt(squares));
        for (int j = 0; j < group; ++j)
          for (int c = 0; c < d; ++c)
            queries[j * d + c] = static_cast<float>(std::cos(0.7 * position + 1.9 * c + 1.1 * (kv * group + j)));
        return NewToken{norm, d > 0 ? key.data() : nullptr, d > 0 ? value.data() : nullptr,
                        d > 0 ? queries.data() : nullptr};
      },
      head_major, prefill_block);
}

}  // namespace kvevict::test
