#include "harness/model/pytorch_checkpoint.h"

#include <algorithm>
#include <cstring>
#include <set>

#include "harness/common/errors.h"
#include "harness/common/text.h"
#include "harness/model/restricted_unpickler.h"

namespace kvevict {
namespace {

using pickle::Kind;
using pickle::ValuePtr;

struct NamedTensor {
  std::string name;
  pickle::TensorRef ref;
};

torch::ScalarType scalar_type(const std::string& dtype) {
  static const std::map<std::string, torch::ScalarType> table = {
      {"F32", torch::kFloat32}, {"F16", torch::kFloat16}, {"BF16", torch::kBFloat16},
      {"F64", torch::kFloat64}, {"I64", torch::kInt64},   {"I32", torch::kInt32},
      {"I16", torch::kInt16},   {"I8", torch::kInt8},     {"U8", torch::kUInt8},
      {"BOOL", torch::kBool}};
  return table.at(dtype);
}

// The {name: tensor} entries of a state dict, in file order.
std::vector<NamedTensor> state_dict_tensors(const ValuePtr& root, const std::string& source) {
  if (root->kind != Kind::Dict)
    throw Error(source + ": the pickle holds a " + pickle::kind_name(root->kind) +
                ", not a state dict (a dict of tensors)");
  std::vector<NamedTensor> out;
  for (const auto& [key, value] : root->entries) {
    if (key->kind != Kind::String) throw Error(source + ": the state dict has a key that is not a string");
    if (value->kind != Kind::Tensor)
      throw Error(source + ": entry " + key->text + " is a " + pickle::kind_name(value->kind) +
                  ", not a tensor; only a flat state dict {name: tensor} is read (save model.state_dict())");
    const auto& type = value->tensor.storage.type;
    if (type.dtype.empty())
      throw Error(source + ": tensor " + key->text + " is stored as " + type.global +
                  ", which is not supported (float32, float16 and bfloat16 weights; integer and bool buffers)");
    out.push_back({key->text, value->tensor});
  }
  return out;
}

// Checks that the tensor lies inside its storage, and that the storage's bytes
// (`available`, starting at file offset `storage_begin`) hold all its elements.
TensorInfo locate(const std::string& path, const NamedTensor& t, uint64_t storage_begin, uint64_t available,
                  const std::string& record) {
  const auto& ref = t.ref;
  const auto& st = ref.storage;
  const std::string where = path + ": tensor " + t.name;
  using u128 = unsigned __int128;
  const u128 needed_bytes = static_cast<u128>(st.numel) * st.type.element_size;
  if (needed_bytes > available)
    throw Error(where + ": its storage " + record + " holds " + std::to_string(available) + " bytes, fewer than the " +
                std::to_string(st.numel) + " elements of " + st.type.global + " it declares; the file is truncated or corrupt");
  if (ref.storage_offset < 0 || ref.storage_offset > st.numel)
    throw Error(where + ": storage offset " + std::to_string(ref.storage_offset) + " lies outside its storage " +
                record + " of " + std::to_string(st.numel) + " elements");
  u128 extent = 0;  // one past the last element the tensor reaches, relative to the offset
  bool empty = false;
  u128 elements = 1;  // the shape's element count, capped just past INT64_MAX
  constexpr u128 kTooMany = static_cast<u128>(INT64_MAX) + 1;
  for (size_t i = 0; i < ref.size.size(); ++i) {
    if (ref.size[i] < 0 || ref.stride[i] < 0) throw Error(where + ": negative size or stride");
    if (ref.size[i] == 0) empty = true;
    elements = std::min(elements * static_cast<u128>(ref.size[i]), kTooMany);
  }
  if (!empty && elements == kTooMany)
    throw Error(where + ": shape " + shape_string(ref.size) + " overflows: its element count does not fit in 64 bits");
  if (!empty) {
    extent = 1;
    // Each term is below 2^126 and capped again after adding, so the sum never wraps.
    for (size_t i = 0; i < ref.size.size(); ++i)
      extent = std::min(extent + static_cast<u128>(ref.size[i] - 1) * static_cast<u128>(ref.stride[i]), kTooMany);
    if (extent == kTooMany)
      throw Error(where + ": shape " + shape_string(ref.size) + " with strides " + shape_string(ref.stride) +
                  " overflows: it reaches past element 2^63 of its storage");
    if (static_cast<u128>(ref.storage_offset) + extent > static_cast<u128>(st.numel))
      throw Error(where + ": it reaches element " +
                  std::to_string(static_cast<uint64_t>(ref.storage_offset + extent)) + " of storage " + record +
                  ", which holds only " + std::to_string(st.numel) + "; the storage is shorter than its tensor");
  }
  TensorInfo info;
  info.name = t.name;
  info.dtype = st.type.dtype;
  info.shape = ref.size;
  info.file = path;
  info.begin = storage_begin + static_cast<uint64_t>(ref.storage_offset) * st.type.element_size;
  info.end = info.begin + static_cast<uint64_t>(extent) * st.type.element_size;
  int64_t expected = 1;
  for (size_t i = ref.size.size(); i-- > 0;) {
    if (ref.size[i] != 1 && ref.stride[i] != expected && !empty) info.strides = ref.stride;
    expected *= ref.size[i];
  }
  return info;
}

uint32_t u32_at(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) | (static_cast<uint32_t>(p[2]) << 16) |
         (static_cast<uint32_t>(p[3]) << 24);
}

// The one record named <prefix>data.pkl (prefix "" or "<dir>/").
const ZipEntry* find_state_pickle(const ZipArchive& zip, const std::string& path) {
  const ZipEntry* found = nullptr;
  for (const ZipEntry& e : zip.entries()) {
    const std::string& n = e.name;
    if (n.size() < 8 || n.compare(n.size() - 8, 8, "data.pkl") != 0) continue;
    std::string prefix = n.substr(0, n.size() - 8);
    if (!prefix.empty() && (prefix.back() != '/' || prefix.find('/') != prefix.size() - 1)) continue;
    if (found) throw Error(path + ": the archive holds two state-dict pickles, " + found->name + " and " + n);
    found = &e;
  }
  if (!found) throw Error(path + ": a zip archive without data.pkl; not a torch.save checkpoint");
  return found;
}

}  // namespace

