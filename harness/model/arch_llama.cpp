// The LLaMA family: RMSNorm, SwiGLU, rotate-half RoPE with rope_theta (and rope_scaling),
// grouped-query attention, tied or untied head. Llama 2/3, TinyLlama, Mistral, Qwen2/2.5,
// Qwen3 and Phi-3 differ only in the rows of kVariants, written from Hugging Face's
// modeling_{llama,mistral,qwen2,qwen3,phi3}.py. Config keys that change the math and
// are not implemented are refused with the key's name (README, "Supported models").
#include <cmath>

#include "harness/model/architecture.h"
#include "harness/common/errors.h"

namespace kvevict {
namespace {

enum class WindowRule {
  None,           // the architecture has no sliding window (a sliding_window key is ignored, as HF does)
  Always,         // sliding_window applies to every layer when it is not null (Mistral, Phi-3)
  QwenLayerFlag,  // use_sliding_window + max_window_layers choose layers: refused when on
};

struct LlamaVariant {
  const char* model_type;
  bool fixed_qkv_bias;        // q/k/v biases always, o_proj none (Qwen2)
  bool reads_attention_bias;  // attention_bias: biases on q, k, v and o (LLaMA, Qwen3)
  bool qk_norm;               // per-head RMSNorm of q and k before RoPE (Qwen3)
  bool fused;                 // qkv_proj rows [q|k|v] and gate_up_proj rows [gate|up] (Phi-3)
  bool partial_rotary;        // honours partial_rotary_factor (Phi-3)
  WindowRule window;
  bool prepend_bos;           // whether the family's tokenizers add BOS to a text
  std::vector<std::string> rope_types;
};

const std::vector<LlamaVariant>& variants() {
  static const std::vector<LlamaVariant> kVariants = {
      // model_type  qkv_bias attn_bias qk_norm fused partial window bos rope_scaling types
      {"llama", false, true, false, false, false, WindowRule::None, true, {"default", "linear", "dynamic", "llama3"}},
      {"mistral", false, false, false, false, false, WindowRule::Always, true, {"default", "linear", "dynamic", "llama3"}},
      {"qwen2", true, false, false, false, false, WindowRule::QwenLayerFlag, false, {"default", "linear", "dynamic", "llama3"}},
      {"qwen3", false, true, true, false, false, WindowRule::QwenLayerFlag, false, {"default", "linear", "dynamic", "llama3"}},
      // Phi-3's config accepts only default RoPE or longrope (not implemented).
      {"phi3", false, false, false, true, true, WindowRule::Always, true, {"default"}},
  };
  return kVariants;
}

bool is_set(const nlohmann::json& c, const char* key) {
  return c.contains(key) && !c[key].is_null() && c[key] != false;
}

// Throws: KEY [WHY] is not implemented for model_type TYPE.
[[noreturn]] void refuse_key(const std::string& path, const std::string& model_type, const std::string& key,
                             const std::string& why) {
  throw Error(path + ": " + key + (why.empty() ? "" : " " + why) + " is not implemented for model_type " +
              model_type);
}

const LlamaVariant& find_variant(const std::string& type, const std::string& path) {
  for (const auto& v : variants())
    if (type == v.model_type) return v;
  throw Error(path + ": model_type \"" + type + "\" is not a LLaMA variant");
}

// Rotary dims, theta and scaling.
void read_rotary(ArchSpec& a, const nlohmann::json& c, const std::string& path, const LlamaVariant& variant) {
  const double partial = config_double_or(c, path, "partial_rotary_factor", 1.0, 0, 1);
  if (partial != 1.0 && !variant.partial_rotary)
    refuse_key(path, a.model_type, "partial_rotary_factor " + std::to_string(partial), "(only 1)");
  a.rotary_dim = read_rotary_dim(a, c, path, "partial_rotary_factor", 1.0);
  a.rope_theta = config_double_or(c, path, "rope_theta", 10000.0, 1, 1e12);
  if (c.contains("rope_parameters") && c["rope_parameters"].is_object())
    a.rope_theta = config_double_or(c["rope_parameters"], path, "rope_theta", a.rope_theta, 1, 1e12);
  a.rope_scaling = read_rope_scaling(c, path, variant.rope_types);
}

// The sliding window where the family has one; per-layer attention types are refused.
void read_attention_window(ArchSpec& a, const nlohmann::json& c, const std::string& path,
                           const LlamaVariant& variant) {
  switch (variant.window) {
    case WindowRule::None: break;
    case WindowRule::Always:
      if (c.contains("sliding_window") && !c["sliding_window"].is_null()) {
        a.sliding_window = config_int(c, path, "sliding_window", 1, kMaxPositions);
      }
      break;
    case WindowRule::QwenLayerFlag:
      // Which layers slide depends on max_window_layers (and has changed between
      // transformers versions); the released Qwen2.5/Qwen3 checkpoints keep it off.
      if (config_bool_or(c, path, "use_sliding_window", false))
        refuse_key(path, a.model_type, "use_sliding_window true", "(per-layer windows from max_window_layers)");
      break;
  }
  if (c.contains("layer_types") && c["layer_types"].is_array())
    for (const auto& layer_type : c["layer_types"])
      if (layer_type != "full_attention")
        refuse_key(path, a.model_type, "layer_types entry " + layer_type.dump(), "(only full_attention)");
}

// Every tensor a checkpoint of this shape holds, with its shape and role.
void add_tensors(ArchSpec& a, const LlamaVariant& variant, bool qkv_bias, bool o_bias) {
  const int64_t D = a.hidden, q = a.n_heads * a.head_dim, kv = a.n_kv_heads * a.head_dim;
  const int64_t F = a.intermediate;
  auto add = [&](const std::string& name, std::vector<int64_t> shape, Role role, int layer = -1) {
    a.tensors.push_back({name, std::move(shape), role, layer});
  };
  add("model.embed_tokens.weight", {a.vocab, D}, Role::Embed);
  for (int i = 0; i < a.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {D}, Role::AttnNormWeight, i);
    if (variant.fused) {
      add(p + "self_attn.qkv_proj.weight", {q + 2 * kv, D}, Role::QkvWeight, i);
    } else {
      add(p + "self_attn.q_proj.weight", {q, D}, Role::QWeight, i);
      add(p + "self_attn.k_proj.weight", {kv, D}, Role::KWeight, i);
      add(p + "self_attn.v_proj.weight", {kv, D}, Role::VWeight, i);
      if (qkv_bias) {
        add(p + "self_attn.q_proj.bias", {q}, Role::QBias, i);
        add(p + "self_attn.k_proj.bias", {kv}, Role::KBias, i);
        add(p + "self_attn.v_proj.bias", {kv}, Role::VBias, i);
      }
    }
    add(p + "self_attn.o_proj.weight", {D, q}, Role::OWeight, i);
    if (o_bias) add(p + "self_attn.o_proj.bias", {D}, Role::OBias, i);
    if (variant.qk_norm) {
      add(p + "self_attn.q_norm.weight", {a.head_dim}, Role::QNormWeight, i);
      add(p + "self_attn.k_norm.weight", {a.head_dim}, Role::KNormWeight, i);
    }
    add(p + "post_attention_layernorm.weight", {D}, Role::MlpNormWeight, i);
    if (variant.fused) {
      add(p + "mlp.gate_up_proj.weight", {2 * F, D}, Role::GateUpWeight, i);
    } else {
      add(p + "mlp.gate_proj.weight", {F, D}, Role::GateWeight, i);
      add(p + "mlp.up_proj.weight", {F, D}, Role::UpWeight, i);
    }
    add(p + "mlp.down_proj.weight", {D, F}, Role::DownWeight, i);
  }
  add("model.norm.weight", {D}, Role::FinalNormWeight);
  if (!a.tied_head) add("lm_head.weight", {a.vocab, D}, Role::LmHead);
}

}  // namespace

