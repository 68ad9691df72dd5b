#!/usr/bin/env bash
# scripts/opensearch.sh — a real, single-node OpenSearch for tests,
# benchmarks and CI.
#
#   scripts/opensearch.sh start    fetch the jars if needed, start the node on a
#                                  fresh data folder, wait until the cluster is
#                                  at least yellow; the last line printed is its
#                                  URL, http://127.0.0.1:<port>
#   scripts/opensearch.sh stop     SIGTERM, then SIGKILL after 20 s; removes the data
#   scripts/opensearch.sh status   print "running ..." (exit 0) or "stopped" (exit 3)
#
# start and stop are idempotent. The jars (the OpenSearch server, its
# transport-netty4 and analysis-common modules, log4j) come from Maven
# Central through mvn (scripts/opensearch/pom.xml pins the version); there
# is no tarball download and no Docker. scripts/opensearch/Launcher.java,
# compiled once into the cache, starts the node with its modules on the
# class path. The node listens on 127.0.0.1 only, is a single-node cluster
# with no security plugin (plain HTTP, no users), and keeps its data in a
# folder that stop removes.
#
# Its write thread pool is small on purpose, so that the node answers 429
# (es_rejected_execution_exception) per item when more shard-level bulk
# requests arrive than its queue holds: one write thread and a queue of
# SLUICE_OPENSEARCH_WRITE_QUEUE (4). A bulk request over an index of 16
# shards is 16 shard requests at once, so such an index is rejected in
# part at once, while the one-shard indices that tests create by default
# are not (each bulk request is one shard request). Capacity tests rely on
# it; set larger values to measure the node instead.
#
# Environment:
#   SLUICE_OPENSEARCH_PORT            HTTP port                         (19200)
#   SLUICE_OPENSEARCH_TRANSPORT_PORT  transport port, bound though unused (HTTP port + 100)
#   SLUICE_OPENSEARCH_WRITE_THREADS   thread_pool.write.size            (1)
#   SLUICE_OPENSEARCH_WRITE_QUEUE     thread_pool.write.queue_size      (4)
#   SLUICE_OPENSEARCH_HEAP            JVM heap options                  (-Xms256m -Xmx512m)
#   SLUICE_OPENSEARCH_WAIT            readiness timeout, seconds        (120)
#   SLUICE_CACHE                      cache root                        (.cache, relative to the repository)
#   SLUICE_MVN_ARGS                   extra mvn arguments, e.g. -o
#   JAVA_HOME                         the Java to use (otherwise java and javac on PATH; 17)
#
# Layout under $SLUICE_CACHE/opensearch:
#   libs/                 the jars, reused between runs
#   launcher/             Launcher.class, compiled once per Launcher.java
#   node-<port>/          one node: config/, data/ and logs/ (removed by stop)
#   opensearch-<port>.pid, opensearch-<port>.log  the JVM's pid and output
#
# Tests use it with: SLUICE_TEST_OPENSEARCH_URL=<the printed URL> go test ./sink/
# (without that variable they run this script themselves).

