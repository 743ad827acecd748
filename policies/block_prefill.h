// Block (chunked) prefill over any scored policy, written "block+POLICY" (block+keydiff,
// block+snapkv, ...): kvpress's BlockPress (NVIDIA kvpress, kvpress/presses/block_press.py),
// the block prompt processing of KeyDiff (Park et al. 2025, arXiv 2504.15364, Sec. 3).
//
// The prefill enters in blocks of block_size tokens, positions
// [b x block_size, (b + 1) x block_size), and after the last query of each block (and
// after the prefill's last token) every KV head is compressed to the wrapped policy's
// budget by the wrapped policy's own scores, so a head never holds more than
// budget + block_size slots, during the prefill as after it. The queries of a block attend
// only the slots kept so far plus their block; the decode cache runs each block as one
// model call (harness/runtime/scorer.cpp), and sim mode masks the same slots. After the
// prefill the wrapped policy goes on as it would alone (one eviction per token).
//
// kvpress's BlockPress is, by its own note, not a true chunked prefill: every query
// attends the whole prompt in one forward pass, and only the scoring is block-wise, its
// first block starting after the first int(length x (1 - compression_ratio)) tokens.
// Here the prefill is chunked for real, so the kept set also steers what later queries
// see, and the blocks start at position 0.
#pragma once
#include <memory>

#include "policies/policy.h"

namespace kvevict {

inline const ParamSpec kBlockSize =
    ParamSpec::integer("block_size", 128, "block+POLICY: prefill tokens per block, compressed after each (BlockPress)")
        .at_least(1);

// The prefix that asks for block prefill over a scored policy.
inline constexpr const char* kBlockPrefix = "block+";

// Wraps `scored` (a ScoredPolicy that evicts); kvevict::Error naming the policy otherwise.
std::unique_ptr<Policy> make_block_prefill(std::unique_ptr<Policy> scored, const PolicyOptions& options);

}  // namespace kvevict
