#include "harness/model/model.h"

#include <torch/cuda.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <tuple>
#include <utility>

#include "harness/common/dtype_names.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/text.h"
#include "harness/model/fused_elementwise.h"
#include "harness/model/matvec.h"
#include "harness/model/model_check.h"
#include "harness/model/rope.h"
#include "harness/model/threads.h"
#include "harness/model/tiled_linear.h"
#include "harness/model/weight_arena.h"

namespace kvevict {
namespace {

// Weights from this size up stream from memory in a decode step; matvec() reads them at
// the bandwidth. Smaller ones (every test model) keep the library paths.
constexpr int64_t kMatvecMinWeightBytes = int64_t{1} << 20;

// x [t, in] through weight [out, in] (+ bias). One row on the CPU is a matrix-vector
// product: sgemm would pack the whole weight matrix for that single row.
// Large float32 and bfloat16 weights use matvec(); everything else tiled_linear(), whose
// numbers, like matvec()'s, do not depend on the thread count.
torch::Tensor project_alone(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias = {}) {
  if (x.dim() == 2 && x.size(0) == 1 && weight.nbytes() >= kMatvecMinWeightBytes &&
      matvec_supported(weight, x, bias))
    return matvec(weight, x, bias);
  return tiled_linear(x, weight, bias);
}

torch::Tensor silu_in_chunks(const torch::Tensor& x) {
  return elementwise_in_chunks(x, [](const torch::Tensor& c) { return torch::silu(c); });
}

}  // namespace

torch::Tensor random_weight(const TensorSpec& spec, const torch::TensorOptions& options) {
  if (spec.name.find("norm") != std::string::npos) return torch::ones(spec.shape, options);
  return (torch::randn(spec.shape, options.dtype(torch::kFloat32)) * 0.02).to(options.dtype());
}

torch::ScalarType parse_dtype(const std::string& name) {
  switch (parse_dtype_name(name)) {
    case DtypeName::Float32: return torch::kFloat32;
    case DtypeName::BFloat16: return torch::kBFloat16;
    case DtypeName::Float16: return torch::kFloat16;
    case DtypeName::Float64: return torch::kFloat64;
  }
  throw Error("unknown dtype \"" + name + "\"");
}

torch::Device parse_device(const std::string& name) {
  if (name == "cpu") return torch::kCPU;
  if (name.rfind("cuda", 0) == 0) {
    if (!torch::cuda::is_available())
      throw Error("device " + name + " requested but this LibTorch build sees no CUDA device");
    return torch::Device(name);
  }
  throw Error("unknown device \"" + name + "\" (use cpu or cuda)");
}

torch::Tensor AttentionBackend::attend_merged(int, const torch::Tensor&, const torch::Tensor&, const torch::Tensor&,
                                             const torch::Tensor&, int64_t) {
  throw Error("this attention backend cannot run a DMC model (config.json dmc_window_size)");
}

DmcMergeState& AttentionBackend::dmc_state(const ArchSpec& arch) {
  if (!dmc_) dmc_ = std::make_unique<DmcMergeState>(arch);
  return *dmc_;
}

bool Model::runs_ops_on_one_thread() const { return arch_.hidden < 256; }

void use_threads_for(const Model& model, int threads) {
  if (threads > 0) set_thread_count(threads);
  if (model.runs_ops_on_one_thread())
    use_one_thread_for_tiny_model();
  else
    restore_threads_after_tiny_model();  // what a tiny model loaded before set aside, unless --threads chose
}

std::unique_ptr<Model> Model::load(const std::string& dir, const ModelOptions& options) {
  namespace fs = std::filesystem;
  auto started = std::chrono::steady_clock::now();
  auto model = std::unique_ptr<Model>(new Model());
  model->dir_ = dir;
  model->device_ = options.shapes_only ? torch::Device(torch::kMeta) : parse_device(options.device);
  model->dtype_ = parse_dtype(options.dtype);

  const std::string config_path = (fs::path(dir) / "config.json").string();
  if (!fs::exists(config_path)) throw Error(config_path + ": no such file (not a model directory?)");
  const nlohmann::json config = read_json_file(config_path);
  checked_model_type(config, config_path);  // a bad model_type is a config error, before any weights
  const bool random = options.random_weights_seed >= 0;
  if (!random) model->weights_ = WeightStore::open(dir);
  const WeightStore& weights = model->weights_;
  model->arch_ = describe_architecture(config, config_path,
                                       [&](const std::string& n) { return random || weights.has(n); });
  const ArchSpec& arch = model->arch_;
  // A tiny model's ops are too small to split: an OpenMP team costs more than it saves
  // (stories260K's RTE ran 20x slower on 2 threads than on 1 on a loaded machine). Its
  // threads run whole requests instead, each op on one thread (use_threads_for), so no
  // number changes.
  if (model->runs_ops_on_one_thread())
    model->request_workers_ = options.threads > 0 ? options.threads : physical_core_count();

  if (!random) check_tensors_match_config(arch, weights, dir);
  if (random) torch::manual_seed(static_cast<uint64_t>(options.random_weights_seed));
  model->layers_.resize(arch.n_layers);
  // On the CPU the weights are copied into 2 MiB pages (weight_arena.h) where memory allows.
  size_t arena_bytes = 0;
  for (const TensorSpec& spec : arch.tensors)
    arena_bytes += weight_arena_bytes(c10::multiply_integers(spec.shape), model->dtype_);
  std::unique_ptr<WeightArena> arena;
  if (model->device_.is_cpu() && WeightArena::fits_in_memory(arena_bytes))
    arena = std::make_unique<WeightArena>(arena_bytes);
  for (const TensorSpec& spec : arch.tensors) {
    const auto options = torch::TensorOptions().dtype(model->dtype_).device(model->device_);
    torch::Tensor t;
    if (arena)
      t = arena->copy_of(random ? random_weight(spec, options) : weights.stored(spec.name), model->dtype_);
    else
      t = random ? random_weight(spec, options) : weights.get(spec.name, model->dtype_, model->device_);
    if (spec.layer < 0)
      model->global_[static_cast<int>(spec.role)] = t;
    else
      model->layers_[spec.layer][static_cast<int>(spec.role)] = t;
  }
  if (arch.tied_head) model->global_[static_cast<int>(Role::LmHead)] = model->global_[static_cast<int>(Role::Embed)];
  if (arena) model->weights_ = WeightStore();  // nothing views the checkpoint's mapping now: unmap it

  // inv_freq in float32, as Hugging Face computes it (dynamic NTK: again per pass); float64
  // runs in float64, as the float64 references compute it.
  if (arch.positions == PositionKind::Rotary)
    model->inv_freq_ = rope_inv_freq(arch, arch.max_positions, model->dtype_ == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32);
  model->tokenizer_ = load_tokenizer_for_model(dir);
  check_tokenizer_fits(model->tokenizer_.get(), arch, dir);
  model->load_seconds_ = seconds_since(started);
  return model;
}

const Tokenizer& Model::require_tokenizer() const {
  if (!tokenizer_)
    throw Error(dir_ + ": no tokenizer (tokenizer.model, tokenizer.json or vocab.json + merges.txt); "
                "use --tokens-file");
  return *tokenizer_;
}

std::vector<int> Model::encode(const std::string& text, bool add_bos) const {
  std::vector<int> ids;
  // The tokenizer's own tokenizer_config.json decides when it has one (Llama-3: yes, Qwen: no).
  const std::optional<int> declared = require_tokenizer().declared_bos();
  const int bos = declared ? *declared : (arch_.prepend_bos ? arch_.bos_token_id : -1);
  if (add_bos && bos >= 0) ids.push_back(bos);
  auto body = require_tokenizer().encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  return ids;
}

torch::Tensor Model::norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) const {
  if (arch_.norm == NormKind::RMSNorm) return rms_norm(x, w, arch_.norm_eps);
  return torch::layer_norm(x, {arch_.hidden}, w, b, arch_.norm_eps);
}

