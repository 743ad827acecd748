// Benchmarks that print numbers. `kvevict bench` times model load, greedy generation
// and a full-sequence forward; with --config it times the eviction hook itself:
// sim-mode forwards under each policy and decode steps at a budget, each as a ratio
// to full attention in the same run (absolute numbers vary between machines).
#include <algorithm>
#include <chrono>
#include <cstdio>
#include <filesystem>
#include <fstream>
#include <iomanip>
#include <limits>
#include <iostream>
#include <nlohmann/json.hpp>
#include <random>
#include <sstream>
#include <unistd.h>

#include <torch/cuda.h>

#include "harness/model/architecture.h"
#include "harness/common/atomic_file.h"
#include "harness/common/config_reader.h"
#include "harness/runtime/attention.h"
#include "harness/cli/commands.h"
#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/output_paths.h"
#include "harness/common/text.h"
#include "harness/runtime/scorer.h"
#include "harness/eval/evaluator.h"
#include "harness/model/threads.h"
#include "harness/runtime/roofline.h"
#include "policies/registry.h"

namespace kvevict {
namespace {

using Clock = std::chrono::steady_clock;

std::vector<int> random_tokens(int n, int vocab, uint64_t seed) {
  std::mt19937_64 rng(seed);
  std::uniform_int_distribution<int> pick(3, vocab - 1);
  std::vector<int> ids(n);
  for (auto& id : ids) id = pick(rng);
  return ids;
}

struct StepTime {
  double total = 1e30;      // seconds per decode step
  double attention = 1e30;  // of which inside attention (scores, softmax, values, eviction)
  int64_t held_bytes = 0;   // K/V memory the cache held at the end
  int64_t cached_tokens = 0;
  int64_t slot_bytes = 0;       // the fp16 bytes of the rows the cache holds (KvStats::peak_bytes)
  double dmc_merge_rate = -1;   // a DMC model: merge decisions, mean over layers and KV heads
};

// Per decode step after a prefill of `prefill` tokens (compressed to the policy's
// budget), averaged over `steps` steps; the best of `repeat` runs.
StepTime decode_step_time(const Model& model, const Policy& policy, const std::vector<int>& tokens,
                          int prefill, int steps, int repeat) {
  StepTime best;
  for (int r = 0; r < std::max(1, repeat); ++r) {
    CacheAttention cache(model, policy, shape_for(model, prefill, prefill));
    model.forward(std::vector<int>(tokens.begin(), tokens.begin() + prefill), 0, cache);
    const double attention_before = cache.attention_seconds();
    auto t0 = Clock::now();
    for (int s = 0; s < steps; ++s) model.forward({tokens[prefill + s]}, prefill + s, cache);
    best.total = std::min(best.total, seconds_since(t0) / steps);
    best.attention = std::min(best.attention, (cache.attention_seconds() - attention_before) / steps);
    best.held_bytes = cache.held_bytes();
    best.cached_tokens = cache.cached_tokens(0);
    best.slot_bytes = cache.stats().peak_bytes;
    const auto& rates = cache.stats().dmc_merge_rate;
    if (!rates.empty()) {
      best.dmc_merge_rate = 0;
      for (double rate : rates) best.dmc_merge_rate += rate / rates.size();
    }
  }
  return best;
}

// Full attention that adds up the time spent inside it: the forward line shows how much
// of the forward is attention (scores, softmax, values) rather than the projections.
class TimedFullAttention : public FullAttention {
 public:
  torch::Tensor attend(int layer, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       int64_t start) override {
    const auto t0 = Clock::now();
    auto out = FullAttention::attend(layer, q, k, v, start);
    seconds += seconds_since(t0);
    return out;
  }
  double seconds = 0;
};

std::string percent(double fraction) {
  std::ostringstream out;
  out << std::fixed << std::setprecision(1) << 100 * fraction << "%";
  return out.str();
}

double mib(double bytes) { return bytes / (1 << 20); }

// The roofline: the machine's GEMM peak (each dtype) and read bandwidth (each thread
// count), then the forward, decode, sim-mode and memory phases as fractions of them.
int bench_policies(const BenchArgs& args, const ConfigObject& config) {
  constexpr long long kMost = std::numeric_limits<int>::max();
  const std::string model_dir = args.model_given ? args.model : config.text("model", args.model);
  const int T = config.integer("tokens", 1024, 1, kMost);
  const int steps = config.integer("decode_steps", 32, 1, kMost);
  const int repeat = config.integer("repeat", args.repeat, 1, kMost);
  const double budget = config.number("budget", 0.2, 0, 1);
  if (!config.has("sim_policies") || !config.has("decode_policy"))
    throw Error(args.config + ": a policy benchmark needs \"sim_policies\" and \"decode_policy\"");
  const auto policies = config.texts("sim_policies", {});
  const std::string decode_policy = config.text("decode_policy", "");
  const auto dtypes = config.texts("dtypes", {args.runtime.options.dtype});
  if (dtypes.empty()) throw Error(config.name("dtypes") + " is empty");
  auto decode_threads = config.integers("decode_threads", {}, 1, kMost);
  const int memory_tokens = config.integer("memory_tokens", 0, 0, kMost);
  const double bandwidth_mib = config.number("bandwidth_MiB", 1024, 1, 1 << 20);
  const int decode_prefill = config.integer("decode_prefill", 16, 1, kMost);
  const int decode_rounds = config.integer("decode_rounds", 5, 1, kMost);
  const int decode_T = config.integer("decode_tokens", T, 1, kMost);
  const auto kv_bits = config.integers("decode_kv_bits", {}, 2, 4);  // KIVI phases: bits each
  const int threads = set_thread_count(args.runtime.options.threads);
  if (decode_threads.empty()) decode_threads.push_back(threads);

  std::cout << std::fixed << std::setprecision(4);
  std::cout << "threads " << threads << " (physical cores " << physical_core_count() << ") load_average "
            << load_average() << std::endl;
  ModelOptions fp32_options = args.runtime.options;
  fp32_options.dtype = dtypes.front();
  auto t0 = Clock::now();
  auto model = Model::load(model_dir, fp32_options);
  const double load = seconds_since(t0);
  use_threads_for(*model, threads);
  const ArchSpec& arch = model->arch();
  std::cout << "model " << model_dir << " (" << arch.model_type << ", " << arch.n_layers << " layers, hidden "
            << arch.hidden << ", " << arch.n_heads << " heads) " << dtypes.front() << " load_seconds " << load << std::endl;
  PolicyOptions none;
  auto full = make_policy(reference_policy_name(), none);
  auto policy_with_budget = [&](const std::string& name) {
    PolicyOptions o;
    o.budget.ratio = budget;  // the paper's split policies read it as heavy = recent = budget / 2
    return make_policy(name, o);
  };

  // Memory first, before other phases leave freed blocks in the allocator's caches.
  if (memory_tokens > 0) {
    auto seq = random_tokens(memory_tokens, static_cast<int>(arch.vocab), 3);
    auto policy = policy_with_budget(decode_policy);
    reset_peak_rss();
    const double s = best_seconds(1, [&] { score_sequence(*model, *policy, Mode::Sim, seq); });
    std::cout << "memory sim_forward " << decode_policy << " budget " << budget << " T=" << memory_tokens
              << " seconds " << s << " peak_rss_MiB " << mib(peak_rss_bytes()) << " weights_MiB "
              << mib(decode_weight_bytes(arch, model->dtype())) << " load_average " << load_average() << std::endl;
  }

  // Roofline limits.
  const double bandwidth_bytes = bandwidth_mib * double(1 << 20);
  auto probe = std::make_unique<BandwidthProbe>(static_cast<int64_t>(bandwidth_bytes));
  for (int n : decode_threads) {
    set_thread_count(n);
    const ReadBandwidth read = probe->measure(std::max(10, repeat + 4));
    std::cout << "roofline read_bandwidth threads " << n << " (reading: " << read.threads << ") GB_per_s "
              << read.bytes_per_s / 1e9 << " load_average " << load_average() << std::endl;
  }
  set_thread_count(threads);

  // Forward and decode per dtype, against that dtype's GEMM peak and the bandwidth.
  for (size_t i = 0; i < dtypes.size(); ++i) {
    std::unique_ptr<Model> other;
    if (i > 0) {
      ModelOptions o = args.runtime.options;
      o.dtype = dtypes[i];
      other = Model::load(model_dir, o);
    }
    const Model& m = i == 0 ? *model : *other;
    const auto peak = measure_gemm_peak(arch, m.dtype(), T, repeat + 1);
    std::cout << "roofline gemm " << dtypes[i] << " rows " << T << " GFLOP_per_s model_mix "
              << peak.mix_flops_per_s / 1e9 << " best_shape " << peak.best_flops_per_s / 1e9 << " " << peak.best_shape
              << " load_average " << load_average() << std::endl;
    auto seq = random_tokens(T, static_cast<int>(arch.vocab), 7);
    double attention_seconds = 1e30;
    const double fwd = best_seconds(repeat, [&] {
      TimedFullAttention attention;
      m.forward(seq, 0, attention);
      attention_seconds = std::min(attention_seconds, attention.seconds);
    });
    const double flops = forward_flops(arch, T) / fwd;
    std::cout << "forward " << dtypes[i] << " T=" << T << " seconds " << fwd << " GFLOP "
              << forward_flops(arch, T) / 1e9 << " GFLOP_per_s " << flops / 1e9 << " of_gemm_peak "
              << percent(flops / peak.best_flops_per_s) << " of_model_mix " << percent(flops / peak.mix_flops_per_s)
              << " attention_seconds " << attention_seconds << " load_average " << load_average() << std::endl;
    auto decode_tokens = random_tokens(decode_prefill + steps, static_cast<int>(arch.vocab), 5);
    // The weights alone through the same kernel: what the step would take with no other work.
    const WeightPass weight_pass(arch, m.dtype());
    const double weight_bytes = decode_weight_bytes(arch, m.dtype());
    // Per step: every weight once, plus the cache (about prefill + steps/2 rows).
    const double bytes = weight_bytes + kv_bytes_per_token(arch, m.dtype()) * (decode_prefill + steps / 2.0);
    for (int n : decode_threads) {
      set_thread_count(n);
      // Rounds of the read probe, then the decode steps and the weight pass right after
      // it: a shared VM's read bandwidth drifts by tens of percent between minutes, so
      // each round is a share of its own probe, and the line is the median round.
      struct Round {
        double probe, step, attention, pass;
      };
      std::vector<Round> rounds;
      for (int r = 0; r < decode_rounds; ++r) {
        const double read = probe->measure(4).bytes_per_s;
        const StepTime step = decode_step_time(m, *full, decode_tokens, decode_prefill, steps, 1);
        rounds.push_back({read, step.total, step.attention, weight_pass.seconds(1)});
      }
      std::sort(rounds.begin(), rounds.end(), [&](const Round& a, const Round& b) {
        return bytes / a.step / a.probe < bytes / b.step / b.probe;
      });
      const Round& median = rounds[rounds.size() / 2];
      std::cout << "decode " << dtypes[i] << " threads " << n << " tokens_per_s " << 1 / median.step
                << " MB_per_token " << bytes / 1e6 << " GB_per_s " << bytes / median.step / 1e9 << " of_bandwidth "
                << percent(bytes / median.step / median.probe) << " probe_GB_per_s " << median.probe / 1e9
                << " step_ms " << median.step * 1e3 << " attention_ms " << median.attention * 1e3 << " weight_pass_ms "
                << median.pass * 1e3 << " weight_pass_of_bandwidth " << percent(weight_bytes / median.pass / median.probe)
                << " rounds " << rounds.size() << " of_bandwidth_range " << percent(bytes / rounds.front().step / rounds.front().probe)
                << "-" << percent(bytes / rounds.back().step / rounds.back().probe)
                << " load_average " << load_average() << std::endl;
    }
    set_thread_count(threads);
  }

  probe.reset();  // its buffer is not part of the phases below

  // Sim-mode policies as a ratio to the full forward, in float32.
  std::vector<int> seq;
  {
    auto tokens = random_tokens(T, static_cast<int>(arch.vocab), 1);
    seq.assign(tokens.begin(), tokens.end());
  }
  // The full forward and the policies take turns, `repeat` rounds, each keeping its best:
  // a slow stretch of a shared machine then falls on all of them, not on whichever ran in it.
  std::vector<std::unique_ptr<Policy>> sim_policies;
  for (const auto& name : policies) sim_policies.push_back(policy_with_budget(name));
  std::vector<const Policy*> sim_runs = {full.get()};
  for (const auto& policy : sim_policies) sim_runs.push_back(policy.get());
  std::vector<double> sim_seconds(sim_runs.size(), 1e30);
  for (int round = 0; round < std::max(1, repeat); ++round)
    for (size_t i = 0; i < sim_runs.size(); ++i)
      sim_seconds[i] = std::min(sim_seconds[i], best_seconds(1, [&] { score_sequence(*model, *sim_runs[i], Mode::Sim, seq); }));
  const double full_sim = sim_seconds[0];
  std::cout << "sim_forward full T=" << T << " seconds " << full_sim << " tokens_per_s " << T / full_sim
            << " load_average " << load_average() << std::endl;
  for (size_t i = 1; i < sim_runs.size(); ++i)
    std::cout << "sim_forward " << policies[i - 1] << " budget " << budget << " seconds " << sim_seconds[i]
              << " ratio_to_full " << sim_seconds[i] / full_sim << " load_average " << load_average() << std::endl;

  // Decode steps after a long prefill: the attention part under eviction vs the full cache.
  auto evicting = policy_with_budget(decode_policy);
  auto decode_tokens = random_tokens(decode_T + steps, static_cast<int>(arch.vocab), 2);
  const StepTime full_step = decode_step_time(*model, *full, decode_tokens, decode_T, steps, repeat);
  const StepTime evict_step = decode_step_time(*model, *evicting, decode_tokens, decode_T, steps, repeat);
  const double full_kv = kv_bytes_per_token(arch, model->dtype()) * (decode_T + steps);
  std::cout << "decode_step full cache=" << decode_T << " ms " << full_step.total * 1e3 << " tokens_per_s "
            << 1 / full_step.total << " attention_ms " << full_step.attention * 1e3 << " kv_MiB " << mib(full_kv)
            << " kv_fp16_held_MiB " << mib(full_step.slot_bytes);
  if (arch.dmc.enabled())  // DMC's slots: the model merges, the full policy keeps every slot
    std::cout << " dmc_merge_rate " << full_step.dmc_merge_rate << " kv_fp16_held_of_fp16_full "
              << percent(full_step.slot_bytes / (static_cast<double>(full_precision_bytes(decode_T + steps, arch.head_dim)) *
                                                 arch.n_kv_heads * arch.n_layers));
  std::cout << std::endl;
  std::cout << "decode_step " << decode_policy << " budget " << budget << " ms " << evict_step.total * 1e3
            << " ratio_to_full " << evict_step.total / full_step.total << " attention_ms "
            << evict_step.attention * 1e3 << " attention_ratio_to_full " << evict_step.attention / full_step.attention
            << " kv_held_MiB " << mib(evict_step.held_bytes) << " kv_held_of_full "
            << percent(evict_step.held_bytes / full_kv) << " load_average " << load_average() << std::endl;
  // Decode with a KIVI-quantized cache (the full policy): the attention part, which now
  // dequantizes what each step reads, and the bytes the packed cache holds vs fp16.
  for (int bits : kv_bits) {
    PolicyOptions o;
    o.kv_quant.bits = bits;
    auto quantized = make_policy(reference_policy_name(), o);
    const StepTime step = decode_step_time(*model, *quantized, decode_tokens, decode_T, steps, repeat);
    const double fp16_kv = static_cast<double>(full_precision_bytes(step.cached_tokens, arch.head_dim)) *
                           arch.n_kv_heads * arch.n_layers;
    std::cout << "decode_step kivi bits " << bits << " G " << o.kv_quant.group << " R " << o.kv_quant.residual
              << " cache=" << decode_T << " ms " << step.total * 1e3 << " ratio_to_full " << step.total / full_step.total
              << " attention_ms " << step.attention * 1e3 << " attention_ratio_to_full "
              << step.attention / full_step.attention << " kv_held_MiB " << mib(step.held_bytes) << " fp16_kv_MiB "
              << mib(fp16_kv) << " kv_held_of_fp16 " << percent(step.held_bytes / fp16_kv) << " load_average "
              << load_average() << std::endl;
  }
  std::cout << "peak_rss_MiB " << mib(peak_rss_bytes()) << " (since the memory phase)\n";
  return 0;
}

// Encode speed of several tokenizers on the same texts, in one run: the first pass with
// an empty word cache ("cold") and the best later pass ("warm").
int bench_tokenizers(const BenchArgs& args, const ConfigObject& config, const std::string& data_override) {
  if (!config.has("jsonl")) throw Error(config.name("jsonl") + " is required");
  const std::string file = data_path(config.text("jsonl", ""), data_override);
  const std::string field = config.text("field", "text");
  const size_t limit = static_cast<size_t>(config.integer("limit", 1000, 1, std::numeric_limits<int>::max()));
  std::vector<std::string> texts;
  size_t bytes = 0;
  std::ifstream in(file);
  if (!in) throw Error(file + ": cannot open");
  for (std::string line; texts.size() < limit && std::getline(in, line);) {
    if (line.empty()) continue;
    texts.push_back(parse_json(line, file).at(field).get<std::string>());
    bytes += texts.back().size();
  }
  std::cout << std::fixed << std::setprecision(3) << "texts " << texts.size() << " bytes " << bytes << " from "
            << file << "\n";
  const nlohmann::json& tokenizers = config.raw("tokenizers");
  if (!tokenizers.is_object()) throw Error(config.name("tokenizers") + " must be an object of name -> tokenizer folder");
  for (const auto& [name, dir] : tokenizers.items()) {
    if (!dir.is_string()) throw Error(config.name("tokenizers") + ": \"" + name + "\" must be a folder name");
    auto tokenizer = load_tokenizer_for_model(data_path(dir.get<std::string>(), data_override));
    if (!tokenizer) throw Error(dir.get<std::string>() + ": no tokenizer files");
    size_t ids = 0;
    const auto encode_all = [&] {
      ids = 0;
      for (const auto& text : texts) ids += tokenizer->encode(text).size();
    };
    const double cold = best_seconds(1, encode_all);
    const double warm = best_seconds(args.repeat, encode_all);
    std::cout << "tokenizer " << name << " ids " << ids << " cold_seconds " << cold << " cold_MB_per_s "
              << bytes / cold / 1e6 << " cold_texts_per_s " << texts.size() / cold << " warm_MB_per_s "
              << bytes / warm / 1e6 << " warm_texts_per_s " << texts.size() / warm << "\n";
  }
  return 0;
}

// A model folder as given (relative to the working directory) or, when no such folder
// exists, in the data folder; its ops on `threads` threads.
std::unique_ptr<Model> load_model_at(const std::string& dir, const std::string& data_override,
                                     const ModelOptions& options, int threads) {
  auto model = Model::load(std::filesystem::exists(dir) ? dir : data_path(dir, data_override), options);
  use_threads_for(*model, threads);
  return model;
}

// Batched decode and evaluation (issue 31), each as a ratio to batch 1 in the same run:
// decode tokens/s at each batch size with the share of the step spent in attention (the
// policy's bookkeeping included), generation end to end, multiple choice, and the peak
// resident memory of a batch against the KV bytes it holds.
int bench_batch(const BenchArgs& args, const ConfigObject& config, const std::string& data_override) {
  constexpr long long kMost = std::numeric_limits<int>::max();
  const std::string model_dir = args.model_given ? args.model : config.text("model", args.model);
  const auto batch_sizes = config.integers("batch_sizes", {1, 2, 4, 8, 16, 32}, 1, 4096);
  const auto dtypes = config.texts("dtypes", {args.runtime.options.dtype});
  const int prefill = config.integer("decode_prefill", 32, 1, kMost);
  const int steps = config.integer("decode_steps", 16, 1, kMost);
  const int repeat = config.integer("repeat", args.repeat, 1, kMost);
  const std::string profile_policy = config.text("profile_policy", default_eviction_policy_name());
  const double budget = config.number("budget", 0.5, 0, 1);
  const int compare_batch = args.batch_size > 0 ? args.batch_size : config.integer("compare_batch", 8, 1, 4096);
  const int generation_limit = config.integer("generation_limit", 32, 0, kMost);
  const std::string generation_task = config.text("generation_task", "xsum");
  // Tasks need a tokenizer that covers the vocabulary: a random model made with
  // --tokenizer-from stories260K has --vocab 512.
  const std::string generation_model = config.text("generation_model", model_dir);
  const int generation_max_length = config.integer("generation_max_length", 1024, 2, kMost);
  const std::string mc_task = config.text("mc_task", "piqa");
  const int mc_limit = config.integer("mc_limit", 0, 0, kMost);
  const auto mc_models = config.texts("mc_models", {});
  const int memory_context = config.integer("memory_context", 0, 0, kMost);
  const int threads = set_thread_count(args.runtime.options.threads);
  std::cout << std::fixed << std::setprecision(4);
  std::cout << "threads " << threads << " (physical cores " << physical_core_count() << ") load_average "
            << load_average() << std::endl;
  PolicyOptions none;
  auto full = make_policy(reference_policy_name(), none);
  PolicyOptions with_budget;
  with_budget.budget.ratio = budget;
  auto profiled = make_policy(profile_policy, with_budget);

  // B sequences with their own caches, prefilled, then `steps` steps of B decode rows in
  // one forward_batch; the best of `repeat` runs.
  struct BatchStep {
    double seconds = 1e30, attention = 1e30;  // per step
    int64_t held_bytes = 0;
  };
  auto batch_step = [&](const Model& m, const Policy& policy, int B) {
    BatchStep best;
    const int vocab = static_cast<int>(m.arch().vocab);
    for (int r = 0; r < repeat; ++r) {
      std::vector<std::unique_ptr<CacheAttention>> caches;
      std::vector<std::vector<int>> tokens;
      for (int b = 0; b < B; ++b) {
        tokens.push_back(random_tokens(prefill + steps, vocab, 100 + b));
        caches.push_back(std::make_unique<CacheAttention>(m, policy, shape_for(m, prefill, prefill)));
        m.forward(std::vector<int>(tokens[b].begin(), tokens[b].begin() + prefill), 0, *caches[b]);
      }
      double attention_before = 0;
      for (auto& c : caches) attention_before += c->attention_seconds();
      const auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) {
        std::vector<BatchSegment> segments;
        for (int b = 0; b < B; ++b) segments.push_back({{tokens[b][prefill + s]}, prefill + s, caches[b].get()});
        m.forward_batch(segments);
      }
      const double seconds = seconds_since(t0) / steps;
      double attention = -attention_before;
      int64_t held = 0;
      for (auto& c : caches) {
        attention += c->attention_seconds();
        held += c->held_bytes();
      }
      if (seconds < best.seconds) best = {seconds, attention / steps, held};
    }
    return best;
  };

