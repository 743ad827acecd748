#include "harness/analysis/analyze.h"

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>
#include <type_traits>

#include "harness/common/data_dir.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/kv_quant.h"
#include "harness/runtime/attention.h"
#include "harness/runtime/policy_driver.h"
#include "harness/runtime/scorer.h"
#include "notebooks-export/results_csv.h"
#include "notebooks-export/svg_plot.h"
#include "policies/registry.h"
#include "tasks/task.h"

namespace kvevict {

double LayerStatistics::sparsity() const {
  double sparse = 0, entries = 0;
  for (const auto& h : heads) {
    sparse += h.sparse;
    entries += h.entries;
  }
  return entries ? sparse / entries : 0;
}

namespace {
template <typename Field>
double head_mean(const std::vector<HeadStatistics>& heads, Field field) {
  double total = 0;
  int n = 0;
  for (const auto& h : heads)
    if (h.fits) {
      total += field(h) / h.fits;
      ++n;
    }
  return n ? total / n : 0;
}
}  // namespace

double LayerStatistics::slope() const { return head_mean(heads, [](const HeadStatistics& h) { return h.slope; }); }
double LayerStatistics::intercept() const {
  return head_mean(heads, [](const HeadStatistics& h) { return h.intercept; });
}
double LayerStatistics::r2() const { return head_mean(heads, [](const HeadStatistics& h) { return h.r2; }); }
double LayerStatistics::top20() const { return head_mean(heads, [](const HeadStatistics& h) { return h.top20; }); }
double LayerStatistics::persistence_at(int delta) const {
  auto found = persistence.find(delta);
  return found == persistence.end() || found->second.second == 0 ? 0 : found->second.first / found->second.second;
}

namespace {

// Least squares ln(acc) = a + b ln(rank) over ranks 1..T of acc sorted descending
// (entries that underflowed to 0 have no logarithm and are left out).
struct PowerLawFit {
  double slope = 0, intercept = 0, r2 = 0;
  bool ok = false;
};
PowerLawFit fit_power_law(const std::vector<double>& sorted) {
  std::vector<double> x, y;
  for (size_t r = 0; r < sorted.size(); ++r)
    if (sorted[r] > 0) {
      x.push_back(std::log(static_cast<double>(r + 1)));
      y.push_back(std::log(sorted[r]));
    }
  PowerLawFit fit;
  const double n = static_cast<double>(x.size());
  if (x.size() < 3) return fit;
  double mx = 0, my = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    mx += x[k];
    my += y[k];
  }
  mx /= n;
  my /= n;
  double sxx = 0, sxy = 0, syy = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    sxx += (x[k] - mx) * (x[k] - mx);
    sxy += (x[k] - mx) * (y[k] - my);
    syy += (y[k] - my) * (y[k] - my);
  }
  fit.slope = sxy / sxx;
  fit.intercept = my - fit.slope * mx;
  double residual = 0;
  for (size_t k = 0; k < x.size(); ++k) {
    const double e = y[k] - (fit.intercept + fit.slope * x[k]);
    residual += e * e;
  }
  fit.r2 = syy > 0 ? 1 - residual / syy : 1;
  fit.ok = true;
  return fit;
}

// Whether a policy's recall runs beside full attention: a realisable policy that reads no
// queries (the observer hands the recall each block's keys and values, not its queries).
bool recall_runs(const Policy& policy) {
  return policy.realisable() && policy.as_realisable()->token_vectors() != TokenVectors::KeysValuesAndQueries &&
         !policy.as_realisable()->rewrites_slots() && policy.prepass() == Prepass::None;
}

// One recall policy at one budget: its driver per layer, run beside full attention.
struct RecallRun {
  std::string policy;
  double budget;
  std::unique_ptr<Policy> made;
  std::unique_ptr<PolicyDriver> driver;
};

