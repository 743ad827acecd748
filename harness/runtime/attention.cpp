#include "harness/runtime/attention.h"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstring>
#include <limits>
#include <map>

#include "harness/common/errors.h"
#include "harness/common/kv_quant.h"
#include "harness/model/threads.h"
#include "harness/runtime/causal_softmax.h"
#include "harness/runtime/double_exp.h"
#include "harness/runtime/single_query_attention.h"
#include "harness/runtime/dmc_attention.h"

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


// Attention scores, softmax and the weighted sum of values: float32 for float32 and
// half models (softmax never in half), float64 for float64 reference runs.
torch::ScalarType accumulation_type(torch::ScalarType compute) {
  return compute == torch::kFloat64 ? torch::kFloat64 : torch::kFloat32;
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

// Query rows per block of the blocked causal attention: about 8M scores (32 MB in
// float32) per block, so no [heads, T, T] buffer is ever made. Each block's products
// pack all its keys and values again (OpenBLAS: 31% of an 8192-token prefill's samples
// with 2M-score blocks of 21 rows); 85-row blocks cut that prefill's attention from
// 17.5-18.7 s to 12.6-12.9 s on the random 12 x 768 model, 16M-score blocks gained nothing more.
int64_t query_block_rows(int64_t hq, int64_t n) {
  constexpr int64_t kBlockScores = int64_t{1} << 23;
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
                                      int64_t n_prev, ProbsFn&& probabilities, int64_t block_rows = 0) {
  const int64_t t = q.size(0), hq = q.size(1), d = q.size(2), n_kv = keys.size(0);
  const auto acc = accumulation_type(q.scalar_type());
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto keys_t = keys.to(acc).transpose(1, 2);  // [Hkv, d, n]
  const auto values_acc = values.to(acc);
  auto out = torch::empty({t, hq * d}, q.options().dtype(acc));
  const int64_t block = block_rows > 0 ? block_rows : query_block_rows(hq, n_prev + t);
  for (int64_t r0 = 0; r0 < t; r0 += block) {
    const int64_t rows = std::min(block, t - r0), n = n_prev + r0 + rows;
    auto logits = heads_bmm(group_queries(q.narrow(0, r0, rows), n_kv).to(acc), keys_t.narrow(2, 0, n));
    logits.mul_(scale);
    torch::Tensor probs = probabilities(logits, r0, rows, n);
    out.narrow(0, r0, rows).copy_(ungroup_output(heads_bmm(probs, values_acc.narrow(1, 0, n)), rows, hq));
  }
  return out.to(q.scalar_type());
}

// Attention of q [t, Hq, d] over rows 0 .. n-1 of a decode cache's buffers [Hkv,
// capacity, d], the last t of them the queries' own: a decode step's one query through
// single_query_attention (plain loops instead of ATen's small ops), a block through
// causal_attention_blocks. probabilities as there; a single query's logits come as one
// block of one row, [Hkv, g, n] float32 on the CPU.
template <typename ProbsFn>
torch::Tensor cache_rows_attention(const torch::Tensor& q, const torch::Tensor& keys, const torch::Tensor& values,
                                   int64_t n, ProbsFn&& probabilities) {
  if (!single_query_supported(q, keys, values))
    return causal_attention_blocks(q, keys.narrow(1, 0, n), values.narrow(1, 0, n), n - q.size(0), probabilities);
  torch::Tensor probs;  // kept alive until the values are summed
  return single_query_attention(q, keys, values, n, [&](float* logits) {
    const int64_t n_kv = keys.size(0), group = q.size(1) / n_kv;
    probs = probabilities(torch::from_blob(logits, {n_kv, group, n}, torch::kFloat32), 0, 1, n).contiguous();
    return probs.data_ptr<float>();
  });
}

// dst.copy_(src) for cache rows: dst and src [Hkv, t, d] (or [t, d]) of one shape. On the
// CPU, with each row's d elements contiguous on both sides, one memcpy per row: a decode
// step's copy of its one new token was ATen's strided copy, about 10 us each, two per
// layer (a twentieth of the bfloat16 batch-1 step of the 12 x 768 bench model).
void copy_rows(const torch::Tensor& dst, const torch::Tensor& src) {
  const bool rows_apart = dst.device().is_cpu() && src.device().is_cpu() && dst.scalar_type() == src.scalar_type() &&
                          dst.sizes() == src.sizes() && (dst.dim() == 2 || dst.dim() == 3) && dst.stride(-1) == 1 &&
                          src.stride(-1) == 1;
  if (!rows_apart) {
    dst.copy_(src);
    return;
  }
  const torch::Tensor to = dst.dim() == 3 ? dst : dst.unsqueeze(0), from = src.dim() == 3 ? src : src.unsqueeze(0);
  const int64_t heads = to.size(0), t = to.size(1), row_bytes = to.size(2) * to.element_size();
  auto* to_bytes = static_cast<char*>(to.data_ptr());
  const auto* from_bytes = static_cast<const char*>(from.data_ptr());
  for (int64_t h = 0; h < heads; ++h)
    for (int64_t j = 0; j < t; ++j)
      std::memcpy(to_bytes + (h * to.stride(0) + j * to.stride(1)) * to.element_size(),
                  from_bytes + (h * from.stride(0) + j * from.stride(1)) * from.element_size(),
                  static_cast<size_t>(row_bytes));
}

// A driver's row moves in both cache buffers [Hkv, capacity, d], every source row read
// before any row is written (as index_select, then index_copy_). On the CPU through one
// staging buffer and memcpy: a decode step's moves (one a KV head once the budget is
// full) were eight ATen ops a layer, 9% of h2o's bfloat16 batch-1 step of the 12 x 768
// bench model.
void move_rows(torch::Tensor& keys, torch::Tensor& values, const std::vector<RowMove>& moves) {
  if (moves.empty()) return;
  const int64_t n_kv = keys.size(0), capacity = keys.size(1), d = keys.size(2);
  if (keys.device().is_cpu() && keys.is_contiguous() && values.is_contiguous()) {
    const int64_t row_bytes = d * keys.element_size();
    std::vector<char> staged(moves.size() * static_cast<size_t>(row_bytes));
    for (torch::Tensor* buffer : {&keys, &values}) {
      auto* bytes = static_cast<char*>(buffer->data_ptr());
      for (size_t i = 0; i < moves.size(); ++i)
        std::memcpy(staged.data() + i * row_bytes, bytes + (moves[i].kv_head * capacity + moves[i].from) * row_bytes,
                    static_cast<size_t>(row_bytes));
      for (size_t i = 0; i < moves.size(); ++i)
        std::memcpy(bytes + (moves[i].kv_head * capacity + moves[i].to) * row_bytes, staged.data() + i * row_bytes,
                    static_cast<size_t>(row_bytes));
    }
    return;
  }
  std::vector<int64_t> sources, targets;
  for (const RowMove& m : moves) {
    sources.push_back(m.kv_head * capacity + m.from);
    targets.push_back(m.kv_head * capacity + m.to);
  }
  const auto device = keys.device();
  auto src = torch::tensor(sources, torch::kLong).to(device), dst = torch::tensor(targets, torch::kLong).to(device);
  for (torch::Tensor* buffer : {&keys, &values}) {
    auto flat = buffer->view({n_kv * capacity, d});
    flat.index_copy_(0, dst, flat.index_select(0, src));
  }
}

// Appends `rows` [Hkv, t, d] to a cache buffer with spare capacity (doubling), so a
// decode step copies only the new token, not the whole cache.
void append_rows(torch::Tensor& buffer, int64_t& size, const torch::Tensor& rows) {
  const int64_t t = rows.size(1);
  if (!buffer.defined() || size + t > buffer.size(1)) {
    // A prefill block gets what it needs; token steps double the room.
    const int64_t capacity = size == 0 && t > 1 ? t + 16 : std::max<int64_t>(2 * (size + t), 16);
    auto grown = torch::zeros({rows.size(0), capacity, rows.size(2)}, rows.options());
    if (size > 0) grown.narrow(1, 0, size).copy_(buffer.narrow(1, 0, size));
    buffer = grown;
  }
  copy_rows(buffer.narrow(1, size, t), rows);
  size += t;
}

// Grows a cache buffer [Hkv, capacity, d] to hold at least `rows` rows, doubling, with
// the new rows zeroed.
void reserve_rows(torch::Tensor& buffer, int64_t used, int64_t rows) {
  if (buffer.size(1) >= rows) return;
  auto grown = torch::zeros({buffer.size(0), std::max<int64_t>(2 * rows, 16), buffer.size(2)}, buffer.options());
  if (used > 0) grown.narrow(1, 0, used).copy_(buffer.narrow(1, 0, used));
  buffer = grown;
}

// A policy cache's key and value buffers [Hkv, capacity, d] made (zeroed, for new keys
// k and values v [t, Hkv, d]) or grown so that they hold `rows` rows, the first `used` kept.
void hold_rows(torch::Tensor& keys, torch::Tensor& values, const torch::Tensor& k, const torch::Tensor& v,
               int64_t used, int64_t rows) {
  if (!keys.defined()) {
    keys = torch::zeros({k.size(1), std::max<int64_t>(rows, 16), k.size(2)}, k.options());
    values = torch::zeros({v.size(1), std::max<int64_t>(rows, 16), v.size(2)}, v.options());
  }
  reserve_rows(keys, used, rows);
  reserve_rows(values, used, rows);
}

// The L2 norms of the new keys k [t, Hkv, d], as the policies read them: [t, Hkv].
torch::Tensor key_norms_of(const torch::Tensor& k) { return k.to(torch::kCPU, torch::kFloat32).norm(2, -1).contiguous(); }

// The driver's pass over one block: logits [Hkv, g*rows, n] (query heads grouped by KV
// head, so also [Hq, rows, n]) become the probabilities, on the CPU in the accumulation
// type, and go back to the logits' device. tokens: the block's own new tokens.
torch::Tensor drive_block(PolicyDriver& driver, const torch::Tensor& logits, int64_t first, int64_t rows, int64_t n,
                          const BlockTokens& tokens) {
  auto block = logits.to(torch::kCPU).contiguous();
  if (block.scalar_type() == torch::kFloat64) driver.rows(first, rows, n, block.data_ptr<double>(), tokens);
  else driver.rows(first, rows, n, block.data_ptr<float>(), tokens);
  return block.to(logits.device());
}

// Sim mode's pass under a policy (driver over SlotColumns::Versions): each block of
// query rows attends only what its heads can still see, the slots each holds at the
// block's start (their keys and values gathered by position) and the block's own keys,
// not every earlier position: under a budget most of those are evicted, and their logits
// would be computed only to be masked. Until a head has evicted anything, its slots are
// positions 0 .. first-1 and the block reads the keys in place, in the blocks
// causal_attention_blocks takes. q [T, Hq, d], k and v [T, Hkv, d]; returns [T, Hq*d].
torch::Tensor held_slot_attention(PolicyDriver& driver, const torch::Tensor& q, const torch::Tensor& k,
                                  const torch::Tensor& v, const HostTokens& tokens) {
  const int64_t T = q.size(0), hq = q.size(1), d = q.size(2), n_kv = k.size(1);
  const auto acc = accumulation_type(q.scalar_type());
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  const auto k_acc = k.to(acc), v_acc = v.to(acc);  // [T, Hkv, d]
  const auto keys = k_acc.permute({1, 0, 2}), values = v_acc.permute({1, 0, 2});  // [Hkv, T, d]
  torch::Tensor key_rows, value_rows;  // [T * Hkv, d]: position p's row of head h at p * Hkv + h
  auto out = torch::empty({T, hq * d}, q.options().dtype(acc));
  const int64_t prefix_block = query_block_rows(hq, T);
  std::vector<int64_t> index;
  for (int64_t first = 0; first < T;) {
    driver.start_block(first);
    int64_t held = 0;
    bool prefix = true;  // every head holds positions 0 .. first-1
    for (int h = 0; h < n_kv; ++h) {
      held = std::max<int64_t>(held, driver.slots(h));
      prefix = prefix && driver.slots(h) == first;
    }
    // A gathered block's own keys are columns too, the later ones hidden from its earlier
    // rows: at a quarter of the held slots, about a tenth of its logits are such.
    const int64_t gathered_block = std::min(query_block_rows(hq, held + 256), std::max<int64_t>(64, held / 4));
    const int64_t rows = std::min(T - first, prefix ? prefix_block : gathered_block);
    const int64_t n = held + rows;  // columns: a head's slots, then the block's keys (then padding)
    torch::Tensor block_keys, block_values;  // [Hkv, n, d]
    if (prefix) {
      block_keys = keys.narrow(1, 0, n);
      block_values = values.narrow(1, 0, n);
    } else {
      if (!key_rows.defined()) {
        key_rows = k_acc.contiguous().view({T * n_kv, d});
        value_rows = v_acc.contiguous().view({T * n_kv, d});
      }
      index.assign(n_kv * n, 0);
      for (int h = 0; h < n_kv; ++h) {
        int64_t* at = index.data() + h * n;
        int64_t c = 0;
        for (int p : driver.state(h).positions()) at[c++] = p * n_kv + h;
        for (int64_t r = 0; r < rows; ++r) at[c++] = (first + r) * n_kv + h;
        while (c < n) at[c++] = (first + rows - 1) * n_kv + h;  // padding no slot names: its attention is 0
      }
      const auto rows_index = torch::from_blob(index.data(), {n_kv * n}, torch::kLong).to(k.device());
      block_keys = key_rows.index_select(0, rows_index).view({n_kv, n, d});
      block_values = value_rows.index_select(0, rows_index).view({n_kv, n, d});
    }
    auto logits = heads_bmm(group_queries(q.narrow(0, first, rows), n_kv).to(acc), block_keys.transpose(1, 2));
    logits.mul_(scale);
    const auto probs = drive_block(driver, logits, first, rows, n, tokens.block().from_row(first, n_kv));
    out.narrow(0, first, rows).copy_(ungroup_output(heads_bmm(probs, block_values), rows, hq));
    first += rows;
  }
  return out.to(q.scalar_type());
}

// Full-precision elements count as fp16 whatever the compute dtype (harness/common/kv_quant.h).
int64_t element_bytes(const torch::Tensor&) { return kFullPrecisionBytes; }

// A layer's peak K+V bytes: what the cache holds, and the fp16 cache of the same slots.
struct PeakBytes {
  int64_t held = 0, full = 0;
};

// The driver's counts of one layer; returns the layer's peak K+V bytes (row_bytes a
// slot's). Key channels a rewrite zeroed (ThinK) count as not held, as in a cache that
// stores a pruned key's kept channels alone.
PeakBytes record_driver_stats(KvStats& stats, int layer, const PolicyDriver& driver, int64_t row_bytes) {
  stats.kept_per_head[layer].resize(driver.n_kv_heads());
  for (int h = 0; h < driver.n_kv_heads(); ++h) stats.kept_per_head[layer][h] = driver.slots(h);
  stats.kept_per_layer[layer] = driver.max_slots();
  stats.max_per_layer[layer] = driver.peak_head_slots();
  stats.visible_per_layer[layer] = driver.last_visible();
  if (driver.rewrites() && row_bytes > 0)
    return {driver.peak_total_elements() * kFullPrecisionBytes, driver.peak_elements_slots() * row_bytes};
  return {driver.peak_total_slots() * row_bytes, driver.peak_total_slots() * row_bytes};
}

// The same for the device policy path, whose KV heads all hold as many slots (what the
// last query saw is the caller's: it is read from the device).
int64_t record_device_stats(KvStats& stats, int layer, const DeviceScoredLayer& policy, int64_t row_bytes) {
  stats.kept_per_head[layer].assign(policy.n_kv_heads(), static_cast<int>(policy.slots()));
  stats.kept_per_layer[layer] = static_cast<int>(policy.slots());
  stats.max_per_layer[layer] = static_cast<int>(policy.peak_slots());
  return policy.peak_slots() * policy.n_kv_heads() * row_bytes;
}

// An unquantized cache's bytes are its fp16 bytes.
void add_full_precision_peak(KvStats& stats, int64_t bytes) {
  stats.peak_bytes += bytes;
  stats.peak_bytes_full += bytes;
}

void add_peak(KvStats& stats, const PeakBytes& bytes) {
  stats.peak_bytes += bytes.held;
  stats.peak_bytes_full += bytes.full;
}


// One layer's KIVI cache over Scalar (the accumulation type): see QuantizedLayerCache.
template <typename Scalar>
class KiviLayerCache final : public QuantizedLayerCache {
 public:
  KiviLayerCache(const Policy& policy, int layer, const SequenceShape& shape, int64_t window, torch::ScalarType acc,
                 int64_t head_dim)
      : shape_(shape), window_(window), acc_(acc), d_(head_dim), bits_(policy.options().kv_quant.bits) {
    for (int h = 0; h < shape.n_kv_heads; ++h) stores_.emplace_back(policy.options().kv_quant, static_cast<int>(head_dim));
    if (policy.keeps_everything()) return;
    if (!policy.realisable())
      throw Error("policy " + policy.name() + " is sim-only: it cannot run with --kv-quant kivi, which quantizes a cache " +
                  "a realisable policy evicts from");
    refuse_rewrites_with_kivi(policy);
    driver_ = std::make_unique<PolicyDriver>(*policy.as_realisable(), layer, shape, window, SlotColumns::CacheRows);
    set_flush_hook();
  }

  torch::Tensor attend(const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       int64_t start) override {
    const int64_t t = q.size(0), n_kv = k.size(1), d = d_;
    if (t > 1 && start + t > std::max<int64_t>(shape_.prefill_len, 1))
      throw Error("a block of several tokens can only be the prefill: a quantized cache flushes between tokens");
    const auto keys_new = k.to(torch::kCPU, acc_).contiguous(), values_new = v.to(torch::kCPU, acc_).contiguous();
    const Scalar* key_rows = keys_new.data_ptr<Scalar>();    // [t][Hkv][d]
    const Scalar* value_rows = values_new.data_ptr<Scalar>();
    // Which position each cache row of a head holds (-1: none): the driver's slots, or
    // every position in order without a policy; the new tokens take the next rows.
    std::vector<std::vector<int>> row_position(n_kv);
    int64_t n_prev = 0;
    for (int h = 0; h < n_kv; ++h) {
      std::vector<int>& rows = row_position[h];
      if (driver_) {
        const std::vector<int>& columns = driver_->columns(h);
        const std::vector<int>& positions = driver_->state(h).positions();
        rows.assign(columns.size(), -1);
        for (size_t s = 0; s < columns.size(); ++s) rows[columns[s]] = positions[s];
      } else {
        rows.resize(stores_[h].tokens());
        for (size_t r = 0; r < rows.size(); ++r) rows[r] = static_cast<int>(r);
      }
      n_prev = std::max<int64_t>(n_prev, static_cast<int64_t>(rows.size()));
      for (int64_t i = 0; i < t; ++i) {
        stores_[h].append(static_cast<int>(start + i), key_rows + (i * n_kv + h) * d, value_rows + (i * n_kv + h) * d);
        rows.push_back(static_cast<int>(start + i));
      }
    }
    const int64_t n = n_prev + t;
    if (t == 1 && start >= shape_.prefill_len) note_bytes();  // a decode step, as it attends
    // What the queries attend to, dequantized: [Hkv, n, d], rows a head does not use zero.
    auto keys = torch::zeros({n_kv, n, d}, torch::TensorOptions().dtype(acc_));
    auto values = torch::zeros({n_kv, n, d}, torch::TensorOptions().dtype(acc_));
    Scalar* key_out = keys.data_ptr<Scalar>();
    Scalar* value_out = values.data_ptr<Scalar>();
    at::parallel_for(0, n_kv, n * d * n_kv >= (int64_t{1} << 16) ? 1 : n_kv, [&](int64_t begin, int64_t end) {
      std::vector<int> row_of(start + t, -1);  // [position] -> row
      for (int64_t h = begin; h < end; ++h) {
        const std::vector<int>& rows = row_position[h];
        for (size_t r = 0; r < rows.size(); ++r)
          if (rows[r] >= 0) row_of[rows[r]] = static_cast<int>(r);
        stores_[h].dequantize_all(row_of, key_out + h * n * d, value_out + h * n * d);
      }
    });
    const auto keys_at = keys.to(q.device()), values_at = values.to(q.device());
    torch::Tensor out;
    if (driver_) {
      const HostTokens tokens(driver_->token_vectors(), k, v, q);
      out = causal_attention_blocks(q, keys_at, values_at, n_prev,
                                    [&](torch::Tensor logits, int64_t r0, int64_t rows, int64_t cols) {
                                      return drive_block(*driver_, logits, start + r0, rows, cols,
                                                         tokens.block().from_row(r0, n_kv));
                                    });
      driver_->take_moves();  // the rows are rebuilt from the stores at every call
      for (int h = 0; h < n_kv; ++h) stores_[h].retain(driver_->state(h).positions());
    } else {
      const int64_t window = window_;
      out = causal_attention_blocks(q, keys_at, values_at, n_prev,
                                    [&](torch::Tensor logits, int64_t r0, int64_t rows, int64_t) {
                                      return causal_softmax(logits, CausalRows{n_prev + r0, rows, window});
                                    });
      for (int64_t i = 0; i < t; ++i)
        for (int h = 0; h < n_kv; ++h) stores_[h].after_attention(static_cast<int>(start + i), shape_.prefill_len);
    }
    if (t > 1) note_bytes();  // after the prefill: the cache the first decode step starts from
    return out;
  }

  std::unique_ptr<QuantizedLayerCache> clone() const override {
    std::unique_ptr<KiviLayerCache> copy(new KiviLayerCache(*this));
    if (driver_) {
      copy->driver_ = driver_->clone();
      if (!copy->driver_) return nullptr;
      copy->set_flush_hook();
    }
    return copy;
  }

  int64_t held_bytes() const override {
    int64_t bytes = 0;
    for (const KvHeadStore<Scalar>& store : stores_) bytes += store.held_bytes();
    return bytes;
  }

  int64_t tokens() const override {
    if (driver_) return driver_->max_slots();
    return stores_.empty() ? 0 : stores_[0].tokens();
  }

  void record(KvStats& stats, int layer) override {
    stats.kv_bits = bits_;
    if (driver_) {
      record_driver_stats(stats, layer, *driver_, 0);
    } else {
      const int kept = stores_.empty() ? 0 : stores_[0].tokens();
      stats.kept_per_layer[layer] = kept;
      stats.max_per_layer[layer] = std::max(stats.max_per_layer[layer], kept);
      stats.kept_per_head[layer].assign(stores_.size(), kept);
      stats.visible_per_layer[layer] = static_cast<int>(window_ > 0 ? std::min<int64_t>(kept, window_) : kept);
    }
    stats.peak_bytes += peak_bytes_ - recorded_bytes_;
    stats.peak_bytes_full += peak_bytes_full_ - recorded_bytes_full_;
    recorded_bytes_ = peak_bytes_;
    recorded_bytes_full_ = peak_bytes_full_;
  }

 private:
  // A copy of every member (the driver is then replaced by its clone).
  KiviLayerCache(const KiviLayerCache& other)
      : shape_(other.shape_), window_(other.window_), acc_(other.acc_), d_(other.d_), bits_(other.bits_),
        stores_(other.stores_), peak_bytes_(other.peak_bytes_), peak_bytes_full_(other.peak_bytes_full_),
        recorded_bytes_(other.recorded_bytes_), recorded_bytes_full_(other.recorded_bytes_full_) {}

  // The stores flush after each query attended and was observed, before the policy compresses.
  void set_flush_hook() {
    driver_->set_attended_hook([this](int kv, int64_t position) {
      stores_[kv].after_attention(static_cast<int>(position), shape_.prefill_len);
    });
  }

  // The layer's bytes now, kept when they are its largest so far.
  void note_bytes() {
    KvByteCount count;
    for (const KvHeadStore<Scalar>& store : stores_) count += store.count();
    if (count.bytes() > peak_bytes_) {
      peak_bytes_ = count.bytes();
      peak_bytes_full_ = full_precision_bytes(count.tokens, d_);
    }
  }

  SequenceShape shape_;
  int64_t window_;
  torch::ScalarType acc_;
  int64_t d_;
  int bits_;
  std::vector<KvHeadStore<Scalar>> stores_;
  std::unique_ptr<PolicyDriver> driver_;
  int64_t peak_bytes_ = 0, peak_bytes_full_ = 0;          // the largest count so far and its fp16 cache
  int64_t recorded_bytes_ = 0, recorded_bytes_full_ = 0;  // what record() has added to the stats
};

KvStats empty_stats(const Model& model, int n_layers) {
  KvStats stats;
  stats.kept_per_layer.assign(n_layers, 0);
  stats.max_per_layer.assign(n_layers, 0);
  stats.kept_per_head.assign(n_layers, {});
  stats.visible_per_layer.assign(n_layers, 0);
  stats.sliding_window = model.arch().sliding_window;
  if (model.arch().dmc.enabled()) stats.dmc_merge_rate.assign(n_layers, 0);
  return stats;
}

// [t, Hkv, d] -> Hkv views [t, d].
std::vector<torch::Tensor> per_head(const torch::Tensor& x) {
  std::vector<torch::Tensor> heads;
  for (int64_t h = 0; h < x.size(1); ++h) heads.push_back(x.select(1, h));
  return heads;
}

}  // namespace

