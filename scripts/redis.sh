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
# Secured mode (opt-in): SLUICE_REDIS_SECURE=1 scripts/redis.sh start starts
# the server as managed Redis asks a client to connect to it:
#   - ACL user SLUICE_REDIS_USERNAME ("sluice", password SLUICE_REDIS_PASSWORD)
#     with only what sluice needs: keys and channels sluice:* (the lease
#     change feed), read, write, scripting, transactions, pub/sub,
#     connection commands, nothing @dangerous;
#   - the default user protected by a random password kept in
#     redis-<port>.admin (for this script and Sentinel);
#   - TLS on the TLS port beside the plain one (client certificates are
#     checked when sent, not required), with a test CA, a server
#     certificate for 127.0.0.1 and localhost and a client certificate made
#     by openssl (scripts/tls.sh) in tls/;
#   - a Sentinel (redis-server --sentinel) on the Sentinel port monitoring
#     the server as master SLUICE_REDIS_SENTINEL_MASTER ("sluice").
# It prints the URLs, the user, the certificate files and the Sentinel. A
# server already running in the other mode, or with another user or
# password, is not changed: stop it first.
# stop stops the Sentinel too.
#
# Environment:
#   SLUICE_REDIS_PORT             port                        (16379)
#   SLUICE_REDIS_WAIT             readiness timeout, seconds  (20)
#   SLUICE_CACHE                  cache root                  (.cache, relative to the repository)
#   SLUICE_REDIS_SECURE=1         start: the secured mode above
#   SLUICE_REDIS_TLS_PORT         TLS port                    (port + 1)
#   SLUICE_REDIS_SENTINEL_PORT    Sentinel port               (port + 2)
#   SLUICE_REDIS_SENTINEL_MASTER  Sentinel's master name      (sluice)
#   SLUICE_REDIS_USERNAME         the ACL user                (sluice)
#   SLUICE_REDIS_PASSWORD         its password                (sluice-test-password)
#   SLUICE_REDIS_CLUSTER=1        start, stop, status: the cluster above
#   SLUICE_REDIS_CLUSTER_PORT     the cluster's first port    (17000; buses on port + 10000)
#
# Layout under $SLUICE_CACHE/redis:
#   redis-<port>.pid    the server's pid
#   redis-<port>.log    the server's log
#   secured mode:
#   redis-<port>.conf   the server's configuration (ACL users), owner-only
#   redis-<port>.admin  the default user's password, owner-only; removed by stop
#   sentinel-<port>.*   the Sentinel's configuration, pid and log
#   tls/                ca.pem (the CA clients trust), client.crt and
#                       client.key, server.crt and server.key
#   cluster-<first port>/  the cluster: node-<port>.{conf,pid,log}, the
#                       nodes' cluster state nodes-<port>.conf, and in the
#                       secured mode admin (the default user's password)
#
# Cluster mode (opt-in): SLUICE_REDIS_CLUSTER=1 scripts/redis.sh start
# starts a Redis Cluster of 3 masters and 3 replicas (one each) on the six
# loopback ports SLUICE_REDIS_CLUSTER_PORT .. + 5, their cluster buses on
# those ports + 10000, creates it with redis-cli --cluster create, waits
# until every node reports cluster_state:ok and every replica is in sync,
# and prints the nodes, comma-separated, as its last line on stdout (the
# seed addresses a client takes: --redis-cluster --redis-addr "$(...)").
# stop and status with SLUICE_REDIS_CLUSTER=1 act on the cluster; it and
# the single server (and its Sentinel) can run side by side. With
# SLUICE_REDIS_SECURE=1 as well, the nodes speak TLS only (clients, the
# cluster bus and replication; the certificates of the secured mode) and
# have the same ACL user and admin password as the secured server.
# Every start creates a new, empty cluster; nothing is kept on disk.
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

SECURE="${SLUICE_REDIS_SECURE:-0}"
TLS_PORT="${SLUICE_REDIS_TLS_PORT:-$((PORT + 1))}"
SENTINEL_PORT="${SLUICE_REDIS_SENTINEL_PORT:-$((PORT + 2))}"
SENTINEL_MASTER="${SLUICE_REDIS_SENTINEL_MASTER:-sluice}"
ACL_USER="${SLUICE_REDIS_USERNAME:-sluice}"
DEFAULT_ACL_PASSWORD=sluice-test-password
ACL_PASSWORD="${SLUICE_REDIS_PASSWORD:-$DEFAULT_ACL_PASSWORD}"
CONFFILE="$DIR/redis-$PORT.conf"
ADMINFILE="$DIR/redis-$PORT.admin"
TLS_DIR="$DIR/tls"
SENTINEL_CONF="$DIR/sentinel-$SENTINEL_PORT.conf"
SENTINEL_PIDFILE="$DIR/sentinel-$SENTINEL_PORT.pid"
SENTINEL_LOG="$DIR/sentinel-$SENTINEL_PORT.log"