// The statistics of one sequence, fed the full attention block by block, layer by layer
// (FullAttention's observer).
class SequenceAnalyzer {
 public:
  SequenceAnalyzer(const AnalyzeOptions& options, AttentionAnalysis& out, bool record_profile,
                   const SequenceShape& shape, int64_t window)
      : options_(options), out_(out), record_profile_(record_profile), shape_(shape), window_(window) {
    for (int d : options.persistence_deltas) max_delta_ = std::max(max_delta_, d);
    for (const auto& name : options_.recall_policies)
      for (double budget : options_.recall_budgets) {
        PolicyOptions o = options_.policy_options;
        o.budget.ratio = budget;
        RecallRun run{name, budget, make_policy(name, o), nullptr};
        if (!recall_runs(*run.made)) continue;  // noted once by analyze_attention
        run.made->validate(shape);
        runs_.push_back(std::move(run));
      }
  }

  // One block of query rows (FullAttention's observer).
  void block(int layer, int64_t first, int64_t rows, int64_t n, const torch::Tensor& k, const torch::Tensor& v,
             const torch::Tensor& logits, const torch::Tensor& probs) {
    if (layer != layer_) {
      if (layer_ >= 0) end_layer();
      begin_layer(layer, k, v);
    }
    const auto host = probs.to(torch::kCPU, torch::kFloat64).contiguous();  // [hq, rows, n]
    statistics(static_cast<int>(first), static_cast<int>(rows), static_cast<int>(n), host.data_ptr<double>());
    for (auto& run : runs_) recall(run, first, rows, n, logits, host.data_ptr<double>());
  }

  void finish() {
    if (layer_ >= 0) end_layer();
  }

 private:
  void begin_layer(int layer, const torch::Tensor& k, const torch::Tensor& v) {
    layer_ = layer;
    T_ = static_cast<int>(k.size(0));
    hq_ = shape_.n_q_heads;
    hkv_ = shape_.n_kv_heads;
    // The vectors the most demanding recall policy reads; the others ignore them.
    TokenVectors vectors = TokenVectors::None;
    for (const auto& run : runs_) vectors = std::max(vectors, run.made->as_realisable()->token_vectors());
    tokens_ = std::make_unique<HostTokens>(vectors, k, v, torch::Tensor());
    if (static_cast<int>(out_.layers.size()) <= layer) out_.layers.resize(layer + 1);
    auto& stats = out_.layers[layer];
    if (stats.heads.size() < static_cast<size_t>(hq_)) stats.heads.resize(hq_);
    acc_.assign(hq_, std::vector<double>(T_, 0.0));
    k_ = std::max(1, static_cast<int>(options_.persistence_k_ratio * T_));
    ring_.assign(hq_, std::vector<std::vector<int>>(max_delta_ + 1));
    for (auto& run : runs_)
      run.driver = std::make_unique<PolicyDriver>(*run.made->as_realisable(), layer, shape_, window_,
                                                  SlotColumns::Positions);
  }

  // probs: [hq][rows][width], row r is query first + r over keys 0..width-1. Only the keys
  // the query sees count (the model's sliding window hides the others).
  void statistics(int first, int rows, int width, const double* probs) {
    auto& stats = out_.layers[layer_];
    std::vector<int> order;
    for (int r = 0; r < rows; ++r) {
      const int i = first + r;
      const int lo = window_ > 0 ? std::max<int>(0, i - static_cast<int>(window_) + 1) : 0;
      for (int h = 0; h < hq_; ++h) {
        const double* p = probs + (static_cast<size_t>(h) * rows + r) * width;
        double top = 0;
        for (int j = lo; j <= i; ++j) top = std::max(top, p[j]);
        int sparse = 0;
        for (int j = lo; j <= i; ++j) sparse += p[j] < 0.01 * top;
        stats.heads[h].sparse += sparse;
        stats.heads[h].entries += i - lo + 1;
        auto& acc = acc_[h];
        for (int j = lo; j <= i; ++j) acc[j] += p[j];
        if (i + 1 > k_) {
          // The heavy hitters after query i, and their overlap with those delta steps before.
          order.resize(i + 1);
          for (int j = 0; j <= i; ++j) order[j] = j;
          std::nth_element(order.begin(), order.begin() + k_, order.end(), [&](int a, int b) {
            return acc[a] != acc[b] ? acc[a] > acc[b] : a < b;
          });
          std::vector<int>& current = ring_[h][i % (max_delta_ + 1)];
          current.assign(order.begin(), order.begin() + k_);
          std::sort(current.begin(), current.end());
          for (int delta : options_.persistence_deltas) {
            const int before = i - delta;
            if (before < k_) continue;
            const auto& earlier = ring_[h][before % (max_delta_ + 1)];
            std::vector<int> common;
            std::set_intersection(earlier.begin(), earlier.end(), current.begin(), current.end(),
                                  std::back_inserter(common));
            auto& slot = stats.persistence[delta];
            slot.first += static_cast<double>(common.size()) / k_;
            slot.second += 1;
          }
        }
      }
    }
  }

