// Fault injection for the crash test (tests/test_crash_resume.cpp): with
// KVEVICT_KILL_POINT=NAME:N set, the N-th time the process reaches the point NAME it
// kills itself with SIGKILL, exactly as `kill -9` at that moment would. Unset (always,
// outside that test), a point is one getenv on first use and a comparison after.
#pragma once

namespace kvevict {

// True when this is the armed point's N-th hit (the caller then does its partial work
// and calls kill_now()).
bool kill_point_reached(const char* name);
[[noreturn]] void kill_now();
// kill_point_reached + kill_now.
inline void kill_point(const char* name) {
  if (kill_point_reached(name)) kill_now();
}

}  // namespace kvevict