void apply_row_rewrites(const torch::Tensor& keys, const torch::Tensor& values, const std::vector<RowRewrites>& rewrites) {
  const int64_t d = values.size(2);
  const auto longs = torch::TensorOptions().dtype(torch::kLong);
  for (const RowRewrites& r : rewrites) {
    if (!r.key_columns.empty() && !r.zeroed_channels.empty()) {
      const auto rows = torch::tensor(std::vector<int64_t>(r.key_columns.begin(), r.key_columns.end()), longs);
      const auto channels =
          torch::tensor(std::vector<int64_t>(r.zeroed_channels.begin(), r.zeroed_channels.end()), longs);
      const auto at_rows = rows.to(keys.device());
      const auto head = keys.select(0, r.kv_head);
      const auto pruned = head.index_select(0, at_rows).index_fill_(1, channels.to(keys.device()), 0);
      head.index_copy_(0, at_rows, pruned);
    }
    if (r.value_columns.empty()) continue;
    if (r.value_deltas.size() != r.value_columns.size() * static_cast<size_t>(d))
      throw Error("internal: a rewrite's value additions are not head_dim " + std::to_string(d) + " floats each");
    std::map<int, std::vector<float>> sums;  // by row
    for (size_t i = 0; i < r.value_columns.size(); ++i) {
      std::vector<float>& sum = sums[r.value_columns[i]];
      sum.resize(d, 0.0f);
      for (int64_t c = 0; c < d; ++c) sum[c] += r.value_deltas[i * d + c];
    }
    std::vector<int64_t> rows;
    auto deltas = torch::empty({static_cast<int64_t>(sums.size()), d}, torch::kFloat32);
    float* out = deltas.data_ptr<float>();
    for (const auto& [row, sum] : sums) {
      rows.push_back(row);
      out = std::copy(sum.begin(), sum.end(), out);
    }
    values.select(0, r.kv_head)
        .index_add_(0, torch::tensor(rows, longs).to(values.device()), deltas.to(values.device(), values.scalar_type()));
  }
}

