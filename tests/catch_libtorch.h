// Catch2 in a test file that also uses LibTorch. LibTorch pulls in glog, whose CHECK
// macros would shadow Catch's; glog is included here first, so the #undefs always follow
// it, whatever the file included before (a unity build includes several test files in
// one translation unit, where only the first inclusion of either header counts).
#pragma once
#include <c10/util/Logging.h>
#undef CHECK
#undef CHECK_EQ
#include "tests/catch.h"
