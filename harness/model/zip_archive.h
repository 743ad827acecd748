// The read side of the zip container torch.save (>= 1.6) writes: a central directory
// (ZIP64 aware) over stored, uncompressed records that are used in place.
#pragma once
#include <cstddef>
#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

namespace kvevict {

struct ZipEntry {
  std::string name;
  uint16_t flags = 0;
  uint16_t method = 0;  // 0 = stored, 8 = deflate
  uint32_t crc32 = 0;   // of the uncompressed bytes, as the central directory records it
  uint64_t compressed_size = 0, size = 0;
  uint64_t local_header_offset = 0;
};

// The CRC-32 of zip (ISO-HDLC: polynomial 0xEDB88320, reflected, inverted in and out).
uint32_t zip_crc32(const uint8_t* data, size_t size);

// A local file header as found when walking the archive from its start.
struct ZipLocalRecord {
  std::string name;
  uint16_t flags = 0, method = 0;
  uint64_t data_offset = 0;       // where the record's bytes begin
  uint64_t compressed_size = 0;   // 0 when the sizes follow the data (flag bit 3)
  bool zip64 = false;
};

class ZipArchive {
 public:
  static bool looks_like_zip(const uint8_t* data, size_t size);

  // Reads the end-of-central-directory record (and its ZIP64 form) and the central
  // directory. A missing end record is not thrown here: has_directory() says so, so
  // that the caller can tell which record the truncation cut (see local_record_at).
  // The structure is checked and kvevict::Error names `path` when it is wrong: one disk
  // only, the end record's counts, size and offset equal the ZIP64 end record's where
  // they fit (0xFFFF... where they do not), the directory ends where the end records
  // begin and holds exactly the entries counted, no name twice.
  ZipArchive(std::string path, const uint8_t* data, size_t size);

  bool has_directory() const { return has_directory_; }
  const std::vector<ZipEntry>& entries() const { return entries_; }
  const ZipEntry* find(const std::string& name) const;

  // The bytes of a stored record. Throws kvevict::Error naming the file, the record
  // and `what` (the tensor it holds) when the record is compressed, encrypted or cut off.
  const uint8_t* stored_data(const ZipEntry& entry, const std::string& what) const;

  // Throws kvevict::Error naming the file, the record and `what` when the record's
  // stored bytes do not have the CRC-32 the central directory gives.
  void check_crc(const ZipEntry& entry, const std::string& what) const;

  // The local header at `offset`, when one is there and complete.
  std::optional<ZipLocalRecord> local_record_at(uint64_t offset) const;

 private:
  void read_directory(uint64_t directory_offset, uint64_t directory_size, uint64_t count, uint64_t end_records);

  std::string path_;
  const uint8_t* data_;
  size_t size_;
  bool has_directory_ = false;
  std::vector<ZipEntry> entries_;
  std::map<std::string, size_t> by_name_;
};

}  // namespace kvevict