// DMC merges each KV head's slots on its own: heads that keep the same slots cannot
// follow, and heads that decide together (Ada-KV's layer-wide ranking) are not implemented.
void refuse_heads_deciding_together(const Policy& policy, bool same_slots, bool lockstep) {
  if (same_slots)
    throw Error("policy " + policy.name() + " keeps the same slots in every KV head of a layer, but a DMC model "
                "(config.json dmc_window_size) merges each head's slots on its own");
  if (lockstep)
    throw Error("policy " + policy.name() + " decides for a layer's KV heads together; over a DMC model "
                "(config.json dmc_window_size), whose heads merge their slots each on its own, that is not implemented");
}

void refuse_rewrites_with_kivi(const Policy& policy) {
  const KvQuantSpec& quant = policy.options().kv_quant;
  if (quant.enabled() && policy.realisable() && policy.as_realisable()->rewrites_slots())
    throw Error("policy " + policy.name() + " rewrites the keys or values of kept slots, which " + quant.keys->quant +
                " kivi holds quantized; that is not implemented");
}

void check_dmc_policy(const Policy& policy, const SequenceShape* shape) {
  if (policy.realisable() && policy.as_realisable()->rewrites_slots())
    throw Error("policy " + policy.name() + " rewrites the keys or values of kept slots; over a DMC model "
                "(config.json dmc_window_size), whose slots merge tokens, that is not implemented");
  const KvQuantSpec& quant = policy.options().kv_quant;
  if (quant.enabled())
    throw Error(std::string(quant.keys->quant) + " over a DMC model (config.json dmc_window_size) is not implemented");
  // The byte bound counts one cache row per token; DMC's slots hold runs of merged tokens.
  if (quant.memory > 0 && !policy.keeps_everything())
    throw Error(std::string(quant.keys->memory) + " over a DMC model (config.json dmc_window_size) is not implemented: "
                "its byte bound counts a row per token, DMC's slots merge tokens (give a token budget)");
  if (!policy.realisable())
    throw Error("policy " + policy.name() + " is sim-only; over a DMC model (config.json dmc_window_size) only "
                "realisable policies run, on its merged slots");
  if (shape && !policy.keeps_everything()) {
    const LayerStates states = policy.as_realisable()->make_layer_states(0, *shape);
    refuse_heads_deciding_together(policy, states.same_slots, states.lockstep);
  }
}

