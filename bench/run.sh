#!/usr/bin/env bash
# Benchmark cairn against restic and borg in the same run.
#
#   bench/run.sh [--quick] [--datasets mixed,small,image] [--tools cairn,restic,borg]
#                [--scenario all|backup|maintenance|blocksizes|jobs|s3|copy|server|clients|slowlink|recovery] [--scale full|quick|FRACTION]
#                [--cold] [--keep] [--no-verify] [--no-build] [--no-install]
#
# --scenario maintenance: 8 daily versions of the mixed tree backed up by cairn
# and restic, then forget --keep-last 3, prune and check --read-data (the
# default, all, runs the backup/restore datasets and then this).
# --scenario blocksizes (cairn only; not part of all, it is long: 30-45 min at
# full scale): the same 8 days, each kept as its own dir (bench/.work/run/history,
# cached), cairn estimate over all of them, then one datastore per block size
# (4K..64K) x compression (standard, max): back up every day, restore the last,
# cairn stats; prints real vs estimated dedup/compression/reduction (must be
# within 2 points) and a Markdown table. Use: --scenario blocksizes --tools cairn
# --scenario jobs (cairn and restic; not part of all, ~10-15 min at full scale):
# 1, 2 and 4 backups started at once into one fresh repository, job k backing
# up history day k (the blocksizes day dirs); total wall, aggregate MB/s, stats
# (stored, occupied, unused) and the duplicate bytes = occupied minus that of the
# same trees backed up one after another; cairn then prunes --max-unused 0%,
# and restores, verifies and check --read-data after the 4-job run.
# Use: --scenario jobs --tools cairn,restic
# --scenario s3 (cairn and restic; not part of all): starts MinIO with
# scripts/s3-server.sh, then first/unchanged backup and restore of each
# --datasets entry to a fresh S3 prefix per tool, with the bytes each command
# uploaded/downloaded (MinIO's counters; cairn's CAIRN_TRAFFIC_REPORT).
# --scenario copy (cairn, restic optional; not part of all): a 12-day history
# (--copy-days) in a 4K cairn repository, cairn copy into 64K repositories
# (local, and on MinIO if a MinIO binary exists), again (no-op), and days 1-11
# then day 12 alone; bytes_sent vs logical bytes; restic copy when named.
# --scenario server (cairn and restic; not part of all): each tool locally and
# through its server on loopback side by side — cairn via `cairn serve` (TLS,
# pinned self-signed certificate), restic via rest-server 0.14 (install-peers.sh
# builds it) — first, unchanged and restore of each --datasets entry; the
# servers' CPU is added to the client's. Use: --scenario server --tools cairn,restic
# --datasets mixed,small
# --scenario slowlink (cairn and restic; not part of all, ~10 min): the seed of an
# online backup, ~200 MB of compressible small files over a 2 Mbit/s uplink —
# cairn through `cairn serve --limit-total-upload 250000` with --pack-size 1M,
# restic through rest-server with --limit-upload 244 — wall time against the
# link time of the bytes each stored, and a verified restore.
# Use: --scenario slowlink --tools cairn,restic
# --scenario recovery (cairn, restic, borg, kopia; not part of all, ~20 min at
# full scale): a 25-day history of the mixed tree (--recovery-days), then per
# tool: restore of the last day, the last day restored over the day before,
# cp -a out of the tool's FUSE mount (borg through pyfuse3), a search for one
# name over every snapshot, and an export of the last day to tar.
# Use: --scenario recovery --tools cairn,restic,borg,kopia --cold
# Builds cairn (cargo build --release), installs restic/borg if missing
# (install-peers.sh), generates datasets if missing (bench/.work/data), then
# runs bench.py, which writes bench/results/<date>-<gitsha>.csv and prints a
# table with cairn/restic and cairn/borg ratios. Other options go to bench.py.
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO_ROOT="$(dirname "$BENCH_DIR")"
BUILD=1
INSTALL=1
TOOLS="cairn,restic,borg"
ARGS=()
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) export BENCH_SCALE=quick ;;
    --scale) export BENCH_SCALE="$2"; shift ;;
    --scale=*) export BENCH_SCALE="${1#*=}" ;;
    --tools) TOOLS="$2"; shift ;;
    --tools=*) TOOLS="${1#*=}" ;;
    --no-build) BUILD=0 ;;
    --no-install) INSTALL=0 ;;
    -h|--help) sed -n '2,48p' "$0"; python3 "$BENCH_DIR/bench.py" --help; exit 0 ;;
    *) ARGS+=("$1") ;;
  esac
  shift
done

log() { printf '[run.sh] %s\n' "$*" >&2; }

if [ "$INSTALL" = 1 ] && [[ ",$TOOLS," == *,restic,* || ",$TOOLS," == *,borg,* || ",$TOOLS," == *,kopia,* ]]; then
  "$BENCH_DIR/install-peers.sh"
fi
[ -x /usr/bin/time ] || { log "installing GNU time"; apt-get update -q && DEBIAN_FRONTEND=noninteractive apt-get install -y -q time; }

if [[ ",$TOOLS," == *,cairn,* ]]; then
  if [ "$BUILD" = 1 ]; then
    log "cargo build --release (cairn)"
    (cd "$REPO_ROOT" && nice -n 10 cargo build --release --bin cairn)
  fi
  CAIRN_BIN="${CAIRN_BIN:-$REPO_ROOT/target/release/cairn}"
  [ -x "$CAIRN_BIN" ] || { log "cairn binary not found at $CAIRN_BIN"; exit 1; }
  export CAIRN_BIN
fi

log "BENCH_SCALE=${BENCH_SCALE:-full} tools=$TOOLS"
exec python3 "$BENCH_DIR/bench.py" --tools "$TOOLS" "${ARGS[@]}"
