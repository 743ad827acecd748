#include "notebooks-export/results_table.h"

#include <algorithm>
#include <cctype>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <set>

#include "harness/common/errors.h"
#include "policies/registry.h"

namespace kvevict {

namespace {

// Columns that hold measurements rather than settings; two rows that differ only in
// these are the same cell recorded twice, not a missing filter.
bool is_measured_column(const std::string& column) {
  static const auto measured = result_columns(ColumnRole::measurement);
  return std::find(measured.begin(), measured.end(), column) != measured.end();
}

std::string trim(const std::string& text) {
  std::size_t begin = 0, end = text.size();
  while (begin < end && std::isspace(static_cast<unsigned char>(text[begin]))) ++begin;
  while (end > begin && std::isspace(static_cast<unsigned char>(text[end - 1]))) --end;
  return text.substr(begin, end - begin);
}

std::string known_columns_list() {
  std::string list;
  for (const auto& column : result_columns()) list += (list.empty() ? "" : ", ") + column;
  return list;
}

void require_known_column(const std::string& column, const std::string& context) {
  const auto columns = result_columns();
  if (std::find(columns.begin(), columns.end(), column) == columns.end())
    throw Error("unknown results column '" + column + "' in " + context + "; columns are " +
                known_columns_list());
}

std::vector<std::string> parse_key(const std::string& key, const std::string& what) {
  std::vector<std::string> columns;
  std::size_t start = 0;
  while (true) {
    std::size_t comma = key.find(',', start);
    std::string column = trim(key.substr(start, comma == std::string::npos ? std::string::npos
                                                                            : comma - start));
    if (column.empty()) throw Error(what + " '" + key + "' names an empty column");
    require_known_column(column, what + " '" + key + "'");
    columns.push_back(column);
    if (comma == std::string::npos) break;
    start = comma + 1;
  }
  return columns;
}

std::optional<double> as_number(const std::string& text) {
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0]))) return std::nullopt;
  char* end = nullptr;
  double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) return std::nullopt;
  return value;
}

struct Filter {
  std::string column;
  std::string value;
  bool matches(const std::map<std::string, std::string>& fields) const {
    const std::string& actual = fields.at(column);
    // An empty field means "not applicable": budget=0.2 keeps the full-cache baseline,
    // which has no budget. "key=" (empty value) selects exactly the empty fields.
    if (actual.empty()) return true;
    auto actual_number = as_number(actual), wanted_number = as_number(value);
    if (actual_number && wanted_number) return *actual_number == *wanted_number;
    return actual == value;
  }
};

Filter parse_filter(const std::string& text) {
  std::size_t equals = text.find('=');
  if (equals == std::string::npos)
    throw Error("filter '" + text + "' must look like key=value (e.g. budget=0.2)");
  Filter filter{trim(text.substr(0, equals)), trim(text.substr(equals + 1))};
  require_known_column(filter.column, "filter '" + text + "'");
  return filter;
}

std::vector<std::string> project(const std::map<std::string, std::string>& fields,
                                 const std::vector<std::string>& columns) {
  std::vector<std::string> values;
  for (const auto& column : columns) values.push_back(fields.at(column));
  return values;
}

std::string join(const std::vector<std::string>& parts, const std::string& separator) {
  std::string joined;
  for (std::size_t i = 0; i < parts.size(); ++i) joined += (i ? separator : "") + parts[i];
  return joined;
}

std::string describe(const std::vector<std::string>& columns,
                     const std::vector<std::string>& values) {
  std::vector<std::string> parts;
  for (std::size_t i = 0; i < columns.size(); ++i) parts.push_back(columns[i] + "=" + values[i]);
  return join(parts, ", ");
}