namespace {

// A driver over DMC's slots (SlotColumns::Versions).
std::unique_ptr<PolicyDriver> make_dmc_driver(const Policy& policy, int layer, const SequenceShape& shape) {
  auto driver = std::make_unique<PolicyDriver>(*policy.as_realisable(), layer, shape, 0, SlotColumns::Versions);
  refuse_heads_deciding_together(policy, driver->same_slots(), driver->lockstep());
  return driver;
}

// One KV head's DMC buffer [capacity, d] after a block, whose rows 0 .. used-1 held its
// slots and the block's versions: the rows `kept` (ascending) move to rows 0 .. kept-1,
// the rest up to `used` are zeroed (unused rows stay finite), and memory follows the
// slots, not the prefill block that made them: the slots and room to grow, shrunk only
// above what step-by-step doubling leaves.
void keep_dmc_rows(torch::Tensor& buffer, const std::vector<int64_t>& kept, int64_t used) {
  const int64_t n = static_cast<int64_t>(kept.size()), d = buffer.size(1);
  bool in_place = true;
  for (int64_t s = 0; s < n; ++s) in_place = in_place && kept[s] == s;
  if (!in_place)
    buffer.narrow(0, 0, n).copy_(buffer.index_select(0, torch::tensor(kept, torch::kLong).to(buffer.device())));
  if (used > n) buffer.narrow(0, n, used - n).zero_();
  if (buffer.size(0) > 2 * (n + 1) + 16) {
    auto smaller = torch::zeros({n + 1 + std::max<int64_t>(16, n / 8), d}, buffer.options());
    smaller.narrow(0, 0, n).copy_(buffer.narrow(0, 0, n));
    buffer = smaller;
  }
}

// A DMC layer's counts from its slots per KV head (all visible); returns the slots summed
// over the heads, which never shrink (a merge replaces one), so they are the layer's peak.
int64_t record_dmc_stats(KvStats& stats, int layer, const std::vector<int64_t>& slots, const DmcMergeState& dmc) {
  int64_t most = 0, total = 0;
  stats.kept_per_head[layer].assign(slots.begin(), slots.end());
  for (int64_t s : slots) {
    most = std::max(most, s);
    total += s;
  }
  stats.kept_per_layer[layer] = static_cast<int>(most);
  stats.visible_per_layer[layer] = static_cast<int>(most);
  // A head's slots never shrink (a merge replaces one), so the layer's peak is now.
  if (most > stats.max_per_layer[layer]) stats.max_per_layer[layer] = static_cast<int>(most);
  stats.dmc_merge_rate[layer] = dmc.merge_rate(layer);
  return total;
}

}  // namespace

