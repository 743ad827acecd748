// Standalone SVG plots of result rows, drawn in plain C++ so that plots need no Python:
// the metric against the cache budget (one line per policy) and the heavy-share ablation.
// The notebook (notebook.cpp) draws the same figures with matplotlib.
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "notebooks-export/results_csv.h"

namespace kvevict {

struct PlotPoint {
  double x = 0;
  double y = 0;
  std::optional<double> error;  // standard error, drawn as an error bar
};

struct PlotSeries {
  std::string label;  // the policy, plus the settings that tell lines apart
  std::vector<PlotPoint> points;  // sorted by x; repeated x values are averaged
  // A policy without a budget (the full cache) is drawn as a dashed horizontal line
  // at points[0].y.
  bool reference = false;
  bool markers = true;  // a circle at every point
  bool dashed = false;  // a dashed line (a fitted line, say)
  int colour = -1;      // palette index (-1: the series' position), e.g. a fit in its data's colour
};

struct PlotSpec {
  std::string task;
  std::string metric;
  std::string kind;      // "budget", "heavy_share" or "bytes"
  std::string x_column;  // "budget", "budget_tokens", "heavy_share" or "kv_bytes_peak"
  std::vector<PlotSeries> series;
  // Free-form plots (kvevict analyze) name their own title and axes; empty: derived
  // from task, metric and x_column.
  std::string title, x_title, y_title;
};

// What to draw, derived from the rows. One budget plot per (task, metric) that has
// budgeted rows; one heavy-share plot per (task, metric) where some policy was run at
// several heavy shares with everything else fixed. Lines are split by any setting
// (model, protocol, shots, heavy share, ...) that varies within the figure.
std::vector<PlotSpec> budget_plots(const std::vector<ResultRow>& rows);
std::vector<PlotSpec> heavy_share_plots(const std::vector<ResultRow>& rows);
// Accuracy against bytes (kv_bytes_peak on the x axis, in KiB): one plot per (task,
// metric) whose rows had a byte budget (kv_memory) or a quantized cache, one line per
// policy and kv_bits ("<task>_<metric>_bytes.svg").
std::vector<PlotSpec> bytes_plots(const std::vector<ResultRow>& rows);

// The settings that split a figure's lines when they vary inside it (in legend order);
// the notebook draws with the same lists.
const std::vector<std::string>& budget_split_columns();
const std::vector<std::string>& ablation_split_columns();

// Text made safe for SVG (XML 1.0) character data and attribute values.
std::string xml_escape(const std::string& text);

// The SVG document for one plot.
std::string render_svg(const PlotSpec& plot);
// Writes render_svg(plot) to path; throws kvevict::Error naming the path when it cannot.
void write_svg(const PlotSpec& plot, const std::string& path);

// Writes every budget and heavy-share plot into out_dir (created if missing) as
// "<task>_<metric>_budget.svg" / "<task>_<metric>_heavy_share.svg", and the needle
// grids as "<task>_<metric>_heatmap.svg" (svg_heatmap.h; names sanitised to
// [A-Za-z0-9._-], a suffix where two would clash), and returns the paths written.
std::vector<std::string> write_svg_plots(const std::vector<ResultRow>& rows,
                                         const std::string& out_dir);

}  // namespace kvevict
