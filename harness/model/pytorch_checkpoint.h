// pytorch_model.bin as torch.save writes a state dict: the zip format (torch >= 1.6:
// <prefix>/data.pkl plus one stored record <prefix>/data/<key> per storage) and the
// legacy format (magic, protocol and sys-info pickles, the state-dict pickle, the
// storage keys, then each storage's element count and bytes). The pickles go through
// the restricted unpickler, so loading never executes anything; tensors are views of
// the memory-mapped file until converted.
#pragma once
#include <map>
#include <memory>
#include <string>
#include <utility>
#include <vector>

#include "harness/common/mapped_file.h"
#include "harness/model/safetensors.h"
#include "harness/model/zip_archive.h"

namespace kvevict {

class PytorchCheckpointFile : public WeightFile {
 public:
  // Throws kvevict::Error naming the file (and the tensor or record) at fault.
  explicit PytorchCheckpointFile(const std::string& path);

  const std::map<std::string, TensorInfo>& tensors() const override { return tensors_; }
  // TensorInfo::begin/end are byte offsets in the file. A view of the mapping, or an
  // aligned copy where the legacy format left the bytes unaligned.
  torch::Tensor view(const TensorInfo& info) const override;
  // The zip format's storage records against their CRC-32s (data.pkl is checked on every
  // load); the legacy format has no checksums.
  size_t verify_checksums() const override;

 private:
  void read_zip();
  void read_legacy();

  MappedFile file_;
  std::map<std::string, TensorInfo> tensors_;
  std::unique_ptr<ZipArchive> zip_;  // the zip format's directory (null for the legacy format)
  std::vector<std::pair<std::string, std::string>> storage_records_;  // zip record, its first tensor
};

}  // namespace kvevict
