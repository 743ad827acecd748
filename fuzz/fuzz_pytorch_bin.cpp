// pytorch_model.bin's containers: the zip directory, its records and their CRC-32s (input
// starting with "PK") or the restricted unpickler (anything else), which must refuse every
// global outside its allow-list, never run past the data and bound the nesting.
#include "fuzz/fuzz_support.h"
#include "harness/common/errors.h"
#include "harness/model/restricted_unpickler.h"
#include "harness/model/zip_archive.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    if (kvevict::ZipArchive::looks_like_zip(data, size)) {
      kvevict::ZipArchive zip("pytorch_model.bin", data, size);
      for (const auto& entry : zip.entries()) {
        try {
          zip.check_crc(entry, entry.name);
        } catch (const kvevict::Error&) {
        }
        try {
          // The pickle is read whatever its CRC says, so that mutations reach the unpickler.
          const uint8_t* record = zip.stored_data(entry, entry.name);
          if (entry.name.size() >= 8 && entry.name.compare(entry.name.size() - 8, 8, "data.pkl") == 0)
            kvevict::pickle::unpickle(record, entry.size, 0, entry.name);
        } catch (const kvevict::Error&) {
        }
      }
      if (!zip.has_directory()) zip.local_record_at(0);
    } else {
      size_t start = 0;
      // The legacy format is several pickles in a row.
      for (int i = 0; i < 8 && start < size; ++i) start = kvevict::pickle::unpickle(data, size, start, "pytorch_model.bin").end;
    }
  } catch (const kvevict::Error&) {
  }
  return 0;
}