PytorchCheckpointFile::PytorchCheckpointFile(const std::string& path) : file_(path) {
  if (ZipArchive::looks_like_zip(file_.data(), file_.size()))
    read_zip();
  else
    read_legacy();
}

// Where the end-of-central-directory record is gone, walks the records from the start
// to say which one the file ends inside, and which tensor that record holds.
[[noreturn]] static void explain_truncated_zip(const ZipArchive& zip, const MappedFile& file) {
  const std::string head = file.path() + ": truncated zip archive (no end-of-central-directory record)";
  std::map<std::string, std::pair<uint64_t, std::string>> storages;  // record -> bytes, first tensor
  uint64_t offset = 0;
  while (auto rec = zip.local_record_at(offset)) {
    uint64_t size = rec->compressed_size;
    std::string holds;
    const bool sized_after = (rec->flags & 8) && size == 0;
    if (rec->name.size() >= 8 && rec->name.compare(rec->name.size() - 8, 8, "data.pkl") == 0) {
      holds = "the state-dict pickle";
      std::vector<NamedTensor> tensors;
      try {
        auto root = pickle::unpickle(file.data(), file.size(), rec->data_offset, file.path() + " (" + rec->name + ")");
        tensors = state_dict_tensors(root.value, file.path());
        if (sized_after) size = root.end - rec->data_offset;
      } catch (const pickle::TruncatedPickle&) {
        throw Error(head + ": it ends inside " + rec->name + ", the state-dict pickle");
      }
      const std::string prefix = rec->name.substr(0, rec->name.size() - 8);
      for (const auto& t : tensors) {
        auto& s = storages[prefix + "data/" + t.ref.storage.key];
        if (s.second.empty()) s = {static_cast<uint64_t>(t.ref.storage.numel) * t.ref.storage.type.element_size, t.name};
      }
    } else if (auto it = storages.find(rec->name); it != storages.end()) {
      holds = "the storage of tensor " + it->second.second;
      if (sized_after) size = it->second.first;
    } else if (sized_after) {
      // A small record (version, byteorder) whose length only its data descriptor
      // states: find the descriptor whose size field matches the distance.
      bool found = false;
      for (uint64_t at = rec->data_offset; !found && at + 16 <= file.size() && at - rec->data_offset < (1u << 20); ++at)
        if (u32_at(file.data() + at) == 0x08074b50 && u32_at(file.data() + at + 8) == at - rec->data_offset) {
          size = at - rec->data_offset;
          found = true;
        }
      if (!found) throw Error(head + ": it ends inside record " + rec->name);
    }
    if (rec->data_offset + size > file.size())
      throw Error(head + ": it ends inside record " + rec->name + (holds.empty() ? "" : ", " + holds));
    offset = rec->data_offset + size;
    if (offset + 4 <= file.size() && u32_at(file.data() + offset) == 0x08074b50)  // data descriptor
      offset += (offset + 28 <= file.size() && u32_at(file.data() + offset + 24) == 0x04034b50) ? 24 : 16;
  }
  if (offset == 0) throw Error(file.path() + ": not a zip archive that torch.save wrote (no end-of-central-directory record)");
  if (offset + 4 <= file.size() && u32_at(file.data() + offset) == 0x02014b50)
    throw Error(head + ": every record up to byte " + std::to_string(offset) +
                " is complete, but the central directory after them is cut off");
  if (file.size() - offset < 30 + 256)
    throw Error(head + ": it ends inside the header of the record at byte " + std::to_string(offset));
  throw Error(head + ": the archive is corrupt after byte " + std::to_string(offset));
}

