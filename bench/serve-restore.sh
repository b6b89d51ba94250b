#!/usr/bin/env bash
# Two cairn binaries side by side on a restore through `cairn serve`: each backs
# up SRC through its own server (plain HTTP on loopback, a fresh datastore; the
# backup is timed too), then
# restores it three times into a tmpfs (so the target's file system is not what
# is measured); prints wall/user/system/RSS of each client and the server's CPU
# and peak RSS. Needs root (tmpfs).
#
#   bench/serve-restore.sh OLD_CAIRN NEW_CAIRN [SRC]     # SRC defaults to /usr/share
set -euo pipefail
old=$1 new=$2 src=${3:-/usr/share}
work=$(mktemp -d /tmp/cairn-serve-restore.XXXXXX)
export CAIRN_PASSWORD=bench
mkdir -p "$work/t"
mount -t tmpfs -o size=3G tmpfs "$work/t"
trap 'umount "$work/t" 2>/dev/null; rm -rf "$work"' EXIT
port=18799
for which in old new; do
  bin=$old; [ "$which" = new ] && bin=$new
  "$bin" --repo "$work/ds-$which" init -q
  tok=$("$bin" serve token add c --datastore s --role admin --state-dir "$work/st-$which" 2>&1 | head -1)
  "$bin" serve --listen 127.0.0.1:$port --insecure-http --datastore s="$work/ds-$which" \
    --state-dir "$work/st-$which" >"$work/serve-$which.log" 2>&1 &
  server=$!
  sleep 1
  printf '%s backup: ' "$which"
  CAIRN_TOKEN=$tok /usr/bin/time -f "%e s wall, %U s user, %S s system, %M KB" \
    "$bin" --repo cairn+http://127.0.0.1:$port/s backup "$src" -q 2>&1 | tail -1
  for i in 1 2 3; do
    rm -rf "$work/t/r"
    printf '%s restore %s: ' "$which" "$i"
    CAIRN_TOKEN=$tok /usr/bin/time -f "%e s wall, %U s user, %S s system, %M KB" \
      "$bin" --repo cairn+http://127.0.0.1:$port/s restore latest --target "$work/t/r" -q 2>&1 | tail -1
  done
  echo "  server: $(awk '{print ($14+$15)/100 " s CPU"}' /proc/$server/stat), $(grep VmHWM /proc/$server/status | tr -s ' \t' ' ')"
  kill $server; wait $server 2>/dev/null || true
done
