# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): the 3-node RabbitMQ 3.10 and 4.3
# clusters.

# ----------------------------------------------------------------------------- RabbitMQ clusters
# Two 3-node clusters on loopback, for the broker failover suites (tests/integration/
# test_failover.c starts and stops them; plain `start` does not, plain `stop` stops them):
#   cluster    RabbitMQ 3.10 (the host's package): node N (1..3) is
#              ${IDEMQ_CLUSTER_NODE_PREFIX}N@localhost, AMQP on
#              127.0.0.1:IDEMQ_CLUSTER_PORT_BASE+N-1, distribution on
#              127.0.0.1:IDEMQ_CLUSTER_DIST_BASE+N-1, state in $CLUSTER_DIR/nN; the nodes share
#              the Erlang cookie of the rabbitmq user's HOME (the CLI uses it too) and the
#              host's epmd.
#   cluster43  RabbitMQ 4.3 from the sid root, run like the 4.3 broker (rb_vars cluster43-N in
#              lib.sh): ${IDEMQ_CLUSTER43_NODE_PREFIX}N@localhost, AMQP on
#              127.0.0.1:IDEMQ_CLUSTER43_PORT_BASE+N-1, distribution on
#              127.0.0.1:IDEMQ_CLUSTER43_DIST_BASE+N-1, an epmd of their own on
#              127.0.0.1:$IDEMQ_CLUSTER43_EPMD_PORT, state in /var/lib/idemq-cluster43/nN of the
#              root, every deprecated feature refused. Needs root.
# Both are throwaway fixtures: a start with no node running forms the cluster anew (fresh data;
# nodes 2 and 3 join node 1 with stop_app, join_cluster, start_app: on 4.3, Khepri only, a
# fresh node needs no reset first; all feature flags enabled); with some nodes running it starts
# the others, which rejoin from their own data; a stop stops the nodes and keeps their data and
# logs for inspection until the next fresh start. cluster_vars KIND picks the cluster the
# cluster_* functions act on; the steps on one node are c310_* and c43_* (cluster_launch,
# cluster_wait, cluster_ctl, cluster_pid, cluster_fail pick them), and cluster_hook runs a
# kind's extra steps.
CLUSTER_SIZE=3

cluster_vars() {
  CL=$1
  case $1 in
    cluster)
      CL_IMPL=c310 CL_PREFIX=$IDEMQ_CLUSTER_NODE_PREFIX CL_PORT_BASE=$IDEMQ_CLUSTER_PORT_BASE
      CL_DIR=$CLUSTER_DIR CL_ENV_VARS=(PORT_BASE DIST_BASE NODE_PREFIX)
      ;;
    cluster43)
      CL_IMPL=c43 CL_PREFIX=$IDEMQ_CLUSTER43_NODE_PREFIX CL_PORT_BASE=$IDEMQ_CLUSTER43_PORT_BASE
      CL_DIR=$SID_ROOT/var/lib/idemq-cluster43 CL_ENV_VARS=(PORT_BASE DIST_BASE NODE_PREFIX EPMD_PORT)
      ;;
    *) die "unknown cluster $1" ;;
  esac
}

cluster_node_name() { printf '%s%s@localhost\n' "$CL_PREFIX" "$1"; }
cluster_url() { printf 'amqp://guest:guest@127.0.0.1:%s/%%2f\n' "$((CL_PORT_BASE + $1 - 1))"; }

# cluster_node_arg N: N itself when it is a node number 1..3; else an error.
cluster_node_arg() {
  if [[ ! ${1:-} =~ ^[1-9][0-9]*$ ]] || (($1 > CLUSTER_SIZE)); then
    die "expected a cluster node number 1..$CLUSTER_SIZE, got '${1:-}'"
  fi
  printf '%s\n' "$1"
}

# The steps on node N of the cluster cluster_vars picked: launch it without waiting; wait until
# it accepts AMQP connections and its application has booted; rabbitmqctl against it; its pid;
# report its failure (with its logs) and exit.
cluster_launch() { "${CL_IMPL}_launch" "$@"; }
cluster_wait() { "${CL_IMPL}_wait" "$@"; }
cluster_ctl() { "${CL_IMPL}_ctl" "$@"; }
cluster_pid() { "${CL_IMPL}_pid" "$@"; }
cluster_fail() { "${CL_IMPL}_fail" "$@"; }
# cluster_hook STEP ARGS...: the kind's STEP, when it has one: prepare RUNNING (before nodes are
# launched, RUNNING of them up), formed (after a fresh formation; false: form it again, its
# nodes' settings changed), stopped (after a stop).
cluster_hook() {
  if declare -F "${CL_IMPL}_$1" >/dev/null; then
    "${CL_IMPL}_$1" "${@:2}"
  fi
}

