#!/usr/bin/env bash
# A throwaway S3 server (MinIO) on loopback for the tests.
#   scripts/s3-server.sh ensure      print the path of a MinIO binary, building it if needed
#   scripts/s3-server.sh start DIR   start MinIO with data in DIR/data, log in DIR/minio.log,
#                                    pid in DIR/pid; create bucket cairn-test; print `export` lines
#   scripts/s3-server.sh stop DIR    stop it (fine if it is already gone)
# ensure looks in order at: $CAIRN_MINIO, `minio` on PATH, the cache
# ${CAIRN_CI_CACHE:-$HOME/.cache/cairn-ci}/minio, $(go env GOBIN or GOPATH/bin)/minio;
# otherwise it builds MinIO with `go install` (about 10 minutes on 2 cores) and copies
# the binary into the cache so the next run finds it there.
set -euo pipefail

minio_module=github.com/minio/minio@v0.0.0-20260212201848-7aac2a2c5b7c
bucket=cairn-test
region=us-east-1
cache_dir=${CAIRN_CI_CACHE:-${HOME:-/tmp}/.cache/cairn-ci}

die() {
  echo "s3-server.sh: $*" >&2
  exit 1
}

find_go() {
  if command -v go >/dev/null; then
    command -v go
  elif [ -x /usr/local/go/bin/go ]; then
    echo /usr/local/go/bin/go
  else
    return 1
  fi
}

# Where `go install` puts binaries: GOBIN, else the first GOPATH entry's bin.
go_bin_dir() {
  local go=$1 gobin gopath
  gobin=$("$go" env GOBIN)
  if [ -n "$gobin" ]; then
    echo "$gobin"
  else
    gopath=$("$go" env GOPATH)
    echo "${gopath%%:*}/bin"
  fi
}

ensure() {
  if [ -n "${CAIRN_MINIO:-}" ]; then
    [ -x "$CAIRN_MINIO" ] || die "CAIRN_MINIO=$CAIRN_MINIO is not an executable file"
    echo "$CAIRN_MINIO"
    return
  fi
  if command -v minio >/dev/null; then
    command -v minio
    return
  fi
  if [ -x "$cache_dir/minio" ]; then
    echo "$cache_dir/minio"
    return
  fi
  local go bindir
  go=$(find_go) || die "MinIO not found and go is not installed (needed to build it; or set CAIRN_MINIO)"
  bindir=$(go_bin_dir "$go") || die "could not ask go for its GOPATH"
  if [ ! -x "$bindir/minio" ]; then
    echo "building MinIO: go install $minio_module (about 10 minutes on 2 cores)" >&2
    GOFLAGS=-buildvcs=false "$go" install "$minio_module" >&2 ||
      die "MinIO build failed: go install $minio_module"
    [ -x "$bindir/minio" ] || die "MinIO build left no binary at $bindir/minio"
    echo "built $bindir/minio" >&2
  fi
  # Keep it for the next run (copy then rename, so a concurrent run never sees half a file).
  if mkdir -p "$cache_dir" 2>/dev/null && cp "$bindir/minio" "$cache_dir/minio.tmp.$$" 2>/dev/null &&
    mv -f "$cache_dir/minio.tmp.$$" "$cache_dir/minio"; then
    echo "cached MinIO at $cache_dir/minio" >&2
    echo "$cache_dir/minio"
  else
    rm -f "$cache_dir/minio.tmp.$$"
    echo "could not cache MinIO in $cache_dir (using $bindir/minio)" >&2
    echo "$bindir/minio"
  fi
}

# True if something accepts connections on 127.0.0.1:$1.
port_busy() {
  (exec 3<>"/dev/tcp/127.0.0.1/$1") 2>/dev/null
}

random_hex() {
  od -An -N"$1" -tx1 /dev/urandom | tr -d ' \n'
}

s3_curl() {
  curl -fsS --noproxy '*' --max-time 10 --aws-sigv4 "aws:amz:$region:s3" --user "$key:$secret" "$@"
}