NAME=redis.sh
# shellcheck source=service.sh
source "$ROOT/scripts/service.sh"
# shellcheck source=tls.sh
source "$ROOT/scripts/tls.sh"
# shellcheck source=redis-cluster.sh
source "$ROOT/scripts/redis-cluster.sh"

secure() { [[ "$SECURE" == 1 ]]; }

# admin_password prints the default user's password of a secured server
# (fails when the server was not started secured).
admin_password() { [[ -s "$ADMINFILE" ]] && cat "$ADMINFILE"; }

# cli PORT ARGS... runs redis-cli against 127.0.0.1:PORT, as the default
# user of a secured server when there is one (the password travels in the
# environment, not on the command line).
cli() {
  local port="$1" pw
  shift
  if pw="$(admin_password)"; then
    REDISCLI_AUTH="$pw" redis-cli -h "$HOST" -p "$port" "$@"
  else
    redis-cli -h "$HOST" -p "$port" "$@"
  fi
}

# ping answers 0 when a Redis on HOST:PORT replies PONG.
ping() {
  if command -v redis-cli >/dev/null; then
    [[ "$(cli "$PORT" ping 2>/dev/null)" == "PONG" ]]
  else
    local reply pw
    { exec 3<>"/dev/tcp/$HOST/$PORT"; } 2>/dev/null || return 1
    if pw="$(admin_password)"; then
      printf 'AUTH %s\r\n' "$pw" >&3
      IFS= read -r -t 2 reply <&3 || true
    fi
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
    if secure && ! admin_password >/dev/null; then
      die "already running on $HOST:$PORT (pid $p) without the secured mode: run '$0 stop' first"
    elif ! secure && admin_password >/dev/null; then
      die "already running on $HOST:$PORT (pid $p) in the secured mode: run '$0 stop' first, or set SLUICE_REDIS_SECURE=1"
    elif secure && ! grep -qF "user $ACL_USER on >$ACL_PASSWORD " "$CONFFILE" 2>/dev/null; then
      die "already running on $HOST:$PORT (pid $p) with another ACL user or password: run '$0 stop' first"
    fi
    log "already running on $HOST:$PORT (pid $p)"
    if secure; then
      start_sentinel
      print_secure
    fi
    return 0
  fi
  if ping; then
    die "something else already answers on $HOST:$PORT; set SLUICE_REDIS_PORT to another port"
  fi
  install_redis
  mkdir -p "$DIR"
  rm -f "$PIDFILE" "$ADMINFILE"
  if secure; then
    start_secure
  else
    redis-server --port "$PORT" --bind "$HOST" --save "" --appendonly no \
      --dir "$DIR" --daemonize yes --pidfile "$PIDFILE" --logfile "$LOGFILE" \
      || die "redis-server failed to start; see $LOGFILE"
  fi
  local deadline=$((SECONDS + WAIT_SECONDS))
  until ping; do
    if ((SECONDS >= deadline)); then
      tail -n 20 "$LOGFILE" >&2 || true
      die "redis-server did not answer PING on $HOST:$PORT within ${WAIT_SECONDS}s; see $LOGFILE"
    fi
    sleep 0.1
  done
  log "running on $HOST:$PORT (pid $(pid || echo '?'), log $LOGFILE)"
  if secure; then
    start_sentinel
    print_secure
  fi
}

