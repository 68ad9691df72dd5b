#!/usr/bin/env bash
# scripts/kafka.sh — a real, single-node Apache Kafka broker for tests and CI.
#
#   scripts/kafka.sh start    fetch the jars if needed, start the broker, wait
#                             (and, on fresh storage, create the consumer-
#                             offsets topic so the first group joins at once)
#   scripts/kafka.sh wait     block until the broker answers a metadata request
#   scripts/kafka.sh stop     SIGTERM, then SIGKILL after 20 s
#   scripts/kafka.sh status   print "running ..." (exit 0) or "stopped" (exit 3)
#
# Secured listeners (opt-in): SLUICE_KAFKA_SECURE=1 scripts/kafka.sh start
# starts the same broker with three more listeners beside the plaintext one,
# all on 127.0.0.1, for testing what managed Kafka asks of a client:
#
#   SASL_SSL  client port + 2  TLS, then SASL PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512
#   SSL       client port + 3  TLS only
#   MTLS      client port + 4  TLS with a client certificate required (mTLS)
#
# It makes a test CA, a broker certificate (subjectAltName 127.0.0.1 and
# localhost) and a client certificate with openssl (scripts/tls.sh) in the
# broker's tls/ folder, and one SASL user (SLUICE_KAFKA_SASL_USERNAME,
# "sluice") that every mechanism accepts: PLAIN from the listener's JAAS
# configuration, SCRAM-SHA-256 and SCRAM-SHA-512 credentials stored in the
# cluster's metadata with the broker's own tools (kafka-storage format
# --add-scram on fresh storage, else kafka-configs --alter). It prints the
# listeners, the certificate files and the user. A broker already running
# in the other mode, or with another user or password, is not changed:
# stop it first (SCRAM credentials of kept storage are updated at the next
# secured start). The plaintext listener,
# the controller and their ports are the same in both modes.
#
# The broker runs in KRaft mode (combined broker + controller, node.id 1) and
# listens on 127.0.0.1 only. The jars come from Maven Central through mvn
# (see scripts/kafka/pom.xml, which pins the Kafka version); there is no
# tarball download and no Docker.
#
# Environment:
#   SLUICE_KAFKA_PORT             client port                 (19092)
#   SLUICE_KAFKA_CONTROLLER_PORT  KRaft controller port       (19093)
#   SLUICE_KAFKA_WAIT             readiness timeout, seconds  (90)
#   SLUICE_KAFKA_FRESH=1          start: wipe the broker's data first
#   SLUICE_KAFKA_HEAP_OPTS        broker heap                 (-Xms128m -Xmx512m)
#   SLUICE_KAFKA_SECURE=1         start: add the secured listeners above
#   SLUICE_KAFKA_SASL_SSL_PORT    SASL_SSL listener           (client port + 2)
#   SLUICE_KAFKA_SSL_PORT         SSL listener                (client port + 3)
#   SLUICE_KAFKA_MTLS_PORT        mTLS listener               (client port + 4)
#   SLUICE_KAFKA_SASL_USERNAME    the SASL user               (sluice)
#   SLUICE_KAFKA_SASL_PASSWORD    its password                (sluice-test-password)
#   SLUICE_CACHE                  cache root                  (<repo>/.cache)
#   SLUICE_MVN_ARGS               extra mvn arguments, e.g. -o or
#                                 -Dmaven.repo.local=... for a CI cache
#   JAVA_HOME                     the Java to use (otherwise java on PATH)
#
# Layout under $SLUICE_CACHE/kafka:
#   libs/                  broker + tools jars, shared, reused between runs
#   broker-<port>/         one broker: server.properties, kafka.pid,
#     data/                log.dirs (KRaft metadata log + topic data)
#     tls/                 secured mode: ca.pem (the CA clients trust), client.crt
#                          and client.key (the mTLS client), server.crt/.key and
#                          keystore.pem (the broker's)
#     scram.stamp          secured mode: a checksum of the SCRAM user and password stored
#     logs/server.log      the broker's log; logs/kafka.out is the JVM's stdout/stderr

