#include "tasks/jsonl.h"

#include <filesystem>
#include <fstream>

#include "harness/common/files.h"

namespace kvevict {
namespace {

std::ifstream open_data_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error("missing data file: " + path);
  return in;
}

bool is_blank(const std::string& s) { return s.find_first_not_of(" \t\r\n") == std::string::npos; }

}  // namespace

const nlohmann::json& JsonLine::field(const std::string& key) const {
  auto it = value.find(key);
  if (it == value.end()) fail("missing field \"" + key + "\"");
  return *it;
}

std::string JsonLine::string_field(const std::string& key) const {
  const auto& f = field(key);
  if (!f.is_string()) fail("field \"" + key + "\" is not a string");
  return f.get<std::string>();
}

long long JsonLine::int_field(const std::string& key) const {
  const auto& f = field(key);
  if (!f.is_number_integer()) fail("field \"" + key + "\" is not an integer");
  return f.get<long long>();
}

std::vector<JsonLine> read_jsonl(const std::string& path) {
  auto in = open_data_file(path);
  std::vector<JsonLine> rows;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (is_blank(text)) continue;
    JsonLine row{path, line, {}};
    row.value = parse_json(text, row.where());
    if (!row.value.is_object()) row.fail("expected a JSON object");
    rows.push_back(std::move(row));
  }
  return rows;
}

std::vector<TextLine> read_text_lines(const std::string& path) {
  auto in = open_data_file(path);
  std::vector<TextLine> lines;
  std::string text;
  for (int line = 1; std::getline(in, text); ++line) {
    if (!text.empty() && text.back() == '\r') text.pop_back();
    lines.push_back({line, text});
  }
  return lines;
}

size_t TsvTable::column(const std::string& name) const {
  for (size_t i = 0; i < header.size(); ++i)
    if (header[i] == name) return i;
  throw Error(file + ": no column \"" + name + "\" in the header");
}

TsvTable read_tsv(const std::string& path) {
  TsvTable table{path, {}, {}};
  for (auto& [line, text] : read_text_lines(path)) {
    if (text.empty()) continue;
    std::vector<std::string> cells;
    for (size_t start = 0;;) {
      const size_t tab = text.find('\t', start);
      cells.push_back(text.substr(start, tab - start));
      if (tab == std::string::npos) break;
      start = tab + 1;
    }
    if (table.header.empty()) {
      table.header = std::move(cells);
    } else if (cells.size() != table.header.size()) {
      throw Error(path + ":" + std::to_string(line) + ": expected " +
                  std::to_string(table.header.size()) + " tab-separated cells, found " +
                  std::to_string(cells.size()));
    } else {
      table.rows.push_back({line, std::move(cells)});
    }
  }
  if (table.header.empty()) throw Error(path + ": empty TSV file (no header row)");
  return table;
}

std::string data_file(const std::string& data_dir, const std::string& relative) {
  if (data_dir.empty()) throw Error("no data directory given for " + relative);
  return (std::filesystem::path(data_dir) / relative).string();
}

}  // namespace kvevict
