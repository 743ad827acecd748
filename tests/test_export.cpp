// Results CSV durability and parsing, pivot tables, notebook and SVG export.
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tests/catch.h"
#include <cctype>
#include <chrono>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <set>
#include <thread>
#include <nlohmann/json.hpp>

#include "harness/common/errors.h"
#include "notebooks-export/notebook.h"
#include "notebooks-export/results_csv.h"
#include "notebooks-export/results_table.h"
#include "notebooks-export/svg_plot.h"
#include "tests/test_support.h"

using kvevict::ResultRow;
namespace fs = std::filesystem;

namespace {

ResultRow make_row(const std::string& task, const std::string& policy,
                   std::optional<double> budget, const std::string& metric, double value,
                   std::optional<double> standard_error = std::nullopt) {
  ResultRow row;
  row.model = "tiny-llama";
  row.task = task;
  row.policy = policy;
  row.budget = budget;
  if (budget && policy == "h2o") {
    row.heavy_share = 0.5;
    row.heavy_ratio = *budget * 0.5;
    row.recent_ratio = *budget * 0.5;
  }
  row.protocol = "stream";
  row.mode = "simulation";
  row.score = "loglikelihood";
  row.shots = 0;
  row.seed = 42;
  row.metric = metric;
  row.value = value;
  row.stderr_ = standard_error;
  row.n = 100;
  if (policy != "full") {
    row.agreement_with_full = 0.9;
    row.mean_abs_ll_change = 0.125;
  }
  row.kv_tokens_kept = 12.5;
  row.kv_bytes_peak = 123456789012LL;
  row.seconds = 1.5;
  row.version = "0.1.0";
  return row;
}

// A small sweep: a full baseline and budgeted policies on two tasks, plus an h2o
// heavy-share ablation at budget 0.2 on copa.
std::vector<ResultRow> sample_sweep() {
  std::vector<ResultRow> rows;
  for (const std::string task : {"copa", "rte"}) {
    rows.push_back(make_row(task, "full", std::nullopt, "acc", 0.70, 0.046));
    for (double budget : {0.1, 0.2, 0.5}) {
      rows.push_back(make_row(task, "h2o", budget, "acc", 0.6 + budget / 4, 0.048));
      rows.push_back(make_row(task, "local", budget, "acc", 0.5 + budget / 2, 0.05));
    }
  }
  for (double share : {0.25, 0.75}) {
    ResultRow row = make_row("copa", "h2o", 0.2, "acc", 0.6 + share / 10, 0.048);
    row.heavy_share = share;
    row.heavy_ratio = 0.2 * share;
    row.recent_ratio = 0.2 * (1 - share);
    rows.push_back(row);
  }
  // A task with only a baseline: no budget figure can be drawn for it.
  rows.push_back(make_row("piqa", "full", std::nullopt, "acc_norm", 0.75, 0.01));
  return rows;
}

void write_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out << text;
}

void append_text(const std::string& path, const std::string& text) {
  std::ofstream out(path, std::ios::binary | std::ios::app);
  out << text;
}

std::string error_message(const std::function<void()>& action) {
  try {
    action();
  } catch (const kvevict::Error& error) {
    return error.what();
  }
  return "(no kvevict::Error thrown)";
}

