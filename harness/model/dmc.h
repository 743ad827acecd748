// Dynamic Memory Compression (DMC; Nawrot et al. 2024, arXiv 2403.09636; docs/DMC.md): one
// sequence's merge state. Per layer, KV head and token, before RoPE, the last dimension of
// the head's key decides whether the token's key/value fold into the head's last cache
// slot (alpha = 1) or open a new one (alpha = 0); the last dimension of the queries gives
// the token's importance omega. A slot is the omega-weighted mean of the last W tokens of
// its run. This class turns a block of projected q, k, v into the slots each token leaves
// behind; the attention backends decide what a query sees of them (attention.h).
#pragma once
#include "harness/model/tensor.h"

#include <cstdint>
#include <vector>

#include "harness/model/architecture.h"

namespace kvevict {

// One layer's block of tokens after DMC's step, all before RoPE.
struct DmcSlots {
  torch::Tensor q;       // [t, Hq, d] the queries with dimension D-1 zeroed
  torch::Tensor k, v;    // [t, Hkv, d] the slot each token leaves as its head's last (key D-1 zero)
  torch::Tensor merges;  // [t, Hkv] uint8 on the CPU: 1 when the token's slot replaced the head's last slot
};

class DmcMergeState {
 public:
  explicit DmcMergeState(const ArchSpec& arch);

  // q [t, Hq, d], k and v [t, Hkv, d] (projected, biases added, before RoPE) of positions
  // start .. start+t-1. start 0 begins a new sequence; any other start must continue the
  // last one of this layer.
  DmcSlots step(int layer, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v, int64_t start);

  int n_layers() const { return static_cast<int>(heads_.size()); }
  int n_kv_heads() const { return n_kv_; }
  // Per layer and KV head: tokens seen, and the merge decisions among them (the first
  // token never merges, so decisions are counted from position 1).
  int64_t tokens(int layer) const { return next_position_[layer]; }
  int64_t merges(int layer, int kv_head) const { return heads_[layer][kv_head].merges; }
  // Slots the head holds: tokens - merges.
  int64_t slots(int layer, int kv_head) const { return tokens(layer) - merges(layer, kv_head); }
  // Share of alpha = 1 among the decisions at positions >= 1, mean over the KV heads (0
  // before the second token).
  double merge_rate(int layer) const;

 private:
  // One KV head's current run: its last W tokens' omega, pre-RoPE key and value, in a ring.
  struct Run {
    int64_t length = 0;  // tokens in the run so far (n_t)
    std::vector<double> omega, keys, values;  // [W], [W * d], [W * d]
    int64_t merges = 0;
  };
  DmcSpec dmc_;
  int64_t n_heads_, n_kv_, d_;
  std::vector<std::vector<Run>> heads_;  // [layer][KV head]
  std::vector<int64_t> next_position_;   // [layer]
};

}  // namespace kvevict
