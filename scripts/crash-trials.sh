#!/usr/bin/env bash
# The crash harnesses with many more trials than the test suite's hundred: backup,
# prune and repair index (maintenance.rs), backup of a tree with every kind of entry,
# copy, and key passwd/add/remove (crash.rs). Each trial kills the operation with
# SIGKILL, at one of its named kill points (cairn_core::hooks; two trials in three)
# or after a random delay, then checks that what was committed is intact: check
# --read-data clean, every committed snapshot restoring exactly, a password that
# opens. Then the concurrency test (two backups and a prune at once) with more rounds.
#
#   scripts/crash-trials.sh [TRIALS] [SEEDS] [CONCURRENCY_ROUNDS]
#
# TRIALS (default 1000) is the total over every harness and seed: half go to
# backup/prune/repair, a fifth each to copy and to keys, a tenth to the full-tree
# backup. Prints per-operation counts of trials, kills at points and failures, and
# exits non-zero when any trial or test failed (or, from 200 trials on, when a kill
# point was never hit). Logs stay in $CRASH_LOG_DIR (default: a new directory under
# /tmp).
set -euo pipefail
cd "$(dirname "$0")/.."
trials=${1:-1000}
seeds=${2:-2}
rounds=${3:-20}
logs=${CRASH_LOG_DIR:-$(mktemp -d /tmp/cairn-crash-trials.XXXXXX)}
mkdir -p "$logs"
share() { # share PERCENT: that part of the trials, per seed, at least 1
  local n=$(((trials * $1 / 100 + seeds - 1) / seeds))
  echo $((n > 0 ? n : 1))
}
maint=$(share 50)
copies=$(share 20)
keys=$(share 20)
full=$(share 10)
cargo build --tests -q -p cairn-cli
failed=0
for s in $(seq 1 "$seeds"); do
  seed=$((s * 7919))
  echo "== seed $seed: $maint backup/prune/repair, $full full-tree backup, $copies copy, $keys key trials"
  set +e
  CAIRN_CRASH_SEED=$seed CAIRN_CRASH_TRIALS=$maint CAIRN_CRASH_FULL_TREE_TRIALS=$full \
    CAIRN_CRASH_COPY_TRIALS=$copies CAIRN_CRASH_KEY_TRIALS=$keys \
    cargo test -q -p cairn-cli --test it -- maintenance::killed crash::killed --nocapture \
    >"$logs/seed-$seed.log" 2>&1
  status=$?
  set -e
  # (cargo's progress dots may start a line: match anywhere)
  grep -oE "crash-trials: .* failures=[0-9]+|^test result.*|^    [a-z:_]+$" \
    "$logs/seed-$seed.log" || true
  grep -A2 "panicked at" "$logs/seed-$seed.log" || true
  if [ "$status" -ne 0 ]; then
    echo "!! seed $seed: cargo test exited with $status (log: $logs/seed-$seed.log)"
    failed=1
  fi
done
echo "== concurrency, $rounds rounds"
set +e
CAIRN_CONCURRENCY_ROUNDS=$rounds \
  cargo test -q -p cairn-cli --test it -- maintenance::backups_and_prune --nocapture \
  >"$logs/concurrency.log" 2>&1
status=$?
set -e
grep -E "^test result" "$logs/concurrency.log" || true
grep -A2 "panicked at" "$logs/concurrency.log" || true
if [ "$status" -ne 0 ]; then
  echo "!! concurrency: cargo test exited with $status (log: $logs/concurrency.log)"
  failed=1
fi

echo "== summary ($logs)"
points=$(grep -o 'name: "[a-z:-]*"' crates/cairn-core/src/hooks.rs | cut -d'"' -f2 | sort -u)
cat "$logs"/seed-*.log | awk -v all="$(echo "$points" | tr '\n' ' ')" '
  { i = index($0, "crash-trials: "); if (i == 0) next; $0 = substr($0, i) }
  / failures=/ {
    op = ""
    for (i = 3; i <= NF; i++) {
      split($i, kv, "=")
      if (kv[1] == "op") { op = kv[2]; if (!(op in seen)) { seen[op] = 1; order[++nops] = op } }
      else v[op, kv[1]] += kv[2]
    }
  }
  / points / {
    op = substr($3, 4)
    for (i = 5; i <= NF; i++) {
      split($i, kv, "=")
      if (kv[2] > 0) { if (!((op, kv[1]) in hit)) { hit[op, kv[1]] = 1; nhit[op]++ } }
      p = kv[1]; sub(/:[0-9]+$/, "", p); named[p] = 1
    }
  }
  END {
    printf "%-11s %7s %10s %7s %15s %9s %11s\n", "operation", "trials", "at-points", "random",
      "random-mid-run", "failures", "points-hit"
    for (k = 1; k <= nops; k++) {
      op = order[k]
      printf "%-11s %7d %10d %7d %15d %9d %11d\n", op, v[op, "trials"], v[op, "at-points"],
        v[op, "random"], v[op, "random-mid-run"], v[op, "failures"], nhit[op]
      t += v[op, "trials"]; a += v[op, "at-points"]; f += v[op, "failures"]
    }
    n = split(all, list, " "); missing = ""; got = 0
    for (i = 1; i <= n; i++) { if (list[i] in named) got++; else missing = missing " " list[i] }
    printf "total: %d trials, %d killed at a kill point, %d failed; kill points hit: %d of %d%s\n",
      t, a, f, got, n, (missing == "" ? "" : " (never:" missing ")")
    # A short run may miss a point; a long one that does has a harness to mend.
    if (f > 0 || (got < n && t >= 200)) exit 1
  }' || failed=1
if [ "$failed" -ne 0 ]; then
  echo "FAILED"
  exit 1
fi
echo "ok"
