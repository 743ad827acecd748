#include "notebooks-export/notebook.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <sstream>
#include <unistd.h>

#include "harness/common/atomic_file.h"
#include "harness/common/errors.h"
#include "policies/registry.h"
#include "notebook_template.h"  // generated from notebook_template.py: kNotebookTemplate
#include "notebooks-export/svg_plot.h"

namespace kvevict {

namespace {

using nlohmann::json;

// Invalid UTF-8 in a label must not make the whole export fail.
std::string dump_json(const json& value, int indent = -1) {
  return value.dump(indent, ' ', false, json::error_handler_t::replace);
}

// nbformat stores source as a list of lines, each but the last ending in "\n".
json source_lines(const std::string& text) {
  json lines = json::array();
  std::size_t start = 0;
  while (start < text.size()) {
    std::size_t newline = text.find('\n', start);
    std::size_t end = newline == std::string::npos ? text.size() : newline + 1;
    lines.push_back(text.substr(start, end - start));
    start = end;
  }
  return lines;
}

class NotebookBuilder {
 public:
  void markdown(const std::string& text) { add("markdown", text); }
  void code(const std::string& text) { add("code", text); }
  json document() const {
    return {{"cells", cells_},
            {"metadata",
             {{"kernelspec",
               {{"display_name", "Python 3"}, {"language", "python"}, {"name", "python3"}}},
              {"language_info", {{"name", "python"}}}}},
            {"nbformat", 4},
            {"nbformat_minor", 5}};
  }

