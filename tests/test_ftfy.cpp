// ftfy 6.1.1's fix_text(s, normalization="NFKC") against golden/ftfy_nfkc_tasks.jsonl:
// every changed string of the multiple-choice task files, a sample of unchanged ones and
// synthetic cases (mojibake, HTML entities with and without tags, CR/LF, control
// characters, width and compatibility forms).
#include "tests/catch.h"
#include <fstream>
#include <nlohmann/json.hpp>
#include <string>

#include "tasks/ftfy.h"
#include "tests/test_support.h"

using namespace kvevict;

TEST_CASE("ftfy fix_text NFKC reproduces every golden line", "[tasks][ftfy][golden]") {
  std::ifstream in(test::data("golden/ftfy_nfkc_tasks.jsonl"));
  REQUIRE(in.good());
  std::string line, mismatches;
  int lines = 0, changed = 0, wrong = 0;
  while (std::getline(in, line)) {
    if (line.empty()) continue;
    auto j = nlohmann::json::parse(line);
    const std::string input = j["input"], expected = j["output"];
    ++lines;
    changed += input != expected;
    const std::string got = ftfy_fix_text_nfkc(input);
    if (got != expected) {
      ++wrong;
      if (wrong <= 20)
        mismatches += j["source"].get<std::string>() + ": got " + nlohmann::json(got).dump() + " expected " +
                      nlohmann::json(expected).dump() + "\n";
    }
  }
  INFO(wrong << " of " << lines << " lines differ:\n" << mismatches);
  CHECK(lines > 5000);
  CHECK(changed > 500);
  CHECK(wrong == 0);
}

TEST_CASE("ftfy leaves entities alone once a line has a tag, and repairs mojibake", "[tasks][ftfy]") {
  CHECK(ftfy_fix_text_nfkc("a &amp; b") == "a & b");
  CHECK(ftfy_fix_text_nfkc("<b>a &amp; b</b>") == "<b>a &amp; b</b>");
  CHECK(ftfy_fix_text_nfkc("x &lt;\n<i>y</i> &amp;") == "x <\n<i>y</i> &amp;");
  CHECK(ftfy_fix_text_nfkc("caf\xC3\x83\xC2\xA9") == "caf\xC3\xA9");  // "cafÃ©" -> "café"
  CHECK(ftfy_fix_text_nfkc("na\xC3\xAFve caf\xC3\xA9") == "na\xC3\xAFve caf\xC3\xA9");  // legit accents stay
}
