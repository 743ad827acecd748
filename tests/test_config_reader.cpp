// ConfigObject, the one reader of config objects: declared keys only, values checked
// with errors that name the file and the key as written.
#include "tests/catch.h"
#include <nlohmann/json.hpp>

#include "harness/common/config_reader.h"
#include "harness/common/errors.h"
#include "tests/test_support.h"

using kvevict::ConfigObject;
using nlohmann::json;

using kvevict::test::error_of;

TEST_CASE("a config object refuses undeclared keys and names bad values", "[config]") {
  const json value = json::parse(R"({"tokens": 64, "name": "x", "ratio": 0.5, "list": [1, 2], "off": null})");
  const std::vector<std::string> keys = {"tokens", "name", "ratio", "list", "off", "absent"};
  const ConfigObject config(value, "bench.json", keys);
  CHECK(config.integer("tokens", 1, 1, 100) == 64);
  CHECK(config.integer("absent", 7, 1, 100) == 7);
  CHECK(config.integer("off", 7, 1, 100) == 7);  // null reads as absent
  CHECK(config.text("name", "") == "x");
  CHECK(config.number("ratio", 0, 0, 1) == 0.5);
  CHECK(config.integers("list", {}, 0, 10) == std::vector<int>{1, 2});

  CHECK(error_of([&] { ConfigObject(json::parse(R"({"tokns": 3})"), "bench.json", keys); }) ==
        "bench.json: unknown key \"tokns\" (known: tokens, name, ratio, list, off, absent)");
  CHECK(error_of([&] { config.integer("tokens", 1, 1, 10); }) == "bench.json: key \"tokens\": 64 is outside [1, 10]");
  CHECK(error_of([&] { config.text("tokens", ""); }) == "bench.json: key \"tokens\" must be a string, not 64");
  CHECK(error_of([&] { config.number("name", 0, 0, 1); }) == "bench.json: key \"name\" must be a number, not \"x\"");
  CHECK(error_of([&] { config.flag("ratio", false); }) == "bench.json: key \"ratio\" must be true or false, not 0.5");
  CHECK(error_of([&] { config.texts("list", {}); }) == "bench.json: key \"list\" must be a list of strings, not [1,2]");
  CHECK(error_of([&] { config.has("undeclared"); }) != "");  // a reader bug, not silence

  // A block inside a config names its keys with the block's prefix.
  const json block = json::parse(R"({"partiton": "gpu"})");
  CHECK(error_of([&] { ConfigObject(block, "sweep.json", {"partition"}, "slurm."); }) ==
        "sweep.json: unknown key \"slurm.partiton\" (known: partition)");
  CHECK(error_of([&] { ConfigObject(json(3), "sweep.json", {"partition"}, "slurm."); }) ==
        "sweep.json: key \"slurm\" must be an object");
}