std::unique_ptr<QuantizedLayerCache> make_quantized_layer_cache(const Policy& policy, int layer,
                                                                const SequenceShape& shape, int64_t sliding_window,
                                                                torch::ScalarType compute, int64_t head_dim) {
  const torch::ScalarType acc = accumulation_type(compute);
  if (acc == torch::kFloat64)
    return std::make_unique<KiviLayerCache<double>>(policy, layer, shape, sliding_window, acc, head_dim);
  return std::make_unique<KiviLayerCache<float>>(policy, layer, shape, sliding_window, acc, head_dim);
}

HostTokens::HostTokens(TokenVectors vectors, const torch::Tensor& k, const torch::Tensor& v, const torch::Tensor& q)
    : key_norms(key_norms_of(k)) {
  if (vectors == TokenVectors::None) return;
  keys = k.to(torch::kCPU, torch::kFloat32).contiguous();
  if (vectors >= TokenVectors::KeysAndValues) values = v.to(torch::kCPU, torch::kFloat32).contiguous();
  // [t, Hq, d] is [t][Hkv][group][d]: query head h belongs to KV head h / group.
  if (vectors == TokenVectors::KeysValuesAndQueries) queries = q.to(torch::kCPU, torch::kFloat32).contiguous();
}

BlockTokens HostTokens::block() const {
  BlockTokens tokens(key_norms.data_ptr<float>());
  if (keys.defined()) {
    tokens.keys = keys.data_ptr<float>();
    tokens.head_dim = static_cast<int>(keys.size(2));
  }
  if (values.defined()) tokens.values = values.data_ptr<float>();
  if (queries.defined()) {
    tokens.queries = queries.data_ptr<float>();
    tokens.group = static_cast<int>(queries.size(1) / keys.size(1));
  }
  return tokens;
}

torch::Tensor FullAttention::attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                    const torch::Tensor& v, int64_t) {
  const int64_t window = sliding_window_;
  return causal_attention_blocks(
      q, k.permute({1, 0, 2}), v.permute({1, 0, 2}), 0,
      [&](torch::Tensor logits, int64_t r0, int64_t rows, int64_t n) {
        if (!observer_) return causal_softmax(logits, CausalRows{r0, rows, window});
        const torch::Tensor scaled = logits.clone();
        torch::Tensor probs = causal_softmax(logits, CausalRows{r0, rows, window});
        const int64_t hq = q.size(1);
        observer_(layer, r0, rows, n, k, v, scaled.view({hq, rows, n}), probs.view({hq, rows, n}));
        return probs;
      },
      block_rows_);
}

torch::Tensor FullAttention::attend_merged(int, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                                           const torch::Tensor& merges, int64_t start) {
  if (start != 0) throw Error("full attention runs one pass; it cannot continue a DMC sequence");
  if (observer_) throw Error("attention statistics over DMC's merged slots are not implemented");
  return dmc_block_attention(q, per_head(k), per_head(v), {}, merges);
}

// ---------------------------------------------------------------------------------
SimAttention::SimAttention(const Model& model, const Policy& policy, SequenceShape shape)
    : policy_(policy), shape_(shape), stats_(empty_stats(model, shape.n_layers)),
      device_policy_path_(!model.device().is_cpu()) {
  // A sim-only policy's layer is a [heads, T, T] float32 matrix on the host (and its
  // probabilities go to the model's device whole): refused where it cannot be held.
  if (policy.realisable() || policy.keeps_everything()) return;
  const double bytes = static_cast<double>(shape.n_q_heads) * shape.length * shape.length * sizeof(float);
  if (bytes > static_cast<double>(kSimOnlyLayerBytesMax)) {
    char size[64];
    std::snprintf(size, sizeof size, "%.1f GiB", bytes / (1 << 30));
    throw Error("policy " + policy.name() + " is sim-only: each layer holds a [heads, T, T] float32 matrix, " +
                std::to_string(shape.n_q_heads) + " x " + std::to_string(shape.length) + " x " +
                std::to_string(shape.length) + " = " + size + ", over the " +
                std::to_string(kSimOnlyLayerBytesMax >> 30) + " GiB allowed; use shorter sequences or a realisable policy");
  }
}

torch::Tensor SimAttention::attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                   const torch::Tensor& v, int64_t start) {
  if (start != 0) throw Error("sim mode runs one teacher-forced pass; it cannot continue a sequence");
  const int64_t T = q.size(0), n_kv = k.size(1), d = q.size(2);
  if (policy_.options().kv_quant.enabled()) return simulate_quantized(layer, q, k, v);
  if (policy_.keeps_everything()) {
    stats_.kept_per_layer[layer] = stats_.max_per_layer[layer] = static_cast<int>(T);
    stats_.kept_per_head[layer].assign(n_kv, static_cast<int>(T));
    stats_.visible_per_layer[layer] = static_cast<int>(sliding_window_ > 0 ? std::min(T, sliding_window_) : T);
    add_full_precision_peak(stats_, T * 2 * n_kv * d * element_bytes(k));
    FullAttention full;
    full.set_sliding_window(sliding_window_);
    return full.attend(layer, q, k, v, start);
  }
  if (policy_.realisable()) return simulate_realisable(layer, q, k, v);
  return simulate_sim_only(layer, q, k, v);
}

torch::Tensor SimAttention::attend_merged(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                          const torch::Tensor& v, const torch::Tensor& merges, int64_t start) {
  if (start != 0) throw Error("sim mode runs one teacher-forced pass; it cannot continue a sequence");
  check_dmc_policy(policy_);
  const int64_t T = q.size(0), n_kv = k.size(1), d = q.size(2);
  if (!policy_.keeps_everything()) {
    auto driver = make_dmc_driver(policy_, layer, shape_);
    driver->start_block(0);
    const HostTokens tokens(driver->token_vectors(), k, v, q);
    auto out = dmc_policy_attention(q, per_head(k), per_head(v), merges, *driver, 0, tokens.block());
    add_peak(stats_, record_driver_stats(stats_, layer, *driver, 2 * d * element_bytes(k)));
    stats_.dmc_merge_rate[layer] = dmc_->merge_rate(layer);
    return out;
  }
  std::vector<int64_t> slots(n_kv);
  for (int64_t h = 0; h < n_kv; ++h) slots[h] = T - merges.select(1, h).sum().item<int64_t>();
  const int64_t total = record_dmc_stats(stats_, layer, slots, *dmc_);
  add_full_precision_peak(stats_, total * 2 * d * element_bytes(k));
  return dmc_block_attention(q, per_head(k), per_head(v), {}, merges);
}

// The layer's teacher-forced q, k, v through a quantized cache in the blocks decode mode
// uses (the prefill, then one token at a time): each query sees each key in the form the
// cache holds it at that step, so sim and decode compute the same numbers.
torch::Tensor SimAttention::simulate_quantized(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                               const torch::Tensor& v) {
  auto cache = make_quantized_layer_cache(policy_, layer, shape_, sliding_window_, q.scalar_type(), q.size(2));
  const int64_t T = q.size(0);
  const int64_t block = std::min<int64_t>(shape_.prefill_len, T);
  std::vector<torch::Tensor> rows;
  int64_t done = 0;
  if (block > 1) {
    // A policy that compresses inside the prefill takes it in its blocks, as decode mode does.
    const RealisablePolicy* realisable = policy_.as_realisable();
    const int64_t step = realisable && realisable->prefill_block() > 0 ? realisable->prefill_block() : block;
    for (int64_t from = 0; from < block;) {
      const int64_t to = std::min(block, (from / step + 1) * step);
      rows.push_back(cache->attend(q.narrow(0, from, to - from), k.narrow(0, from, to - from),
                                   v.narrow(0, from, to - from), from));
      from = to;
    }
    done = block;
  }
  for (; done < T; ++done)
    rows.push_back(cache->attend(q.narrow(0, done, 1), k.narrow(0, done, 1), v.narrow(0, done, 1), done));
  cache->record(stats_, layer);
  return torch::cat(rows, 0);
}

