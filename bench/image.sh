#!/usr/bin/env bash
# Image backups (issue #17), side by side in one run: an ext4 image holding a copy of
# a directory tree (default /usr) plus free space, backed up, then 3% of its blocks
# changed and backed up again, by
#   cairn --image (whole read), cairn --image --changed-blocks, restic, borg, kopia
# (the peers back up the image file as a file). Reports time, CPU, peak RSS and bytes
# added to each repository, the disk's read and write speeds, and cairn's image
# restore against the write speed. Then the dense-filesystem case: an ext4 image of
# --dense-files small files backed up file by file (loop-mounted) and as an image,
# and one file restored each way.
#
#   bench/image.sh [--size 8G] [--content /usr] [--change-percent 3]
#                  [--tools cairn,restic,borg,kopia] [--dense-files 1000000] [--work DIR]
#
# Needs root (loop mounts, drop_caches), e2fsprogs, and the peers from
# bench/install-peers.sh. Every dataset is generated here, reproducibly (seeded).
set -euo pipefail
cd "$(dirname "$0")/.."
size=8G content=/usr pct=3 tools=cairn,restic,borg,kopia dense=1000000 work=bench/.work/image
while [ $# -gt 0 ]; do
  case "$1" in
    --size) size=$2; shift 2 ;;
    --content) content=$2; shift 2 ;;
    --change-percent) pct=$2; shift 2 ;;
    --tools) tools=$2; shift 2 ;;
    --dense-files) dense=$2; shift 2 ;;
    --work) work=$2; shift 2 ;;
    *) echo "unknown option $1" >&2; exit 2 ;;
  esac
done
cargo build --release -q -p cairn-cli
root=$(pwd)
bin=$root/${CARGO_TARGET_DIR:-target}/release/cairn
T=$root/bench/.tools
mkdir -p "$work"; work=$(cd "$work" && pwd)
rm -rf "$work/repos" "$work/out" "$work/mnt"
mkdir -p "$work/repos" "$work/out" "$work/mnt"
export CAIRN_PASSWORD=bench RESTIC_PASSWORD=bench BORG_PASSPHRASE=bench KOPIA_PASSWORD=bench
export BORG_UNKNOWN_UNENCRYPTED_REPO_ACCESS_IS_OK=yes BORG_RELOCATED_REPO_ACCESS_IS_OK=yes
export KOPIA_CONFIG_PATH=$work/kopia.config KOPIA_CACHE_DIRECTORY=$work/kopia-cache
export XDG_CACHE_HOME=$work/cache
img=$work/disk.img
cold() { sync; echo 3 > /proc/sys/vm/drop_caches; }
# run NAME CMD...: wall s, user+sys CPU s and peak RSS MiB of CMD into $work/t.
run() {
  local name=$1; shift
  cold
  /usr/bin/time -f "%e %U %S %M" -o "$work/t" "$@" > "$work/logs-$name.txt" 2>&1 || {
    echo "$name failed: see $work/logs-$name.txt" >&2; tail -5 "$work/logs-$name.txt" >&2; exit 1; }
  read -r wall user sys rss < "$work/t"
  cpu=$(python3 -c "print(f'{$user + $sys:.1f}')")
  rss=$((rss / 1024))
}
bytes() { du -sb "$1" | cut -f1; }
gb() { python3 -c "print(f'{$1 / 1e9:.3f}')"; }

# ---- the image ---------------------------------------------------------------
if [ ! -f "$img.done" ]; then
  echo "making $img: ext4 of $size holding $content (mke2fs -d)"
  rm -f "$img"
  mke2fs -q -F -t ext4 -b 4096 -d "$content" "$img" "$size"
  touch "$img.done"
