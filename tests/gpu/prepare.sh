#!/usr/bin/env bash
# Prepares the device check (tests/gpu/run_on_device.sh) on a Debian 12 machine that reaches
# Debian's archive, for a GPU machine that reaches nothing: into .gpu/ (git-ignored through
# .git/info/exclude), the build's Debian packages as .deb files (unpacked there, never
# installed) and the part of the shared data the device goldens read. Carry .gpu with the
# device tool (`carry: [".gpu"]`); the whole travels in well under its 64 MiB.
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
DATA="${KVEVICT_DATA:-$ROOT/../shared/data}"
cd "$ROOT"
grep -qx '/.gpu/' .git/info/exclude 2>/dev/null || echo '/.gpu/' >> .git/info/exclude
rm -rf .gpu && mkdir -p .gpu/debs .gpu/data
# Headers and libraries the CUDA image lacks; LibTorch, CUDA, the compiler, CMake and
# OpenMP come with the image (a PyTorch wheel's LibTorch brings its own Sleef).
packages=(
  nlohmann-json3-dev libcli11-dev catch2 libicu-dev libicu72 libsentencepiece-dev libsentencepiece0
  libprotobuf-lite32 libcpp-httplib-dev libcpp-httplib0.11 libssl-dev libssl3 libbrotli-dev libbrotli1 zlib1g-dev
  libgoogle-perftools-dev libtcmalloc-minimal4 libgoogle-perftools4 libunwind8 libgmp-dev libgmp10 libgmpxx4ldbl
  pkgconf pkgconf-bin libpkgconf3
)
(cd .gpu/debs && apt-get download "${packages[@]}" >/dev/null)
cp -r "$DATA/models" "$DATA/golden" "$DATA/text" "$DATA/mathqa" .gpu/data/
du -sh .gpu/debs .gpu/data