start() {
  local dir=$1 bin port console pid attempt up exited deadline
  command -v curl >/dev/null || die "curl is required"
  bin=$(ensure)
  mkdir -p "$dir/data"
  dir=$(cd "$dir" && pwd)
  key=cairn$(random_hex 6)
  secret=$(random_hex 16)
  for attempt in 1 2 3 4 5; do
    port=$((20000 + RANDOM % 40000))
    console=$((port + 1))
    if port_busy "$port" || port_busy "$console"; then
      continue
    fi
    MINIO_ROOT_USER=$key MINIO_ROOT_PASSWORD=$secret MINIO_UPDATE=off \
      nohup "$bin" server "$dir/data" --address "127.0.0.1:$port" \
      --console-address "127.0.0.1:$console" </dev/null >"$dir/minio.log" 2>&1 &
    pid=$!
    echo "$pid" >"$dir/pid"
    up='' exited=''
    deadline=$((SECONDS + 30))
    while [ "$SECONDS" -lt "$deadline" ]; do
      if curl -fsS --noproxy '*' --max-time 1 -o /dev/null \
        "http://127.0.0.1:$port/minio/health/live" 2>/dev/null; then
        up=1
        break
      fi
      # Gone, or a zombie not reaped yet.
      if ! kill -0 "$pid" 2>/dev/null || grep -qs '^State:[[:space:]]*Z' "/proc/$pid/status"; then
        exited=1
        break
      fi
      sleep 0.1
    done
    [ -n "$up" ] && break
    kill "$pid" 2>/dev/null || true
    wait "$pid" 2>/dev/null || true
    rm -f "$dir/pid"
    # Someone took the port between the check and MinIO binding it: try another.
    if grep -qi "address already in use" "$dir/minio.log" && [ "$attempt" -lt 5 ]; then
      continue
    fi
    if [ -n "$exited" ]; then
      die "MinIO ($bin) exited before becoming healthy on 127.0.0.1:$port; end of $dir/minio.log:
$(tail -n 20 "$dir/minio.log")"
    fi
    die "MinIO ($bin) did not become healthy on 127.0.0.1:$port within 30 s; end of $dir/minio.log:
$(tail -n 20 "$dir/minio.log")"
  done
  [ -n "${up:-}" ] || die "found no free loopback port for MinIO"
  # /minio/health/live answers once the process listens; the object layer may
  # still be starting and answer 503 to the bucket PUT for a moment. Retry
  # for a while rather than fail the whole run on that.
  local made='' err=''
  deadline=$((SECONDS + 20))
  while [ "$SECONDS" -lt "$deadline" ]; do
    if err=$(s3_curl -o /dev/null -X PUT "http://127.0.0.1:$port/$bucket" 2>&1); then
      made=1
      break
    fi
    # A PUT that was made but whose answer was lost leaves the bucket there.
    if s3_curl -o /dev/null -I "http://127.0.0.1:$port/$bucket" 2>/dev/null; then
      made=1
      break
    fi
    sleep 0.25
  done
  if [ -z "$made" ]; then
    stop "$dir"
    die "could not create bucket $bucket on MinIO at 127.0.0.1:$port: $err"
  fi
  printf 'export CAIRN_TEST_S3=%q\n' "s3:http://127.0.0.1:$port/$bucket"
  printf 'export CAIRN_TEST_S3_ENDPOINT=%q\n' "http://127.0.0.1:$port"
  printf 'export CAIRN_TEST_S3_BUCKET=%q\n' "$bucket"
  printf 'export AWS_ACCESS_KEY_ID=%q\n' "$key"
  printf 'export AWS_SECRET_ACCESS_KEY=%q\n' "$secret"
  printf 'export AWS_REGION=%q\n' "$region"
  # A proxy from the environment must not see requests to the local server.
  printf 'export NO_PROXY=%q no_proxy=%q\n' \
    "127.0.0.1,localhost${NO_PROXY:+,$NO_PROXY}" "127.0.0.1,localhost${no_proxy:+,$no_proxy}"
}

stop() {
  local dir=$1 pid i
  [ -f "$dir/pid" ] || return 0
  pid=$(cat "$dir/pid")
  # Only signal it if that pid is still a MinIO (not a reused pid).
  if [ -n "$pid" ] && kill -0 "$pid" 2>/dev/null && tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -q minio; then
    kill "$pid" 2>/dev/null || true
    for ((i = 0; i < 100; i++)); do
      kill -0 "$pid" 2>/dev/null || break
      sleep 0.1
    done
    if kill -0 "$pid" 2>/dev/null; then
      kill -9 "$pid" 2>/dev/null || true
    fi
  fi
  rm -f "$dir/pid"
}

case "${1:-}" in
  ensure) ensure ;;
  start)
    [ $# -eq 2 ] || die "usage: $0 start DIR"
    start "$2"
    ;;
  stop)
    [ $# -eq 2 ] || die "usage: $0 stop DIR"
    stop "$2"
    ;;
  *) die "usage: $0 ensure | start DIR | stop DIR" ;;
esac
