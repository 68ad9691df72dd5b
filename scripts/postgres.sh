#!/usr/bin/env bash
# scripts/postgres.sh — a real PostgreSQL server for tests, benchmarks and CI.
#
#   scripts/postgres.sh start    install the server if missing, initdb a throwaway
#                                data directory, start it, wait until it accepts
#                                connections; the last line printed is its URL
#   scripts/postgres.sh stop     pg_ctl stop -m fast, then remove the data directory
#   scripts/postgres.sh status   print "running ..." (exit 0) or "stopped" (exit 3)
#
# Both start and stop are idempotent. The server listens on 127.0.0.1 only,
# trusts local connections (it is a throwaway test server: never expose it),
# turns fsync off, and is the Debian package's (installed with apt-get when
# missing). initdb refuses to run as root, so as root the server runs as the
# "postgres" system user the package creates.
#
# Environment:
#   SLUICE_POSTGRES_PORT   port                        (15432)
#   SLUICE_POSTGRES_WAIT   readiness timeout, seconds  (30)
#   SLUICE_CACHE           cache root                  (.cache, relative to the repository)
#
# Layout under $SLUICE_CACHE/postgres:
#   data-<port>/           the data directory (removed by stop)
#   postgres-<port>.log    the server's log
#
# Tests use it with: SLUICE_TEST_POSTGRES_URL=<the printed URL> go test ./sink/
# (without that variable they run this script themselves).

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST=127.0.0.1
PORT="${SLUICE_POSTGRES_PORT:-15432}"
WAIT_SECONDS="${SLUICE_POSTGRES_WAIT:-30}"
CACHE="${SLUICE_CACHE:-.cache}"
[[ "$CACHE" = /* ]] || CACHE="$ROOT/$CACHE"
DIR="$CACHE/postgres"
DATA="$DIR/data-$PORT"
LOGFILE="$DIR/postgres-$PORT.log"
PIDFILE=""  # pg_ctl keeps the pid in the data directory
URL="postgres://postgres@$HOST:$PORT/postgres"

NAME=postgres.sh
# shellcheck source=service.sh
source "$ROOT/scripts/service.sh"

bindir() {
  local d
  for d in /usr/lib/postgresql/*/bin; do
    [[ -x "$d/pg_ctl" ]] && { echo "$d"; return 0; }
  done
  return 1
}

install_postgres() {
  bindir >/dev/null && return 0
  log "PostgreSQL server not found; installing the Debian package"
  local sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || die "postgresql is missing and this is not root: run 'apt-get install -y postgresql' as root"
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq postgresql >/dev/null
  bindir >/dev/null || die "apt-get installed postgresql but no pg_ctl under /usr/lib/postgresql"
}

# as runs a command as the server's owner: postgres when we are root.
as() {
  if [[ "$(id -u)" == 0 ]]; then
    runuser -u postgres -- "$@"
  else
    "$@"
  fi
}

ready() {
  "$(bindir)/pg_isready" -q -h "$HOST" -p "$PORT" -U postgres -d postgres 2>/dev/null
}

running() { [[ -f "$DATA/postmaster.pid" ]] && as "$(bindir)/pg_ctl" -D "$DATA" status >/dev/null 2>&1; }

start() {
  install_postgres
  local bin
  bin="$(bindir)"
  if running && ready; then
    log "already running on $HOST:$PORT"
    echo "$URL"
    return 0
  fi
  if ready; then
    die "something else already answers on $HOST:$PORT; set SLUICE_POSTGRES_PORT to another port"
  fi
  mkdir -p "$DIR"
  if [[ "$(id -u)" == 0 ]]; then
    chown postgres "$DIR"
    chmod o+x "$CACHE" "$DIR" 2>/dev/null || true
  fi
  # A data directory left here was never stopped (a killed run): with
  # fsync off it may not recover, and a throwaway server keeps nothing.
  rm -rf "$DATA"
  as "$bin/initdb" -D "$DATA" -U postgres -A trust -E UTF8 --no-locale >"$LOGFILE" 2>&1 \
    || { tail -n 20 "$LOGFILE" >&2; die "initdb failed; see $LOGFILE"; }
  : >"$LOGFILE"
  [[ "$(id -u)" == 0 ]] && chown postgres "$LOGFILE"
  as "$bin/pg_ctl" -D "$DATA" -l "$LOGFILE" -w -t "$WAIT_SECONDS" start \
    -o "-h $HOST -p $PORT -k '' -c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=200" >/dev/null \
    || { tail -n 20 "$LOGFILE" >&2; die "postgres failed to start; see $LOGFILE"; }
  await_ready ready postgres "did not accept connections"
  log "running on $HOST:$PORT (data $DATA, log $LOGFILE)"
  echo "$URL"
}

stop() {
  local bin
  if ! bin="$(bindir)" || ! running; then
    rm -rf "$DATA"
    log "not running on port $PORT"
    return 0
  fi
  as "$bin/pg_ctl" -D "$DATA" -m fast -w stop >/dev/null || die "pg_ctl stop failed; see $LOGFILE"
  rm -rf "$DATA"
  log "stopped"
}

status() {
  if bindir >/dev/null && running && ready; then
    echo "running on $HOST:$PORT ($URL)"
    return 0
  fi
  echo "stopped"
  return 3
}

dispatch "$@"
