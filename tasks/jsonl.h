// Reading the shipped data files (JSONL, plain line lists, TSV). Every problem is a
// kvevict::Error naming the file, and the line where there is one.
#pragma once
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/common/errors.h"

namespace kvevict {

// One parsed JSONL line and where it came from.
struct JsonLine {
  std::string file;
  int line = 0;  // 1-based
  nlohmann::json value;

  std::string where() const { return file + ":" + std::to_string(line); }
  [[noreturn]] void fail(const std::string& what) const { throw Error(where() + ": " + what); }
  // Typed field access; a missing or mistyped field fails with file:line.
  const nlohmann::json& field(const std::string& key) const;
  std::string string_field(const std::string& key) const;
  long long int_field(const std::string& key) const;
};

// Every non-blank line of a JSONL file, each a JSON object.
std::vector<JsonLine> read_jsonl(const std::string& path);

// One line of a plain text file (a label list), "\r" removed.
struct TextLine {
  int line = 0;  // 1-based
  std::string text;
};
// Every line of the file; a final line break does not add an empty line.
std::vector<TextLine> read_text_lines(const std::string& path);

// A tab-separated table with a header row.
struct TsvRow {
  int line = 0;
  std::vector<std::string> cells;
};
struct TsvTable {
  std::string file;
  std::vector<std::string> header;
  std::vector<TsvRow> rows;
  // Index of the named header column; Error naming the file if absent.
  size_t column(const std::string& name) const;
};
// Rows must have as many cells as the header (Error naming file:line otherwise).
TsvTable read_tsv(const std::string& path);

// Joins the data directory and a file inside it; Error when no directory was given.
std::string data_file(const std::string& data_dir, const std::string& relative);

}  // namespace kvevict
