# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): the 3-node MySQL 9.7 Group
# Replication cluster and the MySQL Router in front of it, run from the Debian sid root.

# ----------------------------------------------------------------------------- Group Replication
# Three MySQL 9.7 servers in single-primary Group Replication, for the database failover tests
# (plain `start` does not start them, plain `stop` stops them). They run with chroot from the
# sid root exactly as the mysql97 servers do (mysql97.sh): node N (1..3) keeps everything in
# /var/lib/idemq-grN of the root (my.cnf, data/, sock, mysqld.pid, error.log), SQL on
# 127.0.0.1:IDEMQ_GR_PORT_BASE+N-1, group communication (XCom, group_replication_local_address)
# on 127.0.0.1:IDEMQ_GR_GCS_BASE+N-1. Needs root.
#
# The group: a recovery user on each node with SQL_LOG_BIN=0 (CHANGE REPLICATION SOURCE ... FOR
# CHANNEL 'group_replication_recovery'), one node bootstrapped (group_replication_bootstrap_group),
# the others joined with START GROUP_REPLICATION, one at a time (distributed recovery from the
# binary logs: there is no clone plugin, and the logs go back to the first formation). Database
# idemq and user idemq/idemq (caching_sha2_password, ALL ON *.* WITH GRANT OPTION) are made on
# the primary and replicate. Every server starts with super_read_only=ON and
# group_replication_start_on_boot=OFF: a restarted node accepts no write before it is back in
# the group, where Group Replication itself decides (the primary is writable, secondaries not).
# Data is kept across stops; the group is made anew only when its first formation never
# completed.
#
# Which node bootstraps the group when no node is in one (start-gr): every server is started
# (without Group Replication), and the node whose gtid_executed contains every other node's
# bootstraps, node 1 first on a tie (so node 1 after a fresh formation or a clean stop); when no
# node contains all the others' transactions the histories have diverged and start-gr refuses.
# start-gr-node N joins node N to the running group; with no node running it refuses
# (start-gr picks the node). A group that has lost its majority (two of three killed: the
# survivor blocks every write) is not joined: a start would hang; unblocking it is a test's
# decision: gr-sql N -e "SET GLOBAL group_replication_force_members='127.0.0.1:<its GCS port>'"
# (the refusal names the command).
#
# MySQL Router 9.7 (sid's mysql-router): sid has no MySQL Shell (mysqlsh), which makes the
# InnoDB Cluster metadata schema that `mysqlrouter --bootstrap` and metadata-cache routing need,
# so the Router is configured statically: RW on 127.0.0.1:IDEMQ_GR_ROUTER_RW_PORT with
# routing_strategy=first-available over nodes 1, 2, 3 in that order, RO on
# 127.0.0.1:IDEMQ_GR_ROUTER_RO_PORT with round-robin over the three. Its limits: it does not
# know which node is primary, only which accept connections: RW goes to the first node that
# accepts a connection. Member weights (node 1 highest, then 2, then 3) make elections follow
# that order, so when the primary dies RW reaches the new primary; but once node 1 runs again
# it is a secondary (Group Replication never hands the primary back by itself) and a write
# through the RW port is refused there with 1290 (--super-read-only); RO may land on the
# primary. TLS passes through to the servers
# (client_ssl_mode=PASSTHROUGH). A test that needs the primary back on node 1 says so:
# gr-sql 1 -e "SELECT group_replication_set_as_primary(@@server_uuid)". It runs in the root as
# the mysql user, state in /var/lib/idemq-gr-router.
GR_SIZE=3
GR_ROUTER_IN=/var/lib/idemq-gr-router

gr_vars() {
  GR=$1
  GR_IN=/var/lib/idemq-gr$1
  GR_DIR=$SID_ROOT$GR_IN
  GR_CNF=$GR_IN/my.cnf
  GR_PORT=$((IDEMQ_GR_PORT_BASE + $1 - 1))
  GR_GCS=$((IDEMQ_GR_GCS_BASE + $1 - 1))
}

gr_url() { printf 'mysql://idemq:idemq@127.0.0.1:%s/idemq\n' "$((IDEMQ_GR_PORT_BASE + $1 - 1))"; }

gr_node_arg() {
  if [[ ! ${1:-} =~ ^[1-9][0-9]*$ ]] || (($1 > GR_SIZE)); then
    die "expected a Group Replication node number 1..$GR_SIZE, got '${1:-}'"
  fi
  printf '%s\n' "$1"
}

