#include "harness/model/safetensors_header.h"

#include <algorithm>
#include <cstdint>
#include <cstring>

#include "harness/common/errors.h"
#include "harness/common/files.h"
#include "harness/common/text.h"

namespace kvevict {
namespace {

}  // namespace

size_t safetensors_dtype_bytes(const std::string& dtype) {
  static const std::map<std::string, size_t> table = {
      {"F32", 4}, {"F16", 2}, {"BF16", 2}, {"F64", 8}, {"I64", 8},
      {"I32", 4}, {"I16", 2}, {"I8", 1},   {"U8", 1},  {"BOOL", 1}};
  auto it = table.find(dtype);
  return it == table.end() ? 0 : it->second;
}

SafetensorsHeader parse_safetensors_header(const uint8_t* bytes, size_t size, const std::string& path) {
  if (size < 8)
    throw Error(path + ": truncated safetensors file: " + std::to_string(size) +
                " bytes, shorter than the 8-byte header length");
  uint64_t header_len = 0;
  std::memcpy(&header_len, bytes, 8);  // little-endian u64, as the format specifies
  if (header_len > size - 8)
    throw Error(path + ": truncated safetensors file: header length " + std::to_string(header_len) +
                " runs past the file size " + std::to_string(size));
  // A key given twice (a tensor named twice, or a field twice in one entry) is ambiguous:
  // parse_json refuses it.
  const nlohmann::json header =
      parse_json(std::string_view(reinterpret_cast<const char*>(bytes + 8), header_len), path + ": safetensors header");
  if (!header.is_object()) throw Error(path + ": safetensors header is not a JSON object");
  SafetensorsHeader result;
  result.data_offset = 8 + header_len;
  const size_t data_size = size - 8 - header_len;
  for (auto& [name, entry] : header.items()) {
    if (name == "__metadata__") continue;
    TensorInfo info;
    info.name = name;
    info.file = path;
    try {
      info.dtype = entry.at("dtype").get<std::string>();
      // Integers only: the JSON library casts a float (and an integer too large for 64 bits,
      // which it parses as one) without a range check, undefined behaviour (fuzz_safetensors).
      const auto& shape = entry.at("shape");
      if (!shape.is_array()) throw std::runtime_error("shape must be a list of integers");
      for (const auto& d : shape) {
        if (!d.is_number_integer() || (d.is_number_unsigned() && d.get<uint64_t>() > INT64_MAX))
          throw std::runtime_error("shape size " + d.dump() + " is not a 64-bit integer");
        info.shape.push_back(d.get<int64_t>());
      }
      const auto& offsets = entry.at("data_offsets");
      if (!offsets.is_array() || offsets.size() != 2 || !offsets[0].is_number_unsigned() ||
          !offsets[1].is_number_unsigned())
        throw std::runtime_error("data_offsets needs two non-negative 64-bit integers");
      info.begin = offsets[0].get<uint64_t>();
      info.end = offsets[1].get<uint64_t>();
    } catch (const std::exception& e) {
      throw Error(path + ": tensor " + name + ": malformed header entry: " + json_error_message(e));
    }
    const size_t element_bytes = safetensors_dtype_bytes(info.dtype);
    if (element_bytes == 0) throw Error(path + ": tensor " + name + ": unsupported dtype " + info.dtype);
    if (info.end < info.begin || info.end > data_size)
      throw Error(path + ": tensor " + name + ": data offsets [" + std::to_string(info.begin) + "," +
                  std::to_string(info.end) + ") run past the end of the data (" + std::to_string(data_size) +
                  " bytes); the file is truncated or corrupt");
    size_t bytes_needed = element_bytes;
    for (auto d : info.shape) {
      if (d < 0) throw Error(path + ": tensor " + name + ": shape " + shape_string(info.shape) + " has a negative size");
      if (__builtin_mul_overflow(bytes_needed, static_cast<size_t>(d), &bytes_needed))
        throw Error(path + ": tensor " + name + ": shape " + shape_string(info.shape) + " of " + info.dtype +
                    " overflows 64-bit sizes");
    }
    if (bytes_needed != info.end - info.begin)
      throw Error(path + ": tensor " + name + ": shape " + shape_string(info.shape) + " of " + info.dtype +
                  " needs " + std::to_string(bytes_needed) + " bytes but offsets span " +
                  std::to_string(info.end - info.begin));
    result.tensors[name] = info;
  }
  // The tensors must tile the data section: sorted by offset, each starts where the
  // previous ended (no overlap: two tensors sharing bytes would read each other's data).
  std::vector<const TensorInfo*> by_offset;
  for (const auto& [_, info] : result.tensors) by_offset.push_back(&info);
  std::sort(by_offset.begin(), by_offset.end(), [](const TensorInfo* a, const TensorInfo* b) {
    return a->begin != b->begin ? a->begin < b->begin : a->end < b->end;
  });
  size_t expected = 0;
  const TensorInfo* previous = nullptr;
  for (const TensorInfo* info : by_offset) {
    if (info->begin < expected)
      throw Error(path + ": tensor " + info->name + ": data offsets [" + std::to_string(info->begin) + "," +
                  std::to_string(info->end) + ") overlap tensor " + previous->name);
    if (info->begin > expected)
      throw Error(path + ": tensor " + info->name + ": data offsets [" + std::to_string(info->begin) + "," +
                  std::to_string(info->end) + ") leave a gap after byte " + std::to_string(expected));
    expected = info->end;
    previous = info;
  }
  if (expected != data_size)
    throw Error(path + ": the tensors end at data byte " + std::to_string(expected) + " but the file has " +
                std::to_string(data_size) + " data bytes");
  return result;
}

std::map<std::string, std::set<std::string>> parse_shard_index(const nlohmann::json& j,
                                                               const std::string& index_path) {
  if (!j.is_object() || !j.contains("weight_map") || !j["weight_map"].is_object())
    throw Error(index_path + ": missing object \"weight_map\"");
  std::map<std::string, std::set<std::string>> shards;
  for (auto& [tensor, shard] : j["weight_map"].items()) {
    if (!shard.is_string()) throw Error(index_path + ": weight_map entry " + tensor + " is not a file name");
    const std::string file = shard.get<std::string>();
    // A shard is a file beside the index: no folders, so the index cannot point elsewhere.
    if (file.empty() || file.find('/') != std::string::npos || file == "." || file == "..")
      throw Error(index_path + ": weight_map entry " + tensor + " names \"" + file + "\", not a file beside the index");
    shards[file].insert(tensor);
  }
  return shards;
}

}  // namespace kvevict
