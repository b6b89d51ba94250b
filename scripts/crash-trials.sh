#!/usr/bin/env bash
# Runs the crash harness (SIGKILL of backup and prune at random points, then
# check --read-data and an exact restore of every committed snapshot) with more
# trials than the test suite's 100, over several seeds.
#   scripts/crash-trials.sh [TRIALS_PER_SEED] [SEEDS]
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-250}
seeds=${2:-4}
cargo build --tests -q -p cairn-cli
for s in $(seq 1 "$seeds"); do
  seed=$((s * 7919))
  echo "== seed $seed, $trials trials"
  CAIRN_CRASH_TRIALS=$trials CAIRN_CRASH_SEED=$seed \
    cargo test -q -p cairn-cli --test it -- maintenance::killed --nocapture 2>&1 |
    grep -E "crash harness|test result|panicked|FAILED" || true
done
