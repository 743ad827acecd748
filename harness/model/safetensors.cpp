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

std::string shape_string(const std::vector<int64_t>& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) s += (i ? "," : "") + std::to_string(shape[i]);
  return s + "]";
}

}  // namespace

SafetensorsFile::SafetensorsFile(const std::string& path) : path_(path) {
  int fd = ::open(path.c_str(), O_RDONLY);
  if (fd < 0) throw Error(path + ": cannot open safetensors file: " + std::strerror(errno));
  struct stat st {};
  ::fstat(fd, &st);
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
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian u64, as the format specifies
  if (header_len > size_ - 8)
    throw Error(path + ": truncated safetensors file: header length " +
                std::to_string(header_len) + " runs past the file size " + std::to_string(size_));
  nlohmann::json header;
  try {
    header = nlohmann::json::parse(bytes + 8, bytes + 8 + header_len);
  } catch (const std::exception& e) {
    throw Error(path + ": malformed safetensors header JSON: " + e.what());
  }
  if (!header.is_object()) throw Error(path + ": safetensors header is not a JSON object");
  data_ = bytes + 8 + header_len;
  size_t data_size = size_ - 8 - header_len;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    TensorInfo info;
    info.name = name;
    info.file = path;
    try {
      info.dtype = entry.at("dtype").get<std::string>();
      info.shape = entry.at("shape").get<std::vector<int64_t>>();
      auto offsets = entry.at("data_offsets").get<std::vector<size_t>>();
      if (offsets.size() != 2) throw std::runtime_error("data_offsets needs two numbers");
      info.begin = offsets[0];
      info.end = offsets[1];
    } catch (const std::exception& e) {
      throw Error(path + ": tensor " + name + ": malformed header entry: " + e.what());
    }
    DtypeInfo dt{};
    if (!lookup_dtype(info.dtype, &dt))
      throw Error(path + ": tensor " + name + ": unsupported dtype " + info.dtype);
    if (info.end < info.begin || info.end > data_size)
      throw Error(path + ": tensor " + name + ": data offsets [" + std::to_string(info.begin) +
                  "," + std::to_string(info.end) + ") run past the end of the data (" +
                  std::to_string(data_size) + " bytes); the file is truncated or corrupt");
    size_t numel = 1;
    for (auto d : info.shape) numel *= static_cast<size_t>(d);
    if (numel * dt.bytes != info.end - info.begin)
      throw Error(path + ": tensor " + name + ": shape " + shape_string(info.shape) + " of " +
                  info.dtype + " needs " + std::to_string(numel * dt.bytes) + " bytes but offsets span " +
                  std::to_string(info.end - info.begin));
    tensors_[name] = info;
  }
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
  const nlohmann::json j = read_json_file(index.string());
  if (!j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(index.string() + ": missing object \"weight_map\"");
  std::map<std::string, std::set<std::string>> shards;
  for (auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string()) throw Error(index.string() + ": weight_map entry " + tensor + " is not a file name");
    shards[(dir / shard.get<std::string>()).string()].insert(tensor);
  }
  for (auto& [file, _] : shards)
    if (!std::filesystem::exists(file))
      throw Error(index.string() + ": shard " + std::filesystem::path(file).filename().string() +
                  " listed in weight_map does not exist");
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

torch::Tensor WeightStore::get(const std::string& name, torch::ScalarType dtype,
                               const torch::Device& device) const {
  auto it = where_.find(name);
  if (it == where_.end()) throw Error("tensor " + name + " is missing from the checkpoint");
  torch::Tensor t = files_[it->second.first]->view(it->second.second).to(device, dtype);
  return t.is_contiguous() ? t : t.contiguous();
}

std::vector<std::string> WeightStore::names() const {
  std::vector<std::string> out;
  for (auto& [name, _] : where_) out.push_back(name);
  return out;
}

size_t WeightStore::total_bytes() const {
  size_t total = 0;
  for (auto& [_, w] : where_) total += w.second.end - w.second.begin;
  return total;
}

}  // namespace kvevict
