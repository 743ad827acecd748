#include "harness/runtime/attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <limits>

#include "harness/common/errors.h"
#include "harness/model/threads.h"
#include "harness/runtime/causal_softmax.h"
#include "harness/runtime/double_exp.h"

namespace kvevict {
namespace {

// q [t, Hq, d] -> [Hkv, g*t, d], grouping query heads by their KV head
// (query head h uses KV head h / g, as Hugging Face's repeat_kv).
torch::Tensor group_queries(const torch::Tensor& q, int64_t n_kv) {
  const int64_t t = q.size(0), hq = q.size(1), d = q.size(2);
  return q.permute({1, 0, 2}).reshape({n_kv, (hq / n_kv) * t, d});
}

// [Hkv, g*t, d] -> [t, Hq*d]
torch::Tensor ungroup_output(const torch::Tensor& out, int64_t t, int64_t hq) {
  const int64_t d = out.size(2);
  return out.reshape({hq, t, d}).permute({1, 0, 2}).reshape({t, hq * d});
}

// Products below this many multiply-adds per head stay one torch::bmm: ATen computes
// bmm's tiny products (under 400) with its own loop, not sgemm, and one call is cheaper there.
constexpr int64_t kPerHeadProductMin = int64_t{1} << 16;

// a [B, m, k] @ b [B, k, n], each batch entry (a KV head) on one thread. torch::bmm makes one
// sgemm call per head and OpenBLAS splits each over all threads, so attention-sized products
// (170 x 64 x 1024) spent their time in thread hand-offs. Inside the parallel region OpenBLAS
// runs single-threaded, so every head gets the numbers a one-thread run gets: results no
// longer depend on the thread count (OpenBLAS's split products rounded differently).
torch::Tensor heads_bmm(const torch::Tensor& a, const torch::Tensor& b) {
  const int64_t heads = a.size(0);
  if (heads < 2 || at::get_num_threads() < 2 || at::in_parallel_region() || !a.device().is_cpu() ||
      a.size(1) * a.size(2) * b.size(2) < kPerHeadProductMin) {
    BlasOnThisThread one_thread;  // nor may OpenBLAS split a head's product (threads.h)
    return torch::bmm(a, b);
  }
  auto out = torch::empty({heads, a.size(1), b.size(2)}, a.options());
  at::parallel_for(0, heads, 1, [&](int64_t begin, int64_t end) {
    for (int64_t h = begin; h < end; ++h) {
      auto slice = out.select(0, h);
      at::mm_out(slice, a.select(0, h), b.select(0, h));
    }
  });
  return out;
}

int64_t element_bytes(torch::ScalarType type) { return static_cast<int64_t>(c10::elementSize(type)); }

// Attention scores, softmax and the weighted sum of values: float32 for float32 and
// half models (softmax never in half), float64 for float64 reference runs.
torch::ScalarType accumulation_type(torch::ScalarType compute) {
  return compute == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
}

// Scaled attention logits [Hkv, g*t, n] of queries q [t, Hq, d] against keys
// [Hkv, n, d], in the accumulation type.
torch::Tensor attention_logits(const torch::Tensor& q, const torch::Tensor& keys) {
  const auto acc = accumulation_type(q.scalar_type());
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  return heads_bmm(group_queries(q, keys.size(0)).to(acc), keys.transpose(1, 2).to(acc)).mul_(scale);
}

// Query rows per block of the sim-only policies' logits: few blocks, none small.
constexpr int64_t kSimBlockRows = 256;

// The sim-only policies' input, a block of query rows at a time: for rows r0 .. r0+rows-1
// of q [T, Hq, d], their scaled logits against keys 0 .. r0+rows-1 (keys [Hkv, T, d]) as
// one contiguous float32 CPU block [Hq, rows, n = r0 + rows], with the keys a model's
// sliding window hides from row i (j <= i - window) at -inf: the window comes before the
// policy. Each logit is the same length-d product of the same operands as in
// attention_logits' whole [T, T] product. Calls block_fn(r0, rows, n, block) in row order.
template <typename BlockFn>
void for_each_causal_logits_block(const torch::Tensor& q, const torch::Tensor& keys, int64_t window,
                                  BlockFn&& block_fn) {
  const int64_t T = q.size(0), hq = q.size(1), n_kv = keys.size(0);
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(2)));
  const auto keys_t = keys.transpose(1, 2).to(accumulation_type(q.scalar_type()));  // [Hkv, d, T]
  for (int64_t r0 = 0; r0 < T; r0 += kSimBlockRows) {
    const int64_t rows = std::min(kSimBlockRows, T - r0), n = r0 + rows;
    auto block = heads_bmm(group_queries(q.narrow(0, r0, rows), n_kv).to(keys_t.scalar_type()), keys_t.narrow(2, 0, n))
                     .mul_(scale)
                     .to(torch::kCPU, torch::kFloat32)
                     .contiguous()
                     .view({hq, rows, n});
    float* logits = block.data_ptr<float>();
    if (window > 0)
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t r = 0; r < rows; ++r) {
          const int64_t hidden = std::min(n, r0 + r - window + 1);
          if (hidden > 0) std::fill_n(logits + (h * rows + r) * n, hidden, -std::numeric_limits<float>::infinity());
        }
    block_fn(r0, rows, n, logits);
  }
}

