// The torch-free part of the safetensors format: the 8-byte length, the JSON header and
// its checks, and a sharded checkpoint's index. Kept apart from the memory mapping and
// the tensors so the parsers can be fuzzed without LibTorch (fuzz/).
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

namespace kvevict {

struct TensorInfo {
  std::string name;
  std::string dtype;  // "F32", "F16", "BF16", "U8", ...
  std::vector<int64_t> shape;
  size_t begin = 0, end = 0;  // byte offsets in the data section (safetensors) or the file (pickles)
  std::string file;
  // Element strides when the tensor is not row-major (a PyTorch checkpoint may store
  // views); empty means contiguous.
  std::vector<int64_t> strides;
};

// Bytes per element of a safetensors dtype name; 0 when the name is not one.
size_t safetensors_dtype_bytes(const std::string& dtype);

struct SafetensorsHeader {
  std::map<std::string, TensorInfo> tensors;
  size_t data_offset = 0;  // where the data section starts in the file
};

// Parses and checks a whole safetensors file's bytes: the header length, the JSON (no
// duplicate names), every entry's dtype and shape (no negative or overflowing sizes),
// and data offsets that tile the data section exactly: in order, without overlap or
// gap, each exactly the shape's size, the last ending at the end of the file.
// kvevict::Error naming `path` and the tensor otherwise.
SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& path);

// A sharded checkpoint's index (model.safetensors.index.json or pytorch_model.bin.index.json):
// shard file name -> the tensors weight_map places in it.
std::map<std::string, std::set<std::string>> parse_shard_index(const nlohmann::json& index,
                                                               const std::string& index_path);

}  // namespace kvevict
