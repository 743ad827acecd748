// The test programs' runner (Catch2 2 or 3: tests/catch.h).
#define CATCH_CONFIG_RUNNER
#include "tests/catch.h"

int main(int argc, char* argv[]) { return Catch::Session().run(argc, argv); }
