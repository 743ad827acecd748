#include "harness/common/output_paths.h"

#include <sys/stat.h>
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

// The checks every output folder shares: not a file, not an input nor inside an input
// folder, and its nearest existing ancestor a writable folder.
void check_folder_itself(const fs::path& p, const std::string& flag, const std::string& given,
                         const CommandInputs& inputs) {
  std::error_code error;
  if (path_exists(p) && !fs::is_directory(p, error)) refuse(flag, given, "is a file, not a folder");
  if (const std::string why = inputs.conflict(p.string()); !why.empty()) refuse(flag, given, why);
  const fs::path base = existing_ancestor(p);
  if (!fs::is_directory(base, error)) refuse(flag, given, base.string() + " is a file, not a folder");
  if (::access(base.c_str(), W_OK) != 0) refuse(flag, given, base.string() + " is not writable");
}

}  // namespace

CommandInputs& CommandInputs::file(const std::string& path, const std::string& what) {
  add(path, false, what + " " + path);
  return *this;
}

CommandInputs& CommandInputs::folder(const std::string& path, const std::string& what) {
  add(path, true, what + " " + path);
  // Its files by inode too: a model folder's files are often links into a cache (Hugging
  // Face's blobs/), and an output linked to one must not write through to it.
  std::error_code error, unreadable;
  for (fs::directory_iterator it(path, error), end; !error && it != end; it.increment(error))
    if (fs::is_regular_file(it->path(), unreadable))
      add(it->path().string(), false, what + " " + path + "'s " + it->path().filename().string());
  return *this;
}

void CommandInputs::add(const std::string& path, bool is_folder, const std::string& description) {
  struct stat st {};
  if (path.empty() || ::stat(path.c_str(), &st) != 0) return;
  inputs_.push_back({st.st_dev, st.st_ino, is_folder, description});
}

std::string CommandInputs::conflict(const std::string& path) const {
  if (inputs_.empty()) return "";
  struct stat st {};
  if (::stat(path.c_str(), &st) == 0)  // through a symbolic link: the file it names
    for (const Input& input : inputs_)
      if (input.device == st.st_dev && input.inode == st.st_ino)
        return "is " + input.description + ", which this command reads; kvevict never overwrites its inputs (write elsewhere)";
  // Inside an input folder: every existing folder above the resolved path, by inode.
  for (fs::path at = resolved(path).parent_path(); !at.empty(); at = at.parent_path()) {
    if (::stat(at.c_str(), &st) == 0)
      for (const Input& input : inputs_)
        if (input.is_folder && input.device == st.st_dev && input.inode == st.st_ino)
          return "lies in " + input.description + ", a folder this command reads; kvevict never writes there (write elsewhere)";
    if (at == at.parent_path()) break;
  }
  return "";
}

bool is_sweep_folder(const std::string& dir) {
  const fs::path d(dir);
  return path_exists(d / "results.csv") || path_exists(d / ".kvevict.lock") || path_exists(d / "slurm" / "sweep.json");
}

void check_output_file(const std::string& path, const std::string& flag, const CommandInputs& inputs) {
  if (path.empty()) refuse(flag, "\"\"", "is empty");
  const fs::path p = resolved(path);
  check_not_sweep_state(p, flag, path);
  if (const std::string why = inputs.conflict(path); !why.empty()) refuse(flag, path, why);
  std::error_code error;
  if (fs::is_directory(p, error)) refuse(flag, path, "is a folder, not a file");
  const fs::path folder = p.parent_path();
  if (!fs::is_directory(folder, error)) refuse(flag, path, "its folder " + folder.string() + " does not exist");
  if (::access(folder.c_str(), W_OK) != 0) refuse(flag, path, "its folder " + folder.string() + " is not writable");
}

void check_output_folder(const std::string& dir, const std::string& flag, const CommandInputs& inputs,
                         const std::vector<std::string>& file_names) {
  if (dir.empty()) refuse(flag, "\"\"", "is empty");
  const fs::path p = resolved(dir);
  check_not_sweep_state(p, flag, dir);
  check_folder_itself(p, flag, dir, inputs);
  for (const auto& name : file_names) {
    const std::string file = (fs::path(dir) / name).string();
    check_not_sweep_state(p / name, flag, file);
    if (const std::string why = inputs.conflict(file); !why.empty()) refuse(flag, file, why);
    std::error_code error;
    if (fs::is_directory(p / name, error)) refuse(flag, file, "is a folder, not a file");
  }
}

void check_sweep_output_folder(const std::string& dir, const std::string& flag, const CommandInputs& inputs) {
  if (dir.empty()) refuse(flag, "\"\"", "is empty");
  const fs::path p = resolved(dir);
  check_folder_itself(p, flag, dir, inputs);
  for (const char* name : {"results.csv", "config.json", ".kvevict.lock"}) {
    const std::string file = (fs::path(dir) / name).string();
    if (const std::string why = inputs.conflict(file); !why.empty()) refuse(flag, file, why);
  }
}

}  // namespace kvevict
