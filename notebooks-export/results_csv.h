// The tidy results CSV: one row per (cell, metric). Every table, plot and notebook is
// derived from this file, and sweeps resume from it, so writing must survive a kill -9
// and reading must tell a torn last line (expected after a kill) from real corruption.
#pragma once
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <variant>
#include <vector>

namespace kvevict {

// One line of the results CSV. Optional fields are written as an empty CSV field,
// meaning "not applicable" (e.g. agreement_with_full for the full policy, budget when
// the budget was given in tokens).
struct ResultRow {
  std::string model;
  std::string task;
  std::string policy;
  std::optional<double> budget;  // ratio of the sequence length, in (0, 1]
  std::optional<std::int64_t> budget_tokens;
  std::optional<double> heavy_share;  // fraction of the budget kept for heavy hitters
  std::optional<double> heavy_ratio;
  std::optional<double> recent_ratio;
  int kv_bits = 16;                   // bits per cached key/value element: 16 unquantized, 2 or 4 KIVI
  std::optional<int> kv_group;        // KIVI's group size G and residual R (quantized cells only)
  std::optional<int> kv_residual;
  std::optional<double> kv_memory;    // --kv-memory: the byte budget as a fraction of the fp16 cache
  std::string protocol;  // "stream" or "prefill-compress"
  std::string mode;      // "sim" or "decode"
  std::string score;
  std::string pipeline = "lm-eval";  // "lm-eval" or "h2o"; older files without the column read as lm-eval
  std::optional<int> shots;
  std::optional<std::uint64_t> seed;  // every seed is an unsigned 64-bit integer
  std::optional<int> limit;
  // Long-context tasks: the prompt length in tokens, niah's needle depth, the question
  // protocol, and what fills the context ("noise", "needle", "xsum", ...).
  std::optional<int> length;
  std::optional<double> depth;
  std::string question;
  // SCBench's shared-context evaluation: "multi-turn" or "multi-request" ("" otherwise),
  // the questions asked of each context, and the turn (1-based) a metric row is of
  // (empty: over every turn, or no turns).
  std::string shared_context;
  std::optional<int> turns;
  std::string haystack;
  std::string metric;  // "acc", "acc_norm", "rouge1", "nll", ...
  std::optional<int> turn;
  double value = 0;
  std::optional<double> stderr_;  // standard error of the mean
  int n = 0;                      // examples behind the value
  std::optional<double> agreement_with_full;
  std::optional<double> mean_abs_ll_change;
  std::optional<double> kv_tokens_kept;
  std::optional<std::int64_t> kv_bytes_peak;
  std::optional<std::int64_t> kv_bytes_full;  // the fp16 cache of the tokens held at that peak
  // A DMC model: the share of merge decisions, mean over layers and KV heads (docs/DMC.md).
  std::optional<double> dmc_merge_rate;
  // A policy's pre-pass (KVzip): tokens run per context token scored (harness/runtime/prepass.h).
  std::optional<double> prepass_token_ratio;
  std::optional<double> seconds;
  std::string version;

