// A whole file mapped read-only into memory; tensors may view into it while it lives.
#pragma once
#include <cstddef>
#include <cstdint>
#include <string>

namespace kvevict {

class MappedFile {
 public:
  // Throws kvevict::Error "PATH: cannot open ..." or "PATH: ... empty".
  explicit MappedFile(const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  const uint8_t* data() const { return data_; }
  size_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* mapping_ = nullptr;
  const uint8_t* data_ = nullptr;
  size_t size_ = 0;
};

}  // namespace kvevict
