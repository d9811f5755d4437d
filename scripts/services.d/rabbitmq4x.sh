# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): RabbitMQ 4.0 and 4.3 (rb_*), run
# from their Debian roots.

# ----------------------------------------------------------------------------- RabbitMQ 4.x
# RabbitMQ 4.0 (Debian 13's package, in $R4_ROOT) and 4.3 (Debian sid's, in $SID_ROOT, which
# MySQL 9.7 shares) run with chroot as their roots' own rabbitmq users; rb_vars in lib.sh holds
# what differs between them (and the 4.3 cluster's nodes): node, ports, folders, which root and
# how it is built, TLS, deprecated features. The rb_* functions below act on the broker rb_vars
# named last; those that take a NAME (rabbitmq4, rabbitmq43) call rb_vars themselves. A root is
# built once per state folder and reused; its marker ($R4_DONE, $SID_DONE) marks a completed
# build, so an interrupted one is redone.
# A broker's processes (the VM, its epmd, erl_child_setup, inet_gethost, a CLI) are those whose
# root directory is its root; in the sid root, where MySQL runs too, those whose environment has
# the broker's ERL_EPMD_PORT (each broker, and the 4.3 cluster, has an epmd of its own).
#
# RabbitMQ 4.3 refuses every deprecated feature (rabbitmq.conf: deprecated_features.permit.NAME
# = false), so that a test that relies on one fails, now or when a later 4.x deprecates
# something more, instead of passing silently. RB43_DEPRECATED are those 4.3.6 knows (from
# `rabbitmqctl list_deprecated_features` on Debian sid's 4.3.6-1; the removed ones,
# classic_queue_mirroring and ram_node_type, take the key too). In 4.3.6 transient_nonexcl_queues
# is the one permitted by default; global_qos is denied by default and, refused, is not an
# error: the broker answers basic.qos_ok and applies the prefetch per consumer, as with
# global=false, instead of to the whole channel (it logs the refusal).
# The first start of a 4.3 node after the sid root's rabbitmq-server was installed or upgraded
# asks the broker for its list (rb_refuse_learn) and keeps it in the root
# ($SID_ROOT$RB43_DEPRECATED_FILE, with the version); a feature missing from both lists is
# then refused too, after one restart of the node (or a new formation of the cluster).
RB43_DEPRECATED=(amqp_address_v1 amqp_filter_set_bug classic_queue_mirroring global_qos
  queue_master_locator ram_node_type transient_nonexcl_queues)
RB43_DEPRECATED_FILE=/etc/rabbitmq/idemq-deprecated-features # in the sid root
declare -A RB_LAUNCHERS=() RB_T0=() RB_JOBS=()

# rb_skipped NAME: true (with the reason on stdout) when start/restart/status leave broker NAME
# out (IDEMQ_SKIP_BROKER4=1 / IDEMQ_SKIP_BROKER43=1; not root).
rb_skipped() {
  rb_vars "$1"
  if [[ ${!RB_SKIP:-0} == 1 ]]; then
    echo "$RB_SKIP=1"
  elif ! is_root; then
    echo "needs root (chroot and mounts)"
  else
    return 1
  fi
}

# r4_sweep: everything in the 4.0 root (a build's leftovers too: nothing else runs there).
# rb_sweep: the broker's processes (rb_procs).
r4_sweep() { sweep rabbitmq4 root_procs "$R4_ROOT"; }
rb_sweep() { sweep "$RB_LABEL" rb_procs; }
rb_procs() {
  if ((RB_SHARED)); then
    root_procs "$RB_ROOT" "ERL_EPMD_PORT=$RB_EPMD"
  else
    root_procs "$RB_ROOT"
  fi
}

rb_pid() {
  local pid
  [[ -r $RB_ROOT$RB_PID_FILE ]] || return 1
  pid=$(tr -dc '0-9' <"$RB_ROOT$RB_PID_FILE")
  [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == beam.smp &&
    $(readlink "/proc/$pid/root" 2>/dev/null) == "$RB_ROOT" ]] || return 1
  printf '%s\n' "$pid"
}

# erlang_cookie FILE: make FILE, an Erlang cookie only its owner can read, unless it is there;
# true when it made it (the caller gives it to the broker's user). Made before a first start:
# nodes booting at once would each write their own, and the CLI reads the same file.
erlang_cookie() {
  [[ -s $1 ]] && return 1
  (umask 077 && head -c 32 /dev/urandom | sha256sum | cut -c1-20 | tr a-f A-F >"$1")
  chmod 400 "$1"
}

