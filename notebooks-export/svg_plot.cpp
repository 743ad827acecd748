#include "notebooks-export/svg_plot.h"

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>

#include "harness/common/atomic_file.h"
#include "harness/common/errors.h"
#include "harness/common/text.h"
#include "notebooks-export/svg_heatmap.h"
#include "policies/registry.h"

namespace kvevict {

namespace {

using Fields = std::map<std::string, std::string>;

// Settings that split the lines of a figure (and appear in the legend) when they vary
// inside it: the context columns of the results table, and for the budget plot also the
// heavy share (the ablation's x axis).
const std::vector<std::string> kAblationSplitColumns = result_columns(SettingUse::context);
const std::vector<std::string> kBudgetSplitColumns = [] {
  auto columns = kAblationSplitColumns;
  for (const auto& column : result_columns(SettingUse::heavy_share)) columns.push_back(column);
  return columns;
}();

struct TaskMetricGroup {
  std::string task;
  std::string metric;
  std::vector<Fields> rows;
};

std::vector<TaskMetricGroup> group_by_task_and_metric(const std::vector<ResultRow>& rows) {
  std::vector<TaskMetricGroup> groups;
  std::map<std::pair<std::string, std::string>, std::size_t> index;
  for (const auto& row : rows) {
    // A shared-context evaluation's per-turn rows sit beside its overall row (turn empty),
    // which the figures draw; the per-turn values are a table's (`table --cols turn`).
    if (row.turn) continue;
    auto key = std::make_pair(row.task, row.metric);
    auto found = index.find(key);
    if (found == index.end()) {
      found = index.emplace(key, groups.size()).first;
      groups.push_back({row.task, row.metric, {}});
    }
    groups[found->second].rows.push_back(row.fields());
  }
  return groups;
}

std::vector<std::string> varying_columns(const std::vector<const Fields*>& rows,
                                         const std::vector<std::string>& candidates) {
  std::vector<std::string> varying;
  for (const auto& column : candidates) {
    std::set<std::string> values;
    for (const auto* fields : rows) values.insert(fields->at(column));
    if (values.size() > 1) varying.push_back(column);
  }
  return varying;
}

double number(const std::string& text) { return std::strtod(text.c_str(), nullptr); }

std::string series_label(const std::string& policy, const std::vector<std::string>& columns,
                         const Fields& fields) {
  std::string extras;
  for (const auto& column : columns)
    if (!fields.at(column).empty())  // "heavy_share=" would say nothing
      extras += (extras.empty() ? "" : ", ") + column + "=" + fields.at(column);
  return extras.empty() ? policy : policy + " (" + extras + ")";
}

// Collects raw (x, y, error) samples per line, in first-appearance order.
class SeriesCollector {
 public:
  void add(const std::vector<std::string>& key, const std::string& policy,
           const std::string& label, bool reference, double x, const Fields& fields) {
    auto found = index_.find(key);
    if (found == index_.end()) {
      found = index_.emplace(key, series_.size()).first;
      series_.push_back({policy, label, reference, {}});
    }
    const std::string& error = fields.at("stderr");
    series_[found->second].samples.push_back(
        {x, number(fields.at("value")),
         error.empty() ? std::nullopt : std::optional<double>(number(error))});
  }

  // Averages repeated x values, sorts by x, drops lines with fewer than
  // `minimum_distinct_x` points, and puts the full-cache baseline first.
  std::vector<PlotSeries> finish(std::size_t minimum_distinct_x) const {
    std::vector<std::pair<std::string, PlotSeries>> kept;  // (policy, series)
    for (const auto& raw : series_) {
      std::map<double, std::vector<const PlotPoint*>> by_x;
      for (const auto& sample : raw.samples)
        if (std::isfinite(sample.x) && std::isfinite(sample.y)) by_x[sample.x].push_back(&sample);
      if (by_x.empty() || by_x.size() < minimum_distinct_x) continue;
      PlotSeries series;
      series.label = raw.label;
      series.reference = raw.reference;
      for (const auto& [x, samples] : by_x) {
        double y_sum = 0, error_sum = 0;
        int errors = 0;
        for (const auto* sample : samples) {
          y_sum += sample->y;
          if (sample->error) {
            error_sum += *sample->error;
            ++errors;
          }
        }
        PlotPoint point{x, y_sum / static_cast<double>(samples.size()), std::nullopt};
        if (errors) point.error = error_sum / errors;
        series.points.push_back(point);
      }
      kept.emplace_back(raw.policy, std::move(series));
    }
    std::stable_partition(kept.begin(), kept.end(),
                          [](const auto& entry) { return is_reference_policy(entry.first); });
    std::vector<PlotSeries> result;
    for (auto& entry : kept) result.push_back(std::move(entry.second));
    return result;
  }

