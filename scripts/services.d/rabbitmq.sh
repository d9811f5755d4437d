# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): RabbitMQ 3.10, the broker
# helpers every RabbitMQ uses.

# ----------------------------------------------------------------------------- RabbitMQ
# Helpers every broker uses (3.10, 4.0, 4.3, the cluster nodes).

# rabbit_conf_head PORT: the first lines of each broker's rabbitmq.conf: the AMQP listener on
# 127.0.0.1:PORT, guest allowed (it can only come from loopback), log to the log file only.
rabbit_conf_head() {
  cat <<EOC
# Written by scripts/services; edits are overwritten at each start.
listeners.tcp.default = 127.0.0.1:$1
loopback_users = none
log.file.level = info
log.console = false
EOC
}

# rabbit_await PORT LAUNCHER FAIL CTL [N]: the end of a broker's start: wait until 127.0.0.1:PORT
# accepts connections, then until the application has booted (rabbitmqctl await_startup), all
# within IDEMQ_START_TIMEOUT. FAIL and CTL are the broker's failure and rabbitmqctl functions,
# given N first when there is one (a cluster node number); FAIL also when LAUNCHER (the start
# script, which execs the VM) exits early; a start given up stops what it launched (give_up).
rabbit_await() {
  local port=$1 launcher=$2 fail=$3 ctl=$4 node=("${@:5}") left deadline=$((SECONDS + IDEMQ_START_TIMEOUT))
  until port_open "$port"; do
    kill -0 "$launcher" 2>/dev/null || give_up "$launcher" "$fail" "${node[@]}" "the broker exited during start-up"
    ((SECONDS < deadline)) || give_up "$launcher" "$fail" "${node[@]}" "not accepting AMQP connections after ${IDEMQ_START_TIMEOUT}s"
    sleep 0.2
  done
  left=$((deadline - SECONDS))
  ((left > 5)) || left=5
  "$ctl" "${node[@]}" -q await_startup --timeout "$left" >/dev/null ||
    give_up "$launcher" "$fail" "${node[@]}" "rabbitmqctl await_startup failed"
}

# signal_broker WHAT PIDFN STOP|CONT: freeze-* / thaw-*: SIGSTOP or SIGCONT to the Erlang VM that
# PIDFN names, a broker that hangs with its sockets open (the kernel still accepts connections).
signal_broker() {
  local pid
  pid=$("$2") || die "$1: not running"
  kill "-$3" "$pid"
  if [[ $3 == STOP ]]; then log "$1: frozen (SIGSTOP $pid)"; else log "$1: thawed (SIGCONT $pid)"; fi
}

# The 3.10 broker (the host's package).
rabbit_pid() { pid_matches "$RABBITMQ_PID_FILE" beam.smp "$RABBIT_DIR"; }

rabbit_prepare() {
  mkdir -p "$RABBIT_DIR/mnesia" "$RABBIT_DIR/log" "$RABBIT_DIR/home"
  : >"$RABBITMQ_CONF_ENV_FILE" # empty on purpose: nothing from /etc/rabbitmq/rabbitmq-env.conf
  tls_prepare
  {
    rabbit_conf_head "$IDEMQ_AMQP_PORT"
    tls_rabbit_conf "$IDEMQ_AMQPS_PORT" "$TLS_DIR"
  } >"$RABBITMQ_CONFIG_FILE"
  [[ -e $RABBITMQ_ENABLED_PLUGINS_FILE ]] || echo '[].' >"$RABBITMQ_ENABLED_PLUGINS_FILE"
  tls_enable_plugin "$RABBITMQ_ENABLED_PLUGINS_FILE"
  if is_root; then
    chown -R rabbitmq:rabbitmq "$RABBIT_DIR"
  fi
}

# Launch the broker in its own session without waiting; rabbit_wait finishes the start.
rabbit_launch() {
  rabbit_env
  local pid
  if pid=$(rabbit_pid); then
    RABBIT_LAUNCHER=""
    if port_open "$IDEMQ_AMQP_PORT"; then
      log "rabbitmq: already running (pid $pid)"
      port_open "$IDEMQ_AMQPS_PORT" ||
        warn "rabbitmq: it has no TLS listener on 127.0.0.1:$IDEMQ_AMQPS_PORT (started by an older scripts/services?): 'scripts/services restart-rabbitmq' adds it"
    else
      # The node is up but its application is not (a test ran `rabbitmqctl stop_app`, or it is
      # still booting): start_app is a no-op for a running application and waits for a booting one.
      log "rabbitmq: node up (pid $pid) but not accepting AMQP connections: rabbitmqctl start_app"
      rmqctl -q start_app >/dev/null || rabbit_fail "rabbitmqctl start_app failed"
      port_open "$IDEMQ_AMQP_PORT" || rabbit_fail "not accepting AMQP connections after start_app"
      log "rabbitmq: ready on 127.0.0.1:$IDEMQ_AMQP_PORT (pid $pid)"
    fi
    return 0
  fi
  local p
  for p in "$IDEMQ_AMQP_PORT" "$IDEMQ_AMQPS_PORT" "$IDEMQ_RABBITMQ_DIST_PORT"; do
    if port_open "$p"; then
      die "rabbitmq: port 127.0.0.1:$p is already taken by a process that is not this project's broker${NL}$(port_owner "$p")${NL}Stop it (a system broker: 'rabbitmqctl stop' or 'systemctl stop rabbitmq-server'), or pick other ports: IDEMQ_AMQP_PORT=... IDEMQ_AMQPS_PORT=... IDEMQ_RABBITMQ_DIST_PORT=... IDEMQ_RABBITMQ_NODE=other@localhost"
    fi
  done
  rabbit_prepare
  log "rabbitmq: starting node $IDEMQ_RABBITMQ_NODE on 127.0.0.1:$IDEMQ_AMQP_PORT (state in $RABBIT_DIR)"
  RABBIT_T0=$(now_s)
  # setsid: the broker outlives this script and is not hit by signals sent to the caller's
  # process group (Ctrl-C in the terminal, `timeout` in scripts/test).
  local run_as=()
  is_root && run_as=(runuser -u rabbitmq --)
  (cd "$RABBIT_DIR" && exec setsid "${run_as[@]}" env HOME="$RABBIT_RUN_HOME" \
    "$RABBIT_BIN/rabbitmq-server" </dev/null >>"$RABBIT_DIR/startup.log" 2>&1) &
  RABBIT_LAUNCHER=$!
  disown "$RABBIT_LAUNCHER" 2>/dev/null || true
}