// A small XML well-formedness check (enough for our SVG): one root element, tags nest
// and match, attributes are quoted, entities are the predefined or numeric ones, and no
// raw '<' or '&' appears in text. Returns "" when well-formed, else what is wrong.
std::string xml_problem(const std::string& xml) {
  std::vector<std::string> open;
  std::size_t pos = 0, roots = 0;
  auto is_name_char = [](char c) {
    return std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == ':' ||
           c == '.';
  };
  auto check_entities = [](const std::string& text) -> std::string {
    for (std::size_t i = 0; i < text.size(); ++i) {
      if (text[i] == '<') return "raw '<' in text or attribute";
      if (text[i] != '&') continue;
      std::size_t semicolon = text.find(';', i);
      if (semicolon == std::string::npos) return "unterminated entity";
      std::string entity = text.substr(i + 1, semicolon - i - 1);
      bool known = entity == "amp" || entity == "lt" || entity == "gt" || entity == "quot" ||
                   entity == "apos" || (entity.size() > 1 && entity[0] == '#');
      if (!known) return "unknown entity &" + entity + ";";
    }
    return "";
  };
  if (xml.compare(0, 5, "<?xml") == 0) {
    pos = xml.find("?>");
    if (pos == std::string::npos) return "unterminated XML declaration";
    pos += 2;
  }
  while (pos < xml.size()) {
    std::size_t lt = xml.find('<', pos);
    std::string text = xml.substr(pos, lt == std::string::npos ? std::string::npos : lt - pos);
    if (auto problem = check_entities(text); !problem.empty()) return problem;
    if (open.empty() && text.find_first_not_of(" \t\r\n") != std::string::npos)
      return "text outside the root element";
    if (lt == std::string::npos) break;
    std::size_t gt = xml.find('>', lt);
    if (gt == std::string::npos) return "unterminated tag";
    std::string tag = xml.substr(lt + 1, gt - lt - 1);
    pos = gt + 1;
    if (!tag.empty() && tag[0] == '/') {
      std::string name = tag.substr(1);
      if (open.empty() || open.back() != name) return "mismatched closing tag </" + name + ">";
      open.pop_back();
      continue;
    }
    bool self_closing = !tag.empty() && tag.back() == '/';
    if (self_closing) tag.pop_back();
    std::size_t i = 0;
    while (i < tag.size() && is_name_char(tag[i])) ++i;
    std::string name = tag.substr(0, i);
    if (name.empty()) return "tag without a name";
    // Attributes: name="value" separated by blanks.
    while (true) {
      while (i < tag.size() && std::isspace(static_cast<unsigned char>(tag[i]))) ++i;
      if (i >= tag.size()) break;
      std::size_t start = i;
      while (i < tag.size() && is_name_char(tag[i])) ++i;
      if (i == start || i >= tag.size() || tag[i] != '=') return "bad attribute in <" + name + ">";
      ++i;
      if (i >= tag.size() || (tag[i] != '"' && tag[i] != '\'')) return "unquoted attribute";
      char quote = tag[i];
      std::size_t end = tag.find(quote, i + 1);
      if (end == std::string::npos) return "unterminated attribute value";
      if (auto problem = check_entities(tag.substr(i + 1, end - i - 1)); !problem.empty())
        return problem;
      i = end + 1;
    }
    if (open.empty() && ++roots > 1) return "more than one root element";
    if (!self_closing) open.push_back(name);
  }
  if (!open.empty()) return "unclosed <" + open.back() + ">";
  if (roots != 1) return "no root element";
  return "";
}

}  // namespace

TEST_CASE("result columns are the tidy CSV schema", "[export]") {
  auto columns = kvevict::result_columns();
  REQUIRE(columns.size() == 39);
  CHECK(columns.front() == "model");
  CHECK(columns[15] == "pipeline");
  CHECK(columns[22] == "shared_context");
  CHECK(columns[26] == "turn");
  CHECK(columns[27] == "value");
  CHECK(columns.back() == "version");
  CHECK(kvevict::result_header().substr(0, 26) == "model,task,policy,budget,b");
}

TEST_CASE("format_row quotes per RFC 4180 and leaves n/a fields empty", "[export]") {
  ResultRow row = make_row("copa", "full", std::nullopt, "acc", 0.2);
  row.model = "org/model, v2";
  row.score = "say \"hi\"";
  row.shots = std::nullopt;
  row.seed = std::nullopt;
  CHECK(kvevict::format_row(row) ==
        "\"org/model, v2\",copa,full,,,,,,16,,,,stream,simulation,\"say \"\"hi\"\"\",lm-eval,,,,,,,,,,acc,,0.2,,100,"
        ",,12.5,123456789012,,,,1.5,0.1.0");
}

