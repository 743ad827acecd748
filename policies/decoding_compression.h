// Decoding-time compression over any scored policy, written "decoding+POLICY"
// (decoding+h2o, decoding+snapkv, ...): kvpress's DecodingPress and
// CompressionRatioDecodingPress (NVIDIA kvpress, kvpress/presses/decoding_press.py and
// compression_ratio_decoding_press.py), and with --budget its PrefillDecodingPress.
//
// The wrapped policy's scores decide what stays, but the cache is compressed only every
// decode_interval generated tokens, not after every token. Decoding step k is the k-th
// token after the prompt (the prefill and any uncompressed question), at position
// prefill_len + question_len + k - 1; after the query of step k, when k is a multiple of
// decode_interval, each KV head keeps
//   target = decode_target tokens                      (DecodingPress), or
//   target = max(1, int((p + 1) * decode_ratio))      (CompressionRatioDecodingPress,
//            p the newest position, so p + 1 tokens seen; kvpress's target_compression_ratio
//            is the share removed, 1 - decode_ratio)
// when it holds more, split as the wrapped policy splits a token budget of `target`
// (its sinks, then int(share x rest) heavy hitters by score, the rest the most recent;
// kvpress's ScorerPress keeps the top-`target` scores with no windows). Between two
// compressions the cache grows by one slot per token, so a head holds at most
// target + decode_interval slots once decoding compresses.
//
// The prefill: without a budget it enters whole and stays whole until the first decoding
// compression (DecodingPress). With a budget (--budget, --budget-tokens, ...; the
// wrapped policy's own split, per layer for pyramidkv) it is compressed once at its end,
// as the wrapped policy alone would, and decoding then compresses every decode_interval
// tokens instead of every token (PrefillDecodingPress(prefilling_press=POLICY,
// decoding_press=DecodingPress(POLICY))).
//
// kvpress buffers the hidden states of the last decoding steps (hidden_states_buffer_size)
// because its scorers see the queries only at compression time. Here the wrapped policy
// observes every query's attention as it is computed (LayerState::observe), each keeping
// what its score needs (h2o the sum over all queries, snapkv/tova their window of recent
// queries), so there is no separate buffer and no parameter for one.
#pragma once
#include <memory>

#include "policies/policy.h"

namespace kvevict {

inline const ParamSpec kDecodeInterval =
    ParamSpec::integer("decode_interval", 512, "decoding+POLICY: generated tokens between two compressions").at_least(1);
inline const ParamSpec kDecodeTarget =
    ParamSpec::integer("decode_target", 2048, "decoding+POLICY: tokens a KV head keeps after each compression")
        .at_least(1);
inline const ParamSpec kDecodeRatio = ParamSpec::real(
    "decode_ratio", 0.5, "decoding+POLICY: instead of decode_target, keep this share of all tokens seen so far")
    .at_least(0)
    .at_most(1);

// The prefix that asks for decoding-time compression over a scored policy.
inline constexpr const char* kDecodingPrefix = "decoding+";

// Wraps `scored` (a ScoredPolicy that evicts); kvevict::Error naming the policy otherwise.
std::unique_ptr<Policy> make_decoding_compression(std::unique_ptr<Policy> scored, const PolicyOptions& options);

}  // namespace kvevict
