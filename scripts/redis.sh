#!/usr/bin/env bash
# scripts/redis.sh — a real redis-server for tests, benchmarks and CI.
#
#   scripts/redis.sh start    install redis-server if missing, start it, wait for PING
#   scripts/redis.sh stop     SHUTDOWN NOSAVE, then SIGTERM, then SIGKILL after 10 s
#   scripts/redis.sh status   print "running ..." (exit 0) or "stopped" (exit 3)
#
# Both start and stop are idempotent. The server listens on 127.0.0.1 only,
# keeps nothing on disk (no RDB snapshots, no AOF), and is the Debian
# package's redis-server (installed with apt-get when missing).
#
# Environment:
#   SLUICE_REDIS_PORT   port                        (16379)
#   SLUICE_REDIS_WAIT   readiness timeout, seconds  (20)
#   SLUICE_CACHE        cache root                  (.cache, relative to the repository)
#
# Layout under $SLUICE_CACHE/redis:
#   redis-<port>.pid    the server's pid
#   redis-<port>.log    the server's log
#
# Tests use it with: SLUICE_TEST_REDIS_ADDR=127.0.0.1:16379 go test ./lease/
# (without that variable they start their own redis-server).

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
HOST=127.0.0.1
PORT="${SLUICE_REDIS_PORT:-16379}"
WAIT_SECONDS="${SLUICE_REDIS_WAIT:-20}"
STOP_SECONDS=10
CACHE="${SLUICE_CACHE:-.cache}"
[[ "$CACHE" = /* ]] || CACHE="$ROOT/$CACHE"
DIR="$CACHE/redis"
PIDFILE="$DIR/redis-$PORT.pid"
LOGFILE="$DIR/redis-$PORT.log"

NAME=redis.sh
# shellcheck source=service.sh
source "$ROOT/scripts/service.sh"

# ping answers 0 when a Redis on HOST:PORT replies PONG.
ping() {
  if command -v redis-cli >/dev/null; then
    [[ "$(redis-cli -h "$HOST" -p "$PORT" ping 2>/dev/null)" == "PONG" ]]
  else
    local reply
    { exec 3<>"/dev/tcp/$HOST/$PORT"; } 2>/dev/null || return 1
    printf 'PING\r\n' >&3
    IFS= read -r -t 2 reply <&3 || true
    exec 3<&- 3>&-
    [[ "$reply" == "+PONG"* ]]
  fi
}

install_redis() {
  command -v redis-server >/dev/null && return 0
  log "redis-server not found; installing the Debian package"
  local sudo=()
  if [[ "$(id -u)" != 0 ]]; then
    command -v sudo >/dev/null || die "redis-server is missing and this is not root: run 'apt-get install -y redis-server' as root"
    sudo=(sudo)
  fi
  "${sudo[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo[@]}" apt-get install -y -qq redis-server >/dev/null
  command -v redis-server >/dev/null || die "apt-get installed redis-server but it is not on PATH"
}

start() {
  if p="$(pid)" && ping; then
    log "already running on $HOST:$PORT (pid $p)"
    return 0
  fi
  if ping; then
    die "something else already answers on $HOST:$PORT; set SLUICE_REDIS_PORT to another port"
  fi
  install_redis
  mkdir -p "$DIR"
  rm -f "$PIDFILE"
  redis-server --port "$PORT" --bind "$HOST" --save "" --appendonly no \
    --dir "$DIR" --daemonize yes --pidfile "$PIDFILE" --logfile "$LOGFILE" \
    || die "redis-server failed to start; see $LOGFILE"
  local deadline=$((SECONDS + WAIT_SECONDS))
  until ping; do
    if ((SECONDS >= deadline)); then
      tail -n 20 "$LOGFILE" >&2 || true
      die "redis-server did not answer PING on $HOST:$PORT within ${WAIT_SECONDS}s; see $LOGFILE"
    fi
    sleep 0.1
  done
  log "running on $HOST:$PORT (pid $(pid || echo '?'), log $LOGFILE)"
}

stop() {
  local p
  if ! p="$(pid)"; then
    rm -f "$PIDFILE"
    log "not running on port $PORT"
    return 0
  fi
  if command -v redis-cli >/dev/null; then
    redis-cli -h "$HOST" -p "$PORT" shutdown nosave >/dev/null 2>&1 || true
  fi
  terminate "$p"
  rm -f "$PIDFILE"
  log "stopped (was pid $p)"
}

status() {
  local p
  if p="$(pid)" && ping; then
    echo "running on $HOST:$PORT (pid $p)"
    return 0
  fi
  echo "stopped"
  return 3
}

dispatch "$@"