// Labels in first-appearance order, except that a single numeric key (budget, heavy
// share, shots) is sorted by value, empty first, since a resumed sweep appends cells
// out of order; and the full-cache baseline leads when the key includes the policy:
// every table reads as "baseline, then the policies".
std::vector<std::vector<std::string>> order_labels(
    std::vector<std::vector<std::string>> labels, const std::vector<std::string>& key) {
  auto numeric = [](const std::string& text, double* value) {
    char* end = nullptr;
    *value = std::strtod(text.c_str(), &end);
    return !text.empty() && end && *end == '\0';
  };
  bool all_numeric = key.size() == 1;
  double unused;
  for (const auto& label : labels)
    all_numeric = all_numeric && (label[0].empty() || numeric(label[0], &unused));
  if (all_numeric)
    std::stable_sort(labels.begin(), labels.end(), [&](const auto& a, const auto& b) {
      double x = -1e300, y = -1e300;
      if (!a[0].empty()) numeric(a[0], &x);
      if (!b[0].empty()) numeric(b[0], &y);
      return x < y;
    });
  auto policy = std::find(key.begin(), key.end(), "policy");
  if (policy != key.end()) {
    std::size_t index = static_cast<std::size_t>(policy - key.begin());
    std::stable_partition(labels.begin(), labels.end(),
                          [&](const auto& label) { return is_reference_policy(label[index]); });
  }
  return labels;
}

[[noreturn]] void throw_duplicate(const std::map<std::string, std::string>& first,
                                  const std::map<std::string, std::string>& second,
                                  const std::vector<std::string>& row_key,
                                  const std::vector<std::string>& column_key,
                                  const std::vector<std::string>& row_label,
                                  const std::vector<std::string>& column_label) {
  std::vector<std::string> differences;
  std::string suggestion;
  for (const auto& column : result_columns()) {
    if (is_measured_column(column) || first.at(column) == second.at(column)) continue;
    differences.push_back(column + " ('" + first.at(column) + "' vs '" + second.at(column) +
                          "')");
    if (suggestion.empty()) suggestion = column + "=" + first.at(column);
  }
  std::string cell = describe(row_key, row_label) + " / " + describe(column_key, column_label);
  if (differences.empty())
    throw Error("pivot cell " + cell +
                " appears twice with identical settings; the results CSV repeats a cell "
                "(deduplicate it)");
  throw Error("pivot cell " + cell + " has several results that differ in " +
              join(differences, ", ") + "; add a filter such as " + suggestion +
              " (or put that column in the row or column key)");
}

// A table.csv field that a spreadsheet will not run as a formula (OWASP, CSV injection):
// text starting with =, +, -, @, a tab or a carriage return gets a leading ' (numbers
// such as -0.5 stay numbers), then RFC 4180 quoting.
std::string spreadsheet_field(const std::string& text) {
  const bool formula_start = !text.empty() && std::string("=+-@\t\r").find(text[0]) != std::string::npos;
  if (formula_start && !as_number(text)) return csv_quote("'" + text);
  return csv_quote(text);
}

std::string escape_markdown(const std::string& text) {
  if (text.empty()) return "n/a";  // an empty key field: e.g. the full cache's budget
  std::string escaped;
  for (char c : text) {
    if (c == '|') escaped += '\\';
    escaped += (c == '\n' || c == '\r') ? ' ' : c;
  }
  return escaped;
}

}  // namespace

std::string format_table_value(double value) {
  char buffer[64];
  std::snprintf(buffer, sizeof buffer, "%.4f", value);
  return buffer;
}