 private:
  void add(const std::string& type, const std::string& text) {
    json cell = {{"cell_type", type},
                 {"id", "cell-" + std::to_string(cells_.size() + 1)},  // nbformat 4.5
                 {"metadata", json::object()},
                 {"source", source_lines(text)}};
    if (type == "code") {
      cell["execution_count"] = nullptr;
      cell["outputs"] = json::array();
    }
    cells_.push_back(std::move(cell));
  }
  json cells_ = json::array();
};

// A results value as Markdown text: Jupyter renders HTML inside Markdown, so a value
// such as <script>...</script> must arrive as text (&lt;script&gt;), and Markdown's own
// emphasis, link and code syntax in it must not apply.
std::string markdown_text(const std::string& text) {
  std::string out;
  for (char c : text) {
    switch (c) {
      case '&': out += "&amp;"; break;
      case '<': out += "&lt;"; break;
      case '>': out += "&gt;"; break;
      case '"': out += "&quot;"; break;
      case '\n': case '\r': out += ' '; break;
      default:
        if (std::string("\\`*_[]").find(c) != std::string::npos) out += '\\';
        out += c;
    }
  }
  return out;
}

std::string distinct_list(const std::vector<ResultRow>& rows,
                          std::string ResultRow::*member) {
  std::vector<std::string> values;
  std::set<std::string> seen;
  for (const auto& row : rows)
    if (seen.insert(row.*member).second) values.push_back(row.*member);
  std::string list;
  for (const auto& value : values) list += (list.empty() ? "" : ", ") + markdown_text(value);
  return list.empty() ? "(none)" : list;
}

// "model, task, policy": column names in prose.
std::string joined(const std::vector<std::string>& names) {
  std::string text;
  for (const auto& name : names) text += (text.empty() ? "" : ", ") + name;
  return text;
}

// A Python list literal of strings, e.g. ["model", "task"].
std::string python_list(const std::vector<std::string>& items) {
  std::string list;
  for (const auto& item : items) list += (list.empty() ? "" : ", ") + dump_json(item);
  return "[" + list + "]";
}

// The code cells of notebook_template.py by name, with each {{NAME}} filled in.
std::map<std::string, std::string> code_cells() {
  const std::map<std::string, std::string> literals = {
      {"{{TEXT_COLUMNS}}", python_list(text_result_columns())},
      {"{{BUDGET_SPLIT}}", python_list(budget_split_columns())},
      {"{{ABLATION_SPLIT}}", python_list(ablation_split_columns())},
      {"{{REFERENCE_POLICY}}", dump_json(reference_policy_name())}};
  const std::string marker = "# %% ";
  std::map<std::string, std::string> cells;
  std::string* cell = nullptr;  // the text before the first marker is the file's own comment
  std::istringstream in(kNotebookTemplate);
  for (std::string line; std::getline(in, line);) {
    if (line.compare(0, marker.size(), marker) == 0) {
      cell = &cells[line.substr(marker.size())];
      continue;
    }
    for (const auto& [name, literal] : literals)
      for (auto at = line.find(name); at != std::string::npos; at = line.find(name, at))
        line.replace(at, name.size(), literal);
    if (cell) *cell += line + "\n";
  }
  for (auto& entry : cells)
    while (!entry.second.empty() && entry.second.back() == '\n') entry.second.pop_back();
  return cells;
}

std::string embedded_data_code(const std::vector<ResultRow>& rows) {
  // One CSV record per list entry keeps the data readable and diffable; JSON string
  // literals are valid Python string literals.
  std::string code =
      "# The results CSV this notebook was generated from, one record per entry.\n"
      "CSV_RECORDS = [\n";
  code += "    " + dump_json(result_header()) + ",\n";
  for (const auto& row : rows) code += "    " + dump_json(format_row(row)) + ",\n";
  code += "]";
  return code;
}

}  // namespace

std::string notebook_json(const std::vector<ResultRow>& rows) {
  NotebookBuilder notebook;
  notebook.markdown(
      "# kvevict results\n"
      "\n"
      "Generated by kvevict from a tidy results CSV: " +
      std::to_string(rows.size()) + " rows.\n"
      "\n"
      "- models: " + distinct_list(rows, &ResultRow::model) + "\n"
      "- tasks: " + distinct_list(rows, &ResultRow::task) + "\n"
      "- policies: " + distinct_list(rows, &ResultRow::policy) + "\n"
      "- metrics: " + distinct_list(rows, &ResultRow::metric) + "\n"
      "\n"
      "The data is embedded below, so the notebook runs without the original file. "
      "Regenerate the notebook from the CSV rather than editing the data cell.");
  const auto code = code_cells();
  notebook.code(code.at("setup"));
  notebook.markdown(
      "## The data\n"
      "\n"
      "One row per (" + joined(result_columns(ColumnRole::setting)) + ", " + joined(result_columns(ColumnRole::metric)) +
      "). `budget` is the fraction of the sequence kept in the KV cache (empty when "
      "the budget was given in tokens, `budget_tokens`); `heavy_share` is the part of the "
      "budget given to heavy hitters, the rest going to recent tokens. Empty fields mean "
      "*not applicable* and load as NaN.");
  notebook.code(embedded_data_code(rows));
  notebook.code(code.at("load"));
  notebook.markdown(
      "## Helpers\n"
      "\n"
      "A figure is split into one line per policy, and further by any setting (" + joined(budget_split_columns()) +
      ") that varies inside it; the legend names those settings. Repeated points are averaged. Error bars show one standard error.");
  notebook.code(code.at("helpers"));
  notebook.markdown(
      "## Metric against KV budget\n"
      "\n"
      "One figure per (task, metric), one line per policy. A policy run without a budget "
      "(the full cache) is the dashed horizontal baseline. Figures without budgeted rows "
      "are skipped.");
  notebook.code(code.at("budget"));
  notebook.markdown(
      "## Heavy-hitter share ablation\n"
      "\n"
      "For each (task, metric), the metric against the share of the budget given to heavy "
      "hitters, one line per policy and budget. Only settings run at two or more heavy "
      "shares are drawn.");
  notebook.code(code.at("heavy_share"));
  return dump_json(notebook.document(), 1) + "\n";
}

void write_notebook(const std::vector<ResultRow>& rows, const std::string& ipynb_path) {
  write_file_atomically(ipynb_path, notebook_json(rows));
}

}  // namespace kvevict