  for (const std::string& dtype : dtypes) {
    ModelOptions options = args.runtime.options;
    options.dtype = dtype;
    auto model = load_model_at(model_dir, data_override, options, threads);
    const ArchSpec& arch = model->arch();
    std::cout << "model " << model_dir << " (" << arch.n_layers << " layers, hidden " << arch.hidden << ") " << dtype
              << " default_batch_size " << default_batch_size(*model) << std::endl;
    const WeightPass weight_pass(arch, model->dtype());
    std::cout << "weight_pass " << dtype << " ms " << weight_pass.seconds(repeat) * 1e3 << " MB "
              << decode_weight_bytes(arch, model->dtype()) / 1e6 << std::endl;
    double one = 0;
    for (int B : batch_sizes) {
      const BatchStep step = batch_step(*model, *full, B);
      const double tokens_per_s = B / step.seconds;
      if (B == 1) one = tokens_per_s;
      // The step's parts: the weight pass of B rows alone (WeightPass), and attention. A
      // batch's sequences attend in parallel (Model::attention_block), so the sum of
      // their attention times is spread over min(B, threads) threads of the step.
      const double pass = weight_pass.seconds(repeat, B);
      const double attention_wall = step.attention / std::min(B, threads);
      std::cout << "batch_decode " << dtype << " full B " << B << " tokens_per_s " << tokens_per_s << " ratio_to_B1 "
                << (one > 0 ? tokens_per_s / one : 0) << " step_ms " << step.seconds * 1e3 << " weight_pass_ms "
                << pass * 1e3 << " attention_summed_ms " << step.attention * 1e3 << " attention_ms "
                << attention_wall * 1e3 << " rest_ms " << (step.seconds - attention_wall - pass) * 1e3
                << " load_average " << load_average() << std::endl;
    }
    // The profile of a batch of compare_batch steps under an evicting policy: its
    // attention share includes the policy's scores and evictions.
    const BatchStep evicting = batch_step(*model, *profiled, compare_batch);
    const BatchStep plain = batch_step(*model, *full, compare_batch);
    const int spread = std::min(compare_batch, threads);
    std::cout << "batch_decode_profile " << dtype << " B " << compare_batch << " full step_ms " << plain.seconds * 1e3
              << " attention " << percent(plain.attention / spread / plain.seconds) << " | " << profile_policy
              << " budget " << budget << " step_ms " << evicting.seconds * 1e3 << " attention_and_policy "
              << percent(evicting.attention / spread / evicting.seconds) << " policy_over_full_ms "
              << (evicting.attention - plain.attention) / spread * 1e3 << std::endl;
  }

