#!/usr/bin/env bash
# Runs the crash harness (SIGKILL of backup and prune at random points, then
# check --read-data and an exact restore of every committed snapshot) with more
# trials than the test suite's 100, over several seeds; then the concurrency test
# (two backups and a prune at once, forget between rounds) with more rounds.
#   scripts/crash-trials.sh [TRIALS_PER_SEED] [SEEDS] [CONCURRENCY_ROUNDS]
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-250}
seeds=${2:-4}
rounds=${3:-20}
cargo build --tests -q -p cairn-cli
for s in $(seq 1 "$seeds"); do
  seed=$((s * 7919))
  echo "== seed $seed, $trials trials"
  CAIRN_CRASH_TRIALS=$trials CAIRN_CRASH_SEED=$seed \
    cargo test -q -p cairn-cli --test it -- maintenance::killed --nocapture 2>&1 |
    grep -E "crash harness|test result|panicked|FAILED" || true
done
echo "== concurrency, $rounds rounds"
CAIRN_CONCURRENCY_ROUNDS=$rounds \
  cargo test -q -p cairn-cli --test it -- maintenance::backups_and_prune --nocapture 2>&1 |
  grep -E "test result|panicked|FAILED|cairn: error" || true