  // The policy's rows through its driver, on a copy of the block's logits: the slots each
  // query sees, and the share of full attention they hold.
  void recall(RecallRun& run, int64_t first, int64_t rows, int64_t width, const torch::Tensor& logits,
              const double* probs) {
    // [hq, rows, width], overwritten by the driver. A copy even on the CPU (to() alone
    // returns the tensor itself there), so the next run still reads logits.
    auto policy_logits = logits.to(torch::kCPU, logits.scalar_type(), /*non_blocking=*/false, /*copy=*/true).contiguous();
    visible_.resize(static_cast<size_t>(hkv_) * rows * width);
    const BlockTokens tokens = tokens_->block().from_row(first, hkv_);
    if (policy_logits.scalar_type() == torch::kFloat64)
      run.driver->rows(first, rows, width, policy_logits.data_ptr<double>(), tokens, visible_.data());
    else
      run.driver->rows(first, rows, width, policy_logits.data_ptr<float>(), tokens, visible_.data());
    auto& stats = out_.layers[layer_].recall[run.policy][run.budget];
    const int group = hq_ / hkv_;
    for (int64_t r = 0; r < rows; ++r)
      for (int h = 0; h < hq_; ++h) {
        const char* seen = visible_.data() + ((h / group) * rows + r) * width;
        const double* p = probs + (static_cast<size_t>(h) * rows + r) * width;
        double mass = 0;
        int attended = 0;
        for (int64_t j = 0; j < width; ++j)
          if (seen[j]) {
            mass += p[j];
            ++attended;
          }
        stats.recall_sum += mass;
        stats.attended_sum += attended - 1;
        stats.rows += 1;
      }
  }

  void end_layer() {
    auto& stats = out_.layers[layer_];
    std::vector<double> profile(T_, 0.0);
    const int top = static_cast<int>(std::ceil(0.2 * T_));
    for (int h = 0; h < hq_; ++h) {
      std::vector<double> sorted = acc_[h];
      std::sort(sorted.begin(), sorted.end(), std::greater<double>());
      double total = 0, head = 0;
      for (int r = 0; r < T_; ++r) {
        total += sorted[r];
        if (r < top) head += sorted[r];
        profile[r] += sorted[r] / hq_;
      }
      PowerLawFit fit = fit_power_law(sorted);
      if (!fit.ok) continue;
      auto& hs = stats.heads[h];
      hs.slope += fit.slope;
      hs.intercept += fit.intercept;
      hs.r2 += fit.r2;
      hs.top20 += total > 0 ? head / total : 0;
      hs.fits += 1;
    }
    if (record_profile_) stats.rank_profile = profile;
    for (auto& run : runs_) run.driver.reset();
  }

  const AnalyzeOptions& options_;
  AttentionAnalysis& out_;
  bool record_profile_;
  SequenceShape shape_;
  int64_t window_;
  int max_delta_ = 0, layer_ = -1, T_ = 0, hq_ = 0, hkv_ = 0, k_ = 1;
  std::unique_ptr<HostTokens> tokens_;  // the layer's keys as the recall policies read them
  std::vector<std::vector<double>> acc_;
  std::vector<std::vector<std::vector<int>>> ring_;  // [head][step % (max delta + 1)]: top-k keys
  std::vector<RecallRun> runs_;
  std::vector<char> visible_;  // [hkv][rows][width]: the slots each query of a recall run saw
};

