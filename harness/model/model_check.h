// Whether a model folder's files agree with each other: config.json, the tensors it
// implies (names, dtypes, shapes), the tokenizer's size and, for `kvevict check-model`,
// every checksum the checkpoint stores. Model::load makes the same checks (except the
// checksums of tensor bytes, which would read every weight on every load).
#pragma once
#include <cstddef>
#include <string>

#include "harness/model/architecture.h"
#include "harness/model/safetensors.h"
#include "harness/tokenizers/tokenizer.h"

namespace kvevict {

// Every tensor config.json implies is stored, as F32, F16 or BF16, with the shape it
// implies; every other stored tensor is one the architecture ignores. kvevict::Error
// naming the file and tensor otherwise.
void check_tensors_match_config(const ArchSpec& arch, const WeightStore& weights, const std::string& dir);

// A tokenizer with more tokens than the embedding has rows would emit ids the model
// cannot look up: kvevict::Error naming the folder. No tokenizer (null) passes.
void check_tokenizer_fits(const Tokenizer* tokenizer, const ArchSpec& arch, const std::string& dir);

struct ModelCheck {
  std::string model_type;
  size_t files = 0;    // checkpoint files (shards)
  size_t tensors = 0;  // stored tensors
  size_t bytes = 0;    // their bytes
  size_t checksummed_records = 0;  // zip records whose CRC-32 matched (pytorch_model.bin)
  int tokenizer_tokens = -1;       // -1: the folder has no tokenizer
};

// `kvevict check-model DIR`: config.json, the checkpoint's structure, every stored
// checksum, the tensors against config.json and the tokenizer against vocab_size.
// Throws kvevict::Error naming the file, key, record or tensor at fault.
ModelCheck check_model(const std::string& dir);

}  // namespace kvevict
