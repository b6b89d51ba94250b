#!/usr/bin/env bash
# The memory of `cairn serve`'s dedup view against the number of chunk ids in a
# datastore, for one or more cairn binaries side by side (an A/B of the view).
#
# Builds a small real repository, then adds LISTS synthetic index files, each with a
# dedup list of IDS random chunk ids (seeded; the index files are junk flagged as
# data-only, which clients of a server never read, and the server never decrypts).
# For each binary: start `cairn serve` on a copy, back up a 1 MiB file through it (the
# first backup makes the server build its view), and print the backup's wall time
# and the server's RSS and peak RSS (VmHWM) after it, then a second backup's wall time.
#
# With --per-pack N the lists are of format 2: their ids in packs of N, each pack a
# sparse file of its list's end under data/, so every backup's plan lists data/ and
# holds the packs against the lists (docs/SERVER.md); the second backup shows that
# cost (the view is built by then). Without it, format 1, whose packs are not checked.
#
# Usage: bench/dedup-view.sh [--lists N] [--ids N] [--per-pack N] [--dir DIR] [BINARY...]
#   defaults: 100 lists of 100,000 ids (10 million), format 1, target/release/cairn.
# Needs python3 with the blake3 module (installed with pip when missing) and
# about 33 bytes of disk per id.
set -euo pipefail
cd "$(dirname "$0")/.."
lists=100 ids=100000 per_pack=0 dir=bench/.work/dedup-view
while [ $# -gt 0 ]; do
  case "$1" in
    --lists) lists=$2; shift 2 ;;
    --ids) ids=$2; shift 2 ;;
    --per-pack) per_pack=$2; shift 2
      # A pack's end (4,700 bytes an id) must stay within the largest pack, 1 GiB.
      [ "$per_pack" -le 228000 ] || { echo "--per-pack: at most 228000" >&2; exit 2; } ;;
    --dir) dir=$2; shift 2 ;;
    -*) echo "usage: $0 [--lists N] [--ids N] [--per-pack N] [--dir DIR] [BINARY...]" >&2; exit 2 ;;
    *) break ;;
  esac
done
bins=("$@")
if [ ${#bins[@]} -eq 0 ]; then
  cargo build --release -q -p cairn-cli
  bins=("$PWD/target/release/cairn")
fi
python3 -c 'import blake3' 2>/dev/null ||
  python3 -m pip install -q blake3 2>/dev/null ||
  python3 -m pip install -q --break-system-packages blake3
export CAIRN_PASSWORD=dedup-view
rm -rf "$dir"; mkdir -p "$dir/src"
head -c 4194304 /dev/urandom > "$dir/src/seed"
"${bins[0]}" init -q --repo "$dir/repo"
"${bins[0]}" backup -q --repo "$dir/repo" "$dir/src"
python3 - "$dir/repo" "$lists" "$ids" "$per_pack" <<'PY'
import os, random, sys, blake3
repo, n, k, per = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), int(sys.argv[4])
rng = random.Random(20261127)
def varint(v):
    out = bytearray()
    while v >= 0x80:
        out.append((v & 0x7F) | 0x80)
        v >>= 7
    out.append(v)
    return bytes(out)
for _ in range(n):
    iid = rng.randbytes(32)
    chunk_ids = sorted(set(rng.randbytes(32) for _ in range(k)))
    # docs/FORMAT.md, "Dedup lists": magic, index id, flags (0: data only, not
    # admin), no supersedes, then the ids ascending (format 1) or the packs, each
    # its id, end and ids ascending (format 2), BLAKE3 of all that.
    if per == 0:
        body = b"CAIRNDL1" + iid + b"\0" + varint(0) + varint(len(chunk_ids)) + b"".join(chunk_ids)
    else:
        groups = [chunk_ids[i:i + per] for i in range(0, len(chunk_ids), per)]
        body = b"CAIRNDL2" + iid + b"\0" + varint(0) + varint(len(groups))
        for g in groups:
            pid, end = rng.randbytes(32), 4700 * len(g)
            os.makedirs(os.path.join(repo, "data", pid.hex()[:2]), exist_ok=True)
            with open(os.path.join(repo, "data", pid.hex()[:2], pid.hex()), "wb") as f:
                f.truncate(end)
            body += pid + varint(end) + varint(len(g)) + b"".join(sorted(g))
    body += blake3.blake3(body).digest()
    with open(os.path.join(repo, "index", iid.hex()), "wb") as f:
        f.write(b"junk")
    with open(os.path.join(repo, "dedup", iid.hex()), "wb") as f:
        f.write(body)
PY
printf 'chunk ids in the datastore: about %s\n\n' "$((lists * ids))"
printf '| binary | first backup through it, s | server RSS MiB | server peak MiB | view built at start | second backup, s |\n|---|---:|---:|---:|---|---:|\n'
for bin in "${bins[@]}"; do
  st=$dir/state; rm -rf "$st"; mkdir -p "$st"
  token=$("$bin" serve token add bench --datastore ds --role backup --state-dir "$st" 2>/dev/null | head -1)
  "$bin" serve --listen 127.0.0.1:0 --datastore "ds=$PWD/$dir/repo" --state-dir "$st" > "$st/log" 2>&1 &
  spid=$!
  for _ in $(seq 100); do grep -q fingerprint "$st/log" && break; sleep 0.1; done
  port=$(grep -o 'https://127.0.0.1:[0-9]*' "$st/log" | head -1 | sed 's/.*://')
  fp=$(grep -o 'fingerprint: [0-9a-f]*' "$st/log" | head -1 | cut -d' ' -f2)
  head -c 1048576 /dev/urandom > "$dir/src/new"
  sync; echo 3 > /proc/sys/vm/drop_caches 2>/dev/null || true
  t0=$(date +%s.%N)
  CAIRN_TOKEN=$token CAIRN_SERVER_FINGERPRINT=$fp "$bin" backup -q \
    --repo "cairn+https://127.0.0.1:$port/ds" "$dir/src"
  t1=$(date +%s.%N)
  head -c 1048576 /dev/urandom > "$dir/src/new2"
  CAIRN_TOKEN=$token CAIRN_SERVER_FINGERPRINT=$fp "$bin" backup -q \
    --repo "cairn+https://127.0.0.1:$port/ds" "$dir/src"
  t2=$(date +%s.%N)
  printf '| %s | %.2f | %.0f | %.0f | %s | %.2f |\n' "$bin" "$(awk "BEGIN{print $t1 - $t0}")" \
    "$(awk '/VmRSS/ {print $2 / 1024}' /proc/$spid/status)" \
    "$(awk '/VmHWM/ {print $2 / 1024}' /proc/$spid/status)" \
    "$(grep -o 'ready in [0-9.]* s' "$st/log" | head -1 || true)" \
    "$(awk "BEGIN{print $t2 - $t1}")"
  kill "$spid"; wait "$spid" 2>/dev/null || true
done
rm -rf "$dir"