  // Whole evaluations at batch 1 and compare_batch: seconds, documents/s, and whether
  // every output is the same.
  auto eval_pair = [&](const Model& model, const std::string& task, int limit, int max_length, Mode mode,
                       const std::string& label) {
    EvalConfig config;
    config.task = task;
    config.task_options.data_dir = data_dir(data_override);
    config.task_options.limit = limit > 0 ? limit : -1;
    config.max_length = max_length;
    config.mode = mode;
    config.compare_with_full = false;
    std::vector<EvalResult> results;
    for (int B : {1, compare_batch}) {
      config.batch_size = B;
      results.push_back(evaluate(model, config));
    }
    bool same = results[0].docs.size() == results[1].docs.size();
    for (size_t d = 0; same && d < results[0].docs.size(); ++d)
      same = results[0].docs[d].generated == results[1].docs[d].generated &&
             results[0].docs[d].choice_scores == results[1].docs[d].choice_scores;
    const double n = results[0].n;
    std::cout << label << " " << task << " docs " << results[0].n << " B1_seconds " << results[0].seconds
              << " B1_docs_per_s " << n / results[0].seconds << " B" << compare_batch << "_seconds " << results[1].seconds
              << " B" << compare_batch << "_docs_per_s " << n / results[1].seconds << " ratio "
              << results[0].seconds / results[1].seconds << " identical " << (same ? "yes" : "NO")
              << " load_average " << load_average() << std::endl;
  };
  if (generation_limit > 0) {
    auto model = load_model_at(generation_model, data_override, args.runtime.options, threads);
    eval_pair(*model, generation_task, generation_limit, generation_max_length, Mode::Decode, "batch_generation");
  }
  for (const std::string& dir : mc_models) {
    auto model = load_model_at(dir, data_override, args.runtime.options, threads);
    eval_pair(*model, mc_task, mc_limit, 1024, Mode::Sim, "batch_mc " + dir + " sim");
    eval_pair(*model, mc_task, mc_limit, 1024, Mode::Decode, "batch_mc " + dir + " decode");
  }

