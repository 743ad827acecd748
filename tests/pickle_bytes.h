// Byte-by-byte builders for torch.save files in tests: pickle opcodes, the state-dict
// pickle torch.save writes, the legacy container's header and a minimal zip writer with
// its own CRC-32 (independent of the reader's), so every byte a test file holds is
// explained here.
#pragma once
#include <cstdint>
#include <string>
#include <vector>

namespace kvevict::test::pickle_bytes {

using Bytes = std::string;

inline void put16(Bytes& b, uint16_t v) {
  for (int i = 0; i < 2; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
}
inline void put32(Bytes& b, uint32_t v) {
  for (int i = 0; i < 4; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
}
inline void put64(Bytes& b, uint64_t v) {
  for (int i = 0; i < 8; ++i) b.push_back(static_cast<char>(v >> (8 * i)));
}

inline uint32_t crc32(const Bytes& data) {
  uint32_t crc = 0xFFFFFFFFu;
  for (unsigned char c : data) {
    crc ^= c;
    for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
  }
  return ~crc;
}

struct ZipRecord {
  std::string name;
  Bytes data;
  uint16_t method = 0;  // 0 stored; 8 claims deflate (the bytes are not really compressed)
};

// A minimal zip writer: local headers with the sizes, a 64-byte-aligned data start (as
// torch's writer pads), the central directory and the end record; with `zip64`, every
// record's size and offset goes through ZIP64 extra fields, and a ZIP64 end record
// precedes the end record, as in multi-GB shards.
inline Bytes write_zip(const std::vector<ZipRecord>& records, bool zip64) {
  Bytes out, central;
  for (const ZipRecord& r : records) {
    const uint64_t offset = out.size();
    Bytes extra;
    if (zip64) {
      put16(extra, 1), put16(extra, 16), put64(extra, r.data.size()), put64(extra, r.data.size());
    }
    size_t data_start = offset + 30 + r.name.size() + extra.size() + 4;
    size_t pad = (64 - data_start % 64) % 64;
    put16(extra, 0x4246), put16(extra, static_cast<uint16_t>(pad)), extra.append(pad, 'Z');
    const uint32_t small_size = zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(r.data.size());
    put32(out, 0x04034b50), put16(out, zip64 ? 45 : 20), put16(out, 0), put16(out, r.method);
    put32(out, 0), put32(out, crc32(r.data)), put32(out, small_size), put32(out, small_size);
    put16(out, static_cast<uint16_t>(r.name.size())), put16(out, static_cast<uint16_t>(extra.size()));
    out += r.name + extra + r.data;

    Bytes cextra;
    if (zip64) {
      put16(cextra, 1), put16(cextra, 24), put64(cextra, r.data.size()), put64(cextra, r.data.size());
      put64(cextra, offset);
    }
    put32(central, 0x02014b50), put16(central, 45), put16(central, zip64 ? 45 : 20), put16(central, 0);
    put16(central, r.method), put32(central, 0), put32(central, crc32(r.data));
    put32(central, small_size), put32(central, small_size);
    put16(central, static_cast<uint16_t>(r.name.size())), put16(central, static_cast<uint16_t>(cextra.size()));
    put16(central, 0), put16(central, 0), put16(central, 0), put32(central, 0);
    put32(central, zip64 ? 0xFFFFFFFFu : static_cast<uint32_t>(offset));
    central += r.name + cextra;
  }
  const uint64_t directory_offset = out.size();
  out += central;
  if (zip64) {
    const uint64_t end64 = out.size();
    put32(out, 0x06064b50), put64(out, 44), put16(out, 45), put16(out, 45), put32(out, 0), put32(out, 0);
    put64(out, records.size()), put64(out, records.size()), put64(out, central.size()), put64(out, directory_offset);
    put32(out, 0x07064b50), put32(out, 0), put64(out, end64), put32(out, 1);
  }
  // The end record keeps every value that fits its field (all do here), as torch's and
  // Python's writers do even beside a ZIP64 end record; 0xFFFF... would mean "too large".
  put32(out, 0x06054b50), put16(out, 0), put16(out, 0);
  put16(out, static_cast<uint16_t>(records.size())), put16(out, static_cast<uint16_t>(records.size()));
  put32(out, static_cast<uint32_t>(central.size())), put32(out, static_cast<uint32_t>(directory_offset));
  put16(out, 0);
  return out;
}

// Pickle opcodes, spelled out.
inline Bytes str(const std::string& s) {
  Bytes b = "X";
  put32(b, static_cast<uint32_t>(s.size()));
  return b + s;
}
inline Bytes integer(int32_t v) {
  Bytes b = "J";
  put32(b, static_cast<uint32_t>(v));
  return b;
}
inline Bytes ints(const std::vector<int64_t>& v) {
  Bytes b = "(";
  for (auto x : v) b += integer(static_cast<int32_t>(x));
  return b + "t";
}
inline const Bytes kOrderedDict = "ccollections\nOrderedDict\n)R";

struct PickledTensor {
  std::string name, storage_global, key;
  int64_t numel, offset;
  std::vector<int64_t> size, stride;
};

// The state-dict pickle torch.save writes (protocol 2), optionally with the
// OrderedDict's _metadata attribute set by BUILD, as Module.state_dict() leaves it.
inline Bytes state_dict_pickle(const std::vector<PickledTensor>& tensors, bool with_metadata) {
  Bytes b = "\x80\x02" + kOrderedDict + "(";
  for (const auto& t : tensors) {
    b += str(t.name) + "ctorch._utils\n_rebuild_tensor_v2\n(";
    b += "(" + str("storage") + "ctorch\n" + t.storage_global + "\n" + str(t.key) + str("cpu") + integer(static_cast<int32_t>(t.numel)) + "tQ";
    b += integer(static_cast<int32_t>(t.offset)) + ints(t.size) + ints(t.stride) + "\x89" + kOrderedDict + "tR";
  }
  b += "u";
  if (with_metadata)
    b += "}(" + str("_metadata") + kOrderedDict + "(" + str("") + "}(" + str("version") + integer(1) + "uuub";
  return b + ".";
}

inline Bytes floats(const std::vector<float>& v) {
  return Bytes(reinterpret_cast<const char*>(v.data()), v.size() * 4);
}
inline Bytes halves(const std::vector<uint16_t>& v) {
  return Bytes(reinterpret_cast<const char*>(v.data()), v.size() * 2);
}

// Pickle's LONG1: a signed little-endian integer of 8 bytes (64-bit sizes).
inline Bytes long8(int64_t v) {
  Bytes b("\x8a\x08", 2);
  put64(b, static_cast<uint64_t>(v));
  return b;
}

// The legacy container's three header pickles: magic number, protocol 1001, sys_info.
inline Bytes legacy_header() {
  Bytes b("\x80\x02\x8a\x0a\x6c\xfc\x9c\x46\xf9\x20\x6a\xa8\x50\x19.", 15);
  b += Bytes("\x80\x02M\xe9\x03.", 6);
  b += "\x80\x02}(" + str("little_endian") + "\x88u.";
  return b;
}

}  // namespace kvevict::test::pickle_bytes
