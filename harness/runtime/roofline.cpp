#include "harness/runtime/roofline.h"

#include <ATen/Parallel.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <map>
#include <sstream>
#include <vector>

namespace kvevict {
namespace {

bool is_matrix_role(Role role) { return role != Role::Embed && role != Role::PositionEmbed; }

// (out, in) -> how many times one forward multiplies by a weight of that shape.
std::map<std::pair<int64_t, int64_t>, int> linear_shapes(const ArchSpec& arch) {
  std::map<std::pair<int64_t, int64_t>, int> shapes;
  for (const TensorSpec& spec : arch.tensors)
    if (spec.shape.size() == 2 && is_matrix_role(spec.role)) ++shapes[{spec.shape[0], spec.shape[1]}];
  if (arch.tied_head)  // the head is the embedding matrix, multiplied by every row
    for (const TensorSpec& spec : arch.tensors)
      if (spec.role == Role::Embed) ++shapes[{spec.shape[0], spec.shape[1]}];
  return shapes;
}

}  // namespace

GemmPeak measure_gemm_peak(const ArchSpec& arch, torch::ScalarType dtype, int64_t rows, int repeat) {
  torch::NoGradGuard no_grad;
  GemmPeak peak;
  double mix_flops = 0, mix_seconds = 0;
  for (const auto& [shape, count] : linear_shapes(arch)) {
    const auto [out, in] = shape;
    auto x = torch::randn({rows, in}).to(dtype);
    auto w = (torch::randn({out, in}) * 0.02).to(dtype);
    torch::linear(x, w);  // warm-up: first-touch pages and library set-up
    const double s = best_seconds(repeat, [&] { torch::linear(x, w); });
    const double flops = 2.0 * rows * out * in;
    mix_flops += count * flops;
    mix_seconds += count * s;
    if (flops / s > peak.best_flops_per_s) {
      peak.best_flops_per_s = flops / s;
      peak.best_shape = "[" + std::to_string(rows) + " x " + std::to_string(out) + " x " + std::to_string(in) + "]";
    }
  }
  peak.mix_flops_per_s = mix_seconds > 0 ? mix_flops / mix_seconds : 0;
  return peak;
}

double measure_read_bandwidth(int64_t bytes, int repeat) {
  const int64_t words = bytes / 8;
  std::vector<uint64_t> buffer(static_cast<size_t>(words), 1);  // written: every page is real
  const uint64_t* data = buffer.data();
  uint64_t sink = 0;
  const double s = best_seconds(std::max(repeat, 3), [&] {
    std::vector<uint64_t> partial(static_cast<size_t>(at::get_num_threads()) + 1, 0);
    at::parallel_for(0, words, 1 << 16, [&](int64_t begin, int64_t end) {
      // Independent integer sums vectorise without reassociation concerns.
      uint64_t a = 0, b = 0, c = 0, d = 0;
      int64_t i = begin;
      for (; i + 4 <= end; i += 4) {
        a += data[i];
        b += data[i + 1];
        c += data[i + 2];
        d += data[i + 3];
      }
      for (; i < end; ++i) a += data[i];
      partial[static_cast<size_t>(at::get_thread_num())] += a + b + c + d;
    });
    for (uint64_t p : partial) sink += p;
  });
  if (sink == 42) return 0;  // keeps the sums alive
  return static_cast<double>(words * 8) / s;
}

double forward_flops(const ArchSpec& arch, int64_t t) {
  double per_token = 0;
  for (const auto& [shape, count] : linear_shapes(arch)) per_token += 2.0 * count * shape.first * shape.second;
  const double pairs = static_cast<double>(t) * (t + 1) / 2;
  const double attention = 2.0 * 2.0 * pairs * arch.n_heads * arch.head_dim * arch.n_layers;
  return per_token * t + attention;
}

double decode_weight_bytes(const ArchSpec& arch, torch::ScalarType dtype) {
  const double element = static_cast<double>(c10::elementSize(dtype));
  double elements = 0;
  for (const TensorSpec& spec : arch.tensors) {
    double n = 1;
    for (int64_t d : spec.shape) n *= static_cast<double>(d);
    if (spec.role == Role::Embed || spec.role == Role::PositionEmbed)
      n = spec.shape.size() == 2 ? static_cast<double>(spec.shape[1]) : n;  // one row
    elements += n;
  }
  if (arch.tied_head)
    for (const TensorSpec& spec : arch.tensors)
      if (spec.role == Role::Embed) elements += static_cast<double>(spec.shape[0]) * spec.shape[1];
  return elements * element;
}

double kv_bytes_per_token(const ArchSpec& arch, torch::ScalarType dtype) {
  return 2.0 * arch.n_layers * arch.n_kv_heads * arch.head_dim * static_cast<double>(c10::elementSize(dtype));
}

int64_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  for (std::string line; std::getline(in, line);)
    if (line.rfind("VmHWM:", 0) == 0) {
      std::istringstream fields(line.substr(6));
      int64_t kb = 0;
      fields >> kb;
      return kb * 1024;
    }
  return 0;
}

void reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  out << "5";  // resets VmHWM to the current RSS
}

std::string load_average() {
  std::ifstream in("/proc/loadavg");
  std::string one, five, fifteen;
  in >> one >> five >> fifteen;
  return one + " " + five + " " + fifteen;
}

}  // namespace kvevict
