# scripts/service.sh — what the service scripts share; sourced, not run.
# shellcheck shell=bash
#
# The sourcing script sets NAME (for messages), HOST and PORT (where the
# server listens), PIDFILE (the server's pid; empty when the server keeps
# its own, as PostgreSQL does), LOGFILE, WAIT_SECONDS (how long start waits
# for the server), STOP_SECONDS and DIR (its folder under the cache), and
# defines start, stop and status. A function uses only those it names.

log() { echo "$NAME: $*" >&2; }
die() { log "$*"; exit 1; }

# pid prints the pid in PIDFILE when that process is alive.
pid() {
  [[ -s "$PIDFILE" ]] || return 1
  local p
  p="$(<"$PIDFILE")"
  [[ "$p" =~ ^[0-9]+$ ]] && kill -0 "$p" 2>/dev/null || return 1
  echo "$p"
}

# listening [PORT] succeeds when something accepts TCP connections on
# HOST:PORT (PORT defaults to $PORT).
listening() { { exec 3<>"/dev/tcp/$HOST/${1:-$PORT}"; } 2>/dev/null || return 1; exec 3<&- 3>&-; }

# already_running succeeds, after logging "already running on HOST:PORT
# (pid N)", when the process in PIDFILE is alive and something listens on
# HOST:PORT: start has nothing to do.
already_running() {
  local p
  p="$(pid)" && listening || return 1
  log "already running on $HOST:$PORT (pid $p)"
}

# require_free_port PORT VARIABLE dies when something else listens on
# HOST:PORT, naming VARIABLE, the environment variable that moves the port.
require_free_port() {
  if listening "$1"; then
    die "something else already listens on $HOST:$1; set $2 to another port"
  fi
}

# await_ready CHECK SERVER FAILURE runs the command CHECK every 0.1 s until
# it succeeds. It dies with "SERVER exited; see LOGFILE", after the log's
# last 20 lines, when the process in PIDFILE is gone (unless PIDFILE is
# empty), and with "SERVER FAILURE on HOST:PORT within WAIT_SECONDSs; see
# LOGFILE" when WAIT_SECONDS pass first.
await_ready() {
  local check="$1" server="$2" failure="$3"
  local deadline=$((SECONDS + WAIT_SECONDS))
  until "$check"; do
    if [[ -n "$PIDFILE" ]] && ! pid >/dev/null; then
      tail -n 20 "$LOGFILE" >&2
      die "$server exited; see $LOGFILE"
    fi
    ((SECONDS >= deadline)) && die "$server $failure on $HOST:$PORT within ${WAIT_SECONDS}s; see $LOGFILE"
    sleep 0.1
  done
}

# terminate stops process $1: SIGTERM, then SIGKILL after STOP_SECONDS.
terminate() {
  local p="$1"
  kill -TERM "$p" 2>/dev/null || true
  local deadline=$((SECONDS + STOP_SECONDS))
  while kill -0 "$p" 2>/dev/null; do
    if ((SECONDS >= deadline)); then
      log "pid $p did not stop within ${STOP_SECONDS}s; killing it"
      kill -KILL "$p" 2>/dev/null || true
      break
    fi
    sleep 0.1
  done
}

# stop_service PATH... terminates the process in PIDFILE, if it is alive,
# and removes each PATH (PIDFILE and the files and folders start made)
# either way; it logs "stopped (was pid N)" or "not running on port PORT".
stop_service() {
  local p
  if ! p="$(pid)"; then
    rm -rf -- "$@"
    log "not running on port $PORT"
    return 0
  fi
  terminate "$p"
  rm -rf -- "$@"
  log "stopped (was pid $p)"
}

# service_status prints "running on HOST:PORT (pid N)" when the process in
# PIDFILE is alive and something listens on HOST:PORT; otherwise it prints
# "stopped" and returns 3 (the LSB status code for "not running").
service_status() {
  local p
  if p="$(pid)" && listening; then
    echo "running on $HOST:$PORT (pid $p)"
    return 0
  fi
  echo "stopped"
  return 3
}

# with_lock CMD... runs CMD holding a lock on DIR/lock, so that two callers
# starting the server at once (test packages, CI steps) start it once.
# Without flock(1) (macOS) it runs unlocked.
with_lock() {
  mkdir -p "$DIR"
  if command -v flock >/dev/null 2>&1; then
    ( flock 9; "$@" ) 9>"$DIR/lock"
  else
    "$@"
  fi
}

# npm_install PACKAGE installs PACKAGE@VERSION from npm into DIR/node_modules
# unless the executable BIN is there and the installed PACKAGE is VERSION.
npm_install() {
  local package="$1"
  if [[ -x "$BIN" ]] && [[ "$(node -p "require('$DIR/node_modules/$package/package.json').version" 2>/dev/null)" == "$VERSION" ]]; then
    return 0
  fi
  command -v npm >/dev/null || die "npm is missing: install Node.js (apt-get install -y nodejs npm)"
  log "installing $package@$VERSION into $DIR"
  mkdir -p "$DIR"
  [[ -f "$DIR/package.json" ]] || echo '{"private":true}' >"$DIR/package.json"
  (cd "$DIR" && npm install --no-audit --no-fund --loglevel=error "$package@$VERSION" >/dev/null) \
    || die "npm install $package@$VERSION failed"
}

# dispatch runs the command named by $1.
dispatch() {
  case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: $0 start|stop|status" ;;
  esac
}