 private:
  struct RawSeries {
    std::string policy;
    std::string label;
    bool reference;
    std::vector<PlotPoint> samples;
  };

  std::map<std::vector<std::string>, std::size_t> index_;
  std::vector<RawSeries> series_;
};

}  // namespace

const std::vector<std::string>& budget_split_columns() { return kBudgetSplitColumns; }
const std::vector<std::string>& ablation_split_columns() { return kAblationSplitColumns; }

std::vector<PlotSpec> budget_plots(const std::vector<ResultRow>& rows) {
  std::vector<PlotSpec> plots;
  for (const auto& group : group_by_task_and_metric(rows)) {
    bool any_budget = false, any_tokens = false;
    for (const auto& fields : group.rows) {
      any_budget |= !fields.at("budget").empty();
      any_tokens |= !fields.at("budget_tokens").empty();
    }
    if (!any_budget && !any_tokens) continue;  // nothing was swept: no plot
    const std::string x_column = any_budget ? "budget" : "budget_tokens";

    std::vector<const Fields*> swept, baseline;
    for (const auto& fields : group.rows) {
      if (!fields.at(x_column).empty())
        swept.push_back(&fields);
      else if (fields.at("budget").empty() && fields.at("budget_tokens").empty() && fields.at("kv_memory").empty())
        baseline.push_back(&fields);  // no budget at all: the full cache (a byte budget is bytes_plots')
    }
    auto swept_split = varying_columns(swept, kBudgetSplitColumns);
    auto baseline_split = varying_columns(baseline, kBudgetSplitColumns);

    SeriesCollector collector;
    for (const auto* fields : swept) {
      std::vector<std::string> key = {"swept", fields->at("policy")};
      for (const auto& column : swept_split) key.push_back(fields->at(column));
      collector.add(key, fields->at("policy"),
                    series_label(fields->at("policy"), swept_split, *fields), false,
                    number(fields->at(x_column)), *fields);
    }
    for (const auto* fields : baseline) {
      std::vector<std::string> key = {"baseline", fields->at("policy")};
      for (const auto& column : baseline_split) key.push_back(fields->at(column));
      collector.add(key, fields->at("policy"),
                    series_label(fields->at("policy"), baseline_split, *fields), true, 0.0,
                    *fields);
    }
    PlotSpec plot{group.task, group.metric, "budget", x_column, collector.finish(1)};
    bool has_line = std::any_of(plot.series.begin(), plot.series.end(),
                                [](const PlotSeries& series) { return !series.reference; });
    if (has_line) plots.push_back(std::move(plot));
  }
  return plots;
}

std::vector<PlotSpec> bytes_plots(const std::vector<ResultRow>& rows) {
  std::vector<PlotSpec> plots;
  for (const auto& group : group_by_task_and_metric(rows)) {
    // Only where bytes were a setting: a byte budget or a quantized cache.
    bool any = false;
    for (const auto& fields : group.rows) any |= !fields.at("kv_memory").empty() || fields.at("kv_bits") != "16";
    if (!any) continue;
    SeriesCollector collector;
    for (const auto& fields : group.rows) {
      if (fields.at("kv_bytes_peak").empty()) continue;
      // One line per policy and bits: eviction alone, KIVI alone, and each mix.
      const std::string label = fields.at("policy") + " " + fields.at("kv_bits") + "-bit";
      collector.add({fields.at("policy"), fields.at("kv_bits")}, fields.at("policy"), label, false,
                    number(fields.at("kv_bytes_peak")) / 1024.0, fields);
    }
    PlotSpec plot{group.task, group.metric, "bytes", "kv_bytes_peak", collector.finish(1)};
    plot.x_title = "KV cache at its peak (KiB; codes, scales, mins and fp16 residual)";
    if (!plot.series.empty()) plots.push_back(std::move(plot));
  }
  return plots;
}

std::vector<PlotSpec> heavy_share_plots(const std::vector<ResultRow>& rows) {
  std::vector<PlotSpec> plots;
  for (const auto& group : group_by_task_and_metric(rows)) {
    std::vector<const Fields*> ablation;
    for (const auto& fields : group.rows)
      if (!fields.at("heavy_share").empty()) ablation.push_back(&fields);
    auto split = varying_columns(ablation, kAblationSplitColumns);

    SeriesCollector collector;
    for (const auto* fields : ablation) {
      // The budget always names the line: the ablation is read "at budget B".
      std::vector<std::string> label_columns;
      if (!fields->at("budget").empty()) label_columns.push_back("budget");
      else if (!fields->at("budget_tokens").empty()) label_columns.push_back("budget_tokens");
      label_columns.insert(label_columns.end(), split.begin(), split.end());
      std::vector<std::string> key = {fields->at("policy"), fields->at("budget"),
                                      fields->at("budget_tokens")};
      for (const auto& column : split) key.push_back(fields->at(column));
      collector.add(key, fields->at("policy"),
                    series_label(fields->at("policy"), label_columns, *fields), false,
                    number(fields->at("heavy_share")), *fields);
    }
    PlotSpec plot{group.task, group.metric, "heavy_share", "heavy_share",
                  collector.finish(2)};
    if (!plot.series.empty()) plots.push_back(std::move(plot));
  }
  return plots;
}

std::string xml_escape(const std::string& text) {
  std::string escaped;
  for (char c : text) {
    switch (c) {
      case '&': escaped += "&amp;"; break;
      case '<': escaped += "&lt;"; break;
      case '>': escaped += "&gt;"; break;
      case '"': escaped += "&quot;"; break;
      case '\'': escaped += "&apos;"; break;
      default:
        // Control characters are not allowed in XML 1.0 at all.
        escaped += (static_cast<unsigned char>(c) < 0x20) ? ' ' : c;
    }
  }
  return escaped;
}

namespace {

// matplotlib's tab10, so the SVGs and the notebook use the same colours.
const char* const kPalette[] = {"#1f77b4", "#ff7f0e", "#2ca02c", "#d62728", "#9467bd",
                                "#8c564b", "#e377c2", "#7f7f7f", "#bcbd22", "#17becf"};

std::string fixed(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}
std::string coordinate(double value) { return fixed(value, 2); }

struct Axis {
  double low = 0, high = 1;
  std::vector<double> ticks;
  int decimals = 0;
  // Maps a data value onto [pixel_low, pixel_high].
  double to_pixel(double value, double pixel_low, double pixel_high) const {
    return pixel_low + (value - low) / (high - low) * (pixel_high - pixel_low);
  }
};

// Pads the data range by 5% and picks about five ticks at 1, 2 or 5 x 10^k.
Axis nice_axis(double low, double high) {
  if (!(high > low)) {
    double pad = low == 0 ? 0.5 : std::abs(low) * 0.1;
    low -= pad;
    high += pad;
  }
  double span = high - low;
  Axis axis;
  axis.low = low - 0.05 * span;
  axis.high = high + 0.05 * span;
  double raw_step = (axis.high - axis.low) / 5;
  double magnitude = std::pow(10.0, std::floor(std::log10(raw_step)));
  double fraction = raw_step / magnitude;
  double step = (fraction < 1.5 ? 1 : fraction < 3 ? 2 : fraction < 7 ? 5 : 10) * magnitude;
  axis.decimals = std::max(0, static_cast<int>(-std::floor(std::log10(step) + 1e-9)));
  for (long long k = static_cast<long long>(std::ceil(axis.low / step - 1e-9));
       k <= static_cast<long long>(std::floor(axis.high / step + 1e-9)); ++k)
    axis.ticks.push_back(k == 0 ? 0.0 : static_cast<double>(k) * step);
  return axis;
}

std::string x_axis_title(const PlotSpec& plot) {
  if (!plot.x_title.empty()) return plot.x_title;
  if (plot.x_column == "budget") return "KV budget (fraction of the sequence)";
  if (plot.x_column == "budget_tokens") return "KV budget (tokens)";
  return "heavy-hitter share of the budget";
}

// Where one figure's parts go, in pixels: the plot area, the legend to its right, and the
// axes that map data onto them.
struct Layout {
  double left = 72, top = 44, plot_width = 480, plot_height = 300;
  double right = left + plot_width, bottom = top + plot_height;
  double legend_left = right + 20;
  double width = 0, height = bottom + 56;
  Axis x_axis, y_axis;
  double px(double x) const { return x_axis.to_pixel(x, left, right); }
  double py(double y) const { return y_axis.to_pixel(y, bottom, top); }
};

// Axes that fit every point and error bar (a reference line spans the x range instead),
// and a width that fits the longest legend label.
Layout layout_for(const PlotSpec& plot) {
  Layout layout;
  double x_low = INFINITY, x_high = -INFINITY, y_low = INFINITY, y_high = -INFINITY;
  for (const auto& series : plot.series) {
    for (const auto& point : series.points) {
      double error = point.error && std::isfinite(*point.error) ? *point.error : 0;
      y_low = std::min(y_low, point.y - error);
      y_high = std::max(y_high, point.y + error);
      if (series.reference) continue;  // spans the whole x range instead
      x_low = std::min(x_low, point.x);
      x_high = std::max(x_high, point.x);
    }
  }
  if (!std::isfinite(x_low)) x_low = x_high = 0;
  if (!std::isfinite(y_low)) y_low = y_high = 0;
  layout.x_axis = nice_axis(x_low, x_high);
  layout.y_axis = nice_axis(y_low, y_high);

  std::size_t longest_label = 0;
  for (const auto& series : plot.series) longest_label = std::max(longest_label, series.label.size());
  layout.width = layout.legend_left + 40 + 6.5 * static_cast<double>(longest_label) + 10;
  return layout;
}

// The document's start: size, background and title.
std::string svg_header(const PlotSpec& plot, const Layout& layout) {
  const double left = layout.left, plot_width = layout.plot_width;
  const double width = layout.width, height = layout.height;
  std::string svg;
  svg += "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n";
  svg += "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + coordinate(width) +
         "\" height=\"" + coordinate(height) + "\" viewBox=\"0 0 " + coordinate(width) + " " +
         coordinate(height) + "\" font-family=\"sans-serif\" font-size=\"11\">\n";
  svg += "<rect x=\"0\" y=\"0\" width=\"" + coordinate(width) + "\" height=\"" +
         coordinate(height) + "\" fill=\"white\"/>\n";
  const char* against = plot.kind == "budget" ? " vs budget"
                        : plot.kind == "bytes" ? " vs KV cache bytes"
                                               : " vs heavy-hitter share";
  const std::string title = !plot.title.empty() ? plot.title : plot.task + ": " + plot.metric + against;
  svg += "<text x=\"" + coordinate(left + plot_width / 2) +
         "\" y=\"24\" text-anchor=\"middle\" font-size=\"15\">" + xml_escape(title) +
         "</text>\n";
  return svg;
}

// Grid, ticks, tick labels, the frame and the axis titles.
std::string svg_axes(const PlotSpec& plot, const Layout& layout) {
  const double left = layout.left, top = layout.top, right = layout.right, bottom = layout.bottom;
  const double plot_width = layout.plot_width, plot_height = layout.plot_height;
  auto px = [&](double x) { return layout.px(x); };
  auto py = [&](double y) { return layout.py(y); };
  const Axis& x_axis = layout.x_axis;
  const Axis& y_axis = layout.y_axis;
  std::string svg;
  svg += "<g stroke=\"#dddddd\" stroke-width=\"1\">\n";
  for (double tick : x_axis.ticks)
    svg += "<line x1=\"" + coordinate(px(tick)) + "\" y1=\"" + coordinate(top) + "\" x2=\"" +
           coordinate(px(tick)) + "\" y2=\"" + coordinate(bottom) + "\"/>\n";
  for (double tick : y_axis.ticks)
    svg += "<line x1=\"" + coordinate(left) + "\" y1=\"" + coordinate(py(tick)) + "\" x2=\"" +
           coordinate(right) + "\" y2=\"" + coordinate(py(tick)) + "\"/>\n";
  svg += "</g>\n<g stroke=\"#333333\" stroke-width=\"1\">\n";
  for (double tick : x_axis.ticks)
    svg += "<line x1=\"" + coordinate(px(tick)) + "\" y1=\"" + coordinate(bottom) + "\" x2=\"" +
           coordinate(px(tick)) + "\" y2=\"" + coordinate(bottom + 5) + "\"/>\n";
  for (double tick : y_axis.ticks)
    svg += "<line x1=\"" + coordinate(left - 5) + "\" y1=\"" + coordinate(py(tick)) +
           "\" x2=\"" + coordinate(left) + "\" y2=\"" + coordinate(py(tick)) + "\"/>\n";
  svg += "</g>\n<g fill=\"#333333\">\n";
  for (double tick : x_axis.ticks)
    svg += "<text x=\"" + coordinate(px(tick)) + "\" y=\"" + coordinate(bottom + 18) +
           "\" text-anchor=\"middle\">" + fixed(tick, x_axis.decimals) + "</text>\n";
  for (double tick : y_axis.ticks)
    svg += "<text x=\"" + coordinate(left - 8) + "\" y=\"" + coordinate(py(tick) + 4) +
           "\" text-anchor=\"end\">" + fixed(tick, y_axis.decimals) + "</text>\n";
  svg += "</g>\n";
  svg += "<rect x=\"" + coordinate(left) + "\" y=\"" + coordinate(top) + "\" width=\"" +
         coordinate(plot_width) + "\" height=\"" + coordinate(plot_height) +
         "\" fill=\"none\" stroke=\"#333333\"/>\n";
  svg += "<text x=\"" + coordinate(left + plot_width / 2) + "\" y=\"" +
         coordinate(bottom + 42) + "\" text-anchor=\"middle\" font-size=\"13\">" +
         xml_escape(x_axis_title(plot)) + "</text>\n";
  svg += "<text transform=\"translate(20 " + coordinate(top + plot_height / 2) +
         ") rotate(-90)\" text-anchor=\"middle\" font-size=\"13\">" +
         xml_escape(plot.y_title.empty() ? plot.metric : plot.y_title) +
         "</text>\n";
  return svg;
}

// One line (or dashed baseline) with its markers and error bars, then its legend entry.
std::string svg_series(const PlotSpec& plot, std::size_t i, const Layout& layout) {
  const double left = layout.left, top = layout.top, right = layout.right;
  auto px = [&](double x) { return layout.px(x); };
  auto py = [&](double y) { return layout.py(y); };
  const double legend_left = layout.legend_left;
  std::string svg;
  const PlotSeries& series = plot.series[i];
  const std::size_t palette_index = series.colour >= 0 ? static_cast<std::size_t>(series.colour) : i;
  const std::string colour = kPalette[palette_index % (sizeof kPalette / sizeof kPalette[0])];
  svg += "<g stroke=\"" + colour + "\" fill=\"" + colour + "\">\n";
  if (series.reference) {
    double y = py(series.points.front().y);
    svg += "<line x1=\"" + coordinate(left) + "\" y1=\"" + coordinate(y) + "\" x2=\"" +
           coordinate(right) + "\" y2=\"" + coordinate(y) +
           "\" stroke-width=\"1.5\" stroke-dasharray=\"6 4\"/>\n";
  } else {
    std::string points;
    for (const auto& point : series.points)
      points += (points.empty() ? "" : " ") + coordinate(px(point.x)) + "," +
                coordinate(py(point.y));
    svg += "<polyline fill=\"none\" stroke-width=\"1.8\"" +
           (series.dashed ? std::string(" stroke-dasharray=\"6 4\"") : std::string()) + " points=\"" + points +
           "\"/>\n";
    for (const auto& point : series.points) {
      if (!series.markers) break;
      if (point.error && std::isfinite(*point.error) && *point.error > 0) {
        double x = px(point.x), y_top = py(point.y + *point.error),
               y_bottom = py(point.y - *point.error);
        svg += "<path fill=\"none\" stroke-width=\"1\" d=\"M" + coordinate(x) + " " +
               coordinate(y_top) + "V" + coordinate(y_bottom) + "M" + coordinate(x - 3) +
               " " + coordinate(y_top) + "H" + coordinate(x + 3) + "M" + coordinate(x - 3) +
               " " + coordinate(y_bottom) + "H" + coordinate(x + 3) + "\"/>\n";
      }
      svg += "<circle cx=\"" + coordinate(px(point.x)) + "\" cy=\"" + coordinate(py(point.y)) +
             "\" r=\"3.5\"/>\n";
    }
  }
  double legend_y = top + 8 + 18 * static_cast<double>(i);
  svg += "<line x1=\"" + coordinate(legend_left) + "\" y1=\"" + coordinate(legend_y) +
         "\" x2=\"" + coordinate(legend_left + 24) + "\" y2=\"" + coordinate(legend_y) +
         "\" stroke-width=\"1.8\"" +
         (series.reference || series.dashed ? std::string(" stroke-dasharray=\"6 4\"") : std::string()) +
         "/>\n";
  if (!series.reference && series.markers)
    svg += "<circle cx=\"" + coordinate(legend_left + 12) + "\" cy=\"" +
           coordinate(legend_y) + "\" r=\"3.5\"/>\n";
  svg += "<text x=\"" + coordinate(legend_left + 32) + "\" y=\"" + coordinate(legend_y + 4) +
         "\" stroke=\"none\" fill=\"#333333\">" + xml_escape(series.label) + "</text>\n";
  svg += "</g>\n";
  return svg;
}

}  // namespace

std::string render_svg(const PlotSpec& plot) {
  const Layout layout = layout_for(plot);
  std::string svg = svg_header(plot, layout) + svg_axes(plot, layout);
  for (std::size_t i = 0; i < plot.series.size(); ++i) svg += svg_series(plot, i, layout);
  svg += "</svg>\n";
  return svg;
}

// Atomically: a plot replaces a symbolic link at its path rather than writing through it.
void write_svg(const PlotSpec& plot, const std::string& path) { write_file_atomically(path, render_svg(plot)); }

std::vector<std::string> write_svg_plots(const std::vector<ResultRow>& rows,
                                         const std::string& out_dir) {
  std::error_code error;
  std::filesystem::create_directories(out_dir, error);
  if (error) throw Error(out_dir + ": cannot create plot directory: " + error.message());

  std::vector<PlotSpec> plots = budget_plots(rows);
  for (auto& plot : heavy_share_plots(rows)) plots.push_back(std::move(plot));
  for (auto& plot : bytes_plots(rows)) plots.push_back(std::move(plot));

  std::vector<std::string> paths;
  std::set<std::string> used_names;
  for (const auto& plot : plots) {
    std::string stem = file_name_part(plot.task) + "_" + file_name_part(plot.metric) +
                       "_" + plot.kind;
    // Different task names can sanitise to the same text; never overwrite a plot.
    std::string name = stem + ".svg";
    for (int suffix = 2; !used_names.insert(name).second; ++suffix)
      name = stem + "_" + std::to_string(suffix) + ".svg";
    std::string path = (std::filesystem::path(out_dir) / name).string();
    write_svg(plot, path);
    paths.push_back(path);
  }
  for (const auto& map : depth_length_heatmaps(rows)) {
    const std::string stem = file_name_part(map.task) + "_" + file_name_part(map.metric) + "_heatmap";
    std::string name = stem + ".svg";
    for (int suffix = 2; !used_names.insert(name).second; ++suffix)
      name = stem + "_" + std::to_string(suffix) + ".svg";
    const std::string path = (std::filesystem::path(out_dir) / name).string();
    write_file_atomically(path, render_heatmap_svg(map));
    paths.push_back(path);
  }
  return paths;
}

}  // namespace kvevict
