#!/usr/bin/env bash
# scripts/s3.sh — a real S3-compatible object store (MinIO) for tests,
# benchmarks and CI.
#
#   scripts/s3.sh start    build MinIO if missing, start it on a fresh data
#                          folder, wait until it is ready; the last line
#                          printed is its endpoint, http://127.0.0.1:<port>
#   scripts/s3.sh stop     SIGTERM, then SIGKILL after 10 s; removes the data
#   scripts/s3.sh build    only build (CI can build ahead of the tests)
#   scripts/s3.sh status   print "running ..." (exit 0) or "stopped" (exit 3)
#
# start and stop are idempotent. MinIO is built from its Go module at the
# pinned version with the Go toolchain on PATH (go install through the Go
# module proxy; no prebuilt download, no Docker) into
# $SLUICE_CACHE/s3/minio-<version>, once per cache. It serves the S3 API
# on 127.0.0.1 only, with its web console off, on a single-drive data
# folder (erasure coding off, so objects are plain files), with a
# test-only root user whose credentials clients use as AWS credentials:
#
#   AWS_ACCESS_KEY_ID=$SLUICE_S3_ACCESS_KEY AWS_SECRET_ACCESS_KEY=$SLUICE_S3_SECRET_KEY
#
# Environment:
#   SLUICE_S3_PORT           S3 API port                       (19000)
#   SLUICE_S3_CONSOLE_PORT   console port, bound though unused (S3 port + 1)
#   SLUICE_S3_ACCESS_KEY     root user                         (sluicetest)
#   SLUICE_S3_SECRET_KEY     root password, ≥ 8 characters     (sluicetestsecret)
#   SLUICE_S3_WAIT           readiness timeout, seconds        (30)
#   SLUICE_MINIO_VERSION     Go module version of MinIO        (pinned below)
#   SLUICE_CACHE             cache root                        (.cache, relative to the repository)
#
# Layout under $SLUICE_CACHE/s3:
#   minio-<version>          the built server
#   build.log                the last build's output
#   data-<port>/             the data folder (removed by stop)
#   s3-<port>.pid, s3-<port>.log
#
# Tests use it with: SLUICE_TEST_S3_URL=<the printed endpoint> go test ./sink/
# (without that variable they run this script themselves).

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST=127.0.0.1
PORT="${SLUICE_S3_PORT:-19000}"
CONSOLE_PORT="${SLUICE_S3_CONSOLE_PORT:-$((PORT + 1))}"
ACCESS_KEY="${SLUICE_S3_ACCESS_KEY:-sluicetest}"
SECRET_KEY="${SLUICE_S3_SECRET_KEY:-sluicetestsecret}"
WAIT_SECONDS="${SLUICE_S3_WAIT:-30}"
# The last commit of MinIO's community edition on the Go module proxy
# (MinIO's RELEASE.* tags are not semantic versions, so the proxy serves
# its commits as pseudo-versions).
VERSION="${SLUICE_MINIO_VERSION:-v0.0.0-20260212201848-7aac2a2c5b7c}"
STOP_SECONDS=10
CACHE="${SLUICE_CACHE:-.cache}"
[[ "$CACHE" = /* ]] || CACHE="$ROOT/$CACHE"
DIR="$CACHE/s3"
BIN="$DIR/minio-$VERSION"
DATA="$DIR/data-$PORT"
PIDFILE="$DIR/s3-$PORT.pid"
LOGFILE="$DIR/s3-$PORT.log"
URL="http://$HOST:$PORT"

NAME=s3.sh
# shellcheck source=service.sh
source "$ROOT/scripts/service.sh"

# ready succeeds when MinIO's readiness probe answers 200.
ready() {
  local status
  { exec 3<>"/dev/tcp/$HOST/$PORT"; } 2>/dev/null || return 1
  printf 'GET /minio/health/ready HTTP/1.0\r\nHost: %s:%s\r\n\r\n' "$HOST" "$PORT" >&3
  IFS= read -r -t 5 status <&3 || status=""
  exec 3<&- 3>&-
  [[ "$status" == "HTTP/1."?" 200"* ]]
}

# build compiles MinIO unless the binary of the pinned version is there.
build() {
  [[ -x "$BIN" ]] && return 0
  command -v go >/dev/null || die "go is missing: MinIO is built with the Go toolchain"
  log "building MinIO $VERSION with $(go env GOVERSION) (first run only; a few minutes)"
  local tmp="$DIR/bin.tmp.$$" began=$SECONDS
  rm -rf "$tmp"
  mkdir -p "$tmp"
  # Outside the repository, so that sluice's go.mod plays no part.
  if ! (cd "$tmp" && GOBIN="$tmp" GOFLAGS=-trimpath CGO_ENABLED=0 GOWORK=off \
      go install -ldflags '-s -w' "github.com/minio/minio@$VERSION") >"$DIR/build.log" 2>&1; then
    tail -n 30 "$DIR/build.log" >&2
    rm -rf "$tmp"
    die "building MinIO failed; see $DIR/build.log"
  fi
  mv "$tmp/minio" "$BIN"
  rm -rf "$tmp"
  log "built $BIN in $((SECONDS - began)) s"
}

do_start() {
  already_running && return 0
  require_free_port "$PORT" SLUICE_S3_PORT
  require_free_port "$CONSOLE_PORT" SLUICE_S3_CONSOLE_PORT
  ((${#SECRET_KEY} >= 8)) || die "SLUICE_S3_SECRET_KEY must have at least 8 characters"
  build
  rm -rf "$DATA" "$PIDFILE"
  mkdir -p "$DATA"
  local detach=env
  command -v setsid >/dev/null 2>&1 && detach=setsid
  MINIO_ROOT_USER="$ACCESS_KEY" MINIO_ROOT_PASSWORD="$SECRET_KEY" MINIO_BROWSER=off MINIO_UPDATE=off \
    "$detach" "$BIN" server "$DATA" --quiet --address "$HOST:$PORT" --console-address "$HOST:$CONSOLE_PORT" \
    >"$LOGFILE" 2>&1 </dev/null 9>&- &
  echo $! >"$PIDFILE"
  await_ready ready MinIO "was not ready"
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
