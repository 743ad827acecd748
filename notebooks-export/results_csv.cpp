#include "notebooks-export/results_csv.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <charconv>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <sstream>

#include "harness/common/errors.h"
#include "harness/common/kill_points.h"
#include "harness/common/utf8.h"

namespace kvevict {

namespace {

const std::vector<std::string> kColumns = result_columns();

// A header from an earlier kvevict: some of today's columns, in today's order, one of
// them missing at least (newer columns were added, e.g. pipeline, length). Such files
// read, their missing columns as empty (or the column's when_empty), and an append
// first rewrites them with the current header.
bool is_older_header(const std::vector<std::string>& fields) {
  if (fields == kColumns) return false;
  for (const char* needed : {"model", "task", "policy", "metric", "value"})
    if (std::find(fields.begin(), fields.end(), needed) == fields.end()) return false;
  std::size_t next = 0;
  for (const auto& field : fields) {
    while (next < kColumns.size() && kColumns[next] != field) ++next;
    if (next == kColumns.size()) return false;
    ++next;
  }
  return true;
}

std::vector<std::string> header_fields(const std::string& line) {
  std::vector<std::string> fields;
  std::size_t begin = 0;
  for (std::size_t comma; (comma = line.find(',', begin)) != std::string::npos; begin = comma + 1)
    fields.push_back(line.substr(begin, comma - begin));
  fields.push_back(line.substr(begin));
  return fields;
}

std::string system_error(const std::string& what) {
  return what + ": " + std::strerror(errno);
}

// Closes a file descriptor on every exit path.
struct FileDescriptor {
  int fd;
  explicit FileDescriptor(int fd_) : fd(fd_) {}
  ~FileDescriptor() {
    if (fd >= 0) ::close(fd);
  }
  FileDescriptor(const FileDescriptor&) = delete;
  FileDescriptor& operator=(const FileDescriptor&) = delete;
};

std::string field_or_empty(const std::map<std::string, std::string>& fields,
                           const std::string& column) {
  auto it = fields.find(column);
  return it == fields.end() ? std::string() : it->second;
}

[[noreturn]] void bad_number(const std::string& column, const std::string& text,
                             const char* expected) {
  throw Error("column '" + column + "': expected " + expected + ", got '" + text + "'");
}

double parse_double(const std::string& column, const std::string& text) {
  // strtod would skip leading blanks; a number with padding is not what we write.
  if (text.empty() || std::isspace(static_cast<unsigned char>(text[0])))
    bad_number(column, text, "a number");
  char* end = nullptr;
  errno = 0;
  double value = std::strtod(text.c_str(), &end);
  if (end != text.c_str() + text.size()) bad_number(column, text, "a number");
  return value;
}

std::int64_t parse_int64(const std::string& column, const std::string& text) {
  std::int64_t value = 0;
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), value);
  if (text.empty() || error != std::errc() || end != text.data() + text.size())
    bad_number(column, text, "an integer");
  return value;
}

int parse_int(const std::string& column, const std::string& text) {
  std::int64_t value = parse_int64(column, text);
  if (value < std::numeric_limits<int>::min() || value > std::numeric_limits<int>::max())
    bad_number(column, text, "an integer that fits in 32 bits");
  return static_cast<int>(value);
}

// A field as written: numbers in their shortest form, optionals empty when not applicable.
std::string format_field(const std::string& text) { return text; }
std::string format_field(double value) { return format_number(value); }
std::string format_field(int value) { return std::to_string(value); }
std::string format_field(std::int64_t value) { return std::to_string(value); }
std::string format_field(std::uint64_t value) { return std::to_string(value); }
template <typename T>
std::string format_field(const std::optional<T>& value) {
  return value ? format_field(*value) : std::string();
}

// The inverse of format_field; throws naming the column on a bad number.
void parse_field(const std::string&, const std::string& text, std::string& out) { out = text; }
void parse_field(const std::string& column, const std::string& text, double& out) {
  out = parse_double(column, text);
}
void parse_field(const std::string& column, const std::string& text, int& out) {
  out = parse_int(column, text);
}
void parse_field(const std::string& column, const std::string& text, std::int64_t& out) {
  out = parse_int64(column, text);
}
void parse_field(const std::string& column, const std::string& text, std::uint64_t& out) {
  auto [end, error] = std::from_chars(text.data(), text.data() + text.size(), out);
  if (text.empty() || error != std::errc() || end != text.data() + text.size())
    bad_number(column, text, "an unsigned 64-bit integer");
}
template <typename T>
void parse_field(const std::string& column, const std::string& text, std::optional<T>& out) {
  if (text.empty()) {
    out.reset();
    return;
  }
  T value{};
  parse_field(column, text, value);
  out = value;
}