TEST_CASE("results CSV rows round-trip through append and read", "[export]") {
  auto dir = kvevict::test::temp_dir("export_roundtrip");
  auto path = dir + "/results.csv";
  ResultRow tricky = make_row("copa", "h2o", 0.2, "acc", 0.1 + 0.2, 0.0451);
  tricky.model = "org/model, \"v2\"";
  tricky.version = "0.1.0\nsecond line";  // a newline inside a quoted field
  tricky.limit = 50;
  tricky.budget = std::nullopt;
  tricky.budget_tokens = 256;
  std::vector<ResultRow> first_cell = {tricky, make_row("copa", "h2o", 0.2, "acc_norm", 0.7)};
  std::vector<ResultRow> second_cell = {make_row("rte", "full", std::nullopt, "acc", 0.55)};
  kvevict::append_rows_durably(path, first_cell);
  kvevict::append_rows_durably(path, second_cell);

  auto rows = kvevict::read_results_csv(path);
  REQUIRE(rows.size() == 3);
  CHECK(rows[0].fields() == tricky.fields());
  CHECK(rows[0].value == 0.1 + 0.2);  // shortest round-trip formatting loses nothing
  CHECK(rows[1].fields() == first_cell[1].fields());
  CHECK(rows[2].fields() == second_cell[0].fields());
  CHECK_FALSE(rows[2].agreement_with_full.has_value());

  auto text = kvevict::test::read_text(path);
  CHECK(text.rfind(kvevict::result_header() + "\n", 0) == 0);
  CHECK(text.find("model,task", 1) == std::string::npos);  // the header is written once
}

TEST_CASE("a torn last row is ignored, and repair truncates it", "[export]") {
  auto dir = kvevict::test::temp_dir("export_torn");
  auto path = dir + "/results.csv";
  kvevict::append_rows_durably(path, {make_row("copa", "full", std::nullopt, "acc", 0.7)});
  kvevict::append_rows_durably(path, {make_row("copa", "h2o", 0.2, "acc", 0.65)});
  const auto whole = kvevict::test::read_text(path);
  const std::string next_line = kvevict::format_row(make_row("copa", "h2o", 0.5, "acc", 0.68));
  append_text(path, next_line.substr(0, next_line.size() / 2));  // killed mid-row

  CHECK(kvevict::read_results_csv(path).size() == 2);
  CHECK(kvevict::test::read_text(path).size() > whole.size());  // reading alone changes nothing

  CHECK(kvevict::read_results_csv(path, /*repair=*/true).size() == 2);
  CHECK(kvevict::test::read_text(path) == whole);

  SECTION("a torn row cut inside a quoted field") {
    append_text(path, "\"org/model, v");
    CHECK(kvevict::read_results_csv(path, true).size() == 2);
    CHECK(kvevict::test::read_text(path) == whole);
  }
  SECTION("a last line with its newline but too few fields is an error, not a torn write") {
    append_text(path, "tiny-llama,copa,h2o\n");
    CHECK_THAT(error_message([&] { kvevict::read_results_csv(path, true); }),
               Catch::Contains(path + ":4:") && Catch::Contains("expected 39 fields"));
    CHECK(kvevict::test::read_text(path) == whole + "tiny-llama,copa,h2o\n");  // untouched
  }
  SECTION("a stray quote in the middle does not swallow the rest as a torn line") {
    const std::string good = kvevict::format_row(make_row("rte", "full", std::nullopt, "acc", 0.5)) + "\n";
    write_text(path, whole + "\"tiny-llama,copa,h2o\n" + good + good);
    CHECK_THAT(error_message([&] { kvevict::read_results_csv(path, true); }), Catch::Contains(path + ":4:"));
    CHECK(kvevict::test::read_text(path) == whole + "\"tiny-llama,copa,h2o\n" + good + good);
  }
  SECTION("appending after a torn row cuts the torn part first") {
    append_text(path, next_line.substr(0, 10));
    kvevict::append_rows_durably(path, {make_row("copa", "h2o", 0.5, "acc", 0.68)});
    auto rows = kvevict::read_results_csv(path);
    REQUIRE(rows.size() == 3);
    CHECK(rows[2].budget == 0.5);
    CHECK(kvevict::test::read_text(path) == whole + next_line + "\n");
  }
  SECTION("a header torn by a kill during the first append") {
    write_text(path, kvevict::result_header().substr(0, 20));
    CHECK(kvevict::read_results_csv(path, true).empty());
    CHECK(kvevict::test::read_text(path).empty());
    kvevict::append_rows_durably(path, {make_row("copa", "full", std::nullopt, "acc", 0.7)});
    CHECK(kvevict::read_results_csv(path).size() == 1);
  }
}

