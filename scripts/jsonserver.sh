#!/usr/bin/env bash
# scripts/jsonserver.sh — json-server, a third-party REST API server from npm,
# as the real API behind the REST sink (rest+http://) in tests and CI.
#
#   scripts/jsonserver.sh start    npm-install the pinned json-server if missing,
#                                  start it with empty in-memory collections,
#                                  wait until it accepts connections; the last
#                                  line printed is its base URL
#   scripts/jsonserver.sh stop     SIGTERM, then SIGKILL after 10 s
#   scripts/jsonserver.sh status   print "running ..." (exit 0) or "stopped" (exit 3)
#
# Both start and stop are idempotent. The server listens on 127.0.0.1 only
# and keeps its data in memory (its database is a JavaScript module, which
# json-server loads into memory and never writes back), so every start is
# empty. Each collection C answers POST /C (201, or 500 "Insert failed,
# duplicate id" for an id it holds), PUT and PATCH /C/:id (200, or 404 for
# an id it does not hold), and GET /C?_limit=1 with the count in
# X-Total-Count.
#
# Environment:
#   SLUICE_JSONSERVER_PORT          port                                (13000)
#   SLUICE_JSONSERVER_VERSION       npm version of json-server          (0.17.4)
#   SLUICE_JSONSERVER_COLLECTIONS   comma-separated collection names    (items)
#   SLUICE_JSONSERVER_WAIT          readiness timeout, seconds          (30)
#   SLUICE_CACHE                    cache root                          (.cache, relative to the repository)
#
# Layout under $SLUICE_CACHE/jsonserver:
#   node_modules/                   the npm install
#   db-<port>.js                    the database module of the server on <port>
#   jsonserver-<port>.pid           its pid
#   jsonserver-<port>.log           its log

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST=127.0.0.1
PORT="${SLUICE_JSONSERVER_PORT:-13000}"
VERSION="${SLUICE_JSONSERVER_VERSION:-0.17.4}"
COLLECTIONS="${SLUICE_JSONSERVER_COLLECTIONS:-items}"
WAIT_SECONDS="${SLUICE_JSONSERVER_WAIT:-30}"
STOP_SECONDS=10
CACHE="${SLUICE_CACHE:-.cache}"
[[ "$CACHE" = /* ]] || CACHE="$ROOT/$CACHE"
DIR="$CACHE/jsonserver"
PIDFILE="$DIR/jsonserver-$PORT.pid"
LOGFILE="$DIR/jsonserver-$PORT.log"
DB="$DIR/db-$PORT.js"
BIN="$DIR/node_modules/.bin/json-server"
URL="http://$HOST:$PORT"

NAME=jsonserver.sh
# shellcheck source=service.sh
source "$ROOT/scripts/service.sh"

# write_db writes the database module: one empty array per collection.
write_db() {
  local body="" name
  IFS=',' read -ra names <<<"$COLLECTIONS"
  for name in "${names[@]}"; do
    name="${name// /}"
    [[ "$name" =~ ^[A-Za-z][A-Za-z0-9_-]*$ ]] || die "SLUICE_JSONSERVER_COLLECTIONS: bad collection name '$name'"
    body+="  \"$name\": [],"$'\n'
  done
  [[ -n "$body" ]] || die "SLUICE_JSONSERVER_COLLECTIONS names no collection"
  printf 'module.exports = () => ({\n%s})\n' "$body" >"$DB"
}

start() {
  if already_running; then
    echo "$URL"
    return 0
  fi
  require_free_port "$PORT" SLUICE_JSONSERVER_PORT
  npm_install json-server
  mkdir -p "$DIR"
  rm -f "$PIDFILE"
  write_db
  nohup "$BIN" --host "$HOST" --port "$PORT" --quiet --no-cors --no-gzip "$DB" >"$LOGFILE" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  await_ready listening json-server "did not listen"
  log "running on $HOST:$PORT (pid $(pid || echo '?'), collections $COLLECTIONS, log $LOGFILE)"
  echo "$URL"
}

stop() { stop_service "$PIDFILE" "$DB"; }

status() { service_status; }

dispatch "$@"