// The model's attention over a KIVI-quantized cache (harness/common/kv_quant.h) in the
// stream protocol, row by row as decode mode computes it: query i attends to every key and
// value as the cache holds them at step i (quantized groups dequantized, the residual at
// full precision), and each row's logits and probabilities go to the observer, so every
// statistic is of the attention the quantized model computes. Scalar is the accumulation
// type (float, or double for a float64 model), as in the decode cache.
template <typename Scalar>
class QuantizedObservedAttention final : public AttentionBackend {
 public:
  QuantizedObservedAttention(const KvQuantSpec& spec, AttentionObserver observer)
      : spec_(spec), observer_(std::move(observer)) {}

  torch::Tensor attend(int layer, const torch::Tensor& q, const torch::Tensor& k, const torch::Tensor& v,
                       int64_t start) override {
    if (start != 0) throw Error("analyze runs one teacher-forced pass; it cannot continue a sequence");
    const torch::ScalarType acc = std::is_same<Scalar, double>::value ? torch::kFloat64 : torch::kFloat32;
    const int64_t T = q.size(0), hq = q.size(1), hkv = k.size(1), d = q.size(2), group = hq / hkv;
    const torch::Tensor queries = q.to(torch::kCPU, acc).contiguous().view({T, hkv, group, d});
    const torch::Tensor keys_in = k.to(torch::kCPU, acc).contiguous(), values_in = v.to(torch::kCPU, acc).contiguous();
    const Scalar* key_rows = keys_in.template data_ptr<Scalar>();      // [T][Hkv][d]
    const Scalar* value_rows = values_in.template data_ptr<Scalar>();  // [T][Hkv][d]
    std::vector<KvHeadStore<Scalar>> stores;
    for (int64_t h = 0; h < hkv; ++h) stores.emplace_back(spec_, static_cast<int>(d));
    std::vector<int> row_of(T);  // nothing is evicted: position p is row p
    for (int64_t p = 0; p < T; ++p) row_of[p] = static_cast<int>(p);
    torch::Tensor keys = torch::zeros({hkv, T, d}, acc), values = torch::zeros({hkv, T, d}, acc);  // as the cache holds them
    torch::Tensor out = torch::empty({T, hkv, group, d}, acc);
    const double scale = 1.0 / std::sqrt(static_cast<double>(d));
    const int64_t window = sliding_window_;
    for (int64_t i = 0; i < T; ++i) {
      const int64_t n = i + 1;
      for (int64_t h = 0; h < hkv; ++h) {
        stores[h].append(static_cast<int>(i), key_rows + (i * hkv + h) * d, value_rows + (i * hkv + h) * d);
        stores[h].dequantize_all(row_of, keys[h].template data_ptr<Scalar>(), values[h].template data_ptr<Scalar>());
      }
      // [Hkv, group, n]: query i against keys 0 .. i.
      torch::Tensor logits = torch::bmm(queries[i], keys.narrow(1, 0, n).transpose(1, 2)).mul_(scale);
      if (window > 0 && n > window) logits.narrow(2, 0, n - window).fill_(-std::numeric_limits<double>::infinity());
      const torch::Tensor probs = torch::softmax(logits, -1);
      out[i].copy_(torch::bmm(probs, values.narrow(1, 0, n)));
      observer_(layer, i, 1, n, k, v, logits.view({hq, 1, n}), probs.view({hq, 1, n}));
      for (auto& store : stores) store.after_attention(static_cast<int>(i), /*prefill_len=*/0);
    }
    return out.view({T, hq * d}).to(q.scalar_type());
  }

 private:
  KvQuantSpec spec_;
  AttentionObserver observer_;
};

std::string number_text(double value) { return format_number(value); }

}  // namespace

