// results.csv -> exports: the export reader (read_results_for_export), then the table
// (Markdown and CSV), the notebook and every SVG plot, as `kvevict table` and `kvevict
// export` make them. Each output must be valid UTF-8 without NUL bytes, the notebook
// valid JSON, and table.csv free of cells a spreadsheet would run as formulas.
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "harness/common/utf8.h"
#include "notebooks-export/notebook.h"
#include "notebooks-export/results_csv.h"
#include "notebooks-export/results_table.h"
#include "notebooks-export/svg_plot.h"

namespace {
void require_text(const std::string& text) {
  if (text.find('\0') != std::string::npos) __builtin_trap();
  for (size_t at = 0; at < text.size();) {
    const kvevict::Utf8Char c = kvevict::decode_utf8_at(text, at);
    if (!c.valid) __builtin_trap();
    at += c.length;
  }
}
// No field of table.csv starts a formula (OWASP): after a line start or a comma, an
// unquoted =, +, -, @ must be a number's sign (- or +) or not be there at all.
void require_no_formula(const std::string& csv) {
  for (size_t i = 0; i < csv.size(); ++i) {
    const bool field_start = i == 0 || csv[i - 1] == ',' || csv[i - 1] == '\n';
    if (!field_start) continue;
    const char c = csv[i] == '"' && i + 1 < csv.size() ? csv[i + 1] : csv[i];
    if (c == '=' || c == '@' || c == '\t') __builtin_trap();
  }
}
}  // namespace

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  const std::string path = kvevict::fuzz::scratch_file("results.csv", data, size);
  std::vector<kvevict::ResultRow> rows;
  try {
    rows = kvevict::read_results_for_export(path);
  } catch (const kvevict::Error&) {
    return 0;
  }
  try {
    kvevict::PivotOptions options;  // kvevict table's defaults: task down, policy across
    const kvevict::PivotTable table = kvevict::pivot_results(rows, options);
    require_text(table.to_markdown());
    const std::string csv = table.to_csv();
    require_text(csv);
    require_no_formula(csv);
  } catch (const kvevict::Error&) {
  }
  const std::string notebook = kvevict::notebook_json(rows);
  require_text(notebook);
  if (!nlohmann::json::accept(notebook)) __builtin_trap();
  for (const auto& plot : kvevict::budget_plots(rows)) require_text(kvevict::render_svg(plot));
  for (const auto& plot : kvevict::heavy_share_plots(rows)) require_text(kvevict::render_svg(plot));
  return 0;
}