void PytorchCheckpointFile::read_zip() {
  const std::string& path = file_.path();
  zip_ = std::make_unique<ZipArchive>(path, file_.data(), file_.size());
  const ZipArchive& zip = *zip_;
  if (!zip.has_directory()) explain_truncated_zip(zip, file_);
  const ZipEntry* pkl = find_state_pickle(zip, path);
  const std::string prefix = pkl->name.substr(0, pkl->name.size() - 8);
  if (const ZipEntry* order = zip.find(prefix + "byteorder")) {
    zip.check_crc(*order, "the byte order");
    const uint8_t* p = zip.stored_data(*order, "the byte order");
    std::string byteorder(reinterpret_cast<const char*>(p), order->size);
    if (byteorder != "little")
      throw Error(path + ": storages are " + byteorder + "-endian; only little-endian checkpoints are read");
  }
  // A flipped byte in the pickle could still parse (another shape, another storage key):
  // its CRC is checked on every load; the tensors' records only by verify_checksums().
  zip.check_crc(*pkl, "the state-dict pickle");
  const uint8_t* pkl_data = zip.stored_data(*pkl, "the state-dict pickle");
  auto root = pickle::unpickle(pkl_data, pkl->size, 0, path + " (" + pkl->name + ")");
  std::map<std::string, std::string> storage_types;  // key -> type, checked consistent
  for (const NamedTensor& t : state_dict_tensors(root.value, path)) {
    const auto& st = t.ref.storage;
    auto [it, fresh] = storage_types.emplace(st.key, st.type.global);
    if (!fresh && it->second != st.type.global)
      throw Error(path + ": tensor " + t.name + ": storage " + st.key + " is read both as " + it->second + " and as " +
                  st.type.global);
    const std::string record = prefix + "data/" + st.key;
    const ZipEntry* entry = zip.find(record);
    if (!entry) throw Error(path + ": tensor " + t.name + ": its storage record " + record + " is missing from the archive");
    const uint8_t* bytes = zip.stored_data(*entry, "the storage of tensor " + t.name);
    const uint64_t begin = static_cast<uint64_t>(bytes - file_.data());
    tensors_[t.name] = locate(path, t, begin, entry->size, record);
    if (fresh) storage_records_.emplace_back(record, t.name);
  }
}

size_t PytorchCheckpointFile::verify_checksums() const {
  for (const auto& [record, tensor] : storage_records_)
    zip_->check_crc(*zip_->find(record), "the storage of tensor " + tensor);
  return storage_records_.size();
}

