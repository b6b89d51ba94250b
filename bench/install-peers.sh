#!/usr/bin/env bash
# Idempotently install the peer tools cairn is benchmarked against:
#   restic 0.19.1 (built from the Go module proxy) -> bench/.tools/restic
#   borg 1.4.x (PyPI, in a venv)                   -> bench/.tools/borg-venv/bin/borg
#   kopia 0.23.1 (built from the Go module proxy)  -> bench/.tools/kopia
#   rest-server 0.14.0 (Go module proxy)           -> bench/.tools/rest-server (restic's server)
# plus the apt packages the harness needs (GNU time, borg build deps).
set -euo pipefail

BENCH_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
TOOLS="$BENCH_DIR/.tools"
RESTIC_VERSION="${RESTIC_VERSION:-0.19.1}"
KOPIA_VERSION="${KOPIA_VERSION:-0.23.1}"
REST_SERVER_VERSION="${REST_SERVER_VERSION:-0.14.0}"
BORG_SPEC="${BORG_SPEC:-borgbackup>=1.4,<1.5}"
mkdir -p "$TOOLS"

log() { printf '[install-peers] %s\n' "$*" >&2; }

SUDO=""
if [ "$(id -u)" != 0 ]; then SUDO="sudo"; fi

# ---- apt packages ---------------------------------------------------------
APT_PKGS=(time pkg-config python3-dev python3-venv libacl1-dev libssl-dev liblz4-dev libzstd-dev libxxhash-dev build-essential libfuse3-dev fuse3)
missing=()
for p in "${APT_PKGS[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if [ "${#missing[@]}" -gt 0 ]; then
  log "apt-get install ${missing[*]}"
  $SUDO apt-get update -q
  DEBIAN_FRONTEND=noninteractive $SUDO apt-get install -y -q "${missing[@]}"
else
  log "apt packages present"
fi

# A Go tool from the module proxy (`go install MOD@vX` fails here: the version
# list is closed), with the version built kept in NAME.version (a proxy build of
# kopia reports "v0-unofficial"). go_tool NAME MODULE VERSION PACKAGE
go_tool() {
  local name=$1 module=$2 version=$3 pkg=$4 src
  if [ -x "$TOOLS/$name" ] && [ "$(cat "$TOOLS/$name.version" 2>/dev/null)" = "$version" ]; then
    log "$name $version present"
    return
  fi
  command -v go >/dev/null || { log "go is needed to build $name"; exit 1; }
  log "downloading $name v$version from the Go module proxy"
  go mod download -json "$module@v$version" >/dev/null
  src="$(go env GOMODCACHE)/$module@v$version"
  log "building $name in $src"
  ( cd "$src" && GOFLAGS=-mod=mod nice -n 10 go build -o "$TOOLS/$name.tmp" "$pkg" )
  mv "$TOOLS/$name.tmp" "$TOOLS/$name"
  echo "$version" > "$TOOLS/$name.version"
}

go_tool restic github.com/restic/restic "$RESTIC_VERSION" ./cmd/restic
# restic's own server, for the server and clients scenarios
go_tool rest-server github.com/restic/rest-server "$REST_SERVER_VERSION" ./cmd/rest-server
go_tool kopia github.com/kopia/kopia "$KOPIA_VERSION" .

# ---- borg -----------------------------------------------------------------
BORG="$TOOLS/borg-venv/bin/borg"
if [ -x "$BORG" ] && "$BORG" --version 2>/dev/null | grep -q "borg 1\.4\."; then
  log "$("$BORG" --version) present"
else
  PY="${BORG_PYTHON:-/usr/bin/python3}"
  [ -x "$PY" ] || PY="$(command -v python3)"
  log "creating venv with $PY"
  rm -rf "$TOOLS/borg-venv"
  "$PY" -m venv "$TOOLS/borg-venv"
  "$TOOLS/borg-venv/bin/pip" install -q --upgrade pip setuptools wheel
  log "pip install '$BORG_SPEC' (may compile from source)"
  nice -n 10 "$TOOLS/borg-venv/bin/pip" install -q "$BORG_SPEC"
  "$BORG" --version
fi
# `borg mount` (bench/recovery.py) needs a FUSE binding in the venv.
if ! "$TOOLS/borg-venv/bin/python" -c "import pyfuse3" 2>/dev/null; then
  log "pip install pyfuse3 (for borg mount)"
  nice -n 10 "$TOOLS/borg-venv/bin/pip" install -q pyfuse3
fi
log "done"
