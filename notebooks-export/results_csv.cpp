#include "notebooks-export/results_csv.h"

#include <fcntl.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <unistd.h>

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

namespace kvevict {

namespace {

const std::vector<std::string> kColumns = {
    "model",         "task",   "policy", "budget",   "budget_tokens",
    "heavy_share",   "heavy_ratio",      "recent_ratio",      "protocol",
    "mode",          "score",  "pipeline",         "shots",  "seed",     "limit",
    "metric",        "value",  "stderr", "n",        "agreement_with_full",
    "mean_abs_ll_change",      "kv_tokens_kept",     "kv_bytes_peak",
    "seconds",       "version"};

// The columns before the pipeline column existed; such files still read (as lm-eval),
// and an append first rewrites them with the current header.
std::vector<std::string> legacy_columns() {
  std::vector<std::string> columns;
  for (const auto& c : kColumns)
    if (c != "pipeline") columns.push_back(c);
  return columns;
}

std::string joined(const std::vector<std::string>& columns) {
  std::string line;
  for (std::size_t i = 0; i < columns.size(); ++i) line += (i ? "," : "") + columns[i];
  return line;
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

std::string optional_number(const std::optional<double>& value) {
  return value ? format_number(*value) : std::string();
}
template <typename Int>
std::string optional_integer(const std::optional<Int>& value) {
  return value ? std::to_string(*value) : std::string();
}

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

std::optional<double> optional_double_field(const std::map<std::string, std::string>& fields,
                                            const std::string& column) {
  std::string text = field_or_empty(fields, column);
  if (text.empty()) return std::nullopt;
  return parse_double(column, text);
}
std::optional<std::int64_t> optional_int64_field(
    const std::map<std::string, std::string>& fields, const std::string& column) {
  std::string text = field_or_empty(fields, column);
  if (text.empty()) return std::nullopt;
  return parse_int64(column, text);
}
std::optional<int> optional_int_field(const std::map<std::string, std::string>& fields,
                                      const std::string& column) {
  std::string text = field_or_empty(fields, column);
  if (text.empty()) return std::nullopt;
  return parse_int(column, text);
}

void check_budget(const std::optional<double>& budget) {
  if (budget && !(*budget > 0 && *budget <= 1))
    throw Error("column 'budget': expected a ratio in (0, 1], got " + format_number(*budget));
}

// One CSV record as found in the file, with enough position information to report
// errors by line and to truncate a torn tail.
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
std::vector<CsvRecord> split_records(const std::string& text) {
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

std::vector<std::string> result_columns() { return kColumns; }

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
  return {
      {"model", model},
      {"task", task},
      {"policy", policy},
      {"budget", optional_number(budget)},
      {"budget_tokens", optional_integer(budget_tokens)},
      {"heavy_share", optional_number(heavy_share)},
      {"heavy_ratio", optional_number(heavy_ratio)},
      {"recent_ratio", optional_number(recent_ratio)},
      {"protocol", protocol},
      {"mode", mode},
      {"score", score},
      {"pipeline", pipeline},
      {"shots", optional_integer(shots)},
      {"seed", optional_integer(seed)},
      {"limit", optional_integer(limit)},
      {"metric", metric},
      {"value", format_number(value)},
      {"stderr", optional_number(stderr_)},
      {"n", std::to_string(n)},
      {"agreement_with_full", optional_number(agreement_with_full)},
      {"mean_abs_ll_change", optional_number(mean_abs_ll_change)},
      {"kv_tokens_kept", optional_number(kv_tokens_kept)},
      {"kv_bytes_peak", optional_integer(kv_bytes_peak)},
      {"seconds", optional_number(seconds)},
      {"version", version},
  };
}

ResultRow ResultRow::from_fields(const std::map<std::string, std::string>& fields) {
  ResultRow row;
  row.model = field_or_empty(fields, "model");
  row.task = field_or_empty(fields, "task");
  row.policy = field_or_empty(fields, "policy");
  row.budget = optional_double_field(fields, "budget");
  check_budget(row.budget);
  row.budget_tokens = optional_int64_field(fields, "budget_tokens");
  row.heavy_share = optional_double_field(fields, "heavy_share");
  row.heavy_ratio = optional_double_field(fields, "heavy_ratio");
  row.recent_ratio = optional_double_field(fields, "recent_ratio");
  row.protocol = field_or_empty(fields, "protocol");
  row.mode = field_or_empty(fields, "mode");
  row.score = field_or_empty(fields, "score");
  row.pipeline = field_or_empty(fields, "pipeline");
  if (row.pipeline.empty()) row.pipeline = "lm-eval";
  row.shots = optional_int_field(fields, "shots");
  row.seed = optional_int_field(fields, "seed");
  row.limit = optional_int_field(fields, "limit");
  row.metric = field_or_empty(fields, "metric");
  row.value = parse_double("value", field_or_empty(fields, "value"));
  row.stderr_ = optional_double_field(fields, "stderr");
  row.n = parse_int("n", field_or_empty(fields, "n"));
  row.agreement_with_full = optional_double_field(fields, "agreement_with_full");
  row.mean_abs_ll_change = optional_double_field(fields, "mean_abs_ll_change");
  row.kv_tokens_kept = optional_double_field(fields, "kv_tokens_kept");
  row.kv_bytes_peak = optional_int64_field(fields, "kv_bytes_peak");
  row.seconds = optional_double_field(fields, "seconds");
  row.version = field_or_empty(fields, "version");
  return row;
}

std::string format_row(const ResultRow& row) {
  // Refuse to write what read_results_csv would reject later.
  check_budget(row.budget);
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
    // A file from before the pipeline column: rewrite it with the current header first.
    std::ifstream in(path, std::ios::binary);
    std::string first_line;
    if (in && std::getline(in, first_line) && first_line == joined(legacy_columns())) {
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

std::vector<ResultRow> read_results_csv(const std::string& path, bool repair) {
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
  const std::vector<CsvRecord> records = split_records(text);
  std::vector<ResultRow> rows;
  if (records.empty()) {
    if (repair && keep_until < whole.size()) truncate_durably(path, keep_until);
    return rows;
  }

  const CsvRecord& first = records.front();
  if (!first.problem.empty() || (first.fields != kColumns && first.fields != legacy_columns()) ||
      !first.terminated)
    throw Error(path + ":1: expected the results header '" + header + "'");
  const std::vector<std::string> file_columns = first.fields == legacy_columns() ? legacy_columns() : kColumns;

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
    try {
      rows.push_back(ResultRow::from_fields(fields));
    } catch (const Error& error) {
      throw Error(where + error.what());
    }
  }
  if (repair && keep_until < whole.size()) truncate_durably(path, keep_until);
  return rows;
}

}  // namespace kvevict
