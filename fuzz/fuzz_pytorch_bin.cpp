// pytorch_model.bin's containers: the zip directory and its records (input starting
// with "PK") or the restricted unpickler (anything else), which must refuse every
// global outside its allow-list and never run past the data.
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
