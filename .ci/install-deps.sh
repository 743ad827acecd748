#!/usr/bin/env bash
# Debian packages kvevict needs to build, test and export notebooks. Run as root.
set -euo pipefail
export DEBIAN_FRONTEND=noninteractive
apt-get update -qq
apt-get install -y -qq --no-install-recommends \
  build-essential cmake pkg-config git \
  libtorch-dev libsentencepiece-dev nlohmann-json3-dev libcli11-dev catch2 libicu-dev libcpp-httplib-dev \
  libopenblas0-openmp libgoogle-perftools-dev libsleef-dev libgmp-dev \
  clang-14 libclang-rt-14-dev python3 \
  slurm-wlm munge \
  jupyter-nbconvert python3-ipykernel python3-pandas python3-matplotlib \
  > /dev/null
