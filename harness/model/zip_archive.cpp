#include "harness/model/zip_archive.h"

#include <algorithm>
#include <cstdio>
#include <cstring>

#include "harness/common/errors.h"

namespace kvevict {
namespace {

constexpr uint32_t kLocalHeader = 0x04034b50;
constexpr uint32_t kCentralHeader = 0x02014b50;
constexpr uint32_t kEndOfDirectory = 0x06054b50;
constexpr uint32_t kZip64EndOfDirectory = 0x06064b50;
constexpr uint32_t kZip64Locator = 0x07064b50;
constexpr uint16_t kZip64ExtraId = 0x0001;

uint16_t u16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | (p[1] << 8)); }
uint32_t u32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | (static_cast<uint32_t>(p[1]) << 8) |
         (static_cast<uint32_t>(p[2]) << 16) | (static_cast<uint32_t>(p[3]) << 24);
}
uint64_t u64(const uint8_t* p) { return u32(p) | (static_cast<uint64_t>(u32(p + 4)) << 32); }

// Replaces the 0xFFFFFFFF placeholders of a header with the 64-bit values of its ZIP64
// extra field, which holds only the fields that overflowed, in this order.
bool apply_zip64_extra(const uint8_t* extra, size_t extra_len, uint64_t* size,
                       uint64_t* compressed_size, uint64_t* offset) {
  size_t pos = 0;
  while (pos + 4 <= extra_len) {
    uint16_t id = u16(extra + pos), len = u16(extra + pos + 2);
    if (pos + 4 + len > extra_len) return false;
    if (id == kZip64ExtraId) {
      const uint8_t* field = extra + pos + 4;
      size_t used = 0;
      for (uint64_t* value : {size, compressed_size, offset}) {
        if (!value || *value != 0xFFFFFFFFu) continue;
        if (used + 8 > len) return false;
        *value = u64(field + used);
        used += 8;
      }
      return true;
    }
    pos += 4 + len;
  }
  return true;
}

// CRC-32 eight bytes at a time ("slicing by 8"): table[k][b] is the CRC of byte b
// followed by k zero bytes.
struct Crc32Tables {
  uint32_t table[8][256];
  Crc32Tables() {
    for (uint32_t b = 0; b < 256; ++b) {
      uint32_t crc = b;
      for (int k = 0; k < 8; ++k) crc = (crc >> 1) ^ (0xEDB88320u & (0u - (crc & 1u)));
      table[0][b] = crc;
    }
    for (uint32_t b = 0; b < 256; ++b)
      for (int k = 1; k < 8; ++k) table[k][b] = (table[k - 1][b] >> 8) ^ table[0][table[k - 1][b] & 0xFF];
  }
};

}  // namespace

uint32_t zip_crc32(const uint8_t* data, size_t size) {
  static const Crc32Tables tables;
  const auto& t = tables.table;
  uint32_t crc = 0xFFFFFFFFu;
  for (; size >= 8; data += 8, size -= 8) {
    const uint32_t low = crc ^ u32(data), high = u32(data + 4);
    crc = t[7][low & 0xFF] ^ t[6][(low >> 8) & 0xFF] ^ t[5][(low >> 16) & 0xFF] ^ t[4][low >> 24] ^
          t[3][high & 0xFF] ^ t[2][(high >> 8) & 0xFF] ^ t[1][(high >> 16) & 0xFF] ^ t[0][high >> 24];
  }
  for (; size > 0; ++data, --size) crc = (crc >> 8) ^ t[0][(crc ^ *data) & 0xFF];
  return ~crc;
}

bool ZipArchive::looks_like_zip(const uint8_t* data, size_t size) {
  return size >= 4 && u32(data) == kLocalHeader;
}

