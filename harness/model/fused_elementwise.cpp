#include "harness/model/fused_elementwise.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <cmath>
#include <cstdint>
#include <type_traits>

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

template <typename S>
torch::Tensor rms_norm_as(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  const int64_t n = x.size(-1), rows = x.numel() / std::max<int64_t>(1, n);
  const S* X = storage<S>(x);
  const S* W = storage<S>(w);
  // ATen's expression: xf.pow(2).mean(-1, true) + eps, then rsqrt (pow(x, 2) is x * x).
  auto squares = torch::empty(x.sizes(), x.options().dtype(torch::kFloat32));
  float* Q = squares.data_ptr<float>();
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t i = begin * n; i < end * n; ++i) {
      const float v = widen(X[i]);
      Q[i] = v * v;
    }
  });
  const auto mean = squares.mean(-1, true).contiguous();  // ATen's reduction order
  const float* M = mean.data_ptr<float>();
  const float eps_f = static_cast<float>(eps);
  auto out = torch::empty(x.sizes(), x.options());
  S* O = storage<S>(out);
  at::parallel_for(0, rows, row_grain(n), [&](int64_t begin, int64_t end) {
    for (int64_t r = begin; r < end; ++r) {
      const float inverse_rms = 1.0f / std::sqrt(M[r] + eps_f);
      const S* in = X + r * n;
      S* o = O + r * n;
      for (int64_t i = 0; i < n; ++i) store(o + i, widen(W[i]) * rounded(widen(in[i]) * inverse_rms, in));
    }
  });
  return out;
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

torch::Tensor rms_norm_fused(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  TORCH_CHECK(x.is_contiguous(), "rms_norm_fused: x must be contiguous");
  const auto wc = w.contiguous();
  if (x.scalar_type() == torch::kBFloat16) return rms_norm_as<uint16_t>(x, wc, eps);
  return rms_norm_as<float>(x, wc, eps);
}

torch::Tensor rms_norm(const torch::Tensor& x, const torch::Tensor& w, double eps) {
  // ATen sums a strided row in another order than a contiguous one: such x keep ATen's ops
  // (as does a w that is not one weight per element of a row: ATen says what is wrong).
  if (fused_elementwise_supported(x, w) && x.is_contiguous() && x.dim() > 0 && w.dim() == 1 &&
      w.size(0) == x.size(-1))
    return rms_norm_fused(x, w, eps);
  return rms_norm_aten(x, w, eps);
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

}  // namespace kvevict
