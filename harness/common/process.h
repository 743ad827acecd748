// Running another program: argv only (no shell, so nothing in an argument is
// interpreted), stdin from /dev/null, stdout and stderr captured separately.
#pragma once
#include <string>
#include <vector>

namespace kvevict {

struct ProcessResult {
  int exit_code = -1;  // 128 + the signal when a signal ended it; 127 when it could not start
  std::string out, err;
};

// Runs argv[0] (a path) with its arguments and waits for it. Throws kvevict::Error only
// when no process could be started at all.
ProcessResult run_process(const std::vector<std::string>& argv);

// The executable `name` resolves to: itself when it holds a '/', else the first match on
// PATH; "" when there is none.
std::string find_executable(const std::string& name);

// The first line of a program's output, without trailing spaces or CR.
std::string first_line(const std::string& text);

}  // namespace kvevict