set -euo pipefail

# ---------------------------------------------------------------- settings --

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
POM="$ROOT/scripts/kafka/pom.xml"
LOG4J_SERVER="$ROOT/scripts/kafka/log4j.properties"
LOG4J_TOOLS="$ROOT/scripts/kafka/tools-log4j.properties"

PORT="${SLUICE_KAFKA_PORT:-19092}"
CONTROLLER_PORT="${SLUICE_KAFKA_CONTROLLER_PORT:-19093}"
WAIT_SECONDS="${SLUICE_KAFKA_WAIT:-90}"
STOP_SECONDS=20
HEAP_OPTS="${SLUICE_KAFKA_HEAP_OPTS:--Xms128m -Xmx512m}"
NODE_ID=1
HOST=127.0.0.1

SECURE="${SLUICE_KAFKA_SECURE:-0}"
SASL_SSL_PORT="${SLUICE_KAFKA_SASL_SSL_PORT:-$((PORT + 2))}"
SSL_PORT="${SLUICE_KAFKA_SSL_PORT:-$((PORT + 3))}"
MTLS_PORT="${SLUICE_KAFKA_MTLS_PORT:-$((PORT + 4))}"
SASL_USERNAME="${SLUICE_KAFKA_SASL_USERNAME:-sluice}"
DEFAULT_SASL_PASSWORD=sluice-test-password
SASL_PASSWORD="${SLUICE_KAFKA_SASL_PASSWORD:-$DEFAULT_SASL_PASSWORD}"

CACHE="${SLUICE_CACHE:-$ROOT/.cache}"
mkdir -p "$CACHE" && CACHE="$(cd "$CACHE" && pwd)" # absolute: it ends up in the broker's command line
KAFKA_CACHE="$CACHE/kafka"
LIBS="$KAFKA_CACHE/libs"
BROKER_DIR="$KAFKA_CACHE/broker-$PORT"
DATA_DIR="$BROKER_DIR/data"
LOG_DIR="$BROKER_DIR/logs"
PROPS="$BROKER_DIR/server.properties"
PIDFILE="$BROKER_DIR/kafka.pid"
TLS_DIR="$BROKER_DIR/tls"
SCRAM_STAMP="$BROKER_DIR/scram.stamp"

if [[ -n "${JAVA_HOME:-}" && -x "$JAVA_HOME/bin/java" ]]; then
  JAVA="$JAVA_HOME/bin/java"
else
  JAVA=java
fi

# Short-lived tool JVMs (storage format, readiness probe): small heap, serial
# GC and no optimising JIT, which make them start noticeably faster.
TOOL_JVM_OPTS=(-Xmx256m -XX:+UseSerialGC -XX:TieredStopAtLevel=1
  "-Dlog4j.configuration=file:$LOG4J_TOOLS")

# ----------------------------------------------------------------- helpers --

log() { echo "kafka: $*" >&2; }
die() { echo "kafka: error: $*" >&2; exit 1; }

# shellcheck source=tls.sh
source "$ROOT/scripts/tls.sh"

# kafka_version prints the Kafka version pinned in the pom.
kafka_version() {
  sed -n 's:.*<kafka.version>\(.*\)</kafka.version>.*:\1:p' "$POM" | head -n 1
}

# with_lock NAME CMD... runs CMD holding an exclusive lock on $KAFKA_CACHE/NAME,
# so that concurrent callers (parallel CI steps, test packages) do not run mvn
# or start the broker twice. Without flock(1) (macOS) it runs unlocked.
with_lock() {
  local name="$1"; shift
  mkdir -p "$KAFKA_CACHE"
  if command -v flock >/dev/null 2>&1; then
    (
      flock 9
      "$@"
    ) 9>"$KAFKA_CACHE/$name"
  else
    "$@"
  fi
}

