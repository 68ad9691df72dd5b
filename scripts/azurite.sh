#!/usr/bin/env bash
# scripts/azurite.sh — Azurite's Table service (the Azure Storage emulator)
# for tests, benchmarks and CI.
#
#   scripts/azurite.sh start    npm-install the pinned Azurite if missing, start
#                               azurite-table, wait until it accepts connections;
#                               the last line printed is the --sink URL prefix
#   scripts/azurite.sh stop     SIGTERM, then SIGKILL after 10 s
#   scripts/azurite.sh status   print "running ..." (exit 0) or "stopped" (exit 3)
#
# Both start and stop are idempotent. The emulator listens on 127.0.0.1 only,
# keeps its data in memory, has telemetry disabled, and serves the well-known
# development account devstoreaccount1, whose public key is documented by
# Microsoft for the emulator (tests pass it in SLUICE_AZURE_ACCOUNT_KEY).
#
# Environment:
#   SLUICE_AZURITE_PORT      port                        (10102)
#   SLUICE_AZURITE_VERSION   npm version of azurite      (3.35.0)
#   SLUICE_AZURITE_WAIT      readiness timeout, seconds  (30)
#   SLUICE_CACHE             cache root                  (.cache, relative to the repository)
#
# Layout under $SLUICE_CACHE/azurite:
#   node_modules/            the npm install
#   azurite-<port>.pid       the emulator's pid
#   azurite-<port>.log       its log

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST=127.0.0.1
PORT="${SLUICE_AZURITE_PORT:-10102}"
VERSION="${SLUICE_AZURITE_VERSION:-3.35.0}"
WAIT_SECONDS="${SLUICE_AZURITE_WAIT:-30}"
STOP_SECONDS=10
CACHE="${SLUICE_CACHE:-.cache}"
[[ "$CACHE" = /* ]] || CACHE="$ROOT/$CACHE"
DIR="$CACHE/azurite"
PIDFILE="$DIR/azurite-$PORT.pid"
LOGFILE="$DIR/azurite-$PORT.log"
BIN="$DIR/node_modules/.bin/azurite-table"
URL="azuretables://$HOST:$PORT/devstoreaccount1"

NAME=azurite.sh
# shellcheck source=service.sh
source "$ROOT/scripts/service.sh"

start() {
  if already_running; then
    echo "$URL"
    return 0
  fi
  require_free_port "$PORT" SLUICE_AZURITE_PORT
  npm_install azurite
  mkdir -p "$DIR"
  rm -f "$PIDFILE"
  AZURITE_DISABLE_TELEMETRY=1 nohup "$BIN" --tableHost "$HOST" --tablePort "$PORT" --inMemoryPersistence \
    --disableTelemetry --skipApiVersionCheck --disableProductStyleUrl --loose --silent \
    >"$LOGFILE" 2>&1 </dev/null &
  echo $! >"$PIDFILE"
  await_ready listening azurite-table "did not listen"
  log "running on $HOST:$PORT (pid $(pid || echo '?'), log $LOGFILE)"
  echo "$URL"
}

stop() { stop_service "$PIDFILE"; }

status() { service_status; }

dispatch "$@"
