// The eviction hook: the attention backends of the two execution modes.
//   FullAttention   plain causal attention (no policy), optionally observed block by
//                   block (analyze);
//   SimAttention    one teacher-forced pass; a realisable policy's rows go through the
//                   policy driver over the logits by position; a sim-only policy
//                   computes the layer itself;
//   CacheAttention  a real KV cache; a realisable policy's rows go through the policy
//                   driver over the cache rows, and evicted K/V are physically removed.
#pragma once
#include "harness/model/tensor.h"

#include <functional>
#include <memory>
#include <vector>

#include "harness/model/model.h"
#include "harness/runtime/device_policy.h"
#include "harness/runtime/policy_driver.h"
#include "policies/policy.h"

namespace kvevict {

// What the cache held, for reports.
struct KvStats {
  std::vector<int> kept_per_layer;     // tokens per KV head at the end (most over the heads)
  std::vector<int> max_per_layer;      // most tokens per KV head at any moment
  std::vector<std::vector<int>> kept_per_head;  // [layer][KV head]: tokens at the end
  // Bytes as harness/common/kv_quant.h counts them (full-precision elements, scales and
  // mins as fp16, codes at their bits), as the cache stands while a query attends: the sum
  // over layers of each layer's peak. Key channels a rewrite zeroed (think+) count as not
  // held, as in a cache that stores a pruned key's kept channels alone.
  int64_t peak_bytes = 0;
  int64_t peak_bytes_full = 0;         // the fp16 cache of the tokens held at those peaks
  int kv_bits = 16;                    // bits per quantized element (16: none)
  // The model's sliding window (0: none). With one, the last query of a layer sees only
  // visible_per_layer of the kept tokens (at most the window), so a budget above the
  // window buys nothing.
  int64_t sliding_window = 0;
  std::vector<int> visible_per_layer;  // keys the last query could attend to (most over KV heads)
  // A DMC model: per layer, the share of merge decisions (alpha = 1) among positions >= 1,
  // mean over the KV heads; empty otherwise. kept_per_head then counts slots.
  std::vector<double> dmc_merge_rate;
  // A policy's pre-pass (harness/runtime/prepass.h) for this sequence: the tokens it ran
  // through the model, the context it scored and its wall time; 0 without one.
  int64_t prepass_tokens = 0;
  int64_t prepass_context = 0;
  double prepass_seconds = 0;
};

// Sees each block of query rows of full attention: queries first .. first+rows-1 of
// `layer` over keys 0 .. n-1; k and v the layer's keys and values [T, n_kv, head_dim];
// logits the scaled logits before the softmax and probs the attention, both
// [n_q, rows, n] in the accumulation type (float32, float64 for float64).
using AttentionObserver =
    std::function<void(int layer, int64_t first, int64_t rows, int64_t n, const torch::Tensor& k,
                       const torch::Tensor& v, const torch::Tensor& logits, const torch::Tensor& probs)>;

// New tokens k, v [t, Hkv, d] (and their queries q [t, Hq, d], after RoPE) on the host as
// a policy driver hands them to its policy (BlockTokens): the key norms [t, Hkv] as
// float32, and the keys, values and queries as float32 only when the policy reads them
// (`vectors`: PolicyDriver::token_vectors).
struct HostTokens {
  HostTokens(TokenVectors vectors, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& q);
  torch::Tensor key_norms, keys, values, queries;
  BlockTokens block() const;
};

class FullAttention : public AttentionBackend {
 public:
  FullAttention() = default;
  // block_rows: query rows per block (0: chosen from the size).
  FullAttention(AttentionObserver observer, int64_t block_rows)
      : observer_(std::move(observer)), block_rows_(block_rows) {}
  torch::Tensor attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v, int64_t start) override;
  // DMC's parallel form over the whole pass (no observer).
  torch::Tensor attend_merged(int layer, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& merges, int64_t start) override;

 private:
  AttentionObserver observer_;
  int64_t block_rows_ = 0;
};

