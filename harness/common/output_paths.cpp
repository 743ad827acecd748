#include "harness/common/output_paths.h"

#include <unistd.h>

#include <filesystem>

#include "harness/common/errors.h"

namespace kvevict {
namespace fs = std::filesystem;

namespace {

// The path made absolute, with symbolic links and "..", "." resolved as far as it exists.
fs::path resolved(const std::string& path) {
  std::error_code error;
  fs::path p = fs::weakly_canonical(fs::absolute(path), error);
  if (error) p = fs::absolute(path).lexically_normal();
  if (!p.has_filename() && p.has_parent_path()) p = p.parent_path();  // "dir/" -> "dir"
  return p;
}

bool path_exists(const fs::path& p) {
  std::error_code error;
  return fs::exists(p, error);
}

// The first folder at or above `p` that is a sweep folder's own subfolder (slurm/,
// shards/, predictions/), or empty.
fs::path inside_sweep_subfolder(const fs::path& p) {
  for (fs::path at = p; at.has_relative_path(); at = at.parent_path()) {
    const std::string name = at.filename().string();
    if ((name == "slurm" || name == "shards" || name == "predictions") && is_sweep_folder(at.parent_path().string()))
      return at;
    if (at == at.parent_path()) break;
  }
  return {};
}

[[noreturn]] void refuse(const std::string& flag, const std::string& path, const std::string& why) {
  throw Error(flag + " " + path + ": " + why);
}

void check_not_sweep_state(const fs::path& p, const std::string& flag, const std::string& given) {
  const std::string name = p.filename().string();
  if ((name == "results.csv" || name == "config.json" || name == ".kvevict.lock") &&
      is_sweep_folder(p.parent_path().string()))
    refuse(flag, given, "is the sweep folder " + p.parent_path().string() + "'s own " + name +
                            "; kvevict never overwrites it (write elsewhere)");
  const fs::path sub = inside_sweep_subfolder(p);
  if (!sub.empty())
    refuse(flag, given, "lies in the sweep folder " + sub.parent_path().string() + "'s own " +
                            sub.filename().string() + "/ folder; kvevict never writes there (write elsewhere)");
}

// The nearest existing folder at or above `p`.
fs::path existing_ancestor(fs::path p) {
  while (!path_exists(p) && p.has_relative_path() && p != p.parent_path()) p = p.parent_path();
  return p;
}

}  // namespace

bool is_sweep_folder(const std::string& dir) {
  const fs::path d(dir);
  return path_exists(d / "results.csv") || path_exists(d / ".kvevict.lock") || path_exists(d / "slurm" / "sweep.json");
}

void check_output_file(const std::string& path, const std::string& flag) {
  if (path.empty()) refuse(flag, "\"\"", "is empty");
  const fs::path p = resolved(path);
  check_not_sweep_state(p, flag, path);
  std::error_code error;
  if (fs::is_directory(p, error)) refuse(flag, path, "is a folder, not a file");
  const fs::path folder = p.parent_path();
  if (!fs::is_directory(folder, error)) refuse(flag, path, "its folder " + folder.string() + " does not exist");
  if (::access(folder.c_str(), W_OK) != 0) refuse(flag, path, "its folder " + folder.string() + " is not writable");
}

void check_output_folder(const std::string& dir, const std::string& flag) {
  if (dir.empty()) refuse(flag, "\"\"", "is empty");
  const fs::path p = resolved(dir);
  check_not_sweep_state(p, flag, dir);
  std::error_code error;
  if (path_exists(p) && !fs::is_directory(p, error)) refuse(flag, dir, "is a file, not a folder");
  const fs::path base = existing_ancestor(p);
  if (!fs::is_directory(base, error)) refuse(flag, dir, base.string() + " is a file, not a folder");
  if (::access(base.c_str(), W_OK) != 0) refuse(flag, dir, base.string() + " is not writable");
}

}  // namespace kvevict