# c310_env N: the RABBITMQ_* environment of 3.10 node N, as rabbit_env does for the 3.10 broker
# (whose variables it replaces: call it in a subshell), and CN_DIR CN_NODE CN_PORT CN_HOME.
c310_env() {
  CN_DIR=$CLUSTER_DIR/n$1
  CN_NODE=$(cluster_node_name "$1")
  CN_PORT=$((IDEMQ_CLUSTER_PORT_BASE + $1 - 1))
  CN_DIST=$((IDEMQ_CLUSTER_DIST_BASE + $1 - 1))
  export RABBITMQ_NODENAME=$CN_NODE
  export RABBITMQ_CONF_ENV_FILE=$CN_DIR/rabbitmq-env.conf
  export RABBITMQ_CONFIG_FILE=$CN_DIR/rabbitmq.conf
  export RABBITMQ_ADVANCED_CONFIG_FILE=$CN_DIR/advanced.config
  export RABBITMQ_MNESIA_BASE=$CN_DIR/mnesia
  export RABBITMQ_LOG_BASE=$CN_DIR/log
  export RABBITMQ_ENABLED_PLUGINS_FILE=$CN_DIR/enabled_plugins
  export RABBITMQ_FEATURE_FLAGS_FILE=$CN_DIR/feature_flags
  export RABBITMQ_PID_FILE=$CN_DIR/rabbitmq.pid
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$CN_PORT
  export RABBITMQ_DIST_PORT=$CN_DIST
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export ERL_CRASH_DUMP=$CN_DIR/log/erl_crash.dump
  if is_root; then
    CN_HOME=$RABBIT_HOME
  else
    CN_HOME=$CLUSTER_DIR/home # one HOME, so one cookie, for the three nodes and the CLI
  fi
}

c310_ctl() (
  c310_env "$1"
  shift
  cd / && as_user rabbitmq env HOME="$CN_HOME" "$RABBIT_BIN/rabbitmqctl" -n "$CN_NODE" "$@"
)

c310_pid() (
  c310_env "$1"
  pid_matches "$CN_DIR/rabbitmq.pid" beam.smp "$CN_DIR"
)

c310_fail() {
  local n=$1
  shift
  warn "cluster node $n: $*"
  (c310_env "$n" && show_tail "$CN_DIR/startup.log" "$CN_DIR/log/$CN_NODE.log")
  exit 1
}

# c310_prepare: the folder and the Erlang cookie every node and the CLI read.
c310_prepare() {
  local home=$RABBIT_HOME
  is_root || home=$CLUSTER_DIR/home
  mkdir -p "$CLUSTER_DIR" "$home"
  if erlang_cookie "$home/.erlang.cookie" && is_root; then
    chown rabbitmq:rabbitmq "$home/.erlang.cookie"
  fi
}

c310_launch() (
  c310_env "$1"
  local p run_as=()
  for p in "$CN_PORT" "$CN_DIST"; do
    if port_open "$p"; then
      die "cluster node $1: port 127.0.0.1:$p is already taken by a process that is not this project's cluster node${NL}$(port_owner "$p")${NL}Pick other ports: IDEMQ_CLUSTER_PORT_BASE=... IDEMQ_CLUSTER_DIST_BASE=..."
    fi
  done
  mkdir -p "$CN_DIR/mnesia" "$CN_DIR/log"
  : >"$RABBITMQ_CONF_ENV_FILE" # nothing from /etc/rabbitmq/rabbitmq-env.conf
  rabbit_conf_head "$CN_PORT" >"$RABBITMQ_CONFIG_FILE"
  [[ -e $RABBITMQ_ENABLED_PLUGINS_FILE ]] || echo '[].' >"$RABBITMQ_ENABLED_PLUGINS_FILE"
  if is_root; then
    chown -R rabbitmq:rabbitmq "$CN_DIR"
    run_as=(runuser -u rabbitmq --)
  fi
  rm -f "$RABBITMQ_PID_FILE"
  log "cluster node $1: starting $CN_NODE on 127.0.0.1:$CN_PORT (state in $CN_DIR)"
  (cd "$CN_DIR" && exec setsid "${run_as[@]}" env HOME="$CN_HOME" \
    "$RABBIT_BIN/rabbitmq-server" </dev/null >>"$CN_DIR/startup.log" 2>&1) &
  echo $! >"$CN_DIR/launcher.pid"
  disown $! 2>/dev/null || true
)

