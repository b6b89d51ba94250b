#!/bin/bash
# cairn mount's memory under a walk of 400,000 files (`find MNT/latest -type f`),
# without an inode budget and at --max-inodes 262144 (the default) and 65536:
# files found, time, RSS after the walk and at its peak, and the mount's own count
# of inodes (mount --json). Needs FUSE (fuse3) and a release build:
#   cargo build --release && bench/mount-inodes.sh        # ~2 min the first time
# Work directory: $WORK (default /tmp/cairn-mount-inodes), kept between runs.
set -e
B=${B:-$(cd "$(dirname "$0")/.." && pwd)/target/release/cairn}
D=${WORK:-/tmp/cairn-mount-inodes}; export CAIRN_PASSWORD=x
if [ ! -d $D/repo ]; then
  rm -rf $D/src; mkdir -p $D/src
  D=$D python3 - <<'PY'
import os
for d in range(400):
    p=f'{os.environ["D"]}/src/d{d:03}'; os.makedirs(p)
    for f in range(1000):
        with open(f'{p}/f{f:04}','w') as fh: fh.write(str(f))
PY
  $B -r $D/repo init -q >/dev/null
  /usr/bin/time -f "backup %e s" $B -r $D/repo backup -q $D/src
fi
for max in ${MAXES:-100000000 262144 65536}; do
  mkdir -p $D/mnt
  $B -r $D/repo mount $D/mnt --max-inodes $max --json > $D/out.json 2>$D/err.txt &
  pid=$!
  for i in $(seq 50); do mountpoint -q $D/mnt && break; sleep 0.2; done
  t0=$(date +%s.%N)
  n=$(find $D/mnt/latest/ -type f | wc -l)
  t1=$(date +%s.%N)
  sleep 2
  rss=$(grep VmRSS /proc/$pid/status | awk '{print $2}')
  hwm=$(grep VmHWM /proc/$pid/status | awk '{print $2}')
  kill -INT $pid; wait $pid || true
  echo "max_inodes=$max files=$n find_s=$(echo "$t1 - $t0" | bc) rss_after_kib=$rss peak_rss_kib=$hwm $(cat $D/out.json)"
done
