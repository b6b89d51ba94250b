#!/usr/bin/env bash
# Memory of a backup of a tree of 10 million files (issue #5: "memory for a tree of
# 10 million files stays bounded").
#
#   bench/dense10m.sh [--entries-per-copy 100000] [--copies 100] [--no-build]
#
# Builds a 100,000-file tree (datasets.py small: 1-8 KiB files in 1,000 dirs), then
# 100 hard-linked copies of it with `cp -al` (10 million names, 101,000 directories,
# no new inodes or data), and backs the whole tree up into a fresh cairn repository:
# first backup (every name is a file to read: hard links are recorded per name, like
# restic and borg do), then an unchanged re-backup. Prints wall time, files/s and the
# peak RSS of each, and the same for one copy alone (100,000 names), so the RSS of
# 10M names can be compared with that of 100k. Work dir: bench/.work/dense10m
# (removed at the end unless KEEP=1).
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(dirname "$BENCH_DIR")"
PER_COPY=100000
COPIES=100
BUILD=1
while [ $# -gt 0 ]; do
  case "$1" in
    --entries-per-copy) PER_COPY="$2"; shift ;;
    --copies) COPIES="$2"; shift ;;
    --no-build) BUILD=0 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
  shift
done
WORK="$BENCH_DIR/.work/dense10m"
CAIRN="${CAIRN_BIN:-$REPO_ROOT/target/release/cairn}"
if [ "$BUILD" = 1 ]; then (cd "$REPO_ROOT" && cargo build --release --bin cairn); fi
[ -x /usr/bin/time ] || { apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q time; }
export CAIRN_PASSWORD=dense10m

log() { printf '[dense10m %s] %s\n' "$(date +%T)" "$*" >&2; }

rm -rf "$WORK"
mkdir -p "$WORK/tree"
log "generating one copy: $PER_COPY files in $((PER_COPY / 100)) dirs"
python3 "$BENCH_DIR/datasets.py" gen small --out "$WORK/base" --files "$PER_COPY" --dirs "$((PER_COPY / 100))" >/dev/null
log "making $COPIES hard-linked copies"
for i in $(seq -w 1 "$COPIES"); do cp -al "$WORK/base" "$WORK/tree/copy$i"; done
sync
names=$(( PER_COPY * COPIES ))

run() { # label files repo path...
  local label=$1 files=$2 repo=$3; shift 3
  local t0 t1
  t0=$(date +%s.%N)
  /usr/bin/time -f "%M" -o "$WORK/$label.rss" "$CAIRN" backup --repo "$repo" "$@" >"$WORK/$label.log" 2>&1
  t1=$(date +%s.%N)
  python3 - "$label" "$files" "$t0" "$t1" "$(cat "$WORK/$label.rss")" <<'EOF'
import sys
label, files, t0, t1, rss = sys.argv[1], int(sys.argv[2]), float(sys.argv[3]), float(sys.argv[4]), int(sys.argv[5])
wall = t1 - t0
print(f"{label:28} {files:>10,} files {wall:8.1f} s {files / wall:>9,.0f} files/s  peak RSS {rss / 1024:7.1f} MiB")
EOF
}

"$CAIRN" init --repo "$WORK/repo-one" >/dev/null
"$CAIRN" init --repo "$WORK/repo-all" >/dev/null
log "one copy ($PER_COPY names)"
run "one-copy-first" "$PER_COPY" "$WORK/repo-one" "$WORK/base"
run "one-copy-unchanged" "$PER_COPY" "$WORK/repo-one" "$WORK/base"
log "all copies ($names names)"
run "all-copies-first" "$names" "$WORK/repo-all" "$WORK/tree"
run "all-copies-unchanged" "$names" "$WORK/repo-all" "$WORK/tree"
"$CAIRN" stats --repo "$WORK/repo-all" | sed 's/^/  /'
[ "${KEEP:-0}" = 1 ] || rm -rf "$WORK"