void check_budget(const ResultRow& row) {
  if (row.budget && !(*row.budget > 0 && *row.budget <= 1))
    throw Error("column 'budget': expected a ratio in (0, 1], got " + format_number(*row.budget));
}

}  // namespace

std::vector<CsvRecord> split_csv_records(const std::string& text) {
  std::vector<CsvRecord> records;
  std::size_t pos = 0;
  int line = 1;
  const std::size_t size = text.size();
  while (pos < size) {
    CsvRecord record;
    record.begin = pos;
    record.line = line;
    std::string field;
    bool record_done = false;
    auto skip_rest_of_line = [&](const std::string& why) {
      record.problem = why;
      while (pos < size && text[pos] != '\n') ++pos;
      if (pos < size) {
        ++pos;
        ++line;
        record.terminated = true;
      }
      record_done = true;
    };
    while (!record_done) {
      field.clear();
      if (pos < size && text[pos] == '"') {
        ++pos;
        bool closed = false;
        while (pos < size) {
          char c = text[pos];
          if (c == '"') {
            if (pos + 1 < size && text[pos + 1] == '"') {
              field += '"';
              pos += 2;
              continue;
            }
            ++pos;
            closed = true;
            break;
          }
          if (c == '\n') ++line;
          field += c;
          ++pos;
        }
        if (!closed) {
          record.problem = "unterminated quoted field";
          record.fields.push_back(field);
          record_done = true;  // reached the end of the text
          break;
        }
        if (pos < size && text[pos] != ',' && text[pos] != '\n' &&
            !(text[pos] == '\r' && pos + 1 < size && text[pos + 1] == '\n')) {
          skip_rest_of_line("unexpected character after a closing quote");
          break;
        }
      } else {
        while (pos < size && text[pos] != ',' && text[pos] != '\n') {
          if (text[pos] == '"') break;
          field += text[pos];
          ++pos;
        }
        if (pos < size && text[pos] == '"') {
          skip_rest_of_line("quote inside an unquoted field");
          break;
        }
        if (pos < size && text[pos] == '\n' && !field.empty() && field.back() == '\r')
          field.pop_back();
      }
      record.fields.push_back(field);
      if (pos >= size) {
        record_done = true;  // no newline: a torn last record, or a file without one
      } else if (text[pos] == ',') {
        ++pos;
      } else if (text[pos] == '\r') {  // CRLF after a quoted field
        pos += 2;
        ++line;
        record.terminated = true;
        record_done = true;
      } else {  // '\n'
        ++pos;
        ++line;
        record.terminated = true;
        record_done = true;
      }
    }
    record.end = pos;
    records.push_back(std::move(record));
  }
  return records;
}

namespace {

std::string read_whole_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) throw Error(path + ": cannot open results CSV");
  std::ostringstream buffer;
  buffer << in.rdbuf();
  if (in.bad()) throw Error(path + ": cannot read results CSV");
  return buffer.str();
}

void truncate_durably(const std::string& path, std::size_t length) {
  FileDescriptor file(::open(path.c_str(), O_WRONLY | O_CLOEXEC));
  if (file.fd < 0) throw Error(system_error(path + ": cannot open to repair"));
  if (::ftruncate(file.fd, static_cast<off_t>(length)) != 0 || ::fsync(file.fd) != 0)
    throw Error(system_error(path + ": cannot truncate the partial last line"));
}

// Reads exactly `length` bytes at `offset` (fewer only at end of file).
std::string read_at(int fd, off_t offset, std::size_t length, const std::string& path) {
  std::string buffer(length, '\0');
  std::size_t got = 0;
  while (got < length) {
    ssize_t n = ::pread(fd, &buffer[got], length - got, offset + static_cast<off_t>(got));
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(system_error(path + ": cannot read"));
    if (n == 0) break;
    got += static_cast<std::size_t>(n);
  }
  buffer.resize(got);
  return buffer;
}

// Offset just after the last newline in the first `size` bytes, or 0 if none.
off_t end_of_last_whole_line(int fd, off_t size, const std::string& path) {
  const off_t chunk = 4096;
  off_t end = size;
  while (end > 0) {
    off_t begin = end > chunk ? end - chunk : 0;
    std::string bytes = read_at(fd, begin, static_cast<std::size_t>(end - begin), path);
    std::size_t newline = bytes.rfind('\n');
    if (newline != std::string::npos) return begin + static_cast<off_t>(newline) + 1;
    end = begin;
  }
  return 0;
}