torch::Tensor Model::activation(const torch::Tensor& x) const {
  switch (arch_.activation) {
    case Activation::SiLU: return silu_in_chunks(x);
    case Activation::ReLU: return torch::relu(x);  // exact either way
    case Activation::GeluExact: return elementwise_in_chunks(x, [](const torch::Tensor& c) { return torch::gelu(c); });
    case Activation::GeluTanh:
      return elementwise_in_chunks(x, [](const torch::Tensor& c) { return torch::gelu(c, "tanh"); });
  }
  return x;
}

torch::Tensor Model::project(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                             const RowLayout& rows) const {
  // One product for all rows off the CPU: the device's GEMM reads the weights once for the
  // batch (per-segment bits are the CPU's contract; a device's GEMM may round a row
  // differently with the row count, within the goldens' tolerance).
  if (rows.first.size() == 1 || !x.device().is_cpu()) return project_alone(x, weight, bias);
  // The decode rows together when project_alone() gives a single row to matvec(), whose
  // rows of a batch have the bits of each row alone; every other case per segment.
  const bool together = rows.decode_rows.defined() && weight.nbytes() >= kMatvecMinWeightBytes &&
                        matvec_supported(weight, x.narrow(0, 0, 1), bias);
  if (together && rows.decode_rows.size(0) == rows.total) return matvec(weight, x, bias);
  const torch::Tensor decoded = together ? matvec(weight, x.index_select(0, rows.decode_rows), bias) : torch::Tensor();
  std::vector<torch::Tensor> parts;  // [segments]: each [t_i, out]
  int64_t next_decoded = 0;
  for (size_t i = 0; i < rows.first.size(); ++i) {
    if (together && rows.count[i] == 1)
      parts.push_back(decoded.narrow(0, next_decoded++, 1));
    else
      parts.push_back(project_alone(x.narrow(0, rows.first[i], rows.count[i]), weight, bias));
  }
  return torch::cat(parts, 0);
}

