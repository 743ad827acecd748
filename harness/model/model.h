// A causal language model from a Hugging Face directory, run through LibTorch.
// One decoder loop serves every architecture (see architecture.h); attention is
// delegated to an AttentionBackend, the single place where eviction happens.
#pragma once
#include "harness/model/tensor.h"

#include <array>
#include <functional>
#include <memory>
#include <string>
#include <vector>

#include "harness/model/architecture.h"
#include "harness/model/dmc.h"
#include "harness/model/matvec.h"
#include "harness/model/safetensors.h"
#include "harness/tokenizers/tokenizer.h"

namespace kvevict {

struct ModelOptions {
  std::string device = "cpu";    // "cpu" or "cuda[:N]"
  std::string dtype = "float32";  // "float32", "bfloat16", "float16" (or "float64" for checks)
  int threads = 0;                // --threads for the math libraries (0: keep the process's setting);
                                  // the caller applies it (use_threads_for), never Model::load
  // The meta device instead of `device`: shapes without data. Not a user's option: the
  // tests run the decoder on it to show that off the CPU no kernel of the project's own
  // reads a tensor through a host pointer (tests/test_device_dispatch.cpp).
  bool shapes_only = false;
  // >= 0: config.json alone, every weight drawn at random with this seed where the model
  // runs (random_weight), so an 8B shape needs no 16 GB file: for speed measurements only.
  int64_t random_weights_seed = -1;
};

// A random weight for speed measurements (make-random-model, random_weights_seed): norms
// 1, every other tensor normal with standard deviation 0.02.
torch::Tensor random_weight(const TensorSpec& spec, const torch::TensorOptions& options);

torch::ScalarType parse_dtype(const std::string& name);
torch::Device parse_device(const std::string& name);

// Attention over already-projected, already-rotated heads.
class AttentionBackend {
 public:
  virtual ~AttentionBackend() = default;
  // q: [t, n_heads, head_dim]; k, v: [t, n_kv_heads, head_dim], for the tokens at
  // positions start .. start+t-1. Returns [t, n_heads * head_dim].
  virtual torch::Tensor attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                               const torch::Tensor& v, int64_t start) = 0;
  // The model's sliding window (0: none): the query at position i never sees keys at
  // positions j <= i - sliding_window. Model::forward sets it before attending.
  void set_sliding_window(int64_t window) { sliding_window_ = window; }
  int64_t sliding_window() const { return sliding_window_; }

  // A DMC model (ArchSpec::dmc): k, v [t, Hkv, d] hold the slot each token leaves as its
  // KV head's last (the key rotated at the token's position), merges [t, Hkv] (uint8, CPU)
  // 1 where that slot replaced the head's previous last slot and 0 where it was appended.
  // Query i attends to every slot its KV head holds after token i. A backend that cannot
  // hold merged slots refuses (this default).
  virtual torch::Tensor attend_merged(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                      const torch::Tensor& v, const torch::Tensor& merges, int64_t start);
  // The sequence's DMC merge state, made at the first call (Model::forward's).
  DmcMergeState& dmc_state(const ArchSpec& arch);
  const DmcMergeState* dmc_state() const { return dmc_.get(); }

 protected:
  int64_t sliding_window_ = 0;
  std::unique_ptr<DmcMergeState> dmc_;  // null for a model without DMC
};

// One sequence's part of a ragged batch (Model::forward_batch): its tokens at positions
// start .. start+t-1, attended through its own backend (its own cache and policy state).
struct BatchSegment {
  std::vector<int> tokens;
  int64_t start = 0;
  AttentionBackend* attention = nullptr;
};

class Model {
 public:
  // Throws kvevict::Error naming the file or tensor at fault. Changes no process-wide
  // setting: the caller sets the threads (use_threads_for).
  static std::unique_ptr<Model> load(const std::string& dir, const ModelOptions& options = {});

  const ArchSpec& arch() const { return arch_; }
  const std::string& dir() const { return dir_; }
  // Null when the directory holds no tokenizer files.
  const Tokenizer* tokenizer() const { return tokenizer_.get(); }
  const Tokenizer& require_tokenizer() const;
  torch::Device device() const { return device_; }
  torch::ScalarType dtype() const { return dtype_; }
  double load_seconds() const { return load_seconds_; }
  // A weight as the model holds it, of layer `layer` (-1: the model's own, as the
  // embedding); undefined where the architecture has none.
  const torch::Tensor& weight(Role role, int layer = -1) const {
    return layer < 0 ? global_[static_cast<int>(role)] : layers_.at(layer)[static_cast<int>(role)];
  }
  // How many whole requests an evaluation may run at once: 1, unless the model's ops are
  // too small to split, when each op runs on one thread and the threads (--threads,
  // default all physical cores) take one request each instead.
  int request_workers() const { return request_workers_; }
  bool runs_ops_on_one_thread() const;  // hidden < 256

