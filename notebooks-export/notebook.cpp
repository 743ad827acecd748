#include "notebooks-export/notebook.h"

#include <cstdio>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>
#include <unistd.h>

#include "harness/common/errors.h"

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

std::string distinct_list(const std::vector<ResultRow>& rows,
                          std::string ResultRow::*member) {
  std::vector<std::string> values;
  std::set<std::string> seen;
  for (const auto& row : rows)
    if (seen.insert(row.*member).second) values.push_back(row.*member);
  std::string list;
  for (const auto& value : values) list += (list.empty() ? "" : ", ") + value;
  return list.empty() ? "(none)" : list;
}

const char* const kSetupCode = R"py(import io

import matplotlib

matplotlib.use("Agg")  # headless; figures are rendered to PNG and displayed explicitly
import matplotlib.pyplot as plt
import numpy as np
import pandas as pd
from IPython.display import Image, display


def show(fig):
    """Shows a figure as this cell's output whatever the backend, then frees it."""
    buffer = io.BytesIO()
    fig.savefig(buffer, format="png", dpi=100, bbox_inches="tight")
    plt.close(fig)
    display(Image(data=buffer.getvalue())))py";

// A Python list literal of strings, e.g. ["model", "task"].
std::string python_list(const std::vector<std::string>& items) {
  std::string list;
  for (const auto& item : items) list += (list.empty() ? "" : ", ") + dump_json(item);
  return "[" + list + "]";
}

// Follows "TEXT_COLUMNS = [...]\n", which comes from the column table.
const char* const kLoadCode = R"py(
# Read everything as text first so that names such as "NA" stay names, then convert
# the numeric columns; an empty field means "not applicable" and becomes NaN.
df = pd.read_csv(io.StringIO("\n".join(CSV_RECORDS) + "\n"), dtype=str, keep_default_na=False)
for column in df.columns:
    if column not in TEXT_COLUMNS:
        df[column] = pd.to_numeric(df[column].mask(df[column] == ""))

df.groupby(["task", "metric", "policy"], sort=False).size().rename("rows").to_frame())py";

const char* const kHelperCode = R"py(# Settings that split a figure into several lines when they vary inside it.
# heavy_ratio / recent_ratio follow from budget x heavy_share, so they never split lines.
BUDGET_SPLIT = ["model", "protocol", "mode", "score", "pipeline", "shots", "limit", "seed", "heavy_share"]
ABLATION_SPLIT = ["model", "protocol", "mode", "score", "pipeline", "shots", "limit", "seed"]


def text(value):
    """A setting as the CSV writes it: integers without '.0', blank when not applicable."""
    if isinstance(value, float):
        if value != value:
            return ""
        return str(int(value)) if value.is_integer() else repr(value)
    return str(value)


def varying(frame, columns):
    return [c for c in columns if frame[c].map(text).nunique() > 1]


def label(policy, columns, row):
    extras = ", ".join(f"{c}={text(row[c])}" for c in columns if text(row[c]))
    return f"{policy} ({extras})" if extras else policy


def add(series, key, policy, line_label, reference, x, row):
    entry = series.setdefault(
        key, {"policy": policy, "label": line_label, "reference": reference, "samples": []})
    entry["samples"].append((float(x), row["value"], row["stderr"]))


def finish(series, minimum_distinct_x):
    """Averages repeated x values; drops short lines; the full-cache baseline goes first."""
    lines = []
    for entry in series.values():
        samples = pd.DataFrame(entry["samples"], columns=["x", "y", "err"], dtype=float)
        samples = samples[np.isfinite(samples["x"]) & np.isfinite(samples["y"])]
        points = samples.groupby("x", sort=True).mean()
        if len(points) == 0 or len(points) < minimum_distinct_x:
            continue
        lines.append(dict(entry, points=points))
    lines.sort(key=lambda line: line["policy"] != "full")  # stable: keeps first appearance
    return lines


def draw(lines, title, x_title, y_title):
    fig, ax = plt.subplots(figsize=(7, 4.2))
    for i, line in enumerate(lines):
        colour = f"C{i % 10}"
        points = line["points"]
        if line["reference"]:
            ax.axhline(points["y"].iloc[0], color=colour, linestyle="--", label=line["label"])
        else:
            err = points["err"] if points["err"].notna().any() else None
            ax.errorbar(points.index, points["y"], yerr=err, color=colour, marker="o",
                        capsize=3, label=line["label"])
    ax.set_title(title)
    ax.set_xlabel(x_title)
    ax.set_ylabel(y_title)
    ax.grid(alpha=0.3)
    ax.legend(loc="center left", bbox_to_anchor=(1.02, 0.5), fontsize="small")
    show(fig))py";

