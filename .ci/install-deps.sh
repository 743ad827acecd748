#!/usr/bin/env bash
# Debian packages kvevict needs to build, test and export notebooks. Run as root.
# Debian 12 (bookworm: LibTorch 1.13, Catch2 2) or 13 (trixie: LibTorch 2.6, Catch2 3).
#   --suite-only   leave out what only the deep checks (clang, libFuzzer) and the Slurm
#                  cluster test need (that test then reports itself skipped)
#   --no-cluster   leave out only Slurm and munge (the Debian 13 chroot's deep checks)
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
with_clang=1
with_cluster=1
case "${1:-}" in
  --suite-only) with_clang=0 with_cluster=0 ;;
  --no-cluster) with_cluster=0 ;;
  "") ;;
  *) echo "install-deps.sh: unknown option $1 (--suite-only or --no-cluster)" >&2; exit 2 ;;
esac
. /etc/os-release
case "${VERSION_CODENAME:-}" in
  bookworm) clang=(clang-14 libclang-rt-14-dev) ;;
  *) clang=(clang-19 libclang-rt-19-dev) ;;
esac
extra=()
[ "$with_clang" = 1 ] && extra+=("${clang[@]}")
[ "$with_cluster" = 1 ] && extra+=(slurm-wlm munge)
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  build-essential cmake pkg-config git \
  libtorch-dev libsentencepiece-dev nlohmann-json3-dev libcli11-dev catch2 libicu-dev libcpp-httplib-dev libssl-dev \
  libopenblas0-openmp libgoogle-perftools-dev libsleef-dev libgmp-dev python3 \
  jupyter-nbconvert python3-ipykernel python3-pandas python3-matplotlib \
  "${extra[@]}" \
  > /dev/null
