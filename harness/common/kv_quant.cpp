#include "harness/common/kv_quant.h"

#include <algorithm>
#include <cmath>

#include "harness/common/errors.h"
#include "harness/common/limits.h"

namespace kvevict {

std::string kv_quant_method(const KvQuantSpec& spec) { return spec.enabled() ? "kivi" : "none"; }

void set_kv_quant_method(KvQuantSpec& spec, const std::string& method) {
  const KvQuantKeys& k = *spec.keys;
  if (method == "none") {
    if (spec.bits_given && spec.bits != 16)
      throw Error(std::string(k.bits) + " " + std::to_string(spec.bits) + " needs " + k.quant + " kivi (" + k.quant +
                  " none keeps the cache at full precision)");
    spec.bits = 16;
  } else if (method == "kivi") {
    // 16 is the unquantized cache's value, not a KIVI width: taking the 2-bit default
    // for it would run another cache than the one asked for.
    if (spec.bits_given && spec.bits == 16)
      throw Error(std::string(k.bits) + " 16 is the unquantized cache; " + k.quant + " kivi stores 2 or 4 bits");
    spec.bits = spec.bits == 16 ? 2 : spec.bits;
  } else {
    throw Error(std::string(k.quant) + ": unknown KV quantization '" + method + "' (none, kivi)");
  }
  spec.method_given = method;
}

void check_kv_quant_spec(const KvQuantSpec& spec) {
  const KvQuantKeys& k = *spec.keys;
  if (spec.bits != 16 && spec.bits != 2 && spec.bits != 4)
    throw Error(std::string(k.bits) + " must be 2 or 4 (16: no quantization), got " + std::to_string(spec.bits));
  if (spec.group < 1) throw Error(std::string(k.group) + " must be at least 1, got " + std::to_string(spec.group));
  if (spec.residual < 1 || spec.residual % spec.group != 0)
    throw Error(std::string(k.residual) + " must be a positive multiple of " + k.group + " (" +
                std::to_string(spec.group) + "), got " + std::to_string(spec.residual));
  // A residual longer than any context never flushes a key: the cache would be fp16.
  if (spec.residual > kMaxModelPositions)
    throw Error(std::string(k.residual) + " " + std::to_string(spec.residual) + " is above " +
                std::to_string(kMaxModelPositions) + ", the longest context a model may declare");
  if (!spec.enabled() && (spec.group_given || spec.residual_given))
    throw Error(std::string(spec.group_given ? k.group : k.residual) + " applies to a quantized cache (" + k.quant +
                " kivi); this cache is unquantized");
  if (spec.memory != -1 && !(spec.memory > 0 && spec.memory <= 1))
    throw Error(std::string(k.memory) + " must be in (0, 1], got " + std::to_string(spec.memory));
}

void check_kv_quant_head_dim(const KvQuantSpec& spec, int64_t head_dim) {
  if (spec.enabled() && head_dim % spec.group != 0)
    throw Error(std::string(spec.keys->group) + " " + std::to_string(spec.group) +
                " does not divide the model's head_dim " + std::to_string(head_dim) +
                " (values are quantized in groups of that many channels)");
}

template <typename Scalar>
QuantParams<Scalar> quantize_group(const Scalar* x, int n, int64_t stride, int bits, uint8_t* codes) {
  Scalar lo = x[0], hi = x[0];
  for (int i = 1; i < n; ++i) {
    lo = std::min(lo, x[i * stride]);
    hi = std::max(hi, x[i * stride]);
  }
  const Scalar top = static_cast<Scalar>((1 << bits) - 1);
  QuantParams<Scalar> p{lo, (hi - lo) / top};
  for (int i = 0; i < n; ++i) {
    if (p.scale == Scalar(0)) {
      codes[i] = 0;
      continue;
    }
    const Scalar scaled = std::clamp((x[i * stride] - lo) / p.scale, Scalar(0), top);
    codes[i] = static_cast<uint8_t>(std::nearbyint(scaled));  // the default rounding: half to even
  }
  return p;
}
template QuantParams<float> quantize_group(const float*, int, int64_t, int, uint8_t*);
template QuantParams<double> quantize_group(const double*, int, int64_t, int, uint8_t*);

void pack_codes(const uint8_t* codes, int64_t n, int bits, uint8_t* out) {
  std::fill(out, out + packed_bytes(n, bits), uint8_t{0});
  for (int64_t i = 0; i < n; ++i) out[i * bits / 8] |= static_cast<uint8_t>(codes[i] << (i * bits % 8));
}

void unpack_codes(const uint8_t* packed, int64_t n, int bits, uint8_t* codes) {
  const int mask = (1 << bits) - 1;
  for (int64_t i = 0; i < n; ++i) codes[i] = static_cast<uint8_t>((packed[i * bits / 8] >> (i * bits % 8)) & mask);
}

KvByteCount& KvByteCount::operator+=(const KvByteCount& o) {
  tokens += o.tokens;
  key_quantized += o.key_quantized;
  key_groups += o.key_groups;
  key_residual += o.key_residual;
  value_quantized += o.value_quantized;
  value_groups += o.value_groups;
  value_residual += o.value_residual;
  bits_total += o.bits_total;
  return *this;
}

// ---------------------------------------------------------------------------------
template <typename Scalar>
KvHeadStore<Scalar>::KvHeadStore(const KvQuantSpec& spec, int head_dim)
    : spec_(spec), d_(head_dim), row_bytes_(packed_bytes(head_dim, spec.bits)) {
  check_kv_quant_spec(spec);
  check_kv_quant_head_dim(spec, head_dim);
  if (!spec.enabled()) throw Error("internal: a KV store without quantization");
}

template <typename Scalar>
void KvHeadStore<Scalar>::append(int position, const Scalar* key, const Scalar* value) {
  key_res_pos_.push_back(position);
  key_res_.insert(key_res_.end(), key, key + d_);
  value_res_pos_.push_back(position);
  value_res_.insert(value_res_.end(), value, value + d_);
}

template <typename Scalar>
void KvHeadStore<Scalar>::after_attention(int position, int prefill_len) {
  const int R = spec_.residual;
  if (prefill_len > 1 && position < prefill_len - 1) return;  // inside the prefill
  if (prefill_len > 1 && position == prefill_len - 1) {
    const int n = key_residual_tokens();
    quantize_oldest_keys(n - n % R);
  } else if (key_residual_tokens() == R) {
    quantize_oldest_keys(R);
  }
  while (value_residual_tokens() > R) quantize_oldest_value();
}

template <typename Scalar>
void KvHeadStore<Scalar>::quantize_oldest_keys(int count) {
  const int G = spec_.group;
  std::vector<uint8_t> codes(static_cast<size_t>(G) * d_);  // [G][d], one code per byte
  std::vector<uint8_t> column(G);          // [G]: one channel's codes
  for (int b0 = 0; b0 < count; b0 += G) {
    const Scalar* block = key_res_.data() + static_cast<size_t>(b0) * d_;  // [G][d]
    const int id = key_blocks();
    block_min_.resize(block_min_.size() + d_);
    block_scale_.resize(block_scale_.size() + d_);
    for (int c = 0; c < d_; ++c) {
      // channel c of G tokens: a column of the block, stride d
      const QuantParams<Scalar> p = quantize_group(block + c, G, d_, spec_.bits, column.data());
      block_min_[static_cast<size_t>(id) * d_ + c] = p.min;
      block_scale_[static_cast<size_t>(id) * d_ + c] = p.scale;
      for (int i = 0; i < G; ++i) codes[static_cast<size_t>(i) * d_ + c] = column[i];
    }
    block_live_.push_back(G);
    for (int i = 0; i < G; ++i) {
      key_q_pos_.push_back(key_res_pos_[b0 + i]);
      key_q_block_.push_back(id);
      const size_t at = key_codes_.size();
      key_codes_.resize(at + row_bytes_);
      pack_codes(codes.data() + static_cast<size_t>(i) * d_, d_, spec_.bits, key_codes_.data() + at);
    }
  }
  key_res_pos_.erase(key_res_pos_.begin(), key_res_pos_.begin() + count);
  key_res_.erase(key_res_.begin(), key_res_.begin() + static_cast<size_t>(count) * d_);
}

template <typename Scalar>
void KvHeadStore<Scalar>::quantize_oldest_value() {
  const int G = spec_.group, groups = d_ / G;
  std::vector<uint8_t> codes(d_);
  for (int g = 0; g < groups; ++g) {
    const QuantParams<Scalar> p = quantize_group(value_res_.data() + g * G, G, 1, spec_.bits, codes.data() + g * G);
    value_min_.push_back(p.min);
    value_scale_.push_back(p.scale);
  }
  const size_t at = value_codes_.size();
  value_codes_.resize(at + row_bytes_);
  pack_codes(codes.data(), d_, spec_.bits, value_codes_.data() + at);
  value_q_pos_.push_back(value_res_pos_.front());
  value_res_pos_.erase(value_res_pos_.begin());
  value_res_.erase(value_res_.begin(), value_res_.begin() + d_);
}

namespace {
// Keeps the entries i of a [n][width] table whose keep[i] is set, in order.
template <typename T>
void compact(std::vector<T>& table, const std::vector<char>& keep, size_t width) {
  size_t out = 0;
  for (size_t i = 0; i < keep.size(); ++i)
    if (keep[i]) {
      if (out != i) std::copy_n(table.begin() + i * width, width, table.begin() + out * width);
      ++out;
    }
  table.resize(out * width);
}

std::vector<char> kept_mask(const std::vector<int>& positions, const std::vector<int>& sorted_kept) {
  std::vector<char> keep(positions.size());
  for (size_t i = 0; i < positions.size(); ++i)
    keep[i] = std::binary_search(sorted_kept.begin(), sorted_kept.end(), positions[i]);
  return keep;
}
}  // namespace

template <typename Scalar>
void KvHeadStore<Scalar>::retain(const std::vector<int>& positions) {
  std::vector<int> kept(positions);
  std::sort(kept.begin(), kept.end());
  if (static_cast<int>(kept.size()) == tokens()) return;  // nothing evicted (the store holds every kept slot)
  // Keys.
  std::vector<char> keep = kept_mask(key_q_pos_, kept);
  for (size_t i = 0; i < keep.size(); ++i)
    if (!keep[i]) --block_live_[key_q_block_[i]];
  compact(key_q_pos_, keep, 1);
  compact(key_q_block_, keep, 1);
  compact(key_codes_, keep, static_cast<size_t>(row_bytes_));
  std::vector<char> live_block(block_live_.size());
  std::vector<int> renumber(block_live_.size(), -1);
  int next = 0;
  for (size_t b = 0; b < block_live_.size(); ++b) {
    live_block[b] = block_live_[b] > 0;
    if (live_block[b]) renumber[b] = next++;
  }
  compact(block_min_, live_block, d_);
  compact(block_scale_, live_block, d_);
  compact(block_live_, live_block, 1);
  for (int& b : key_q_block_) b = renumber[b];
  keep = kept_mask(key_res_pos_, kept);
  compact(key_res_pos_, keep, 1);
  compact(key_res_, keep, d_);
  // Values.
  const size_t groups = d_ / spec_.group;
  keep = kept_mask(value_q_pos_, kept);
  compact(value_q_pos_, keep, 1);
  compact(value_codes_, keep, static_cast<size_t>(row_bytes_));
  compact(value_min_, keep, groups);
  compact(value_scale_, keep, groups);
  keep = kept_mask(value_res_pos_, kept);
  compact(value_res_pos_, keep, 1);
  compact(value_res_, keep, d_);
  if (static_cast<size_t>(tokens()) != kept.size())
    throw Error("internal: a KV store was asked to keep a token it does not hold");
}

template <typename Scalar>
void KvHeadStore<Scalar>::read(int position, Scalar* key, Scalar* value) const {
  std::vector<uint8_t> codes(d_);
  auto at = [](const std::vector<int>& sorted, int p) -> int {
    auto it = std::lower_bound(sorted.begin(), sorted.end(), p);
    return it != sorted.end() && *it == p ? static_cast<int>(it - sorted.begin()) : -1;
  };
  if (int i = at(key_res_pos_, position); i >= 0) {
    std::copy_n(key_res_.begin() + static_cast<size_t>(i) * d_, d_, key);
  } else if (int j = at(key_q_pos_, position); j >= 0) {
    unpack_codes(key_codes_.data() + j * row_bytes_, d_, spec_.bits, codes.data());
    const size_t block = static_cast<size_t>(key_q_block_[j]) * d_;
    for (int c = 0; c < d_; ++c) key[c] = dequantize(codes[c], QuantParams<Scalar>{block_min_[block + c], block_scale_[block + c]});
  } else {
    throw Error("internal: a KV store was asked for a key it does not hold (position " + std::to_string(position) + ")");
  }
  if (int i = at(value_res_pos_, position); i >= 0) {
    std::copy_n(value_res_.begin() + static_cast<size_t>(i) * d_, d_, value);
  } else if (int j = at(value_q_pos_, position); j >= 0) {
    unpack_codes(value_codes_.data() + j * row_bytes_, d_, spec_.bits, codes.data());
    const int G = spec_.group, groups = d_ / G;
    for (int c = 0; c < d_; ++c) {
      const size_t g = static_cast<size_t>(j) * groups + c / G;
      value[c] = dequantize(codes[c], QuantParams<Scalar>{value_min_[g], value_scale_[g]});
    }
  } else {
    throw Error("internal: a KV store was asked for a value it does not hold (position " + std::to_string(position) + ")");
  }
}

template <typename Scalar>
void KvHeadStore<Scalar>::dequantize_all(const std::vector<int>& row_of, Scalar* keys, Scalar* values) const {
  std::vector<uint8_t> codes(d_);  // [d]: one token's codes
  const int G = spec_.group, groups = d_ / G;
  for (size_t j = 0; j < key_q_pos_.size(); ++j) {
    Scalar* out = keys + static_cast<int64_t>(row_of[key_q_pos_[j]]) * d_;
    unpack_codes(key_codes_.data() + j * row_bytes_, d_, spec_.bits, codes.data());
    const Scalar* lo = block_min_.data() + static_cast<size_t>(key_q_block_[j]) * d_;
    const Scalar* scale = block_scale_.data() + static_cast<size_t>(key_q_block_[j]) * d_;
    for (int c = 0; c < d_; ++c) out[c] = dequantize(codes[c], QuantParams<Scalar>{lo[c], scale[c]});
  }
  for (size_t i = 0; i < key_res_pos_.size(); ++i)
    std::copy_n(key_res_.begin() + i * d_, d_, keys + static_cast<int64_t>(row_of[key_res_pos_[i]]) * d_);
  for (size_t j = 0; j < value_q_pos_.size(); ++j) {
    Scalar* out = values + static_cast<int64_t>(row_of[value_q_pos_[j]]) * d_;
    unpack_codes(value_codes_.data() + j * row_bytes_, d_, spec_.bits, codes.data());
    for (int c = 0; c < d_; ++c) {
      const size_t g = j * groups + c / G;
      out[c] = dequantize(codes[c], QuantParams<Scalar>{value_min_[g], value_scale_[g]});
    }
  }
  for (size_t i = 0; i < value_res_pos_.size(); ++i)
    std::copy_n(value_res_.begin() + i * d_, d_, values + static_cast<int64_t>(row_of[value_res_pos_[i]]) * d_);
}

template <typename Scalar>
KvByteCount KvHeadStore<Scalar>::count() const {
  KvByteCount c;
  const int64_t d = d_, b = spec_.bits, fp_bits = 8 * kFullPrecisionBytes;
  c.tokens = tokens();
  c.key_quantized = static_cast<int64_t>(key_q_pos_.size());
  c.key_groups = static_cast<int64_t>(block_live_.size()) * d;
  c.key_residual = static_cast<int64_t>(key_res_pos_.size());
  c.value_quantized = static_cast<int64_t>(value_q_pos_.size());
  c.value_groups = c.value_quantized * (d / spec_.group);
  c.value_residual = static_cast<int64_t>(value_res_pos_.size());
  c.bits_total = (c.key_quantized + c.value_quantized) * d * b + (c.key_groups + c.value_groups) * 2 * fp_bits +
                 (c.key_residual + c.value_residual) * d * fp_bits;
  return c;
}

template <typename Scalar>
int64_t KvHeadStore<Scalar>::held_bytes() const {
  auto size = [](const auto& v) { return static_cast<int64_t>(v.size() * sizeof(v[0])); };
  return size(key_q_pos_) + size(key_q_block_) + size(key_codes_) + size(block_min_) + size(block_scale_) +
         size(block_live_) + size(key_res_pos_) + size(key_res_) + size(value_q_pos_) + size(value_codes_) +
         size(value_min_) + size(value_scale_) + size(value_res_pos_) + size(value_res_);
}

template class KvHeadStore<float>;
template class KvHeadStore<double>;

// ---------------------------------------------------------------------------------
int64_t kv_bytes_bound(const KvQuantSpec& spec, int64_t tokens, int64_t head_dim, int64_t length) {
  if (!spec.enabled()) return full_precision_bytes(tokens, head_dim);
  const int64_t d = head_dim, b = spec.bits, R = spec.residual, G = spec.group, fp = 8 * kFullPrecisionBytes;
  const int64_t key_groups = (length + G - 1) / G;
  // bits: codes, then a group's scale and min (fp16 each), then full-precision elements.
  int64_t key_bits = 0;
  for (int64_t residual = std::min<int64_t>(tokens, 1); residual <= std::min(tokens, R); ++residual) {
    const int64_t quantized = tokens - residual;
    key_bits = std::max(key_bits, quantized * d * b + std::min(quantized, key_groups) * d * 2 * fp + residual * d * fp);
  }
  const int64_t value_residual = std::min(tokens, R + 1), value_quantized = tokens - value_residual;
  const int64_t value_bits = value_quantized * (d * b + (d / G) * 2 * fp) + value_residual * d * fp;
  return (key_bits + value_bits + 7) / 8;
}

int64_t tokens_for_memory(const KvQuantSpec& spec, double fraction, int64_t length, int64_t head_dim) {
  const double budget = fraction * static_cast<double>(full_precision_bytes(length, head_dim));
  int64_t lo = 0, hi = length;  // the bound grows with the tokens: the largest that fits
  while (lo < hi) {
    const int64_t mid = (lo + hi + 1) / 2;
    if (static_cast<double>(kv_bytes_bound(spec, mid, head_dim, length)) <= budget) lo = mid;
    else hi = mid - 1;
  }
  return lo;
}

}  // namespace kvevict
