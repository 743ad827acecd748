// An architecture is data: which blocks a decoder layer has, how they are wired, and
// the Hugging Face tensor names and shapes that feed them. One shared decoder loop
// (Model::forward in model.cpp) runs every architecture; the files arch_*.cpp only describe.
#pragma once
#include <functional>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/common/limits.h"

namespace kvevict {

enum class NormKind { RMSNorm, LayerNorm };
enum class MlpKind { SwiGLU, FeedForward };  // FeedForward: fc1 -> activation -> fc2
enum class Activation { SiLU, ReLU, GeluExact, GeluTanh };
enum class ResidualKind { PreNormSequential, PreNormParallel, PostNorm };
enum class PositionKind { Rotary, Learned };
enum class QkvLayout { Separate, FusedPerHead, FusedRows };  // FusedPerHead: GPT-NeoX [heads, 3*head_dim]; FusedRows: Phi-3 rows [q | k | v]

// Tensor roles the decoder binds. Global roles first, then per-layer ones.
enum class Role {
  Embed, PositionEmbed, ProjectIn, ProjectOut, FinalNormWeight, FinalNormBias, LmHead,
  AttnNormWeight, AttnNormBias, MlpNormWeight, MlpNormBias,
  QWeight, QBias, KWeight, KBias, VWeight, VBias, QkvWeight, QkvBias, OWeight, OBias,
  GateWeight, UpWeight, DownWeight, Fc1Weight, Fc1Bias, Fc2Weight, Fc2Bias,
  QNormWeight, KNormWeight, GateUpWeight,  // Qwen3 per-head q/k RMSNorm; Phi-3 rows [gate | up]
  Count
};
constexpr int kRoleCount = static_cast<int>(Role::Count);

struct TensorSpec {
  std::string name;
  std::vector<int64_t> shape;
  Role role;
  int layer = -1;  // -1 for global tensors
};

// How RoPE frequencies are derived from rope_theta (config.json "rope_scaling").
struct RopeScaling {
  std::string type = "default";  // "default", "linear", "dynamic", "llama3"
  double factor = 1;
  double low_freq_factor = 1, high_freq_factor = 4;  // llama3
  int64_t original_max_positions = 0;               // llama3
};

// Dynamic Memory Compression (Nawrot et al. 2024; docs/DMC.md): a retrofitted model merges
// each KV head's new key/value into its last cache slot or appends a slot, as the last
// dimension of its pre-RoPE key decides. config.json's dmc_window_size and dmc_init_val.
struct DmcSpec {
  int64_t window = 0;   // W: a slot averages at most the last W tokens of its run; 0: DMC off
  double init_val = 0;  // c: merge when k[D-1] - c > 0; importance sigmoid(q[D-1] + c) + 2^-7
  bool enabled() const { return window > 0; }
};

struct ArchSpec {
  std::string model_type;  // "llama", "opt", "gpt_neox"
  int64_t hidden = 0, n_layers = 0, n_heads = 0, n_kv_heads = 0, head_dim = 0;
  int64_t intermediate = 0, vocab = 0, max_positions = 0;
  NormKind norm = NormKind::RMSNorm;
  double norm_eps = 1e-5;
  MlpKind mlp = MlpKind::SwiGLU;
  Activation activation = Activation::SiLU;
  ResidualKind residual = ResidualKind::PreNormSequential;
  PositionKind positions = PositionKind::Rotary;
  QkvLayout qkv = QkvLayout::Separate;
  int64_t rotary_dim = 0;     // leading dims of each head that rotate (rotate-half)
  double rope_theta = 10000;
  RopeScaling rope_scaling;
  int64_t sliding_window = 0;   // > 0: query i sees only keys j > i - sliding_window
  int64_t position_offset = 0;  // OPT's learned positions start at row 2
  DmcSpec dmc;                  // DMC merging (LLaMA family only)
  bool has_final_norm = true;
  bool tied_head = false;       // lm head = token embedding
  int bos_token_id = -1;        // -1: the model has no BOS
  bool prepend_bos = true;      // whether its tokenizer adds BOS to a text
  int eos_token_id = -1;
  std::vector<TensorSpec> tensors;             // everything the checkpoint must hold
  std::vector<std::string> ignored_suffixes;   // legacy buffers skipped, as HF does
};

// Reads config.json (already parsed) and describes the model. `has_tensor` answers
// whether the checkpoint holds a name (OPT checkpoints differ in their prefix).
using HasTensor = std::function<bool(const std::string&)>;
ArchSpec describe_architecture(const nlohmann::json& config, const std::string& config_path,
                               const HasTensor& has_tensor);

// config.json's model_type, checked against the supported architectures (Error naming
// the file otherwise). Model::load calls it before opening any weights.
std::string checked_model_type(const nlohmann::json& config, const std::string& config_path);

// One per architecture file. describe_llama serves the LLaMA family: llama, mistral,
// qwen2, qwen3 and phi3 are one row each of its variant table.
ArchSpec describe_llama(const nlohmann::json& config, const std::string& config_path,
                        const HasTensor& has_tensor);
ArchSpec describe_opt(const nlohmann::json& config, const std::string& config_path,
                      const HasTensor& has_tensor);
ArchSpec describe_gpt_neox(const nlohmann::json& config, const std::string& config_path,
                           const HasTensor& has_tensor);

// Reading config.json keys with errors that name the file and key. A key that is absent
// or null takes the fallback; a present key of the wrong type or outside [min, max] (NaN
// and infinities included) is an error, never a silent default. Ranges are checked
// here, before any arithmetic or allocation depends on the value.
int64_t config_int(const nlohmann::json& config, const std::string& path, const std::string& key);
int64_t config_int(const nlohmann::json& config, const std::string& path, const std::string& key,
                   int64_t min, int64_t max);
int64_t config_int_or(const nlohmann::json& config, const std::string& path, const std::string& key,
                      int64_t fallback, int64_t min, int64_t max);
double config_double_or(const nlohmann::json& config, const std::string& path, const std::string& key,
                        double fallback, double min, double max);
bool config_bool_or(const nlohmann::json& config, const std::string& path, const std::string& key,
                    bool fallback);
std::string config_string_or(const nlohmann::json& config, const std::string& path,
                             const std::string& key, const std::string& fallback);
// bos_token_id / eos_token_id: an id in [0, vocab), or a list whose first entry is one.
int config_token_id_or(const nlohmann::json& config, const std::string& path, const std::string& key,
                       int fallback, int64_t vocab);
// config.json's "rope_scaling" (or "rope_parameters"); defined in rope_scaling.cpp, see rope.h.
RopeScaling read_rope_scaling(const nlohmann::json& config, const std::string& path,
                              const std::vector<std::string>& allowed);

// config.json's DMC keys (dmc_window_size, dmc_init_val: both or neither) for a family that
// implements DMC; needs a.head_dim. `refusal`, when not empty, is why this model cannot
// carry them: a DMC key is then an error naming the file and the key.
DmcSpec read_dmc(const ArchSpec& a, const nlohmann::json& config, const std::string& path,
                 const std::string& refusal = "");

// The multi-head shape of OPT and GPT-NeoX: hidden_size, num_hidden_layers and
// num_attention_heads, one KV head per query head, head width hidden / heads (an exact split).
void read_mha_shape(ArchSpec& a, const nlohmann::json& config, const std::string& path);

// The rotary dims of a head: head_dim times `fraction_key` (partial_rotary_factor,
// rotary_pct; `fallback` when absent), which must be even and above 0 (RoPE turns
// dimensions in pairs). The error names the keys that decide it: head_dim, or
// hidden_size / num_attention_heads where head_dim is derived, and the fraction's key
// only when the config sets it.
int64_t read_rotary_dim(const ArchSpec& a, const nlohmann::json& config, const std::string& path,
                        const std::string& fraction_key, double fallback);

// Upper bounds for config.json sizes: far above any released model, low enough that
// the tensor list and every shape product stay small and inside int64.
constexpr int64_t kMaxLayers = 1024, kMaxHeads = 4096, kMaxHidden = 1 << 18;
constexpr int64_t kMaxIntermediate = 1 << 20, kMaxVocab = 1 << 22, kMaxPositions = kMaxModelPositions;

}  // namespace kvevict
