#!/usr/bin/env bash
# CTest entry for the tests that need a real Slurm: brings up a one-node cluster
# (tests/slurm/cluster.sh), runs the Catch tests tagged [slurm] against it, and stops the
# daemons by their pid files whatever happens. Where the daemons cannot start the tests
# are skipped with the reason (exit 77, which CTest reports as "Skipped"), except when
# the CI environment variable is set: there they must start, so the test fails.
set -uo pipefail
tests_binary=$1
here=$(cd "$(dirname "$0")" && pwd)
state=$(mktemp -d /tmp/kvevict-slurm.XXXXXX)
cleanup() {
  bash "$here/cluster.sh" stop "$state"
  rm -rf "$state"
}
trap cleanup EXIT

if ! started=$(bash "$here/cluster.sh" start "$state" 2>&1); then
  if [[ -n ${CI:-} ]]; then
    echo "FAILED: CI is set and the Slurm test cluster did not start:"
    echo "$started"
    exit 1
  fi
  echo "SKIPPED: the Slurm test cluster cannot start on this machine, so the [slurm] tests did not run:"
  echo "$started"
  exit 77
fi
eval "$(tail -n 1 <<<"$started")"  # export SLURM_CONF=...
echo "Slurm test cluster up ($SLURM_CONF)"
"$tests_binary" "[slurm]"