// probs [Hkv, g*t, n] times values [Hkv, n, d] -> [t, Hq*d] in `out_type`.
torch::Tensor weighted_values(const torch::Tensor& probs, const torch::Tensor& values, int64_t t,
                              int64_t hq, torch::ScalarType out_type) {
  return ungroup_output(heads_bmm(probs, values.to(probs.scalar_type())), t, hq).to(out_type);
}

// Query rows per block of the blocked causal attention: about 2M scores (8 MB in
// float32) per block, so no [heads, T, T] buffer is ever made.
int64_t query_block_rows(int64_t hq, int64_t n) {
  constexpr int64_t kBlockScores = int64_t{1} << 21;
  return std::max<int64_t>(16, kBlockScores / std::max<int64_t>(1, hq * n));
}

// Attention of queries q [t, Hq, d] at positions n_prev .. n_prev+t-1 over keys and
// values [Hkv, n_prev + t, d] whose row j holds position j, one block of query rows at
// a time. A block sees keys 0 .. (its last query), so the masked upper triangle is
// never computed. probabilities(logits, r0, rows, keys) turns the scaled logits of
// query rows r0 .. r0+rows-1, [Hkv, g*rows, keys] in the accumulation type (head-major
// within a KV group), into the probabilities that weight the values. Returns [t, Hq*d].
template <typename ProbsFn>
torch::Tensor causal_attention_blocks(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                                      int64_t n_prev, ProbsFn&& probabilities) {
  const int64_t t = q.size(0), hq = q.size(1), d = q.size(2), n_kv = keys.size(0);
  const auto acc = accumulation_type(q.scalar_type());
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto keys_t = keys.to(acc).transpose(1, 2);  // [Hkv, d, n]
  const auto values_acc = values.to(acc);
  auto out = torch::empty({t, hq * d}, q.options().dtype(acc));
  const int64_t block = query_block_rows(hq, n_prev + t);
  for (int64_t r0 = 0; r0 < t; r0 += block) {
    const int64_t rows = std::min(block, t - r0), n = n_prev + r0 + rows;
    auto logits = heads_bmm(group_queries(q.narrow(0, r0, rows), n_kv).to(acc), keys_t.narrow(2, 0, n));
    logits.mul_(scale);
    torch::Tensor probs = probabilities(logits, r0, rows, n);
    out.narrow(0, r0, rows).copy_(ungroup_output(heads_bmm(probs, values_acc.narrow(1, 0, n)), rows, hq));
  }
  return out.to(q.scalar_type());
}

