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

namespace kvevict::fuzz {

// A folder of its own per process, so a loader that looks for files beside its input
// (tokenizer_config.json) finds none by accident.
inline std::string scratch_file(const std::string& name, const uint8_t* data, size_t size) {
  static const std::string folder = [] {
    const std::string dir = "/tmp/kvevict_fuzz_" + std::to_string(::getpid());
    std::filesystem::create_directories(dir);
    return dir;
  }();
  const std::string path = folder + "/" + name;
  std::ofstream out(path, std::ios::binary | std::ios::trunc);
  out.write(reinterpret_cast<const char*>(data), static_cast<std::streamsize>(size));
  return path;
}

}  // namespace kvevict::fuzz
