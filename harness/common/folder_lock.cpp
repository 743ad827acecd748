#include "harness/common/folder_lock.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <cerrno>
#include <cstring>
#include <filesystem>

#include "harness/common/errors.h"

namespace kvevict {

FolderLock::FolderLock(const std::string& dir, bool wait, const std::function<void(const std::string&)>& waiting) {
  const std::string path = (std::filesystem::path(dir) / ".kvevict.lock").string();
  fd_ = ::open(path.c_str(), O_RDWR | O_CREAT | O_CLOEXEC, 0644);
  if (fd_ < 0) throw Error(path + ": cannot create the folder's lock file (" + std::strerror(errno) + ")");
  int rc;
  while ((rc = ::flock(fd_, LOCK_EX | LOCK_NB)) != 0 && errno == EINTR) {
  }
  if (rc != 0 && errno == EWOULDBLOCK) {
    char holder[32] = {0};
    const ssize_t n = ::pread(fd_, holder, sizeof holder - 1, 0);
    const std::string who = n > 0 ? " (pid " + std::string(holder, static_cast<size_t>(n)) + ")" : "";
    if (!wait) {
      ::close(fd_);
      throw Error(dir + ": another kvevict process" + who +
                  " is writing to this folder; wait for it to finish, or pass --wait");
    }
    if (waiting) waiting("waiting for another kvevict process" + who + " to release " + dir);
    while ((rc = ::flock(fd_, LOCK_EX)) != 0 && errno == EINTR) {
    }
  }
  if (rc != 0) {
    const std::string message = path + ": cannot lock (" + std::strerror(errno) + ")";
    ::close(fd_);
    throw Error(message);
  }
  // Who holds it, for the other writer's message only; the lock itself is the flock.
  const std::string pid = std::to_string(::getpid());
  if (::ftruncate(fd_, 0) == 0 && ::pwrite(fd_, pid.data(), pid.size(), 0) < 0) {
    // informational only
  }
}

FolderLock::~FolderLock() {
  if (fd_ >= 0) ::close(fd_);  // closing the descriptor releases the flock
}

}  // namespace kvevict
