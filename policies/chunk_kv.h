// ChunkKV (Liu et al. 2025, "ChunkKV: Semantic-Preserving KV Cache Compression for
// Efficient Long-Context LLM Inference", arXiv 2502.01941; kvpress's ChunkKVPress): any
// scored policy keeps whole chunks of contiguous tokens instead of single tokens, written
// "chunk+POLICY" (chunk+snapkv, chunk+keydiff, ...).
//
// Chunk c holds the positions c*chunk_length .. (c+1)*chunk_length - 1. A slot scores the
// mean of the inner policy's scores over the slots of its chunk that the KV head holds
// (for a whole chunk the sum's ranking; kvpress also takes the mean, so a chunk cut short
// competes on equal terms), averaged over the layer's KV heads, which keep the same
// chunks (kvpress and the paper sum the chunk scores over the heads). The top-k then
// keeps the best chunks whole, the sinks and recent window of the inner policy's budget
// split as that policy has them; the last chunk to fit may be cut (its newest slots stay),
// so the budget is spent exactly, where kvpress keeps int(chunks x (1 - ratio)) chunks.
#pragma once
#include <memory>

#include "policies/policy.h"

namespace kvevict {

inline const ParamSpec kChunkLength =
    ParamSpec::integer("chunk_length", 20, "chunk+POLICY: tokens per chunk (ChunkKV)").at_least(1);

// The prefix that asks for ChunkKV's chunk selection over a scored policy.
inline constexpr const char* kChunkPrefix = "chunk+";

// Wraps `scored` (a ScoredPolicy that evicts); kvevict::Error naming the policy otherwise.
std::unique_ptr<Policy> make_chunk_kv(std::unique_ptr<Policy> scored, const PolicyOptions& options);

}  // namespace kvevict