torch::Tensor SimAttention::simulate_realisable(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                                const torch::Tensor& v) {
  if (device_policy_path_)
    if (auto on_device = DeviceScoredLayer::make(policy_, layer, shape_, sliding_window_))
      return simulate_on_device(*on_device, layer, q, k, v);
  // A policy that rewrites slots runs over positions (simulate_rewriting); the others
  // attend their held slots (held_slot_attention).
  const bool rewrites = policy_.as_realisable()->rewrites_slots();
  PolicyDriver driver(*policy_.as_realisable(), layer, shape_, sliding_window_,
                      rewrites ? SlotColumns::Positions : SlotColumns::Versions);
  const HostTokens tokens(driver.token_vectors(), k, v, q);
  if (rewrites) {
    auto out = simulate_rewriting(driver, tokens, q, k, v);
    add_peak(stats_, record_driver_stats(stats_, layer, driver, 2 * q.size(2) * element_bytes(k)));
    return out;
  }
  auto out = held_slot_attention(driver, q, k, v, tokens);
  add_peak(stats_, record_driver_stats(stats_, layer, driver, 2 * q.size(2) * element_bytes(k)));
  return out;
}

// A policy that rewrites kept slots: the pass runs in the blocks decode mode feeds (the
// prefill, cut where the policy compresses inside it, then one query at a time) over
// copies of the layer's keys and values, and each block's rewrites change those copies
// before the next block's queries read them: from the rewrite on, every later query sees
// the slot as the decode cache then holds it.
torch::Tensor SimAttention::simulate_rewriting(PolicyDriver& driver, const HostTokens& tokens, const torch::Tensor& q,
                                               const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t T = q.size(0), n_kv = k.size(1);
  // clone, not contiguous: with one KV head the permuted view is already contiguous, and
  // the rewrites must not reach the model's own k and v.
  const auto keys = k.permute({1, 0, 2}).clone(at::MemoryFormat::Contiguous);
  const auto values = v.permute({1, 0, 2}).clone(at::MemoryFormat::Contiguous);
  const int64_t prefill = std::min<int64_t>(shape_.prefill_len, T);
  const int64_t step = policy_.as_realisable()->prefill_block() > 0 ? policy_.as_realisable()->prefill_block() : prefill;
  std::vector<torch::Tensor> outs;
  for (int64_t from = 0; from < T;) {
    const int64_t to = from < prefill ? std::min(prefill, (from / step + 1) * step) : from + 1;
    outs.push_back(causal_attention_blocks(q.narrow(0, from, to - from), keys.narrow(1, 0, to), values.narrow(1, 0, to),
                                           from, [&](torch::Tensor logits, int64_t r0, int64_t rows, int64_t n) {
                                             return drive_block(driver, logits, from + r0, rows, n,
                                                                tokens.block().from_row(from + r0, n_kv));
                                           }));
    apply_row_rewrites(keys, values, driver.take_rewrites());
    from = to;
  }
  return torch::cat(outs, 0);
}

// The device policy path over the teacher-forced pass: the logits come by position; each
// query (the prefill's rows together) sees its slots' columns, gathered, and its attention
// goes back to those columns. Nothing of the [T, T] logits leaves the device.
torch::Tensor SimAttention::simulate_on_device(DeviceScoredLayer& policy, int layer, const torch::Tensor& q,
                                               const torch::Tensor& k, const torch::Tensor& v) {
  const int64_t n_kv = k.size(1), g = q.size(1) / n_kv, d = q.size(2);
  const auto norms = k.to(torch::kFloat32).norm(2, -1);  // [T, Hkv], where k is
  const auto longs = torch::TensorOptions().dtype(torch::kLong).device(q.device());
  auto out = causal_attention_blocks(
      q, k.permute({1, 0, 2}), v.permute({1, 0, 2}), 0, [&](torch::Tensor logits, int64_t r0, int64_t rows, int64_t n) {
        auto probs = torch::zeros_like(logits).view({n_kv, g, rows, n});
        const auto by_row = logits.view({n_kv, g, rows, n});
        for (int64_t r = 0; r < rows;) {
          // The prefill's queries run together (nothing is evicted inside it), the rest one by one.
          int64_t count = 1;
          while (r0 + r + count < shape_.prefill_len && r + count < rows) ++count;
          const int64_t first = r0 + r;
          auto columns = torch::arange(first, first + count, longs).unsqueeze(0).expand({n_kv, count});
          if (policy.slots() > 0) columns = torch::cat({policy.positions(), columns}, 1);
          const int64_t slots = columns.size(1);
          const auto index = columns.view({n_kv, 1, 1, slots}).expand({n_kv, g, count, slots});
          const auto slot_logits = by_row.narrow(2, r, count).gather(3, index).reshape({n_kv, g * count, slots});
          const auto slot_probs = policy.rows(slot_logits, first, count, norms.narrow(0, first, count));
          probs.narrow(2, r, count).scatter_(3, index, slot_probs.view({n_kv, g, count, slots}));
          r += count;
        }
        return probs.view({n_kv, g * rows, n});
      });
  add_full_precision_peak(stats_, record_device_stats(stats_, layer, policy, 2 * d * element_bytes(k)));
  stats_.visible_per_layer[layer] = static_cast<int>(policy.last_visible());
  return out;
}

torch::Tensor SimAttention::simulate_sim_only(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                              const torch::Tensor& v) {
  const int64_t T = q.size(0), hq = q.size(1), n_kv = k.size(1), d = q.size(2), g = hq / n_kv;
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
  stats_.kept_per_head[layer].assign(n_kv, stats_.kept_per_layer[layer]);
  stats_.visible_per_layer[layer] = static_cast<int>(
      sliding_window_ > 0 ? std::min<int64_t>(stats_.kept_per_layer[layer], sliding_window_) : stats_.kept_per_layer[layer]);
  add_full_precision_peak(stats_, stats_.max_per_layer[layer] * 2 * n_kv * d * element_bytes(k));
  const auto acc = accumulation_type(q.scalar_type());
  auto p = probs32.to(q.device(), acc).view({n_kv, g * T, T});
  return weighted_values(p, v.permute({1, 0, 2}), T, hq, q.scalar_type());
}

// ---------------------------------------------------------------------------------
CacheAttention::CacheAttention(const Policy& policy, SequenceShape shape) : policy_(policy), shape_(shape) {}

CacheAttention::CacheAttention(const Model& model, const Policy& policy, SequenceShape shape)
    : policy_(policy), shape_(shape), layers_(shape.n_layers), stats_(empty_stats(model, shape.n_layers)) {
  if (!policy.realisable())
    throw Error("policy " + policy.name() + " is sim-only (it needs " + policy.as_sim_only()->needs() +
                ", which a real cache does not hold); use --mode sim");
  device_policy_path_ = !model.device().is_cpu();
}

