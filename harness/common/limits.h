// Limits shared by readers in different libraries.
#pragma once
#include <cstdint>

namespace kvevict {

// The longest context (max_position_embeddings) a config.json may declare: far above any
// released model. Policies use it to refuse a ratio budget that keeps no token at any length.
constexpr int64_t kMaxModelPositions = int64_t{1} << 24;

}  // namespace kvevict
