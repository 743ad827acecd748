// CaM (Zhang et al., "CaM: Cache Merging for Memory-efficient LLMs Inference", ICML 2024,
// openreview.net/forum?id=LCTmppB165; kvpress's CAMPress): an evicted token's value is
// merged into the kept tokens after it instead of dropped, written "cam+POLICY" (cam+h2o,
// cam+snapkv, ...: any realisable policy that evicts; it chooses what stays, as alone).
//
// Each KV head keeps, per slot, the cumulative attention A_j (the sum over every query
// observed so far of the group-mean attention, kvpress's running attention sum, here
// from the first query since compressions start at the prefill's end) and the value v_j
// as the cache holds it (float32, merges included). At each compression, for every
// slot i the policy evicts (in position order), with W_i the first merge_budget kept
// slots after i in position order and m = |W_i| (0: nothing to merge into):
//
//   p_i = clamp(A_i / ((1/m) sum_{j in W_i} A_j), 0, 1)       (0/0 -> 0, x/0 -> 1)
//   b_i = [u_i < p_i],  u_i = cam_merge_draw(merge_seed, layer, KV head, position_i)
//   v_j += b_i v_i / m   for each j in W_i
//
// (the paper's merge probability and value averaging; kvpress's Bernoulli mask and
// window). All merges of one compression read the values before it, and each kept value
// gets its additions summed in float32 in eviction order, then added once
// (LayerState::take_rewrites carries them to the cache). Keys are not changed. kvpress
// compresses during decoding only and merges the k best-scored evicted tokens for k
// decoding steps since its last compression (one per step at compression_interval 1);
// here every eviction, the prefill's included, merges each evicted token.
#pragma once
#include <cstdint>
#include <memory>

#include "policies/policy.h"

namespace kvevict {

inline const ParamSpec kMergeBudget =
    ParamSpec::integer("merge_budget", 32, "cam+POLICY: kept tokens after an evicted one that its value merges into")
        .at_least(1);
inline const ParamSpec kMergeSeed =
    ParamSpec::seed("merge_seed", "cam+POLICY: seed of CaM's Bernoulli merge draws").per_run_seed();

// The prefix that asks for CaM's value merging over a token policy.
inline constexpr const char* kCamPrefix = "cam+";

// Wraps `inner` (a realisable policy that evicts); kvevict::Error naming the policy otherwise.
std::unique_ptr<Policy> make_cam(std::unique_ptr<Policy> inner, const PolicyOptions& options);

// u in [0, 1) for the token at `position` of KV head `kv_head` in `layer`: a function of
// these and the seed alone (counter-based, so no thread or call order changes it).
double cam_merge_draw(uint64_t seed, int layer, int kv_head, int position);

}  // namespace kvevict
