#!/usr/bin/env bash
# Structure-aware fuzzing of every cairn-format decoder (crates/cairn-format/src/fuzz.rs)
# for longer than the test suite's fixed 3,000 cases per decoder: release build with
# overflow checks and debug assertions on, each decoder fuzzed for SECONDS.
#   scripts/fuzz.sh [SECONDS_PER_DECODER] [SEED]
# Wall time is about SECONDS x 13 decoders / cores, plus the build. Prints the cases run per
# decoder; on a failure prints the decoder, the input as hex and the
# CAIRN_FUZZ_SEED / CAIRN_FUZZ_CASE that reproduce it, and exits non-zero.
set -euo pipefail
cd "$(dirname "$0")/.."
secs=${1:-60}
seed=${2:-$(date +%s)}
threads=$(nproc 2>/dev/null || echo 2)
echo "== fuzzing each decoder for ${secs}s, seed $seed, $threads threads"
export CARGO_PROFILE_RELEASE_OVERFLOW_CHECKS=true
export CARGO_PROFILE_RELEASE_DEBUG_ASSERTIONS=true
set +e
CAIRN_FUZZ_SECS=$secs CAIRN_FUZZ_SEED=$seed \
  cargo test --release -q -p cairn-format --lib fuzz:: -- --nocapture --test-threads="$threads" 2>&1 |
  sed -E 's/^\.+//' | grep -vE '^(running [0-9]+ tests?|test .* \.\.\. ok|)$'
status=${PIPESTATUS[0]}
set -e
if [ "$status" != 0 ]; then
  echo "== FAILED (seed $seed)"
  exit 1
fi
echo "== ok (seed $seed)"