c310_wait() (
  c310_env "$1"
  rabbit_await "$CN_PORT" "$(cat "$CN_DIR/launcher.pid")" c310_fail c310_ctl "$1"
)

# The 4.3 nodes: rb_* with rb_vars cluster43-N (see "RabbitMQ 4.x").
c43_launch() { rb_vars "cluster43-$1" && rb_launch; }
c43_wait() { rb_vars "cluster43-$1" && rb_wait; }
c43_pid() { rb_vars "cluster43-$1" && rb_pid; }
c43_ctl() {
  rb_vars "cluster43-$1"
  shift
  rb_ctl "$@"
}
c43_fail() {
  rb_vars "cluster43-$1"
  shift
  rb_fail "$@"
}

# c43_procs: the processes of the 4.3 cluster (all have its ERL_EPMD_PORT).
c43_procs() { root_procs "$SID_ROOT" "ERL_EPMD_PORT=$IDEMQ_CLUSTER43_EPMD_PORT"; }

# c43_prepare RUNNING: the root (built if need be); with no node running, the end of whatever an
# earlier cluster left (its epmd) and a free port for the new epmd.
c43_prepare() {
  is_root || die "cluster43: needs root (chroot and mounts)"
  sid_ensure_root
  (($1 == 0)) || return 0
  sweep cluster43 c43_procs
  if port_open "$IDEMQ_CLUSTER43_EPMD_PORT"; then
    die "cluster43: port 127.0.0.1:$IDEMQ_CLUSTER43_EPMD_PORT (its epmd) is already taken by a process that is not this project's${NL}$(port_owner "$IDEMQ_CLUSTER43_EPMD_PORT")${NL}Pick another: IDEMQ_CLUSTER43_EPMD_PORT=..."
  fi
}

# c43_formed: the first formation with the root's rabbitmq-server learns its deprecated
# features (rb_refuse_learn); false when some were not refused yet (form the cluster again).
c43_formed() {
  local permitted
  rb_vars cluster43-1
  permitted=$(rb_refuse_learn)
  [[ -z $permitted ]] && return 0
  log "cluster43: deprecated features new to scripts/services: ${permitted//$'\n'/ }; forming the cluster again to refuse them"
  return 1
}

c43_stopped() { sweep cluster43 c43_procs; }

# cluster_running_count: how many nodes node 1 sees running in its cluster (0 when it is down).
cluster_running_count() {
  cluster_ctl 1 -q eval 'length(rabbit_nodes:all_running()).' 2>/dev/null | tr -dc '0-9' || true
}

