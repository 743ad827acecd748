// LLaMA (also Llama 2/3, Mistral, TinyLlama): RMSNorm, SwiGLU, rotate-half RoPE with
// rope_theta, grouped-query attention, tied or untied head.
#include "harness/architecture.h"

namespace kvevict {

ArchSpec describe_llama(const nlohmann::json& c, const std::string& path, const HasTensor&) {
  ArchSpec a;
  a.model_type = "llama";
  a.hidden = config_int(c, path, "hidden_size");
  a.n_layers = config_int(c, path, "num_hidden_layers");
  a.n_heads = config_int(c, path, "num_attention_heads");
  a.n_kv_heads = config_int_or(c, "num_key_value_heads", a.n_heads);
  a.head_dim = config_int_or(c, "head_dim", a.hidden / a.n_heads);
  a.intermediate = config_int(c, path, "intermediate_size");
  a.vocab = config_int(c, path, "vocab_size");
  a.max_positions = config_int_or(c, "max_position_embeddings", 2048);
  a.norm = NormKind::RMSNorm;
  a.norm_eps = config_double_or(c, "rms_norm_eps", 1e-6);
  a.mlp = MlpKind::SwiGLU;
  a.activation = Activation::SiLU;
  a.residual = ResidualKind::PreNormSequential;
  a.positions = PositionKind::Rotary;
  a.rotary_dim = a.head_dim;
  a.rope_theta = config_double_or(c, "rope_theta", 10000.0);
  a.tied_head = config_bool_or(c, "tie_word_embeddings", false);
  a.bos_token_id = static_cast<int>(config_int_or(c, "bos_token_id", 1));
  a.eos_token_id = static_cast<int>(config_int_or(c, "eos_token_id", 2));
  const bool bias = config_bool_or(c, "attention_bias", false);
  const int64_t D = a.hidden, q = a.n_heads * a.head_dim, kv = a.n_kv_heads * a.head_dim;

  auto add = [&](const std::string& name, std::vector<int64_t> shape, Role role, int layer = -1) {
    a.tensors.push_back({name, std::move(shape), role, layer});
  };
  add("model.embed_tokens.weight", {a.vocab, D}, Role::Embed);
  for (int i = 0; i < a.n_layers; ++i) {
    const std::string p = "model.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {D}, Role::AttnNormWeight, i);
    add(p + "self_attn.q_proj.weight", {q, D}, Role::QWeight, i);
    add(p + "self_attn.k_proj.weight", {kv, D}, Role::KWeight, i);
    add(p + "self_attn.v_proj.weight", {kv, D}, Role::VWeight, i);
    add(p + "self_attn.o_proj.weight", {D, q}, Role::OWeight, i);
    if (bias) {
      add(p + "self_attn.q_proj.bias", {q}, Role::QBias, i);
      add(p + "self_attn.k_proj.bias", {kv}, Role::KBias, i);
      add(p + "self_attn.v_proj.bias", {kv}, Role::VBias, i);
      add(p + "self_attn.o_proj.bias", {D}, Role::OBias, i);
    }
    add(p + "post_attention_layernorm.weight", {D}, Role::MlpNormWeight, i);
    add(p + "mlp.gate_proj.weight", {a.intermediate, D}, Role::GateWeight, i);
    add(p + "mlp.up_proj.weight", {a.intermediate, D}, Role::UpWeight, i);
    add(p + "mlp.down_proj.weight", {D, a.intermediate}, Role::DownWeight, i);
  }
  add("model.norm.weight", {D}, Role::FinalNormWeight);
  if (!a.tied_head) add("lm_head.weight", {a.vocab, D}, Role::LmHead);
  a.ignored_suffixes = {"rotary_emb.inv_freq"};
  return a;
}

}  // namespace kvevict
