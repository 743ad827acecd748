#!/usr/bin/env bash
# The whole test suite again under AddressSanitizer + UndefinedBehaviorSanitizer, plus
# the libFuzzer targets (tests/fuzz/run_fuzzers.sh, as the CTest test fuzz_parsers).
# The README's deep checks; CI runs them after the README's test command.
#
#   tests/sanitizers/run_suite.sh [BUILD_DIR]      (default: build-sanitize)
#   KVEVICT_FUZZ_SECONDS   seconds per fuzz target (default 60)
#
# LibTorch (and OpenBLAS, ICU, protobuf) come from Debian uninstrumented. ASan still
# checks every access kvevict's own code makes, but:
#  - detect_leaks=0: LibTorch and its dependencies allocate process-lifetime singletons
#    (operator registry, thread pools) they never free; LeakSanitizer reports those as
#    leaks on every exit, drowning anything real. The fuzz targets (no LibTorch) keep
#    leak detection on.
#  - the uninstrumented libraries' own memory errors are out of reach here.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
BUILD="${1:-$ROOT/build-sanitize}"
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
# -O1 -g1: quick to compile on CI's two cores, fast enough to run, function names in reports.
cmake -S "$ROOT" -B "$BUILD" -DCMAKE_BUILD_TYPE=None -DCMAKE_CXX_FLAGS="-O1 -g1" -DKVEVICT_SANITIZE=ON \
  -DKVEVICT_FUZZ_SECONDS="${KVEVICT_FUZZ_SECONDS:-60}" "${launcher[@]}"
cmake --build "$BUILD" -j2
export ASAN_OPTIONS="detect_leaks=0:abort_on_error=1:strict_string_checks=1:detect_stack_use_after_return=0"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"
# The Slurm test starts a real cluster around the same code paths; the release suite covers it.
ctest --test-dir "$BUILD" --output-on-failure -j2 -E '^slurm_cluster$'