TEST_CASE("a malformed line in the middle is an error naming file:line", "[export]") {
  auto dir = kvevict::test::temp_dir("export_malformed");
  auto path = dir + "/results.csv";
  const std::string header = kvevict::result_header() + "\n";
  const std::string good = kvevict::format_row(make_row("copa", "full", std::nullopt, "acc", 0.7)) + "\n";

  write_text(path, header + good + "tiny-llama,copa,broken\n" + good);
  auto message = error_message([&] { kvevict::read_results_csv(path, true); });
  CHECK_THAT(message, Catch::Contains(path + ":3:"));
  CHECK_THAT(message, Catch::Contains("expected 39 fields"));
  CHECK(kvevict::test::read_text(path) == header + good + "tiny-llama,copa,broken\n" + good);

  ResultRow bad_budget = make_row("copa", "h2o", 0.2, "acc", 0.7);
  std::string bad_line = kvevict::format_row(bad_budget);
  bad_line.replace(bad_line.find(",0.2,"), 5, ",0.2x,");
  write_text(path, header + bad_line + "\n" + good);
  message = error_message([&] { kvevict::read_results_csv(path); });
  CHECK_THAT(message, Catch::Contains(path + ":2:"));
  CHECK_THAT(message, Catch::Contains("budget"));

  write_text(path, "model,task\n" + good);
  CHECK_THAT(error_message([&] { kvevict::read_results_csv(path); }),
             Catch::Contains(path + ":1:"));
  CHECK_THAT(error_message([&] {
               kvevict::append_rows_durably(path, {make_row("copa", "full", std::nullopt, "acc", 1)});
             }),
             Catch::Contains("header"));

  CHECK_THAT(error_message([&] { kvevict::read_results_csv(dir + "/missing.csv"); }),
             Catch::Contains("missing.csv"));
}

TEST_CASE("rows appended by a process killed with SIGKILL stay whole", "[export]") {
  auto dir = kvevict::test::temp_dir("export_kill");
  auto path = dir + "/results.csv";
  const std::vector<ResultRow> cell = {make_row("copa", "h2o", 0.2, "acc", 0.65, 0.04),
                                       make_row("copa", "h2o", 0.2, "acc_norm", 0.66, 0.04)};
  pid_t child = ::fork();
  REQUIRE(child >= 0);
  if (child == 0) {
    try {
      for (;;) kvevict::append_rows_durably(path, cell);  // until killed
    } catch (...) {
    }
    ::_exit(1);  // never return into Catch from the child
  }
  // Kill it mid-stream: once a few cells are on disk (fsync can be slow on CI disks).
  for (int waited = 0; waited < 2000; ++waited) {
    std::error_code error;
    if (fs::file_size(path, error) > 2000 && !error) break;
    std::this_thread::sleep_for(std::chrono::milliseconds(5));
  }
  std::this_thread::sleep_for(std::chrono::milliseconds(20));
  ::kill(child, SIGKILL);
  int status = 0;
  ::waitpid(child, &status, 0);
  REQUIRE(WIFSIGNALED(status));

  auto rows = kvevict::read_results_csv(path, true);
  REQUIRE(rows.size() >= 2);
  for (const auto& row : rows) CHECK(row.fields() == cell[row.metric == "acc" ? 0 : 1].fields());
  // After repair the file holds whole rows only, and appending continues cleanly.
  kvevict::append_rows_durably(path, cell);
  CHECK(kvevict::read_results_csv(path).size() == rows.size() + 2);
}

