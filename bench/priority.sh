#!/usr/bin/env bash
# A foreground workload beside a backup: fio's random 4 KiB reads (O_DIRECT, so
# every read reaches the disk) alone, beside `cairn backup` in a loop (page cache
# dropped before each, so it reads the disk too), and beside `cairn backup
# --priority low`; prints fio's read latency p50/p99/p99.9 and the backup's
# wall time for each (issue #19: "low keeps a foreground workload's latency close to
# what it is without the backup"). Needs fio (apt install fio) and a release build.
#
#   bench/priority.sh [--data DIR] [--seconds 20]
#
# DATA defaults to /usr (what is backed up, from a dropped page cache each time).
set -euo pipefail
cd "$(dirname "$0")/.."
data=/usr
secs=20
while [ $# -gt 0 ]; do
  case "$1" in
    --data) data=$2; shift 2 ;;
    --seconds) secs=$2; shift 2 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
done
command -v fio >/dev/null || { echo "fio is needed: apt-get install fio" >&2; exit 1; }
cargo build --release -q -p cairn-cli
cairn=$PWD/target/release/cairn
work=$(mktemp -d /var/tmp/cairn-priority.XXXXXX)
trap 'rm -rf "$work"' EXIT
export CAIRN_PASSWORD=bench
# The foreground's file: 2 GiB, written once.
fio --name=prep --filename="$work/fg" --size=2G --rw=write --bs=1M --direct=1 \
    --output=/dev/null
run_fio() {
  fio --name=fg --filename="$work/fg" --size=2G --rw=randread --bs=4k --direct=1 \
      --ioengine=psync --time_based --runtime="$secs" --output-format=json \
      --output="$work/$1.json"
}
percentiles() {
  python3 - "$1" <<'EOF'
import json, sys
j = json.load(open(sys.argv[1]))["jobs"][0]["read"]
p = j["clat_ns"]["percentile"]
print(f'{j["iops"]:8.0f} IOPS  p50 {p["50.000000"]/1e3:7.0f} us  p99 {p["99.000000"]/1e3:7.0f} us  p99.9 {p["99.900000"]/1e3:7.0f} us')
EOF
}
backup_loop() {
  # Backups of DATA, one after the other, until fio ends.
  local extra=("$@")
  rm -rf "$work/repo"
  "$cairn" -r "$work/repo" init -q --no-encryption >/dev/null
  local n=0 start end
  start=$(date +%s.%N)
  while [ ! -e "$work/stop" ]; do
    # From the disk each time, so the backup competes for it, not only for CPU.
    echo 1 > /proc/sys/vm/drop_caches
    "$cairn" -r "$work/repo" backup "${extra[@]}" --force -q "$data" 2>/dev/null || true
    n=$((n + 1))
  done
  end=$(date +%s.%N)
  echo "$n $(python3 -c "print(f'{($end-$start)/max($n,1):.1f}')")" > "$work/backups"
}
measure() {
  local label=$1; shift
  sync; echo 3 > /proc/sys/vm/drop_caches
  rm -f "$work/stop" "$work/backups"
  if [ "$label" != alone ]; then
    backup_loop "$@" &
    local pid=$!
    sleep 2
  fi
  run_fio "$label"
  touch "$work/stop"
  if [ "$label" != alone ]; then
    wait "$pid"
    read -r n per < "$work/backups"
    printf '%-26s %s  (%s backups, %s s each)\n' "$label" "$(percentiles "$work/$label.json")" "$n" "$per"
  else
    printf '%-26s %s\n' "$label" "$(percentiles "$work/$label.json")"
  fi
}
echo "fio randread 4k O_DIRECT for ${secs}s; backups of $data"
measure alone
measure "beside backup"
measure "beside backup --priority low" --priority low