void write_all(int fd, const std::string& payload, const std::string& path) {
  std::size_t written = 0;
  // One write() normally takes the whole payload; the loop only covers signals and
  // short writes on a full disk.
  while (written < payload.size()) {
    ssize_t n = ::write(fd, payload.data() + written, payload.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) throw Error(system_error(path + ": cannot append results"));
    written += static_cast<std::size_t>(n);
  }
}

void fsync_parent_directory(const std::string& path) {
  auto parent = std::filesystem::absolute(path).parent_path();
  FileDescriptor dir(::open(parent.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC));
  if (dir.fd >= 0) ::fsync(dir.fd);  // best effort: some file systems refuse it
}

}  // namespace

const std::vector<ResultColumn>& result_column_table() {
  using R = ResultRow;
  using Role = ColumnRole;
  using Use = SettingUse;
  constexpr InLabel label = InLabel::yes;
  static const std::vector<ResultColumn> table = {
      {"model", &R::model, Role::setting, Use::context},
      {"task", &R::task, Role::setting, Use::figure, label},
      {"policy", &R::policy, Role::setting, Use::line, label},
      {"budget", &R::budget, Role::setting, Use::budget, label, nullptr, check_budget},
      {"budget_tokens", &R::budget_tokens, Role::setting, Use::budget, label},
      {"heavy_share", &R::heavy_share, Role::setting, Use::heavy_share, label},
      // Derived from budget x heavy_share: splitting by them would cut a budget sweep into points.
      {"heavy_ratio", &R::heavy_ratio, Role::derived},
      {"recent_ratio", &R::recent_ratio, Role::derived},
      {"kv_bits", &R::kv_bits, Role::setting, Use::context, label, "16"},  // files from before the column
      {"kv_group", &R::kv_group, Role::setting, Use::context},
      {"kv_residual", &R::kv_residual, Role::setting, Use::context},
      {"kv_memory", &R::kv_memory, Role::setting, Use::context, label},
      {"protocol", &R::protocol, Role::setting, Use::context, label},
      {"mode", &R::mode, Role::setting, Use::context},
      {"score", &R::score, Role::setting, Use::context},
      {"pipeline", &R::pipeline, Role::setting, Use::context, label, "lm-eval"},  // files from before the column
      {"shots", &R::shots, Role::setting, Use::context, label},
      {"seed", &R::seed, Role::setting, Use::context, label},
      {"limit", &R::limit, Role::setting, Use::context},
      {"length", &R::length, Role::setting, Use::context, label},
      {"depth", &R::depth, Role::setting, Use::context, label},
      {"question", &R::question, Role::setting, Use::context, label},
      {"shared_context", &R::shared_context, Role::setting, Use::context, label},
      {"turns", &R::turns, Role::setting, Use::context, label},
      // Follows from the task.
      {"haystack", &R::haystack, Role::derived},
      {"metric", &R::metric, Role::metric},
      {"turn", &R::turn, Role::metric},
      {"value", &R::value, Role::measurement},
      {"stderr", &R::stderr_, Role::measurement},
      {"n", &R::n, Role::measurement},
      {"agreement_with_full", &R::agreement_with_full, Role::measurement},
      {"mean_abs_ll_change", &R::mean_abs_ll_change, Role::measurement},
      {"kv_tokens_kept", &R::kv_tokens_kept, Role::measurement},
      {"kv_bytes_peak", &R::kv_bytes_peak, Role::measurement},
      {"kv_bytes_full", &R::kv_bytes_full, Role::measurement},
      {"dmc_merge_rate", &R::dmc_merge_rate, Role::measurement},
      {"prepass_token_ratio", &R::prepass_token_ratio, Role::measurement},
      {"seconds", &R::seconds, Role::measurement},
      {"version", &R::version, Role::provenance},
  };
  return table;
}

std::vector<std::string> result_columns() {
  std::vector<std::string> names;
  for (const auto& column : result_column_table()) names.push_back(column.name);
  return names;
}

std::vector<std::string> result_columns(ColumnRole role) {
  std::vector<std::string> names;
  for (const auto& column : result_column_table())
    if (column.role == role) names.push_back(column.name);
  return names;
}

std::vector<std::string> result_columns(SettingUse use) {
  std::vector<std::string> names;
  for (const auto& column : result_column_table())
    if (column.role == ColumnRole::setting && column.use == use) names.push_back(column.name);
  return names;
}

