// A scored policy's decode-mode row protocol as tensor ops on the cache's own device: the
// device policy path. The host's PolicyDriver (policy_driver.h) copies every block's
// logits to the host and its probabilities back, once per layer and step; here the
// append, the visibility, the masked softmax, the policy's observation (ScoreRecipe) and
// the top-k with its sink and recent windows stay where the cache is, and nothing waits
// for the device: the slot count, the budget and when to compress are known on the host
// from positions alone. A decode step can then be captured as a CUDA graph.
//
// It runs what the host path runs, in the same order and precision: the softmax over the
// slots a query sees (its exponentials in the logits' precision, their sum in float64;
// on the CPU the host's own routine, slot_softmax.h), the group's attention reduced head
// by head in float32, one addition per query; the selection keeps the sinks and the recent window,
// then the highest scores, the newer slot among equal ones. On the CPU device the kept
// sets and the attention equal the host path's (tests/test_device_policy.cpp); the host
// path stays the reference and runs every policy without a recipe, Ada-KV, shared
// decisions, static patterns, KIVI and DMC.
//
// Recipes: Position (local, streamingllm), AttentionSum (h2o), NegativeKeyNorm (knorm),
// LatestAttention (tova, its heads sharing one decision), PositionDraw (random: the
// draws computed on the host from the positions, uploaded as a table once per doubling).
#pragma once
#include "harness/model/tensor.h"

#include <cstdint>
#include <memory>

#include "policies/policy.h"

namespace kvevict {

class DeviceScoredLayer {
 public:
  // Null when the policy cannot run here: not a scored policy with a ScoreRecipe, KIVI,
  // or an unlimited budget (nothing to evict). A decision shared by the layer's heads
  // (tova) is made once from the heads' averaged scores, as SharedScores does.
  static std::unique_ptr<DeviceScoredLayer> make(const Policy& policy, int layer, const SequenceShape& shape,
                                                 int64_t sliding_window);

  // Queries at positions first .. first+rows-1, whose own keys enter as the newest slots
  // (the cache's rows n-rows .. n-1; slot s sits in cache row s, oldest first). logits
  // [Hkv, g*rows, n] (the query heads of a KV head's group, head-major; float32 or
  // float64) on the cache's device; key_norms [rows, Hkv] float32 there. Returns the
  // attention that weights the values, in the logits' dtype (0 where a query sees no slot).
  // After the last query the policy compresses when its budget says so: then kept()
  // holds the slots each head keeps, ascending, and the cache must gather its rows.
  torch::Tensor rows(const torch::Tensor& logits, int64_t first, int64_t rows, const torch::Tensor& key_norms);

  // [Hkv, slots()] long: the slots kept by the last call's compression (undefined: none).
  const torch::Tensor& kept() const { return kept_; }
  int64_t slots() const { return slots_; }    // slots per KV head (every head holds as many)
  int n_kv_heads() const { return n_kv_; }
  int64_t peak_slots() const { return peak_; }  // the most any head held while a query attended
  // Slots the last query saw (the most over the KV heads): all of them, or with a sliding
  // window those inside it, read from the device when asked (a wait; window models only).
  int64_t last_visible() const;
  // [Hkv, slots()] long: the positions each head holds, oldest first.
  const torch::Tensor& positions() const { return positions_; }
  std::unique_ptr<DeviceScoredLayer> clone() const;
  // The softmax as tensor ops on the CPU too (what another device runs), for the tests.
  void use_tensor_softmax(bool on) { tensor_softmax_ = on; }

 private:
  DeviceScoredLayer() = default;
  // Step 3 of rows(): [Hkv, g, rows, n] in the logits' dtype.
  torch::Tensor host_softmax(const torch::Tensor& logits, int64_t first, int64_t rows) const;
  torch::Tensor tensor_softmax(const torch::Tensor& logits, const torch::Tensor& seen) const;
  bool tensor_softmax_ = false;
  const ScoredPolicy* policy_ = nullptr;
  ScoreRecipe recipe_ = ScoreRecipe::None;
  bool shared_ = false;
  int layer_ = 0;
  int64_t length_ = 0;       // the sequence's length (ScoreRecipe::PositionDraw's first table)
  torch::Tensor draws_;      // PositionDraw: [Hkv, capacity] float32, position p's draw at column p
  GroupReduce reduce_ = GroupReduce::Mean;
  Budget budget_;
  int group_ = 1;
  int n_kv_ = 1;
  int64_t prefill_len_ = 0;
  int64_t window_ = 0;
  int64_t last_slots_ = 0;     // slots while the last query attended
  torch::Tensor last_seen_;    // with a window: [] long, what the last query saw (most over heads)
  int64_t slots_ = 0;
  int64_t peak_ = 0;
  torch::Tensor positions_;  // [Hkv, slots] long
  torch::Tensor values_;     // [Hkv, slots] float32: the recipe's per-slot state
  torch::Tensor kept_;       // [Hkv, kept] long, or undefined
};

}  // namespace kvevict
