// Helpers for the libFuzzer targets: the loaders under test take file paths, so each
// input is written to a per-process scratch file first. kvevict::Error is the expected
// answer to bad input; anything else (a crash, a sanitizer report, another exception
// type escaping) is a finding.
#pragma once
#include <unistd.h>

#include <cstddef>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <string>
#include <system_error>

namespace kvevict::fuzz {

// A folder of its own per process, so a loader that looks for files beside its input
// (tokenizer_config.json) finds none by accident; removed when the process exits.
class ScratchFolder {
 public:
  ScratchFolder()
      : path_((std::filesystem::temp_directory_path() / ("kvevict_fuzz_" + std::to_string(::getpid()))).string()) {
    std::filesystem::create_directories(path_);
  }
  ~ScratchFolder() {
    std::error_code ignored;
    std::filesystem::remove_all(path_, ignored);
  }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
};

inline std::string scratch_file(const std::string& name, const uint8_t* data, size_t size) {
  static const ScratchFolder folder;
  const std::string path = folder.path() + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace kvevict::fuzz