// Appends `rows` [Hkv, t, d] to a cache buffer with spare capacity (doubling), so a
// decode step copies only the new token, not the whole cache.
void append_rows(torch::Tensor& buffer, int64_t& size, const torch::Tensor& rows) {
  const int64_t t = rows.size(1);
  if (!buffer.defined() || size + t > buffer.size(1)) {
    // A prefill block gets what it needs; token steps double the room.
    const int64_t capacity = size == 0 && t > 1 ? t + 16 : std::max<int64_t>(2 * (size + t), 16);
    auto grown = torch::empty({rows.size(0), capacity, rows.size(2)}, rows.options());
    if (size > 0) grown.narrow(1, 0, size).copy_(buffer.narrow(1, 0, size));
    buffer = grown;
  }
  buffer.narrow(1, size, t).copy_(rows);
  size += t;
}

}  // namespace

torch::Tensor FullAttention::attend(int, const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, int64_t) {
  const int64_t window = sliding_window_;
  return causal_attention_blocks(q, k.permute({1, 0, 2}), v.permute({1, 0, 2}), 0,
                                 [&](torch::Tensor logits, int64_t r0, int64_t rows, int64_t) {
                                   return causal_softmax(logits, CausalRows{r0, rows, window});
                                 });
}

// ---------------------------------------------------------------------------------
SimAttention::SimAttention(const Model& model, const Policy& policy, SequenceShape shape)
    : model_(model), policy_(policy), shape_(shape) {
  stats_.kept_per_layer.assign(shape.n_layers, 0);
  stats_.max_per_layer.assign(shape.n_layers, 0);
  stats_.visible_per_layer.assign(shape.n_layers, 0);
  stats_.sliding_window = model.arch().sliding_window;
}

torch::Tensor SimAttention::attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, int64_t start) {
  if (start != 0) throw Error("sim mode runs one teacher-forced pass; it cannot continue a sequence");
  const int64_t T = q.size(0), hq = q.size(1), n_kv = k.size(1), d = q.size(2), g = hq / n_kv;
  const int64_t kv_bytes = 2 * n_kv * d * element_bytes(k.scalar_type());
  if (policy_.keeps_everything()) {
    stats_.kept_per_layer[layer] = stats_.max_per_layer[layer] = static_cast<int>(T);
    stats_.visible_per_layer[layer] = static_cast<int>(sliding_window_ > 0 ? std::min(T, sliding_window_) : T);
    stats_.peak_bytes += T * kv_bytes;
    FullAttention full;
    full.set_sliding_window(sliding_window_);
    return full.attend(layer, q, k, v, start);
  }
  if (policy_.realisable()) {
    auto out = q.scalar_type() == torch::kFloat64 ? simulate_realisable<double>(layer, q, k, v)
                                                  : simulate_realisable<float>(layer, q, k, v);
    stats_.peak_bytes += stats_.max_per_layer[layer] * kv_bytes;
    return out;
  }
  // Sim-only policies get float32 logits on the CPU, as the paper's code computes them.
  auto probs32 = torch::zeros({hq, T, T}, torch::kFloat32);
  float* probs = probs32.data_ptr<float>();
  const SimOnlyPolicy& sim_only = *policy_.as_sim_only();
  const auto keys = k.permute({1, 0, 2});  // [Hkv, T, d]
  if (auto rows_pass = sim_only.layer_rows(layer, shape_, static_cast<int>(T))) {
    // A causal policy takes each block of rows as it is computed, while it is in cache.
    for_each_causal_logits_block(q, keys, sliding_window_, [&](int64_t r0, int64_t rows, int64_t n, const float* block) {
      rows_pass->rows(static_cast<int>(r0), static_cast<int>(rows), static_cast<int>(n), block, probs);
    });
  } else {
    // The others see the whole layer at once: all T x T logits as one contiguous buffer
    // (the entries above the diagonal, which they never read, left unset), freed before
    // the values.
    auto logits32 = torch::empty({hq, T, T}, torch::kFloat32);
    float* logits = logits32.data_ptr<float>();
    for_each_causal_logits_block(q, keys, sliding_window_, [&](int64_t r0, int64_t rows, int64_t n, const float* block) {
      for (int64_t h = 0; h < hq; ++h)
        for (int64_t r = 0; r < rows; ++r)
          std::copy_n(block + (h * rows + r) * n, n, logits + (h * T + r0 + r) * T);
    });
    sim_only.simulate_layer(layer, shape_, static_cast<int>(T), logits, probs);
  }
  const Budget b = policy_.layer_budget(layer, shape_);
  stats_.kept_per_layer[layer] = stats_.max_per_layer[layer] = std::min<int>(T, b.capacity + 1);
  stats_.visible_per_layer[layer] = static_cast<int>(
      sliding_window_ > 0 ? std::min<int64_t>(stats_.kept_per_layer[layer], sliding_window_) : stats_.kept_per_layer[layer]);
  stats_.peak_bytes += stats_.max_per_layer[layer] * kv_bytes;
  const auto acc = accumulation_type(q.scalar_type());
  auto p = probs32.to(q.device(), acc).view({n_kv, g * T, T});
  return weighted_values(p, v.permute({1, 0, 2}), T, hq, q.scalar_type());
}

