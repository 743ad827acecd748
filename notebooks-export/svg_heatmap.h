// The needle-in-a-haystack figure: a score per (context length, needle depth) cell, one
// heatmap per task, metric and every other setting (policy, budget, question mode, ...),
// as the NIAH papers draw it. Plain C++ SVG, like svg_plot.h.
#pragma once
#include <map>
#include <string>
#include <utility>
#include <vector>

#include "notebooks-export/results_csv.h"

namespace kvevict {

struct Heatmap {
  std::string task, metric;
  std::string label;                          // the policy and the settings that set this grid apart
  std::vector<int> lengths;                   // the x axis, ascending
  std::vector<double> depths;                 // the y axis, ascending (0: the needle first)
  std::map<std::pair<int, double>, double> cells;  // (length, depth) -> the mean value there
  // The colour scale, shared by every heatmap of the task and metric so that they compare.
  double low = 0, high = 1;
};

// One heatmap per group of rows that has a length and a depth and differs in nothing
// else but those two; groups with a single cell are left out.
std::vector<Heatmap> depth_length_heatmaps(const std::vector<ResultRow>& rows);

std::string render_heatmap_svg(const Heatmap& map);

}  // namespace kvevict
