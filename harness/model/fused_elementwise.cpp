#include "harness/model/fused_elementwise.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>
#include <utility>

#include "harness/common/bit_cast.h"
#include "harness/common/float_row_exp.h"
#include "harness/model/bfloat16_bits.h"

namespace kvevict {
namespace {

// Element storage: float, or bfloat16 as its 16 bits (bfloat16_bits.h): plain code the
// compiler vectorizes (c10::BFloat16's conversions did not, and made the bfloat16 loops
// slower than ATen's on a 1024-token block).
inline void store(float* p, float v) { *p = v; }
inline void store(uint16_t* p, float v) { *p = bf16_bits(v); }
// What ATen does after each op on a tensor stored as S: round the float result to S.
inline float rounded(float v, const float*) { return v; }
inline float rounded(float v, const uint16_t*) { return widen(bf16_bits(v)); }

template <typename S>
S* storage(const torch::Tensor& t) {
  if constexpr (std::is_same_v<S, float>) return t.data_ptr<float>();
  else return reinterpret_cast<uint16_t*>(t.data_ptr<at::BFloat16>());
}

// Rows per parallel task: about 32K elements, so a decode step's single row stays on
// the calling thread (as ATen's element-wise ops do below their grain size).
int64_t row_grain(int64_t row_length) { return std::max<int64_t>(1, (int64_t{1} << 15) / std::max<int64_t>(1, row_length)); }

// One row's mean of squares: each square exact in double (a float's or bfloat16's
// product fits its 53 bits), element i summed into lane i % 8 in order, the lanes
// combined in a fixed tree, the sum divided by n and rounded once to float. Plain code,
// one build for every CPU: a row's mean has the same bits on any x86-64, alone or in a
// block, on any thread count.
template <typename S>
float mean_of_squares(const S* x, int64_t n) {
  double lanes[8] = {0, 0, 0, 0, 0, 0, 0, 0};
  int64_t i = 0;
  for (; i + 8 <= n; i += 8)
    for (int lane = 0; lane < 8; ++lane) {
      const double v = widen(x[i + lane]);
      lanes[lane] += v * v;
    }
  for (int lane = 0; i < n; ++i, ++lane) {
    const double v = widen(x[i]);
    lanes[lane] += v * v;
  }
  const double sum = ((lanes[0] + lanes[1]) + (lanes[2] + lanes[3])) + ((lanes[4] + lanes[5]) + (lanes[6] + lanes[7]));
  return static_cast<float>(sum / static_cast<double>(n));
}

// out = w * (x * rsqrt(mean(x^2) + eps)) for `rows` rows of n, each rounded as ATen rounds.
template <typename S>
void rms_norm_rows(const S* X, const S* W, int64_t rows, int64_t n, float eps, S* O) {
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const S* in = X + r * n;
      S* o = O + r * n;
      const float inverse_rms = 1.0f / std::sqrt(mean_of_squares(in, n) + eps);
      for (int64_t i = 0; i < n; ++i) store(o + i, widen(W[i]) * rounded(widen(in[i]) * inverse_rms, in));
    }
  });
}

template <typename S>
torch::Tensor rms_norm_as(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(1, n);
  auto out = torch::empty(x.sizes(), x.options());
  rms_norm_rows(storage<S>(x), storage<S>(w), rows, n, static_cast<float>(eps), storage<S>(out));
  return out;
}

// x + delta, rounded to S as ATen's add rounds it, and that sum's RMSNorm.
template <typename S>
std::pair<torch::Tensor, torch::Tensor> add_rms_norm_as(const torch::Tensor& x, const torch::Tensor& delta,
                                                        const torch::Tensor& w, double eps) {
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(1, n);
  auto sum = torch::empty(x.sizes(), x.options());
  const S* X = storage<S>(x);
  const S* D = storage<S>(delta);
  S* Y = storage<S>(sum);
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * n; i < end * n; ++i) store(Y + i, widen(X[i]) + widen(D[i]));
  });
  auto out = torch::empty(x.sizes(), x.options());
  rms_norm_rows(Y, storage<S>(w), rows, n, static_cast<float>(eps), storage<S>(out));
  return {sum, out};
}