std::unique_ptr<CacheAttention> CacheAttention::fork(const SequenceShape& shape) const {
  if (!policy_.states_agree(shape_, shape)) return nullptr;
  std::unique_ptr<CacheAttention> copy(new CacheAttention(policy_, shape));
  copy->sliding_window_ = sliding_window_;
  copy->device_policy_path_ = device_policy_path_;
  if (dmc_) copy->dmc_ = std::make_unique<DmcMergeState>(*dmc_);
  copy->stats_ = stats_;
  copy->attention_seconds_ = attention_seconds_;
  copy->layers_.resize(layers_.size());
  // The buffers are copied whole (their spare rows too), so the copy grows as this would.
  auto copied = [](const torch::Tensor& t) { return t.defined() ? t.clone() : t; };
  for (size_t l = 0; l < layers_.size(); ++l) {
    const LayerCache& from = layers_[l];
    LayerCache& to = copy->layers_[l];
    to.key_buffer = copied(from.key_buffer);
    to.value_buffer = copied(from.value_buffer);
    to.size = from.size;
    to.peak_bytes = from.peak_bytes;
    to.peak_bytes_full = from.peak_bytes_full;
    if (from.driver && !(to.driver = from.driver->clone())) return nullptr;
    if (from.device_policy) to.device_policy = from.device_policy->clone();
    if (from.quantized && !(to.quantized = from.quantized->clone())) return nullptr;
    to.dmc_slots = from.dmc_slots;
    for (const torch::Tensor& t : from.dmc_keys) to.dmc_keys.push_back(copied(t));
    for (const torch::Tensor& t : from.dmc_values) to.dmc_values.push_back(copied(t));
  }
  return copy;
}

int64_t CacheAttention::cached_tokens(int layer) const {
  const LayerCache& cache = layers_[layer];
  if (cache.quantized) return cache.quantized->tokens();
  if (!cache.dmc_slots.empty()) return *std::max_element(cache.dmc_slots.begin(), cache.dmc_slots.end());
  if (cache.device_policy) return cache.device_policy->slots();
  return cache.driver ? cache.driver->max_slots() : cache.size;
}

std::vector<std::vector<int>> CacheAttention::kept_positions(int layer) const {
  const LayerCache& cache = layers_[layer];
  std::vector<std::vector<int>> kept;
  if (cache.device_policy) {
    if (!cache.device_policy->positions().defined()) return kept;
    const auto positions = cache.device_policy->positions().to(torch::kCPU).contiguous();
    for (int64_t h = 0; h < positions.size(0); ++h) {
      const int64_t* row = positions.data_ptr<int64_t>() + h * positions.size(1);
      kept.emplace_back(row, row + positions.size(1));
    }
  } else if (cache.driver) {
    for (int h = 0; h < cache.driver->n_kv_heads(); ++h) kept.push_back(cache.driver->state(h).positions());
  }
  return kept;
}

int64_t CacheAttention::held_bytes() const {
  int64_t bytes = 0;
  for (const LayerCache& cache : layers_) {
    if (cache.quantized) bytes += cache.quantized->held_bytes();
    for (const torch::Tensor* buffer : {&cache.key_buffer, &cache.value_buffer})
      if (buffer->defined()) bytes += static_cast<int64_t>(buffer->nbytes());
    for (const auto* buffers : {&cache.dmc_keys, &cache.dmc_values})
      for (const torch::Tensor& buffer : *buffers)
        if (buffer.defined()) bytes += static_cast<int64_t>(buffer.nbytes());
  }
  return bytes;
}

torch::Tensor CacheAttention::attend(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                     const torch::Tensor& v, int64_t start) {
  const auto started = std::chrono::steady_clock::now();
  LayerCache& cache = layers_[layer];
  if (policy_.options().kv_quant.enabled()) {
    if (!cache.quantized)
      cache.quantized = make_quantized_layer_cache(policy_, layer, shape_, sliding_window_, q.scalar_type(), q.size(2));
    torch::Tensor out = cache.quantized->attend(q, k, v, start);
    cache.quantized->record(stats_, layer);
    attention_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
    return out;
  }
  if (!policy_.keeps_everything() && !cache.driver && !cache.device_policy) {
    if (device_policy_path_) cache.device_policy = DeviceScoredLayer::make(policy_, layer, shape_, sliding_window_);
    if (!cache.device_policy)
      cache.driver = std::make_unique<PolicyDriver>(*policy_.as_realisable(), layer, shape_, sliding_window_,
                                                    SlotColumns::CacheRows);
  }
  torch::Tensor out = cache.device_policy ? attend_on_device(cache, layer, q, k, v, start)
                      : cache.driver      ? attend_evicting(cache, layer, q, k, v, start)
                                          : attend_full(cache, layer, q, k, v);
  attention_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

torch::Tensor CacheAttention::attend_merged(int layer, const torch::Tensor& q, const torch::Tensor& k,
                                            const torch::Tensor& v, const torch::Tensor& merges, int64_t start) {
  const auto started = std::chrono::steady_clock::now();
  check_dmc_policy(policy_);
  LayerCache& cache = layers_[layer];
  const int64_t t = q.size(0), n_kv = k.size(1), d = q.size(2);
  if (start == 0) {
    cache.dmc_slots.assign(n_kv, 0);
    cache.dmc_keys.assign(n_kv, {});
    cache.dmc_values.assign(n_kv, {});
    if (!policy_.keeps_everything()) cache.driver = make_dmc_driver(policy_, layer, shape_);
  }
  const uint8_t* mp = merges.data_ptr<uint8_t>();
  // Head h's buffers [capacity, d] hold its slots in rows 0 .. slots(h)-1, oldest first;
  // the block's versions go to the rows after them. Without a policy, a merge at the
  // block's first token replaces the head's last slot, so that row is not attended to and
  // is overwritten; with one, the driver merges.
  for (int64_t h = 0; h < n_kv; ++h) {
    int64_t& held = cache.dmc_slots[h];
    if (!cache.driver && mp[h] && held > 0) --held;
    for (auto* buffers : {&cache.dmc_keys, &cache.dmc_values}) {
      torch::Tensor& buffer = (*buffers)[h];
      if (!buffer.defined() || buffer.size(0) < held + t) {
        auto grown = torch::zeros({std::max<int64_t>(2 * (held + t), 16), d}, k.options());
        if (held > 0) grown.narrow(0, 0, held).copy_(buffer.narrow(0, 0, held));
        buffer = grown;
      }
    }
    cache.dmc_keys[h].narrow(0, held, t).copy_(k.select(1, h));
    cache.dmc_values[h].narrow(0, held, t).copy_(v.select(1, h));
  }
  torch::Tensor out;
  std::vector<std::vector<int64_t>> kept(n_kv);  // per head: the rows it keeps, in slot order
  if (cache.driver) {
    cache.driver->start_block(start);
    const HostTokens tokens(cache.driver->token_vectors(), k, v, q);
    out = dmc_policy_attention(q, cache.dmc_keys, cache.dmc_values, merges, *cache.driver, start, tokens.block());
    for (int64_t h = 0; h < n_kv; ++h) {
      const std::vector<int>& columns = cache.driver->columns(static_cast<int>(h));
      kept[h].assign(columns.begin(), columns.end());
    }
  } else {
    out = dmc_block_attention(q, cache.dmc_keys, cache.dmc_values, cache.dmc_slots, merges);
    // Each head keeps its slots and the block's final versions.
    const std::vector<std::vector<int64_t>> finals = dmc_final_versions(merges);
    for (int64_t h = 0; h < n_kv; ++h) {
      for (int64_t row = 0; row < cache.dmc_slots[h]; ++row) kept[h].push_back(row);
      for (int64_t j : finals[h]) kept[h].push_back(cache.dmc_slots[h] + j);
    }
  }
  for (int64_t h = 0; h < n_kv; ++h) {
    for (auto* buffers : {&cache.dmc_keys, &cache.dmc_values})
      keep_dmc_rows((*buffers)[h], kept[h], cache.dmc_slots[h] + t);
    cache.dmc_slots[h] = static_cast<int64_t>(kept[h].size());
  }
  int64_t peak;
  if (cache.driver) {
    peak = record_driver_stats(stats_, layer, *cache.driver, 2 * d * element_bytes(k)).full;
    stats_.dmc_merge_rate[layer] = dmc_->merge_rate(layer);
  } else {
    peak = record_dmc_stats(stats_, layer, cache.dmc_slots, *dmc_) * 2 * d * element_bytes(k);
  }
  if (peak > cache.peak_bytes) {
    add_full_precision_peak(stats_, peak - cache.peak_bytes);
    cache.peak_bytes = peak;
  }
  attention_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - started).count();
  return out;
}