TEST_CASE("pivot renders an exact Markdown and CSV table", "[export]") {
  std::vector<ResultRow> rows = {
      make_row("copa", "h2o", 0.2, "acc", 0.70, 0.0461),
      make_row("copa", "full", std::nullopt, "acc", 0.72, 0.0451),
      make_row("copa", "h2o", 0.5, "acc", 0.71, 0.0455),
      make_row("copa", "local", 0.2, "acc", 0.6),
      make_row("rte", "full", std::nullopt, "acc", 0.55, 0.03),
      make_row("rte", "h2o", 0.2, "acc", 0.531234, 0.03),
  };
  kvevict::PivotOptions options;
  options.row_key = "task";
  options.column_key = "policy";
  options.filters = {"budget=0.20"};  // numeric match; the full baseline has no budget
  auto table = kvevict::pivot_results(rows, options);
  CHECK(table.to_markdown() ==
        "| task | metric | full | h2o | local |\n"
        "|---|---|---:|---:|---:|\n"
        "| copa | acc | 0.7200 (0.0451) | 0.7000 (0.0461) | 0.6000 |\n"
        "| rte | acc | 0.5500 (0.0300) | 0.5312 (0.0300) |  |\n");
  CHECK(table.to_csv() ==
        "task,metric,full,h2o,local\n"
        "copa,acc,0.7200,0.7000,0.6000\n"
        "rte,acc,0.5500,0.5312,\n");

  SECTION("a chosen metric leaves the row key alone") {
    options.metric = "acc";
    auto by_task = kvevict::pivot_results(rows, options);
    CHECK(by_task.row_key_columns == std::vector<std::string>{"task"});
    CHECK(by_task.to_csv().rfind("task,full,h2o,local\n", 0) == 0);
  }
  SECTION("policies down the side, budgets across in numeric order; an empty budget reads n/a") {
    options = {};
    options.row_key = "policy";
    options.column_key = "budget";
    options.filters = {"task=copa"};
    options.metric = "acc";
    CHECK(kvevict::pivot_results(rows, options).to_markdown() ==
          "| policy | n/a | 0.2 | 0.5 |\n"
          "|---|---:|---:|---:|\n"
          "| full | 0.7200 (0.0451) |  |  |\n"
          "| h2o |  | 0.7000 (0.0461) | 0.7100 (0.0455) |\n"
          "| local |  | 0.6000 |  |\n");
  }
  SECTION("two results in one cell name the missing filter") {
    options.filters.clear();
    auto message = error_message([&] { kvevict::pivot_results(rows, options); });
    CHECK_THAT(message, Catch::Contains("budget ('0.2' vs '0.5')"));
    CHECK_THAT(message, Catch::Contains("task=copa"));
  }
  SECTION("bad keys and filters are errors") {
    options.filters = {"budgett=0.2"};
    CHECK_THAT(error_message([&] { kvevict::pivot_results(rows, options); }),
               Catch::Contains("unknown results column 'budgett'"));
    options.filters = {"budget"};
    CHECK_THAT(error_message([&] { kvevict::pivot_results(rows, options); }),
               Catch::Contains("key=value"));
  }
}

TEST_CASE("the notebook is nbformat 4 JSON with the expected cells", "[export]") {
  auto dir = kvevict::test::temp_dir("export_notebook");
  auto path = dir + "/results.ipynb";
  auto rows = sample_sweep();
  rows[0].model = "org/model, \"quoted\"";
  kvevict::write_notebook(rows, path);

  auto notebook = kvevict::test::read_json(path);
  CHECK(notebook["nbformat"] == 4);
  REQUIRE(notebook["nbformat_minor"].get<int>() >= 4);
  CHECK(notebook["metadata"]["kernelspec"]["name"] == "python3");
  CHECK(notebook["metadata"]["kernelspec"]["language"] == "python");
  std::vector<std::string> types;
  std::set<std::string> ids;
  std::string all_code;
  for (const auto& cell : notebook["cells"]) {
    types.push_back(cell["cell_type"]);
    if (notebook["nbformat_minor"] == 5) CHECK(ids.insert(cell["id"].get<std::string>()).second);
    CHECK(cell["metadata"].is_object());
    std::string source;
    for (const auto& line : cell["source"]) source += line.get<std::string>();
    if (cell["cell_type"] == "code") {
      CHECK(cell["outputs"].is_array());
      CHECK(cell["execution_count"].is_null());
      all_code += source + "\n";
    }
  }
  CHECK(types == std::vector<std::string>{"markdown", "code", "markdown", "code", "code",
                                          "markdown", "code", "markdown", "code", "markdown",
                                          "code"});
  CHECK_THAT(all_code, Catch::Contains("matplotlib.use(\"Agg\")"));
  CHECK_THAT(all_code, Catch::Contains("pd.read_csv(io.StringIO("));
  CHECK_THAT(all_code, Catch::Contains("heavy_share"));
  // The embedded record keeps its RFC 4180 quoting inside a Python string literal.
  CHECK_THAT(all_code, Catch::Contains(R"("\"org/model, \"\"quoted\"\"\",copa,full,)"));
}