# gr_pid N: the pid of node N's mysqld: its pid file names a mysqld in the sid root whose
# command line names its folder (as m97_pid), or, before it wrote one, such a mysqld.
gr_pid() {
  local pid in=/var/lib/idemq-gr$1/ dir=$SID_ROOT/var/lib/idemq-gr$1
  if [[ -r $dir/mysqld.pid ]]; then
    pid=$(tr -dc '0-9' <"$dir/mysqld.pid")
    if [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == mysqld &&
      $(readlink "/proc/$pid/root" 2>/dev/null) == "$SID_ROOT" ]] &&
      tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$in"; then
      printf '%s\n' "$pid"
      return 0
    fi
  fi
  for pid in $(pgrep -x mysqld); do
    if [[ $(readlink "/proc/$pid/root" 2>/dev/null) == "$SID_ROOT" ]] &&
      tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$in"; then
      printf '%s\n' "$pid"
      return 0
    fi
  done
  return 1
}

# gr_sql N ARGS...: the root's mysql as root through node N's socket; a frozen node must not
# hang its caller (GR_SQL_TIMEOUT seconds; START GROUP_REPLICATION waits for the group).
gr_sql() {
  local n=$1
  shift
  sid_chroot_cmd
  timeout "${GR_SQL_TIMEOUT:-10}" "${SID_CMD[@]}" /usr/bin/mysql --defaults-file="/var/lib/idemq-gr$n/my.cnf" --user=root \
    --connect-timeout=2 --batch --skip-column-names "$@"
}