  // Peak resident memory: the process after loading, then compare_batch sequences of
  // memory_context tokens each in their own full caches.
  if (memory_context > 0) {
    auto model = load_model_at(generation_model, data_override, args.runtime.options, threads);  // generate_batch decodes its text
    const int vocab = static_cast<int>(model->arch().vocab);
    std::vector<GenerateOptions> options(compare_batch);
    std::vector<std::vector<int>> prompts;
    for (int b = 0; b < compare_batch; ++b) {
      prompts.push_back(random_tokens(memory_context, vocab, 300 + b));
      options[b].max_new_tokens = 8;
    }
    reset_peak_rss();
    const int64_t before = peak_rss_bytes();
    int64_t kv = 0;
    for (const Generation& g : generate_batch(*model, *full, prompts, options, compare_batch)) kv += g.kv.peak_bytes;
    const int64_t peak = peak_rss_bytes();
    std::cout << "batch_memory B " << compare_batch << " context " << memory_context << " rss_before_MiB "
              << mib(before) << " peak_rss_MiB " << mib(peak) << " growth_MiB " << mib(peak - before)
              << " kv_peak_MiB (fp16 count) " << mib(kv) << " kv_" << args.runtime.options.dtype << "_MiB "
              << mib(kv * (model->dtype() == torch::kBFloat16 ? 1 : 2)) << " overhead_MiB "
              << mib(peak - before - kv * (model->dtype() == torch::kBFloat16 ? 1 : 2)) << std::endl;
  }
  return 0;
}

// Shared-context reuse for multiple choice (issue 31): whole decode-mode evaluations with
// reuse off and on, alternating, in one run: seconds, documents/s, the ratio, and whether
// every prediction and score is the same (the full cache's cut block: the largest change).
int bench_context_reuse(const BenchArgs& args, const ConfigObject& config, const std::string& data_override) {
  constexpr long long kMost = std::numeric_limits<int>::max();
  const std::string model_dir = args.model_given ? args.model : config.text("model", args.model);
  const auto tasks = config.texts("reuse_tasks", {"piqa", "copa"});
  const auto policies = config.texts("policies", {reference_policy_name(), default_eviction_policy_name()});
  const int budget_tokens = config.integer("budget_tokens", 16, 1, kMost);
  const int limit = config.integer("limit", 0, 0, kMost);
  const int repeat = config.integer("repeat", args.repeat, 1, kMost);
  const int batch = args.batch_size > 0 ? args.batch_size : config.integer("batch_size", 1, 1, 4096);
  const int threads = set_thread_count(args.runtime.options.threads);
  auto model = load_model_at(model_dir, data_override, args.runtime.options, threads);
  std::cout << std::fixed << std::setprecision(4);
  std::cout << "context_reuse model " << model_dir << " threads " << threads << " batch " << batch << " load_average "
            << load_average() << std::endl;
  for (const std::string& task : tasks)
    for (const std::string& policy : policies) {
      EvalConfig eval;
      eval.task = task;
      eval.task_options.data_dir = data_dir(data_override);
      eval.task_options.limit = limit > 0 ? limit : -1;
      eval.policy = policy;
      if (policy != reference_policy_name()) eval.policy_options.budget.tokens = budget_tokens;
      eval.mode = Mode::Decode;
      eval.compare_with_full = false;
      eval.batch_size = batch;
      // The best of `repeat` runs each, off and on alternating, so a load change hits both.
      double best[2] = {1e30, 1e30};
      EvalResult results[2];
      for (int r = 0; r < repeat; ++r)
        for (int on = 0; on < 2; ++on) {
          eval.context_reuse = on == 1;
          results[on] = evaluate(*model, eval);
          best[on] = std::min(best[on], results[on].seconds);
        }
      bool same_predictions = results[0].docs.size() == results[1].docs.size();
      double largest_change = 0;
      for (size_t d = 0; same_predictions && d < results[0].docs.size(); ++d) {
        same_predictions = results[0].docs[d].prediction.predicted == results[1].docs[d].prediction.predicted;
        const auto& a = results[0].docs[d].choice_scores, & b = results[1].docs[d].choice_scores;
        for (size_t c = 0; c < a.size() && c < b.size(); ++c) largest_change = std::max(largest_change, std::abs(a[c] - b[c]));
      }
      const double n = results[0].n;
      std::cout << "context_reuse " << task << " " << policy
                << (policy != reference_policy_name() ? " budget_tokens " + std::to_string(budget_tokens) : "")
                << " docs " << results[0].n << " off_seconds " << best[0] << " off_docs_per_s " << n / best[0]
                << " on_seconds " << best[1] << " on_docs_per_s " << n / best[1] << " ratio " << best[0] / best[1]
                << " same_predictions " << (same_predictions ? "yes" : "NO") << " largest_score_change "
                << std::setprecision(3) << std::scientific << largest_change << std::fixed << std::setprecision(4)
                << " load_average " << load_average() << std::endl;
    }
  return 0;
}

// bench/peer.py's rows (issue 41: kvevict against llama.cpp on the same weights): each
// row one run, printed as "peer_row KIND key value ..." for the script, which alternates
// them with llama.cpp's runs and keeps the best. A "limits" row measures the machine
// (read bandwidth, FMA peak); a "decode_batch" row times `tokens` decode steps of B
// sequences, each in its own cache after its own `prompt` random tokens (as
// llama-batched-bench does), full or under `policy` at `budget` (the prompt compressed
// after its prefill, then eviction at every step); a "prefill" row times one forward of
// `prefill` random tokens into a cache under `policy` at `budget` for an evicting one, by `protocol`:
// prefill-compress (full attention, then compressed) or stream (evicting from the first token).
const std::vector<std::string> kPeerRowKeys = {"limits", "bandwidth_MiB", "decode_batch", "prompt", "tokens",
                                               "prefill", "policy", "budget", "protocol"};

// The wall time a backend spends in attend(): the attention part of a pass, whatever the backend.
class TimedAttention : public AttentionBackend {
 public:
  explicit TimedAttention(AttentionBackend& inner) : inner_(inner) {}
  torch::Tensor attend(int layer, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       int64_t start) override {
    inner_.set_sliding_window(sliding_window());
    const auto t0 = Clock::now();
    torch::Tensor out = inner_.attend(layer, q, k, v, start);
    seconds_ += seconds_since(t0);
    return out;
  }
  double seconds() const { return seconds_; }