TEST_CASE("the notebook's Markdown shows results values as text, never as live HTML", "[export][security]") {
  auto rows = sample_sweep();
  rows[0].model = "<script>alert(1)</script>";
  rows[0].task = "<img src=x onerror=alert(1)>";
  rows[0].policy = "[click](javascript:alert(1)) & *bold*";
  const auto notebook = nlohmann::json::parse(kvevict::notebook_json(rows));
  std::string markdown;
  for (const auto& cell : notebook["cells"])
    if (cell["cell_type"] == "markdown")
      for (const auto& line : cell["source"]) markdown += line.get<std::string>();
  CHECK(markdown.find('<') == std::string::npos);
  CHECK(markdown.find('>') == std::string::npos);
  CHECK_THAT(markdown, Catch::Contains("&lt;script&gt;alert(1)&lt;/script&gt;"));
  CHECK_THAT(markdown, Catch::Contains("&lt;img src=x onerror=alert(1)&gt;"));
  CHECK_THAT(markdown, Catch::Contains("\\[click\\](javascript:alert(1)) &amp; \\*bold\\*"));
}

TEST_CASE("table.csv neutralises cells a spreadsheet would run as formulas (OWASP)", "[export][security]") {
  std::vector<ResultRow> rows = {
      make_row("copa", "=cmd|' /C calc'!A0", 0.2, "acc", 0.70),
      make_row("copa", "+1+1", 0.2, "acc", 0.71),
      make_row("copa", "-2+3", 0.2, "acc", 0.72),
      make_row("copa", "@SUM(A1)", 0.2, "acc", 0.73),
      make_row("copa", "\tx", 0.2, "acc", 0.74),
      make_row("copa", "\rx", 0.2, "acc", 0.75),
      make_row("copa", "-0.5", 0.2, "acc", 0.76),
      make_row("copa", "h2o", 0.2, "acc", 0.77),
  };
  kvevict::PivotOptions options;
  options.row_key = "task";
  options.column_key = "policy";
  CHECK(kvevict::pivot_results(rows, options).to_csv() ==
        "task,metric,'=cmd|' /C calc'!A0,'+1+1,'-2+3,'@SUM(A1),'\tx,\"'\rx\",-0.5,h2o\n"
        "copa,acc,0.7000,0.7100,0.7200,0.7300,0.7400,0.7500,0.7600,0.7700\n");
}

TEST_CASE("exports refuse what they cannot show: NUL, invalid UTF-8, non-finite numbers, no rows", "[export]") {
  auto dir = kvevict::test::temp_dir("export_checks");
  const std::string path = dir + "/results.csv";
  const std::string good = kvevict::format_row(make_row("copa", "h2o", 0.2, "acc", 0.7)) + "\n";
  auto with = [&](const std::string& from, const std::string& to) {
    std::string row = good;
    row.replace(row.find(from), from.size(), to);
    std::ofstream(path, std::ios::binary) << kvevict::result_header() << "\n" << good << row;
  };
  with("h2o", std::string("h2\0o", 4));
  CHECK(kvevict::read_results_csv(path).size() == 2);  // the reader a resume uses is unchanged
  CHECK_THAT(error_message([&] { kvevict::read_results_for_export(path); }), Catch::Contains("results.csv:3: column 'policy' holds a NUL byte"));
  with("h2o", "h2\xc3o");
  CHECK_THAT(error_message([&] { kvevict::read_results_for_export(path); }), Catch::Contains("results.csv:3: column 'policy' is not valid UTF-8"));
  with(",0.7,", ",inf,");
  CHECK_THAT(error_message([&] { kvevict::read_results_for_export(path); }), Catch::Contains("results.csv:3: column 'value': inf is not a finite number"));
  with(",0.7,", ",0.7,");
  CHECK(kvevict::read_results_for_export(path).size() == 2);
  std::ofstream(path, std::ios::binary) << kvevict::result_header() << "\n";
  CHECK_THAT(error_message([&] { kvevict::read_results_for_export(path); }), Catch::Contains("no result rows"));
}