namespace {

// Query row `logits` (n keys) masked to a KV head's slots at positions pos[0..slots)
// that are not older than oldest_visible and (when vis is given) visible: the row
// becomes its softmax in place (zero but at the slots) and out[s] gets slot s's
// probability. exps: slots doubles of scratch. Returns the slots attended.
template <typename Scalar>
int masked_slot_softmax(Scalar* logits, int64_t n, const std::vector<int>& pos, int slots, int64_t oldest_visible,
                        const char* vis, double* exps, float* out) {
  auto attended = [&](int s) { return pos[s] >= oldest_visible && (!vis || vis[s]); };
  double m = -std::numeric_limits<double>::infinity();
  for (int s = 0; s < slots; ++s)
    if (attended(s)) m = std::max<double>(m, logits[pos[s]]);
  // exp(l - m) of the attended slots, four at a time with std::exp's bits (double_exp.h);
  // the others get a stand-in on exp's fast path, then 0.
  for (int s = 0; s < slots; ++s) exps[s] = attended(s) ? logits[pos[s]] - m : -1.0;
  exp_doubles(exps, exps, slots);
  double sum = 0;  // exponentials summed in double: no rounding noise of its own
  int seen = 0;
  for (int s = 0; s < slots; ++s) {
    const bool is_attended = attended(s);
    if (!is_attended) exps[s] = 0.0;
    sum += exps[s];
    seen += is_attended;
  }
  const double inv = 1.0 / sum;
  std::fill(logits, logits + n, Scalar(0));
  for (int s = 0; s < slots; ++s) out[s] = static_cast<float>(logits[pos[s]] = static_cast<Scalar>(exps[s] * inv));
  return seen;
}

}  // namespace