std::vector<double> LayerStatistics::dmc_compression() const {
  std::vector<double> ratios;
  for (const auto& [tokens, slots] : dmc_tokens_slots)
    ratios.push_back(slots > 0 ? static_cast<double>(tokens) / static_cast<double>(slots) : 0);
  return ratios;
}

namespace {

// DMC: each sequence through the parallel form; the merge state counts each head's slots.
AttentionAnalysis analyze_dmc(const Model& model, const std::vector<std::vector<int>>& sequences) {
  AttentionAnalysis out;
  const ArchSpec& arch = model.arch();
  out.layers.resize(arch.n_layers);
  for (auto& layer : out.layers) layer.dmc_tokens_slots.assign(arch.n_kv_heads, {0, 0});
  out.notes.push_back("DMC model (config.json dmc_window_size " + std::to_string(arch.dmc.window) +
                      "): per-head compression ratios (tokens / slots) only; the attention statistics "
                      "over merged slots are not computed");
  for (const auto& tokens : sequences) {
    if (tokens.empty()) continue;
    FullAttention attention;
    model.forward(tokens, 0, attention);
    const DmcMergeState& dmc = *attention.dmc_state();
    for (int l = 0; l < arch.n_layers; ++l)
      for (int h = 0; h < arch.n_kv_heads; ++h) {
        out.layers[l].dmc_tokens_slots[h].first += dmc.tokens(l);
        out.layers[l].dmc_tokens_slots[h].second += dmc.slots(l, h);
      }
    out.sequences += 1;
    out.tokens += static_cast<int64_t>(tokens.size());
  }
  return out;
}

}  // namespace

std::unique_ptr<AttentionBackend> make_observed_kivi_attention(const KvQuantSpec& spec, torch::ScalarType dtype,
                                                              AttentionObserver observer) {
  if (dtype == torch::kFloat64) return std::make_unique<QuantizedObservedAttention<double>>(spec, std::move(observer));
  return std::make_unique<QuantizedObservedAttention<float>>(spec, std::move(observer));
}

AttentionAnalysis analyze_attention(const Model& model, const std::vector<std::vector<int>>& sequences,
                                    const AnalyzeOptions& options) {
  if (model.arch().dmc.enabled()) return analyze_dmc(model, sequences);
  AttentionAnalysis out;
  for (const auto& name : options.recall_policies) {
    PolicyOptions o = options.policy_options;
    o.budget.ratio = 0.5;
    const auto policy = make_policy(name, o);
    if (!policy->realisable())
      out.notes.push_back(name + ": sim-only (it needs " + policy->as_sim_only()->needs() + "), no recall");
    else if (policy->as_realisable()->rewrites_slots())
      out.notes.push_back(name + ": rewrites the keys or values it keeps, which the recall beside full attention "
                          "does not follow, no recall");
    else if (policy->prepass() != Prepass::None)
      out.notes.push_back(name + ": scores the context by a pre-pass of the model (KVzip's reconstruction), which "
                          "the recall's single pass does not run, no recall");
    else if (!recall_runs(*policy))
      out.notes.push_back(name + ": reads each token's queries, which the recall's attention observer does not "
                          "hand over, no recall");
  }
  size_t longest = 0;
  for (size_t s = 0; s < sequences.size(); ++s)
    if (sequences[s].size() > sequences[longest].size()) longest = s;
  for (size_t s = 0; s < sequences.size(); ++s) {
    const auto& tokens = sequences[s];
    if (tokens.empty()) continue;
    const SequenceShape shape = shape_for(model, static_cast<int>(tokens.size()), 0);
    SequenceAnalyzer analyzer(options, out, s == longest, shape, model.arch().sliding_window);
    const AttentionObserver observer = [&](int layer, int64_t first, int64_t rows, int64_t n, const torch::Tensor& k,
                                           const torch::Tensor& v, const torch::Tensor& logits,
                                           const torch::Tensor& probs) {
      analyzer.block(layer, first, rows, n, k, v, logits, probs);
    };
    const KvQuantSpec& kv_quant = options.policy_options.kv_quant;
    if (!kv_quant.enabled()) {
      FullAttention attention(observer, std::max(1, options.block_rows));
      model.forward(tokens, 0, attention);
    } else {
      const auto attention = make_observed_kivi_attention(kv_quant, model.dtype(), observer);
      model.forward(tokens, 0, *attention);
    }
    analyzer.finish();
    out.sequences += 1;
    out.tokens += static_cast<int64_t>(tokens.size());
  }
  return out;
}