const char* const kBudgetCode = R"py(X_TITLES = {"budget": "KV budget (fraction of the sequence)", "budget_tokens": "KV budget (tokens)"}
plotted = 0
for (task, metric), group in df.groupby(["task", "metric"], sort=False):
    if group["budget"].notna().any():
        x_column = "budget"
    elif group["budget_tokens"].notna().any():
        x_column = "budget_tokens"
    else:
        print(f"{task} / {metric}: no budgeted rows, no figure")
        continue
    swept = group[group[x_column].notna()]
    baseline = group[group["budget"].isna() & group["budget_tokens"].isna()]
    swept_split, baseline_split = varying(swept, BUDGET_SPLIT), varying(baseline, BUDGET_SPLIT)
    series = {}
    for row in swept.to_dict("records"):
        key = ("swept", row["policy"]) + tuple(text(row[c]) for c in swept_split)
        add(series, key, row["policy"], label(row["policy"], swept_split, row), False,
            row[x_column], row)
    for row in baseline.to_dict("records"):
        key = ("baseline", row["policy"]) + tuple(text(row[c]) for c in baseline_split)
        add(series, key, row["policy"], label(row["policy"], baseline_split, row), True, 0.0, row)
    lines = finish(series, 1)
    if not any(not line["reference"] for line in lines):
        print(f"{task} / {metric}: no finite values, no figure")
        continue
    draw(lines, f"{task}: {metric} vs budget", X_TITLES[x_column], metric)
    plotted += 1
if plotted == 0:
    print("No budget sweeps in these results."))py";

const char* const kHeavyShareCode = R"py(plotted = 0
for (task, metric), group in df.groupby(["task", "metric"], sort=False):
    ablation = group[group["heavy_share"].notna()]
    split = varying(ablation, ABLATION_SPLIT)
    series = {}
    for row in ablation.to_dict("records"):
        # The budget always names the line: the ablation reads "at budget B".
        budget_column = ("budget" if text(row["budget"]) else
                         "budget_tokens" if text(row["budget_tokens"]) else None)
        label_columns = ([budget_column] if budget_column else []) + split
        key = (row["policy"], text(row["budget"]), text(row["budget_tokens"]))
        key += tuple(text(row[c]) for c in split)
        add(series, key, row["policy"], label(row["policy"], label_columns, row), False,
            row["heavy_share"], row)
    lines = finish(series, 2)  # a line needs at least two heavy shares
    if not lines:
        continue
    draw(lines, f"{task}: {metric} vs heavy-hitter share", "heavy-hitter share of the budget",
         metric)
    plotted += 1
if plotted == 0:
    print("No heavy-share ablation in these results (no setting was run at several heavy shares)."))py";

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
  notebook.code(kSetupCode);
  notebook.markdown(
      "## The data\n"
      "\n"
      "One row per (model, task, policy, budget, heavy share, protocol, shots, seed, "
      "metric). `budget` is the fraction of the sequence kept in the KV cache (empty when "
      "the budget was given in tokens, `budget_tokens`); `heavy_share` is the part of the "
      "budget given to heavy hitters, the rest going to recent tokens. Empty fields mean "
      "*not applicable* and load as NaN.");
  notebook.code(embedded_data_code(rows));
  notebook.code("TEXT_COLUMNS = " + python_list(text_result_columns()) + "\n" + kLoadCode);
  notebook.markdown(
      "## Helpers\n"
      "\n"
      "A figure is split into one line per policy, and further by any setting (model, "
      "protocol, shots, seed, heavy share, ...) that varies inside it; the legend names "
      "those settings. Repeated points are averaged. Error bars show one standard error.");
  notebook.code(kHelperCode);
  notebook.markdown(
      "## Metric against KV budget\n"
      "\n"
      "One figure per (task, metric), one line per policy. A policy run without a budget "
      "(the full cache) is the dashed horizontal baseline. Figures without budgeted rows "
      "are skipped.");
  notebook.code(kBudgetCode);
  notebook.markdown(
      "## Heavy-hitter share ablation\n"
      "\n"
      "For each (task, metric), the metric against the share of the budget given to heavy "
      "hitters, one line per policy and budget. Only settings run at two or more heavy "
      "shares are drawn.");
  notebook.code(kHeavyShareCode);
  return dump_json(notebook.document(), 1) + "\n";
}

void write_notebook(const std::vector<ResultRow>& rows, const std::string& ipynb_path) {
  const std::string text = notebook_json(rows);
  const std::string temporary = ipynb_path + ".tmp" + std::to_string(::getpid());
  {
    std::ofstream out(temporary, std::ios::binary | std::ios::trunc);
    out << text;
    out.close();
    if (!out) {
      std::remove(temporary.c_str());
      throw Error(ipynb_path + ": cannot write notebook");
    }
  }
  std::error_code error;
  std::filesystem::rename(temporary, ipynb_path, error);
  if (error) {
    std::remove(temporary.c_str());
    throw Error(ipynb_path + ": cannot write notebook: " + error.message());
  }
}

}  // namespace kvevict
