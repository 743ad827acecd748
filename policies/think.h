// ThinK (Xu et al. 2024, "ThinK: Thinner Key Cache by Query-Driven Pruning", arXiv
// 2407.21018; kvpress's ThinKPress, composed after a token press as kvpress's
// ComposedPress([SnapKVPress, ThinKPress])): key-channel pruning on top of any realisable
// token policy, written "think+POLICY" (think+snapkv, think+h2o, ...).
//
// At the end of the prefill (the compression after the query at prefill_len - 1, once the
// token policy has chosen its slots), each KV head scores each channel c of its keys by
// the paper's query-driven criterion, as kvpress computes it:
//
//   score_c = ( (1/(W g)) sum_{w, j} q_{w,j,c}^2 ) * ( (1/n) sum_s k_{s,c}^2 )
//
// over the W = min(think_window, prefill_len) last queries of the prefill and the g query
// heads j of the KV head's group (post-RoPE queries, as the model computed them) and the n
// slots the head then keeps (post-RoPE keys as cached). The int(head_dim x
// key_channel_compression_ratio) channels of lowest score (equal scores: the lower channel
// first) are zeroed in the keys of all n kept slots; the caller zeroes them where it holds
// those keys (LayerState::take_rewrites), so every later query's logits miss them. Keys
// that enter after the prefill stay whole (kvpress prunes at prefill time only). Sums in
// double. The token policy runs as alone, on what it reads of each token as it entered
// (a key policy keeps its unpruned copy). Bytes: a zeroed channel counts as not held
// (KvStats::peak_bytes), as in a cache that stores a pruned key's kept channels alone.
#pragma once
#include <memory>

#include "policies/policy.h"

namespace kvevict {

inline const ParamSpec kKeyChannelRatio =
    ParamSpec::real("key_channel_compression_ratio", 0.5,
                    "think+POLICY: share of each KV head's key channels zeroed at the end of the prefill (ThinK)")
        .at_least(0)
        .at_most(1);
inline const ParamSpec kThinkWindow =
    ParamSpec::integer("think_window", 32, "think+POLICY: the prefill's last queries that score the key channels")
        .at_least(1);

// The prefix that asks for ThinK's key-channel pruning over a token policy.
inline constexpr const char* kThinkPrefix = "think+";

// Wraps `inner` (a realisable policy that evicts); kvevict::Error naming the policy otherwise.
std::unique_ptr<Policy> make_think(std::unique_ptr<Policy> inner, const PolicyOptions& options);

// The channels ThinK zeroes in one KV head, ascending: query_squares[c] the sum of q_c^2
// over the window's queries and the group (`queries` of them), keys [slots][head_dim].
std::vector<int> think_pruned_channels(const std::vector<double>& query_squares, int queries,
                                       const std::vector<float>& keys, int slots, int head_dim, double ratio);

}  // namespace kvevict