set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$ROOT/scripts/opensearch/pom.xml"
LAUNCHER="$ROOT/scripts/opensearch/Launcher.java"
HOST=127.0.0.1
PORT="${SLUICE_OPENSEARCH_PORT:-19200}"
TRANSPORT_PORT="${SLUICE_OPENSEARCH_TRANSPORT_PORT:-$((PORT + 100))}"
WRITE_THREADS="${SLUICE_OPENSEARCH_WRITE_THREADS:-1}"
WRITE_QUEUE="${SLUICE_OPENSEARCH_WRITE_QUEUE:-4}"
HEAP="${SLUICE_OPENSEARCH_HEAP:--Xms256m -Xmx512m}"
WAIT_SECONDS="${SLUICE_OPENSEARCH_WAIT:-120}"
STOP_SECONDS=20
CACHE="${SLUICE_CACHE:-.cache}"
[[ "$CACHE" = /* ]] || CACHE="$ROOT/$CACHE"
DIR="$CACHE/opensearch"
LIBS="$DIR/libs"
CLASSES="$DIR/launcher"
NODE="$DIR/node-$PORT"
PIDFILE="$DIR/opensearch-$PORT.pid"
LOGFILE="$DIR/opensearch-$PORT.log"
URL="http://$HOST:$PORT"

if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
  JAVA="$JAVA_HOME/bin/java"
  JAVAC="$JAVA_HOME/bin/javac"
else
  JAVA=java
  JAVAC=javac
fi

NAME=opensearch.sh
# shellcheck source=service.sh
source "$ROOT/scripts/service.sh"

# ready succeeds when the cluster health answers 200 with status green or
# yellow (a single node has no replicas to place).
ready() {
  local reply
  { exec 3<>"/dev/tcp/$HOST/$PORT"; } 2>/dev/null || return 1
  printf 'GET /_cluster/health?wait_for_status=yellow&timeout=1s HTTP/1.0\r\nHost: %s:%s\r\n\r\n' "$HOST" "$PORT" >&3
  reply="$(timeout 5 cat <&3 || true)"
  exec 3<&- 3>&-
  [[ "$reply" == "HTTP/1."?" 200"* && "$reply" =~ \"status\":\"(green|yellow)\" ]]
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
  command -v mvn >/dev/null || die "mvn not found: Maven is needed to fetch OpenSearch (apt-get install -y maven)"
  log "fetching OpenSearch jars from Maven Central (first run only)"
  local tmp="$DIR/libs.tmp.$$"
  rm -rf "$tmp"
  # shellcheck disable=SC2086  # SLUICE_MVN_ARGS is a list of words on purpose
  if ! mvn -B -ntp -f "$POM" ${SLUICE_MVN_ARGS:-} dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$tmp" >"$DIR/mvn.log" 2>&1; then
    tail -n 30 "$DIR/mvn.log" >&2
    rm -rf "$tmp"
    die "mvn could not fetch OpenSearch; see $DIR/mvn.log"
  fi
  libs_stamp >"$tmp/.stamp"
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS"
}

# ensure_launcher compiles Launcher.java into $CLASSES unless the classes
# of this source are there (a checksum of the source and the jars' stamp).
ensure_launcher() {
  local want
  want="src=$(cksum <"$LAUNCHER" | cut -d' ' -f1) $(cat "$LIBS/.stamp")"
  if [[ -f "$CLASSES/.stamp" && "$(cat "$CLASSES/.stamp")" == "$want" ]]; then
    return 0
  fi
  "$JAVAC" -version >/dev/null 2>&1 || die "cannot run $JAVAC: a Java 17 JDK is needed (apt-get install -y openjdk-17-jdk-headless)"
  local tmp="$DIR/launcher.tmp.$$"
  rm -rf "$tmp"
  mkdir -p "$tmp"
  "$JAVAC" -nowarn -d "$tmp" -cp "$LIBS/*" "$LAUNCHER" || { rm -rf "$tmp"; die "compiling $LAUNCHER failed"; }
  echo "$want" >"$tmp/.stamp"
  rm -rf "$CLASSES"
  mv "$tmp" "$CLASSES"
}

# write_config writes the node's settings and logging configuration.
write_config() {
  mkdir -p "$NODE/config" "$NODE/data" "$NODE/logs"
  cat >"$NODE/config/opensearch.yml" <<EOF
# Generated by scripts/opensearch.sh on every start; edits are overwritten.
cluster.name: sluice-test
node.name: sluice-test
path.data: $NODE/data
path.logs: $NODE/logs
network.host: $HOST
http.port: $PORT
transport.port: $TRANSPORT_PORT
discovery.type: single-node
# One write thread and a short queue: the node refuses shard-level bulk
# requests beyond them with 429 per item (see the script's header).
thread_pool.write.size: $WRITE_THREADS
thread_pool.write.queue_size: $WRITE_QUEUE
# A test machine's disk may be fuller than the watermarks allow; the node
# must not turn its indices read-only for that.
cluster.routing.allocation.disk.threshold_enabled: false
EOF
  cat >"$NODE/config/log4j2.properties" <<'EOF'
status = error
appender.console.type = Console
appender.console.name = console
appender.console.layout.type = PatternLayout
appender.console.layout.pattern = [%d{ISO8601}][%-5p][%-25c{1.}] %marker%m%n
rootLogger.level = info
rootLogger.appenderRef.console.ref = console
# Deprecation warnings of the tests' own requests are noise here.
logger.deprecation.name = org.opensearch.deprecation
logger.deprecation.level = error
EOF
}

do_start() {
  already_running && return 0
  require_free_port "$PORT" SLUICE_OPENSEARCH_PORT
  require_free_port "$TRANSPORT_PORT" SLUICE_OPENSEARCH_TRANSPORT_PORT
  "$JAVA" -version >/dev/null 2>&1 || die "cannot run $JAVA: Java 17 is needed (apt-get install -y openjdk-17-jdk-headless)"
  mkdir -p "$DIR"
  ensure_libs
  ensure_launcher
  rm -rf "$NODE" "$PIDFILE"
  write_config
  local detach=env
  command -v setsid >/dev/null 2>&1 && detach=setsid
  # shellcheck disable=SC2086  # HEAP is a list of words on purpose
  "$detach" "$JAVA" $HEAP -XX:+UseSerialGC -Xss1m \
    -Djava.awt.headless=true -Dfile.encoding=UTF-8 -Djava.io.tmpdir="$NODE" \
    -Dlog4j2.formatMsgNoLookups=true -Dlog4j2.disable.jmx=true -Dlog4j.shutdownHookEnabled=false \
    -Dio.netty.noUnsafe=true -Dio.netty.noKeySetOptimization=true -Dio.netty.recycler.maxCapacityPerThread=0 \
    -cp "$LIBS/*:$CLASSES" Launcher "$NODE" \
    >"$LOGFILE" 2>&1 </dev/null 9>&- &
  echo $! >"$PIDFILE"
  await_ready ready OpenSearch "was not ready"
  log "running on $HOST:$PORT (pid $(pid || echo '?'), log $LOGFILE)"
}

start() {
  with_lock do_start
  echo "$URL"
}

stop() { stop_service "$PIDFILE" "$NODE"; }

status() { service_status; }

dispatch "$@"
