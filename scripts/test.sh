#!/usr/bin/env bash
# The whole test suite: format, lints, unit, property and integration tests.
# Installs what the tests need (rsync for the restore comparison, chromium, node and
# puppeteer-core for the web console's browser test) on a fresh machine,
# and runs a local S3 server (MinIO, scripts/s3-server.sh) for the S3 backend tests:
# built with go on first use (about 10 minutes), cached in ~/.cache/cairn-ci afterwards.
# Integration tests mount tmpfs filesystems (disk-full, read-only target): run as root.
set -euo pipefail
cd "$(dirname "$0")/.."

need_apt=()
command -v rsync >/dev/null || need_apt+=(rsync)
command -v mount >/dev/null || need_apt+=(mount)
command -v curl >/dev/null || need_apt+=(curl)
command -v openssl >/dev/null || need_apt+=(openssl)
# GNU tar, zstd and unzip unpack the exports (export, dump --archive, the console's .tar.zst)
command -v tar >/dev/null || need_apt+=(tar)
command -v zstd >/dev/null || need_apt+=(zstd)
command -v unzip >/dev/null || need_apt+=(unzip)
command -v script >/dev/null || need_apt+=(bsdutils)   # a terminal for the prompt and dump tests
# The web console's end-to-end test: Debian's chromium, driven by puppeteer-core.
command -v chromium >/dev/null || need_apt+=(chromium)
command -v node >/dev/null || need_apt+=(nodejs)
command -v npm >/dev/null || need_apt+=(npm)
# `cairn mount` tests mount FUSE file systems and unmount them from outside.
command -v fusermount3 >/dev/null || need_apt+=(fuse3)
# The --priority test reads a job's I/O class with ionice.
command -v ionice >/dev/null || need_apt+=(util-linux)
# Image tests: ext4 images (mke2fs -d), loop devices, partition tables; the
# inode-flag tests' chattr and lsattr come in the same package.
command -v mke2fs >/dev/null && command -v lsattr >/dev/null || need_apt+=(e2fsprogs)
command -v losetup >/dev/null || need_apt+=(mount)
command -v sfdisk >/dev/null || need_apt+=(fdisk)
command -v faketime >/dev/null || need_apt+=(faketime)   # a prune with its clock ahead
command -v ncdu >/dev/null || need_apt+=(ncdu)   # ls --ncdu's export, read back by ncdu
if [ ${#need_apt[@]} -gt 0 ]; then
  echo "installing: ${need_apt[*]}"
  apt-get update -qq && DEBIAN_FRONTEND=noninteractive apt-get install -y -qq "${need_apt[@]}" >/dev/null
fi
if ! command -v cargo >/dev/null; then
  echo "cargo is required (https://rustup.rs)" >&2
  exit 1
fi
rustup component add rustfmt clippy >/dev/null 2>&1 || true
# puppeteer-core only (no browser download), at the version in package-lock.json.
if [ ! -d tests/console/node_modules/puppeteer-core ]; then
  echo "installing the console tests' node modules (tests/console)"
  (cd tests/console && npm ci --no-audit --no-fund --loglevel=error >/dev/null)
fi
# Before the long steps, so that a missing go or a failed build shows at once.
minio=$(bash scripts/s3-server.sh ensure)

echo "== cargo fmt --check"
cargo fmt --all -- --check
echo "== cargo clippy"
cargo clippy --workspace --all-targets --quiet -- -D warnings
s3dir=$(mktemp -d)
trap 'bash scripts/s3-server.sh stop "$s3dir" || true; rm -rf "$s3dir"' EXIT
s3env=$(CAIRN_MINIO=$minio bash scripts/s3-server.sh start "$s3dir")
eval "$s3env"
# The TLS test starts a MinIO of its own with a private CA.
export CAIRN_TEST_MINIO_BIN="$minio"
echo "== S3 server: MinIO on ${CAIRN_TEST_S3_ENDPOINT#http://} (bucket $CAIRN_TEST_S3_BUCKET)"
echo "== cargo test"
log=$(mktemp)
set +e
cargo test --workspace --all-targets --no-fail-fast 2>&1 | tee "$log"
status=${PIPESTATUS[0]}
set -e
read -r passed failed < <(awk '/^test result:/ {
    for (i = 1; i <= NF; i++) { if ($(i+1) ~ /^passed/) p += $i; if ($(i+1) ~ /^failed/) f += $i }
  } END { print p + 0, f + 0 }' "$log")
rm -f "$log"
echo "tests: ${passed:-0} passed, ${failed:-0} failed"
exit "$status"
