// OPT (OPTForCausalLM): learned positions with offset 2, LayerNorm with biases, ReLU
// feed-forward, pre-LN or post-LN (opt-350m), optional project_in/project_out around
// a narrower embedding, head tied to the token embedding.
#include "harness/model/architecture.h"
#include "harness/common/errors.h"

namespace kvevict {

static Activation parse_activation(const std::string& name, const std::string& path) {
  if (name == "relu") return Activation::ReLU;
  if (name == "gelu") return Activation::GeluExact;
  if (name == "gelu_new" || name == "gelu_fast" || name == "gelu_pytorch_tanh") return Activation::GeluTanh;
  if (name == "silu" || name == "swish") return Activation::SiLU;
  throw Error(path + ": unsupported activation \"" + name + "\"");
}

ArchSpec describe_opt(const nlohmann::json& c, const std::string& path, const HasTensor& has) {
  ArchSpec a;
  a.model_type = "opt";
  read_mha_shape(a, c, path);
  read_dmc(a, c, path, "learned positions; DMC is read for the LLaMA family");
  a.intermediate = config_int(c, path, "ffn_dim", 1, kMaxIntermediate);
  a.vocab = config_int(c, path, "vocab_size", 1, kMaxVocab);
  a.max_positions = config_int(c, path, "max_position_embeddings", 1, kMaxPositions);
  a.norm = NormKind::LayerNorm;
  a.norm_eps = 1e-5;  // nn.LayerNorm's default; OPT's config has no eps key
  a.mlp = MlpKind::FeedForward;
  a.activation = parse_activation(config_string_or(c, path, "activation_function", "relu"), path);
  const bool pre_ln = config_bool_or(c, path, "do_layer_norm_before", true);
  a.residual = pre_ln ? ResidualKind::PreNormSequential : ResidualKind::PostNorm;
  a.positions = PositionKind::Learned;
  a.position_offset = 2;
  a.has_final_norm = pre_ln && !config_bool_or(c, path, "_remove_final_layer_norm", false);
  a.tied_head = true;
  a.bos_token_id = config_token_id_or(c, path, "bos_token_id", 2, a.vocab);
  a.eos_token_id = config_token_id_or(c, path, "eos_token_id", 2, a.vocab);
  const bool bias = config_bool_or(c, path, "enable_bias", true);
  const int64_t D = a.hidden, F = a.intermediate;
  const int64_t P = config_int_or(c, path, "word_embed_proj_dim", D, 1, kMaxHidden);

  // Hub checkpoints saved from OPTModel name tensors decoder.* without "model.".
  std::string root = has("decoder.embed_tokens.weight") && !has("model.decoder.embed_tokens.weight")
                         ? "decoder."
                         : "model.decoder.";
  auto add = [&](const std::string& name, std::vector<int64_t> shape, Role role, int layer = -1) {
    a.tensors.push_back({name, std::move(shape), role, layer});
  };
  add(root + "embed_tokens.weight", {a.vocab, P}, Role::Embed);
  add(root + "embed_positions.weight", {a.max_positions + a.position_offset, D}, Role::PositionEmbed);
  if (P != D) {
    add(root + "project_in.weight", {D, P}, Role::ProjectIn);
    add(root + "project_out.weight", {P, D}, Role::ProjectOut);
  }
  for (int i = 0; i < a.n_layers; ++i) {
    const std::string p = root + "layers." + std::to_string(i) + ".";
    add(p + "self_attn_layer_norm.weight", {D}, Role::AttnNormWeight, i);
    add(p + "self_attn_layer_norm.bias", {D}, Role::AttnNormBias, i);
    const char* names[] = {"q_proj", "k_proj", "v_proj", "out_proj"};
    const Role weights[] = {Role::QWeight, Role::KWeight, Role::VWeight, Role::OWeight};
    const Role biases[] = {Role::QBias, Role::KBias, Role::VBias, Role::OBias};
    for (int k = 0; k < 4; ++k) {
      add(p + "self_attn." + names[k] + ".weight", {D, D}, weights[k], i);
      if (bias) add(p + "self_attn." + names[k] + ".bias", {D}, biases[k], i);
    }
    add(p + "final_layer_norm.weight", {D}, Role::MlpNormWeight, i);
    add(p + "final_layer_norm.bias", {D}, Role::MlpNormBias, i);
    add(p + "fc1.weight", {F, D}, Role::Fc1Weight, i);
    add(p + "fc2.weight", {D, F}, Role::Fc2Weight, i);
    if (bias) {
      add(p + "fc1.bias", {F}, Role::Fc1Bias, i);
      add(p + "fc2.bias", {D}, Role::Fc2Bias, i);
    }
  }
  if (a.has_final_norm) {
    add(root + "final_layer_norm.weight", {D}, Role::FinalNormWeight);
    add(root + "final_layer_norm.bias", {D}, Role::FinalNormBias);
  }
  a.ignored_suffixes = {"lm_head.weight"};  // tied: some checkpoints store a copy
  return a;
}

}  // namespace kvevict
