# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): the interface every service
# file in scripts/services.d implements, the order the all-services commands follow, and
# .state/env.
#
# The services: rabbitmq (3.10), rabbitmq4, rabbitmq43, mariadb, mariadb-tls, mysql97 (both
# MySQL 9.7 servers), cluster, cluster43, galera, gr. Each file defines, for each of its
# services NAME (with - as _ in function names):
#   svc_NAME_prepare   its files (folders, configuration, certificates); starts nothing
#   svc_NAME_start     start it: launch it (or its whole start in the background) and return
#                      without waiting where it can; one already running is left alone
#   svc_NAME_wait      the rest of a start that svc_NAME_start began in this shell: until it
#                      accepts connections (nothing for those whose start waits already)
#   svc_NAME_stop      a clean stop, then until its processes are gone; idempotent
#   svc_NAME_status    its state on stdout; false when it is not up
#   svc_NAME_skipped   (optional) true, with the reason on stdout, when start, restart and
#                      status leave it out (IDEMQ_SKIP_*, not root)
# `svc STEP NAME` calls one; a service without that step does nothing for it. The commands on
# one service (start-NAME, stop-NAME, ...) call the service's own functions, as they always
# did (start-rabbitmq4, for one, starts it even with IDEMQ_SKIP_BROKER4=1).
svc() {
  local fn=svc_${2//-/_}_$1
  declare -F "$fn" >/dev/null || return 0
  "$fn" "${@:3}"
}
# svc_left_out NAME: svc_NAME_skipped, false when the service has none.
svc_left_out() {
  local fn=svc_${1//-/_}_skipped
  declare -F "$fn" >/dev/null || return 1
  "$fn"
}

# The order of `start` (every start first, the waits after it: the 4.x brokers and MySQL 9.7
# start in the background, RabbitMQ 3.10 boots while MariaDB starts), of `stop` and `status`,
# and of the stops that begin `restart` (those left out are not stopped).
# shellcheck disable=SC2034 # used by scripts/services
SERVICES_START=(rabbitmq4 rabbitmq43 mysql97 rabbitmq mariadb mariadb-tls)
# shellcheck disable=SC2034
SERVICES_WAIT=(rabbitmq rabbitmq4 rabbitmq43 mysql97)
# shellcheck disable=SC2034
SERVICES_STOP=(rabbitmq rabbitmq4 rabbitmq43 mariadb cluster cluster43 galera gr mariadb-tls mysql97)
# shellcheck disable=SC2034
SERVICES_STATUS=(rabbitmq rabbitmq4 rabbitmq43 mariadb cluster cluster43 galera gr mariadb-tls mysql97)
# shellcheck disable=SC2034
SERVICES_RESTART_STOP=(rabbitmq rabbitmq4 rabbitmq43 mysql97 mariadb mariadb-tls)

# ----------------------------------------------------------------------------- stopping, starting
# stop_pid WHAT PID CMD...: stop a server with CMD... (its clean stop: rabbitmqctl stop), with
# SIGTERM when CMD fails, with SIGKILL when it is still there after 60 s; WHAT prefixes messages.
stop_pid() {
  local what=$1 pid=$2
  shift 2
  if ! "$@" >/dev/null 2>&1; then
    warn "$what: the clean stop failed; sending SIGTERM"
    kill -TERM "$pid" 2>/dev/null || true
  fi
  wait_stopped "$what" "$pid"
}

# shutdown_pid WHAT PID TOOL ADMIN...: stop_pid for a database server: its clean stop is
# `ADMIN... --connect-timeout=5 shutdown`, TOOL (mariadb-admin, mysqladmin) names it in the warning.
shutdown_pid() {
  local what=$1 pid=$2 tool=$3
  shift 3
  if ! "$@" --connect-timeout=5 shutdown >/dev/null 2>&1; then
    warn "$what: $tool shutdown failed; sending SIGTERM"
    kill -TERM "$pid" 2>/dev/null || true
  fi
  wait_stopped "$what" "$pid"
}

# wait_stopped WHAT PID: the end of stop_pid and shutdown_pid: until PID is gone, with SIGKILL
# when it is still there after 60 s.
wait_stopped() {
  local what=$1 pid=$2
  if ! wait_gone "$pid" 60; then
    warn "$what: still running after 60s; killing it"
    kill -KILL "$pid" 2>/dev/null || true
    wait_gone "$pid" 10 || die "$what: pid $pid does not go away"
  fi
}

# stop_group LAUNCHER: a start given up. setsid made LAUNCHER the leader of a process group of
# its own, and everything the start launched is in it: stopped with SIGTERM, SIGKILL after 10 s.
# Left running, a server is unknown to scripts/services until it writes its pid file (a broker
# writes it late): it would keep its ports, and the next start would report them taken by a
# process that is not this project's.
stop_group() {
  local group=$1 i
  [[ $group =~ ^[1-9][0-9]*$ ]] || return 0
  kill -TERM -- "-$group" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    pgrep -g "$group" >/dev/null || return 0
    sleep 0.1
  done
  kill -KILL -- "-$group" 2>/dev/null || true
}

# give_up LAUNCHER FAIL ARGS...: stop_group LAUNCHER, then FAIL ARGS... (which exits).
give_up() {
  stop_group "$1"
  "${@:2}"
}

# stop_trees PID...: each PID and every process under it (SIGTERM, SIGKILL after 10 s), all at
# once: a start waiting for a root's lock would otherwise take it from a stopped one and start
# building. A background start cut short by another's failure may be building a root
# (debootstrap, apt in the chroot) or booting a server: its processes are the job's
# descendants, in the script's own process group, so stop_group cannot reach them.
stop_trees() {
  local -a tree=("$@")
  local i=0 child
  while ((i < ${#tree[@]})); do
    for child in $(pgrep -P "${tree[i]}"); do tree+=("$child"); done
    i=$((i + 1))
  done
  kill -TERM "${tree[@]}" 2>/dev/null || return 0
  for ((i = 0; i < 100; i++)); do
    kill -0 "${tree[@]}" 2>/dev/null || return 0
    sleep 0.1
  done
  kill -KILL "${tree[@]}" 2>/dev/null || true
}

# stop_unfinished_starts: at the exit of a failed `start`, what it began and did not finish: the
# background starts still running (stop_trees) and a 3.10 broker launched but not yet awaited
# (stop_group). A failed start leaves no root being built and no server half started.
stop_unfinished_starts() {
  local name pid
  local -a running=() names=()
  for name in "${!RB_JOBS[@]}"; do
    pid=${RB_JOBS[$name]}
    if [[ -z $pid ]] || ! kill -0 "$pid" 2>/dev/null; then continue; fi
    running+=("$pid") names+=("$name")
  done
  for pid in ${M97_JOBS[@]+"${M97_JOBS[@]}"}; do
    kill -0 "$pid" 2>/dev/null || continue
    running+=("$pid") names+=(mysql97)
  done
  if [[ -n ${RABBIT_LAUNCHER:-} ]] && pgrep -g "$RABBIT_LAUNCHER" >/dev/null; then
    warn "rabbitmq: its start did not finish; stopping it"
    stop_group "$RABBIT_LAUNCHER"
  fi
  ((${#running[@]})) || return 0
  warn "the start of $(printf '%s\n' "${names[@]}" | sort -u | paste -sd' ') did not finish; stopping it"
  stop_trees "${running[@]}"
}

# await_ready LAUNCHER FAIL PROBE...: the end of a database server's start: until PROBE...
# succeeds (it answers), within IDEMQ_START_TIMEOUT; FAIL (the server's failure function) when
# LAUNCHER (the process that became the server) exits first or time runs out (give_up).
await_ready() {
  local launcher=$1 fail=$2 deadline=$((SECONDS + IDEMQ_START_TIMEOUT))
  shift 2
  until "$@"; do
    kill -0 "$launcher" 2>/dev/null || give_up "$launcher" "$fail" "the server exited during start-up"
    ((SECONDS < deadline)) || give_up "$launcher" "$fail" "not accepting connections after ${IDEMQ_START_TIMEOUT}s"
    sleep 0.2
  done
}

# ----------------------------------------------------------------------------- common
write_env() {
  {
    printf '# Written by scripts/services start. Source it: . %q\n' "$ENV_FILE"
    printf 'export IDEMQ_TEST_AMQP_URL=%s\n' "amqp://guest:guest@127.0.0.1:$IDEMQ_AMQP_PORT/%2f"
    printf 'export IDEMQ_TEST_AMQPS_URL=%s\n' "amqps://guest:guest@127.0.0.1:$IDEMQ_AMQPS_PORT/%2f"
    echo "# The test CA and certificates of the TLS listeners (scripts/services, \"RabbitMQ TLS\")"
    printf 'export IDEMQ_TEST_TLS_DIR=%q\n' "$TLS_DIR"
    printf 'export IDEMQ_TEST_MYSQL_URL=%s\n' "mysql://idemq:idemq@127.0.0.1:$IDEMQ_MYSQL_PORT/idemq"
    printf 'export IDEMQ_TEST_MYSQL_SOCKET=%q\n' "$MARIA_SOCKET"
    printf 'export IDEMQ_SERVICES=%q\n' "$ROOT/scripts/services"
    echo "# root through the socket, no password: mariadb --defaults-file=\"\$IDEMQ_MYSQL_DEFAULTS_FILE\" --user=root"
    printf 'export IDEMQ_MYSQL_DEFAULTS_FILE=%q\n' "$MARIA_CNF"
    echo "# rabbitmqctl: \"\$IDEMQ_SERVICES\" rabbitmqctl ARGS (as root, plain rabbitmqctl -n \$IDEMQ_RABBITMQ_NODE works too)"
    echo "# So that \$IDEMQ_SERVICES, run from a test, acts on these same servers:"
    printf 'export IDEMQ_RABBITMQ_NODE=%q\n' "$IDEMQ_RABBITMQ_NODE"
    printf 'export IDEMQ_AMQP_PORT=%q IDEMQ_AMQPS_PORT=%q IDEMQ_MYSQL_PORT=%q IDEMQ_RABBITMQ_DIST_PORT=%q\n' \
      "$IDEMQ_AMQP_PORT" "$IDEMQ_AMQPS_PORT" "$IDEMQ_MYSQL_PORT" "$IDEMQ_RABBITMQ_DIST_PORT"
    if is_root; then
      echo "# RabbitMQ 4.0: \"\$IDEMQ_SERVICES\" rabbitmq4ctl ARGS; IDEMQ_TEST_BROKER=4 points the plain broker commands at it"
      printf 'export IDEMQ_TEST_AMQP4_URL=%s\n' "amqp://guest:guest@127.0.0.1:$IDEMQ_AMQP4_PORT/%2f"
      printf 'export IDEMQ_RABBITMQ4_NODE=%q\n' "$IDEMQ_RABBITMQ4_NODE"
      printf 'export IDEMQ_AMQP4_PORT=%q IDEMQ_RABBITMQ4_DIST_PORT=%q IDEMQ_RABBITMQ4_EPMD_PORT=%q\n' \
        "$IDEMQ_AMQP4_PORT" "$IDEMQ_RABBITMQ4_DIST_PORT" "$IDEMQ_RABBITMQ4_EPMD_PORT"
    fi
    if ! rb_skipped rabbitmq43 >/dev/null; then
      echo "# RabbitMQ 4.3 (Debian sid root): \"\$IDEMQ_SERVICES\" rabbitmq43ctl ARGS; IDEMQ_TEST_BROKER=4.3 points the plain"
      echo "# broker commands at it. TLS with the 3.10 broker's test CA, certificates and EXTERNAL user; deprecated features refused"
      printf 'export IDEMQ_TEST_AMQP43_URL=%s\n' "amqp://guest:guest@127.0.0.1:$IDEMQ_AMQP43_PORT/%2f"
      printf 'export IDEMQ_TEST_AMQPS43_URL=%s\n' "amqps://guest:guest@127.0.0.1:$IDEMQ_AMQPS43_PORT/%2f"
      printf 'export IDEMQ_RABBITMQ43_NODE=%q\n' "$IDEMQ_RABBITMQ43_NODE"
      printf 'export IDEMQ_AMQP43_PORT=%q IDEMQ_AMQPS43_PORT=%q IDEMQ_RABBITMQ43_DIST_PORT=%q IDEMQ_RABBITMQ43_EPMD_PORT=%q\n' \
        "$IDEMQ_AMQP43_PORT" "$IDEMQ_AMQPS43_PORT" "$IDEMQ_RABBITMQ43_DIST_PORT" "$IDEMQ_RABBITMQ43_EPMD_PORT"
    fi
    cluster_vars cluster
    cluster_env_lines
    if is_root; then
      cluster_vars cluster43
      cluster_env_lines
    fi
    maria_tls_env
    m97_env
    galera_env
    gr_env
    if [[ $STATE_DIR != "$ROOT/.state" ]]; then
      printf 'export IDEMQ_STATE_DIR=%q\n' "$STATE_DIR"
    fi
  } >"$ENV_FILE.tmp"
  mv "$ENV_FILE.tmp" "$ENV_FILE"
}