# gr_member N: node N's own member state and role as node N sees them ("OFFLINE -" outside a
# group, "? ?" when it does not answer).
gr_member() {
  local out
  out=$(gr_sql "$1" -e "SELECT IFNULL(MAX(MEMBER_STATE), 'OFFLINE'), IFNULL(NULLIF(MAX(MEMBER_ROLE), ''), '-')
    FROM performance_schema.replication_group_members WHERE MEMBER_ID = @@server_uuid" 2>/dev/null) || out=""
  [[ -n $out ]] || out=$'?\t?'
  printf '%s\n' "${out//$'\t'/ }"
}

# gr_has_majority N: node N is ONLINE in a group where more than half of the members are ONLINE
# (one that can commit).
gr_has_majority() {
  local out
  out=$(gr_sql "$1" -e "SELECT SUM(MEMBER_STATE = 'ONLINE') * 2 > COUNT(*)
      AND MAX(MEMBER_ID = @@server_uuid AND MEMBER_STATE = 'ONLINE')
    FROM performance_schema.replication_group_members" 2>/dev/null) || return 1
  [[ $out == 1 ]]
}

gr_fail() {
  local n=$1
  shift
  gr_vars "$n"
  warn "gr node $n: $*"
  show_tail "$GR_DIR/startup.log" "$GR_DIR/error.log"
  exit 1
}

# gr_group_name: the group's name, a UUID made from the state folder: a member of another
# folder's group (another checkout on the same ports) cannot join this one, nor this one's it.
gr_group_name() {
  local h
  h=$(printf '%s' "$SID_ROOT/var/lib/idemq-gr" | sha256sum)
  printf '%s-%s-%s-%s-%s\n' "${h:0:8}" "${h:8:4}" "${h:12:4}" "${h:16:4}" "${h:20:12}"
}

gr_write_cnf() {
  local n seeds=()
  for n in $(seq "$GR_SIZE"); do seeds+=("127.0.0.1:$((IDEMQ_GR_GCS_BASE + n - 1))"); done
  cat >"$GR_DIR/my.cnf" <<EOF
# Written by scripts/services; edits are overwritten at each start. Paths are inside the root
# $SID_ROOT.
# Clients: scripts/services gr-sql $GR ARGS (the root's mysql as root, through the socket)
[client]
socket = $GR_IN/sock
port = $GR_PORT
default-character-set = utf8mb4

[mysqld]
user = mysql
datadir = $GR_IN/data
socket = $GR_IN/sock
port = $GR_PORT
bind-address = 127.0.0.1
mysqlx = OFF
secure-file-priv =
pid-file = $GR_IN/mysqld.pid
log-error = $GR_IN/error.log
character-set-server = utf8mb4
max_connections = 200
max_connect_errors = 1000000
innodb_buffer_pool_size = 64M
innodb_redo_log_capacity = 64M
innodb_rollback_on_timeout = ON
# Group Replication: GTIDs, the binary log (on by default) and how the others reach this node.
server_id = $GR
gtid_mode = ON
enforce_gtid_consistency = ON
log_bin = binlog
report_host = 127.0.0.1
report_port = $GR_PORT
plugin_load_add = group_replication.so
# loose-: --initialize-insecure reads this file before the plugin is loaded.
loose-group_replication_group_name = $(gr_group_name)
loose-group_replication_start_on_boot = OFF
loose-group_replication_bootstrap_group = OFF
loose-group_replication_single_primary_mode = ON
loose-group_replication_local_address = 127.0.0.1:$GR_GCS
loose-group_replication_group_seeds = $(IFS=, && echo "${seeds[*]}")
loose-group_replication_ip_allowlist = 127.0.0.1/8
loose-group_replication_recovery_get_public_key = ON
# The Router's RW port takes the first node that accepts connections (node 1, 2, 3): the
# elections follow that order (the highest weight wins), so after the primary dies RW reaches
# the new primary as long as the lower nodes stay down.
loose-group_replication_member_weight = $((70 - 10 * GR))
# A member silent for 5 s (killed, frozen) is expelled at once rather than 5 s later: failover
# tests wait less for the new primary.
loose-group_replication_member_expel_timeout = 0
EOF
  chmod 644 "$GR_DIR/my.cnf"
}

# gr_prepare N: folder and my.cnf of node N, which is not running.
gr_prepare() {
  gr_vars "$1"
  mkdir -p "$GR_DIR"
  gr_write_cnf
  chroot "$SID_ROOT" chown mysql:mysql "$GR_IN"
  rm -f "$GR_DIR/sock" "$GR_DIR/sock.lock" "$GR_DIR/mysqld.pid"
}

# gr_init N: a new datadir for node N (about 10 s).
gr_init() {
  gr_prepare "$1"
  rm -rf "$GR_DIR/data"
  log "gr node $1: initialising a new data folder in $GR_DIR/data"
  if ! sid_chroot /usr/sbin/mysqld --defaults-file="$GR_CNF" --initialize-insecure --user=mysql \
    </dev/null >"$GR_DIR/install.log" 2>&1; then
    warn "gr node $1: mysqld --initialize-insecure failed"
    show_tail "$GR_DIR/install.log" "$GR_DIR/error.log"
    return 1
  fi
}

# gr_ports_free N: node N (not running) finds its ports free; else an error naming the owner.
gr_ports_free() {
  local p
  gr_vars "$1"
  for p in "$GR_PORT" "$GR_GCS"; do
    if port_open "$p"; then
      die "gr node $1: port 127.0.0.1:$p is already taken by a process that is not this node${NL}$(port_owner "$p")${NL}Pick other ports: IDEMQ_GR_PORT_BASE=... IDEMQ_GR_GCS_BASE=..."
    fi
  done
}

# gr_launch N: start node N's mysqld (not yet in the group), without waiting; the launcher's pid
# (which becomes mysqld) in launcher.pid.
gr_launch() {
  local n=$1
  gr_ports_free "$n"
  sid_sweep "gr node $n" "$GR_IN/" # a hung client, a server whose pid file is gone
  gr_prepare "$n"
  log "gr node $n: starting MySQL on 127.0.0.1:$GR_PORT (state in $GR_DIR)"
  sid_chroot_cmd
  # It must not hold the cluster's lock: a later stop would wait for it forever.
  (exec {GR_LOCK}>&- && exec setsid "${SID_CMD[@]}" /usr/sbin/mysqld --defaults-file="$GR_CNF" \
    --super-read-only=ON </dev/null >>"$GR_DIR/startup.log" 2>&1) &
  echo $! >"$GR_DIR/launcher.pid"
  disown $! 2>/dev/null || true
}

# gr_wait_answers N: until node N answers through its socket.
gr_wait_answers() {
  local n=$1 launcher deadline=$((SECONDS + IDEMQ_START_TIMEOUT))
  gr_vars "$n"
  launcher=$(cat "$GR_DIR/launcher.pid")
  until gr_sql "$n" -e 'SELECT 1' >/dev/null 2>&1 && port_open "$GR_PORT"; do
    kill -0 "$launcher" 2>/dev/null || gr_fail "$n" "mysqld exited during start-up"
    ((SECONDS < deadline)) || gr_fail "$n" "not answering after ${IDEMQ_START_TIMEOUT}s"
    sleep 0.3
  done
}

# gr_wait_online N: until node N is ONLINE in the group.
gr_wait_online() {
  local n=$1 m deadline=$((SECONDS + IDEMQ_START_TIMEOUT))
  while :; do
    m=$(gr_member "$n")
    [[ $m == ONLINE* ]] && return 0
    [[ $m != ERROR* ]] || gr_fail "$n" "its member state is ERROR"
    ((SECONDS < deadline)) || gr_fail "$n" "not ONLINE after ${IDEMQ_START_TIMEOUT}s (state, role: $m)"
    sleep 0.3
  done
}

# gr_recovery_user N: the recovery account and channel of node N, outside the binary log (each
# node has its own); idempotent. Node N is not in a group: super_read_only is still on.
gr_recovery_user() {
  gr_sql "$1" <<'EOF' || gr_fail "$1" "could not create the recovery user"
SET GLOBAL super_read_only = OFF;
SET SQL_LOG_BIN = 0;
CREATE USER IF NOT EXISTS 'idemq_gr_recovery'@'%' IDENTIFIED WITH caching_sha2_password BY 'idemq_gr_recovery';
GRANT REPLICATION SLAVE, CONNECTION_ADMIN, BACKUP_ADMIN, GROUP_REPLICATION_STREAM ON *.* TO 'idemq_gr_recovery'@'%';
SET SQL_LOG_BIN = 1;
CHANGE REPLICATION SOURCE TO SOURCE_USER = 'idemq_gr_recovery', SOURCE_PASSWORD = 'idemq_gr_recovery'
  FOR CHANNEL 'group_replication_recovery';
SET GLOBAL super_read_only = ON;
EOF
}

# gr_join N: node N (running, not in a group) joins the group; a member in ERROR leaves first.
gr_join() {
  local n=$1
  [[ $(gr_member "$n") == ERROR* ]] && gr_sql "$n" -e 'STOP GROUP_REPLICATION' >/dev/null 2>&1
  gr_recovery_user "$n"
  log "gr node $n: START GROUP_REPLICATION"
  GR_SQL_TIMEOUT=$IDEMQ_START_TIMEOUT gr_sql "$n" -e 'START GROUP_REPLICATION' >/dev/null || gr_fail "$n" "START GROUP_REPLICATION failed"
  gr_wait_online "$n"
}

# gr_bootstrap N: node N (running, not in a group) makes a new group of one, as its primary.
gr_bootstrap() {
  local n=$1
  gr_recovery_user "$n"
  log "gr node $n: bootstrapping the group"
  GR_SQL_TIMEOUT=$IDEMQ_START_TIMEOUT gr_sql "$n" <<'EOF' || gr_fail "$n" "bootstrapping the group failed"
SET GLOBAL group_replication_bootstrap_group = ON;
START GROUP_REPLICATION;
SET GLOBAL group_replication_bootstrap_group = OFF;
EOF
  gr_wait_online "$n"
}

# gr_provision N: database and account on primary N, idempotent; they replicate.
gr_provision() {
  gr_sql "$1" <<'EOF' || gr_fail "$1" "could not create the idemq database and user"
CREATE DATABASE IF NOT EXISTS idemq CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'idemq'@'%' IDENTIFIED WITH caching_sha2_password BY 'idemq';
GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'%' WITH GRANT OPTION;
EOF
}

# gr_pick_bootstrap N...: of the running nodes N..., the first whose gtid_executed contains
# every other's (the rule above); false when none does.
gr_pick_bootstrap() {
  local n m ok gtids=()
  for n in "$@"; do
    gtids[n]=$(gr_sql "$n" -e "SELECT REPLACE(@@GLOBAL.gtid_executed, '\n', '')") ||
      gr_fail "$n" "cannot read gtid_executed"
    log "gr node $n: gtid_executed ${gtids[n]:-(empty)}"
  done
  for n in "$@"; do
    ok=1
    for m in "$@"; do
      [[ $(gr_sql "$n" -e "SELECT GTID_SUBSET('${gtids[m]}', '${gtids[n]}')") == 1 ]] || ok=0
    done
    if ((ok)); then
      printf '%s\n' "$n"
      return 0
    fi
  done
  return 1
}

gr_lock() {
  exec {GR_LOCK}>"$STATE_DIR/gr.lock"
  flock "$GR_LOCK"
}
gr_unlock() { exec {GR_LOCK}>&-; }

gr_running() {
  local n
  for n in $(seq "$GR_SIZE"); do
    gr_pid "$n" >/dev/null && echo "$n"
  done
  return 0
}

# gr_group_node: a running node ONLINE in a group with a majority; false when there is none.
gr_group_node() {
  local n
  for n in $(gr_running); do
    gr_has_majority "$n" && { echo "$n"; return 0; }
  done
  return 1
}

# gr_in_group_blocked: some running node is in a group (ONLINE, RECOVERING, UNREACHABLE
# members) that has no majority.
gr_in_group_blocked() {
  local n
  for n in $(gr_running); do
    case $(gr_member "$n") in
      ONLINE* | RECOVERING*) return 0 ;;
    esac
  done
  return 1
}

# gr_force_hint: how a test unblocks the group of the first running node (its majority lost).
gr_force_hint() {
  local m
  m=$(gr_running | head -n 1)
  printf 'scripts/services gr-sql %s -e "SET GLOBAL group_replication_force_members='"'"'127.0.0.1:%s'"'"'"' \
    "$m" "$((IDEMQ_GR_GCS_BASE + m - 1))"
}

gr_prereqs() {
  is_root || die "gr: needs root (chroot and mounts)"
  sid_ensure_root
  sid_ensure_packages mysql-router
}

# gr_start: the whole group and the Router; running members are left alone.
gr_start() {
  local n t0 up=() down=() fresh=0 boot fails=0 jobs=() j
  gr_prereqs
  t0=$(now_s)
  gr_lock
  mapfile -t up < <(gr_running)
  for n in $(seq "$GR_SIZE"); do gr_pid "$n" >/dev/null || down+=("$n"); done
  for n in "${down[@]}"; do gr_ports_free "$n"; done # all before any node starts
  if boot=$(gr_group_node); then
    for n in "${down[@]}"; do gr_launch "$n"; done
    for n in "${down[@]}"; do gr_wait_answers "$n"; done
    for n in $(seq "$GR_SIZE"); do
      case $(gr_member "$n") in
        ONLINE*) ;;
        RECOVERING*) gr_wait_online "$n" ;;
        *) gr_join "$n" ;;
      esac
    done
  elif gr_in_group_blocked; then
    die "gr: the running nodes ${up[*]} are in a group without a majority: a joiner would hang. To unblock it: $(gr_force_hint)"
  else
    if [[ ! -e $SID_ROOT/var/lib/idemq-gr.initialized ]]; then
      fresh=1
      ((${#up[@]} == 0)) || die "gr: nodes ${up[*]} run, but the group was never formed: scripts/services stop-gr first"
      log "gr: initialising three new data folders (in parallel)"
      for n in $(seq "$GR_SIZE"); do
        gr_init "$n" &
        jobs+=($!)
      done
      for j in "${jobs[@]}"; do wait "$j" || fails=1; done
      ((fails == 0)) || die "gr: initialising a node failed"
    fi
    for n in "${down[@]}"; do gr_launch "$n"; done
    for n in "${down[@]}"; do gr_wait_answers "$n"; done
    if ((fresh)); then
      boot=1
    else
      # shellcheck disable=SC2046 # one number a line
      boot=$(gr_pick_bootstrap $(seq "$GR_SIZE")) ||
        die "gr: no node's gtid_executed contains all the others': the histories diverged (see gr-sql N -e 'SELECT @@GLOBAL.gtid_executed')"
      log "gr: node $boot has every transaction of the others: bootstrapping from it"
    fi
    gr_bootstrap "$boot"
    gr_provision "$boot"
    touch "$SID_ROOT/var/lib/idemq-gr.initialized"
    for n in $(seq "$GR_SIZE"); do
      ((n == boot)) || gr_join "$n"
    done
  fi
  gr_router_start
  gr_unlock
  log "gr: ready, $GR_SIZE members ONLINE on 127.0.0.1:$IDEMQ_GR_PORT_BASE..$((IDEMQ_GR_PORT_BASE + GR_SIZE - 1)), Router RW 127.0.0.1:$IDEMQ_GR_ROUTER_RW_PORT, RO 127.0.0.1:$IDEMQ_GR_ROUTER_RO_PORT ($(elapsed "$t0")s)"
}

# gr_start_node N: node N (re)joins the running group.
gr_start_node() {
  local n=$1 t0
  gr_prereqs
  t0=$(now_s)
  gr_lock
  if gr_pid "$n" >/dev/null && [[ $(gr_member "$n") == ONLINE* ]]; then
    gr_unlock
    log "gr node $n: already running and ONLINE"
    return 0
  fi
  if ! gr_group_node >/dev/null; then
    if gr_in_group_blocked; then
      die "gr: the running nodes are in a group without a majority: node $n would hang joining it. To unblock it: $(gr_force_hint)"
    fi
    die "gr: no group runs: scripts/services start-gr picks the node to bootstrap from"
  fi
  if ! gr_pid "$n" >/dev/null; then
    gr_launch "$n"
    gr_wait_answers "$n"
  fi
  gr_join "$n"
  gr_unlock
  log "gr node $n: ONLINE ($(elapsed "$t0")s)"
}

# gr_stop_node N: a clean shutdown of node N (a member leaves its group as it does), then
# whatever is left of it; idempotent.
gr_stop_node() {
  local n=$1 pid t0
  gr_vars "$n"
  if pid=$(gr_pid "$n"); then
    t0=$(now_s)
    kill -CONT "$pid" 2>/dev/null || true
    log "gr node $n: stopping (pid $pid)"
    # Leaving the group first takes about 3 s; a shutdown that leaves it takes 10 s more.
    GR_SQL_TIMEOUT=60 gr_sql "$n" -e 'STOP GROUP_REPLICATION' >/dev/null 2>&1 || true
    sid_chroot_cmd
    shutdown_pid "gr node $n" "$pid" mysqladmin \
      "${SID_CMD[@]}" /usr/bin/mysqladmin --defaults-file="$GR_CNF" --user=root
    rm -f "$GR_DIR/mysqld.pid"
    log "gr node $n: stopped ($(elapsed "$t0")s)"
  fi
  sid_sweep "gr node $n" "$GR_IN/"
}

# gr_stop: the Router, then the secondaries, the primary last (the next start-gr then finds
# every transaction on it, and no election happens on the way down). Frozen nodes are thawed
# first: the others would wait for them.
gr_stop() {
  local n pid primary="" others=() jobs=() j rc=0
  if ! is_root || [[ ! -e $SID_DONE ]]; then
    log "gr: not running"
    return 0
  fi
  gr_lock
  gr_router_stop
  for n in $(seq "$GR_SIZE"); do
    pid=$(gr_pid "$n") || continue
    kill -CONT "$pid" 2>/dev/null || true
  done
  for n in $(gr_running); do
    if [[ -z $primary && $(gr_member "$n") == "ONLINE PRIMARY" ]]; then primary=$n; else others+=("$n"); fi
  done
  ((${#others[@]})) || [[ -n $primary ]] || log "gr: not running"
  # The others at once (each takes a few seconds to leave and shut down), then the primary.
  for n in "${others[@]}"; do
    gr_stop_node "$n" &
    jobs+=($!)
  done
  for j in "${jobs[@]}"; do wait "$j" || rc=1; done
  ((rc == 0)) || die "gr: a node did not stop"
  [[ -z $primary ]] || gr_stop_node "$primary"
  for n in $(seq "$GR_SIZE"); do gr_vars "$n" && sid_sweep "gr node $n" "$GR_IN/"; done
  gr_unlock
}

gr_kill_node() {
  local pid
  is_root || die "gr: needs root"
  pid=$(gr_pid "$1") || die "gr node $1 is not running"
  kill -KILL "$pid"
  wait_gone "$pid" 10 || die "gr node $1: pid $pid survived kill -9"
  log "gr node $1: killed (pid $pid)"
}

gr_signal_node() {
  local pid
  is_root || die "gr: needs root"
  pid=$(gr_pid "$1") || die "gr node $1 is not running"
  kill -"$2" "$pid"
  log "gr node $1: $3 (pid $pid)"
}

# ----------------------------------------------------------------------------- MySQL Router
gr_router_dir() { printf '%s\n' "$SID_ROOT$GR_ROUTER_IN"; }

gr_router_pid() {
  local pid dir
  dir=$(gr_router_dir)
  [[ -r $dir/mysqlrouter.pid ]] || return 1
  pid=$(tr -dc '0-9' <"$dir/mysqlrouter.pid")
  [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == mysqlrouter &&
    $(readlink "/proc/$pid/root" 2>/dev/null) == "$SID_ROOT" ]] || return 1
  printf '%s\n' "$pid"
}

gr_router_start() {
  local dir n dests=() pid launcher deadline=$((SECONDS + IDEMQ_START_TIMEOUT)) p
  dir=$(gr_router_dir)
  if pid=$(gr_router_pid); then
    log "gr router: already running (pid $pid)"
    return 0
  fi
  for p in "$IDEMQ_GR_ROUTER_RW_PORT" "$IDEMQ_GR_ROUTER_RO_PORT"; do
    if port_open "$p"; then
      die "gr router: port 127.0.0.1:$p is already taken by a process that is not this project's Router${NL}$(port_owner "$p")${NL}Pick others: IDEMQ_GR_ROUTER_RW_PORT=... IDEMQ_GR_ROUTER_RO_PORT=..."
    fi
  done
  sid_sweep "gr router" "$GR_ROUTER_IN/"
  for n in $(seq "$GR_SIZE"); do dests+=("127.0.0.1:$((IDEMQ_GR_PORT_BASE + n - 1))"); done
  mkdir -p "$dir/log" "$dir/run" "$dir/data"
  cat >"$dir/mysqlrouter.conf" <<EOF
# Written by scripts/services; edits are overwritten at each start. Paths are inside the root
# $SID_ROOT. Static routing: without MySQL Shell there is no InnoDB Cluster metadata, so the
# Router does not know which node is primary (see scripts/services.d/gr.sh).
[DEFAULT]
user = mysql
logging_folder = $GR_ROUTER_IN/log
runtime_folder = $GR_ROUTER_IN/run
data_folder = $GR_ROUTER_IN/data

[logger]
level = INFO

[routing:rw]
bind_address = 127.0.0.1
bind_port = $IDEMQ_GR_ROUTER_RW_PORT
destinations = $(IFS=, && echo "${dests[*]}")
routing_strategy = first-available
protocol = classic
client_ssl_mode = PASSTHROUGH

[routing:ro]
bind_address = 127.0.0.1
bind_port = $IDEMQ_GR_ROUTER_RO_PORT
destinations = $(IFS=, && echo "${dests[*]}")
routing_strategy = round-robin
protocol = classic
client_ssl_mode = PASSTHROUGH
EOF
  chmod 644 "$dir/mysqlrouter.conf"
  chroot "$SID_ROOT" chown -R mysql:mysql "$GR_ROUTER_IN"
  rm -f "$dir/mysqlrouter.pid"
  log "gr router: starting MySQL Router, RW 127.0.0.1:$IDEMQ_GR_ROUTER_RW_PORT, RO 127.0.0.1:$IDEMQ_GR_ROUTER_RO_PORT"
  sid_chroot_cmd
  (exec {GR_LOCK}>&- && exec setsid "${SID_CMD[@]}" /usr/bin/mysqlrouter -c "$GR_ROUTER_IN/mysqlrouter.conf" \
    --pid-file "$GR_ROUTER_IN/mysqlrouter.pid" </dev/null >>"$dir/startup.log" 2>&1) &
  launcher=$!
  disown "$launcher" 2>/dev/null || true
  until port_open "$IDEMQ_GR_ROUTER_RW_PORT" && port_open "$IDEMQ_GR_ROUTER_RO_PORT" && gr_router_pid >/dev/null; do
    if ! kill -0 "$launcher" 2>/dev/null || ((SECONDS >= deadline)); then
      warn "gr router: not listening (exited, or not after ${IDEMQ_START_TIMEOUT}s)"
      show_tail "$dir/startup.log" "$dir/log/mysqlrouter.log"
      exit 1
    fi
    sleep 0.2
  done
}

gr_router_stop() {
  local pid t0
  if pid=$(gr_router_pid); then
    t0=$(now_s)
    kill -CONT "$pid" 2>/dev/null || true
    kill -TERM "$pid" 2>/dev/null || true
    wait_stopped "gr router" "$pid"
    log "gr router: stopped ($(elapsed "$t0")s)"
  fi
  sid_sweep "gr router" "$GR_ROUTER_IN/"
}

# gr_router_where PORT: which node a new connection through the Router's PORT reaches.
gr_router_where() {
  timeout 5 mariadb --no-defaults --protocol=tcp --host=127.0.0.1 --port="$1" --user=idemq --password=idemq \
    --connect-timeout=2 --batch --skip-column-names \
    -e "SELECT CONCAT('node ', @@server_id, ' (127.0.0.1:', @@port, IF(@@super_read_only, ', read-only', ', writable'), ')')" 2>/dev/null ||
    echo "no answer"
}

gr_status() {
  local n pid rc=0 frozen members
  is_root || { echo "gr: needs root"; return 1; }
  for n in $(seq "$GR_SIZE"); do
    if pid=$(gr_pid "$n"); then
      frozen=""
      [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == T ]] && frozen=" (frozen)"
      echo "gr node $n: running$frozen, pid $pid, $(gr_url "$n"), member state and role: $(gr_member "$n")"
    else
      echo "gr node $n: not running ($(gr_url "$n"), started by: scripts/services start-gr)"
      rc=1
    fi
  done
  for n in $(gr_running); do
    members=$(gr_sql "$n" -e "SELECT CONCAT('  ', MEMBER_HOST, ':', MEMBER_PORT, ' ', MEMBER_STATE, ' ', MEMBER_ROLE)
      FROM performance_schema.replication_group_members ORDER BY MEMBER_PORT" 2>/dev/null) || continue
    echo "gr: replication_group_members as node $n sees them:"
    printf '%s\n' "$members"
    break
  done
  if pid=$(gr_router_pid); then
    echo "gr router: running, pid $pid; RW 127.0.0.1:$IDEMQ_GR_ROUTER_RW_PORT (first-available) reaches $(gr_router_where "$IDEMQ_GR_ROUTER_RW_PORT"); RO 127.0.0.1:$IDEMQ_GR_ROUTER_RO_PORT (round-robin)"
  else
    echo "gr router: not running"
    rc=1
  fi
  return "$rc"
}

gr_client() {
  local n=$1
  shift
  is_root || die "gr: needs root (chroot)"
  gr_vars "$n"
  [[ -e $GR_DIR/my.cnf ]] || die "gr node $n: never started here: scripts/services start-gr"
  sid_chroot /usr/bin/mysql --defaults-file="$GR_CNF" --user=root "$@"
}

# Its lines of .state/env (write_env), whether it runs or not.
gr_env() {
  local n urls=()
  for n in $(seq "$GR_SIZE"); do urls+=("$(gr_url "$n")"); done
  echo "# The 3-node MySQL 9.7 Group Replication cluster (sid root), started only by \"\$IDEMQ_SERVICES\" start-gr; root: gr-sql N ARGS."
  echo "# Its Router routes statically (RW: first node that accepts, not necessarily the primary; RO: round-robin)"
  printf 'export IDEMQ_TEST_GR_URLS=%s\n' "$(IFS=, && echo "${urls[*]}")"
  printf 'export IDEMQ_TEST_GR_ROUTER_URL=%s\n' "mysql://idemq:idemq@127.0.0.1:$IDEMQ_GR_ROUTER_RW_PORT/idemq"
  printf 'export IDEMQ_TEST_GR_ROUTER_RO_URL=%s\n' "mysql://idemq:idemq@127.0.0.1:$IDEMQ_GR_ROUTER_RO_PORT/idemq"
  printf 'export IDEMQ_GR_PORT_BASE=%q IDEMQ_GR_GCS_BASE=%q IDEMQ_GR_ROUTER_RW_PORT=%q IDEMQ_GR_ROUTER_RO_PORT=%q\n' \
    "$IDEMQ_GR_PORT_BASE" "$IDEMQ_GR_GCS_BASE" "$IDEMQ_GR_ROUTER_RW_PORT" "$IDEMQ_GR_ROUTER_RO_PORT"
}

# The interface (common.sh): not part of `start` nor of "all up" in `status` (its status is
# never false); `stop` stops it where it can run.
svc_gr_stop() { gr_stop; }
svc_gr_status() {
  is_root && [[ -e $SID_DONE ]] || return 0
  gr_status || true
}
