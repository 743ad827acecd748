// The "analyze" list of a config as `kvevict analyze --config` reads it
// (harness/config/analyze_entries.h): entries, names as folders, keys and ranges.
#include <filesystem>
#include <nlohmann/json.hpp>

#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/config/analyze_entries.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  static const std::string out = [] {
    return (std::filesystem::path(kvevict::fuzz::scratch_file("unused", nullptr, 0)).parent_path() / "analyze_out").string();
  }();
  try {
    const nlohmann::json config =
        kvevict::parse_json(std::string_view(reinterpret_cast<const char*>(data), size), "config.json");
    const auto entries = kvevict::read_analyze_entries(config, "config.json", out, kvevict::AnalyzeEntry{},
                                                       kvevict::PolicyOptions{}, "/nonexistent-data");
    for (const auto& e : entries)
      // Every output folder is one component under --out.
      if (std::filesystem::path(e.out).parent_path() != std::filesystem::path(out) || e.name.empty()) __builtin_trap();
  } catch (const kvevict::Error&) {
  }
  return 0;
}
