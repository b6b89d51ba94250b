#!/usr/bin/env bash
# Backup throughput with the index in RAM vs on SSD (issue #5: the SSD placement
# must reach >= 80% of the RAM placement at 4K blocks).
#
#   bench/placement.sh [DAY_A DAY_B]     (default: the day-by-day history that
#                                         `bench/run.sh --scenario blocksizes` builds)
#
# For each placement: a fresh 4K-block repository, a backup of DAY_A (mostly new
# data), then of DAY_B (another path, so no parent snapshot: every chunk is looked
# up in the index; ~96% are known). Prints wall seconds and MB/s of each, and the
# index's RAM per blob. Uses target/release/cairn (or $CAIRN_BIN).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
B="${CAIRN_BIN:-$HERE/../target/release/cairn}"
A="${1:-$HERE/.work/run/history/day-01}"
C="${2:-$HERE/.work/run/history/day-02}"
W="$(mktemp -d /var/tmp/cairn-placement.XXXXXX)"
trap 'rm -rf "$W"' EXIT
export CAIRN_PASSWORD=bench
bytes() { du -sb "$1" | cut -f1; }
SA=$(bytes "$A"); SC=$(bytes "$C")
tar cf - "$A" "$C" 2>/dev/null | cat >/dev/null   # warm the page cache for both runs
printf '%-6s %-26s %9s %9s %12s\n' placement backup seconds MB/s "RAM B/blob"
for p in ram ssd; do
  "$B" init -q -r "$W/repo-$p" --block-size 4K --index-placement "$p" --index-path "$W/ssd" >/dev/null
  for src in "$A" "$C"; do
    s=$(date +%s.%N)
    "$B" backup -q -r "$W/repo-$p" "$src"
    e=$(date +%s.%N)
    size=$([ "$src" = "$A" ] && echo "$SA" || echo "$SC")
    per=$("$B" index -r "$W/repo-$p" --json | python3 -c 'import json,sys; print(round(json.load(sys.stdin)["ram_bytes_per_blob"],2))')
    python3 -c "import sys; s,e,b=map(float,sys.argv[1:4]); print('%-6s %-26s %9.2f %9.0f %12s' % ('$p', '$(basename "$src")', e-s, b/(e-s)/1e6, '$per'))" "$s" "$e" "$size"
  done
done
