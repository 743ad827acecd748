#include "harness/model/safetensors.h"

#include <fcntl.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/model/pytorch_checkpoint.h"
#include "harness/model/safetensors_header.h"

namespace kvevict {
namespace {

struct DtypeInfo {
  torch::ScalarType type;
  size_t bytes;
};

bool lookup_dtype(const std::string& name, DtypeInfo* out) {
  static const std::map<std::string, DtypeInfo> table = {
      {"F32", {torch::kFloat32, 4}}, {"F16", {torch::kFloat16, 2}},
      {"BF16", {torch::kBFloat16, 2}}, {"F64", {torch::kFloat64, 8}},
      {"I64", {torch::kInt64, 8}},   {"I32", {torch::kInt32, 4}},
      {"I16", {torch::kInt16, 2}},   {"I8", {torch::kInt8, 1}},
      {"U8", {torch::kUInt8, 1}},    {"BOOL", {torch::kBool, 1}}};
  auto it = table.find(name);
  if (it == table.end()) return false;
  *out = it->second;
  return true;
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open safetensors file: " + std::strerror(errno));
  struct stat st {};
  if (::fstat(fd, &st) != 0 || !S_ISREG(st.st_mode)) {
    ::close(fd);
    throw Error(path + ": not a regular file");
  }
  size_ = static_cast<size_t>(st.st_size);
  if (size_ < 8) {
    ::close(fd);
    throw Error(path + ": truncated safetensors file: " + std::to_string(size_) +
                " bytes, shorter than the 8-byte header length");
  }
  mapping_ = ::mmap(nullptr, size_, PROT_READ, MAP_PRIVATE, fd, 0);
  ::close(fd);
  if (mapping_ == MAP_FAILED) throw Error(path + ": mmap failed: " + std::strerror(errno));
  const auto* bytes = static_cast<const uint8_t*>(mapping_);
  SafetensorsHeader header;
  try {
    header = parse_safetensors_header(bytes, size_, path);
  } catch (...) {
    ::munmap(mapping_, size_);  // the destructor does not run for a throwing constructor
    mapping_ = nullptr;
    throw;
  }
  data_ = bytes + header.data_offset;
  tensors_ = std::move(header.tensors);
}

SafetensorsFile::~SafetensorsFile() {
  if (mapping_ && mapping_ != MAP_FAILED) ::munmap(mapping_, size_);
}

torch::Tensor SafetensorsFile::view(const TensorInfo& info) const {
  DtypeInfo dt{};
  lookup_dtype(info.dtype, &dt);
  // The mapping is read-only; callers convert before writing (get() always returns
  // either a converted copy or a tensor that is only read).
  return torch::from_blob(const_cast<uint8_t*>(data_ + info.begin), info.shape,
                          torch::TensorOptions().dtype(dt.type));
}

namespace {

// The shard files an index's weight_map names, each once, with the tensors it says
// each shard holds.
std::map<std::string, std::set<std::string>> read_shard_index(const std::filesystem::path& dir,
                                                              const std::filesystem::path& index) {
  std::map<std::string, std::set<std::string>> shards;
  for (auto& [file, tensors] : parse_shard_index(read_json_file(index.string()), index.string())) {
    const std::filesystem::path shard = dir / file;
    if (!std::filesystem::is_regular_file(shard))
      throw Error(index.string() + ": shard " + file + " listed in weight_map does not exist");
    shards[shard.string()] = tensors;
  }
  return shards;
}

}  // namespace

WeightStore WeightStore::open(const std::string& model_dir) {
  namespace fs = std::filesystem;
  WeightStore store;
  fs::path dir(model_dir);
  // Safetensors first; PyTorch pickles only where a directory has nothing else.
  std::map<std::string, std::set<std::string>> files;  // file -> tensors its index promises
  bool pickles = false;
  if (fs::exists(dir / "model.safetensors")) {
    files[(dir / "model.safetensors").string()];
  } else if (fs::exists(dir / "model.safetensors.index.json")) {
    files = read_shard_index(dir, dir / "model.safetensors.index.json");
  } else if (fs::exists(dir / "pytorch_model.bin")) {
    files[(dir / "pytorch_model.bin").string()];
    pickles = true;
  } else if (fs::exists(dir / "pytorch_model.bin.index.json")) {
    files = read_shard_index(dir, dir / "pytorch_model.bin.index.json");
    pickles = true;
  } else {
    throw Error(model_dir + ": no model.safetensors, model.safetensors.index.json, pytorch_model.bin "
                "or pytorch_model.bin.index.json");
  }
  for (auto& [f, promised] : files) {
    std::shared_ptr<WeightFile> file;
    if (pickles)
      file = std::make_shared<PytorchCheckpointFile>(f);
    else
      file = std::make_shared<SafetensorsFile>(f);
    for (const std::string& name : promised)
      if (!file->tensors().count(name))
        throw Error(f + ": tensor " + name + " is missing, though the index's weight_map places it in this shard");
    size_t idx = store.files_.size();
    for (auto& [name, info] : file->tensors()) {
      if (store.where_.count(name))
        throw Error(f + ": tensor " + name + " also appears in " + store.where_[name].second.file);
      store.where_[name] = {idx, info};
    }
    store.files_.push_back(file);
  }
  return store;
}

const TensorInfo& WeightStore::info(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error("tensor " + name + " is missing from the checkpoint");
  return it->second.second;
}

torch::Tensor WeightStore::stored(const std::string& name) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error("tensor " + name + " is missing from the checkpoint");
  return files_[it->second.first]->view(it->second.second);
}

torch::Tensor WeightStore::get(const std::string& name, torch::ScalarType dtype,
                               const torch::Device& device) const {
  torch::Tensor t = stored(name).to(device, dtype);
  return t.is_contiguous() ? t : t.contiguous();
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  for (auto& [name, _] : where_) out.push_back(name);
  return out;
}

size_t WeightStore::verify_checksums() const {
  size_t checked = 0;
  for (const auto& file : files_) checked += file->verify_checksums();
  return checked;
}

size_t WeightStore::total_bytes() const {
  size_t total = 0;
  for (auto& [_, w] : where_) total += w.second.end - w.second.begin;
  return total;
}

}  // namespace kvevict