TEST_CASE("SVG plots are well-formed XML, one per figure", "[export]") {
  auto dir = kvevict::test::temp_dir("export_svg");
  auto rows = sample_sweep();
  for (auto& row : rows)
    if (row.task == "rte") row.task = "rte/<v2> & co";  // must be sanitised and escaped
  auto paths = kvevict::write_svg_plots(rows, dir + "/plots");

  std::vector<std::string> names;
  for (const auto& path : paths) names.push_back(fs::path(path).filename().string());
  CHECK(names == std::vector<std::string>{"copa_acc_budget.svg", "rte__v2____co_acc_budget.svg",
                                          "copa_acc_heavy_share.svg"});
  for (const auto& path : paths) {
    INFO(path);
    auto svg = kvevict::test::read_text(path);
    CHECK(xml_problem(svg).empty());
    CHECK_THAT(svg, Catch::Contains("<polyline"));
    CHECK_THAT(svg, Catch::Contains("<circle"));
  }
  auto budget_svg = kvevict::test::read_text(paths[0]);
  CHECK_THAT(budget_svg, Catch::Contains("stroke-dasharray"));  // the full-cache baseline
  CHECK_THAT(budget_svg, Catch::Contains(">h2o (heavy_share=0.5)</text>"));
  CHECK_THAT(kvevict::test::read_text(paths[1]), Catch::Contains("rte/&lt;v2&gt; &amp; co"));
  CHECK_THAT(kvevict::test::read_text(paths[2]), Catch::Contains(">h2o (budget=0.2)</text>"));
  CHECK(xml_problem("<svg><g></svg>") != "");  // the checker itself rejects bad XML

  auto budget = kvevict::budget_plots(rows);
  REQUIRE(budget.size() == 2);
  // full, then first appearance: h2o at heavy share 0.5, local, h2o at 0.25 and 0.75.
  REQUIRE(budget[0].series.size() == 5);
  CHECK(budget[0].series[2].label == "local");  // no heavy share: nothing to add
  CHECK(budget[0].series[0].label == "full");
  CHECK(budget[0].series[0].reference);
  CHECK(budget[0].series[1].points.size() == 3);
  auto ablation = kvevict::heavy_share_plots(rows);
  REQUIRE(ablation.size() == 1);
  REQUIRE(ablation[0].series.size() == 1);
  CHECK(ablation[0].series[0].points.size() == 3);  // heavy share 0.25, 0.5, 0.75
}

TEST_CASE("an equal-memory sweep plots accuracy against the bytes each cell held", "[export]") {
  std::vector<ResultRow> rows;
  rows.push_back(make_row("copa", "full", std::nullopt, "acc", 0.70, 0.046));
  rows.back().kv_bytes_peak = 4096;
  for (int bits : {16, 2}) {
    ResultRow kivi = make_row("copa", "full", std::nullopt, "acc", 0.68, 0.046);
    kivi.kv_bits = bits;
    kivi.kv_bytes_peak = bits == 16 ? 4096 : 1024;
    if (bits != 16) rows.push_back(kivi);
    for (double memory : {0.25, 0.5}) {
      ResultRow row = make_row("copa", "h2o", std::nullopt, "acc", 0.6 + memory / 10, 0.048);
      row.kv_bits = bits;
      row.kv_memory = memory;
      row.kv_bytes_peak = static_cast<int64_t>(memory * 4096) - (bits == 2 ? 100 : 0);
      rows.push_back(row);
    }
  }
  const auto plots = kvevict::bytes_plots(rows);
  REQUIRE(plots.size() == 1);
  // One line per policy and bits, the full cache's first: full 16, full 2, h2o 16, h2o 2.
  REQUIRE(plots[0].series.size() == 4);
  CHECK(plots[0].series[1].label == "full 2-bit");
  CHECK(plots[0].series[3].label == "h2o 2-bit");
  REQUIRE(plots[0].series[3].points.size() == 2);
  CHECK(plots[0].series[3].points[0].x == Approx((1024 - 100) / 1024.0));  // KiB
  CHECK(plots[0].series[3].points[1].y == Approx(0.65));
  const std::string svg = kvevict::render_svg(plots[0]);
  CHECK(xml_problem(svg).empty());
  CHECK_THAT(svg, Catch::Contains(">copa: acc vs KV cache bytes</text>"));
  CHECK_THAT(svg, Catch::Contains("KV cache at its peak (KiB"));
  // Without a byte budget or a quantized cache there is nothing to plot against bytes.
  CHECK(kvevict::bytes_plots(sample_sweep()).empty());
}