std::vector<torch::Tensor> Model::project_each(const torch::Tensor& x, const std::vector<Linear>& linears,
                                               const RowLayout& rows) const {
  // Whether project() of x is one matvec() of all of its rows: a single-row segment, or a
  // batch whose segments are all decode rows, through a weight matvec() takes.
  const bool all_rows =
      x.dim() == 2 && (rows.first.size() == 1 ? x.size(0) == 1
                                              : rows.decode_rows.defined() && rows.decode_rows.size(0) == rows.total);
  bool one_pass = all_rows;
  for (const Linear& l : linears)
    one_pass = one_pass && l.weight.nbytes() >= kMatvecMinWeightBytes && matvec_supported(l.weight, x, l.bias);
  if (one_pass) return matvec_each(linears, x);
  std::vector<torch::Tensor> out;  // [linears]
  for (const Linear& l : linears) out.push_back(project(x, l.weight, l.bias, rows));
  return out;
}

torch::Tensor Model::per_segment(const torch::Tensor& x, const RowLayout& rows,
                                 const std::function<torch::Tensor(const torch::Tensor&, size_t)>& fn) const {
  if (rows.first.size() == 1) return fn(x, 0);
  std::vector<torch::Tensor> parts;  // [segments]
  for (size_t i = 0; i < rows.first.size(); ++i) parts.push_back(fn(x.narrow(0, rows.first[i], rows.count[i]), i));
  return torch::cat(parts, 0);
}

namespace {
// An activation (elementwise_in_chunks: fixed chunks, each a serial ATen loop whose
// vectorised body, two vectors a step, and scalar tail round differently) gives a row of
// `width` elements the bits it gives that row alone when the rows hold whole steps of the
// widest ISA (2 x 16 floats) and the chunks start at row starts.
bool activation_rows_apart(int64_t width) { return width % 32 == 0 && kElementwiseChunk % width == 0; }
}  // namespace

