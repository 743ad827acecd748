// An exclusive lock on an output folder, so two processes never write one results.csv
// (two sweeps into one --out, a merge into a folder a sweep is filling, or the rewrite
// a resume does). It is flock(2) on DIR/.kvevict.lock: the kernel drops it when the
// process ends, however it ends, so a kill -9 never leaves a stale lock behind.
#pragma once
#include <functional>
#include <string>

namespace kvevict {

class FolderLock {
 public:
  // Locks `dir` (which must exist). Without `wait`, a folder another process holds is a
  // kvevict::Error naming the folder and that process; with it, this call tells
  // `waiting` (a line naming both) and blocks until the folder is free.
  FolderLock(const std::string& dir, bool wait, const std::function<void(const std::string&)>& waiting = {});
  ~FolderLock();
  FolderLock(const FolderLock&) = delete;
  FolderLock& operator=(const FolderLock&) = delete;

 private:
  int fd_ = -1;
};

}  // namespace kvevict