 private:
  AttentionBackend& inner_;
  double seconds_ = 0;
};

int bench_peer_rows(const BenchArgs& args, const ConfigObject& config) {
  constexpr long long kMost = std::numeric_limits<int>::max();
  const nlohmann::json& rows = config.raw("peer_rows");
  if (!rows.is_array() || rows.empty()) throw Error(config.name("peer_rows") + " must be a non-empty list of row objects");
  const int threads = set_thread_count(args.runtime.options.threads);
  std::unique_ptr<Model> model;  // loaded by the first row that needs it
  auto loaded = [&]() -> const Model& {
    if (!model) {
      const std::string dir = args.model_given ? args.model : config.text("model", "");
      if (dir.empty()) throw Error(config.name("model") + " is required by decode and prefill rows (or pass --model)");
      ModelOptions options = args.runtime.options;
      options.dtype = config.text("dtype", options.dtype);
      model = Model::load(dir, options);
      use_threads_for(*model, threads);
    }
    return *model;
  };
  // What the script needs for the roofline of a row: the bytes and FLOPs of a step.
  auto model_costs = [](const Model& m) {
    std::ostringstream out;
    out << std::setprecision(10) << " weight_bytes " << decode_weight_bytes(m.arch(), m.dtype()) << " kv_bytes_per_token "
        << kv_bytes_per_token(m.arch(), m.dtype()) << " linear_flops_per_token " << linear_flops_per_token(m.arch())
        << " attention_flops_per_pair " << attention_flops_per_pair(m.arch());
    return out.str();
  };
  std::cout << std::fixed << std::setprecision(4);
  for (size_t i = 0; i < rows.size(); ++i) {
    const ConfigObject row(rows[i], config.name("peer_rows") + " row " + std::to_string(i), kPeerRowKeys);
    const bool limits = row.flag("limits", false);
    const int kinds = limits + row.has("decode_batch") + row.has("prefill");
    if (kinds != 1)
      throw Error(config.name("peer_rows") + " row " + std::to_string(i) +
                  ": give exactly one of \"limits\": true, \"decode_batch\" and \"prefill\"");
    if (limits) {
      const auto bytes = static_cast<int64_t>(row.number("bandwidth_MiB", 512, 1, 1 << 20) * (1 << 20));
      const ReadBandwidth read = measure_read_bandwidth(bytes, 10);
      const FmaPeak fma = measure_fma_peak(5);
      std::cout << "peer_row limits threads " << threads << " read_GB_per_s " << read.bytes_per_s / 1e9
                << " read_threads " << read.threads << " fma_f32_GFLOP_per_s " << fma.f32_flops_per_s / 1e9
                << " fma_isa " << fma.f32_isa << " bf16_dot_GFLOP_per_s " << fma.bf16_dot_flops_per_s / 1e9
                << " fma_threads " << fma.threads << " load_average " << load_average() << std::endl;
    } else if (row.has("decode_batch")) {
      const int B = row.integer("decode_batch", 1, 1, 4096);
      const int prompt = row.integer("prompt", 32, 1, kMost);
      const int steps = row.integer("tokens", 64, 1, kMost);
      const std::string name = row.text("policy", reference_policy_name());
      if (row.has("protocol")) throw Error(row.name("protocol") + ": a decode row runs prefill-compress only");
      PolicyOptions options;
      if (name != reference_policy_name()) options.budget.ratio = row.number("budget", 0.2, 0, 1);
      const auto policy = make_policy(name, options);
      const Model& m = loaded();
      std::vector<std::unique_ptr<CacheAttention>> caches;
      std::vector<std::vector<int>> tokens;
      for (int b = 0; b < B; ++b) {
        tokens.push_back(random_tokens(prompt + steps, static_cast<int>(m.arch().vocab), 100 + b));
        caches.push_back(std::make_unique<CacheAttention>(m, *policy, shape_for(m, prompt + steps, prompt)));
        m.forward(std::vector<int>(tokens[b].begin(), tokens[b].begin() + prompt), 0, *caches[b]);
      }
      double attention_before = 0;
      for (auto& c : caches) attention_before += c->attention_seconds();
      const auto t0 = Clock::now();
      for (int s = 0; s < steps; ++s) {
        std::vector<BatchSegment> segments;
        for (int b = 0; b < B; ++b) segments.push_back({{tokens[b][prompt + s]}, prompt + s, caches[b].get()});
        m.forward_batch(segments);
      }
      const double seconds = seconds_since(t0);
      double attention = -attention_before;
      for (auto& c : caches) attention += c->attention_seconds();
      // The sequences attend in parallel, one on each thread: the summed attention time
      // spread over min(B, threads) is its share of the step's wall time.
      const double attention_wall = attention / std::min(B, threads) / steps;
      std::cout << "peer_row decode dtype " << config.text("dtype", args.runtime.options.dtype) << " B " << B
                << " prompt " << prompt << " tokens " << steps << " policy " << name << " kept_tokens "
                << caches[0]->cached_tokens(0) << " tokens_per_s " << B * steps / seconds << " step_ms "
                << seconds / steps * 1e3 << " attention_ms " << attention_wall * 1e3 << model_costs(m)
                << " load_average " << load_average() << std::endl;
    } else {
      const int T = row.integer("prefill", 512, 1, kMost);
      const std::string name = row.text("policy", reference_policy_name());
      const std::string protocol_text = row.text("protocol", protocol_name(Protocol::PrefillCompress));
      Protocol protocol;
      try {
        protocol = parse_protocol(protocol_text);
      } catch (const Error& e) {
        throw Error(row.name("protocol") + ": " + e.what());
      }
      PolicyOptions options;
      if (name != reference_policy_name()) options.budget.ratio = row.number("budget", 0.2, 0, 1);
      const auto policy = make_policy(name, options);
      const Model& m = loaded();
      const auto tokens = random_tokens(T, static_cast<int>(m.arch().vocab), 11);
      // A decode cache takes a block only up to the end of the prefill: streaming, it would
      // be T one-token steps. Sim mode runs the stream protocol in one teacher-forced pass,
      // as eval --mode sim does, and that pass is what is timed.
      std::unique_ptr<CacheAttention> cache;
      std::unique_ptr<SimAttention> sim;
      if (protocol == Protocol::Stream)
        sim = std::make_unique<SimAttention>(m, *policy, shape_for(m, T, 0));
      else
        cache = std::make_unique<CacheAttention>(m, *policy, shape_for(m, T, T));
      AttentionBackend& inner = cache ? static_cast<AttentionBackend&>(*cache) : *sim;
      TimedAttention timed(inner);
      const auto t0 = Clock::now();
      m.forward(tokens, 0, timed);
      const double seconds = seconds_since(t0);
      const KvStats* stats = sim ? &sim->stats() : nullptr;
      const int64_t kept = cache ? cache->cached_tokens(0) : stats->kept_per_layer.empty() ? T : stats->kept_per_layer[0];
      std::cout << "peer_row prefill dtype " << config.text("dtype", args.runtime.options.dtype) << " T " << T
                << " policy " << name << " protocol " << protocol_name(protocol) << " tokens_per_s " << T / seconds << " seconds " << seconds
                << " attention_seconds " << timed.seconds() << " kept_tokens " << kept
                << " flops " << std::setprecision(1) << forward_flops(m.arch(), T) << std::setprecision(4)
                << model_costs(m) << " load_average " << load_average() << std::endl;
    }
  }
  return 0;
}

// The keys of each kind of benchmark config; any other key is refused (a typo would
// otherwise silently bench the default).
const std::vector<std::string> kTokenizerBenchKeys = {"comment", "description", "jsonl", "field", "limit", "tokenizers"};
const std::vector<std::string> kPolicyBenchKeys = {
    "comment",        "description",   "model",       "tokens",        "decode_steps",   "repeat",
    "budget",         "sim_policies",  "decode_policy", "dtypes",      "decode_threads", "memory_tokens",
    "bandwidth_MiB",  "decode_prefill", "decode_rounds", "decode_tokens", "decode_kv_bits"};
const std::vector<std::string> kBatchBenchKeys = {
    "comment", "description", "model", "batch_sizes", "dtypes", "decode_prefill", "decode_steps", "repeat",
    "profile_policy", "budget", "compare_batch", "generation_task", "generation_model", "generation_limit", "generation_max_length",
    "mc_task", "mc_limit", "mc_models", "memory_context"};
const std::vector<std::string> kPeerBenchKeys = {"comment", "description", "model", "dtype", "peer_rows"};
const std::vector<std::string> kContextReuseBenchKeys = {"comment", "description", "model", "reuse_tasks", "policies",
                                                         "budget_tokens", "limit", "repeat", "batch_size"};

}  // namespace