torch::Tensor Model::per_row(const torch::Tensor& x, const RowLayout& rows, bool rows_apart,
                             const std::function<torch::Tensor(const torch::Tensor&)>& fn) const {
  if (rows.one_row_each && rows_apart && x.device().is_cpu()) return fn(x);  // CUDA's kernels: not checked
  return per_segment(x, rows, [&](const torch::Tensor& part, size_t) { return fn(part); });
}

torch::Tensor Model::attention_block(int layer, const torch::Tensor& h, const std::vector<torch::Tensor>& cos,
                                     const std::vector<torch::Tensor>& sin, const std::vector<BatchSegment>& segments,
                                     const RowLayout& rows) const {
  const Slots& w = layers_[layer];
  auto W = [&](Role r) -> const torch::Tensor& { return w[static_cast<int>(r)]; };
  const int64_t t = h.size(0), hd = arch_.head_dim;  // t: the rows of every segment
  torch::Tensor q, k, v;
  if (arch_.qkv == QkvLayout::FusedPerHead) {
    auto qkv = project(h, W(Role::QkvWeight), W(Role::QkvBias), rows).view({t, arch_.n_heads, 3 * hd});
    q = qkv.narrow(2, 0, hd);
    k = qkv.narrow(2, hd, hd);
    v = qkv.narrow(2, 2 * hd, hd);
  } else if (arch_.qkv == QkvLayout::FusedRows) {
    const int64_t q_rows = arch_.n_heads * hd, kv_rows = arch_.n_kv_heads * hd;
    auto qkv = project(h, W(Role::QkvWeight), W(Role::QkvBias), rows);
    q = qkv.narrow(1, 0, q_rows).reshape({t, arch_.n_heads, hd});
    k = qkv.narrow(1, q_rows, kv_rows).reshape({t, arch_.n_kv_heads, hd});
    v = qkv.narrow(1, q_rows + kv_rows, kv_rows).reshape({t, arch_.n_kv_heads, hd});
  } else {
    const auto qkv = project_each(
        h, {{W(Role::QWeight), W(Role::QBias)}, {W(Role::KWeight), W(Role::KBias)}, {W(Role::VWeight), W(Role::VBias)}},
        rows);
    q = qkv[0].view({t, arch_.n_heads, hd});
    k = qkv[1].view({t, arch_.n_kv_heads, hd});
    v = qkv[2].view({t, arch_.n_kv_heads, hd});
  }
  if (W(Role::QNormWeight).defined()) {  // Qwen3: RMSNorm over head_dim of every head, before RoPE
    q = per_segment(q, rows, [&](const torch::Tensor& x, size_t) { return rms_norm(x, W(Role::QNormWeight), arch_.norm_eps); });
    k = per_segment(k, rows, [&](const torch::Tensor& x, size_t) { return rms_norm(x, W(Role::KNormWeight), arch_.norm_eps); });
  }
  if (arch_.dmc.enabled()) {  // merged slots before RoPE, per segment (its own merge state)
    auto out = per_segment(q, rows, [&](const torch::Tensor& segment_q, size_t i) {
      const int64_t first = rows.first[i], count = rows.count[i];
      return dmc_attention(layer, segment_q, k.narrow(0, first, count), v.narrow(0, first, count), cos[i], sin[i],
                           segments[i].start, *segments[i].attention);
    });
    return project(out, W(Role::OWeight), W(Role::OBias), rows);
  }
  if (arch_.positions == PositionKind::Rotary) {
    if (rows.one_row_each) {  // an element-wise loop: each row with its own position's cos and sin
      const auto all_cos = torch::cat(cos, 0), all_sin = torch::cat(sin, 0);  // [segments, 1, rotary_dim]
      q = rotate_half(q, all_cos, all_sin, arch_.rotary_dim);
      k = rotate_half(k, all_cos, all_sin, arch_.rotary_dim);
    } else {
      auto rotate = [&](const torch::Tensor& x, size_t i) { return rotate_half(x, cos[i], sin[i], arch_.rotary_dim); };
      q = per_segment(q, rows, rotate);
      k = per_segment(k, rows, rotate);
    }
  }
  auto attend_segment = [&](const torch::Tensor& segment_q, size_t i) {
    const int64_t first = rows.first[i], count = rows.count[i];
    const bool alone = rows.first.size() == 1;
    return segments[i].attention->attend(layer, segment_q.contiguous(), (alone ? k : k.narrow(0, first, count)).contiguous(),
                                         (alone ? v : v.narrow(0, first, count)).contiguous(), segments[i].start);
  };
  torch::Tensor out;  // [t, Hq*d]
  if (rows.one_row_each && q.device().is_cpu()) {
    // A decode step: each sequence's attention (its single-query products and its
    // policy) on one thread, the sequences spread over the threads. One after another,
    // each split its tiny ops over the threads while the others waited. A sequence's
    // numbers do not depend on the thread count (the [threads] tests), so none moves.
    std::vector<torch::Tensor> parts(segments.size());  // [segments]: each [1, Hq*d]
    at::parallel_for(0, static_cast<int64_t>(segments.size()), 1, [&](int64_t begin, int64_t end) {
      for (int64_t i = begin; i < end; ++i) parts[i] = attend_segment(q.narrow(0, i, 1), static_cast<size_t>(i));
    });
    out = torch::cat(parts, 0);
  } else {
    out = per_segment(q, rows, attend_segment);
  }
  return project(out, W(Role::OWeight), W(Role::OBias), rows);
}