rabbit_fail() {
  warn "rabbitmq: $*"
  show_tail "$RABBIT_DIR/startup.log" "$RABBIT_DIR/log/$IDEMQ_RABBITMQ_NODE.log"
  exit 1
}

rabbit_wait() {
  rabbit_env
  if [[ -z ${RABBIT_LAUNCHER:-} ]]; then
    return 0
  fi
  rabbit_await "$IDEMQ_AMQP_PORT" "$RABBIT_LAUNCHER" rabbit_fail rmqctl
  # Enabled feature flags persist in the feature_flags file: only the first start pays for this.
  if ! grep -q stream_queue "$RABBITMQ_FEATURE_FLAGS_FILE" 2>/dev/null; then
    rmqctl -q enable_feature_flag all >/dev/null || rabbit_fail "enable_feature_flag all failed"
    log "rabbitmq: enabled all feature flags"
  fi
  tls_provision_user rabbitmq "$RABBIT_DIR/mnesia/$IDEMQ_RABBITMQ_NODE.idemq-tls-user" rmqctl rabbit_fail
  port_open "$IDEMQ_AMQP_PORT" || rabbit_fail "AMQP port closed right after start-up"
  port_open "$IDEMQ_AMQPS_PORT" || rabbit_fail "no TLS listener on 127.0.0.1:$IDEMQ_AMQPS_PORT"
  log "rabbitmq: ready on 127.0.0.1:$IDEMQ_AMQP_PORT, TLS on 127.0.0.1:$IDEMQ_AMQPS_PORT (pid $(rabbit_pid), $(elapsed "$RABBIT_T0")s)"
  RABBIT_LAUNCHER="" # started: a later failure of `start` leaves it running (stop_unfinished_starts)
}

rabbit_stop() {
  rabbit_env
  local pid t0
  if ! pid=$(rabbit_pid); then
    log "rabbitmq: not running"
    return 0
  fi
  t0=$(now_s)
  log "rabbitmq: stopping (pid $pid)"
  stop_pid rabbitmq "$pid" rmqctl -q stop
  rm -f "$RABBITMQ_PID_FILE"
  log "rabbitmq: stopped ($(elapsed "$t0")s)"
}

rabbit_status() {
  rabbit_env
  local pid
  if pid=$(rabbit_pid); then
    if port_open "$IDEMQ_AMQP_PORT"; then
      echo "rabbitmq: running, pid $pid, node $IDEMQ_RABBITMQ_NODE, amqp://guest:guest@127.0.0.1:$IDEMQ_AMQP_PORT/%2f accepting connections"
      if ! port_open "$IDEMQ_AMQPS_PORT"; then
        echo "rabbitmq: no TLS listener on 127.0.0.1:$IDEMQ_AMQPS_PORT (restart-rabbitmq adds it)"
        return 1
      fi
      echo "rabbitmq: TLS listener amqps://127.0.0.1:$IDEMQ_AMQPS_PORT (test CA and certificates in $TLS_DIR)"
      return 0
    fi
    echo "rabbitmq: process $pid is up but 127.0.0.1:$IDEMQ_AMQP_PORT is not accepting connections (starting or stopping?)"
    return 1
  fi
  if port_open "$IDEMQ_AMQP_PORT"; then
    echo "rabbitmq: not running; 127.0.0.1:$IDEMQ_AMQP_PORT is taken by another process $(port_owner "$IDEMQ_AMQP_PORT")"
  else
    echo "rabbitmq: not running"
  fi
  return 1
}

# The interface (common.sh). prepare only for a broker that is not running (its start calls it).
svc_rabbitmq_prepare() { rabbit_prepare; }
svc_rabbitmq_start() { rabbit_launch; }
svc_rabbitmq_wait() { rabbit_wait; }
svc_rabbitmq_stop() { rabbit_stop; }
svc_rabbitmq_status() { rabbit_status; }