# rb_prepare: the broker's folders, rabbitmq.conf (rewritten at each start, so edits do not
# last), enabled plugins, TLS files, all owned by the root's rabbitmq user.
rb_prepare() {
  local etc=$RB_ROOT$RB_ETC name
  mkdir -p "$etc" "$RB_ROOT$RB_VAR/mnesia" "$RB_ROOT$RB_LOG" "$RB_ROOT$RB_HOME"
  if erlang_cookie "$RB_ROOT$RB_HOME/.erlang.cookie"; then
    chroot "$RB_ROOT" chown rabbitmq:rabbitmq "$RB_HOME/.erlang.cookie"
  fi
  if [[ -n $RB_TLS_PORT ]]; then
    tls_prepare
    mkdir -p "$etc/tls"
    install -m 644 "$TLS_DIR/ca.pem" "$TLS_DIR/server.pem" "$etc/tls/"
    install -m 600 "$TLS_DIR/server.key" "$etc/tls/"
  fi
  {
    rabbit_conf_head "$RB_PORT"
    [[ -z $RB_TLS_PORT ]] || tls_rabbit_conf "$RB_TLS_PORT" "$RB_ETC/tls"
    if ((RB_REFUSE)); then
      echo "# Every deprecated feature refused (scripts/services, \"RabbitMQ 4.x\")"
      for name in $(rb_deprecated_names); do
        echo "deprecated_features.permit.$name = false"
      done
    fi
  } >"$etc/rabbitmq.conf"
  [[ -e $etc/enabled_plugins ]] || echo '[].' >"$etc/enabled_plugins"
  [[ -z $RB_TLS_PORT ]] || tls_enable_plugin "$etc/enabled_plugins"
  chroot "$RB_ROOT" chown -R rabbitmq:rabbitmq "$RB_VAR" "$RB_LOG" "$RB_ETC"
}

# rb_deprecated_names: RB43_DEPRECATED and those the root's broker listed, one a line, sorted.
rb_deprecated_names() {
  {
    printf '%s\n' "${RB43_DEPRECATED[@]}"
    grep -v '^#' "$RB_ROOT$RB43_DEPRECATED_FILE" 2>/dev/null || true
  } | sort -u
}

# rb_deprecated_permitted [--learn LINE]: the deprecated features the running node permits, one
# a line; with --learn, first keep all it knows in $RB_ROOT$RB43_DEPRECATED_FILE below LINE.
rb_deprecated_permitted() {
  local json list
  json=$(rb_ctl -q list_deprecated_features name state --formatter=json) ||
    rb_fail "rabbitmqctl list_deprecated_features failed"
  list=$(sed -n 's/.*"name":"\([^"]*\)","state":"\([^"]*\)".*/\1 \2/p' <<<"$json")
  [[ -n $list ]] || rb_fail "rabbitmqctl list_deprecated_features listed nothing: $json"
  if [[ ${1:-} == --learn ]]; then
    {
      printf '%s\n' "$2" '# Its deprecated features (scripts/services, "RabbitMQ 4.x"): refused'
      awk '{ print $1 }' <<<"$list"
    } >"$RB_ROOT$RB43_DEPRECATED_FILE.tmp"
    mv "$RB_ROOT$RB43_DEPRECATED_FILE.tmp" "$RB_ROOT$RB43_DEPRECATED_FILE"
  fi
  awk '$2 != "denied" { print $1 }' <<<"$list"
}

# rb_refuse_learn: at the first start of a 4.3 node with the root's rabbitmq-server version,
# keep every deprecated feature the node lists in $RB_ROOT$RB43_DEPRECATED_FILE and print those
# it permits: ones rabbitmq.conf did not refuse yet (the caller restarts the node, whose new
# rabbitmq.conf refuses them). Prints nothing for the other brokers or versions it has seen.
rb_refuse_learn() {
  ((RB_REFUSE)) || return 0
  local stamp
  stamp="# rabbitmq-server $(dpkg-query --admindir="$RB_ROOT/var/lib/dpkg" -W -f='${Version}' rabbitmq-server 2>/dev/null || true)"
  [[ $(head -n 1 "$RB_ROOT$RB43_DEPRECATED_FILE" 2>/dev/null) == "$stamp" ]] && return 0
  rb_deprecated_permitted --learn "$stamp"
}

rb_fail() {
  warn "$RB_LABEL: $*"
  show_tail "$RB_ROOT$RB_LOG/startup.log" "$RB_ROOT$RB_LOG/$RB_NODE.log"
  exit 1
}