// DMC (dmc.h): before RoPE the merge state turns q, k, v into the queries and the slots;
// each slot key is rotated at its token's position, and its dimension D-1, which RoPE
// filled again from its pair, is zeroed once more.
torch::Tensor Model::dmc_attention(int layer, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                   const torch::Tensor& cos, const torch::Tensor& sin, int64_t start,
                                   AttentionBackend& attention) const {
  DmcSlots slots = attention.dmc_state(arch_).step(layer, q, k, v, start);
  auto q_rotated = rotate_half(slots.q, cos, sin, arch_.rotary_dim).contiguous();
  auto k_rotated = rotate_half(slots.k, cos, sin, arch_.rotary_dim).contiguous();
  k_rotated.select(2, arch_.head_dim - 1).zero_();
  return attention.attend_merged(layer, q_rotated, k_rotated, slots.v.contiguous(), slots.merges, start);
}

torch::Tensor Model::mlp_block(int layer, const torch::Tensor& h, const RowLayout& rows) const {
  const Slots& w = layers_[layer];
  auto W = [&](Role r) -> const torch::Tensor& { return w[static_cast<int>(r)]; };
  const int64_t F = arch_.intermediate;
  // silu(gate) * up: one pass over the whole batch where the fused loop takes it (each
  // element's bits its own); else the activation by row (per_row) and the product
  // element-wise over the batch, which splits no differently per segment.
  auto gated = [&](const torch::Tensor& gate, const torch::Tensor& up) {
    if (fused_elementwise_supported(gate, up)) return silu_times(gate, up);
    return per_row(gate, rows, activation_rows_apart(F), [](const torch::Tensor& g) { return silu_in_chunks(g); }) * up;
  };
  if (arch_.mlp == MlpKind::SwiGLU && W(Role::GateUpWeight).defined()) {
    auto gate_up = project(h, W(Role::GateUpWeight), {}, rows);
    return project(gated(gate_up.narrow(-1, 0, F), gate_up.narrow(-1, F, F)), W(Role::DownWeight), {}, rows);
  }
  if (arch_.mlp == MlpKind::SwiGLU) {
    const auto gate_up = project_each(h, {{W(Role::GateWeight), {}}, {W(Role::UpWeight), {}}}, rows);
    return project(gated(gate_up[0], gate_up[1]), W(Role::DownWeight), {}, rows);
  }
  auto hidden = project(h, W(Role::Fc1Weight), W(Role::Fc1Bias), rows);
  return project(per_row(hidden, rows, activation_rows_apart(F), [&](const torch::Tensor& x) { return activation(x); }),
                 W(Role::Fc2Weight), W(Role::Fc2Bias), rows);
}