cluster_start() {
  local n t0 up=() down=()
  t0=$(now_s)
  for n in $(seq "$CLUSTER_SIZE"); do
    if cluster_pid "$n" >/dev/null; then up+=("$n"); else down+=("$n"); fi
  done
  if ((${#down[@]} == 0)); then
    log "$CL: already running (nodes ${up[*]})"
    return 0
  fi
  cluster_hook prepare "${#up[@]}"
  if ((${#up[@]} == 0)); then
    # A fresh cluster: data of an earlier one (nodes that knew each other) would only get in
    # the way of forming this one.
    rm -rf "${CL_DIR:?}"/n[0-9]*
    for n in "${down[@]}"; do cluster_launch "$n"; done
    for n in "${down[@]}"; do cluster_wait "$n"; done
    for n in "${down[@]:1}"; do
      cluster_ctl "$n" -q stop_app >/dev/null || cluster_fail "$n" "rabbitmqctl stop_app failed"
      cluster_ctl "$n" -q join_cluster "$(cluster_node_name 1)" >/dev/null ||
        cluster_fail "$n" "rabbitmqctl join_cluster $(cluster_node_name 1) failed"
      cluster_ctl "$n" -q start_app >/dev/null || cluster_fail "$n" "rabbitmqctl start_app failed"
    done
    # Quorum queues with at-least-once dead-lettering need stream_queue; flags are cluster-wide.
    cluster_ctl 1 -q enable_feature_flag all >/dev/null || cluster_fail 1 "enable_feature_flag all failed"
    if ! cluster_hook formed; then
      cluster_stop
      cluster_start
      return
    fi
  else
    for n in "${down[@]}"; do cluster_launch "$n"; done
    for n in "${down[@]}"; do cluster_wait "$n"; done
  fi
  local running
  running=$(cluster_running_count)
  [[ $running == "$CLUSTER_SIZE" ]] || cluster_fail 1 "node 1 sees ${running:-no} running nodes, expected $CLUSTER_SIZE"
  log "$CL: ready, $CLUSTER_SIZE nodes on 127.0.0.1:$CL_PORT_BASE..$((CL_PORT_BASE + CLUSTER_SIZE - 1)) ($(elapsed "$t0")s)"
}

# cluster_stop_node N: a clean stop of node N; idempotent.
cluster_stop_node() {
  local pid t0
  pid=$(cluster_pid "$1") || return 0
  t0=$(now_s)
  kill -CONT "$pid" 2>/dev/null || true # a frozen node would not stop
  stop_pid "$CL node $1" "$pid" cluster_ctl "$1" -q stop
  log "$CL node $1: stopped ($(elapsed "$t0")s)"
}

cluster_stop() {
  local n jobs=() any=0
  for n in $(seq "$CLUSTER_SIZE"); do
    cluster_pid "$n" >/dev/null || continue
    any=1
    cluster_stop_node "$n" &
    jobs+=($!)
  done
  local rc=0 j
  for j in "${jobs[@]}"; do wait "$j" || rc=1; done
  ((rc == 0)) || die "$CL: a node did not stop"
  cluster_hook stopped
  ((any)) || log "$CL: not running"
}

# cluster_kill_node N: kill -9 node N (a crash: no goodbye to its peers or clients).
cluster_kill_node() {
  local pid
  pid=$(cluster_pid "$1") || die "$CL node $1 is not running"
  kill -KILL "$pid"
  wait_gone "$pid" 10 || die "$CL node $1: pid $pid survived kill -9"
  log "$CL node $1: killed (pid $pid)"
}

cluster_start_node() {
  local t0
  t0=$(now_s)
  if cluster_pid "$1" >/dev/null; then
    log "$CL node $1: already running"
    return 0
  fi
  cluster_hook prepare 1
  cluster_launch "$1"
  cluster_wait "$1"
  log "$CL node $1: ready ($(elapsed "$t0")s)"
}

cluster_status() {
  local n pid rc=0
  for n in $(seq "$CLUSTER_SIZE"); do
    if pid=$(cluster_pid "$n"); then
      echo "$CL node $n: running, pid $pid, node $(cluster_node_name "$n"), $(cluster_url "$n")"
    else
      echo "$CL node $n: not running ($(cluster_node_name "$n"), started by: scripts/services start-$CL)"
      rc=1
    fi
  done
  return "$rc"
}

# cluster_env_lines: the cluster's lines of .state/env (write_env), whether it runs or not.
cluster_env_lines() {
  local n urls=() v var
  for n in $(seq "$CLUSTER_SIZE"); do urls+=("$(cluster_url "$n")"); done
  echo "# The 3-node $CL, started only by \"\$IDEMQ_SERVICES\" start-$CL (the failover suite)"
  printf 'export IDEMQ_TEST_%s_URLS=%s\n' "${CL^^}" "$(IFS=, && echo "${urls[*]}")"
  printf 'export'
  for v in "${CL_ENV_VARS[@]}"; do
    var=IDEMQ_${CL^^}_$v
    printf ' %s=%q' "$var" "${!var}"
  done
  echo
}

# cluster_cmd KIND: cluster_vars KIND for a command on that cluster (the 4.3 one needs root).
cluster_cmd() {
  cluster_vars "$1"
  [[ $1 != cluster43 ]] || is_root || die "cluster43: needs root (chroot and mounts)"
}

# The interface (common.sh). Neither cluster is part of `start`, nor of "all up" in `status`
# (their status is never false); `stop` stops both (the 4.3 one where it can run). prepare is
# the cluster's prepare step for nodes that are running (it ends nothing of theirs).
svc_cluster_prepare() { cluster_vars cluster && cluster_hook prepare 1; }
svc_cluster_start() { cluster_vars cluster && cluster_start; }
svc_cluster_stop() { cluster_vars cluster && cluster_stop; }
svc_cluster_status() {
  cluster_vars cluster
  cluster_status || true
}
svc_cluster43_prepare() { cluster_cmd cluster43 && cluster_hook prepare 1; }
svc_cluster43_start() { cluster_cmd cluster43 && cluster_start; }
svc_cluster43_stop() {
  if is_root && [[ -e $SID_DONE ]]; then
    cluster_vars cluster43
    cluster_stop
  fi
}
svc_cluster43_status() {
  if is_root; then
    cluster_vars cluster43
    cluster_status || true
  fi
}