// Over a DMC model's slots run the full cache and every realisable policy whose heads
// decide each on its own, with a token budget; a quantized store of merged slots and a
// byte budget (--kv-memory) are not implemented. Throws naming the flag or policy. With a
// shape, also whether the policy's heads decide on their own (the backends learn that from
// their drivers).
void check_dmc_policy(const Policy& policy, const SequenceShape* shape = nullptr);
void refuse_heads_deciding_together(const Policy& policy, bool same_slots, bool lockstep);
// Carries out a driver's rewrites (PolicyDriver::take_rewrites) on one layer's keys and
// values [Hkv, rows, d] whose rows are the driver's columns: the zeroed key channels, and
// each row's value additions, summed in float32 in the order given and then added once,
// so that every backend adds the same numbers to the same values.
void apply_row_rewrites(const torch::Tensor& keys, const torch::Tensor& values, const std::vector<RowRewrites>& rewrites);

// A policy that rewrites kept slots (RealisablePolicy::rewrites_slots) over a KIVI cache,
// which holds them quantized, is not implemented: throws naming the flag.
void refuse_rewrites_with_kivi(const Policy& policy);

// The most a sim-only policy's [heads, T, T] float32 layer matrix may take (SimAttention
// refuses a longer sequence): 16 GiB is 32 heads at T = 11585.
constexpr int64_t kSimOnlyLayerBytesMax = int64_t{16} << 30;

class SimAttention : public AttentionBackend {
 public:
  SimAttention(const Model& model, const Policy& policy, SequenceShape shape);
  torch::Tensor attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v, int64_t start) override;
  // DMC: the parallel form (dmc_attention.h) over the teacher-forced pass.
  torch::Tensor attend_merged(int layer, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& merges, int64_t start) override;
  const KvStats& stats() const { return stats_; }
  // As CacheAttention's: a realisable policy that can runs on the device policy path, by
  // default off the CPU only.
  void use_device_policy_path(bool on) { device_policy_path_ = on; }

 private:
  // Attention output [T, Hq*d] under a realisable policy.
  torch::Tensor simulate_realisable(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v);
  torch::Tensor simulate_rewriting(PolicyDriver& driver, const HostTokens& tokens, const torch::Tensor& q,
                                   const torch::Tensor& k, const torch::Tensor& v);
  torch::Tensor simulate_quantized(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v);
  torch::Tensor simulate_sim_only(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v);
  torch::Tensor simulate_on_device(DeviceScoredLayer& policy, int layer, const torch::Tensor& q,
                                   const torch::Tensor& k, const torch::Tensor& v);
  const Policy& policy_;
  SequenceShape shape_;
  KvStats stats_;
  bool device_policy_path_ = false;
};

// One layer's KIVI-quantized cache (harness/common/kv_quant.h: one KvHeadStore per KV
// head) with the policy's driver, if any. Each call appends the new tokens to the stores,
// dequantizes what the queries attend to into [Hkv, rows, d] (rows as the driver
// addresses them), runs the attention (and the policy), lets the stores flush after each
// query attended, and removes what the policy evicted. Decode mode keeps one per layer;
// sim mode runs a layer's teacher-forced q, k, v through a fresh one in the same blocks
// (the prefill, then token by token), so both modes compute the same numbers.
class QuantizedLayerCache {
 public:
  virtual ~QuantizedLayerCache() = default;
  // q [t, Hq, d], k and v [t, Hkv, d] of positions start .. start+t-1; t > 1 only for the
  // prefill. Returns [t, Hq*d] in q's dtype.
  virtual torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                               int64_t start) = 0;
  virtual int64_t held_bytes() const = 0;
  virtual int64_t tokens() const = 0;  // tokens held (most over the KV heads)
  // Writes this layer's counts into stats (layer's entries, and its share of the bytes).
  virtual void record(KvStats& stats, int layer) = 0;
  // A copy that goes on on its own (a fork of the cache); null when the policy's states
  // cannot be cloned.
  virtual std::unique_ptr<QuantizedLayerCache> clone() const = 0;
};
std::unique_ptr<QuantizedLayerCache> make_quantized_layer_cache(const Policy& policy, int layer,
                                                                const SequenceShape& shape, int64_t sliding_window,
                                                                torch::ScalarType compute, int64_t head_dim);

