// The test programs' runner (Catch2 2 or 3: tests/catch.h).
#define CATCH_CONFIG_RUNNER
#include "tests/catch.h"

// tests/test_support.cpp's: removes the temporary folders of the case that ended. Weak,
// so that a runner without test_support (the SentencePiece cross-check) links.
extern "C" void kvevict_test_case_ended() __attribute__((weak));

namespace {

#if KVEVICT_CATCH_MAJOR >= 3
using ListenerBase = Catch::EventListenerBase;
#else
using ListenerBase = Catch::TestEventListenerBase;
#endif

// A case's folders go when it ends, however it ends: a failed REQUIRE or an exception
// unwinds to Catch, which then reports the case ended.
struct TempFolderCleanup : ListenerBase {
  using ListenerBase::ListenerBase;
  void testCaseEnded(const Catch::TestCaseStats& stats) override {
    if (kvevict_test_case_ended) kvevict_test_case_ended();
    ListenerBase::testCaseEnded(stats);
  }
};

}  // namespace

CATCH_REGISTER_LISTENER(TempFolderCleanup)

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