# run_with_timeout SECONDS CMD... uses timeout(1) when there is one.
run_with_timeout() {
  local secs="$1"; shift
  if command -v timeout >/dev/null 2>&1; then
    timeout "$secs" "$@"
  else
    "$@"
  fi
}

# port_open PORT succeeds when something accepts TCP connections on it.
port_open() {
  (exec 3<>"/dev/tcp/$HOST/$1") 2>/dev/null
}

# pid_cmdline PID prints the command line of a live process.
pid_cmdline() {
  if [[ -r "/proc/$1/cmdline" ]]; then
    tr '\0' ' ' <"/proc/$1/cmdline"
  else
    ps -p "$1" -o args= 2>/dev/null
  fi
}

# alive PID succeeds while the process exists and is not a zombie (in a
# container whose init does not reap orphans, a dead broker can linger as one).
alive() {
  kill -0 "$1" 2>/dev/null || return 1
  if [[ -r "/proc/$1/stat" ]]; then
    local stat
    stat="$(cat "/proc/$1/stat" 2>/dev/null)" || return 1
    stat="${stat##*) }" # the state letter follows the parenthesised name
    [[ "${stat:0:1}" != Z ]]
  fi
}

# broker_pid prints the pid of our running broker and succeeds, or fails (and
# removes a stale pidfile). "Ours" means a kafka.Kafka JVM started with this
# broker's server.properties, so a recycled pid is not mistaken for it.
broker_pid() {
  [[ -f "$PIDFILE" ]] || return 1
  local pid cmd
  pid="$(cat "$PIDFILE" 2>/dev/null || true)"
  if [[ "$pid" =~ ^[0-9]+$ ]] && alive "$pid"; then
    cmd="$(pid_cmdline "$pid" || true)"
    if [[ "$cmd" == *kafka.Kafka* && "$cmd" == *"$PROPS"* ]]; then
      echo "$pid"
      return 0
    fi
  fi
  rm -f "$PIDFILE"
  return 1
}