// The full cache: rows in position order, causal attention over them.
torch::Tensor CacheAttention::attend_full(LayerCache& cache, int layer, const torch::Tensor& q, const torch::Tensor& k,
                                          const torch::Tensor& v) {
  const int64_t t = q.size(0), n_kv = k.size(1), d = q.size(2);
  int64_t value_size = cache.size;
  append_rows(cache.key_buffer, cache.size, k.permute({1, 0, 2}));  // [Hkv, t, d]
  append_rows(cache.value_buffer, value_size, v.permute({1, 0, 2}));
  const int64_t n = cache.size, n_prev = n - t, window = sliding_window_;
  auto out = cache_rows_attention(q, cache.key_buffer, cache.value_buffer, n,
                                  [&](torch::Tensor logits, int64_t r0, int64_t rows, int64_t) {
                                    return causal_softmax(logits, CausalRows{n_prev + r0, rows, window});
                                  });
  if (n > stats_.max_per_layer[layer]) {
    add_full_precision_peak(stats_, (n - stats_.max_per_layer[layer]) * 2 * n_kv * d * element_bytes(k));
    stats_.max_per_layer[layer] = static_cast<int>(n);
  }
  stats_.kept_per_layer[layer] = static_cast<int>(n);
  stats_.kept_per_head[layer].assign(n_kv, static_cast<int>(n));
  stats_.visible_per_layer[layer] = static_cast<int>(window > 0 ? std::min(n, window) : n);
  return out;
}

// Under a policy: each KV head's new keys go to the rows its driver assigns, the driver
// turns each block's logits over the cache rows into the attention (and evicts), and the
// cache carries out the row moves of its evictions.
torch::Tensor CacheAttention::attend_evicting(LayerCache& cache, int layer, const torch::Tensor& q,
                                              const torch::Tensor& k, const torch::Tensor& v, int64_t start) {
  PolicyDriver& driver = *cache.driver;
  const int64_t t = q.size(0), n_kv = k.size(1), d = q.size(2);
  check_block(start, t);
  const int64_t n_prev = driver.max_slots(), n = n_prev + t;
  hold_rows(cache.key_buffer, cache.value_buffer, k, v, n_prev, n);
  // Head h's new keys go to rows slots(h) .. slots(h)+t-1 (where the driver puts them).
  const auto new_keys = k.permute({1, 0, 2}), new_values = v.permute({1, 0, 2});  // [Hkv, t, d]
  bool uniform = true;
  for (int h = 0; h < n_kv; ++h) uniform = uniform && driver.slots(h) == n_prev;
  if (uniform) {
    copy_rows(cache.key_buffer.narrow(1, n_prev, t), new_keys);
    copy_rows(cache.value_buffer.narrow(1, n_prev, t), new_values);
  } else {
    for (int h = 0; h < n_kv; ++h) {
      copy_rows(cache.key_buffer.select(0, h).narrow(0, driver.slots(h), t), new_keys.select(0, h));
      copy_rows(cache.value_buffer.select(0, h).narrow(0, driver.slots(h), t), new_values.select(0, h));
    }
  }
  const HostTokens tokens(driver.token_vectors(), k, v, q);
  auto out = cache_rows_attention(q, cache.key_buffer, cache.value_buffer, n,
                                  [&](torch::Tensor logits, int64_t r0, int64_t rows, int64_t cols) {
                                    return drive_block(driver, logits, start + r0, rows, cols,
                                                       tokens.block().from_row(r0, static_cast<int>(n_kv)));
                                  });
  const int64_t capacity = cache.key_buffer.size(1);
  move_rows(cache.key_buffer, cache.value_buffer, driver.take_moves());
  // Rewrites name the rows after the moves.
  if (driver.rewrites()) apply_row_rewrites(cache.key_buffer, cache.value_buffer, driver.take_rewrites());
  const int64_t kept = driver.max_slots();
  if (capacity > kept + 1 + std::max<int64_t>(16, kept / 8)) {
    // Memory follows the budget, not the prompt (or the doubling that filled the cache):
    // the kept rows plus the next token's, which the following eviction frees again.
    for (torch::Tensor* buffer : {&cache.key_buffer, &cache.value_buffer}) {
      auto smaller = torch::zeros({n_kv, kept + 1, d}, buffer->options());
      smaller.narrow(1, 0, kept).copy_(buffer->narrow(1, 0, kept));
      *buffer = smaller;
    }
  }
  // Peak bytes: the sum over layers of each layer's largest cache.
  const PeakBytes peak = record_driver_stats(stats_, layer, driver, 2 * d * element_bytes(k));
  add_peak(stats_, {peak.held - cache.peak_bytes, peak.full - cache.peak_bytes_full});
  cache.peak_bytes = peak.held;
  cache.peak_bytes_full = peak.full;
  return out;
}

const KvStats& CacheAttention::stats() const {
  for (size_t l = 0; l < layers_.size(); ++l)
    if (layers_[l].device_policy) stats_.visible_per_layer[l] = static_cast<int>(layers_[l].device_policy->last_visible());
  return stats_;
}

void CacheAttention::check_block(int64_t start, int64_t t) const {
  // Nothing is evicted inside the prefill or inside an uncompressed question (scorer.h).
  const bool in_prefill = start + t <= std::max<int64_t>(shape_.prefill_len, 1);
  const bool in_question = shape_.question_len > 0 && start >= shape_.prefill_len &&
                           start + t <= shape_.prefill_len + shape_.question_len;
  if (t > 1 && !in_prefill && !in_question)
    throw Error("a block of several tokens can only be the prefill or the question: eviction happens between tokens");
}

// The device policy path: every head holds as many slots, slot s in cache row s, oldest
// first; the new keys go to the rows after them, and a compression gathers the kept rows
// to the front. Nothing here waits for the device.
torch::Tensor CacheAttention::attend_on_device(LayerCache& cache, int layer, const torch::Tensor& q,
                                               const torch::Tensor& k, const torch::Tensor& v, int64_t start) {
  DeviceScoredLayer& policy = *cache.device_policy;
  const int64_t t = q.size(0), n_kv = k.size(1), d = q.size(2);
  check_block(start, t);
  const int64_t n_prev = policy.slots(), n = n_prev + t;
  hold_rows(cache.key_buffer, cache.value_buffer, k, v, n_prev, n);
  copy_rows(cache.key_buffer.narrow(1, n_prev, t), k.permute({1, 0, 2}));
  copy_rows(cache.value_buffer.narrow(1, n_prev, t), v.permute({1, 0, 2}));
  const auto norms = k.to(torch::kFloat32).norm(2, -1);  // [t, Hkv], where k is
  auto out = cache_rows_attention(q, cache.key_buffer, cache.value_buffer, n,
                                  [&](torch::Tensor logits, int64_t r0, int64_t rows, int64_t) {
                                    return policy.rows(logits, start + r0, rows, norms.narrow(0, r0, rows));
                                  });
  if (policy.kept().defined()) {
    const torch::Tensor& kept = policy.kept();  // [Hkv, kept]
    const int64_t count = kept.size(1);
    const auto rows = kept.unsqueeze(-1).expand({n_kv, count, d});
    for (torch::Tensor* buffer : {&cache.key_buffer, &cache.value_buffer}) {
      const auto gathered = buffer->narrow(1, 0, n).gather(1, rows);
      // Memory follows the budget, as on the host path: the kept rows and the next token's.
      if (buffer->size(1) > count + 1 + std::max<int64_t>(16, count / 8)) {
        auto smaller = torch::zeros({n_kv, count + 1, d}, buffer->options());
        smaller.narrow(1, 0, count).copy_(gathered);
        *buffer = smaller;
      } else {
        buffer->narrow(1, 0, count).copy_(gathered);
      }
    }
  }
  const int64_t peak = record_device_stats(stats_, layer, policy, 2 * d * element_bytes(k));
  add_full_precision_peak(stats_, peak - cache.peak_bytes);
  cache.peak_bytes = peak;
  return out;
}

}  // namespace kvevict