namespace {

// The config.json of a random-weight LLaMA (or Qwen3) of this shape.
nlohmann::json random_model_config(const RandomModelArgs& a) {
  const bool qwen3 = a.arch == "qwen3";
  const int64_t D = a.hidden, hd = a.head_dim > 0 ? a.head_dim : a.hidden / a.heads, I = a.intermediate;
  return {{"architectures", {qwen3 ? "Qwen3ForCausalLM" : "LlamaForCausalLM"}},
          {"model_type", a.arch}, {"head_dim", hd},
          {"hidden_size", D}, {"intermediate_size", I}, {"num_hidden_layers", a.layers},
          {"num_attention_heads", a.heads}, {"num_key_value_heads", a.kv_heads},
          {"vocab_size", a.vocab}, {"max_position_embeddings", a.max_positions},
          {"rms_norm_eps", 1e-5}, {"rope_theta", 10000.0}, {"tie_word_embeddings", false},
          {"bos_token_id", 1}, {"eos_token_id", 2}, {"torch_dtype", "float32"},
          {"kvevict_note", "random weights: for speed and memory only, never for accuracy"}};
}

// A model shape drawn at random where the model runs (ModelOptions::random_weights_seed):
// prefill and decode tokens/s at each context length, under the full cache and each
// policy (prefill-compress: the prompt compressed to the budget, then decode steps), for
// shapes too large to write as a file (an 8B model on a GPU: configs/bench_gpu_8b.json).
const std::vector<std::string> kRandomModelBenchKeys = {"comment", "description", "random_model", "dtypes", "contexts",
                                                        "decode_steps", "policies", "budget", "repeat"};
const std::vector<std::string> kRandomModelShapeKeys = {"layers", "hidden", "heads", "kv_heads", "intermediate",
                                                        "vocab", "max_positions", "head_dim"};

int bench_random_model(const BenchArgs& args, const ConfigObject& config) {
  namespace fs = std::filesystem;
  const ConfigObject shape(config.raw("random_model"), config.name("random_model"), kRandomModelShapeKeys,
                           "random_model.");
  RandomModelArgs a;
  a.layers = shape.integer("layers", a.layers, 1, kMaxLayers);
  a.hidden = shape.integer("hidden", a.hidden, 1, kMaxHidden);
  a.heads = shape.integer("heads", a.heads, 1, kMaxHeads);
  a.kv_heads = shape.integer("kv_heads", a.kv_heads, 1, kMaxHeads);
  a.intermediate = shape.integer("intermediate", a.intermediate, 1, kMaxIntermediate);
  a.vocab = shape.integer("vocab", a.vocab, 1, kMaxVocab);
  a.max_positions = shape.integer("max_positions", a.max_positions, 1, kMaxPositions);
  a.head_dim = shape.integer("head_dim", 0, 0, kMaxHidden);
  if ((a.head_dim == 0 && a.hidden % a.heads != 0) || a.heads % a.kv_heads != 0)
    throw Error(config.name("random_model") + ": hidden must divide by heads (or give head_dim), heads by kv_heads");
  const std::vector<std::string> dtypes = config.texts("dtypes", {"float32"});
  const std::vector<int> contexts = config.integers("contexts", {256}, 2, kMaxPositions);
  const int steps = config.integer("decode_steps", 16, 1, kMaxPositions);
  const std::vector<std::string> policies = config.texts("policies", {reference_policy_name()});
  const double budget = config.number("budget", 0.2, 0, 1);
  const int repeat = config.integer("repeat", 1, 1, 1000);
  for (int context : contexts)
    if (context + steps > a.max_positions)
      throw Error(config.name("contexts") + ": " + std::to_string(context) + " + decode_steps " +
                  std::to_string(steps) + " exceeds random_model.max_positions " + std::to_string(a.max_positions));
  // Only config.json is written (the weights are drawn where the model runs), into a
  // temporary folder removed afterwards.
  const fs::path dir = fs::temp_directory_path() / ("kvevict_bench_model_" + std::to_string(::getpid()));
  struct RemoveAfter {
    fs::path dir;
    ~RemoveAfter() { remove_tree(dir.string()); }
  } remove_after{dir};
  fs::create_directories(dir);
  write_file_atomically((dir / "config.json").string(), random_model_config(a).dump(2) + "\n");

  const bool cuda = args.runtime.options.device.rfind("cuda", 0) == 0;
  auto wait = [&] {
    if (cuda) torch::cuda::synchronize();
  };
  std::cout << std::fixed << std::setprecision(1);
  std::cout << "random model: " << a.layers << " layers, hidden " << a.hidden << ", heads " << a.heads << "/"
            << a.kv_heads << ", intermediate " << a.intermediate << ", vocab " << a.vocab << ", device "
            << args.runtime.options.device << "\n";
  for (const std::string& dtype : dtypes) {
    ModelOptions options = args.runtime.options;
    options.dtype = dtype;
    options.random_weights_seed = 7;
    auto t0 = Clock::now();
    auto model = Model::load(dir.string(), options);
    wait();
    std::cout << dtype << " weights drawn in " << seconds_since(t0) << " s\n";
    use_threads_for(*model, options.threads);
    torch::NoGradGuard no_grad;
    for (int context : contexts) {
      const std::vector<int> tokens = random_tokens(context + steps, a.vocab, 11);
      for (const std::string& name : policies) {
        PolicyOptions policy_options;
        if (name != reference_policy_name()) policy_options.budget.ratio = budget;
        const auto policy = make_policy(name, policy_options);
        double prefill_s = 1e30, decode_s = 1e30;
        int64_t kept = 0;
        for (int r = 0; r < repeat; ++r) {
          CacheAttention cache(*model, *policy, shape_for(*model, context, context));
          auto started = Clock::now();
          model->forward(std::vector<int>(tokens.begin(), tokens.begin() + context), 0, cache);
          wait();
          prefill_s = std::min(prefill_s, seconds_since(started));
          started = Clock::now();
          for (int s = 0; s < steps; ++s) model->forward({tokens[context + s]}, context + s, cache);
          wait();
          decode_s = std::min(decode_s, seconds_since(started));
          kept = cache.cached_tokens(0);
        }
        std::cout << dtype << " context " << context << " policy " << name << " prefill_tokens_per_s "
                  << context / prefill_s << " decode_tokens_per_s " << steps / decode_s << " kept_tokens " << kept
                  << "\n";
      }
    }
  }
  return 0;
}

}  // namespace

