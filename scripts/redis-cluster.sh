# scripts/redis-cluster.sh — the Redis Cluster of scripts/redis.sh
# (SLUICE_REDIS_CLUSTER=1); sourced by it, not run.
# shellcheck shell=bash
#
# Six redis-servers in cluster mode on CLUSTER_PORT .. + 5, each with its
# cluster bus on its port + 10000, made into 3 masters with one replica
# each by redis-cli --cluster create. redis.sh defines HOST, CACHE, DIR,
# TLS_DIR, SECURE, ACL_USER, ACL_PASSWORD, WAIT_SECONDS, log, die,
# terminate, install_redis and make_test_certs before sourcing this file.

CLUSTER_PORT="${SLUICE_REDIS_CLUSTER_PORT:-17000}"
CLUSTER_NODES=6
CLUSTER_BUS_OFFSET=10000
CLUSTER_DIR="$DIR/cluster-$CLUSTER_PORT"
CLUSTER_ADMIN="$CLUSTER_DIR/admin"

cluster_ports() { seq "$CLUSTER_PORT" $((CLUSTER_PORT + CLUSTER_NODES - 1)); }

# cluster_seeds prints the nodes as a client takes them: host:port,...
cluster_seeds() {
  local p out=()
  for p in $(cluster_ports); do out+=("$HOST:$p"); done
  (IFS=,; echo "${out[*]}")
}

# cluster_secured succeeds when the running (or starting) cluster is the
# secured one: its admin password file exists.
cluster_secured() { [[ -s "$CLUSTER_ADMIN" ]]; }

# ccli PORT ARGS... runs redis-cli against the node on PORT: over TLS and
# as the default user (password in the environment) when the cluster is
# secured.
ccli() {
  local port="$1"
  shift
  if cluster_secured; then
    REDISCLI_AUTH="$(cat "$CLUSTER_ADMIN")" redis-cli --tls --cacert "$TLS_DIR/ca.pem" \
      --cert "$TLS_DIR/client.crt" --key "$TLS_DIR/client.key" -h "$HOST" -p "$port" "$@"
  else
    redis-cli -h "$HOST" -p "$port" "$@"
  fi
}

# node_pid PORT prints the pid of the node on PORT when it is alive.
node_pid() {
  # shellcheck disable=SC2034 # pid reads it
  local PIDFILE="$CLUSTER_DIR/node-$1.pid"
  pid
}

# cluster_node_ready PORT succeeds when the node on PORT sees the whole
# cluster in state ok and is a master with a replica or a replica in sync.
cluster_node_ready() {
  local info repl
  info="$(ccli "$1" cluster info 2>/dev/null)" || return 1
  [[ "$info" == *"cluster_state:ok"* && "$info" == *"cluster_known_nodes:$CLUSTER_NODES"* \
    && "$info" == *"cluster_slots_ok:16384"* ]] || return 1
  repl="$(ccli "$1" info replication 2>/dev/null)" || return 1
  [[ "$repl" == *"role:master"*"connected_slaves:1"* || "$repl" == *"role:slave"*"master_link_status:up"* ]]
}

cluster_ready() {
  local p
  for p in $(cluster_ports); do
    cluster_node_ready "$p" || return 1
  done
}

# cluster_alive prints how many of the nodes' processes are alive.
cluster_alive() {
  local p n=0
  for p in $(cluster_ports); do
    node_pid "$p" >/dev/null && n=$((n + 1))
  done
  echo "$n"
}

