#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <string>

#include "harness/common/files.h"
#include "tests/catch.h"

namespace fs = std::filesystem;
using kvevict::remove_tree;

TEST_CASE("remove_tree removes a folder's whole tree and follows no link out of it", "[files]") {
  const fs::path root = fs::temp_directory_path() / ("kvevict_remove_tree_" + std::to_string(::getpid()));
  const fs::path outside = root.string() + "_outside";
  fs::create_directories(root / "a" / "b" / "c");
  fs::create_directories(outside);
  std::ofstream(root / "a" / "b" / "c" / "deep.txt") << "x";
  std::ofstream(root / "top.txt") << "y";
  std::ofstream(outside / "kept.txt") << "z";
  fs::create_directory_symlink(outside, root / "a" / "link");

  CHECK(remove_tree(root.string()));
  CHECK_FALSE(fs::exists(fs::symlink_status(root)));
  CHECK(fs::exists(outside / "kept.txt"));  // the link went, not what it pointed to

  CHECK(remove_tree(root.string()));  // nothing there: nothing left either
  std::ofstream(root.string() + "_file") << "w";
  CHECK(remove_tree(root.string() + "_file"));  // a plain file is a tree of one
  CHECK_FALSE(fs::exists(root.string() + "_file"));
  CHECK(remove_tree(outside.string()));
  CHECK_FALSE(fs::exists(outside));
}