fi
img_bytes=$(stat -c %s "$img")
used=$(du -B1 "$img" | cut -f1)
cold; s=$(date +%s.%N); dd if="$img" of=/dev/null bs=4M status=none; e=$(date +%s.%N)
read_speed=$(python3 -c "print(f'{$used / ($e - $s) / 1e6:.0f}')")
# The disk's write speed: 2 GiB written with O_DIRECT, then synced.
s=$(date +%s.%N); dd if=/dev/zero of="$work/out/zeros" bs=4M count=512 oflag=direct conv=fdatasync status=none; e=$(date +%s.%N)
write_speed=$(python3 -c "print(f'{2**31 / ($e - $s) / 1e6:.0f}')"); rm -f "$work/out/zeros"
echo "image: $(gb "$img_bytes") GB, $(gb "$used") GB allocated; disk: cold sequential read $read_speed MB/s, write $write_speed MB/s"

# change FILE: 3% of the blocks changed, in runs of 64 KiB to 1 MiB at seeded random
# places, with seeded random bytes (incompressible: what is added should be about
# what changed); the list of ranges goes to changed.txt. The same every time.
change() {
  python3 - "$1" "$pct" "$work/changed.txt" <<'PY'
import os, random, sys
path, pct, listfile = sys.argv[1], float(sys.argv[2]), sys.argv[3]
size = os.path.getsize(path)
r = random.Random(17)
target = int(size * pct / 100)
done, ranges = 0, []
with open(path, "r+b") as f:
    while done < target:
        n = r.choice([64, 128, 256, 512, 1024]) * 1024
        off = r.randrange(0, (size - n) // 4096) * 4096
        f.seek(off); f.write(r.randbytes(n)); ranges.append((off, n)); done += n
with open(listfile, "w") as l:
    for o, n in ranges: l.write(f"{o} {n}\n")
PY
}

header=$(printf '%-22s %-12s %8s %8s %8s %9s %10s' tool run wall_s cpu_s rss_MiB "MB/s" added_GB)
rows=()
row() {
  rows+=("$(printf '%-22s %-12s %8s %8s %8s %9s %10s' "$1" "$2" "$wall" "$cpu" "$rss" "$3" "$4")")
  echo "${rows[-1]}"
}
echo "$header"
# Each tool backs up a working copy at one path (the peers find their parent by
# path), changed in place between its two runs; its repository is deleted after.
copy=$work/vm/disk.img
mkdir -p "$work/vm"
for tool in ${tools//,/ }; do
  variants=$tool
  [ "$tool" = cairn ] && variants="cairn cairn-cbt"
  for v in $variants; do
    repo=$work/repos/$v
    cp --sparse=always "$img" "$copy"
    case $v in
      cairn|cairn-cbt) "$bin" init -q --repo "$repo"
        first=("$bin" backup -q --repo "$repo" --image "$copy")
        second=("$bin" backup -q --repo "$repo" --image "$copy")
        [ "$v" = cairn-cbt ] && second+=(--changed-blocks "$work/changed.txt") ;;
      restic) "$T/restic" init -q -r "$repo" >/dev/null
        first=("$T/restic" -q -r "$repo" backup "$copy"); second=("${first[@]}") ;;
      borg) "$T/borg-venv/bin/borg" init -e repokey-blake2 "$repo" >/dev/null 2>&1
        first=("$T/borg-venv/bin/borg" create "$repo::a" "$copy"); second=("$T/borg-venv/bin/borg" create "$repo::b" "$copy") ;;
      kopia) "$T/kopia" repository create filesystem --path "$repo" >/dev/null 2>&1
        first=("$T/kopia" snapshot create "$copy"); second=("${first[@]}") ;;
    esac
    b0=$(bytes "$repo")
    run "$v-first" "${first[@]}"; b1=$(bytes "$repo")
    row "$v" first "$(python3 -c "print(f'{$img_bytes / $wall / 1e6:.0f}')")" "$(gb $((b1 - b0)))"
    change "$copy"
    changed_bytes=$(awk '{s+=$2} END {print s}' "$work/changed.txt")
    run "$v-second" "${second[@]}"; b2=$(bytes "$repo")
    row "$v" "3% changed" "$(python3 -c "print(f'{$img_bytes / $wall / 1e6:.0f}')")" "$(gb $((b2 - b1)))"
    if [ "$v" = cairn ]; then
      run cairn-restore "$bin" restore -q --repo "$repo" latest --image --target "$work/out/restored.img"
      restore_wall=$wall
      cmp "$work/out/restored.img" "$copy" || { echo "restored image differs" >&2; exit 1; }
      rm -f "$work/out/restored.img"
    fi
    rm -rf "$repo" "$copy"
  done
