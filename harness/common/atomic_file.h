// Whole-file writes that a concurrent reader never sees half done: the bytes go to a
// temporary file in the same folder, are fsync'ed, and the file is renamed over the
// target (then the folder is fsync'ed, so the new name survives a crash).
#pragma once
#include <string>

namespace kvevict {

// Writes `text` to `path` atomically; kvevict::Error naming the path on failure.
void write_file_atomically(const std::string& path, const std::string& text);

// A temporary name beside `path` (same folder, so a rename is atomic), unique per process.
std::string temporary_path_beside(const std::string& path);

// Renames the finished `temporary` (already fsync'ed) over `path` and fsyncs the folder.
void publish_file(const std::string& temporary, const std::string& path);

}  // namespace kvevict
