// Rotary position embedding frequencies, with the rope_scaling variants of Hugging Face's
// modeling_rope_utils.py that kvevict implements: default, linear, dynamic (NTK) and
// llama3 (Llama-3.1). Anything else is refused when config.json is read.
#pragma once
#include "harness/model/tensor.h"

#include <nlohmann/json.hpp>
#include <string>
#include <utility>

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

// cos and sin [t, 1, rotary_dim] of positions start .. start+t-1, in `dtype` on `device`.
// Element j's angle is position * inv_freq[j % (rotary_dim / 2)] in inv_freq's dtype
// (torch::outer's product, as Hugging Face computes it), its cosine and sine are taken in
// double and rounded once to that dtype, then to `dtype`. One loop on the host whose
// elements each have bits of their own, so a position's row is the same in a prefill
// block and in a decode step (the ATen ops, ten for a decode step's one row, took Sleef's
// or libm's cos by the element's place in the tensor, and needed fixed chunks for that).
std::pair<torch::Tensor, torch::Tensor> rope_cos_sin(const torch::Tensor& inv_freq, int64_t start, int64_t t,
                                                     torch::ScalarType dtype, torch::Device device);

// True when the frequencies depend on the sequence length (dynamic NTK).
bool rope_depends_on_length(const ArchSpec& arch);

}  // namespace kvevict
