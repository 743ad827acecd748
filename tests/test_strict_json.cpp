// parse_json (harness/common/files.h), the one JSON reader every file goes through: a key
// given twice in one object is an error naming the object, and errors are one line
// naming the source, never the JSON library's own text.
#include "tests/catch.h"
#include <string>

#include "harness/common/errors.h"
#include "harness/common/files.h"

namespace {

std::string error_of(const std::string& text, const std::string& where = "f.json") {
  try {
    kvevict::parse_json(text, where);
  } catch (const kvevict::Error& e) {
    return e.what();
  }
  return "";
}

}  // namespace

TEST_CASE("parse_json refuses a key given twice and names the object", "[json][errors]") {
  CHECK(error_of(R"({"budgets": [0.5], "limit": 2, "budgets": [0.2]})") ==
        "f.json: key \"budgets\" appears twice in the top-level object");
  CHECK(error_of(R"({"weight_map": {"a": "x", "b": "y", "a": "x"}})") ==
        "f.json: key \"a\" appears twice in weight_map");
  CHECK(error_of(R"({"model": {"vocab": {"!": 0, "\"": 1, "!": 2}}})") ==
        "f.json: key \"!\" appears twice in model.vocab");
  CHECK(error_of(R"({"added_tokens": [{"id": 1}, 7, [2, {"x": 1}], {"id": 2, "content": "a", "id": 3}]})") ==
        "f.json: key \"id\" appears twice in added_tokens[3]");
  CHECK(error_of(R"([[{"a": {"b": 1, "b": 1}}]])", "t.jsonl:4") == "t.jsonl:4: key \"b\" appears twice in [0][0].a");
}

TEST_CASE("parse_json accepts equal keys in different objects and keeps every value", "[json]") {
  const auto j = kvevict::parse_json(R"({"a": {"x": 1}, "b": {"x": 2}, "c": [{"x": 3}, {"x": 4}], "x": 5})", "f.json");
  CHECK(j["a"]["x"] == 1);
  CHECK(j["b"]["x"] == 2);
  CHECK(j["c"][1]["x"] == 4);
  CHECK(j["x"] == 5);
  CHECK(kvevict::parse_json("[1, \"two\", null, {}]", "f.json").size() == 4);
}

TEST_CASE("parse_json errors name the source without the JSON library's tags", "[json][errors]") {
  const std::string message = error_of("{\"a\": [1, 2,", "data/x.jsonl:7");
  CHECK(message.rfind("data/x.jsonl:7: malformed JSON: ", 0) == 0);
  CHECK(message.find("json.exception") == std::string::npos);
  CHECK(message.find('\n') == std::string::npos);
  CHECK(error_of("1e999999").find("malformed JSON") != std::string::npos);  // out_of_range, not a crash
}
