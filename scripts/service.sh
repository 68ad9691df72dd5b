# scripts/service.sh — what the service scripts share; sourced, not run.
#
# The sourcing script sets NAME (for messages), PIDFILE and STOP_SECONDS, and
# defines start, stop and status.

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

# dispatch runs the command named by $1.
dispatch() {
  case "${1:-}" in
    start) start ;;
    stop) stop ;;
    status) status ;;
    *) die "usage: $0 start|stop|status" ;;
  esac
}
