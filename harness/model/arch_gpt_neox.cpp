// GPT-NeoX / Pythia: fused query_key_value laid out per head, partial rotary
// (rotary_pct) with rotate-half, parallel or sequential residual, exact-erf GELU,
// untied embed_out.
#include "harness/model/architecture.h"
#include "harness/common/errors.h"

namespace kvevict {

ArchSpec describe_gpt_neox(const nlohmann::json& c, const std::string& path, const HasTensor&) {
  ArchSpec a;
  a.model_type = "gpt_neox";
  read_mha_shape(a, c, path);
  read_dmc(a, c, path, "DMC is read for the LLaMA family");
  a.intermediate = config_int(c, path, "intermediate_size", 1, kMaxIntermediate);
  a.vocab = config_int(c, path, "vocab_size", 1, kMaxVocab);
  a.max_positions = config_int_or(c, path, "max_position_embeddings", 2048, 1, kMaxPositions);
  a.norm = NormKind::LayerNorm;
  a.norm_eps = config_double_or(c, path, "layer_norm_eps", 1e-5, 0, 1);
  a.mlp = MlpKind::FeedForward;
  const std::string act = config_string_or(c, path, "hidden_act", "gelu");
  if (act == "gelu") a.activation = Activation::GeluExact;
  else if (act == "gelu_new" || act == "gelu_fast" || act == "gelu_pytorch_tanh") a.activation = Activation::GeluTanh;
  else if (act == "relu") a.activation = Activation::ReLU;
  else throw Error(path + ": unsupported hidden_act \"" + act + "\"");
  a.residual = config_bool_or(c, path, "use_parallel_residual", true) ? ResidualKind::PreNormParallel
                                                                : ResidualKind::PreNormSequential;
  a.positions = PositionKind::Rotary;
  a.qkv = QkvLayout::FusedPerHead;
  a.rotary_dim = read_rotary_dim(a, c, path, "rotary_pct", 0.25);
  a.rope_theta = config_double_or(c, path, "rotary_emb_base",
                                  config_double_or(c, path, "rope_theta", 10000.0, 1, 1e12), 1, 1e12);
  a.tied_head = config_bool_or(c, path, "tie_word_embeddings", false);
  a.bos_token_id = config_token_id_or(c, path, "bos_token_id", 0, a.vocab);
  a.eos_token_id = config_token_id_or(c, path, "eos_token_id", 0, a.vocab);
  a.prepend_bos = false;  // the GPT-NeoX tokenizer adds no BOS
  const bool bias = config_bool_or(c, path, "attention_bias", true);
  const int64_t D = a.hidden, F = a.intermediate;

  auto add = [&](const std::string& name, std::vector<int64_t> shape, Role role, int layer = -1) {
    a.tensors.push_back({name, std::move(shape), role, layer});
  };
  add("gpt_neox.embed_in.weight", {a.vocab, D}, Role::Embed);
  for (int i = 0; i < a.n_layers; ++i) {
    const std::string p = "gpt_neox.layers." + std::to_string(i) + ".";
    add(p + "input_layernorm.weight", {D}, Role::AttnNormWeight, i);
    add(p + "input_layernorm.bias", {D}, Role::AttnNormBias, i);
    add(p + "post_attention_layernorm.weight", {D}, Role::MlpNormWeight, i);
    add(p + "post_attention_layernorm.bias", {D}, Role::MlpNormBias, i);
    add(p + "attention.query_key_value.weight", {3 * D, D}, Role::QkvWeight, i);
    if (bias) add(p + "attention.query_key_value.bias", {3 * D}, Role::QkvBias, i);
    add(p + "attention.dense.weight", {D, D}, Role::OWeight, i);
    if (bias) add(p + "attention.dense.bias", {D}, Role::OBias, i);
    add(p + "mlp.dense_h_to_4h.weight", {F, D}, Role::Fc1Weight, i);
    add(p + "mlp.dense_h_to_4h.bias", {F}, Role::Fc1Bias, i);
    add(p + "mlp.dense_4h_to_h.weight", {D, F}, Role::Fc2Weight, i);
    add(p + "mlp.dense_4h_to_h.bias", {D}, Role::Fc2Bias, i);
  }
  add("gpt_neox.final_layer_norm.weight", {D}, Role::FinalNormWeight);
  add("gpt_neox.final_layer_norm.bias", {D}, Role::FinalNormBias);
  if (!a.tied_head) add("embed_out.weight", {a.vocab, D}, Role::LmHead);
  // Old Pythia checkpoints carry these buffers; HF skips them on load.
  a.ignored_suffixes = {"attention.bias", "attention.masked_bias", "attention.rotary_emb.inv_freq"};
  return a;
}

}  // namespace kvevict