torch::Tensor Model::forward(const std::vector<int>& tokens, int64_t start,
                             AttentionBackend& attention) const {
  return forward_batch({BatchSegment{tokens, start, &attention}}).front();
}

std::vector<torch::Tensor> Model::forward_batch(const std::vector<BatchSegment>& segments) const {
  torch::NoGradGuard no_grad;
  if (segments.empty()) return {};
  RowLayout rows;
  std::vector<int64_t> ids, decode_rows;  // [total], [one-token segments]
  for (size_t i = 0; i < segments.size(); ++i) {
    const BatchSegment& segment = segments[i];
    if (!segment.attention) throw Error("internal: batch segment " + std::to_string(i) + " has no attention backend");
    if (segments.size() > 1 && segment.tokens.empty())
      throw Error("internal: batch segment " + std::to_string(i) + " has no tokens");
    for (int id : segment.tokens)
      if (id < 0 || id >= arch_.vocab)
        throw Error("token id " + std::to_string(id) + " is outside the vocabulary (size " +
                    std::to_string(arch_.vocab) + ")");
    const int64_t t = static_cast<int64_t>(segment.tokens.size());
    rows.first.push_back(rows.total);
    rows.count.push_back(t);
    if (t == 1) decode_rows.push_back(rows.total);
    rows.total += t;
    ids.insert(ids.end(), segment.tokens.begin(), segment.tokens.end());
  }
  if (decode_rows.size() >= 2) rows.decode_rows = torch::tensor(decode_rows, torch::kLong).to(device_);
  rows.one_row_each = segments.size() >= 2 && rows.total == static_cast<int64_t>(segments.size());
  auto G = [&](Role r) -> const torch::Tensor& { return global_[static_cast<int>(r)]; };
  auto id_tensor = torch::tensor(ids, torch::kLong).to(device_);
  // Advanced indexing, not index_select: the same rows, and it has a meta kernel (the
  // device-dispatch test runs the decoder on the meta device).
  auto x = G(Role::Embed).index({id_tensor});  // [total, hidden]
  if (G(Role::ProjectIn).defined()) x = project(x, G(Role::ProjectIn), {}, rows);

  std::vector<torch::Tensor> cos, sin;  // [segments]: each [t_i, 1, rotary_dim]
  std::vector<torch::Tensor> positions;  // learned positions: [segments], each [t_i]
  for (const BatchSegment& segment : segments) {
    const int64_t start = segment.start, t = static_cast<int64_t>(segment.tokens.size());
    if (arch_.positions == PositionKind::Learned) {
      positions.push_back(torch::arange(start, start + t, torch::kLong));
      if (start + t + arch_.position_offset > G(Role::PositionEmbed).size(0))
        throw Error("sequence of " + std::to_string(start + t) + " tokens exceeds the model's " +
                    std::to_string(arch_.max_positions) + " learned positions");
    } else {
      const auto table = inv_freq_.defined() ? inv_freq_.scalar_type() : torch::kFloat32;
      const auto inv_freq = rope_depends_on_length(arch_) ? rope_inv_freq(arch_, start + t, table) : inv_freq_;
      auto [segment_cos, segment_sin] = rope_cos_sin(inv_freq, start, t, dtype_, device_);
      cos.push_back(std::move(segment_cos));
      sin.push_back(std::move(segment_sin));
    }
  }
  if (arch_.positions == PositionKind::Learned) {
    auto all = positions.size() == 1 ? positions.front() : torch::cat(positions, 0);
    x = x + G(Role::PositionEmbed).index({(all + arch_.position_offset).to(device_)});
  }

  for (const BatchSegment& segment : segments) segment.attention->set_sliding_window(arch_.sliding_window);
  // RMSNorm's one reduction sums each row on its own (fused_elementwise.h; ATen's mean over
  // the last dimension likewise, below ATen's grain on one thread): a row's bits do not
  // depend on the others.
  const bool norm_rows_apart = arch_.norm == NormKind::RMSNorm;
  auto norm_rows = [&](const torch::Tensor& in, const Slots& layer, Role weight, Role bias) {
    return per_row(in, rows, norm_rows_apart, [&](const torch::Tensor& part) {
      return norm(part, layer[static_cast<int>(weight)], layer[static_cast<int>(bias)]);
    });
  };
  // A residual sum and its norm, the next block's input: one pass over the rows where the
  // fused RMSNorm takes them (the sum has ATen's bits, each row's norm is its own).
  auto add_norm = [&](const torch::Tensor& in, const torch::Tensor& delta, const Slots& layer, Role weight,
                      Role bias) -> std::pair<torch::Tensor, torch::Tensor> {
    const torch::Tensor& w = layer[static_cast<int>(weight)];
    if (arch_.norm == NormKind::RMSNorm && fused_elementwise_supported(in, w))
      return add_rms_norm(in, delta, w, arch_.norm_eps);
    auto sum = in + delta;
    return {sum, norm_rows(sum, layer, weight, bias)};
  };
  torch::Tensor h;  // PreNormSequential: the norm of x that the next block reads
  for (int l = 0; l < arch_.n_layers; ++l) {
    const Slots& w = layers_[l];
    auto attend = [&](const torch::Tensor& in) { return attention_block(l, in, cos, sin, segments, rows); };
    switch (arch_.residual) {
      case ResidualKind::PreNormSequential: {
        if (l == 0) h = norm_rows(x, w, Role::AttnNormWeight, Role::AttnNormBias);
        std::tie(x, h) = add_norm(x, attend(h), w, Role::MlpNormWeight, Role::MlpNormBias);
        const torch::Tensor mlp = mlp_block(l, h, rows);
        if (l + 1 < arch_.n_layers)
          std::tie(x, h) = add_norm(x, mlp, layers_[l + 1], Role::AttnNormWeight, Role::AttnNormBias);
        else
          x = x + mlp;
        break;
      }
      case ResidualKind::PreNormParallel:
        x = x + attend(norm_rows(x, w, Role::AttnNormWeight, Role::AttnNormBias)) +
            mlp_block(l, norm_rows(x, w, Role::MlpNormWeight, Role::MlpNormBias), rows);
        break;
      case ResidualKind::PostNorm:
        x = norm_rows(x + attend(x), w, Role::AttnNormWeight, Role::AttnNormBias);
        x = norm_rows(x + mlp_block(l, x, rows), w, Role::MlpNormWeight, Role::MlpNormBias);
        break;
    }
  }
  if (arch_.has_final_norm)
    x = per_segment(x, rows, [&](const torch::Tensor& part, size_t) {
      return norm(part, G(Role::FinalNormWeight), G(Role::FinalNormBias));
    });
  if (G(Role::ProjectOut).defined()) x = project(x, G(Role::ProjectOut), {}, rows);
  const auto out_type = dtype_ == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
  // [total, vocab] on the model's device: a device run's scorer reads it there (scorer.h).
  auto logits = project(x, G(Role::LmHead), {}, rows).to(out_type);
  if (segments.size() == 1) return {logits};
  std::vector<torch::Tensor> out;  // [segments]: each [t_i, vocab]
  // Copies, so that a sequence keeping its rows does not keep the whole batch's.
  for (size_t i = 0; i < segments.size(); ++i) out.push_back(logits.narrow(0, rows.first[i], rows.count[i]).clone());
  return out;
}

}  // namespace kvevict
