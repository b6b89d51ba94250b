#!/usr/bin/env bash
# Generate the benchmark datasets (deterministic from a fixed seed).
#
#   bench/datasets.sh [--quick] [--out DIR] [mixed] [small] [image]
#   bench/datasets.sh day TREE N      # apply the day-N edits to a mixed tree in place
#   bench/datasets.sh history TREE N  # apply day-N edits of the maintenance history in place
#
# Sizes follow BENCH_SCALE (full: mixed 2 GiB, small 200k files, image 2 GiB;
# quick: 300 MiB, 20k files, 300 MiB; or a fraction of full) and the overrides
# BENCH_MIXED_MIB, BENCH_SMALL_FILES, BENCH_SMALL_DIRS, BENCH_IMAGE_MIB.
# Existing complete datasets (DIR/<name>.json present) are kept; --force regenerates.
set -euo pipefail
BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
OUT="${BENCH_DATA:-$BENCH_DIR/.work/data}"
FORCE=0
KINDS=()
if [ "${1:-}" = day ] || [ "${1:-}" = history ]; then
  exec python3 "$BENCH_DIR/datasets.py" "$1" --dir "$2" --day "$3"
fi
while [ $# -gt 0 ]; do
  case "$1" in
    --quick) export BENCH_SCALE=quick ;;
    --scale) export BENCH_SCALE="$2"; shift ;;
    --out) OUT="$2"; shift ;;
    --force) FORCE=1 ;;
    mixed|small|image) KINDS+=("$1") ;;
    -h|--help) sed -n '2,11p' "$0"; exit 0 ;;
    *) echo "unknown argument $1" >&2; exit 2 ;;
  esac
  shift
done
[ "${#KINDS[@]}" -gt 0 ] || KINDS=(mixed small image)
mkdir -p "$OUT"
for k in "${KINDS[@]}"; do
  name="$(python3 -c "import sys; sys.path.insert(0, '$BENCH_DIR'); import datasets as d; print(d.dataset_dirname('$k', d.scale_config()))")"
  if [ "$FORCE" = 0 ] && [ -f "$OUT/$name.json" ] && [ -d "$OUT/$name" ]; then
    echo "[datasets.sh] $OUT/$name exists" >&2
    continue
  fi
  python3 "$BENCH_DIR/datasets.py" gen "$k" --out "$OUT/$name" >/dev/null
done
ls -d "$OUT"/*/ 2>/dev/null