template <typename S>
torch::Tensor rotate_half_as(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                             int64_t rotary_dim) {
  const int64_t t = x.size(0), heads = x.size(1), head_dim = x.size(2), half = rotary_dim / 2;
  const int64_t token_stride = x.stride(0), head_stride = x.stride(1);
  const S* X = storage<S>(x);
  const S* C = storage<S>(cos);
  const S* N = storage<S>(sin);
  auto out = torch::empty({t, heads, head_dim}, x.options().memory_format(at::MemoryFormat::Contiguous));
  S* O = storage<S>(out);
  at::parallel_for(0, t * heads, row_grain(head_dim), [&](int64_t begin, int64_t end) {
    for (int64_t row = begin; row < end; ++row) {
      const int64_t token = row / heads, head = row % heads;
      const S* in = X + token * token_stride + head * head_stride;
      const S* c = C + token * rotary_dim;
      const S* s = N + token * rotary_dim;
      S* o = O + row * head_dim;
      // rot * cos + cat(-x2, x1) * sin, each product and the sum rounded as ATen rounds them.
      for (int64_t i = 0; i < half; ++i)
        store(o + i, rounded(widen(in[i]) * widen(c[i]), in) + rounded(-widen(in[i + half]) * widen(s[i]), in));
      for (int64_t i = half; i < rotary_dim; ++i)
        store(o + i, rounded(widen(in[i]) * widen(c[i]), in) + rounded(widen(in[i - half]) * widen(s[i]), in));
      for (int64_t i = rotary_dim; i < head_dim; ++i) o[i] = in[i];
    }
  });
  return out;
}

// Elements per exponential pass of silu_times: a float buffer on the stack.
constexpr int64_t kSiluBlock = 1024;

// out[i] = silu(gate[i]) * up[i] for `count` elements, each rounded to S where ATen rounds
// (after the silu and after the product). silu(g) = g * sigmoid(g) with e = exp(-|g|),
// which never overflows: g / (1 + e) for g >= 0, g * e / (1 + e) below. The
// exponentials are float_row_exp.h's, the same bits in every loop, so an element's
// result depends on its value alone: not on its place in a row, the block, the
// thread count or the CPU.
template <typename S>
void silu_times_block(const S* gate, const S* up, int64_t count, S* out) {
  float e[kSiluBlock];
  for (int64_t first = 0; first < count; first += kSiluBlock) {
    const int64_t n = std::min(kSiluBlock, count - first);
    const S* g = gate + first;
    for (int64_t i = 0; i < n; ++i) e[i] = -std::fabs(widen(g[i]));
    exp_floats(e, e, static_cast<int>(n));
    // Both numerators computed and one chosen by x's sign bit (-0 takes x * e = -0 too):
    // integer selects the compiler vectorises, where a comparison (which may trap) or a
    // branch (the signs of a row's gates are random) left a scalar loop 8x slower.
    for (int64_t i = 0; i < n; ++i) {
      const float x = widen(g[i]);
      const uint32_t negative = 0u - (bit_cast<uint32_t>(x) >> 31);  // all ones below zero
      const uint32_t numerator = (bit_cast<uint32_t>(x) & ~negative) | (bit_cast<uint32_t>(x * e[i]) & negative);
      const float silu = bit_cast<float>(numerator) / (1.0f + e[i]);
      store(out + first + i, rounded(silu, g) * widen(up[first + i]));
    }
  }
}

template <typename S>
torch::Tensor silu_times_as(const torch::Tensor& gate, const torch::Tensor& up) {
  const int64_t n = gate.size(-1), rows = gate.numel() / std::max<int64_t>(1, n);
  const auto g = gate.reshape({rows, n}), u = up.reshape({rows, n});  // views where the strides allow
  auto out = torch::empty({rows, n}, gate.options());
  const S* G = storage<S>(g);
  const S* U = storage<S>(u);
  S* O = storage<S>(out);
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) silu_times_block(G + r * g.stride(0), U + r * u.stride(0), n, O + r * n);
  });
  return out.view(gate.sizes());
}

}  // namespace

bool fused_elementwise_supported(const torch::Tensor& x, const torch::Tensor& partner) {
  const auto type = x.scalar_type();
  return x.device().is_cpu() && (type == torch::kFloat32 || type == torch::kBFloat16) &&
         partner.scalar_type() == type && partner.device().is_cpu();
}

torch::Tensor rms_norm_aten(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  auto xf = x.scalar_type() == torch::kFloat64 ? x : x.to(torch::kFloat32);
  auto normed = xf * torch::rsqrt(xf.pow(2).mean(-1, true) + eps);
  return w * normed.to(x.scalar_type());
}

namespace {
// Whether the loops take x and w: x [..., n] (any strides: a copy is contiguous), w [n].
bool fused_norm_supported(const torch::Tensor& x, const torch::Tensor& w) {
  return fused_elementwise_supported(x, w) && x.dim() > 0 && w.dim() == 1 && w.size(0) == x.size(-1);
}
}  // namespace