std::vector<std::string> label_columns() {
  std::vector<std::string> names;
  for (const auto& column : result_column_table())
    if (column.in_label == InLabel::yes) names.push_back(column.name);
  return names;
}

std::vector<std::string> text_result_columns() {
  std::vector<std::string> names;
  for (const auto& column : result_column_table())
    if (column.is_text()) names.push_back(column.name);
  return names;
}

std::string result_header() {
  std::string header;
  for (std::size_t i = 0; i < kColumns.size(); ++i) header += (i ? "," : "") + kColumns[i];
  return header;
}

std::string csv_quote(const std::string& field) {
  if (field.find_first_of(",\"\r\n") == std::string::npos) return field;
  std::string quoted = "\"";
  for (char c : field) {
    if (c == '"') quoted += '"';
    quoted += c;
  }
  quoted += '"';
  return quoted;
}

std::string format_number(double value) {
  char buffer[64];
  auto result = std::to_chars(buffer, buffer + sizeof buffer, value);
  return std::string(buffer, result.ptr);
}

std::map<std::string, std::string> ResultRow::fields() const {
  std::map<std::string, std::string> fields;
  for (const auto& column : result_column_table())
    fields[column.name] = std::visit([this](auto member) { return format_field(this->*member); },
                                     column.field);
  return fields;
}

ResultRow ResultRow::from_fields(const std::map<std::string, std::string>& fields) {
  ResultRow row;
  for (const auto& column : result_column_table()) {
    std::string text = field_or_empty(fields, column.name);
    if (text.empty() && column.when_empty) text = column.when_empty;
    std::visit([&](auto member) { parse_field(column.name, text, row.*member); }, column.field);
    if (column.check) column.check(row);
  }
  return row;
}

std::string format_row(const ResultRow& row) {
  // Refuse to write what read_results_csv would reject later.
  for (const auto& column : result_column_table())
    if (column.check) column.check(row);
  auto fields = row.fields();
  std::string line;
  for (std::size_t i = 0; i < kColumns.size(); ++i) {
    if (i) line += ',';
    line += csv_quote(fields.at(kColumns[i]));
  }
  return line;
}

void append_rows_durably(const std::string& path, const std::vector<ResultRow>& rows) {
  if (rows.empty()) return;
  {
    // A file from an earlier kvevict: rewrite it with the current header first.
    std::ifstream in(path, std::ios::binary);
    std::string first_line;
    if (in && std::getline(in, first_line) && is_older_header(header_fields(first_line))) {
      in.close();
      const auto old_rows = read_results_csv(path, /*repair=*/false);
      const std::string tmp = path + ".upgrade.tmp";
      std::filesystem::remove(tmp);
      append_rows_durably(tmp, old_rows.empty() ? std::vector<ResultRow>{} : old_rows);
      if (old_rows.empty()) std::ofstream(tmp, std::ios::binary) << result_header() << '\n';
      std::filesystem::rename(tmp, path);
    }
  }
  // Format everything before touching the file, so a bad row writes nothing.
  std::string payload;
  for (const auto& row : rows) payload += format_row(row) + '\n';

  FileDescriptor file(::open(path.c_str(), O_RDWR | O_CREAT | O_APPEND | O_CLOEXEC, 0644));
  if (file.fd < 0) throw Error(system_error(path + ": cannot open results CSV for appending"));
  // Two shards pointed at the same file must not interleave header and rows.
  while (::flock(file.fd, LOCK_EX) != 0) {
    if (errno != EINTR) throw Error(system_error(path + ": cannot lock results CSV"));
  }

  struct stat info {};
  if (::fstat(file.fd, &info) != 0) throw Error(system_error(path + ": cannot stat"));
  off_t size = info.st_size;
  const std::string header = result_header();
  if (size > 0) {
    std::string start = read_at(file.fd, 0, header.size() + 2, path);
    std::size_t newline = start.find('\n');
    if (newline == std::string::npos && static_cast<off_t>(start.size()) == size &&
        header.compare(0, start.size(), start) == 0) {
      size = 0;  // only a torn header: start afresh
    } else {
      std::string first_line = start.substr(0, newline);
      if (!first_line.empty() && first_line.back() == '\r') first_line.pop_back();
      if (newline == std::string::npos || first_line != header)
        throw Error(path + ":1: not a kvevict results CSV (expected header '" + header +
                    "'); refusing to append");
      size = end_of_last_whole_line(file.fd, size, path);
    }
    if (size != info.st_size && ::ftruncate(file.fd, size) != 0)
      throw Error(system_error(path + ": cannot truncate the partial last line"));
  }
  if (size == 0) payload = header + '\n' + payload;

  kill_point("append-before-write");
  if (kill_point_reached("append-mid-write")) {  // a kill -9 inside the write: a torn tail
    write_all(file.fd, payload.substr(0, payload.size() * 3 / 4), path);
    kill_now();
  }
  write_all(file.fd, payload, path);
  kill_point("append-before-fsync");
  if (::fsync(file.fd) != 0) throw Error(system_error(path + ": fsync failed"));
  if (info.st_size == 0) fsync_parent_directory(path);  // make a new file's name durable
}