class CacheAttention : public AttentionBackend {
 public:
  CacheAttention(const Model& model, const Policy& policy, SequenceShape shape);
  // t > 1 processes a block with full causal attention: allowed only up to the end of
  // the prefill (shape.prefill_len), since eviction never happens inside a block.
  torch::Tensor attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                       const torch::Tensor& v, int64_t start) override;
  // DMC: real slots; each KV head's rows are its slots in order, the last one replaced by a merge.
  torch::Tensor attend_merged(int layer, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& merges, int64_t start) override;
  // (On the device policy path, what the last query saw is read from the device here.)
  const KvStats& stats() const;
  // A copy of this cache, with its policy's states, that goes on as a sequence of `shape`
  // (which Policy::states_agree with this one's): the fork of a shared context. Null when
  // a state cannot be cloned (LayerState::clone); the caller then runs without reuse.
  std::unique_ptr<CacheAttention> fork(const SequenceShape& shape) const;
  // Rows of K/V the layer holds now (most over its KV heads).
  int64_t cached_tokens(int layer) const;
  // Under a policy: the positions each KV head of the layer holds now, ascending ([Hkv][slots]).
  std::vector<std::vector<int>> kept_positions(int layer) const;
  // Bytes of K/V memory the cache holds now (allocated rows, all layers).
  int64_t held_bytes() const;
  // Wall time spent inside attend() (scores, softmax, values, policy, eviction).
  double attention_seconds() const { return attention_seconds_; }
  // Whether a policy that can (DeviceScoredLayer::make) runs on the device policy path:
  // on by default off the CPU, off on the CPU, where the host path is the reference. Set
  // before the first token; the tests turn it on to compare the two on the CPU.
  void use_device_policy_path(bool on) { device_policy_path_ = on; }

 private:
  CacheAttention(const Policy& policy, SequenceShape shape);  // fork's: the members come after
  struct LayerCache {
    // [n_kv_heads, capacity, head_dim]. Without a policy, rows 0 .. size-1 hold positions
    // 0 .. size-1; with one, KV head h holds its driver's slots in rows 0 .. slots(h)-1 in
    // any order (the driver knows which row holds which slot). Unused rows are finite
    // (zero-filled), since they meet a probability of 0 in the value product.
    torch::Tensor key_buffer, value_buffer;
    int64_t size = 0;                     // without a policy: rows in use
    std::unique_ptr<PolicyDriver> driver;  // null without a policy or on the device policy path
    std::unique_ptr<DeviceScoredLayer> device_policy;  // the device policy path (device_policy.h)
    int64_t peak_bytes = 0;               // with a policy: the largest K+V bytes so far
    int64_t peak_bytes_full = 0;          // and the fp16 bytes of the slots held then
    std::unique_ptr<QuantizedLayerCache> quantized;  // with --kv-quant: the whole layer's cache
    // DMC: per KV head, its slots (oldest first) in rows 0 .. dmc_slots[h]-1 of
    // dmc_keys[h] / dmc_values[h] [capacity, head_dim]: heads hold different numbers.
    std::vector<int64_t> dmc_slots;
    std::vector<torch::Tensor> dmc_keys, dmc_values;
  };
  torch::Tensor attend_full(LayerCache& cache, int layer, const torch::Tensor& q, const torch::Tensor& k,
                            const torch::Tensor& v);
  torch::Tensor attend_evicting(LayerCache& cache, int layer, const torch::Tensor& q, const torch::Tensor& k,
                                const torch::Tensor& v, int64_t start);
  torch::Tensor attend_on_device(LayerCache& cache, int layer, const torch::Tensor& q, const torch::Tensor& k,
                                 const torch::Tensor& v, int64_t start);
  // A block of several tokens must be the prefill or the question (eviction happens between tokens).
  void check_block(int64_t start, int64_t t) const;
  bool device_policy_path_ = false;
  const Policy& policy_;
  SequenceShape shape_;
  std::vector<LayerCache> layers_;
  mutable KvStats stats_;
  double attention_seconds_ = 0;
};

}  // namespace kvevict