// The row loop of a realisable policy, one block of query rows at a time (see
// causal_attention_blocks): row i is masked by the current slots, the policy observes
// the masked softmax, then evicts. The probabilities overwrite the block's logits, so a
// layer never holds more than one block of scores. Scalar is the accumulation type.
template <typename Scalar>
torch::Tensor SimAttention::simulate_realisable(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& v) {
  const int64_t hq = q.size(1), n_kv = k.size(1), g = hq / n_kv;
  auto norms = k.to(torch::kCPU, torch::kFloat32).norm(2, -1).contiguous();  // [T, Hkv]
  const float* key_norms = norms.data_ptr<float>();
  auto state = policy_.as_realisable()->make_layer_state(layer, shape_);
  std::vector<float> row;  // what the policy observes: [Hq][slots]
  std::vector<double> exps(static_cast<size_t>(hq) * q.size(0));  // [Hq][slots], per head: heads run in parallel
  std::vector<int> seen_per_head(hq);
  std::vector<std::vector<char>> pattern(n_kv);  // static sparse patterns: slots this row attends
  std::vector<char> masked(n_kv);
  int max_slots = 0, visible = 0;
  // Heads that do not share state each run their own rows: a thread takes whole KV
  // heads through the block, with the same arithmetic in the same order per head.
  const bool by_head = state->independent_heads();
  std::vector<std::vector<float>> head_rows(by_head ? n_kv : 0);  // per KV head: [g][slots]
  std::vector<int> max_slots_per_kv(n_kv, 0), seen_per_kv(n_kv, 0);
  auto block_probs = [&](torch::Tensor logits, int64_t r0, int64_t rows, int64_t n) {
    auto block = logits.to(torch::kCPU).contiguous();  // [Hq, rows, n]
    Scalar* L = block.data_ptr<Scalar>();
    if (by_head) {
      at::parallel_for(0, n_kv, 1, [&](int64_t first_kv, int64_t end_kv) {
        for (int64_t kv = first_kv; kv < end_kv; ++kv) {
          std::vector<float>& head_row = head_rows[kv];
          for (int64_t i = r0; i < r0 + rows; ++i) {
            state->append_head(static_cast<int>(kv), static_cast<int>(i), key_norms[i * n_kv + kv]);
            const std::vector<int>& pos = state->positions(static_cast<int>(kv));
            const int slots = static_cast<int>(pos.size());
            max_slots_per_kv[kv] = std::max(max_slots_per_kv[kv], slots);
            head_row.resize(static_cast<size_t>(g) * slots);
            const int64_t oldest_visible = sliding_window_ > 0 ? i - sliding_window_ + 1 : 0;
            const char* vis = state->visible_slots(static_cast<int>(kv), static_cast<int>(i), &pattern[kv])
                                  ? pattern[kv].data() : nullptr;
            int seen = 0;
            for (int64_t j = 0; j < g; ++j) {
              const int64_t h = kv * g + j;
              seen = std::max(seen, masked_slot_softmax(L + (h * rows + (i - r0)) * n, n, pos, slots, oldest_visible,
                                                        vis, exps.data() + h * q.size(0), head_row.data() + j * slots));
            }
            seen_per_kv[kv] = seen;
            state->observe_head(static_cast<int>(kv), head_row.data());
            if (i >= shape_.prefill_len - 1) state->compress_head(static_cast<int>(kv));
          }
        }
      });
      max_slots = *std::max_element(max_slots_per_kv.begin(), max_slots_per_kv.end());
      visible = *std::max_element(seen_per_kv.begin(), seen_per_kv.end());
      return block.to(logits.device());
    }
    for (int64_t i = r0; i < r0 + rows; ++i) {
      state->append(static_cast<int>(i), key_norms + i * n_kv);
      const int slots = state->size();
      max_slots = std::max(max_slots, slots);
      row.resize(static_cast<size_t>(hq) * slots);
      // Slots the model's sliding window hides from query i: probability 0, as in decode.
      const int64_t oldest_visible = sliding_window_ > 0 ? i - sliding_window_ + 1 : 0;
      for (int64_t kv = 0; kv < n_kv; ++kv)
        masked[kv] = state->visible_slots(static_cast<int>(kv), static_cast<int>(i), &pattern[kv]);
      // Each head's masked softmax is independent of the others': the heads share the
      // threads (same arithmetic per head), the policy then observes them in order.
      auto softmax_heads = [&](int64_t first_head, int64_t end_head) {
        for (int64_t h = first_head; h < end_head; ++h)
          seen_per_head[h] = masked_slot_softmax(L + (h * rows + (i - r0)) * n, n, state->positions(static_cast<int>(h / g)),
                                                 slots, oldest_visible, masked[h / g] ? pattern[h / g].data() : nullptr,
                                                 exps.data() + h * q.size(0), row.data() + h * slots);
      };
      // Short rows stay on one thread: a parallel region costs more than they do.
      constexpr int64_t kParallelRowScores = 1024;
      at::parallel_for(0, hq, hq * slots >= kParallelRowScores ? 1 : hq, softmax_heads);
      visible = *std::max_element(seen_per_head.begin(), seen_per_head.end());
      state->observe(row.data());
      if (i >= shape_.prefill_len - 1) state->compress(nullptr);
    }
    return block.to(logits.device());
  };
  auto out = causal_attention_blocks(q, k.permute({1, 0, 2}), v.permute({1, 0, 2}), 0, block_probs);
  stats_.kept_per_layer[layer] = state->size();
  stats_.max_per_layer[layer] = max_slots;
  stats_.visible_per_layer[layer] = visible;
  return out;
}

