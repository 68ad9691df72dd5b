#!/usr/bin/env bash
# scripts/dynamodb.sh — DynamoDB Local, Amazon's local edition of DynamoDB,
# for tests, benchmarks and CI.
#
#   scripts/dynamodb.sh start    fetch the jars if needed, start the server, wait
#                                until it answers a request; the last line
#                                printed is its endpoint, http://127.0.0.1:<port>
#   scripts/dynamodb.sh stop     SIGTERM, then SIGKILL after 10 s
#   scripts/dynamodb.sh status   print "running ..." (exit 0) or "stopped" (exit 3)
#
# Both start and stop are idempotent. The jars (DynamoDB Local and its
# dependencies, with sqlite4java's native libraries) come from Maven Central
# through mvn (scripts/dynamodb/pom.xml pins the version); there is no
# tarball download and no Docker. The server keeps its tables in memory
# (-inMemory), shares one database among all credentials and regions
# (-sharedDb), sends no telemetry, and listens on 127.0.0.1 only (through
# scripts/dynamodb/Loopback.java: DynamoDB Local itself would listen on
# every interface). It accepts any credentials: clients set dummy ones,
# e.g. AWS_ACCESS_KEY_ID=local AWS_SECRET_ACCESS_KEY=local AWS_REGION=us-east-1
# (DynamoDB Local refuses key IDs with characters other than letters and digits).
#
# Environment:
#   SLUICE_DYNAMODB_PORT   port                        (18000)
#   SLUICE_DYNAMODB_WAIT   readiness timeout, seconds  (60)
#   SLUICE_DYNAMODB_HEAP   JVM heap options            (-Xms64m -Xmx512m)
#   SLUICE_CACHE           cache root                  (.cache, relative to the repository)
#   SLUICE_MVN_ARGS        extra mvn arguments, e.g. -o
#   JAVA_HOME              the Java to use (otherwise java on PATH; 17+)
#
# Layout under $SLUICE_CACHE/dynamodb:
#   libs/                  the jars and native libraries, reused between runs
#   dynamodb-<port>.pid    the server's pid
#   dynamodb-<port>.log    its log
#
# Tests use it with: SLUICE_TEST_DYNAMODB_URL=<the printed endpoint> go test ./sink/
# (without that variable they run this script themselves).

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$ROOT/scripts/dynamodb/pom.xml"
LAUNCHER="$ROOT/scripts/dynamodb/Loopback.java"
HOST=127.0.0.1
PORT="${SLUICE_DYNAMODB_PORT:-18000}"
WAIT_SECONDS="${SLUICE_DYNAMODB_WAIT:-60}"
HEAP="${SLUICE_DYNAMODB_HEAP:--Xms64m -Xmx512m}"
STOP_SECONDS=10
CACHE="${SLUICE_CACHE:-.cache}"
[[ "$CACHE" = /* ]] || CACHE="$ROOT/$CACHE"
DIR="$CACHE/dynamodb"
LIBS="$DIR/libs"
PIDFILE="$DIR/dynamodb-$PORT.pid"
LOGFILE="$DIR/dynamodb-$PORT.log"
URL="http://$HOST:$PORT"

if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
  JAVA="$JAVA_HOME/bin/java"
else
  JAVA=java
fi

NAME=dynamodb.sh
# shellcheck source=service.sh
source "$ROOT/scripts/service.sh"

# ready succeeds when the server answers a ListTables request with 200 (it
# checks the form of the signature, not its value), which also warms up
# its request path before the first test.
ready() {
  local status
  { exec 3<>"/dev/tcp/$HOST/$PORT"; } 2>/dev/null || return 1
  printf 'POST / HTTP/1.1\r\nHost: %s:%s\r\nX-Amz-Target: DynamoDB_20120810.ListTables\r\nContent-Type: application/x-amz-json-1.0\r\nAuthorization: AWS4-HMAC-SHA256 Credential=ready/20200101/us-east-1/dynamodb/aws4_request, SignedHeaders=host, Signature=0\r\nContent-Length: 2\r\nConnection: close\r\n\r\n{}' "$HOST" "$PORT" >&3
  IFS= read -r -t 30 status <&3 || status=""
  exec 3<&- 3>&-
  [[ "$status" == "HTTP/1.1 200"* ]]
}

# libs_stamp identifies the jar set: a checksum of the pom.
libs_stamp() { echo "pom=$(cksum <"$POM" | cut -d' ' -f1)"; }

# ensure_libs copies the jars from Maven Central into $LIBS unless they are
# there for this pom; mvn writes into a temporary folder that replaces
# $LIBS only once complete.
ensure_libs() {
  if [[ -f "$LIBS/.stamp" && "$(cat "$LIBS/.stamp")" == "$(libs_stamp)" ]]; then
    return 0
  fi
  command -v mvn >/dev/null || die "mvn not found: Maven is needed to fetch DynamoDB Local (apt-get install -y maven)"
  log "fetching DynamoDB Local from Maven Central (first run only)"
  local tmp="$DIR/libs.tmp.$$"
  rm -rf "$tmp"
  # shellcheck disable=SC2086  # SLUICE_MVN_ARGS is a list of words on purpose
  if ! mvn -B -ntp -f "$POM" ${SLUICE_MVN_ARGS:-} dependency:copy-dependencies \
      -DoutputDirectory="$tmp" >"$DIR/mvn.log" 2>&1; then
    tail -n 30 "$DIR/mvn.log" >&2
    rm -rf "$tmp"
    die "mvn could not fetch DynamoDB Local; see $DIR/mvn.log"
  fi
  ls "$tmp"/libsqlite4java-linux-amd64-*.so >/dev/null 2>&1 || die "no sqlite4java native library for linux-amd64 among the jars"
  libs_stamp >"$tmp/.stamp"
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS"
}

do_start() {
  already_running && return 0
  require_free_port "$PORT" SLUICE_DYNAMODB_PORT
  "$JAVA" -version >/dev/null 2>&1 || die "cannot run $JAVA: Java 17+ is needed (apt-get install -y openjdk-17-jre-headless)"
  ensure_libs
  rm -f "$PIDFILE"
  local detach=env
  command -v setsid >/dev/null 2>&1 && detach=setsid
  # shellcheck disable=SC2086  # HEAP is a list of words on purpose
  "$detach" "$JAVA" $HEAP -XX:+UseSerialGC -Djava.awt.headless=true "-Dsluice.host=$HOST" \
    "-Djava.library.path=$LIBS" -cp "$LIBS/*" "$LAUNCHER" \
    -port "$PORT" -inMemory -sharedDb -disableTelemetry \
    >"$LOGFILE" 2>&1 </dev/null 9>&- &
  echo $! >"$PIDFILE"
  await_ready ready "DynamoDB Local" "did not answer"
  log "running on $HOST:$PORT (pid $(pid || echo '?'), log $LOGFILE)"
}

start() {
  with_lock do_start
  echo "$URL"
}

stop() { stop_service "$PIDFILE"; }

status() { service_status; }

dispatch "$@"