nlohmann::json AttentionAnalysis::to_json(const AnalyzeOptions& options) const {
  nlohmann::json j;
  j["sequences"] = sequences;
  j["tokens"] = tokens;
  j["persistence_k_ratio"] = options.persistence_k_ratio;
  j["notes"] = notes;
  j["layers"] = nlohmann::json::array();
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& s = layers[l];
    if (!s.dmc_tokens_slots.empty()) {
      j["layers"].push_back({{"layer", l}, {"dmc_compression", s.dmc_compression()}});  // [KV head]: tokens / slots
      continue;
    }
    nlohmann::json layer = {{"layer", l},          {"sparsity", s.sparsity()}, {"powerlaw_slope", s.slope()},
                            {"powerlaw_r2", s.r2()}, {"top20_mass", s.top20()}};
    for (int delta : options.persistence_deltas) layer["persistence"][std::to_string(delta)] = s.persistence_at(delta);
    for (const auto& [policy, by_budget] : s.recall)
      for (const auto& [budget, r] : by_budget) {
        layer["recall"][policy][number_text(budget)] = r.recall();
        layer["attended"][policy][number_text(budget)] = r.attended();
      }
    j["layers"].push_back(layer);
  }
  return j;
}

std::string AttentionAnalysis::to_csv(const AnalyzeOptions& options) const {
  std::ostringstream csv;
  csv << "layer,head,statistic,policy,budget,delta,value\n";
  auto line = [&](size_t layer, const std::string& head, const std::string& statistic, const std::string& policy,
                  const std::string& budget, const std::string& delta, double value) {
    csv << layer << "," << head << "," << statistic << "," << csv_quote(policy) << "," << budget << "," << delta << ","
        << number_text(value) << "\n";
  };
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& s = layers[l];
    if (!s.dmc_tokens_slots.empty()) {
      const std::vector<double> ratios = s.dmc_compression();
      for (size_t h = 0; h < ratios.size(); ++h) line(l, std::to_string(h), "dmc_compression", "", "", "", ratios[h]);
      continue;
    }
    line(l, "all", "sparsity", "", "", "", s.sparsity());
    line(l, "all", "powerlaw_slope", "", "", "", s.slope());
    line(l, "all", "powerlaw_r2", "", "", "", s.r2());
    line(l, "all", "top20_mass", "", "", "", s.top20());
    for (size_t h = 0; h < s.heads.size(); ++h) {
      const auto& hs = s.heads[h];
      const std::string head = std::to_string(h);
      if (hs.entries) line(l, head, "sparsity", "", "", "", hs.sparse / hs.entries);
      if (!hs.fits) continue;
      line(l, head, "powerlaw_slope", "", "", "", hs.slope / hs.fits);
      line(l, head, "powerlaw_r2", "", "", "", hs.r2 / hs.fits);
      line(l, head, "top20_mass", "", "", "", hs.top20 / hs.fits);
    }
    for (int delta : options.persistence_deltas)
      line(l, "all", "persistence", "", "", std::to_string(delta), s.persistence_at(delta));
    for (const auto& [policy, by_budget] : s.recall)
      for (const auto& [budget, r] : by_budget) {
        line(l, "all", "recall", policy, number_text(budget), "", r.recall());
        line(l, "all", "attended", policy, number_text(budget), "", r.attended());
      }
  }
  return csv.str();
}