ZipArchive::ZipArchive(std::string path, const uint8_t* data, size_t size)
    : path_(std::move(path)), data_(data), size_(size) {
  // The end record is the last 22 bytes, unless an archive comment (at most 64 KiB) follows.
  if (size_ < 22) return;
  size_t lowest = size_ > 22 + 0xFFFF ? size_ - 22 - 0xFFFF : 0;
  for (size_t at = size_ - 22 + 1; at-- > lowest;) {
    if (u32(data_ + at) != kEndOfDirectory) continue;
    const uint8_t* end = data_ + at;
    if (at + 22 + u16(end + 20) > size_) continue;  // a signature inside the comment
    const auto corrupt = [&](const std::string& what) {
      return Error(path_ + ": corrupt zip archive: " + what);
    };
    const uint16_t disk = u16(end + 4), directory_disk = u16(end + 6);
    const uint64_t disk_count = u16(end + 8);
    uint64_t count = u16(end + 10), directory_size = u32(end + 12), directory_offset = u32(end + 16);
    uint64_t end_records = at;  // where the central directory must end
    if (disk != 0 || directory_disk != 0)
      throw corrupt("the end record names disk " + std::to_string(disk) + " and directory disk " +
                    std::to_string(directory_disk) + "; a multi-disk archive is not a torch.save file");
    if (at >= 20 && u32(data_ + at - 20) == kZip64Locator) {
      uint64_t zip64_end = u64(data_ + at - 20 + 8);
      if (zip64_end > at - 20 || at - 20 - zip64_end < 56 || u32(data_ + zip64_end) != kZip64EndOfDirectory)
        throw Error(path_ + ": corrupt zip archive: the ZIP64 end-of-central-directory locator points to offset " +
                    std::to_string(zip64_end) + ", where no ZIP64 end record is");
      const uint8_t* z = data_ + zip64_end;
      const uint64_t z_disk_count = u64(z + 24), z_count = u64(z + 32), z_size = u64(z + 40), z_offset = u64(z + 48);
      if (u32(z + 16) != 0 || u32(z + 20) != 0 || z_disk_count != z_count)
        throw corrupt("the ZIP64 end record describes a multi-disk archive");
      // The end record keeps each value that fits and 0xFFFF... ("see ZIP64") for one
      // that does not, as torch's, Python's, Go's and Java's writers do.
      const auto agrees = [&](const char* field, uint64_t small, uint64_t placeholder, uint64_t wide) {
        if (small != std::min(wide, placeholder))
          throw corrupt("the end record's " + std::string(field) + " " + std::to_string(small) +
                        " disagrees with the ZIP64 end record's " + std::to_string(wide) +
                        (small == placeholder ? " (the placeholder stands only for a value too large for it)" : ""));
      };
      agrees("entry count", count, 0xFFFF, z_count);
      agrees("entry count on this disk", disk_count, 0xFFFF, z_count);
      agrees("central directory size", directory_size, 0xFFFFFFFFu, z_size);
      agrees("central directory offset", directory_offset, 0xFFFFFFFFu, z_offset);
      count = z_count;
      directory_size = z_size;
      directory_offset = z_offset;
      end_records = zip64_end;
    } else if (disk_count != count) {
      throw corrupt("the end record counts " + std::to_string(count) + " entries in all but " +
                    std::to_string(disk_count) + " on its disk");
    }
    read_directory(directory_offset, directory_size, count, end_records);
    has_directory_ = true;
    return;
  }
}

void ZipArchive::read_directory(uint64_t directory_offset, uint64_t directory_size, uint64_t count,
                                uint64_t end_records) {
  if (directory_offset > size_ || directory_size > size_ - directory_offset)
    throw Error(path_ + ": truncated zip archive: the central directory (" + std::to_string(directory_size) +
                " bytes at offset " + std::to_string(directory_offset) + ") runs past the end of the file (" +
                std::to_string(size_) + " bytes)");
  if (directory_offset + directory_size != end_records)
    throw Error(path_ + ": corrupt zip archive: the central directory (" + std::to_string(directory_size) +
                " bytes at offset " + std::to_string(directory_offset) + ") does not end where the end record begins (byte " +
                std::to_string(end_records) + ")");
  const uint8_t* p = data_ + directory_offset;
  const uint8_t* end = p + directory_size;
  for (uint64_t i = 0; i < count; ++i) {
    if (p == end)
      throw Error(path_ + ": corrupt zip archive: the end record counts " + std::to_string(count) +
                  " entries, but the central directory holds " + std::to_string(i));
    if (end - p < 46 || u32(p) != kCentralHeader)
      throw Error(path_ + ": corrupt zip archive: central directory entry " + std::to_string(i) + " of " +
                  std::to_string(count) + " is malformed");
    ZipEntry e;
    e.flags = u16(p + 8);
    e.method = u16(p + 10);
    e.crc32 = u32(p + 16);
    e.compressed_size = u32(p + 20);
    e.size = u32(p + 24);
    uint16_t name_len = u16(p + 28), extra_len = u16(p + 30), comment_len = u16(p + 32);
    e.local_header_offset = u32(p + 42);
    if (static_cast<uint64_t>(end - p) < 46u + name_len + extra_len + comment_len)
      throw Error(path_ + ": corrupt zip archive: central directory entry " + std::to_string(i) +
                  " runs past the directory");
    e.name.assign(reinterpret_cast<const char*>(p + 46), name_len);
    if (!apply_zip64_extra(p + 46 + name_len, extra_len, &e.size, &e.compressed_size, &e.local_header_offset))
      throw Error(path_ + ": corrupt zip archive: record " + e.name + " has a malformed ZIP64 extra field");
    if (e.local_header_offset >= directory_offset)
      throw Error(path_ + ": corrupt zip archive: record " + e.name + " has its local header at byte " +
                  std::to_string(e.local_header_offset) + ", not before the central directory (byte " +
                  std::to_string(directory_offset) + ")");
    if (!by_name_.emplace(e.name, entries_.size()).second)
      throw Error(path_ + ": corrupt zip archive: record " + e.name + " appears twice");
    entries_.push_back(std::move(e));
    p += 46 + name_len + extra_len + comment_len;
  }
  if (p != end)
    throw Error(path_ + ": corrupt zip archive: the end record counts " + std::to_string(count) +
                " entries, but the central directory holds " + std::to_string(end - p) + " bytes more");
}