  // Column name -> the field exactly as written to the CSV ("" when not applicable).
  // Pivots and plots work on this generic view.
  std::map<std::string, std::string> fields() const;
  // The inverse of fields(); throws kvevict::Error naming the column on a bad number.
  // Missing columns are treated as empty.
  static ResultRow from_fields(const std::map<std::string, std::string>& fields);
};

// What a column holds, which decides the code that looks at it.
enum class ColumnRole {
  setting,      // identifies a cell: sweeps resume by these, tables and plots split by them
  derived,      // follows from the settings (heavy_ratio, recent_ratio), so not part of the key
  metric,       // names the measurement
  measurement,  // the value and what it cost; rows differing only here are one cell twice
  provenance,   // which kvevict wrote the row
};

// How a setting shows in figures, tables and labels (none for every other role).
enum class SettingUse {
  none,
  figure,       // one figure (and one table row) per value: the task
  line,         // names every line and table column: the policy
  budget,       // the budget plot's x axis (a ratio or tokens); names the ablation's lines
  heavy_share,  // the ablation's x axis; splits the budget plot's lines when it varies
  context,      // splits lines, and joins their legend, when it varies inside a figure
};

// Whether a cell's one-line label (progress, failures, duplicates) shows the column.
enum class InLabel { no, yes };

// The ResultRow member a column reads and writes; its type decides how the field is
// written and parsed (optional: empty when not applicable; std::string: text).
using ResultField =
    std::variant<std::string ResultRow::*, double ResultRow::*, int ResultRow::*,
                 std::optional<double> ResultRow::*, std::optional<int> ResultRow::*,
                 std::optional<std::int64_t> ResultRow::*, std::optional<std::uint64_t> ResultRow::*>;

struct ResultColumn {
  const char* name;
  ResultField field;
  ColumnRole role;
  SettingUse use = SettingUse::none;
  InLabel in_label = InLabel::no;
  const char* when_empty = nullptr;  // text read for an empty or missing field
  void (*check)(const ResultRow&) = nullptr;  // run after reading and before writing
  bool is_text() const { return std::holds_alternative<std::string ResultRow::*>(field); }
};

// The one list of results columns, in file order: writing, parsing, the header, sweep
// keys, cell labels, how plots split lines, tables and the notebook all come from it. A
// new column is one line there.
const std::vector<ResultColumn>& result_column_table();

// The column names, in file order.
std::vector<std::string> result_columns();
// The column names with one role, in file order.
std::vector<std::string> result_columns(ColumnRole role);
// The setting columns with one use, in file order.
std::vector<std::string> result_columns(SettingUse use);
// The columns a cell's label shows, in file order.
std::vector<std::string> label_columns();
// The names of the columns that hold text rather than numbers, in file order.
std::vector<std::string> text_result_columns();
// The header line, without the newline.
std::string result_header();

// RFC 4180: quotes a field when it contains a comma, quote, CR or LF.
std::string csv_quote(const std::string& field);

// One CSV record as found in a text, with enough position information to report errors
// by line and to truncate a torn tail.
struct CsvRecord {
  std::vector<std::string> fields;
  std::size_t begin = 0;    // byte offset of the first character
  std::size_t end = 0;      // byte offset just after the terminating newline
  int line = 0;             // 1-based physical line where the record starts
  bool terminated = false;  // ended by a newline outside quotes
  std::string problem;      // why the quoting is malformed; empty when well-formed
};

// RFC 4180 splitter. Quoted fields may hold commas, doubled quotes and newlines;
// CRLF line ends are accepted. A quoting error ends the record at the next newline so
// that the following records are still found.
std::vector<CsvRecord> split_csv_records(const std::string& text);
// Shortest text that reads back as the same double ("0.2", not "0.20000000000000001").
std::string format_number(double value);

// One CSV line for the row, without the trailing newline.
std::string format_row(const ResultRow& row);

// Appends the rows (normally all metrics of one cell) with a single write() followed by
// fsync(), writing the header first when the file is new or empty. A kill at any moment
// therefore leaves whole rows plus at most one partial last line. A partial last line
// left by an earlier kill is cut off before appending so it cannot merge with new rows.
// Throws kvevict::Error when the file cannot be written or has a different header.
void append_rows_durably(const std::string& path, const std::vector<ResultRow>& rows);

// Parses a results CSV. A trailing record without a final newline, or with the wrong
// number of fields, is a torn write and is ignored; with repair = true the file is also
// truncated to end after the last whole row. A wrong header or a malformed record
// anywhere else throws kvevict::Error naming file:line.
std::vector<ResultRow> read_results_csv(const std::string& path, bool repair = false);

// read_results_csv for tables, plots and notebooks, which show the text and numbers: also
// refuses (naming file:line and column) a NUL byte, invalid UTF-8, a number that is not
// finite (nan, 1e999), and a file with no rows.
std::vector<ResultRow> read_results_for_export(const std::string& path);

}  // namespace kvevict
