#include "harness/common/atomic_file.h"

#include <fcntl.h>
#include <unistd.h>

#include <cerrno>
#include <cstdio>
#include <cstring>
#include <filesystem>

#include "harness/common/errors.h"
#include "harness/common/kill_points.h"

namespace kvevict {
namespace fs = std::filesystem;

namespace {

std::string system_error(const std::string& what) { return what + " (" + std::strerror(errno) + ")"; }

void fsync_folder_of(const std::string& path) {
  const auto folder = fs::absolute(path).parent_path();
  int fd = ::open(folder.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
  if (fd < 0) return;
  ::fsync(fd);  // best effort: some file systems refuse it on folders
  ::close(fd);
}

}  // namespace

std::string temporary_path_beside(const std::string& path) {
  const fs::path target(path);
  return (target.parent_path() / ("." + target.filename().string() + ".tmp." + std::to_string(::getpid()))).string();
}

void publish_file(const std::string& temporary, const std::string& path) {
  kill_point("publish-before-rename");  // the new file is complete; `path` still the old one
  if (std::rename(temporary.c_str(), path.c_str()) != 0) {
    const std::string message = system_error(path + ": cannot rename " + temporary + " over it");
    std::remove(temporary.c_str());
    throw Error(message);
  }
  fsync_folder_of(path);
}

void write_file_atomically(const std::string& path, const std::string& text) {
  const std::string temporary = temporary_path_beside(path);
  int fd = ::open(temporary.c_str(), O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
  if (fd < 0) throw Error(system_error(path + ": cannot create " + temporary));
  size_t written = 0;
  while (written < text.size()) {
    ssize_t n = ::write(fd, text.data() + written, text.size() - written);
    if (n < 0 && errno == EINTR) continue;
    if (n < 0) {
      const std::string message = system_error(path + ": cannot write");
      ::close(fd);
      std::remove(temporary.c_str());
      throw Error(message);
    }
    written += static_cast<size_t>(n);
  }
  const bool synced = ::fsync(fd) == 0;
  const bool closed = ::close(fd) == 0;
  if (!synced || !closed) {
    const std::string message = system_error(path + ": cannot flush");
    std::remove(temporary.c_str());
    throw Error(message);
  }
  publish_file(temporary, path);
}

}  // namespace kvevict
