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
APT_PKGS=(time pkg-config python3-dev python3-venv libacl1-dev libssl-dev liblz4-dev libzstd-dev libxxhash-dev build-essential)
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

# ---- restic ---------------------------------------------------------------
if [ -x "$TOOLS/restic" ] && "$TOOLS/restic" version 2>/dev/null | grep -q "restic $RESTIC_VERSION"; then
  log "restic $RESTIC_VERSION present"
else
  command -v go >/dev/null || { log "go toolchain not found"; exit 1; }
  log "downloading restic v$RESTIC_VERSION from the Go module proxy"
  go mod download -json "github.com/restic/restic@v$RESTIC_VERSION" >/dev/null
  src="$(go env GOMODCACHE)/github.com/restic/restic@v$RESTIC_VERSION"
  log "building restic in $src"
  ( cd "$src" && GOFLAGS=-mod=mod nice -n 10 go build -o "$TOOLS/restic.tmp" ./cmd/restic )
  mv "$TOOLS/restic.tmp" "$TOOLS/restic"
  "$TOOLS/restic" version
fi

# ---- rest-server (restic's server, for the server scenario) --------------
if [ -x "$TOOLS/rest-server" ] && [ "$(cat "$TOOLS/rest-server.version" 2>/dev/null)" = "$REST_SERVER_VERSION" ]; then
  log "rest-server $REST_SERVER_VERSION present"
else
  command -v go >/dev/null || { log "go is needed to build rest-server"; exit 1; }
  log "downloading rest-server v$REST_SERVER_VERSION from the Go module proxy"
  go mod download -json "github.com/restic/rest-server@v$REST_SERVER_VERSION" >/dev/null
  src="$(go env GOMODCACHE)/github.com/restic/rest-server@v$REST_SERVER_VERSION"
  ( cd "$src" && GOFLAGS=-mod=mod nice -n 10 go build -o "$TOOLS/rest-server.tmp" ./cmd/rest-server )
  mv "$TOOLS/rest-server.tmp" "$TOOLS/rest-server"
  echo "$REST_SERVER_VERSION" > "$TOOLS/rest-server.version"
fi

# ---- kopia ----------------------------------------------------------------
# a module-proxy build reports "v0-unofficial", so the version built is kept in a stamp file
if [ -x "$TOOLS/kopia" ] && [ "$(cat "$TOOLS/kopia.version" 2>/dev/null)" = "$KOPIA_VERSION" ]; then
  log "kopia $KOPIA_VERSION present"
else
  command -v go >/dev/null || { log "go toolchain not found"; exit 1; }
  log "downloading kopia v$KOPIA_VERSION from the Go module proxy"
  go mod download -json "github.com/kopia/kopia@v$KOPIA_VERSION" >/dev/null
  src="$(go env GOMODCACHE)/github.com/kopia/kopia@v$KOPIA_VERSION"
  log "building kopia in $src"
  ( cd "$src" && GOFLAGS=-mod=mod nice -n 10 go build -o "$TOOLS/kopia.tmp" . )
  mv "$TOOLS/kopia.tmp" "$TOOLS/kopia"
  echo "$KOPIA_VERSION" > "$TOOLS/kopia.version"
fi

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
log "done"