void PytorchCheckpointFile::read_legacy() {
  const std::string& path = file_.path();
  const uint8_t* data = file_.data();
  const size_t size = file_.size();
  if (data[0] != 0x80)
    throw Error(path + ": not a PyTorch checkpoint: neither a zip archive nor the legacy torch.save format");
  // torch's magic number 0x1950a86a20f9469cfc6c as pickle's LONG1 stores it.
  static const std::string kMagic("\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19", 10);
  // The magic number is the file's first pickle; damaged, it is whatever its bytes parse as
  // (a memo lookup, a stray opcode), which says nothing useful about the file.
  pickle::Unpickled magic;
  const std::string no_magic =
      path + ": not a PyTorch checkpoint: it starts with a pickle, but not with torch.save's magic number "
             "0x1950a86a20f9469cfc6c (a legacy checkpoint whose first bytes are damaged, or another pickle)";
  try {
    magic = pickle::unpickle(data, size, 0, path + " (legacy header)");
  } catch (const Error&) {
    throw Error(no_magic);
  }
  if (magic.value->kind != Kind::BigInt || magic.value->text != kMagic) throw Error(no_magic);
  auto protocol = pickle::unpickle(data, size, magic.end, path + " (legacy header)");
  if (protocol.value->kind != Kind::Int || protocol.value->integer != 1001)
    throw Error(path + ": legacy torch.save protocol version is not 1001; re-save with a modern torch or convert to safetensors");
  auto sys_info = pickle::unpickle(data, size, protocol.end, path + " (legacy sys_info)");
  bool little_endian = false;
  if (sys_info.value->kind == Kind::Dict)
    for (auto& [k, v] : sys_info.value->entries)
      if (k->kind == Kind::String && k->text == "little_endian" && v->kind == Kind::Bool) little_endian = v->boolean;
  if (!little_endian)
    throw Error(path + ": legacy checkpoint written on a big-endian machine; only little-endian checkpoints are read");
  auto root = pickle::unpickle(data, size, sys_info.end, path + " (legacy state-dict pickle)");
  auto tensors = state_dict_tensors(root.value, path);
  auto keys = pickle::unpickle(data, size, root.end, path + " (legacy storage keys)");
  if (keys.value->kind != Kind::List) throw Error(path + ": legacy storage key list is not a list");

  std::map<std::string, const NamedTensor*> first_user;  // storage key -> first tensor on it
  for (const NamedTensor& t : tensors) {
    auto [it, fresh] = first_user.emplace(t.ref.storage.key, &t);
    if (!fresh && it->second->ref.storage.type.global != t.ref.storage.type.global)
      throw Error(path + ": tensor " + t.name + ": storage " + t.ref.storage.key + " is read both as " +
                  it->second->ref.storage.type.global + " and as " + t.ref.storage.type.global);
  }
  // Each storage: its element count (int64) then its bytes, in the key list's order.
  std::map<std::string, std::pair<uint64_t, uint64_t>> located;  // key -> (begin, bytes)
  uint64_t pos = keys.end;
  for (const ValuePtr& key : keys.value->items) {
    if (key->kind != Kind::String) throw Error(path + ": legacy storage key list holds a non-string");
    auto user = first_user.find(key->text);
    if (user == first_user.end())
      throw Error(path + ": storage " + key->text + " is in the key list but no tensor uses it");
    const NamedTensor& t = *user->second;
    const std::string where = path + ": tensor " + t.name + ": storage " + key->text;
    if (size - pos < 8) throw Error(where + " is cut off: the file ends at byte " + std::to_string(size) + "; the file is truncated");
    int64_t count = 0;
    std::memcpy(&count, data + pos, 8);
    if (count != t.ref.storage.numel)
      throw Error(where + " holds " + std::to_string(count) + " elements in the file but " +
                  std::to_string(t.ref.storage.numel) + " in the pickle; the file is corrupt");
    const unsigned __int128 bytes = static_cast<unsigned __int128>(count) * t.ref.storage.type.element_size;
    if (bytes > size - pos - 8)
      throw Error(where + ": its " + std::to_string(static_cast<uint64_t>(bytes)) + " bytes at offset " +
                  std::to_string(pos + 8) + " run past the end of the file (" + std::to_string(size) +
                  " bytes); the file is truncated");
    located[key->text] = {pos + 8, static_cast<uint64_t>(bytes)};
    pos += 8 + static_cast<uint64_t>(bytes);
  }
  for (const NamedTensor& t : tensors) {
    auto it = located.find(t.ref.storage.key);
    if (it == located.end())
      throw Error(path + ": tensor " + t.name + ": its storage " + t.ref.storage.key + " is missing from the file");
    tensors_[t.name] = locate(path, t, it->second.first, it->second.second, t.ref.storage.key);
  }
}

torch::Tensor PytorchCheckpointFile::view(const TensorInfo& info) const {
  const auto dtype = scalar_type(info.dtype);
  std::vector<int64_t> strides = info.strides;
  if (strides.empty()) {
    strides.assign(info.shape.size(), 1);
    for (size_t i = info.shape.size(); i-- > 1;) strides[i - 1] = strides[i] * std::max<int64_t>(info.shape[i], 1);
  }
  if (info.end == info.begin) return torch::empty(info.shape, torch::TensorOptions().dtype(dtype));
  const uint8_t* p = file_.data() + info.begin;
  const size_t element = torch::elementSize(dtype);
  if (reinterpret_cast<uintptr_t>(p) % element == 0)
    // Read-only mapping: WeightStore::get converts or only reads it.
    return torch::from_blob(const_cast<uint8_t*>(p), info.shape, strides, torch::TensorOptions().dtype(dtype));
  // The legacy format packs storages without alignment: copy to aligned memory.
  auto bytes = torch::empty({static_cast<int64_t>(info.end - info.begin)}, torch::kUInt8);
  std::memcpy(bytes.data_ptr<uint8_t>(), p, info.end - info.begin);
  return bytes.view(dtype).as_strided(info.shape, strides, 0);
}

}  // namespace kvevict