std::vector<std::string> AttentionAnalysis::write_plots(const AnalyzeOptions&, const std::string& dir) const {
  std::error_code error;
  std::filesystem::create_directories(dir, error);
  if (error) throw Error(dir + ": cannot create plot directory: " + error.message());
  std::vector<std::pair<std::string, PlotSpec>> plots;
  if (!layers.empty() && !layers[0].dmc_tokens_slots.empty()) {
    PlotSpec compression;
    compression.title = "DMC compression per layer (tokens / cache slots)";
    compression.x_title = "layer";
    compression.y_title = "compression ratio";
    for (size_t h = 0; h < layers[0].dmc_tokens_slots.size(); ++h) {
      PlotSeries series;
      series.label = "KV head " + std::to_string(h);
      for (size_t l = 0; l < layers.size(); ++l)
        series.points.push_back({static_cast<double>(l), layers[l].dmc_compression()[h], std::nullopt});
      compression.series.push_back(series);
    }
    const std::string path = (std::filesystem::path(dir) / "dmc_compression.svg").string();
    write_svg(compression, path);
    return {path};
  }

  PlotSpec sparsity;
  sparsity.title = "Attention sparsity per layer (entries < 1% of the row maximum)";
  sparsity.x_title = "layer";
  sparsity.y_title = "sparsity";
  PlotSeries sparse_series, top_series;
  sparse_series.label = "sparsity";
  top_series.label = "top-20% key mass";
  for (size_t l = 0; l < layers.size(); ++l) {
    sparse_series.points.push_back({static_cast<double>(l), layers[l].sparsity(), std::nullopt});
    top_series.points.push_back({static_cast<double>(l), layers[l].top20(), std::nullopt});
  }
  sparsity.series = {sparse_series, top_series};
  plots.push_back({"sparsity_per_layer.svg", sparsity});

  PlotSpec rank;
  rank.title = "Accumulated attention by rank (log-log) and the power-law fit";
  rank.x_title = "ln rank";
  rank.y_title = "ln accumulated attention (mean over heads)";
  for (size_t l = 0; l < layers.size(); ++l) {
    const auto& s = layers[l];
    PlotSeries data, fit;
    data.label = "layer " + std::to_string(l);
    data.markers = false;
    data.colour = fit.colour = static_cast<int>(l);
    for (size_t r = 0; r < s.rank_profile.size(); ++r)
      if (s.rank_profile[r] > 0)
        data.points.push_back({std::log(static_cast<double>(r + 1)), std::log(s.rank_profile[r]), std::nullopt});
    if (data.points.empty()) continue;
    fit.label = "fit, slope " + format_number(std::round(s.slope() * 1000) / 1000);
    fit.markers = false;
    fit.dashed = true;
    const double x_end = data.points.back().x;
    fit.points = {{0.0, s.intercept(), std::nullopt}, {x_end, s.intercept() + s.slope() * x_end, std::nullopt}};
    rank.series.push_back(data);
    rank.series.push_back(fit);
  }
  plots.push_back({"powerlaw_rank.svg", rank});

  PlotSpec recall;
  recall.title = "Attention recall: full-attention mass in the kept set (mean over layers)";
  recall.x_title = "KV budget (fraction of the sequence)";
  recall.y_title = "attention recall";
  std::map<std::string, std::map<double, std::pair<double, int>>> by_policy;
  std::vector<std::string> order;
  for (const auto& s : layers)
    for (const auto& [policy, by_budget] : s.recall) {
      if (!by_policy.count(policy)) order.push_back(policy);
      for (const auto& [budget, r] : by_budget) {
        by_policy[policy][budget].first += r.recall();
        by_policy[policy][budget].second += 1;
      }
    }
  for (const auto& policy : order) {
    PlotSeries series;
    series.label = policy;
    for (const auto& [budget, sum] : by_policy[policy])
      series.points.push_back({budget, sum.first / sum.second, std::nullopt});
    recall.series.push_back(series);
  }
  if (!recall.series.empty()) plots.push_back({"recall_vs_budget.svg", recall});

  std::vector<std::string> paths;
  for (const auto& [name, plot] : plots) {
    const std::string path = (std::filesystem::path(dir) / name).string();
    write_svg(plot, path);
    paths.push_back(path);
  }
  return paths;
}

}  // namespace kvevict
