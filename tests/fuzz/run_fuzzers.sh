#!/usr/bin/env bash
# Builds the libFuzzer targets in fuzz/ (clang, ASan + UBSan) and runs each for a bounded
# time on seeds made from the real data. Any crash, sanitizer report or leaked exception
# fails the run; libFuzzer writes the reproducer to $WORK/artifacts/<target>-crash-*.
#
#   tests/fuzz/run_fuzzers.sh [WORK_DIR]   (default: build/fuzz)
#   KVEVICT_FUZZ_SECONDS   seconds per target (default 60)
#   KVEVICT_FUZZ_TARGETS   space-separated subset (default: all)
#   KVEVICT_FUZZ_JOBS      build parallelism (default 2)
# Reproduce one finding: $WORK/fuzz_<target> $WORK/artifacts/<target>-crash-<sha>
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
WORK="$(realpath -m "${1:-$ROOT/build/fuzz}")"
SECONDS_EACH="${KVEVICT_FUZZ_SECONDS:-60}"
DATA="${KVEVICT_DATA:-$ROOT/../shared/data}"
# Debian 12's clang is 14, Debian 13's 19.
CXX_FUZZ="${KVEVICT_FUZZ_CXX:-$(command -v clang++-14 || command -v clang++-19 || echo clang++-14)}"
ALL="safetensors config_json sentencepiece bpe_json bpe_added_tokens bpe_vocab_merges task_jsonl results_csv pytorch_bin sweep_config slurm_record analyze_config results_export server_request duo_pattern"
TARGETS="${KVEVICT_FUZZ_TARGETS:-$ALL}"

if ! command -v "$CXX_FUZZ" >/dev/null; then
  echo "fuzz: $CXX_FUZZ not found (bash .ci/install-deps.sh installs clang and libFuzzer)" >&2
  exit 1
fi
launcher=()
command -v ccache >/dev/null && launcher=(-DCMAKE_CXX_COMPILER_LAUNCHER=ccache)
cmake -S "$ROOT/fuzz" -B "$WORK/build" -DCMAKE_CXX_COMPILER="$CXX_FUZZ" -DCMAKE_BUILD_TYPE=None \
  "${launcher[@]}" >/dev/null
cmake --build "$WORK/build" -j"${KVEVICT_FUZZ_JOBS:-2}" >/dev/null

rm -rf "$WORK/seeds"
python3 "$ROOT/tests/fuzz/make_seeds.py" "$DATA" "$ROOT" "$WORK/seeds"
mkdir -p "$WORK/artifacts"
export ASAN_OPTIONS="abort_on_error=1:detect_leaks=1:allocator_may_return_null=1"
export UBSAN_OPTIONS="print_stacktrace=1:halt_on_error=1"

failed=()
for target in $TARGETS; do
  corpus="$WORK/corpus/$target"  # grows across runs; the seeds stay as made
  mkdir -p "$corpus"
  log="$WORK/$target.log"
  # -rss_limit_mb: the 2 GB default leaves no room on a 2-core CI machine running two.
  if "$WORK/build/fuzz_$target" -max_total_time="$SECONDS_EACH" -rss_limit_mb=1536 -timeout=20 \
       -max_len=65536 -print_final_stats=1 -artifact_prefix="$WORK/artifacts/$target-" \
       "$corpus" "$WORK/seeds/$target" >"$log" 2>&1; then
    runs=$(grep -o 'stat::number_of_executed_units: *[0-9]*' "$log" | grep -o '[0-9]*$' || echo "?")
    cov=$(grep -o 'cov: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
    ft=$(grep -o 'ft: [0-9]*' "$log" | tail -1 | grep -o '[0-9]*' || echo "?")
    echo "fuzz_$target: ok, $runs executions in ${SECONDS_EACH}s, coverage $cov edges, $ft features"
  else
    echo "fuzz_$target: FAILED (log $log)"
    grep -E "ERROR|runtime error|SUMMARY|Test unit written|terminate called" "$log" | head -8
    failed+=("$target")
  fi
done
if [ ${#failed[@]} -gt 0 ]; then
  echo "fuzz: ${#failed[@]} target(s) found a crash: ${failed[*]}; reproducers in $WORK/artifacts" >&2
  exit 1
fi
