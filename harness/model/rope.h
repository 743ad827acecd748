// Rotary position embedding frequencies, with the rope_scaling variants of Hugging Face's
// modeling_rope_utils.py that kvevict implements: default, linear, dynamic (NTK) and
// llama3 (Llama-3.1). Anything else is refused when config.json is read.
#pragma once
#include "harness/model/tensor.h"

#include <nlohmann/json.hpp>
#include <string>

#include "harness/model/architecture.h"

namespace kvevict {

// Reads config.json's "rope_scaling" (or transformers 5's "rope_parameters"); null or
// absent means default. `allowed` lists the types this architecture accepts; any other
// type, or a missing parameter, is an Error naming the file and key.
RopeScaling read_rope_scaling(const nlohmann::json& config, const std::string& path,
                              const std::vector<std::string>& allowed);

// Inverse frequencies [rotary_dim / 2] for a forward pass whose last position is
// seq_len - 1 (only dynamic NTK depends on it), computed as Hugging Face does in float32;
// float64 reference runs compute them in float64, as the float64 references do.
torch::Tensor rope_inv_freq(const ArchSpec& arch, int64_t seq_len, torch::ScalarType table = torch::kFloat32);

// True when the frequencies depend on the sequence length (dynamic NTK).
bool rope_depends_on_length(const ArchSpec& arch);

}  // namespace kvevict
