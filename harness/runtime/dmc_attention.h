// Attention over DMC's slots (harness/model/dmc.h), one form for both modes. A KV head
// holds `held` slots from earlier calls, all visible, then one slot version per token of
// the block: version j is the head's last slot after token j, so query i sees version j
// when j == i, or when j < i and token j+1 appended (merges[j+1] == 0, so version j was
// final). Sim mode passes the whole sequence with nothing held (the parallel form of the
// DMC paper); the decode cache passes its slots and keeps each block's final versions.
#pragma once
#include "harness/model/tensor.h"

#include <cstdint>
#include <vector>

#include "harness/runtime/policy_driver.h"

namespace kvevict {

// q [t, Hq, d] (rotated); keys[h] / values[h] [rows, d]: KV head h's held slots in rows
// 0 .. held[h]-1 (held empty: none), then the block's t slot versions; merges [t, Hkv]
// uint8 on the CPU. A merge at the block's first token must already have taken the
// replaced slot out of held. Scores, softmax and values in float32 (float64 for float64).
// Returns [t, Hq * d] in q's dtype.
torch::Tensor dmc_block_attention(const torch::Tensor& q, const std::vector<torch::Tensor>& keys,
                                  const std::vector<torch::Tensor>& values, const std::vector<int64_t>& held,
                                  const torch::Tensor& merges);

// The same block under an eviction policy over the slots (docs/DMC.md): the driver
// (SlotColumns::Versions, after start_block(first)) holds each head's slots, which sit in
// rows 0 .. driver.slots(h)-1 of keys[h] / values[h], then the block's t versions. It
// merges and appends as merges says, decides what each query sees and evicts; afterwards
// its columns(h) are the rows head h keeps. first: the block's first position; tokens
// the versions' keys as the policy reads them (BlockTokens). The driver's softmax runs in
// float64 on the CPU.
torch::Tensor dmc_policy_attention(const torch::Tensor& q, const std::vector<torch::Tensor>& keys,
                                   const std::vector<torch::Tensor>& values, const torch::Tensor& merges,
                                   PolicyDriver& driver, int64_t first, const BlockTokens& tokens);

// The slot versions of a block that stay (j is the last token, or token j+1 appended),
// per KV head: [Hkv] lists of block rows.
std::vector<std::vector<int64_t>> dmc_final_versions(const torch::Tensor& merges);

}  // namespace kvevict