// ---------------------------------------------------------------------------------
CacheAttention::CacheAttention(const Model& model, const Policy& policy, SequenceShape shape)
    : model_(model), policy_(policy), shape_(shape), layers_(shape.n_layers) {
  if (!policy.realisable())
    throw Error("policy " + policy.name() + " is sim-only (it needs " + policy.as_sim_only()->needs() +
                ", which a real cache does not hold); use --mode sim");
  if (!policy.keeps_everything())
    for (int l = 0; l < shape.n_layers; ++l) layers_[l].state = policy.as_realisable()->make_layer_state(l, shape);
  stats_.kept_per_layer.assign(shape.n_layers, 0);
  stats_.max_per_layer.assign(shape.n_layers, 0);
  stats_.visible_per_layer.assign(shape.n_layers, 0);
  stats_.sliding_window = model.arch().sliding_window;
}

int64_t CacheAttention::cached_tokens(int layer) const {
  return layers_[layer].size;
}

int64_t CacheAttention::held_bytes() const {
  int64_t bytes = 0;
  for (const LayerCache& cache : layers_)
    for (const torch::Tensor* buffer : {&cache.key_buffer, &cache.value_buffer})
      if (buffer->defined()) bytes += static_cast<int64_t>(buffer->nbytes());
  return bytes;
}

// Keeps the slots in `keep` (per KV head, in slot order). Attention does not care
// about the order of cache rows (positions are already rotated into the keys), so a
// kept row beyond the new size moves into a freed row below it: one row per evicted
// token, not a rewrite of the whole cache.
void CacheAttention::evict(LayerCache& cache, const std::vector<std::vector<int>>& keep) {
  const int64_t n_kv = static_cast<int64_t>(keep.size()), kept = static_cast<int64_t>(keep[0].size());
  const int64_t capacity = cache.key_buffer.size(1), d = cache.key_buffer.size(2);
  std::vector<int64_t> sources, targets;
  std::vector<char> used(static_cast<size_t>(kept));
  for (int64_t h = 0; h < n_kv; ++h) {
    std::vector<int>& rows = cache.rows[h];
    std::vector<int> kept_rows;
    for (int slot : keep[h]) kept_rows.push_back(rows[slot]);
    std::fill(used.begin(), used.end(), 0);
    for (int row : kept_rows)
      if (row < kept) used[row] = 1;
    int64_t free_row = 0;
    for (int& row : kept_rows) {
      if (row < kept) continue;
      while (used[free_row]) ++free_row;
      used[free_row] = 1;
      sources.push_back(h * capacity + row);
      targets.push_back(h * capacity + free_row);
      if (!cache.row_positions.empty()) cache.row_positions[h][free_row] = cache.row_positions[h][row];
      row = static_cast<int>(free_row);
    }
    rows.swap(kept_rows);
    if (!cache.row_positions.empty()) cache.row_positions[h].resize(kept);
  }
  if (!sources.empty()) {
    const auto device = cache.key_buffer.device();
    auto src = torch::tensor(sources, torch::kLong).to(device), dst = torch::tensor(targets, torch::kLong).to(device);
    for (torch::Tensor* buffer : {&cache.key_buffer, &cache.value_buffer}) {
      auto flat = buffer->view({n_kv * capacity, d});
      flat.index_copy_(0, dst, flat.index_select(0, src));
    }
  }
  cache.size = kept;
  if (capacity > kept + 1 + std::max<int64_t>(16, kept / 8)) {
    // Memory follows the budget, not the prompt (or the doubling that filled the cache):
    // the kept rows plus the next token's, which the following eviction frees again.
    for (torch::Tensor* buffer : {&cache.key_buffer, &cache.value_buffer}) {
      auto smaller = torch::empty({n_kv, kept + 1, d}, buffer->options());
      smaller.narrow(1, 0, kept).copy_(buffer->narrow(1, 0, kept));
      *buffer = smaller;
    }
  }
}