# find_class NAME... prints the first of the given class names that one of the
# jars contains (zip directories store entry names uncompressed, so grep can
# see them). It keeps the script working across Kafka versions that moved
# tools from the Scala core (kafka.*) to Java (org.apache.kafka.tools.*).
find_class() {
  local class
  for class in "$@"; do
    if grep -qaF "${class//.//}.class" "$LIBS"/*.jar 2>/dev/null; then
      echo "$class"
      return 0
    fi
  done
  return 1
}

# run_tool CLASS ARGS... runs a Kafka command-line tool on the broker's classpath.
run_tool() {
  "$JAVA" "${TOOL_JVM_OPTS[@]}" -cp "$LIBS/*" "$@"
}

# show_log_tail prints the end of the broker's logs, for failure messages.
show_log_tail() {
  local f
  for f in "$LOG_DIR/kafka.out" "$LOG_DIR/server.log"; do
    [[ -s "$f" ]] || continue
    echo "----- last lines of $f -----" >&2
    tail -n 30 "$f" >&2
  done
  echo "-----" >&2
}

# -------------------------------------------------------------------- jars --

# libs_stamp identifies the jar set: the pinned version plus a checksum of the
# pom, so that any edit of the pom (version, exclusions) refreshes the jars.
libs_stamp() {
  echo "kafka=$(kafka_version) pom=$(cksum <"$POM" | cut -d' ' -f1)"
}

# ensure_libs copies the broker's jars from Maven Central into $LIBS, unless
# they are already there for the pinned version. mvn writes into a temporary
# folder that replaces $LIBS only once complete, so an interrupted download
# never leaves a half-filled libs folder behind.
ensure_libs() {
  local want
  want="$(libs_stamp)"
  if [[ -f "$LIBS/.stamp" && "$(cat "$LIBS/.stamp")" == "$want" ]]; then
    return 0
  fi
  command -v mvn >/dev/null 2>&1 || die "mvn not found: Maven is needed to fetch the Kafka jars"

  log "fetching Apache Kafka $(kafka_version) jars from Maven Central (first run only)"
  local tmp="$KAFKA_CACHE/libs.tmp.$$" mvn_log="$KAFKA_CACHE/mvn.log"
  rm -rf "$tmp"
  # mvn's output goes to a file (Debian's Maven 3.8 prints stray colour codes
  # even in batch mode) and is shown only when it fails.
  # shellcheck disable=SC2086  # SLUICE_MVN_ARGS is a list of words on purpose
  if ! mvn -B -ntp -f "$POM" ${SLUICE_MVN_ARGS:-} \
      dependency:copy-dependencies \
      -DincludeScope=runtime -DoutputDirectory="$tmp" >"$mvn_log" 2>&1; then
    tail -n 40 "$mvn_log" >&2
    rm -rf "$tmp"
    die "mvn could not fetch the Kafka jars (full output: $mvn_log)"
  fi
  echo "$want" >"$tmp/.stamp"
  rm -rf "$LIBS"
  mv "$tmp" "$LIBS"
}

# ----------------------------------------------------------------- broker --

# write_config generates server.properties for this port (every start, so a
# changed port or setting takes effect; the data folder is kept).
write_config() {
  mkdir -p "$DATA_DIR" "$LOG_DIR"
  local listeners="PLAINTEXT://$HOST:$PORT,CONTROLLER://$HOST:$CONTROLLER_PORT"
  local advertised="PLAINTEXT://$HOST:$PORT"
  local protocols="PLAINTEXT:PLAINTEXT,CONTROLLER:PLAINTEXT"
  if secure; then
    local extra="SASL_SSL://$HOST:$SASL_SSL_PORT,SSL://$HOST:$SSL_PORT,MTLS://$HOST:$MTLS_PORT"
    listeners="$listeners,$extra"
    advertised="$advertised,$extra"
    protocols="$protocols,SASL_SSL:SASL_SSL,SSL:SSL,MTLS:SSL"
  fi
  # It may hold the PLAIN password: readable by the owner only.
  rm -f "$PROPS"
  (umask 077 && : >"$PROPS")
  cat >"$PROPS" <<EOF
# Generated by scripts/kafka.sh on every start; edits are overwritten.
process.roles=broker,controller
node.id=$NODE_ID
controller.quorum.voters=$NODE_ID@$HOST:$CONTROLLER_PORT
controller.listener.names=CONTROLLER
listeners=$listeners
advertised.listeners=$advertised
inter.broker.listener.name=PLAINTEXT
listener.security.protocol.map=$protocols
log.dirs=$DATA_DIR

# One node: every internal topic has a single replica.
offsets.topic.replication.factor=1
transaction.state.log.replication.factor=1
transaction.state.log.min.isr=1
min.insync.replicas=1
# Fewer partitions for the internal topics than the defaults (50), so that
# the first consumer group or transaction on a fresh broker is not slowed
# down by creating them.
offsets.topic.num.partitions=5
transaction.state.log.num.partitions=5

# Tests: consumer groups form at once, topics appear on first use.
group.initial.rebalance.delay.ms=0
auto.create.topics.enable=true
delete.topic.enable=true
num.partitions=1
default.replication.factor=1
EOF
  if secure; then
    cat >>"$PROPS" <<EOF

# Secured listeners (SLUICE_KAFKA_SECURE=1). TLS from PEM files made by
# scripts/tls.sh; MTLS requires a client certificate signed by the same CA.
ssl.keystore.type=PEM
ssl.keystore.location=$TLS_DIR/keystore.pem
ssl.truststore.type=PEM
ssl.truststore.location=$TLS_DIR/ca.pem
ssl.client.auth=none
listener.name.mtls.ssl.client.auth=required
# SASL on SASL_SSL: PLAIN users are listed here; SCRAM users are stored in
# the cluster's metadata (kafka-storage format --add-scram, kafka-configs).
sasl.enabled.mechanisms=PLAIN,SCRAM-SHA-256,SCRAM-SHA-512
listener.name.sasl_ssl.plain.sasl.jaas.config=org.apache.kafka.common.security.plain.PlainLoginModule required user_$SASL_USERNAME="$SASL_PASSWORD";
listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config=org.apache.kafka.common.security.scram.ScramLoginModule required;
EOF
  fi
}

# secure succeeds in secured mode (SLUICE_KAFKA_SECURE=1).
secure() { [[ "$SECURE" == 1 ]]; }

# running_secure succeeds when the running broker's configuration has the
# secured listeners.
running_secure() { grep -q '^listeners=.*SASL_SSL://' "$PROPS" 2>/dev/null; }

# check_credentials refuses a user or password that would break the
# broker's JAAS or SCRAM syntax.
check_credentials() {
  [[ "$SASL_USERNAME" =~ ^[A-Za-z0-9._-]+$ ]] \
    || die "SLUICE_KAFKA_SASL_USERNAME must be letters, digits, '.', '_' or '-' (got '$SASL_USERNAME')"
  local bad='[][ ",=\\]'
  [[ -n "$SASL_PASSWORD" && ! "$SASL_PASSWORD" =~ $bad ]] \
    || die "SLUICE_KAFKA_SASL_PASSWORD must be non-empty, without spaces, quotes, backslashes, ',', '=', '[' or ']'"
}

# prepare_tls makes the certificates and the broker's PEM key store (its
# key, its certificate and the CA, in one file).
prepare_tls() {
  make_test_certs "$TLS_DIR"
  (umask 077 && cat "$TLS_DIR/server.key" "$TLS_DIR/server.crt" "$TLS_DIR/ca.pem" >"$TLS_DIR/keystore.pem")
}

# scram_stamp prints what SCRAM_STAMP holds when the user's credentials are
# stored: a checksum of the user and password, never the password.
scram_stamp() {
  printf '%s\n%s\n' "$SASL_USERNAME" "$SASL_PASSWORD" | cksum | cut -d' ' -f1
}

# scram_args prints the SCRAM credentials in the bracket syntax of Kafka's
# tools, one mechanism per line, with PREFIX (name=USER, for the storage
# tool) inside the brackets.
scram_args() {
  local prefix="$1" mech
  for mech in SCRAM-SHA-256 SCRAM-SHA-512; do
    echo "$mech=[${prefix}password=$SASL_PASSWORD]"
  done
}

# redact_password prints stdin with the SASL password masked.
redact_password() {
  local line
  while IFS= read -r line; do
    echo "${line//"$SASL_PASSWORD"/***}"
  done
}

# ensure_scram_users stores the SCRAM credentials with kafka-configs when
# the storage holds none or other ones (a data folder formatted before, in
# plaintext mode or with another password). The running broker applies them
# through its controller.
ensure_scram_users() {
  if [[ -f "$SCRAM_STAMP" && "$(cat "$SCRAM_STAMP")" == "$(scram_stamp)" ]]; then
    return 0
  fi
  local tool
  tool="$(find_class kafka.admin.ConfigCommand org.apache.kafka.tools.ConfigCommand)" \
    || die "no ConfigCommand class in $LIBS"
  log "storing SCRAM-SHA-256 and SCRAM-SHA-512 credentials of user '$SASL_USERNAME' (kafka-configs)"
  # One mechanism per request: Kafka refuses two credentials of one user
  # in the same request.
  local config
  while IFS= read -r config; do
    if ! run_with_timeout 60 "$JAVA" "${TOOL_JVM_OPTS[@]}" -cp "$LIBS/*" "$tool" \
        --bootstrap-server "$HOST:$PORT" --alter --entity-type users --entity-name "$SASL_USERNAME" \
        --add-config "$config" >"$LOG_DIR/scram.out" 2>&1; then
      redact_password <"$LOG_DIR/scram.out" >&2
      die "kafka-configs could not store the SCRAM credentials"
    fi
  done < <(scram_args "")
  scram_stamp >"$SCRAM_STAMP"
}

# print_secure tells a client how to connect to the secured listeners.
print_secure() {
  local pw="from SLUICE_KAFKA_SASL_PASSWORD"
  [[ -z "${SLUICE_KAFKA_SASL_PASSWORD:-}" ]] && pw="$DEFAULT_SASL_PASSWORD (the default; set SLUICE_KAFKA_SASL_PASSWORD)"
  log "SASL_SSL  $HOST:$SASL_SSL_PORT  TLS + SASL PLAIN, SCRAM-SHA-256 or SCRAM-SHA-512"
  log "SSL       $HOST:$SSL_PORT  TLS only"
  log "MTLS      $HOST:$MTLS_PORT  TLS with a client certificate required"
  log "SASL user $SASL_USERNAME, password $pw"
  log "CA        $TLS_DIR/ca.pem"
  log "client    $TLS_DIR/client.crt $TLS_DIR/client.key"
}

# format_storage writes the KRaft meta.properties into the data folder on the
# first start (or after a wipe) with a random cluster id.
format_storage() {
  if [[ -f "$DATA_DIR/meta.properties" ]]; then
    return 0
  fi
  local tool cluster_id
  tool="$(find_class org.apache.kafka.tools.StorageTool kafka.tools.StorageTool)" \
    || die "no StorageTool class in $LIBS"
  cluster_id="$(random_cluster_id)"
  local -a scram=()
  if secure; then
    local arg
    while IFS= read -r arg; do
      scram+=(--add-scram "$arg")
    done < <(scram_args "name=$SASL_USERNAME,")
  fi
  log "formatting $DATA_DIR (cluster id $cluster_id)"
  rm -f "$SCRAM_STAMP"
  if ! run_tool "$tool" format -t "$cluster_id" -c "$PROPS" --ignore-formatted "${scram[@]}" >"$LOG_DIR/format.out" 2>&1; then
    redact_password <"$LOG_DIR/format.out" >&2
    die "formatting the storage failed"
  fi
  if secure; then
    scram_stamp >"$SCRAM_STAMP"
  fi
}

# random_cluster_id prints 16 random bytes in URL-safe base64 without padding,
# the form Kafka's Uuid uses. Like Kafka, it avoids a leading '-' that a
# command-line parser would take for an option.
random_cluster_id() {
  local id
  while :; do
    id="$(head -c 16 /dev/urandom | base64 | tr '+/' '-_' | tr -d '=\n')"
    if [[ "$id" != -* ]]; then
      echo "$id"
      return
    fi
  done
}

print_versions() {
  local java_version
  java_version="$("$JAVA" -version 2>&1 | head -n 1)" || die "cannot run $JAVA (is Java 17+ installed?)"
  log "Apache Kafka $(kafka_version), $java_version"
}

# launch runs the broker in the background, detached from this shell's
# session, with its output in logs/kafka.out and its pid in kafka.pid.
launch() {
  # shellcheck disable=SC2206  # HEAP_OPTS is a list of words on purpose
  local -a jvm=(
    $HEAP_OPTS
    -XX:+UseG1GC -XX:MaxGCPauseMillis=20 -XX:InitiatingHeapOccupancyPercent=35
    -XX:+ExplicitGCInvokesConcurrent -Djava.awt.headless=true
    "-Dlog4j.configuration=file:$LOG4J_SERVER"
    "-Dkafka.logs.dir=$LOG_DIR"
  )
  local detach=env # a no-op wrapper when there is no setsid(1)
  if command -v setsid >/dev/null 2>&1; then
    detach=setsid
  fi

  # One server.log per run, so that failure messages show this run's lines.
  if [[ -f "$LOG_DIR/server.log" ]]; then
    mv -f "$LOG_DIR/server.log" "$LOG_DIR/server.log.prev"
  fi

  # The lock's file descriptor (9) must not leak into the broker, or the lock
  # would be held for as long as the broker runs.
  "$detach" "$JAVA" "${jvm[@]}" -cp "$LIBS/*" kafka.Kafka "$PROPS" \
    </dev/null >"$LOG_DIR/kafka.out" 2>&1 9>&- &
  echo $! >"$PIDFILE"
}

do_start() {
  local pid
  if pid="$(broker_pid)"; then
    if [[ "${SLUICE_KAFKA_FRESH:-0}" == 1 ]]; then
      log "SLUICE_KAFKA_FRESH=1: restarting the running broker with empty storage"
      do_stop
    else
      if secure && ! running_secure; then
        die "already running (pid $pid) on $HOST:$PORT without the secured listeners: run '$0 stop' first"
      elif ! secure && running_secure; then
        die "already running (pid $pid) on $HOST:$PORT with the secured listeners: run '$0 stop' first, or set SLUICE_KAFKA_SECURE=1"
      elif secure && ! grep -qF "user_$SASL_USERNAME=\"$SASL_PASSWORD\";" "$PROPS"; then
        die "already running (pid $pid) on $HOST:$PORT with another SASL user or password: run '$0 stop' first"
      fi
      log "already running (pid $pid) on $HOST:$PORT"
      return 0
    fi
  fi

  print_versions
  # The jars are shared by the brokers of all ports: a lock of their own.
  with_lock lock-libs ensure_libs

  if port_open "$PORT" || port_open "$CONTROLLER_PORT"; then
    die "port $PORT or $CONTROLLER_PORT on $HOST is taken by another process (set SLUICE_KAFKA_PORT / SLUICE_KAFKA_CONTROLLER_PORT)"
  fi
  if secure; then
    local p
    for p in "$SASL_SSL_PORT" "$SSL_PORT" "$MTLS_PORT"; do
      port_open "$p" && die "port $p on $HOST is taken by another process (set SLUICE_KAFKA_SASL_SSL_PORT / SLUICE_KAFKA_SSL_PORT / SLUICE_KAFKA_MTLS_PORT)"
    done
    check_credentials
    prepare_tls
  fi

  if [[ "${SLUICE_KAFKA_FRESH:-0}" == 1 ]]; then
    log "SLUICE_KAFKA_FRESH=1: wiping $DATA_DIR"
    rm -rf "$DATA_DIR"
  fi

  write_config
  format_storage
  launch
  log "started broker pid $(cat "$PIDFILE") on $HOST:$PORT (log: $LOG_DIR/server.log)"
}

# probe succeeds when the broker answers a metadata request and lists itself
# as a live broker. The ApiVersions tool first sends a Metadata request and
# then prints one line per broker in the answer; a broker that is still
# fenced (registering with the controller) is not in the answer yet, so
# success also means topics can be created and written.
probe() {
  local tool out
  tool="$(find_class org.apache.kafka.tools.BrokerApiVersionsCommand kafka.admin.BrokerApiVersionsCommand)" \
    || die "no BrokerApiVersionsCommand class in $LIBS"
  out="$(run_with_timeout 30 "$JAVA" "${TOOL_JVM_OPTS[@]}" -cp "$LIBS/*" \
    "$tool" --bootstrap-server "$HOST:$PORT" 2>&1)" || return 1
  [[ "$out" == *"$HOST:$PORT (id: $NODE_ID "* ]]
}

# warm_up_groups makes the broker create its consumer-offsets topic, by
# looking up the coordinator of a consumer group, when a fresh data folder
# does not have it yet. Without it, the first consumer group of a test on a
# fresh broker waits for the topic to be created: about 5 s with kafka-go,
# whose coordinator lookups back off. Best effort: a failure only logs.
warm_up_groups() {
  if [[ -d "$DATA_DIR/__consumer_offsets-0" ]]; then
    return 0
  fi
  local tool
  tool="$(find_class org.apache.kafka.tools.consumer.group.ConsumerGroupCommand kafka.admin.ConsumerGroupCommand)" \
    || return 0
  # The group does not exist: the command says so after the lookup.
  if ! run_with_timeout 60 "$JAVA" "${TOOL_JVM_OPTS[@]}" -cp "$LIBS/*" "$tool" \
      --bootstrap-server "$HOST:$PORT" --describe --group sluice-warm-up >/dev/null 2>&1; then
    log "note: could not warm up the group coordinator; the first consumer group may take a few seconds"
  fi
}

do_wait() {
  [[ -f "$LIBS/.stamp" ]] || die "no Kafka jars in $LIBS yet: run '$0 start' first"
  local start=$SECONDS deadline=$((SECONDS + WAIT_SECONDS)) had_pidfile=0
  [[ -f "$PIDFILE" ]] && had_pidfile=1

  while ((SECONDS < deadline)); do
    # A broker we started that has exited will not come back: fail at once.
    if ((had_pidfile)) && ! broker_pid >/dev/null; then
      echo "kafka: error: the broker exited during startup" >&2
      show_log_tail
      exit 1
    fi
    # Cheap TCP check first; the JVM-based metadata probe only once the
    # listener is up.
    if port_open "$PORT" && probe; then
      log "ready on $HOST:$PORT ($((SECONDS - start)) s)"
      return 0
    fi
    sleep 0.5
  done

  echo "kafka: error: no metadata answer from $HOST:$PORT within ${WAIT_SECONDS}s (SLUICE_KAFKA_WAIT)" >&2
  if broker_pid >/dev/null; then
    show_log_tail
  else
    echo "kafka: no broker started by $0 is running on port $PORT" >&2
  fi
  exit 1
}

do_stop() {
  local pid
  if ! pid="$(broker_pid)"; then
    log "not running"
    rm -f "$PIDFILE"
    return 0
  fi
  log "stopping broker pid $pid"
  kill -TERM "$pid" 2>/dev/null || true
  local deadline=$((SECONDS + STOP_SECONDS))
  while alive "$pid" && ((SECONDS < deadline)); do
    sleep 0.2
  done
  if alive "$pid"; then
    log "still running after ${STOP_SECONDS}s: SIGKILL"
    kill -KILL "$pid" 2>/dev/null || true
    deadline=$((SECONDS + 5))
    while alive "$pid" && ((SECONDS < deadline)); do
      sleep 0.1
    done
  fi
  rm -f "$PIDFILE"
  log "stopped"
}

do_status() {
  local pid
  if pid="$(broker_pid)"; then
    if running_secure; then
      echo "running (pid $pid, $HOST:$PORT; SASL_SSL $HOST:$SASL_SSL_PORT, SSL $HOST:$SSL_PORT, MTLS $HOST:$MTLS_PORT)"
    else
      echo "running (pid $pid, $HOST:$PORT)"
    fi
  else
    echo "stopped"
    return 3
  fi
}

usage() {
  sed -n '2,/^$/s/^# \{0,1\}//p' "$0" >&2
  exit 2
}

# -------------------------------------------------------------------- main --

case "${1:-}" in
  start)
    with_lock "lock-$PORT" do_start
    do_wait
    warm_up_groups
    if secure; then
      with_lock "lock-$PORT" ensure_scram_users
      print_secure
    fi
    ;;
  wait) do_wait ;;
  stop) with_lock "lock-$PORT" do_stop ;;
  status) do_status ;;
  *) usage ;;
esac
