#!/usr/bin/env bash
# The device check of issue 42, on a machine with an NVIDIA GPU and a PyTorch wheel (the
# device tool's H200: PyTorch 2.11 + CUDA 13, no network), from the repository root after
# tests/gpu/prepare.sh ran here and .gpu/ was carried:
#   1. builds kvevict against the wheel's LibTorch (-DKVEVICT_CUDA=ON), with the Debian
#      packages of .gpu/debs unpacked into a folder of their own;
#   2. runs the goldens (stories260K, the family fixtures, KIVI, DMC, h2o-paper, the
#      bfloat16 and float16 cases) and the device policy path's checks on --device cuda,
#      against the same tolerances as on the CPU (KVEVICT_TEST_DEVICE);
#   3. runs configs/bench_gpu_8b.json: an 8B shape drawn on the GPU, prefill and decode
#      tokens/s at 4k and 32k, full cache and h2o at 20%.
# Everything it prints also goes to $OUT/device_check.log. Meant to finish in under 10 minutes.
set -uo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
cd "$ROOT"
LOG="${OUT:-$ROOT/.gpu}/device_check.log"
exec > >(tee "$LOG") 2>&1
started=$(date +%s)
stamp() { echo "== $(( $(date +%s) - started )) s: $*"; }

DEPS=/tmp/kvevict-deps
mkdir -p "$DEPS"
for f in .gpu/debs/*.deb; do dpkg -x "$f" "$DEPS"; done
TORCH_PREFIX="$(python3 -c 'import torch; print(torch.utils.cmake_prefix_path)')"
TORCH_LIB="$(python3 -c 'import os, torch; print(os.path.join(os.path.dirname(torch.__file__), "lib"))')"
export PATH="$DEPS/usr/bin:$PATH"
export PKG_CONFIG_SYSROOT_DIR="$DEPS"
export PKG_CONFIG_LIBDIR="$DEPS/usr/lib/x86_64-linux-gnu/pkgconfig:$DEPS/usr/share/pkgconfig"
export LD_LIBRARY_PATH="$DEPS/usr/lib/x86_64-linux-gnu:$TORCH_LIB:${LD_LIBRARY_PATH:-}"
export KVEVICT_DATA="$ROOT/.gpu/data"
nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader
python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)'

# Each step gets what is left of BUDGET seconds, so that the log of every finished step
# comes back even when a later one runs long.
BUDGET="${KVEVICT_DEVICE_BUDGET:-560}"
left() { echo $(( BUDGET - ($(date +%s) - started) )); }
echo "tools: $(command -v g++ gcc nvcc cmake ninja | tr '\n' ' ')"
g++ --version | head -n 1; cmake --version | head -n 1; nvcc --version | tail -n 1

stamp "configure"
# Debian's multiarch headers (gmp.h, openssl/opensslconf.h) sit where pkg-config does not point.
generator=(-G Ninja) keep_going=(-k 0); command -v ninja >/dev/null || generator=() keep_going=(-k)
cmake -S . -B build-gpu "${generator[@]}" -DCMAKE_BUILD_TYPE=Release -DKVEVICT_CUDA=ON \
  -DCMAKE_PREFIX_PATH="$TORCH_PREFIX;$DEPS/usr" -DCMAKE_CUDA_ARCHITECTURES=90 \
  -DCMAKE_CXX_FLAGS="-isystem $DEPS/usr/include/x86_64-linux-gnu" >build-gpu.log 2>&1 \
  || { tail -n 60 build-gpu.log; cp build-gpu.log "${OUT:-.gpu}/" 2>/dev/null; exit 1; }
grep -m 3 "kvevict:" build-gpu.log
stamp "build kvevict and kvevict_tests"
cmake --build build-gpu -j "$(nproc)" --target kvevict kvevict_tests -- "${keep_going[@]}" >>build-gpu.log 2>&1 \
  || { grep -m 20 -B2 -A8 "error" build-gpu.log; cp build-gpu.log "${OUT:-.gpu}/" 2>/dev/null; }
ldd build-gpu/kvevict 2>/dev/null | grep -E "not found|torch_cuda|gomp"

if [ -x build-gpu/kvevict_tests ]; then
  stamp "goldens and the device policy path on cuda"
  KVEVICT_TEST_DEVICE=cuda timeout "$(( $(left) - 200 ))" build-gpu/kvevict_tests \
    "[golden]~[h2o_pipeline]~[ftfy]~[analyze],[device-policy],[device]" -w NoAssertions --durations yes
  stamp "goldens done (exit $?)"
fi

[ -x build-gpu/kvevict ] || exit 1
# 4k first, then 32k with whatever time is left: the 4k rows come back even if 32k runs long.
for context in 4096 32768; do
  python3 -c "import json, sys; c = json.load(open('configs/bench_gpu_8b.json')); c['contexts'] = [$context]; json.dump(c, open('/tmp/bench_$context.json', 'w'))"
  stamp "bench: 8B shape, bfloat16, $context tokens ($(left) s left)"
  timeout "$(left)" build-gpu/kvevict bench --config "/tmp/bench_$context.json" --device cuda
  stamp "bench $context done (exit $?)"
done
nvidia-smi --query-gpu=memory.used,clocks.sm --format=csv,noheader
