#!/usr/bin/env bash
# The README's test command on Debian 13 (trixie: LibTorch 2.6, Catch2 3, GCC 14), in a
# debootstrap chroot on this Debian 12 machine; with --sanitize, the README's deep checks
# there instead (tests/sanitizers/run_suite.sh: the suite under ASan + UBSan, and the fuzz
# targets built with clang 19). Run as root. CI runs the deep checks here, after the
# README's test command on Debian 12, so each LibTorch runs the whole suite once. The
# repository's parent folder (the repository and ../shared) is bind-mounted into the
# chroot; the build goes to build-debian13/ (build-debian13-sanitize/) in the repository.
#
#   tests/debian13/run_suite.sh [--sanitize] [CHROOT]
#       CHROOT: default /var/tmp/kvevict-trixie, kept for reuse
#   KVEVICT_FUZZ_SECONDS   with --sanitize: seconds per fuzz target (default 60)
#
# The Slurm cluster test is left out there (it starts daemons; the Debian 12 suite runs it).
set -euo pipefail
ROOT="$(cd "$(dirname "$0")/../.." && pwd)"
PARENT="$(dirname "$ROOT")"
NAME="$(basename "$ROOT")"
sanitize=0
if [ "${1:-}" = "--sanitize" ]; then
  sanitize=1
  shift
fi
CHROOT="${1:-/var/tmp/kvevict-trixie}"
# The archive this machine's own apt uses, for the new suite.
MIRROR="$(sed -n 's/^URIs: *//p' /etc/apt/sources.list.d/debian.sources 2>/dev/null | head -n 1)"
MIRROR="${MIRROR:-http://deb.debian.org/debian}"

started=$(date +%s)
if [ ! -x "$CHROOT/usr/bin/apt-get" ]; then
  command -v debootstrap >/dev/null || apt-get install -y -qq debootstrap >/dev/null
  debootstrap --variant=minbase --components=main,contrib,non-free trixie "$CHROOT" "$MIRROR" >/dev/null
fi
echo "deb $MIRROR trixie main contrib non-free" > "$CHROOT/etc/apt/sources.list"

mounted=()
cleanup() {
  for ((i = ${#mounted[@]} - 1; i >= 0; i--)); do umount -l "${mounted[$i]}" 2>/dev/null || true; done
}
trap cleanup EXIT
bind() {  # bind SOURCE TARGET_IN_CHROOT
  mkdir -p "$CHROOT$2"
  mountpoint -q "$CHROOT$2" || { mount --bind "$1" "$CHROOT$2"; mounted+=("$CHROOT$2"); }
}
mountpoint -q "$CHROOT/proc" || { mount -t proc proc "$CHROOT/proc"; mounted+=("$CHROOT/proc"); }
bind /dev /dev
bind /dev/pts /dev/pts
bind "$PARENT" /kvevict-src

inside() { chroot "$CHROOT" /usr/bin/env -i PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root LANG=C.UTF-8 bash -c "$1"; }
if [ "$sanitize" = 1 ]; then
  inside "cd /kvevict-src/$NAME && bash .ci/install-deps.sh --no-cluster"
  echo "debian13: chroot ready in $(( $(date +%s) - started )) s"
  inside "cd /kvevict-src/$NAME && KVEVICT_FUZZ_SECONDS=${KVEVICT_FUZZ_SECONDS:-60} bash tests/sanitizers/run_suite.sh build-debian13-sanitize"
  echo "debian13: deep checks done in $(( $(date +%s) - started )) s"
  exit 0
fi
inside "cd /kvevict-src/$NAME && bash .ci/install-deps.sh --suite-only"
echo "debian13: chroot ready in $(( $(date +%s) - started )) s"
inside "cd /kvevict-src/$NAME && cmake -S . -B build-debian13 -DCMAKE_BUILD_TYPE=Release >/dev/null && cmake --build build-debian13 -j2 -- --no-print-directory >/dev/null"
echo "debian13: built in $(( $(date +%s) - started )) s"
inside "cd /kvevict-src/$NAME && ctest --test-dir build-debian13 -j2 --output-on-failure -E '^slurm_cluster\$'"
echo "debian13: tested in $(( $(date +%s) - started )) s"
