// KV-cache quantization as KIVI (arXiv 2402.02750, jy-yuan/KIVI) defines it: keys per
// channel, values per token, a full-precision residual, and the flush schedule. A property
// of the cache, composable with every eviction policy: one KvHeadStore per layer and KV
// head holds each kept token's key and value either at full precision (the residual) or
// as packed b-bit codes with a per-group scale and min, and counts its bytes. No LibTorch,
// so the quantizer, the packing, the schedule and the byte counts are tested model-free.
//
// Quantizing a group x: m = min x, M = max x, s = (M - m)/(2^b - 1),
//   q = nearbyint(clamp((x - m)/s, 0, 2^b - 1))   (round half to even, as torch.round),
//   x^ = q*s + m; a constant group (s = 0) dequantizes to m.
// Keys (after RoPE): a group is G consecutive kept tokens of one channel (a flush makes
// R/G blocks of G tokens; a block holds d groups, one per channel). Values: a group is G
// consecutive channels of one token.
// Schedule, after the query at position t attended (before the policy evicts):
//   inside the prefill (t < P - 1): nothing;
//   at the prefill's last token (t = P - 1, P > 1): keys: with n in the residual and
//     r = n mod R, the oldest n - r are quantized in blocks of G; values as below;
//   otherwise (stream): (1) a key residual of exactly R tokens is quantized whole;
//     (2) while the value residual holds more than R tokens, its oldest is quantized.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvevict {

// The names of the quantization settings where the user wrote them.
struct KvQuantKeys {
  const char* quant;
  const char* bits;
  const char* group;
  const char* residual;
  const char* memory;
};
inline constexpr KvQuantKeys kKvQuantFlags{"--kv-quant", "--kv-bits", "--kv-group", "--kv-residual", "--kv-memory"};
inline constexpr KvQuantKeys kSweepKvQuantKeys{"kv_quant", "kv_bits", "kv_group", "kv_residual", "kv_memories"};

// Bytes a full-precision element, a scale or a min counts for, whatever the compute dtype
// (fp16), so byte counts compare across dtypes.
inline constexpr int64_t kFullPrecisionBytes = 2;

struct KvQuantSpec {
  int bits = 16;        // 16: no quantization; 2 or 4: KIVI
  int group = 32;       // G
  int residual = 128;   // R, a multiple of G
  double memory = -1;   // --kv-memory: a byte budget as a fraction of the fp16 cache (-1: none)
  const KvQuantKeys* keys = &kKvQuantFlags;  // for error messages only
  // Which settings the user wrote (the CLI's flags), so that a contradiction is refused
  // rather than one of its sides silently winning: "--kv-quant none --kv-bits 4".
  bool bits_given = false, group_given = false, residual_given = false;
  std::string method_given;  // "none", "kivi" or "" (not given)
  bool enabled() const { return bits != 16; }
};

// "none" or "kivi" (the --kv-quant flag and the kv_quant sweep key).
std::string kv_quant_method(const KvQuantSpec& spec);
// Sets bits to 16 for "none"; "kivi" keeps the bits (2 when they were 16). Throws naming the key.
void set_kv_quant_method(KvQuantSpec& spec, const std::string& method);

// The rules that need no model: bits 2 or 4 (or 16 off), G >= 1, R a positive multiple
// of G and at most kMaxModelPositions, memory in (0, 1], and no contradiction among the
// settings given (bits or G or R with method none, bits 16 with kivi, G or R on an
// unquantized cache). Throws kvevict::Error naming the flag or key.
void check_kv_quant_spec(const KvQuantSpec& spec);
// head_dim divisible by G (values are grouped per token by G channels).
void check_kv_quant_head_dim(const KvQuantSpec& spec, int64_t head_dim);

// One quantization group's parameters.
template <typename Scalar>
struct QuantParams {
  Scalar min = 0, scale = 0;
};

// Quantizes n numbers x[i * stride] to codes[i] (one code per byte, 0 .. 2^bits - 1).
template <typename Scalar>
QuantParams<Scalar> quantize_group(const Scalar* x, int n, int64_t stride, int bits, uint8_t* codes);
template <typename Scalar>
inline Scalar dequantize(uint8_t code, const QuantParams<Scalar>& p) {
  return p.scale == Scalar(0) ? p.min : static_cast<Scalar>(code) * p.scale + p.min;
}

// b-bit codes packed little-endian: code i occupies bits (i*b) % 8 .. of byte (i*b) / 8.
inline int64_t packed_bytes(int64_t codes, int bits) { return (codes * bits + 7) / 8; }
void pack_codes(const uint8_t* codes, int64_t n, int bits, uint8_t* out);
void unpack_codes(const uint8_t* packed, int64_t n, int bits, uint8_t* codes);