int run_bench(const BenchArgs& args, const std::string& data_override) {
  // --batch-size sets the batch a batch benchmark compares with batch 1; elsewhere it
  // would be silently ignored.
  auto refuse_batch_size = [&](const std::string& what) {
    if (args.batch_size > 0)
      throw Error("bench: --batch-size applies to a batch benchmark config (a \"batch_sizes\" list, "
                  "configs/bench_batch.json), not to " + what);
  };
  if (!args.config.empty()) {
    const nlohmann::json config = read_json_file(args.config);
    if (!(config.is_object() && config.contains("batch_sizes"))) refuse_batch_size(args.config);
    if (config.is_object() && config.contains("tokenizers"))
      return bench_tokenizers(args, ConfigObject(config, args.config, kTokenizerBenchKeys), data_override);
    if (config.is_object() && config.contains("reuse_tasks"))
      return bench_context_reuse(args, ConfigObject(config, args.config, kContextReuseBenchKeys), data_override);
    if (config.is_object() && config.contains("peer_rows"))
      return bench_peer_rows(args, ConfigObject(config, args.config, kPeerBenchKeys));
    if (config.is_object() && config.contains("random_model"))
      return bench_random_model(args, ConfigObject(config, args.config, kRandomModelBenchKeys));
    if (config.is_object() && config.contains("batch_sizes"))
      return bench_batch(args, ConfigObject(config, args.config, kBatchBenchKeys), data_override);
    return bench_policies(args, ConfigObject(config, args.config, kPolicyBenchKeys));
  }
  refuse_batch_size("the generate benchmark (no --config)");
  auto t0 = Clock::now();
  auto model = Model::load(args.model, args.runtime.options);
  const double load = seconds_since(t0);
  use_threads_for(*model, args.runtime.options.threads);
  PolicyOptions none;
  auto full = make_policy(reference_policy_name(), none);
  const int vocab = static_cast<int>(model->arch().vocab);
  std::vector<int> prompt = {model->arch().bos_token_id >= 0 ? model->arch().bos_token_id : 0};
  GenerateOptions gen;
  gen.max_new_tokens = args.new_tokens;
  int generated = 0;
  const double gen_s = best_seconds(args.repeat, [&] {
    generated = static_cast<int>(generate(*model, *full, prompt, gen).tokens.size());
  });
  const int T = std::min<int>(args.tokens, static_cast<int>(model->arch().max_positions));
  auto seq = random_tokens(T, vocab, 7);
  const double fwd_s = best_seconds(args.repeat, [&] {
    FullAttention attention;
    model->forward(seq, 0, attention);
  });
  std::cout << std::fixed << std::setprecision(4);
  std::cout << "model " << args.model << "\n";
  std::cout << "load_seconds " << load << "\n";
  std::cout << "generate_tokens " << generated << " seconds " << gen_s << " tokens_per_s " << generated / gen_s << "\n";
  std::cout << "forward_tokens " << T << " seconds " << fwd_s << " tokens_per_s " << T / fwd_s << "\n";
  return 0;
}