done

echo
echo "# image $(gb "$img_bytes") GB ($(gb "$used") GB allocated), $pct% changed = $(gb "$changed_bytes") GB; disk read $read_speed MB/s, write $write_speed MB/s"
echo "# MB/s = image bytes / wall s; added = GB the repository grew"
echo "$header"
printf '%s\n' "${rows[@]}"
if [ -n "${restore_wall:-}" ]; then
  echo "cairn restore --image of the changed image to a file: ${restore_wall} s, $(python3 -c "print(f'{$img_bytes / $restore_wall / 1e6:.0f}')") MB/s of image ($(python3 -c "print(f'{$used / $restore_wall / 1e6:.0f}')") MB/s of allocated data; the disk writes $write_speed MB/s)"
fi

# ---- the dense filesystem ----------------------------------------------------
if [ "$dense" -gt 0 ] && [[ ,$tools, == *,cairn,* ]]; then
  dimg=$work/dense.img
  if [ ! -f "$dimg.done" ]; then
    echo "making $dimg: $dense small files"
    rm -rf "$work/dense-src" "$dimg"; mkdir -p "$work/dense-src"
    python3 - "$work/dense-src" "$dense" <<'PY'
import os, random, sys
root, n = sys.argv[1], int(sys.argv[2])
r = random.Random(5)
for d in range((n + 999) // 1000):
    p = os.path.join(root, f"d{d:05d}"); os.mkdir(p)
    for i in range(min(1000, n - d * 1000)):
        with open(os.path.join(p, f"f{i:04d}"), "wb") as f:
            f.write(r.randbytes(r.randrange(100, 4000)))
PY
    inodes=$((dense + dense / 1000 + 1000))
    mke2fs -q -F -t ext4 -b 4096 -N "$inodes" -d "$work/dense-src" "$dimg" "$(( (dense * 5 / 1024) + 1024 ))M"
    rm -rf "$work/dense-src"; touch "$dimg.done"
  fi
  mount -o ro,loop "$dimg" "$work/mnt"
  trap 'umount "$work/mnt" 2>/dev/null || true' EXIT
  "$bin" init -q --repo "$work/repos/dense-files"
  run dense-files "$bin" backup -q --repo "$work/repos/dense-files" "$work/mnt"; files_wall=$wall files_cpu=$cpu files_rss=$rss
  umount "$work/mnt"
  "$bin" init -q --repo "$work/repos/dense-image"
  run dense-image "$bin" backup -q --repo "$work/repos/dense-image" --image "$dimg"; image_wall=$wall image_cpu=$cpu image_rss=$rss
  one=$(printf 'd%05d/f%04d' $(( dense / 2000 )) 7)
  run dense-one-files "$bin" restore -q --repo "$work/repos/dense-files" latest --include "$work/mnt/$one" --target "$work/out/one-files"
  one_files=$wall
  run dense-one-image "$bin" restore -q --repo "$work/repos/dense-image" latest --image-fs "/$one" --target "$work/out/one-image"
  one_image=$wall
  cmp "$work/out/one-files/$work/mnt/$one" "$work/out/one-image/${one#*/}"
  echo
  echo "# dense filesystem: $dense small files in an ext4 image of $(gb "$(stat -c %s "$dimg")") GB"
  printf '%-34s %8s %8s %8s\n' "" wall_s cpu_s rss_MiB
  printf '%-34s %8s %8s %8s\n' "backup file by file (loop mount)" "$files_wall" "$files_cpu" "$files_rss"
  printf '%-34s %8s %8s %8s\n' "backup --image" "$image_wall" "$image_cpu" "$image_rss"
  printf '%-34s %8s\n' "restore one file (file snapshot)" "$one_files"
  printf '%-34s %8s\n' "restore one file (--image-fs)" "$one_image"
fi
