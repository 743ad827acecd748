#include "notebooks-export/svg_heatmap.h"

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <set>

#include "notebooks-export/svg_plot.h"

namespace kvevict {

std::vector<Heatmap> depth_length_heatmaps(const std::vector<ResultRow>& rows) {
  // Group by every setting except the two axes; the metric names the figure too.
  std::vector<std::string> group_columns;
  for (const auto& column : result_columns(ColumnRole::setting))
    if (column != "length" && column != "depth") group_columns.push_back(column);
  std::map<std::vector<std::string>, std::size_t> index;
  std::vector<Heatmap> maps;
  std::vector<std::map<std::pair<int, double>, std::vector<double>>> samples;
  std::vector<std::map<std::string, std::string>> group_fields;
  for (const auto& row : rows) {
    if (!row.length || !row.depth || !std::isfinite(row.value)) continue;
    const auto fields = row.fields();
    std::vector<std::string> key{row.metric};
    for (const auto& column : group_columns) key.push_back(fields.at(column));
    auto found = index.find(key);
    if (found == index.end()) {
      found = index.emplace(key, maps.size()).first;
      maps.push_back({row.task, row.metric, "", {}, {}, {}});
      samples.emplace_back();
      group_fields.push_back(fields);
    }
    samples[found->second][{*row.length, *row.depth}].push_back(row.value);
  }
  // A label names the policy and the settings that differ between the task's figures.
  std::vector<Heatmap> kept;
  for (std::size_t g = 0; g < maps.size(); ++g) {
    Heatmap& map = maps[g];
    std::set<int> lengths;
    std::set<double> depths;
    for (const auto& [cell, values] : samples[g]) {
      lengths.insert(cell.first);
      depths.insert(cell.second);
      double sum = 0;
      for (double v : values) sum += v;
      map.cells[cell] = sum / static_cast<double>(values.size());
    }
    if (map.cells.size() < 2) continue;
    map.lengths.assign(lengths.begin(), lengths.end());
    map.depths.assign(depths.begin(), depths.end());
    std::string extras;
    for (const auto& column : group_columns) {
      if (column == "task" || column == "policy") continue;
      std::set<std::string> values;
      for (std::size_t other = 0; other < maps.size(); ++other)
        if (group_fields[other].at("task") == map.task) values.insert(group_fields[other].at(column));
      const std::string& value = group_fields[g].at(column);
      if (values.size() > 1 && !value.empty()) extras += (extras.empty() ? "" : ", ") + column + "=" + value;
    }
    const std::string& policy = group_fields[g].at("policy");
    map.label = extras.empty() ? policy : policy + " (" + extras + ")";
    kept.push_back(std::move(map));
  }
  for (Heatmap& map : kept) {
    map.low = 0;
    map.high = 0;
    for (const Heatmap& other : kept)
      if (other.task == map.task && other.metric == map.metric)
        for (const auto& [cell, value] : other.cells) {
          map.low = std::min(map.low, value);
          map.high = std::max(map.high, value);
        }
    if (!(map.high > map.low)) map.high = map.low + 1;
  }
  return kept;
}

namespace {

std::string number(double value, int decimals) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.*f", decimals, value);
  return buffer;
}

// Red (low) through yellow to green (high), as the NIAH figures colour their scores.
std::string colour(double share) {
  share = std::clamp(share, 0.0, 1.0);
  const double r = share < 0.5 ? 1.0 : 2.0 * (1.0 - share);
  const double g = share < 0.5 ? 2.0 * share : 1.0;
  char buffer[16];
  std::snprintf(buffer, sizeof buffer, "#%02x%02x%02x", static_cast<int>(std::lround(215 * r + 20)),
                static_cast<int>(std::lround(190 * g + 20)), 60);
  return buffer;
}

}  // namespace

std::string render_heatmap_svg(const Heatmap& map) {
  const double cell_w = 64, cell_h = 26, left = 90, top = 56, bottom = 56, right = 30;
  const std::string title = map.task + ": " + map.metric + ", " + map.label;
  // Wide enough for the title at about 8 px a character.
  const double width = std::max(left + cell_w * map.lengths.size() + right, 8.0 * title.size() + 20);
  const double height = top + cell_h * map.depths.size() + bottom;
  const double low = map.low, high = map.high;
  std::string svg = "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"" + number(width, 0) + "\" height=\"" +
                    number(height, 0) + "\" font-family=\"sans-serif\" font-size=\"12\">\n";
  svg += "<rect width=\"100%\" height=\"100%\" fill=\"white\"/>\n";
  svg += "<text x=\"" + number(width / 2, 1) + "\" y=\"20\" text-anchor=\"middle\" font-size=\"14\">" +
         xml_escape(title) + "</text>\n";
  svg += "<text x=\"" + number(width / 2, 1) + "\" y=\"38\" text-anchor=\"middle\" fill=\"#555\">colour from " +
         number(low, 1) + " (red) to " + number(high, 1) + " (green); empty: not run</text>\n";
  for (std::size_t y = 0; y < map.depths.size(); ++y) {
    const double cy = top + cell_h * y;
    svg += "<text x=\"" + number(left - 8, 1) + "\" y=\"" + number(cy + cell_h / 2 + 4, 1) +
           "\" text-anchor=\"end\">" + number(100 * map.depths[y], 0) + "%</text>\n";
    for (std::size_t x = 0; x < map.lengths.size(); ++x) {
      const double cx = left + cell_w * x;
      const auto found = map.cells.find({map.lengths[x], map.depths[y]});
      if (found == map.cells.end()) continue;
      svg += "<rect x=\"" + number(cx, 1) + "\" y=\"" + number(cy, 1) + "\" width=\"" + number(cell_w - 1, 1) +
             "\" height=\"" + number(cell_h - 1, 1) + "\" fill=\"" + colour((found->second - low) / (high - low)) +
             "\"/>\n";
      svg += "<text x=\"" + number(cx + cell_w / 2, 1) + "\" y=\"" + number(cy + cell_h / 2 + 4, 1) +
             "\" text-anchor=\"middle\">" + number(found->second, 1) + "</text>\n";
    }
  }
  const double axis_y = top + cell_h * map.depths.size();
  for (std::size_t x = 0; x < map.lengths.size(); ++x)
    svg += "<text x=\"" + number(left + cell_w * x + cell_w / 2, 1) + "\" y=\"" + number(axis_y + 16, 1) +
           "\" text-anchor=\"middle\">" + std::to_string(map.lengths[x]) + "</text>\n";
  svg += "<text x=\"" + number(left + cell_w * map.lengths.size() / 2, 1) + "\" y=\"" + number(axis_y + 38, 1) +
         "\" text-anchor=\"middle\">context length (tokens)</text>\n";
  svg += "<text x=\"18\" y=\"" + number(top + cell_h * map.depths.size() / 2, 1) +
         "\" text-anchor=\"middle\" transform=\"rotate(-90 18 " + number(top + cell_h * map.depths.size() / 2, 1) +
         ")\">needle depth</text>\n";
  svg += "</svg>\n";
  return svg;
}

}  // namespace kvevict