namespace {

// What a table, plot or notebook cannot show faithfully: "" when the field is fine.
std::string export_problem(const ResultColumn& column, const std::string& text) {
  if (text.find('\0') != std::string::npos) return "column '" + std::string(column.name) + "' holds a NUL byte";
  for (std::size_t at = 0; at < text.size();) {
    const Utf8Char c = decode_utf8_at(text, at);
    if (!c.valid) return "column '" + std::string(column.name) + "' is not valid UTF-8 (byte " + std::to_string(at + 1) + ")";
    at += c.length;
  }
  if (!column.is_text() && !text.empty()) {
    const double value = std::strtod(text.c_str(), nullptr);
    if (!std::isfinite(value))
      return "column '" + std::string(column.name) + "': " + text + " is not a finite number";
  }
  return "";
}

std::vector<ResultRow> read_results(const std::string& path, bool repair, bool for_export);

}  // namespace

std::vector<ResultRow> read_results_csv(const std::string& path, bool repair) { return read_results(path, repair, false); }

std::vector<ResultRow> read_results_for_export(const std::string& path) {
  std::vector<ResultRow> rows = read_results(path, false, true);
  if (rows.empty()) throw Error(path + ": no result rows (only a header, or empty): nothing to export");
  return rows;
}

namespace {
std::vector<ResultRow> read_results(const std::string& path, bool repair, bool for_export) {
  if (std::filesystem::is_directory(path)) throw Error(path + ": is a folder, not a results CSV");
  const std::string whole = read_whole_file(path);
  // Appends are whole lines in one write(), so a kill can only leave bytes after the
  // last newline. Those alone are a torn write; everything before must parse cleanly.
  const std::size_t last_newline = whole.rfind('\n');
  const std::size_t keep_until = last_newline == std::string::npos ? 0 : last_newline + 1;
  const std::string header = result_header();
  if (keep_until == 0 && !whole.empty() && header.compare(0, whole.size(), whole) != 0)
    throw Error(path + ":1: expected the results header '" + header + "'");
  const std::string text = whole.substr(0, keep_until);
  const std::vector<CsvRecord> records = split_csv_records(text);
  std::vector<ResultRow> rows;
  if (records.empty()) {
    if (repair && keep_until < whole.size()) truncate_durably(path, keep_until);
    return rows;
  }

  const CsvRecord& first = records.front();
  if (!first.problem.empty() || (first.fields != kColumns && !is_older_header(first.fields)) || !first.terminated)
    throw Error(path + ":1: expected the results header '" + header + "'");
  const std::vector<std::string> file_columns = first.fields;

  const std::size_t column_count = file_columns.size();
  for (std::size_t i = 1; i < records.size(); ++i) {
    const CsvRecord& record = records[i];
    const std::string where = path + ":" + std::to_string(record.line) + ": ";
    if (!record.problem.empty()) throw Error(where + record.problem);
    if (!record.terminated) throw Error(where + "a quoted field runs to the end of the file");
    if (record.fields.size() != column_count)
      throw Error(where + "expected " + std::to_string(column_count) + " fields, found " +
                  std::to_string(record.fields.size()));
    std::map<std::string, std::string> fields;
    for (std::size_t c = 0; c < column_count; ++c) fields[file_columns[c]] = record.fields[c];
    if (for_export)
      for (const auto& column : result_column_table()) {
        const std::string problem = export_problem(column, field_or_empty(fields, column.name));
        if (!problem.empty()) throw Error(where + problem);
      }
    try {
      rows.push_back(ResultRow::from_fields(fields));
    } catch (const Error& error) {
      throw Error(where + error.what());
    }
  }
  if (repair && keep_until < whole.size()) truncate_durably(path, keep_until);
  return rows;
}

}  // namespace

}  // namespace kvevict
