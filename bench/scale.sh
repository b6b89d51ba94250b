#!/usr/bin/env bash
# The scale table of issue #19: a repository of N index entries (default 100
# million) built by crates/cairn-plan/examples/scale-repo.rs (16-byte chunks stored
# exactly as a backup stores chunks, in 20 snapshots that share nothing), then each
# operation with its wall time, CPU and peak RSS (GNU time's maximum resident set):
#   backup of a small change, stats, check, check --read-data-subset 1%, copy of
#   one snapshot to a new repository, two backups through `cairn serve` (with the
#   server's memory), forget of one snapshot (5% of the data) and prune.
# Usage: bench/scale.sh [--entries N] [--placement ssd|ram] [--dir DIR] [--keep]
# Needs about 200 bytes of disk per entry (20 GB at 100M) plus the local index.
set -euo pipefail
cd "$(dirname "$0")/.."
entries=100000000 placement=ssd dir=bench/.work/scale keep=0
while [ $# -gt 0 ]; do
  case "$1" in
    --entries) entries=$2; shift 2 ;;
    --placement) placement=$2; shift 2 ;;
    --dir) dir=$2; shift 2 ;;
    --keep) keep=1; shift ;;
    *) echo "usage: $0 [--entries N] [--placement ssd|ram] [--dir DIR] [--keep]" >&2; exit 2 ;;
  esac
done
cargo build --release -q -p cairn-cli
cargo build --release -q -p cairn-plan --example scale-repo
R=$PWD/target/release/cairn
export CAIRN_PASSWORD=scale-bench CAIRN_FROM_PASSWORD=scale-bench CAIRN_REPO=$dir/repo CAIRN_MEMORY_LIMIT=none
rm -rf "$dir"; mkdir -p "$dir/small"
$R init -q --index-placement "$placement" --index-path "$dir/index"
t0=$(date +%s.%N)
target/release/examples/scale-repo "$dir/repo" "$entries" 20 > "$dir/snapshots" 2> "$dir/build.log"
t1=$(date +%s.%N)
printf 'built %s chunks in %.0f s: %s\n' "$entries" "$(awk "BEGIN{print $t1 - $t0}")" "$(du -sh "$dir/repo" | cut -f1)"
# A small change: 64 files of 64 KiB, seeded.
python3 - "$dir/small" <<'PY'
import random, sys
r = random.Random(19)
for i in range(64):
    open(f"{sys.argv[1]}/f{i:02}", "wb").write(r.randbytes(65536))
PY
printf '| operation | wall s | CPU s | peak RSS MiB |\n|---|---:|---:|---:|\n'
run() {
  local name=$1; shift
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  if /usr/bin/time -o "$dir/time" -f '%e %U %S %M' "$@" > "$dir/out" 2> "$dir/err"; then
    read -r wall user sys rss < "$dir/time"
    printf '| %s | %.1f | %.1f | %.0f |\n' "$name" "$wall" "$(awk "BEGIN{print $user + $sys}")" "$(awk "BEGIN{print $rss / 1024}")"
  else
    printf '| %s | failed: %s | | |\n' "$name" "$(grep -v '^Command' "$dir/err" | tail -1)"
  fi
}
first=$(head -1 "$dir/snapshots")
run "backup of a small change (4 MiB)" $R backup -q "$dir/small"
run "stats" $R stats -q
run "check" $R check -q
run "check --read-data-subset 1%" $R check -q --read-data-subset 1%
$R init -q --repo "$dir/copy" --index-placement "$placement" --index-path "$dir/index"
run "copy of one snapshot (5% of the chunks)" $R copy -q --from "$dir/repo" --to "$dir/copy" "$first"
# Through cairn serve (a backup token): the server answers the client's dedup
# questions from its view of every chunk id in the datastore, built at the first
# backup; its peak RSS is the server's own (VmHWM), the other columns the client's.
srv=$dir/serve; mkdir -p "$srv"
token=$($R serve token add scale --datastore ds --role backup --state-dir "$srv" 2>/dev/null | head -1)
$R serve --listen 127.0.0.1:0 --datastore "ds=$PWD/$dir/repo" --state-dir "$srv" > "$srv/log" 2>&1 &
spid=$!
for _ in $(seq 100); do grep -q fingerprint "$srv/log" && break; sleep 0.1; done
port=$(grep -o 'https://127.0.0.1:[0-9]*' "$srv/log" | head -1 | sed 's/.*://')
fp=$(grep -o 'fingerprint: [0-9a-f]*' "$srv/log" | head -1 | cut -d' ' -f2)
through_server() {
  local name=$1
  run "$name" env CAIRN_TOKEN="$token" CAIRN_SERVER_FINGERPRINT="$fp" CAIRN_REPO="cairn+https://127.0.0.1:$port/ds" "$R" backup -q "$dir/small"
  printf '| (cairn serve after it: RSS %s MiB, peak %s MiB) | | | |\n' \
    "$(awk '/VmRSS/ {printf "%.0f", $2 / 1024}' /proc/$spid/status)" \
    "$(awk '/VmHWM/ {printf "%.0f", $2 / 1024}' /proc/$spid/status)"
}
head -c 1048576 /dev/urandom > "$dir/small/through-server-1"
through_server "backup through cairn serve, first (the server builds its view)"
head -c 1048576 /dev/urandom > "$dir/small/through-server-2"
through_server "backup through cairn serve, second"
kill "$spid"; wait "$spid" 2>/dev/null || true
$R forget -q "$first"
run "prune (5% of the data unused)" $R prune -q
[ "$keep" = 1 ] || rm -rf "$dir"