// Which cache rows each query of the block [start, start + t) may not see: later
// positions (causal) and those the model's sliding window has passed. [Hkv, 1, t, n].
torch::Tensor CacheAttention::window_mask(LayerCache& cache, int64_t start, int64_t t, int layer) {
  const int64_t n_kv = cache.key_buffer.size(0), n = cache.size;
  if (cache.row_positions.empty()) cache.row_positions.assign(n_kv, {});
  auto positions = torch::empty({n_kv, 1, 1, n}, torch::kLong);
  int64_t* P = positions.data_ptr<int64_t>();
  for (int64_t h = 0; h < n_kv; ++h) {
    auto& rows = cache.row_positions[h];
    for (int64_t r = static_cast<int64_t>(rows.size()); r < n; ++r) rows.push_back(start + r - (n - t));
    std::copy(rows.begin(), rows.end(), P + h * n);
  }
  auto query = torch::arange(start, start + t, torch::kLong).view({1, 1, t, 1});
  auto hidden = (positions > query).logical_or(positions <= query - sliding_window_);
  stats_.visible_per_layer[layer] = static_cast<int>(
      (~hidden.select(2, t - 1)).sum(-1).max().item<int64_t>());
  return hidden;
}

torch::Tensor CacheAttention::attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, int64_t start) {
  const auto started = std::chrono::steady_clock::now();
  LayerCache& cache = layers_[layer];
  const int64_t t = q.size(0), hq = q.size(1), n_kv = k.size(1), d = q.size(2), g = hq / n_kv;
  const bool evicting = cache.state != nullptr;
  if (t > 1 && evicting && start + t > std::max<int64_t>(shape_.prefill_len, 1))
    throw Error("a block of several tokens can only be the prefill: eviction happens between tokens");

  int64_t value_size = cache.size;
  append_rows(cache.key_buffer, cache.size, k.permute({1, 0, 2}));  // [Hkv, t, d]
  append_rows(cache.value_buffer, value_size, v.permute({1, 0, 2}));
  const int64_t n = cache.size, n_prev = n - t;
  auto keys = cache.key_buffer.narrow(1, 0, n), values = cache.value_buffer.narrow(1, 0, n);

  // The policy observes each new query's attention over the slots in its own (position)
  // order; the cache rows are unordered.
  torch::Tensor norms;  // [t, Hkv] key norms of the new tokens
  if (evicting) {
    norms = k.to(torch::kCPU, torch::kFloat32).norm(2, -1).contiguous();
    if (cache.rows.empty()) cache.rows.assign(n_kv, {});
  }
  // probs [Hq, rows, cols] of the new queries r0 .. r0+rows-1.
  auto observe_rows = [&](const torch::Tensor& probs, int64_t r0, int64_t rows) {
    auto probs_cpu = probs.to(torch::kCPU, torch::kFloat32).contiguous();
    const int64_t cols = probs_cpu.size(-1);
    const float* P = probs_cpu.data_ptr<float>();
    const float* key_norms = norms.data_ptr<float>();
    for (int64_t r = r0; r < r0 + rows; ++r) {
      cache.state->append(static_cast<int>(start + r), key_norms + r * n_kv);
      for (auto& slot_rows : cache.rows) slot_rows.push_back(static_cast<int>(n_prev + r));
      const int64_t m = n_prev + r + 1;  // slots this row can see
      row_buffer_.resize(static_cast<size_t>(hq) * m);
      for (int64_t h = 0; h < hq; ++h) {
        const float* prob_row = P + (h * rows + (r - r0)) * cols;
        const std::vector<int>& slot_rows = cache.rows[h / g];
        float* out = row_buffer_.data() + h * m;
        for (int64_t s = 0; s < m; ++s) out[s] = prob_row[slot_rows[s]];
      }
      cache.state->observe(row_buffer_.data());
    }
  };
  torch::Tensor out;
  if (t > 1 && sliding_window_ == 0) {
    // A block of several tokens (the prefill, or any block of a full cache) holds its
    // rows in position order: blocked causal attention, no t x n buffer.
    stats_.visible_per_layer[layer] = static_cast<int>(n);
    out = causal_attention_blocks(q, keys, values, n_prev, [&](torch::Tensor logits, int64_t r0, int64_t rows, int64_t) {
      auto probs = causal_softmax(logits, CausalRows{n_prev + r0, rows, 0});
      if (evicting) observe_rows(probs, r0, rows);
      return probs;
    });
  } else {
    auto logits = attention_logits(q, keys).view({n_kv, g, t, n});
    if (sliding_window_ == 0) stats_.visible_per_layer[layer] = static_cast<int>(n);
    torch::Tensor window_hidden;  // [Hkv, 1, t, n] on the CPU, when the model has a window
    if (sliding_window_ > 0) {
      window_hidden = window_mask(cache, start, t, layer);
      logits = logits.masked_fill(window_hidden.to(q.device()), -std::numeric_limits<double>::infinity());
    }
    if (evicting && t == 1 && cache.state->size() > 0) {
      // A static sparse pattern keeps keys cached that this query must not attend.
      torch::Tensor hidden;
      std::vector<char> visible;
      for (int64_t h = 0; h < n_kv; ++h) {
        if (!cache.state->visible_slots(static_cast<int>(h), static_cast<int>(start), &visible)) continue;
        if (!hidden.defined()) hidden = torch::zeros({n_kv, 1, 1, n}, torch::kBool);
        auto flags = hidden.accessor<bool, 4>();
        for (size_t s = 0; s < visible.size(); ++s)
          if (!visible[s]) flags[h][0][0][cache.rows[h][s]] = true;
      }
      if (hidden.defined()) {
        logits = logits.masked_fill(hidden.to(q.device()), -std::numeric_limits<double>::infinity());
        // What the query sees: neither hidden by its pattern nor by the model's window.
        if (window_hidden.defined()) hidden = hidden.logical_or(window_hidden);
        stats_.visible_per_layer[layer] = static_cast<int>((~hidden.select(2, 0)).sum(-1).max().item<int64_t>());
      }
    }
    auto probs = torch::softmax(logits, -1);
    out = weighted_values(probs.view({n_kv, g * t, n}), values, t, hq, q.scalar_type());
    if (evicting) observe_rows(probs, 0, t);
  }
  if (n > stats_.max_per_layer[layer]) {
    // Peak bytes: the sum over layers of each layer's largest cache.
    stats_.peak_bytes += (n - stats_.max_per_layer[layer]) * 2 * n_kv * d * element_bytes(k.scalar_type());
    stats_.max_per_layer[layer] = static_cast<int>(n);
  }
  if (evicting) {
    std::vector<std::vector<int>> keep;
    if (start + t - 1 >= shape_.prefill_len - 1 && cache.state->compress(&keep)) evict(cache, keep);
  }
  stats_.kept_per_layer[layer] = static_cast<int>(cache.size);
  attention_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

}  // namespace kvevict
