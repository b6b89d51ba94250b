#!/usr/bin/env bash
# `cairn mount` against its targets (issue #18): copying a large file out of the
# mount vs `cairn restore` of it, `ls -l` of a directory of 100,000 files, and the
# mount's RSS along the way. Needs root (drop_caches) and FUSE; ~2 minutes.
# --index-entries N adds N synthetic entries to the repository's index before
# mounting (crates/cairn-plan/examples/synthetic-index.rs: packs that do not
# exist), so the RSS can be compared at a large index without its data.
#   bench/mount.sh [--size 1G] [--files 100000] [--index-entries 0] [--keep DIR]
set -euo pipefail
cd "$(dirname "$0")/.."
size=1G files=100000 entries=0 work="" tree=""
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size=$2; shift 2 ;;
    --files) files=$2; shift 2 ;;
    --index-entries) entries=$2; shift 2 ;;
    --keep) work=$2; shift 2 ;;
    --tree) tree=$(realpath "$2"); shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
cargo build --release -q -p cairn-cli
cargo build --release -q -p cairn-plan --example synthetic-index
bin=${CAIRN_BIN:-${CARGO_TARGET_DIR:-target}/release/cairn}
[ -n "$work" ] || { work=$(mktemp -d); trap 'fusermount3 -u "$work/mnt" 2>/dev/null || true; rm -rf "$work"' EXIT; }
export CAIRN_REPO=$work/repo CAIRN_PASSWORD=bench
mkdir -p "$work/src/big" "$work/src/many" "$work/mnt"
head -c "$size" /dev/urandom > "$work/src/big/large.bin"
python3 -c "
import os, sys
for i in range(int(sys.argv[2])): open(os.path.join(sys.argv[1], 'f%07d' % i), 'w').write(str(i))
" "$work/src/many" "$files"
"$bin" init -q
big=$("$bin" backup --json "$work/src/big" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["snapshot_id"])')
many=$("$bin" backup --json "$work/src/many" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["snapshot_id"])')
[ -z "$tree" ] || treesnap=$("$bin" backup --json "$tree" 2>/dev/null | python3 -c 'import json,sys; print(json.load(sys.stdin)["snapshot_id"])')
if [ "$entries" != 0 ]; then
  ${CARGO_TARGET_DIR:-target}/release/examples/synthetic-index "$CAIRN_REPO" "$entries"
  echo "index: $entries synthetic entries added ($(du -sh "$CAIRN_REPO/index" | cut -f1) of index files)"
fi
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
t() { local s; s=$(date +%s.%N); "$@" >/dev/null; python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$s" "$(date +%s.%N)"; }
rss() { grep VmRSS "/proc/$pid/status" | awk '{print $2 " kB"}'; }
cold; echo "restore of the large file (cold cache): $(t "$bin" restore -q "$big" --target "$work/restored") s"
rm -rf "$work/restored"
start=$(date +%s.%N)
"$bin" mount "$work/mnt" --idle-secs 5 2>"$work/mount.log" & pid=$!
for _ in $(seq 3000); do grep -q mounted "$work/mount.log" 2>/dev/null && break; sleep 0.1; done
echo "mounted in $(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$start" "$(date +%s.%N)") s"
echo "mount RSS at start: $(rss)"
f=$work/mnt/snapshots/$big${work}/src/big/large.bin
cold; echo "cp out of the mount (cold cache): $(t cp "$f" "$work/copy") s"
cmp "$f" "$work/copy" && rm -f "$work/copy"
echo "mount RSS after the copy: $(rss)"
d=$work/mnt/snapshots/$many${work}/src/many
for i in 1 2 3; do echo "ls -l of $files entries (run $i): $(t ls -l "$d") s"; done
echo "mount RSS after ls -l: $(rss), inodes held: $(stat -f -c %c "$work/mnt")"
if [ -n "$tree" ]; then
  out=/dev/shm/cairn-mount-bench-$$
  cpu() { awk '{printf "%.2f", ($14 + $15) / 100}' "/proc/$pid/stat"; }
  for i in 1 2 3; do
    rm -rf "$out"; cold; c0=$(cpu)
    w=$(t cp -a "$work/mnt/snapshots/$treesnap$tree" "$out")
    echo "cp -a of $tree out of the mount into tmpfs (cold cache, run $i): $w s, mount CPU $(python3 -c "import sys; print(f'{float(sys.argv[2]) - float(sys.argv[1]):.2f}')" "$c0" "$(cpu)") s"
  done
  diff -r --no-dereference "$tree" "$out" >/dev/null && echo "  (the copy equals the source)"
  for i in 1 2 3; do
    rm -rf "$out"; cold
    echo "restore of it into tmpfs (cold cache, run $i): $(t "$bin" restore -q "$treesnap" --target "$out") s"
  done
  rm -rf "$out"
fi
cold; sleep 6
echo "idle 6 s and drop_caches: RSS $(rss), inodes held: $(stat -f -c %c "$work/mnt"), locks: $(ls "$work/repo/locks" | wc -l)"
kill "$pid"; wait "$pid" || true
"$bin" mount "$work/mnt" --no-xattrs 2>"$work/mount.log" & pid=$!
for _ in $(seq 100); do grep -q mounted "$work/mount.log" 2>/dev/null && break; sleep 0.1; done
for i in 1 2 3; do echo "ls -l with --no-xattrs (run $i): $(t ls -l "$d") s"; done
kill "$pid"; wait "$pid" || true