torch::Tensor rms_norm_fused(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  const auto xc = x.contiguous(), wc = w.contiguous();
  if (x.scalar_type() == torch::kBFloat16) return rms_norm_as<uint16_t>(xc, wc, eps);
  return rms_norm_as<float>(xc, wc, eps);
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  // Other dtypes and devices, and a w that is not one weight per element of a row (ATen
  // then says what is wrong), keep ATen's ops.
  if (fused_norm_supported(x, w)) return rms_norm_fused(x, w, eps);
  return rms_norm_aten(x, w, eps);
}

std::pair<torch::Tensor, torch::Tensor> add_rms_norm(const torch::Tensor& x, const torch::Tensor& delta,
                                                     const torch::Tensor& w, double eps) {
  if (!fused_norm_supported(x, w) || delta.scalar_type() != x.scalar_type() || !delta.device().is_cpu() ||
      delta.sizes() != x.sizes()) {
    auto sum = x + delta;
    return {sum, rms_norm(sum, w, eps)};
  }
  const auto xc = x.contiguous(), dc = delta.contiguous(), wc = w.contiguous();
  if (x.scalar_type() == torch::kBFloat16) return add_rms_norm_as<uint16_t>(xc, dc, wc, eps);
  return add_rms_norm_as<float>(xc, dc, wc, eps);
}

torch::Tensor rotate_half_aten(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                               int64_t rotary_dim) {
  const int64_t half = rotary_dim / 2, head_dim = x.size(-1);
  auto rot = x.narrow(-1, 0, rotary_dim);
  auto x1 = rot.narrow(-1, 0, half), x2 = rot.narrow(-1, half, half);
  auto out = rot * cos + torch::cat({-x2, x1}, -1) * sin;
  if (rotary_dim == head_dim) return out;
  return torch::cat({out, x.narrow(-1, rotary_dim, head_dim - rotary_dim)}, -1);
}

torch::Tensor rotate_half_fused(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                                int64_t rotary_dim) {
  const auto xs = x.stride(2) == 1 ? x : x.contiguous();
  const auto c = cos.contiguous(), s = sin.contiguous();
  if (x.scalar_type() == torch::kBFloat16) return rotate_half_as<uint16_t>(xs, c, s, rotary_dim);
  return rotate_half_as<float>(xs, c, s, rotary_dim);
}

torch::Tensor rotate_half(const torch::Tensor& x, const torch::Tensor& cos, const torch::Tensor& sin,
                          int64_t rotary_dim) {
  // The loops index cos and sin as [t, rotary_dim]; other shapes go to ATen's broadcasting.
  const bool angles_per_token = x.dim() == 3 && cos.numel() == x.size(0) * rotary_dim &&
                                sin.numel() == cos.numel() && rotary_dim <= x.size(2) && rotary_dim % 2 == 0;
  if (fused_elementwise_supported(x, cos) && sin.scalar_type() == cos.scalar_type() && angles_per_token)
    return rotate_half_fused(x, cos, sin, rotary_dim);
  return rotate_half_aten(x, cos, sin, rotary_dim);
}

torch::Tensor elementwise_in_chunks(const torch::Tensor& x, const std::function<torch::Tensor(const torch::Tensor&)>& op) {
  if (!x.device().is_cpu()) return op(x);
  if (x.scalar_type() == torch::kFloat16)  // LibTorch's CPU kernels lack float16: float32, rounded once
    return elementwise_in_chunks(x.to(torch::kFloat32), op).to(torch::kFloat16);
  const torch::Tensor flat = x.contiguous().view(-1);
  const int64_t n = flat.numel();
  if (n <= kElementwiseChunk) return op(flat).view(x.sizes());
  torch::Tensor out = torch::empty_like(flat);  // [n]
  const int64_t chunks = (n + kElementwiseChunk - 1) / kElementwiseChunk;
  at::parallel_for(0, chunks, 1, [&](int64_t begin, int64_t end) {
    for (int64_t c = begin; c < end; ++c) {
      const int64_t first = c * kElementwiseChunk, length = std::min(kElementwiseChunk, n - first);
      out.narrow(0, first, length).copy_(op(flat.narrow(0, first, length)));
    }
  });
  return out.view(x.sizes());
}

torch::Tensor silu_times(const torch::Tensor& gate, const torch::Tensor& up) {
  if (!fused_elementwise_supported(gate, up) || gate.sizes() != up.sizes() || gate.dim() == 0)
    return elementwise_in_chunks(gate, [](const torch::Tensor& c) { return torch::silu(c); }) * up;
  // Rows whose elements are contiguous (a narrow() of a fused gate-up product is).
  const auto g = gate.stride(-1) == 1 ? gate : gate.contiguous(), u = up.stride(-1) == 1 ? up : up.contiguous();
  if (gate.scalar_type() == torch::kBFloat16) return silu_times_as<uint16_t>(g, u);
  return silu_times_as<float>(g, u);
}

}  // namespace kvevict