  // Text to ids, with BOS first when the model uses one and `add_bos` is set.
  std::vector<int> encode(const std::string& text, bool add_bos) const;

  // Runs tokens at positions start.. through the decoder. Returns logits [t, vocab] on the
  // model's device (float32; float64 for a float64 model).
  torch::Tensor forward(const std::vector<int>& tokens, int64_t start,
                        AttentionBackend& attention) const;

  // Several sequences in one pass, as serving engines flatten a batch: their rows are
  // stacked with no padding, the decode rows (segments of one token) go through each
  // large projection together (matvec() reads each weight row once for all of them), and
  // each segment attends through its own backend at its own positions. Everything else
  // (norms, RoPE, activations, a segment of several tokens) runs per segment with the
  // ops forward() runs, so segment i's logits [t_i, vocab] have the bits that
  // forward(tokens_i, start_i, attention_i) gives alone.
  std::vector<torch::Tensor> forward_batch(const std::vector<BatchSegment>& segments) const;

 private:
  using Slots = std::array<torch::Tensor, kRoleCount>;
  // Where each segment's rows lie in the stacked rows.
  struct RowLayout {
    std::vector<int64_t> first, count;  // [segments]
    torch::Tensor decode_rows;          // [d] long: the rows of one-token segments (undefined if < 2 of them)
    int64_t total = 0;
    // Several segments of one token each (a batch's decode step): a per-row op whose bits
    // do not depend on the number of rows runs once over all of them (per_row).
    bool one_row_each = false;
  };
  torch::Tensor project(const torch::Tensor& x, const torch::Tensor& weight, const torch::Tensor& bias,
                        const RowLayout& rows) const;
  // project() of each weight, the products in one matvec_each() pass where every one of them
  // would be a single matvec() of all of x.
  std::vector<torch::Tensor> project_each(const torch::Tensor& x, const std::vector<Linear>& linears,
                                          const RowLayout& rows) const;
  // fn applied to each segment's rows of x, stacked again.
  torch::Tensor per_segment(const torch::Tensor& x, const RowLayout& rows,
                            const std::function<torch::Tensor(const torch::Tensor&, size_t)>& fn) const;
  // fn of rows that do not read each other: once over every row when each segment is one
  // row and `rows_apart` (fn gives each row the bits it gives that row alone), else per
  // segment. A decode step's ops then cost one dispatch, not one per sequence.
  torch::Tensor per_row(const torch::Tensor& x, const RowLayout& rows, bool rows_apart,
                        const std::function<torch::Tensor(const torch::Tensor&)>& fn) const;
  torch::Tensor norm(const torch::Tensor& x, const torch::Tensor& w, const torch::Tensor& b) const;
  torch::Tensor activation(const torch::Tensor& x) const;
  torch::Tensor attention_block(int layer, const torch::Tensor& h, const std::vector<torch::Tensor>& cos,
                                const std::vector<torch::Tensor>& sin, const std::vector<BatchSegment>& segments,
                                const RowLayout& rows) const;
  torch::Tensor dmc_attention(int layer, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                              const torch::Tensor& cos, const torch::Tensor& sin, int64_t start,
                              AttentionBackend& attention) const;
  torch::Tensor mlp_block(int layer, const torch::Tensor& h, const RowLayout& rows) const;

  std::string dir_;
  ArchSpec arch_;
  WeightStore weights_;
  Slots global_;
  std::vector<Slots> layers_;
  std::unique_ptr<Tokenizer> tokenizer_;
  torch::Device device_{torch::kCPU};
  torch::ScalarType dtype_ = torch::kFloat32;
  torch::Tensor inv_freq_;
  double load_seconds_ = 0;
  int request_workers_ = 1;
};

// Sets the process's math-library threads for running `model`: `threads` (> 0: --threads)
// first; then a tiny model (runs_ops_on_one_thread) runs each op on one thread, setting
// aside the count it replaces, and a bigger model loaded after it without --threads gets
// that count back (a sweep over several models in one process). The CLI and the sweep
// call it after Model::load.
void use_threads_for(const Model& model, int threads);

}  // namespace kvevict