# start_secure starts redis-server with the ACL users and TLS, from a
# configuration file readable by the owner only (it holds the passwords).
start_secure() {
  [[ "$ACL_USER" =~ ^[A-Za-z0-9._-]+$ && "$ACL_USER" != default ]] \
    || die "SLUICE_REDIS_USERNAME must be letters, digits, '.', '_' or '-', and not 'default' (got '$ACL_USER')"
  [[ -n "$ACL_PASSWORD" && "$ACL_PASSWORD" =~ ^[[:graph:]]+$ && "$ACL_PASSWORD" != *[\"\'\\]* ]] \
    || die "SLUICE_REDIS_PASSWORD must be non-empty, without spaces, quotes or backslashes"
  make_test_certs "$TLS_DIR"
  (umask 077 && openssl rand -hex 24 >"$ADMINFILE") || die "could not write $ADMINFILE"
  local admin
  admin="$(cat "$ADMINFILE")"
  (umask 077 && cat >"$CONFFILE" <<EOF
# Generated by scripts/redis.sh (SLUICE_REDIS_SECURE=1) on every start.
port $PORT
tls-port $TLS_PORT
bind $HOST
save ""
appendonly no
dir $DIR
daemonize yes
pidfile $PIDFILE
logfile $LOGFILE
tls-cert-file $TLS_DIR/server.crt
tls-key-file $TLS_DIR/server.key
tls-ca-cert-file $TLS_DIR/ca.pem
tls-auth-clients optional
# The default user: this script and Sentinel only.
user default on >$admin ~* &* +@all
# sluice's user: its own keys, and the command groups a lease manager uses.
user $ACL_USER on >$ACL_PASSWORD resetkeys ~sluice:* resetchannels &sluice:* -@all +@read +@write +@scripting +@transaction +@connection +@pubsub -@dangerous
EOF
  ) || die "could not write $CONFFILE"
  redis-server "$CONFFILE" || die "redis-server failed to start; see $LOGFILE"
}

# sentinel_pid prints the Sentinel's pid when it is alive.
sentinel_pid() {
  local PIDFILE="$SENTINEL_PIDFILE"
  pid
}

# start_sentinel starts a Sentinel monitoring the server (it rewrites its
# configuration file, so the file is written anew on every start).
start_sentinel() {
  if sentinel_pid >/dev/null; then
    return 0
  fi
  local deadline reply
  rm -f "$SENTINEL_PIDFILE"
  cat >"$SENTINEL_CONF" <<EOF
# Generated by scripts/redis.sh (SLUICE_REDIS_SECURE=1); Sentinel rewrites it.
port $SENTINEL_PORT
bind $HOST
daemonize yes
pidfile $SENTINEL_PIDFILE
logfile $SENTINEL_LOG
dir $DIR
sentinel monitor $SENTINEL_MASTER $HOST $PORT 1
sentinel auth-pass $SENTINEL_MASTER $(cat "$ADMINFILE")
sentinel down-after-milliseconds $SENTINEL_MASTER 5000
EOF
  chmod 600 "$SENTINEL_CONF"
  (umask 077 && redis-server "$SENTINEL_CONF" --sentinel) || die "redis-server --sentinel failed to start; see $SENTINEL_LOG"
  deadline=$((SECONDS + WAIT_SECONDS))
  until reply="$(redis-cli -h "$HOST" -p "$SENTINEL_PORT" sentinel get-master-addr-by-name "$SENTINEL_MASTER" 2>/dev/null)" \
      && [[ "$reply" == *"$PORT"* ]]; do
    if ((SECONDS >= deadline)); then
      tail -n 20 "$SENTINEL_LOG" >&2 || true
      die "Sentinel on $HOST:$SENTINEL_PORT did not name its master within ${WAIT_SECONDS}s; see $SENTINEL_LOG"
    fi
    sleep 0.1
  done
}

# stop_sentinel stops the Sentinel of this port, if any.
stop_sentinel() {
  local p
  if p="$(sentinel_pid)"; then
    redis-cli -h "$HOST" -p "$SENTINEL_PORT" shutdown nosave >/dev/null 2>&1 || true
    terminate "$p"
    log "stopped the Sentinel (was pid $p)"
  fi
  rm -f "$SENTINEL_PIDFILE"
}

# print_secure tells a client how to connect.
print_secure() {
  local pw="from SLUICE_REDIS_PASSWORD"
  [[ -z "${SLUICE_REDIS_PASSWORD:-}" ]] && pw="$DEFAULT_ACL_PASSWORD (the default; set SLUICE_REDIS_PASSWORD)"
  log "plain     redis://$ACL_USER@$HOST:$PORT"
  log "TLS       rediss://$ACL_USER@$HOST:$TLS_PORT"
  log "Sentinel  master $SENTINEL_MASTER via $HOST:$SENTINEL_PORT"
  log "ACL user  $ACL_USER (keys sluice:*), password $pw"
  log "CA        $TLS_DIR/ca.pem"
  log "client    $TLS_DIR/client.crt $TLS_DIR/client.key"
}

stop() {
  local p
  stop_sentinel
  if ! p="$(pid)"; then
    rm -f "$PIDFILE" "$ADMINFILE"
    log "not running on port $PORT"
    return 0
  fi
  if command -v redis-cli >/dev/null; then
    cli "$PORT" shutdown nosave >/dev/null 2>&1 || true
  fi
  terminate "$p"
  rm -f "$PIDFILE" "$ADMINFILE"
  log "stopped (was pid $p)"
}

status() {
  local p
  if p="$(pid)" && ping; then
    if admin_password >/dev/null; then
      echo "running on $HOST:$PORT (pid $p; TLS $HOST:$TLS_PORT, Sentinel $HOST:$SENTINEL_PORT)"
    else
      echo "running on $HOST:$PORT (pid $p)"
    fi
    return 0
  fi
  echo "stopped"
  return 3
}

if [[ "${SLUICE_REDIS_CLUSTER:-0}" == 1 ]]; then
  start() { cluster_start; }
  stop() { cluster_stop; }
  status() { cluster_status; }
fi

dispatch "$@"