ArchSpec describe_llama(const nlohmann::json& c, const std::string& path, const HasTensor&) {
  const std::string type = config_string_or(c, path, "model_type", "llama");
  const LlamaVariant& variant = find_variant(type, path);
  auto refuse = [&](const std::string& key, const std::string& why) { refuse_key(path, type, key, why); };

  ArchSpec a;
  a.model_type = type;
  a.hidden = config_int(c, path, "hidden_size", 1, kMaxHidden);
  a.n_layers = config_int(c, path, "num_hidden_layers", 1, kMaxLayers);
  a.n_heads = config_int(c, path, "num_attention_heads", 1, kMaxHeads);
  a.n_kv_heads = config_int_or(c, path, "num_key_value_heads", a.n_heads, 1, kMaxHeads);
  if (a.n_heads % a.n_kv_heads != 0)
    throw Error(path + ": num_attention_heads must be a multiple of num_key_value_heads");
  if (!c.contains("head_dim") && a.hidden < a.n_heads)
    throw Error(path + ": hidden_size " + std::to_string(a.hidden) + " is smaller than num_attention_heads " +
                std::to_string(a.n_heads));
  a.head_dim = config_int_or(c, path, "head_dim", a.hidden / a.n_heads, 1, kMaxHidden);  // Qwen3, Mistral-Nemo: explicit
  a.intermediate = config_int(c, path, "intermediate_size", 1, kMaxIntermediate);
  a.vocab = config_int(c, path, "vocab_size", 1, kMaxVocab);
  a.max_positions = config_int_or(c, path, "max_position_embeddings", 2048, 1, kMaxPositions);
  a.norm = NormKind::RMSNorm;
  a.norm_eps = config_double_or(c, path, "rms_norm_eps", 1e-6, 0, 1);
  a.mlp = MlpKind::SwiGLU;
  a.activation = Activation::SiLU;
  const std::string act = config_string_or(c, path, "hidden_act", "silu");
  if (act != "silu" && act != "swish") refuse("hidden_act \"" + act + "\"", "(only silu)");
  a.residual = ResidualKind::PreNormSequential;
  a.positions = PositionKind::Rotary;
  a.qkv = variant.fused ? QkvLayout::FusedRows : QkvLayout::Separate;

  // DMC before RoPE's checks: a DMC head needs its last dimension (head_dim >= 2).
  a.dmc = read_dmc(a, c, path, variant.qk_norm ? "its per-head q/k norm sits where DMC reads the keys" : "");
  read_rotary(a, c, path, variant);
  read_attention_window(a, c, path, variant);
  if (a.dmc.enabled() && a.sliding_window > 0)
    refuse("dmc_window_size with sliding_window " + std::to_string(a.sliding_window), "(DMC slots under a sliding window)");

  const bool attention_bias = config_bool_or(c, path, "attention_bias", false);
  if (attention_bias && !variant.reads_attention_bias) refuse("attention_bias true", "");
  if (config_bool_or(c, path, "mlp_bias", false)) refuse("mlp_bias true", "");
  for (const char* key : {"attn_logit_softcapping", "final_logit_softcapping", "logit_scale"})
    if (is_set(c, key)) refuse(key, "");

  a.tied_head = config_bool_or(c, path, "tie_word_embeddings", false);
  a.bos_token_id = config_token_id_or(c, path, "bos_token_id", 1, a.vocab);
  a.eos_token_id = config_token_id_or(c, path, "eos_token_id", 2, a.vocab);
  a.prepend_bos = variant.prepend_bos;
  const bool qkv_bias = attention_bias || variant.fixed_qkv_bias, o_bias = attention_bias;
  add_tensors(a, variant, qkv_bias, o_bias);
  a.ignored_suffixes = {"rotary_emb.inv_freq"};
  if (a.tied_head) a.ignored_suffixes.push_back("lm_head.weight");  // a stored copy of the tied head
  return a;
}

}  // namespace kvevict