// What a head's store (or a layer's, summed) holds, as the issue counts it.
struct KvByteCount {
  int64_t tokens = 0;             // kept tokens
  int64_t key_quantized = 0;      // tokens whose key is quantized
  int64_t key_groups = 0;         // key groups (one per channel of a block) with >= 1 kept token
  int64_t key_residual = 0;       // tokens whose key is in the residual
  int64_t value_quantized = 0;
  int64_t value_groups = 0;
  int64_t value_residual = 0;
  int64_t bits_total = 0;         // every byte below, in bits (quantized elements are b bits)
  int64_t bytes() const { return (bits_total + 7) / 8; }
  KvByteCount& operator+=(const KvByteCount& o);
};

// The fp16 cache of `tokens` kept tokens of one KV head: keys and values, head_dim each.
inline int64_t full_precision_bytes(int64_t tokens, int64_t head_dim) {
  return 2 * tokens * head_dim * kFullPrecisionBytes;
}

// One KV head's cache in one layer under KIVI. Tokens are named by position; each store
// keeps its tokens in position order.
template <typename Scalar>
class KvHeadStore {
 public:
  KvHeadStore(const KvQuantSpec& spec, int head_dim);
  // Token `position` (above every position held) enters both residuals.
  void append(int position, const Scalar* key, const Scalar* value);
  // The flush schedule after the query at `position` attended; prefill_len as SequenceShape's.
  void after_attention(int position, int prefill_len);
  // Keeps only the tokens at these positions (any order); the others leave whichever
  // store holds them. A key block whose tokens are all gone frees its scales and mins.
  void retain(const std::vector<int>& positions);
  // key and value [head_dim] of a held `position` as the cache holds it (dequantized
  // or full precision).
  void read(int position, Scalar* key, Scalar* value) const;
  // Every held token's key and value, as read() gives them, into row row_of[position] of
  // keys and values ([rows][head_dim] each); row_of: [position] -> row, indexed up to the
  // newest position held.
  void dequantize_all(const std::vector<int>& row_of, Scalar* keys, Scalar* values) const;
  // The byte count of what the store holds now (see KvByteCount).
  KvByteCount count() const;
  // Bytes the store's buffers hold now (codes, scales, mins, residuals, positions).
  int64_t held_bytes() const;
  int tokens() const { return static_cast<int>(key_res_pos_.size() + key_q_pos_.size()); }
  int key_residual_tokens() const { return static_cast<int>(key_res_pos_.size()); }
  int value_residual_tokens() const { return static_cast<int>(value_res_pos_.size()); }
  int key_blocks() const { return static_cast<int>(block_live_.size()); }

 private:
  void quantize_oldest_keys(int count);  // count: a multiple of G
  void quantize_oldest_value();

  KvQuantSpec spec_;
  int d_;
  int64_t row_bytes_;                  // packed codes of one token's d elements
  // Keys: quantized tokens (ascending), then the residual (ascending, newer).
  std::vector<int> key_q_pos_;         // [n_kq]
  std::vector<int> key_q_block_;       // [n_kq]: the block holding each
  std::vector<uint8_t> key_codes_;     // [n_kq][row_bytes]
  std::vector<Scalar> block_min_;      // [blocks][d]: one group per channel
  std::vector<Scalar> block_scale_;    // [blocks][d]
  std::vector<int> block_live_;        // [blocks]: kept tokens in each
  std::vector<int> key_res_pos_;       // [n_kr]
  std::vector<Scalar> key_res_;        // [n_kr][d]
  // Values: quantized tokens (ascending), then the residual.
  std::vector<int> value_q_pos_;       // [n_vq]
  std::vector<uint8_t> value_codes_;   // [n_vq][row_bytes]
  std::vector<Scalar> value_min_;      // [n_vq][d/G]
  std::vector<Scalar> value_scale_;    // [n_vq][d/G]
  std::vector<int> value_res_pos_;     // [n_vr]
  std::vector<Scalar> value_res_;      // [n_vr][d]
};

extern template class KvHeadStore<float>;
extern template class KvHeadStore<double>;

// The most bytes a KIVI cache of one KV head can hold at attention with `tokens` tokens
// kept of a sequence of `length`, whichever tokens a policy keeps: R + 1 values in the
// residual (a quantized value is cheaper), and for the keys the worst split between the
// residual (the new token and up to R - 1 others) and quantized keys each alive in its own
// group (a scattered kept set pays a group's scale and min per kept key, up to the
// ceil(length / G) groups the sequence has). bits 16: the fp16 cache.
int64_t kv_bytes_bound(const KvQuantSpec& spec, int64_t tokens, int64_t head_dim, int64_t length);
// --kv-memory: the most tokens per KV head (the current one included) whose bound fits
// `fraction` of the fp16 cache of `length` tokens; 0 when none fits.
int64_t tokens_for_memory(const KvQuantSpec& spec, double fraction, int64_t length, int64_t head_dim);

}  // namespace kvevict