cluster_start() {
  ((CLUSTER_PORT >= 1 && CLUSTER_PORT + CLUSTER_NODES - 1 + CLUSTER_BUS_OFFSET <= 65535)) \
    || die "SLUICE_REDIS_CLUSTER_PORT=$CLUSTER_PORT: the nodes' ports and their buses (+ $CLUSTER_BUS_OFFSET) must be below 65536"
  local alive p
  alive="$(cluster_alive)"
  if ((alive == CLUSTER_NODES)); then
    if [[ "$SECURE" == 1 ]] && ! cluster_secured; then
      die "a cluster is already running on $HOST:$CLUSTER_PORT.. without the secured mode: run 'SLUICE_REDIS_CLUSTER=1 $0 stop' first"
    elif [[ "$SECURE" != 1 ]] && cluster_secured; then
      die "a cluster is already running on $HOST:$CLUSTER_PORT.. in the secured mode: stop it first, or set SLUICE_REDIS_SECURE=1"
    fi
    if cluster_ready; then
      log "cluster already running on $HOST:$CLUSTER_PORT-$((CLUSTER_PORT + CLUSTER_NODES - 1))"
      cluster_print
      return 0
    fi
  fi
  if ((alive > 0)); then
    log "a cluster on $HOST:$CLUSTER_PORT.. is partly running or not ready ($alive of $CLUSTER_NODES nodes alive); starting it anew"
    cluster_stop
  fi
  for p in $(cluster_ports); do
    listening "$p" && die "something else already listens on $HOST:$p; set SLUICE_REDIS_CLUSTER_PORT to another port"
    listening $((p + CLUSTER_BUS_OFFSET)) \
      && die "something else already listens on $HOST:$((p + CLUSTER_BUS_OFFSET)) (the cluster bus of $p); set SLUICE_REDIS_CLUSTER_PORT to another port"
  done
  install_redis
  rm -rf "$CLUSTER_DIR"
  mkdir -p "$CLUSTER_DIR"
  chmod 700 "$CLUSTER_DIR"
  if [[ "$SECURE" == 1 ]]; then
    [[ "$ACL_USER" =~ ^[A-Za-z0-9._-]+$ && "$ACL_USER" != default ]] \
      || die "SLUICE_REDIS_USERNAME must be letters, digits, '.', '_' or '-', and not 'default' (got '$ACL_USER')"
    [[ -n "$ACL_PASSWORD" && "$ACL_PASSWORD" =~ ^[[:graph:]]+$ && "$ACL_PASSWORD" != *[\"\'\\]* ]] \
      || die "SLUICE_REDIS_PASSWORD must be non-empty, without spaces, quotes or backslashes"
    make_test_certs "$TLS_DIR"
    (umask 077 && openssl rand -hex 24 >"$CLUSTER_ADMIN") || die "could not write $CLUSTER_ADMIN"
  fi
  for p in $(cluster_ports); do
    cluster_node_conf "$p"
    redis-server "$CLUSTER_DIR/node-$p.conf" || die "redis-server on port $p failed to start; see $CLUSTER_DIR/node-$p.log"
  done
  local deadline=$((SECONDS + WAIT_SECONDS))
  for p in $(cluster_ports); do
    until [[ "$(ccli "$p" ping 2>/dev/null)" == PONG ]]; do
      if ((SECONDS >= deadline)); then
        tail -n 20 "$CLUSTER_DIR/node-$p.log" >&2 || true
        die "the node on $HOST:$p did not answer PING within ${WAIT_SECONDS}s; see $CLUSTER_DIR/node-$p.log"
      fi
      sleep 0.1
    done
  done
  local nodes=()
  for p in $(cluster_ports); do nodes+=("$HOST:$p"); done
  local first
  first="$(cluster_ports | head -n 1)"
  # redis-cli takes the first three as masters and gives each a replica.
  ccli "$first" --cluster create "${nodes[@]}" --cluster-replicas 1 --cluster-yes >"$CLUSTER_DIR/create.log" 2>&1 \
    || { tail -n 20 "$CLUSTER_DIR/create.log" >&2; die "redis-cli --cluster create failed; see $CLUSTER_DIR/create.log"; }
  until cluster_ready; do
    if ((SECONDS >= deadline)); then
      for p in $(cluster_ports); do ccli "$p" cluster info 2>&1 | grep -E 'cluster_state|known_nodes' >&2 || true; done
      die "the cluster on $HOST:$CLUSTER_PORT.. was not ready (state ok, replicas in sync) within ${WAIT_SECONDS}s; see $CLUSTER_DIR"
    fi
    sleep 0.1
  done
  log "cluster running on $HOST:$CLUSTER_PORT-$((CLUSTER_PORT + CLUSTER_NODES - 1)) (3 masters, 3 replicas; logs in $CLUSTER_DIR)"
  cluster_print
}

# cluster_node_conf PORT writes the node's configuration: owner-only, as
# it holds the passwords in the secured mode.
cluster_node_conf() {
  local p="$1"
  (
    umask 077
    {
      echo "# Generated by scripts/redis.sh (SLUICE_REDIS_CLUSTER=1) on every start."
      echo "bind $HOST"
      echo "save \"\""
      echo "appendonly no"
      echo "dir $CLUSTER_DIR"
      echo "daemonize yes"
      echo "pidfile $CLUSTER_DIR/node-$p.pid"
      echo "logfile $CLUSTER_DIR/node-$p.log"
      echo "cluster-enabled yes"
      echo "cluster-config-file $CLUSTER_DIR/nodes-$p.conf"
      echo "cluster-port $((p + CLUSTER_BUS_OFFSET))"
      # A crashed master is replaced after 2 s (the default 15 s would
      # leave its slots unserved for as long).
      echo "cluster-node-timeout 2000"
      if cluster_secured; then
        local admin
        admin="$(cat "$CLUSTER_ADMIN")"
        echo "port 0"
        echo "tls-port $p"
        echo "tls-cluster yes"
        echo "tls-replication yes"
        echo "tls-cert-file $TLS_DIR/server.crt"
        echo "tls-key-file $TLS_DIR/server.key"
        echo "tls-ca-cert-file $TLS_DIR/ca.pem"
        echo "tls-auth-clients optional"
        echo "masteruser default"
        echo "masterauth $admin"
        echo "# The default user: this script, redis-cli --cluster and replication."
        echo "user default on >$admin ~* &* +@all"
        echo "# sluice's user: its own keys, and the command groups a lease manager uses."
        echo "user $ACL_USER on >$ACL_PASSWORD resetkeys ~sluice:* resetchannels &sluice:* -@all +@read +@write +@scripting +@transaction +@connection +@pubsub -@dangerous +cluster|slots"
      else
        echo "port $p"
      fi
    } >"$CLUSTER_DIR/node-$p.conf"
  ) || die "could not write $CLUSTER_DIR/node-$p.conf"
}

# cluster_print tells a client how to connect; the seeds are the last line
# on stdout.
cluster_print() {
  if cluster_secured; then
    local pw="from SLUICE_REDIS_PASSWORD"
    [[ -z "${SLUICE_REDIS_PASSWORD:-}" ]] && pw="$DEFAULT_ACL_PASSWORD (the default; set SLUICE_REDIS_PASSWORD)"
    log "TLS only  --redis-cluster --redis-tls --redis-ca-file $TLS_DIR/ca.pem"
    log "ACL user  $ACL_USER (keys sluice:*), password $pw"
    log "client    $TLS_DIR/client.crt $TLS_DIR/client.key"
  fi
  cluster_seeds
}

cluster_stop() {
  local p pid pids=()
  for p in $(cluster_ports); do
    if pid="$(node_pid "$p")"; then
      # NOW: a master does not wait for its replica (which may be gone).
      ccli "$p" shutdown nosave now >/dev/null 2>&1 || true
      pids+=("$pid")
    fi
  done
  # All asked first, then waited for: each exit takes as long as the
  # system takes to reap the process.
  for pid in "${pids[@]}"; do terminate "$pid"; done
  rm -rf "$CLUSTER_DIR"
  if ((${#pids[@]} == 0)); then
    log "no cluster running on $HOST:$CLUSTER_PORT.."
  else
    log "stopped the cluster on $HOST:$CLUSTER_PORT.. (${#pids[@]} nodes)"
  fi
}

cluster_status() {
  local alive
  alive="$(cluster_alive)"
  if ((alive == CLUSTER_NODES)) && cluster_ready; then
    local mode=""
    cluster_secured && mode=", TLS only"
    echo "running: cluster of $CLUSTER_NODES nodes on $HOST:$CLUSTER_PORT-$((CLUSTER_PORT + CLUSTER_NODES - 1))$mode, state ok; seeds $(cluster_seeds)"
    return 0
  fi
  if ((alive > 0)); then
    echo "degraded: $alive of $CLUSTER_NODES cluster nodes alive on $HOST:$CLUSTER_PORT.., or not every node ok and in sync"
    return 3
  fi
  echo "stopped"
  return 3
}