const ZipEntry* ZipArchive::find(const std::string& name) const {
  auto it = by_name_.find(name);
  return it == by_name_.end() ? nullptr : &entries_[it->second];
}

std::optional<ZipLocalRecord> ZipArchive::local_record_at(uint64_t offset) const {
  if (offset > size_ || size_ - offset < 30 || u32(data_ + offset) != kLocalHeader) return std::nullopt;
  const uint8_t* p = data_ + offset;
  ZipLocalRecord r;
  r.flags = u16(p + 6);
  r.method = u16(p + 8);
  uint64_t compressed = u32(p + 18), size = u32(p + 22);
  uint16_t name_len = u16(p + 26), extra_len = u16(p + 28);
  if (size_ - offset < 30u + name_len + extra_len) return std::nullopt;
  r.name.assign(reinterpret_cast<const char*>(p + 30), name_len);
  r.zip64 = compressed == 0xFFFFFFFFu || size == 0xFFFFFFFFu;
  if (!apply_zip64_extra(p + 30 + name_len, extra_len, &size, &compressed, nullptr)) return std::nullopt;
  r.compressed_size = compressed;
  r.data_offset = offset + 30 + name_len + extra_len;
  return r;
}

const uint8_t* ZipArchive::stored_data(const ZipEntry& entry, const std::string& what) const {
  const std::string where = path_ + ": record " + entry.name + " (" + what + ")";
  if (entry.flags & 1) throw Error(where + " is encrypted; torch.save never encrypts");
  if (entry.method != 0)
    throw Error(where + " is compressed (zip method " + std::to_string(entry.method) +
                "); only stored records are read, as torch.save writes them: unzip and re-zip with -0, or re-save with torch.save");
  auto local = local_record_at(entry.local_header_offset);
  if (!local || local->name != entry.name)
    throw Error(where + ": no matching local header at offset " + std::to_string(entry.local_header_offset) +
                "; the archive is corrupt or truncated");
  if (local->data_offset > size_ || entry.size > size_ - local->data_offset)
    throw Error(where + ": its " + std::to_string(entry.size) + " bytes at offset " +
                std::to_string(local->data_offset) + " run past the end of the file (" + std::to_string(size_) +
                " bytes); the archive is truncated");
  if (entry.compressed_size != entry.size)
    throw Error(where + ": stored size " + std::to_string(entry.compressed_size) + " differs from its size " +
                std::to_string(entry.size) + "; the archive is corrupt");
  return data_ + local->data_offset;
}

void ZipArchive::check_crc(const ZipEntry& entry, const std::string& what) const {
  const uint32_t crc = zip_crc32(stored_data(entry, what), entry.size);
  if (crc != entry.crc32) {
    char found[16], expected[16];
    std::snprintf(found, sizeof found, "%08x", crc);
    std::snprintf(expected, sizeof expected, "%08x", entry.crc32);
    throw Error(path_ + ": record " + entry.name + " (" + what + "): its bytes have CRC-32 " + found +
                ", the central directory says " + expected + "; the archive is corrupt");
  }
}

}  // namespace kvevict