PivotTable pivot_results(const std::vector<ResultRow>& rows, const PivotOptions& options) {
  std::vector<std::string> row_key = parse_key(options.row_key, "row key");
  std::vector<std::string> column_key = parse_key(options.column_key, "column key");
  for (const auto& column : column_key)
    if (std::find(row_key.begin(), row_key.end(), column) != row_key.end())
      throw Error("column '" + column + "' is in both the row key and the column key");

  std::vector<Filter> filters;
  for (const auto& text : options.filters) filters.push_back(parse_filter(text));
  if (!options.metric.empty()) {
    filters.push_back(Filter{"metric", options.metric});
  } else if (std::find(row_key.begin(), row_key.end(), "metric") == row_key.end() &&
             std::find(column_key.begin(), column_key.end(), "metric") == column_key.end()) {
    row_key.push_back("metric");  // otherwise acc and acc_norm would collide
  }
  // A shared-context evaluation's rows per turn beside its overall row would collide too.
  if (std::find(row_key.begin(), row_key.end(), "turn") == row_key.end() &&
      std::find(column_key.begin(), column_key.end(), "turn") == column_key.end() &&
      std::any_of(rows.begin(), rows.end(), [](const ResultRow& row) { return row.turn.has_value(); }))
    row_key.push_back("turn");

  // Pass 1: keep matching rows and collect labels in first-appearance order.
  std::vector<std::map<std::string, std::string>> kept;
  std::vector<std::vector<std::string>> row_labels, column_labels;
  std::set<std::vector<std::string>> seen_rows, seen_columns;
  for (const auto& row : rows) {
    auto fields = row.fields();
    bool keep = std::all_of(filters.begin(), filters.end(),
                            [&](const Filter& filter) { return filter.matches(fields); });
    if (!keep) continue;
    auto row_label = project(fields, row_key), column_label = project(fields, column_key);
    if (seen_rows.insert(row_label).second) row_labels.push_back(row_label);
    if (seen_columns.insert(column_label).second) column_labels.push_back(column_label);
    kept.push_back(std::move(fields));
  }
  row_labels = order_labels(std::move(row_labels), row_key);
  column_labels = order_labels(std::move(column_labels), column_key);

  std::map<std::vector<std::string>, std::size_t> row_index, column_index;
  for (std::size_t i = 0; i < row_labels.size(); ++i) row_index[row_labels[i]] = i;
  for (std::size_t i = 0; i < column_labels.size(); ++i) column_index[column_labels[i]] = i;

  PivotTable table;
  table.row_key_columns = row_key;
  table.row_labels = row_labels;
  for (const auto& label : column_labels) table.column_labels.push_back(join(label, ", "));
  table.cells.assign(row_labels.size(),
                     std::vector<std::optional<PivotCell>>(column_labels.size()));

  // Pass 2: fill cells, remembering which source row filled each to explain collisions.
  std::vector<std::vector<const std::map<std::string, std::string>*>> source(
      row_labels.size(), std::vector<const std::map<std::string, std::string>*>(
                             column_labels.size(), nullptr));
  for (const auto& fields : kept) {
    auto row_label = project(fields, row_key), column_label = project(fields, column_key);
    std::size_t r = row_index.at(row_label), c = column_index.at(column_label);
    if (source[r][c])
      throw_duplicate(*source[r][c], fields, row_key, column_key, row_label, column_label);
    source[r][c] = &fields;
    PivotCell cell;
    cell.value = *as_number(fields.at("value"));
    cell.stderr_ = as_number(fields.at("stderr"));
    table.cells[r][c] = cell;
  }
  return table;
}

std::string PivotTable::to_markdown() const {
  std::vector<std::string> header;
  for (const auto& column : row_key_columns) header.push_back(escape_markdown(column));
  for (const auto& label : column_labels) header.push_back(escape_markdown(label));
  std::string text = "| " + join(header, " | ") + " |\n|";
  for (std::size_t i = 0; i < row_key_columns.size(); ++i) text += "---|";
  for (std::size_t i = 0; i < column_labels.size(); ++i) text += "---:|";  // numbers align right
  text += "\n";
  for (std::size_t r = 0; r < row_labels.size(); ++r) {
    std::vector<std::string> line;
    for (const auto& label : row_labels[r]) line.push_back(escape_markdown(label));
    for (const auto& cell : cells[r]) {
      std::string shown;
      if (cell) {
        shown = format_table_value(cell->value);
        if (cell->stderr_) shown += " (" + format_table_value(*cell->stderr_) + ")";
      }
      line.push_back(shown);
    }
    text += "| " + join(line, " | ") + " |\n";
  }
  return text;
}

std::string PivotTable::to_csv() const {
  std::vector<std::string> header;
  for (const auto& column : row_key_columns) header.push_back(spreadsheet_field(column));
  for (const auto& label : column_labels) header.push_back(spreadsheet_field(label));
  std::string text = join(header, ",") + "\n";
  for (std::size_t r = 0; r < row_labels.size(); ++r) {
    std::vector<std::string> line;
    for (const auto& label : row_labels[r]) line.push_back(spreadsheet_field(label));
    for (const auto& cell : cells[r]) line.push_back(cell ? format_table_value(cell->value) : "");
    text += join(line, ",") + "\n";
  }
  return text;
}

}  // namespace kvevict