// A random-weight LLaMA (or Qwen3: q/k norm, explicit head_dim) checkpoint in Hugging
// Face layout (config.json + model.safetensors, F32), for speed and memory measurements only.
int run_make_random_model(const RandomModelArgs& a) {
  namespace fs = std::filesystem;
  // Every size is checked before anything is computed, allocated or written.
  auto in_range = [](const char* flag, int64_t value, int64_t min, int64_t max) {
    if (value < min || value > max)
      throw Error(std::string("make-random-model: ") + flag + " " + std::to_string(value) + " is outside [" +
                  std::to_string(min) + ", " + std::to_string(max) + "]");
  };
  in_range("--layers", a.layers, 1, kMaxLayers);
  in_range("--hidden", a.hidden, 1, kMaxHidden);
  in_range("--heads", a.heads, 1, kMaxHeads);
  in_range("--kv-heads", a.kv_heads, 1, kMaxHeads);
  in_range("--intermediate", a.intermediate, 1, kMaxIntermediate);
  in_range("--vocab", a.vocab, 1, kMaxVocab);
  in_range("--max-positions", a.max_positions, 1, kMaxPositions);
  in_range("--head-dim", a.head_dim, 0, kMaxHidden);
  if ((a.head_dim == 0 && a.hidden % a.heads != 0) || a.heads % a.kv_heads != 0)
    throw Error("make-random-model: hidden must divide by heads (or pass --head-dim), heads by kv-heads");
  if ((a.head_dim > 0 ? a.head_dim : a.hidden / a.heads) % 2 != 0)
    throw Error("make-random-model: the head width (--hidden / --heads or --head-dim) must be even for RoPE");
  const std::vector<std::string> kTokenizerFiles = {"tokenizer.model", "tokenizer.json", "tokenizer_config.json",
                                                    "vocab.json", "merges.txt", "special_tokens_map.json"};
  std::vector<std::string> tokenizer_files;
  if (!a.tokenizer_from.empty()) {
    for (const auto& name : kTokenizerFiles)
      if (fs::is_regular_file(fs::path(a.tokenizer_from) / name)) tokenizer_files.push_back(name);
    if (tokenizer_files.empty())
      throw Error("make-random-model: --tokenizer-from " + a.tokenizer_from + " holds no tokenizer files");
  }
  // --out may be an existing model folder (made again), never a sweep folder or the
  // tokenizer's own folder.
  std::vector<std::string> written = {"config.json", "model.safetensors"};
  written.insert(written.end(), tokenizer_files.begin(), tokenizer_files.end());
  check_output_folder(a.out, "--out", CommandInputs().folder(a.tokenizer_from, "--tokenizer-from"), written);
  fs::create_directories(a.out);
  const nlohmann::json config = random_model_config(a);
  // The tensors are the ones the architecture's row lists for this config, in its order.
  const std::string config_path = (fs::path(a.out) / "config.json").string();
  const ArchSpec arch = describe_architecture(config, config_path, [](const std::string&) { return true; });

  nlohmann::json header;
  size_t offset = 0;
  for (const TensorSpec& tensor : arch.tensors) {
    size_t n = 1;
    for (auto d : tensor.shape) n *= d;
    header[tensor.name] = {{"dtype", "F32"}, {"shape", tensor.shape}, {"data_offsets", {offset, offset + n * 4}}};
    offset += n * 4;
  }
  std::string text = header.dump();
  while ((8 + text.size()) % 8) text += ' ';  // keep tensor data 8-byte aligned
  // Written beside and renamed over, so a failure leaves no partial model.safetensors.
  const std::string weights_path = (fs::path(a.out) / "model.safetensors").string();
  const std::string temporary = temporary_path_beside(weights_path);
  std::ofstream out(temporary, std::ios::binary);
  if (!out) throw Error(weights_path + ": cannot create " + temporary);
  uint64_t len = text.size();
  out.write(reinterpret_cast<const char*>(&len), 8);
  out.write(text.data(), text.size());
  torch::manual_seed(a.seed);
  for (const TensorSpec& tensor : arch.tensors) {
    const auto t = random_weight(tensor, torch::TensorOptions().dtype(torch::kFloat32)).contiguous();
    out.write(reinterpret_cast<const char*>(t.data_ptr<float>()), t.numel() * 4);
  }
  out.close();
  if (!out) {
    std::remove(temporary.c_str());
    throw Error(weights_path + ": cannot write the weights (disk full?)");
  }
  publish_file(temporary, weights_path);
  for (const auto& name : tokenizer_files)
    write_file_atomically((fs::path(a.out) / name).string(), read_text_file((fs::path(a.tokenizer_from) / name).string()));
  write_file_atomically(config_path, config.dump(2) + "\n");
  std::cout << "wrote " << a.out << " (" << offset / (1 << 20) << " MiB of F32 weights)\n";
  return 0;
}

}  // namespace kvevict