TEST_CASE("every export replaces a symbolic link at its path instead of writing through it", "[export][security]") {
  // Every kind of figure (budget, heavy share, bytes, the needle heatmap), the notebook and
  // the table: a link left at an output's path must not carry the write to its target.
  auto rows = sample_sweep();
  for (int bits : {16, 2}) {
    ResultRow row = make_row("copa", "h2o", std::nullopt, "acc", 0.6, 0.048);
    row.kv_bits = bits;
    row.kv_memory = 0.5;
    row.kv_bytes_peak = 2048;
    rows.push_back(row);
  }
  for (int length : {1024, 2048})
    for (double depth : {0.0, 1.0}) {
      ResultRow row = make_row("niah", "full", std::nullopt, "rouge1_x10", depth * 10);
      row.length = length;
      row.depth = depth;
      row.question = "agnostic";
      rows.push_back(row);
    }
  const auto dir = kvevict::test::temp_dir("export_symlinks");
  std::string csv = kvevict::result_header() + "\n";
  for (const auto& row : rows) csv += kvevict::format_row(row) + "\n";
  fs::create_directories(dir + "/R");
  std::ofstream(dir + "/R/results.csv", std::ios::binary) << csv;
  const std::string exports = "export " + dir + "/R --svg " + dir + "/svg --notebook " + dir + "/n.ipynb";
  const std::string table = "table " + dir + "/R --where task=rte --rows budget --out " + dir + "/t";
  auto run = [](const std::string& args) {
    const auto r = kvevict::test::run_kvevict(args);
    INFO("kvevict " << args << "\n" << r.err);
    REQUIRE(r.exit_code == 0);
  };
  run(exports);
  run(table);
  std::vector<std::string> outputs = {dir + "/n.ipynb", dir + "/t.md", dir + "/t.csv"};
  std::set<std::string> kinds;
  for (const auto& entry : fs::directory_iterator(dir + "/svg")) {
    outputs.push_back(entry.path().string());
    const std::string name = entry.path().stem().string();
    kinds.insert(name.substr(name.rfind('_') + 1));
  }
  CHECK(kinds == std::set<std::string>{"budget", "share", "bytes", "heatmap"});
  // Each output a link to a file of its own outside the outputs.
  fs::create_directories(dir + "/targets");
  for (size_t i = 0; i < outputs.size(); ++i) {
    const std::string target = dir + "/targets/" + std::to_string(i);
    std::ofstream(target) << "not an export";
    fs::remove(outputs[i]);
    fs::create_symlink(target, outputs[i]);
  }
  run(exports);
  run(table);
  for (size_t i = 0; i < outputs.size(); ++i) {
    INFO(outputs[i]);
    CHECK_FALSE(fs::is_symlink(outputs[i]));
    CHECK(kvevict::test::read_text(outputs[i]).size() > 100);
    CHECK(kvevict::test::read_text(dir + "/targets/" + std::to_string(i)) == "not an export");
  }
}

TEST_CASE("the notebook executes headless with jupyter nbconvert", "[export][jupyter]") {
  // Not a skip: CI installs jupyter-nbconvert, python3-ipykernel, python3-pandas and
  // python3-matplotlib, and a notebook that cannot run is a broken export.
  if (std::system("command -v jupyter >/dev/null 2>&1") != 0)
    FAIL("jupyter is not on PATH; install the Debian packages jupyter-nbconvert "
         "python3-ipykernel python3-pandas python3-matplotlib to run this test");
  auto dir = kvevict::test::temp_dir("export_nbconvert");
  auto notebook = dir + "/results.ipynb";
  kvevict::write_notebook(sample_sweep(), notebook);
  auto empty_notebook = dir + "/empty.ipynb";
  kvevict::write_notebook({}, empty_notebook);  // no data at all: every figure is skipped

  for (const auto& [input, output] : {std::pair{notebook, std::string("executed.ipynb")},
                                      std::pair{empty_notebook, std::string("executed_empty.ipynb")}}) {
    auto log = dir + "/nbconvert.log";
    std::string command = "jupyter nbconvert --to notebook --execute "
                          "--ExecutePreprocessor.timeout=600 --output-dir '" + dir +
                          "' --output '" + output + "' '" + input + "' >'" + log + "' 2>&1";
    int status = std::system(command.c_str());
    INFO(kvevict::test::read_text(log));
    REQUIRE(WIFEXITED(status));
    REQUIRE(WEXITSTATUS(status) == 0);
  }
  // The executed sweep notebook holds the figures: copa and rte budget plots, copa ablation.
  auto executed = kvevict::test::read_json(dir + "/executed.ipynb");
  int images = 0;
  for (const auto& cell : executed["cells"])
    for (const auto& output : cell.value("outputs", nlohmann::json::array()))
      if (output.contains("data") && output["data"].contains("image/png")) ++images;
  CHECK(images == 3);
}