# rb_launch: launch the broker without waiting (rb_wait finishes the start), building its root
# first if need be; a running broker is left alone (its application started if a test stopped it).
rb_launch() {
  is_root || die "$RB_LABEL: needs root (chroot and mounts)${RB_SKIP:+; $RB_SKIP=1 leaves it out}"
  "$RB_BUILD"
  local pid p ports=("$RB_PORT" "$RB_DIST")
  RB_LAUNCHERS[$RB]=""
  if pid=$(rb_pid); then
    if port_open "$RB_PORT"; then
      log "$RB_LABEL: already running (pid $pid)"
    else
      log "$RB_LABEL: node up (pid $pid) but not accepting AMQP connections: rabbitmqctl start_app"
      rb_ctl -q start_app >/dev/null || rb_fail "rabbitmqctl start_app failed"
      port_open "$RB_PORT" || rb_fail "not accepting AMQP connections after start_app"
      log "$RB_LABEL: ready on 127.0.0.1:$RB_PORT (pid $pid)"
    fi
    return 0
  fi
  # A stale epmd of an earlier run (or of a CLI call made while the broker was down). Not for a
  # cluster node: the epmd is the other nodes' too (the cluster code sweeps it).
  if ((!RB_CLUSTERED)); then
    rb_sweep
    ports+=("$RB_EPMD")
  fi
  [[ -z $RB_TLS_PORT ]] || ports+=("$RB_TLS_PORT")
  for p in "${ports[@]}"; do
    if port_open "$p"; then
      die "$RB_LABEL: port 127.0.0.1:$p is already taken by a process that is not this project's broker${NL}$(port_owner "$p")${NL}Stop it, or pick other ports: $RB_PORT_VARS"
    fi
  done
  rb_prepare
  log "$RB_LABEL: starting node $RB_NODE on 127.0.0.1:$RB_PORT (root $RB_ROOT)"
  RB_T0[$RB]=$(now_s)
  # setsid, as for 3.10; the launcher is the server's start script (exec all the way down).
  rb_chroot_cmd
  (exec setsid "${RB_CMD[@]}" /usr/lib/rabbitmq/bin/rabbitmq-server \
    </dev/null >>"$RB_ROOT$RB_LOG/startup.log" 2>&1) &
  RB_LAUNCHERS[$RB]=$!
  disown $! 2>/dev/null || true
}

# rb_wait: the rest of a start rb_launch began in this shell: ready, all feature flags enabled
# (a cluster node: the cluster code does that once for all), the TLS user.
rb_wait() {
  local launcher=${RB_LAUNCHERS[$RB]:-} tls=""
  [[ -n $launcher ]] || return 0
  rabbit_await "$RB_PORT" "$launcher" rb_fail rb_ctl
  ((RB_CLUSTERED)) && return 0
  # Enabled feature flags persist with the node's data: only the first start pays for this.
  # No policy is applied: tests rely on 4.x's defaults (quorum queues: delivery limit 20).
  local ff_done=$RB_ROOT$RB_VAR/mnesia/$RB_NODE.idemq-feature-flags-enabled
  if [[ ! -e $ff_done ]]; then
    rb_ctl -q enable_feature_flag all >/dev/null || rb_fail "enable_feature_flag all failed"
    touch "$ff_done"
    log "$RB_LABEL: enabled all feature flags"
  fi
  port_open "$RB_PORT" || rb_fail "AMQP port closed right after start-up"
  if [[ -n $RB_TLS_PORT ]]; then
    tls_provision_user "$RB_LABEL" "$RB_ROOT$RB_VAR/mnesia/$RB_NODE.idemq-tls-user" rb_ctl rb_fail
    port_open "$RB_TLS_PORT" || rb_fail "no TLS listener on 127.0.0.1:$RB_TLS_PORT"
    tls=", TLS on 127.0.0.1:$RB_TLS_PORT"
  fi
  log "$RB_LABEL: ready on 127.0.0.1:$RB_PORT$tls (pid $(rb_pid), $(elapsed "${RB_T0[$RB]}")s)"
}

# rb_start NAME: start broker NAME and wait until it is ready. A 4.3 broker's first start with
# a new rabbitmq-server may learn of deprecated features to refuse: one restart applies them.
rb_start() {
  rb_vars "$1"
  local permitted
  rb_launch
  rb_wait
  [[ -n ${RB_LAUNCHERS[$RB]} ]] || return 0
  permitted=$(rb_refuse_learn)
  [[ -n $permitted ]] || return 0
  log "$RB_LABEL: deprecated features new to scripts/services: ${permitted//$'\n'/ }; restarting to refuse them"
  rb_halt
  rb_launch
  rb_wait
  permitted=$(rb_deprecated_permitted)
  [[ -z $permitted ]] || rb_fail "deprecated features still permitted: ${permitted//$'\n'/ }"
}

