// Pivot tables over result rows: e.g. task down the side, policy across the top,
// filtered to one budget. Output as Markdown (value with stderr) or CSV (value only).
#pragma once
#include <optional>
#include <string>
#include <vector>

#include "notebooks-export/results_csv.h"

namespace kvevict {

struct PivotOptions {
  // Column names of the results CSV; several may be joined with commas ("task,shots").
  std::string row_key = "task";
  std::string column_key = "policy";
  // "key=value" conditions that must all hold. Compared as numbers when both sides
  // parse as numbers (budget=0.2 matches 0.20), otherwise as exact strings. A row whose
  // field is empty (not applicable) passes any filter on it, so budget=0.2 keeps the
  // full-cache baseline; "key=" (empty value) keeps only rows where the field is empty.
  std::vector<std::string> filters;
  // Keep only this metric. When empty, "metric" is added to the row key instead.
  std::string metric;
};

struct PivotCell {
  double value = 0;
  std::optional<double> stderr_;
};

struct PivotTable {
  std::vector<std::string> row_key_columns;          // e.g. {"task", "metric"}
  std::vector<std::vector<std::string>> row_labels;  // one entry per row key column
  std::vector<std::string> column_labels;            // column key values (joined by ", ")
  std::vector<std::vector<std::optional<PivotCell>>> cells;  // [row][column]

  // "| task | full | h2o |" ... with "0.7200 (0.0451)" cells; missing cells are empty.
  std::string to_markdown() const;
  // Row key columns then one column per column label; values only, no stderr.
  std::string to_csv() const;
};

// Throws kvevict::Error for an unknown column, a malformed filter, or two rows landing
// in the same cell (the message names the columns a filter should pin down).
PivotTable pivot_results(const std::vector<ResultRow>& rows, const PivotOptions& options);

// Four decimals: the precision the tables report.
std::string format_table_value(double value);

}  // namespace kvevict
