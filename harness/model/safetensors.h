// Memory-mapped checkpoint files: safetensors (one file, or a sharded set behind
// model.safetensors.index.json) or, failing that, PyTorch pickles (pytorch_model.bin,
// or shards behind pytorch_model.bin.index.json; see pytorch_checkpoint.h). Tensors
// are views of the mapping until converted.
#pragma once
#include "harness/model/tensor.h"

#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/model/safetensors_header.h"  // TensorInfo

namespace kvevict {

// One checkpoint file whose tensors are read-only views of its mapping.
class WeightFile {
 public:
  virtual ~WeightFile() = default;
  virtual const std::map<std::string, TensorInfo>& tensors() const = 0;
  // A zero-copy view of the mapped bytes where alignment allows, with the stored dtype.
  virtual torch::Tensor view(const TensorInfo& info) const = 0;
  // Checks every stored checksum the format has (reading all of the file's tensor bytes);
  // returns how many records were checked, 0 for a format without checksums.
  virtual size_t verify_checksums() const { return 0; }
};

class SafetensorsFile : public WeightFile {
 public:
  explicit SafetensorsFile(const std::string& path);
  ~SafetensorsFile();
  SafetensorsFile(const SafetensorsFile&) = delete;
  SafetensorsFile& operator=(const SafetensorsFile&) = delete;

  const std::map<std::string, TensorInfo>& tensors() const override { return tensors_; }
  // A zero-copy view of the mapped bytes, with the stored dtype.
  torch::Tensor view(const TensorInfo& info) const override;
  const std::string& path() const { return path_; }

 private:
  std::string path_;
  void* mapping_ = nullptr;
  size_t size_ = 0;
  const uint8_t* data_ = nullptr;  // start of the data section
  std::map<std::string, TensorInfo> tensors_;
};

// All tensors of a model directory (single file or shards).
class WeightStore {
 public:
  static WeightStore open(const std::string& model_dir);
  bool has(const std::string& name) const { return where_.count(name) > 0; }
  const TensorInfo& info(const std::string& name) const;
  // The stored tensor as stored (a view of the mapping where alignment allows), only to read.
  torch::Tensor stored(const std::string& name) const;
  // The stored tensor converted to `dtype` on `device` (no copy when nothing changes).
  torch::Tensor get(const std::string& name, torch::ScalarType dtype,
                    const torch::Device& device) const;
  std::vector<std::string> names() const;
  size_t total_bytes() const;
  size_t file_count() const { return files_.size(); }
  // WeightFile::verify_checksums over every file: the number of records checked.
  size_t verify_checksums() const;

 private:
  std::vector<std::shared_ptr<WeightFile>> files_;
  std::map<std::string, std::pair<size_t, TensorInfo>> where_;
};

}  // namespace kvevict