# rb_halt: stop the broker, end what is left of it; idempotent.
rb_halt() {
  local pid t0
  t0=$(now_s)
  if pid=$(rb_pid); then
    log "$RB_LABEL: stopping (pid $pid)"
    kill -CONT "$pid" 2>/dev/null || true # a frozen broker (freeze-*) would not stop
    stop_pid "$RB_LABEL" "$pid" rb_ctl -q stop
    rm -f "$RB_ROOT$RB_PID_FILE"
  fi
  ((RB_CLUSTERED)) || rb_sweep
  ((RB_SHARED)) || unmount_under "$RB_ROOT" "$RB_LABEL"
  if [[ -n $pid ]]; then log "$RB_LABEL: stopped ($(elapsed "$t0")s)"; else log "$RB_LABEL: not running"; fi
}

# rb_stop NAME: rb_halt for broker NAME, when there can be one.
rb_stop() {
  rb_vars "$1"
  if ! is_root || [[ ! -d $RB_ROOT ]]; then
    log "$RB_LABEL: not running"
    return 0
  fi
  rb_halt
}

rb_status() {
  local pid why version refused=""
  rb_vars "$1"
  if why=$(rb_skipped "$1"); then
    echo "$RB_LABEL: left out ($why)"
    return 0
  fi
  if pid=$(rb_pid); then
    if port_open "$RB_PORT"; then
      version=$(sed -n 's/^rabbitmq-server /rabbitmq-server /p' "$RB_DONE")
      ((RB_REFUSE)) && refused="; deprecated features refused"
      echo "$RB_LABEL: running, pid $pid, node $RB_NODE, amqp://guest:guest@127.0.0.1:$RB_PORT/%2f accepting connections ($version$refused)"
      [[ -n $RB_TLS_PORT ]] || return 0
      if ! port_open "$RB_TLS_PORT"; then
        echo "$RB_LABEL: no TLS listener on 127.0.0.1:$RB_TLS_PORT (restart-$RB adds it)"
        return 1
      fi
      echo "$RB_LABEL: TLS listener amqps://127.0.0.1:$RB_TLS_PORT (test CA and certificates in $TLS_DIR)"
      return 0
    fi
    echo "$RB_LABEL: process $pid is up but 127.0.0.1:$RB_PORT is not accepting connections (starting or stopping?)"
    return 1
  fi
  if port_open "$RB_PORT"; then
    echo "$RB_LABEL: not running; 127.0.0.1:$RB_PORT is taken by another process $(port_owner "$RB_PORT")"
  else
    echo "$RB_LABEL: not running"
  fi
  return 1
}

# rb_bg_start NAME: start broker NAME in the background (it boots, or its root is built, while
# the others start); rb_bg_wait NAME: its outcome. Nothing when it is left out.
rb_bg_start() {
  local why
  RB_JOBS[$1]=""
  if why=$(rb_skipped "$1"); then
    log "$1: left out ($why)"
    return 0
  fi
  rb_start "$1" &
  RB_JOBS[$1]=$!
}
rb_bg_wait() {
  [[ -n ${RB_JOBS[$1]:-} ]] || return 0
  rb_skipped "$1" >/dev/null || true # RB_SKIP for the message
  wait "${RB_JOBS[$1]}" || die "$1: start failed ($RB_SKIP=1 leaves it out)"
}

# The interface (common.sh) of rabbitmq4 and rabbitmq43: prepare (only for a broker that is not
# running: its start calls it) builds the root first if need be; start and wait are the
# background start of `start` and its outcome, nothing when the broker is left out.
svc_rabbitmq4_prepare() { rb_vars rabbitmq4 && rb_svc_prepare; }
svc_rabbitmq4_start() { rb_bg_start rabbitmq4; }
svc_rabbitmq4_wait() { rb_bg_wait rabbitmq4; }
svc_rabbitmq4_stop() { rb_stop rabbitmq4; }
svc_rabbitmq4_status() { rb_status rabbitmq4; }
svc_rabbitmq4_skipped() { rb_skipped rabbitmq4; }
svc_rabbitmq43_prepare() { rb_vars rabbitmq43 && rb_svc_prepare; }
svc_rabbitmq43_start() { rb_bg_start rabbitmq43; }
svc_rabbitmq43_wait() { rb_bg_wait rabbitmq43; }
svc_rabbitmq43_stop() { rb_stop rabbitmq43; }
svc_rabbitmq43_status() { rb_status rabbitmq43; }
svc_rabbitmq43_skipped() { rb_skipped rabbitmq43; }
rb_svc_prepare() {
  is_root || die "$RB_LABEL: needs root (chroot and mounts)${RB_SKIP:+; $RB_SKIP=1 leaves it out}"
  "$RB_BUILD"
  rb_prepare
}
