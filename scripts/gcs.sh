#!/usr/bin/env bash
# scripts/gcs.sh — a Cloud Storage emulator (fake-gcs-server) for tests,
# benchmarks and CI.
#
#   scripts/gcs.sh start    build fake-gcs-server if missing, start it, wait
#                           until it answers; the last line printed is its
#                           endpoint, http://127.0.0.1:<port>
#   scripts/gcs.sh stop     SIGTERM, then SIGKILL after 10 s; removes the data
#   scripts/gcs.sh build    only build (CI can build ahead of the tests)
#   scripts/gcs.sh status   print "running ..." (exit 0) or "stopped" (exit 3)
#
# start and stop are idempotent. fake-gcs-server is built from its Go
# module at the pinned version with the Go toolchain on PATH (go install
# through the Go module proxy; no prebuilt download, no Docker) into
# $SLUICE_CACHE/gcs/fake-gcs-server-<version>, once per cache. It serves
# Cloud Storage's JSON API over plain HTTP on 127.0.0.1 only, and takes
# any credentials or none: clients point the storage client at the
# endpoint (sluice: gs://bucket/prefix?endpoint=<the printed endpoint>).
# It keeps its buckets in a fresh data folder per start (removed by
# stop), with the filesystem backend: the memory backend finds an object
# by scanning its bucket's list, so its uploads slow down as a bucket
# fills (measured: about 330 uploads/s at 2,000 objects, 32 at 10,000),
# where the filesystem backend keeps 120-300/s.
#
# Environment:
#   SLUICE_GCS_PORT      port                        (14443)
#   SLUICE_GCS_WAIT      readiness timeout, seconds  (30)
#   SLUICE_GCS_VERSION   Go module version of fake-gcs-server (pinned below)
#   SLUICE_CACHE         cache root                  (.cache, relative to the repository)
#
# Layout under $SLUICE_CACHE/gcs:
#   fake-gcs-server-<version>   the built server
#   build.log                   the last build's output
#   data-<port>/                the data folder (removed by stop)
#   gcs-<port>.pid, gcs-<port>.log
#
# Tests use it with: SLUICE_TEST_GCS_URL=<the printed endpoint> go test ./sink/
# (without that variable they run this script themselves).

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST=127.0.0.1
PORT="${SLUICE_GCS_PORT:-14443}"
WAIT_SECONDS="${SLUICE_GCS_WAIT:-30}"
VERSION="${SLUICE_GCS_VERSION:-v1.56.1}"
STOP_SECONDS=10
CACHE="${SLUICE_CACHE:-.cache}"
[[ "$CACHE" = /* ]] || CACHE="$ROOT/$CACHE"
DIR="$CACHE/gcs"
BIN="$DIR/fake-gcs-server-$VERSION"
DATA="$DIR/data-$PORT"
PIDFILE="$DIR/gcs-$PORT.pid"
LOGFILE="$DIR/gcs-$PORT.log"
URL="http://$HOST:$PORT"

NAME=gcs.sh
# shellcheck source=service.sh
source "$ROOT/scripts/service.sh"

# ready succeeds when the JSON API lists the buckets (200).
ready() {
  local status
  { exec 3<>"/dev/tcp/$HOST/$PORT"; } 2>/dev/null || return 1
  printf 'GET /storage/v1/b?project=sluice HTTP/1.0\r\nHost: %s:%s\r\n\r\n' "$HOST" "$PORT" >&3
  IFS= read -r -t 5 status <&3 || status=""
  exec 3<&- 3>&-
  [[ "$status" == "HTTP/1."?" 200"* ]]
}

# build compiles fake-gcs-server unless the binary of the pinned version
# is there.
build() {
  [[ -x "$BIN" ]] && return 0
  command -v go >/dev/null || die "go is missing: fake-gcs-server is built with the Go toolchain"
  log "building fake-gcs-server $VERSION with $(go env GOVERSION) (first run only; a few minutes)"
  local tmp="$DIR/bin.tmp.$$" began=$SECONDS
  rm -rf "$tmp"
  mkdir -p "$tmp"
  # Outside the repository, so that sluice's go.mod plays no part.
  if ! (cd "$tmp" && GOBIN="$tmp" GOFLAGS=-trimpath CGO_ENABLED=0 GOWORK=off \
      go install -ldflags '-s -w' "github.com/fsouza/fake-gcs-server@$VERSION") >"$DIR/build.log" 2>&1; then
    tail -n 30 "$DIR/build.log" >&2
    rm -rf "$tmp"
    die "building fake-gcs-server failed; see $DIR/build.log"
  fi
  mv "$tmp/fake-gcs-server" "$BIN"
  rm -rf "$tmp"
  log "built $BIN in $((SECONDS - began)) s"
}

do_start() {
  already_running && return 0
  require_free_port "$PORT" SLUICE_GCS_PORT
  build
  rm -rf "$DATA" "$PIDFILE"
  mkdir -p "$DATA"
  local detach=env
  command -v setsid >/dev/null 2>&1 && detach=setsid
  "$detach" "$BIN" -scheme http -host "$HOST" -port "$PORT" -backend filesystem -filesystem-root "$DATA" \
    -external-url "$URL" -public-host "$HOST:$PORT" -log-level warn \
    >"$LOGFILE" 2>&1 </dev/null 9>&- &
  echo $! >"$PIDFILE"
  await_ready ready fake-gcs-server "did not answer"
  log "running on $HOST:$PORT (pid $(pid || echo '?'), log $LOGFILE)"
}

start() {
  with_lock do_start
  echo "$URL"
}

stop() { stop_service "$PIDFILE" "$DATA"; }

status() { service_status; }

case "${1:-}" in
  build) with_lock build ;;
  *) dispatch "$@" ;;
esac
