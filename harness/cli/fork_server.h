// A kvevict process that has already loaded LibTorch and forks a child per command line
// it is sent, so that a test suite which runs the CLI hundreds of times (the bad-input
// table) pays the dynamic loading and static initialisation of Debian's LibTorch (about
// one CPU-second, 290 shared libraries) once, not per run. Each child is the binary's own
// main with the arguments, environment and working directory of the request, its stdout
// and stderr in the files named, and /proc/self/exe still this binary.
//
// Started by setting KVEVICT_FORK_SERVER=1 in kvevict's environment (tests/test_support.cpp
// does). Protocol on stdin/stdout, fields NUL-terminated:
//   request:  cwd, stdout path, stderr path, argument count, arguments (argv[0] first),
//             environment count, NAME=VALUE entries
//   reply:    the child's wait status in decimal, then '\n'
// The server never runs an OpenMP region or starts a thread, so each child starts as a
// fresh process would. It exits when stdin closes, which is also what the death of the
// client does; then it removes its run-files folder (KVEVICT_FORK_SERVER_FOLDER: the
// last run's stdout and stderr files, then the folder if empty).
#pragma once

namespace kvevict {

using CommandLineMain = int (*)(int argc, char** argv);

// Serves requests until stdin closes; returns the process's exit code.
int serve_forked_commands(CommandLineMain run);

// Flushes stdout and stderr and ends the process without static destructors: LibTorch's
// deregister its ~2000 operators one by one (about 0.3 CPU-seconds per run, and in a
// forked child they write to, and so copy, most of the parent's pages). Every file kvevict
// writes is closed (and renamed into place) before its command returns.
[[noreturn]] void exit_without_static_destructors(int code);

}  // namespace kvevict
