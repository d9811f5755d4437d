# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): the 3-node MariaDB Galera
# cluster.

# ----------------------------------------------------------------------------- Galera cluster
# Three MariaDB 10.11 nodes (the host's mariadbd) with galera-4 on loopback, for the database
# failover tests (plain `start` does not start them, plain `stop` stops them). Node N (1..3):
# SQL on 127.0.0.1:IDEMQ_GALERA_PORT_BASE+N-1, group communication (gcomm) on
# IDEMQ_GALERA_GCOMM_BASE+N-1, IST on IDEMQ_GALERA_IST_BASE+N-1, rsync SST on
# IDEMQ_GALERA_SST_BASE+N-1, everything of it in $GALERA_DIR/nodeN (my.cnf, data/, sock,
# mariadbd.pid, error.log). Database idemq, user idemq/idemq with ALL ON *.* WITH GRANT OPTION,
# root without password through each node's socket.
#
# Node 1 is initialised with mariadb-install-db; nodes 2 and 3 start empty and join by SST.
# Data is kept across stops (a start from existing state is an ordinary restart); the cluster
# is made anew only when its first formation never completed ($GALERA_DIR/.initialized).
#
# Which node bootstraps a new primary component when no node runs (start-galera, and
# start-galera-node N, which bootstraps only the node this rule picks and refuses any other):
#   1. the node whose grastate.dat says safe_to_bootstrap: 1 (Galera writes it for the last
#      node of a cleanly stopped cluster: stop-galera stops node 1 last, so usually node 1);
#   2. else (every node crashed or was killed) the highest seqno, from grastate.dat or, where
#      that says -1 (the node was running when it died), from `mariadbd --wsrep-recover`; on a
#      tie the lowest node number. Its grastate.dat is then set to safe_to_bootstrap: 1, as
#      Galera's documentation says to do by hand.
# That node starts with --wsrep-new-cluster, the others join it (IST or SST), one at a time.
# Running nodes without a primary component (two of three killed: the survivor answers 1047)
# are not bootstrapped by anything here: start-galera-node refuses to join them, since a
# joiner would wait for a primary that never comes. A failure test that wants the survivor back
# says so: galera-sql N -e "SET GLOBAL wsrep_provider_options='pc.bootstrap=YES'".
#
# A node is recognised by its pid file or, while that does not exist yet (mariadbd writes it
# after an SST), by a mariadbd whose command line names its folder: a second mariadbd on a
# running node's data folder once took all three nodes down.
GALERA_SIZE=3

galera_vars() {
  GN=$1
  GN_DIR=$GALERA_DIR/node$1
  GN_CNF=$GN_DIR/my.cnf
  GN_PORT=$((IDEMQ_GALERA_PORT_BASE + $1 - 1))
  GN_GCOMM=$((IDEMQ_GALERA_GCOMM_BASE + $1 - 1))
  GN_IST=$((IDEMQ_GALERA_IST_BASE + $1 - 1))
  GN_SST=$((IDEMQ_GALERA_SST_BASE + $1 - 1))
}

galera_url() { printf 'mysql://idemq:idemq@127.0.0.1:%s/idemq\n' "$((IDEMQ_GALERA_PORT_BASE + $1 - 1))"; }

galera_node_arg() {
  if [[ ! ${1:-} =~ ^[1-9][0-9]*$ ]] || (($1 > GALERA_SIZE)); then
    die "expected a Galera node number 1..$GALERA_SIZE, got '${1:-}'"
  fi
  printf '%s\n' "$1"
}

# galera_pid N: the pid of node N's mariadbd (see above), false when it does not run.
galera_pid() {
  local pid dir=$GALERA_DIR/node$1/
  if pid=$(pid_matches "${dir}mariadbd.pid" mariadbd "$dir"); then
    printf '%s\n' "$pid"
    return 0
  fi
  for pid in $(pgrep -x mariadbd); do
    if tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "${dir}my.cnf"; then
      printf '%s\n' "$pid"
      return 0
    fi
  done
  return 1
}

# galera_procs N: every process of node N (mariadbd, its SST script and rsync daemon, a client
# through its socket): whatever names its folder in its command line.
galera_procs() {
  local pid dir=$GALERA_DIR/node$1/
  for pid in $(pgrep -f -- "$dir"); do
    [[ $pid != "$$" && $pid != "$BASHPID" ]] && printf '%s\n' "$pid"
  done
}

# galera_sql N ARGS...: the mariadb client as root through node N's socket; a frozen node must
# not hang its caller, hence the timeout.
galera_sql() {
  local n=$1
  shift
  timeout 5 mariadb --defaults-file="$GALERA_DIR/node$n/my.cnf" --user=root --connect-timeout=2 \
    --batch --skip-column-names "$@"
}

# galera_wsrep N: node N's wsrep status as "size state ready status" (4 ? ? ? when it does not
# answer).
galera_wsrep() {
  local out
  out=$(galera_sql "$1" -e "SELECT
      MAX(IF(VARIABLE_NAME = 'WSREP_CLUSTER_SIZE', VARIABLE_VALUE, NULL)),
      MAX(IF(VARIABLE_NAME = 'WSREP_LOCAL_STATE_COMMENT', VARIABLE_VALUE, NULL)),
      MAX(IF(VARIABLE_NAME = 'WSREP_READY', VARIABLE_VALUE, NULL)),
      MAX(IF(VARIABLE_NAME = 'WSREP_CLUSTER_STATUS', VARIABLE_VALUE, NULL))
    FROM information_schema.GLOBAL_STATUS" 2>/dev/null) || out=""
  [[ -n $out ]] || out=$'?\t?\t?\t?'
  printf '%s\n' "${out//$'\t'/ }"
}

galera_fail() {
  local n=$1
  shift
  warn "galera node $n: $*"
  show_tail "$GALERA_DIR/node$n/startup.log" "$GALERA_DIR/node$n/error.log"
  exit 1
}

galera_write_cnf() {
  local user_line="# runs as the invoking user" n addrs=()
  is_root && user_line="user = mysql"
  for n in $(seq "$GALERA_SIZE"); do addrs+=("127.0.0.1:$((IDEMQ_GALERA_GCOMM_BASE + n - 1))"); done
  cat >"$GN_CNF" <<EOF
# Written by scripts/services; edits are overwritten at each start.
# Clients: scripts/services galera-sql $GN ARGS (mariadb --defaults-file=$GN_CNF --user=root)
[client]
socket = $GN_DIR/sock
port = $GN_PORT
default-character-set = utf8mb4

[mysqld]
$user_line
datadir = $GN_DIR/data
socket = $GN_DIR/sock
port = $GN_PORT
bind-address = 127.0.0.1
pid-file = $GN_DIR/mariadbd.pid
log-error = $GN_DIR/error.log
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
max_connections = 200
max_connect_errors = 1000000
innodb_buffer_pool_size = 64M
innodb_log_file_size = 32M
innodb_rollback_on_timeout = ON
# Galera replicates row events of InnoDB tables, and needs interleaved auto-increment locks.
binlog_format = ROW
default_storage_engine = InnoDB
innodb_autoinc_lock_mode = 2

wsrep_on = ON
wsrep_provider = /usr/lib/galera/libgalera_smm.so
# Named after its state folder: a node of another folder's cluster (another checkout on the
# same ports) is refused at the handshake instead of merging with this one.
wsrep_cluster_name = idemq-galera-$(printf '%s' "$GALERA_DIR" | sha256sum | cut -c1-12)
wsrep_cluster_address = gcomm://$(IFS=, && echo "${addrs[*]}")
wsrep_node_name = node$GN
wsrep_node_address = 127.0.0.1:$GN_GCOMM
wsrep_node_incoming_address = 127.0.0.1:$GN_PORT
wsrep_sst_method = rsync
wsrep_sst_receive_address = 127.0.0.1:$GN_SST
# Every port on loopback and distinct per node (all three share one address). A 64 MB gcache
# lets a node that was down for a while come back by IST rather than a full SST.
wsrep_provider_options = "base_host=127.0.0.1; base_port=$GN_GCOMM; gmcast.listen_addr=tcp://127.0.0.1:$GN_GCOMM; ist.recv_addr=127.0.0.1:$GN_IST; gcache.size=64M"
EOF
  chmod 644 "$GN_CNF"
}

# galera_prepare N: folder and my.cnf of node N, which is not running.
galera_prepare() {
  galera_vars "$1"
  mkdir -p "$GN_DIR/data"
  is_root && chown mysql:mysql "$GN_DIR" "$GN_DIR/data"
  rm -f "$GN_DIR/sock" "$GN_DIR/mariadbd.pid"
  galera_write_cnf
}

# galera_ports_free N: node N (not running) finds its ports free; else an error naming the owner
# (another state folder's cluster on the default ports, say).
galera_ports_free() {
  local p
  galera_vars "$1"
  for p in "$GN_PORT" "$GN_GCOMM" "$GN_IST" "$GN_SST"; do
    if port_open "$p"; then
      die "galera node $1: port 127.0.0.1:$p is already taken by a process that is not this node${NL}$(port_owner "$p")${NL}Pick other ports: IDEMQ_GALERA_PORT_BASE=... IDEMQ_GALERA_GCOMM_BASE=... IDEMQ_GALERA_IST_BASE=... IDEMQ_GALERA_SST_BASE=..."
    fi
  done
}

# galera_launch N [ARGS...]: start node N's mariadbd with ARGS (--wsrep-new-cluster), without
# waiting; its pid in $GN_DIR/launcher.pid.
galera_launch() {
  local n=$1
  shift
  galera_ports_free "$n"
  # A leftover of this node (an SST's rsync daemon holding its port) would fail its start.
  sweep "galera node $n" galera_procs "$n"
  galera_prepare "$n"
  log "galera node $n: starting on 127.0.0.1:$GN_PORT${1:+ ($*)} (state in $GN_DIR)"
  # The server must not inherit the cluster's lock (a later stop would wait for it forever).
  (exec {GALERA_LOCK}>&- && cd "$GN_DIR" && exec setsid mariadbd --defaults-file="$GN_CNF" "$@" \
    </dev/null >>"$GN_DIR/startup.log" 2>&1) &
  echo $! >"$GN_DIR/launcher.pid"
  disown $! 2>/dev/null || true
}

# galera_wait N SIZE: until node N is Synced, wsrep_ready and sees SIZE nodes in a primary
# component (a joiner's SST comes first: minutes on a big database, seconds here).
galera_wait() {
  local n=$1 size=$2 launcher ws deadline=$((SECONDS + IDEMQ_START_TIMEOUT))
  launcher=$(cat "$GALERA_DIR/node$n/launcher.pid")
  while :; do
    ws=$(galera_wsrep "$n")
    [[ $ws == "$size Synced ON Primary" ]] && return 0
    kill -0 "$launcher" 2>/dev/null || galera_fail "$n" "mariadbd exited during start-up"
    ((SECONDS < deadline)) ||
      galera_fail "$n" "not Synced in a primary component of $size after ${IDEMQ_START_TIMEOUT}s (size, state, ready, status: $ws)"
    sleep 0.3
  done
}

# galera_grastate N KEY: KEY (seqno, safe_to_bootstrap, uuid) from node N's grastate.dat.
galera_grastate() {
  sed -n "s/^$2:[[:space:]]*//p" "$GALERA_DIR/node$1/data/grastate.dat" 2>/dev/null | head -n 1
}

# galera_seqno N: node N's last committed seqno: grastate.dat's, or when that is -1 (it was
# running when it died), InnoDB's as `mariadbd --wsrep-recover` reads it; -1 when unknown.
galera_seqno() {
  local n=$1 seqno log
  seqno=$(galera_grastate "$n" seqno)
  if [[ $seqno == -1 ]]; then
    galera_prepare "$n"
    log=$GN_DIR/recover.log
    : >"$log"
    is_root && chown mysql:mysql "$log"
    mariadbd --defaults-file="$GN_CNF" --wsrep-recover --log-error="$log" >/dev/null 2>&1 || true
    seqno=$(sed -n 's/.*WSREP: Recovered position: [^:]*:\(-\{0,1\}[0-9]*\).*/\1/p' "$log" | tail -n 1)
  fi
  printf '%s\n' "${seqno:--1}"
}

# galera_pick_bootstrap: the node to bootstrap with no node running (the rule above), after
# marking it safe_to_bootstrap; false when no node has Galera state.
galera_pick_bootstrap() {
  local n seqno best=0 best_seqno=-2
  for n in $(seq "$GALERA_SIZE"); do
    [[ -s $GALERA_DIR/node$n/data/grastate.dat ]] || continue
    if [[ $(galera_grastate "$n" safe_to_bootstrap) == 1 ]]; then
      log "galera: node $n has safe_to_bootstrap: 1 (it left the cluster last, or was bootstrapped last)"
      printf '%s\n' "$n"
      return 0
    fi
  done
  for n in $(seq "$GALERA_SIZE"); do
    [[ -s $GALERA_DIR/node$n/data/grastate.dat ]] || continue
    seqno=$(galera_seqno "$n")
    log "galera: node $n: last committed seqno $seqno"
    if ((seqno > best_seqno)); then
      best=$n best_seqno=$seqno
    fi
  done
  ((best)) || return 1
  log "galera: no node left the cluster last; node $best has the highest seqno ($best_seqno)"
  printf '%s\n' "$best"
}

# galera_bootstrap N: start node N as a new primary component (galera_pick_bootstrap's node,
# which Galera accepts only once its grastate.dat says safe_to_bootstrap: 1).
galera_bootstrap() {
  local state=$GALERA_DIR/node$1/data/grastate.dat
  if [[ -s $state && $(galera_grastate "$1" safe_to_bootstrap) != 1 ]]; then
    sed -i 's/^safe_to_bootstrap:.*/safe_to_bootstrap: 1/' "$state"
    log "galera node $1: set safe_to_bootstrap: 1 in its grastate.dat"
  fi
  galera_launch "$1" --wsrep-new-cluster
  galera_wait "$1" 1
}

# galera_provision: database and account, idempotent; DDL, so Galera replicates it to every node.
galera_provision() {
  galera_sql "$1" --database=mysql <<'EOF' || galera_fail "$1" "could not create the idemq database and user"
-- Anonymous accounts would shadow 'idemq'@'%' for connections from localhost.
DROP USER IF EXISTS ''@'localhost';
DROP USER IF EXISTS ''@'%';
CREATE DATABASE IF NOT EXISTS idemq CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'idemq'@'127.0.0.1' IDENTIFIED BY 'idemq';
CREATE USER IF NOT EXISTS 'idemq'@'localhost' IDENTIFIED BY 'idemq';
CREATE USER IF NOT EXISTS 'idemq'@'%' IDENTIFIED BY 'idemq';
GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'localhost' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'%' WITH GRANT OPTION;
EOF
}

# galera_lock / galera_unlock: one start or stop of the cluster or a node at a time.
galera_lock() {
  mkdir -p "$GALERA_DIR"
  exec {GALERA_LOCK}>"$GALERA_DIR/.lock"
  flock "$GALERA_LOCK"
}
galera_unlock() { exec {GALERA_LOCK}>&-; }

# galera_running: the numbers of the running nodes, one a line.
galera_running() {
  local n
  for n in $(seq "$GALERA_SIZE"); do
    galera_pid "$n" >/dev/null && echo "$n"
  done
  return 0
}

# galera_primary_node: a running node that is in a primary component (false when none is).
galera_primary_node() {
  local n ws
  for n in $(galera_running); do
    ws=$(galera_wsrep "$n")
    [[ $ws == *" Primary" ]] && { echo "$n"; return 0; }
  done
  return 1
}

# galera_init: a new cluster: node 1 initialised by mariadb-install-db (the others start empty
# and join by SST).
galera_init() {
  log "galera: initialising a new cluster in $GALERA_DIR (node 1 with mariadb-install-db)"
  rm -rf "${GALERA_DIR:?}"/node[0-9]*
  galera_prepare 1
  local args=(--defaults-file="$GN_CNF" --auth-root-authentication-method=normal --skip-test-db)
  is_root && args+=(--user=mysql)
  if ! mariadb-install-db "${args[@]}" >"$GN_DIR/install.log" 2>&1; then
    warn "galera node 1: mariadb-install-db failed"
    show_tail "$GN_DIR/install.log"
    exit 1
  fi
}

galera_start() {
  local n t0 up down=() boot
  command -v mariadbd >/dev/null 2>&1 || die "galera: mariadbd is not installed (scripts/setup)"
  [[ -e /usr/lib/galera/libgalera_smm.so ]] || die "galera: galera-4 is not installed (scripts/setup installs it)"
  command -v rsync >/dev/null 2>&1 || die "galera: rsync (its SST) is not installed (scripts/setup installs it)"
  t0=$(now_s)
  galera_lock
  mapfile -t up < <(galera_running)
  for n in $(seq "$GALERA_SIZE"); do
    galera_pid "$n" >/dev/null || down+=("$n")
  done
  if ((${#down[@]} == 0)); then
    galera_unlock
    log "galera: already running (nodes ${up[*]})"
    return 0
  fi
  # Every port first: a node bootstrapped next to a foreign cluster's nodes would be a mess.
  for n in "${down[@]}"; do galera_ports_free "$n"; done
  if ((${#up[@]} == 0)); then
    if [[ ! -e $GALERA_DIR/.initialized ]] || ! boot=$(galera_pick_bootstrap); then
      galera_init
      boot=1
    fi
    galera_bootstrap "$boot"
    galera_provision "$boot"
    touch "$GALERA_DIR/.initialized"
    up=("$boot")
    down=()
    for n in $(seq "$GALERA_SIZE"); do ((n == boot)) || down+=("$n"); done
  elif ! galera_primary_node >/dev/null; then
    die "galera: nodes ${up[*]} run but none is in a primary component: a joiner would wait forever (see 'galera-sql N' and pc.bootstrap in scripts/services.d/galera.sh)"
  fi
  # One joiner at a time: a donor serves one SST at a time.
  for n in "${down[@]}"; do
    galera_launch "$n"
    up+=("$n")
    galera_wait "$n" "${#up[@]}"
  done
  galera_unlock
  log "galera: ready, $GALERA_SIZE nodes Synced on 127.0.0.1:$IDEMQ_GALERA_PORT_BASE..$((IDEMQ_GALERA_PORT_BASE + GALERA_SIZE - 1)) ($(elapsed "$t0")s)"
}

# galera_start_node N: start node N alone: it joins the running primary component; with no node
# running, it bootstraps one only when the rule above picks it.
galera_start_node() {
  local n=$1 t0 up boot primary
  t0=$(now_s)
  galera_lock
  if galera_pid "$n" >/dev/null; then
    galera_unlock
    log "galera node $n: already running"
    return 0
  fi
  mapfile -t up < <(galera_running)
  if ((${#up[@]} == 0)); then
    [[ -e $GALERA_DIR/.initialized ]] || die "galera: never formed here: scripts/services start-galera"
    boot=$(galera_pick_bootstrap) || die "galera: no node has Galera state: scripts/services start-galera"
    ((boot == n)) || die "galera: no node runs, and node $boot, not $n, is the one to bootstrap from (start-galera-node $boot first, or start-galera)"
    galera_bootstrap "$n"
  else
    primary=$(galera_primary_node) ||
      die "galera: nodes ${up[*]} run but none is in a primary component: node $n would wait forever to join. To make one: scripts/services galera-sql ${up[0]} -e \"SET GLOBAL wsrep_provider_options='pc.bootstrap=YES'\""
    log "galera node $n: joining the primary component of node $primary"
    galera_launch "$n"
    galera_wait "$n" "$((${#up[@]} + 1))"
  fi
  galera_unlock
  log "galera node $n: ready ($(elapsed "$t0")s)"
}

# galera_stop_node N: a clean shutdown of node N, then whatever is left of it; idempotent.
galera_stop_node() {
  local n=$1 pid t0
  galera_vars "$n"
  if pid=$(galera_pid "$n"); then
    t0=$(now_s)
    kill -CONT "$pid" 2>/dev/null || true # a frozen node would not stop
    log "galera node $n: stopping (pid $pid)"
    shutdown_pid "galera node $n" "$pid" mariadb-admin \
      mariadb-admin --defaults-file="$GN_CNF" --user=root
    log "galera node $n: stopped ($(elapsed "$t0")s)"
  fi
  sweep "galera node $n" galera_procs "$n"
}

# galera_stop: node by node, node 1 last, so that node 1 is the one with safe_to_bootstrap: 1
# and the next start-galera bootstraps from it. Frozen nodes are thawed first: the others would
# wait for them.
galera_stop() {
  local n pid any=0
  [[ -d $GALERA_DIR ]] || { log "galera: not running"; return 0; }
  galera_lock
  for n in $(seq "$GALERA_SIZE"); do
    if pid=$(galera_pid "$n"); then
      any=1
      kill -CONT "$pid" 2>/dev/null || true
    fi
  done
  for n in $(seq "$GALERA_SIZE" -1 1); do galera_stop_node "$n"; done
  galera_unlock
  ((any)) || log "galera: not running"
}

galera_kill_node() {
  local pid
  pid=$(galera_pid "$1") || die "galera node $1 is not running"
  kill -KILL "$pid"
  wait_gone "$pid" 10 || die "galera node $1: pid $pid survived kill -9"
  log "galera node $1: killed (pid $pid)"
}

# galera_signal_node N SIGNAL WHAT: SIGSTOP / SIGCONT node N's mariadbd (a hung node: its
# sockets stay open; the others evict it after a few seconds of silence).
galera_signal_node() {
  local pid
  pid=$(galera_pid "$1") || die "galera node $1 is not running"
  kill -"$2" "$pid"
  log "galera node $1: $3 (pid $pid)"
}

galera_status() {
  local n pid rc=0 size state ready status frozen
  for n in $(seq "$GALERA_SIZE"); do
    if pid=$(galera_pid "$n"); then
      frozen=""
      [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == T ]] && frozen=" (frozen)"
      read -r size state ready status <<<"$(galera_wsrep "$n")"
      echo "galera node $n: running$frozen, pid $pid, $(galera_url "$n"), wsrep_cluster_size=$size wsrep_local_state_comment=$state wsrep_ready=$ready wsrep_cluster_status=$status"
    else
      echo "galera node $n: not running ($(galera_url "$n"), started by: scripts/services start-galera)"
      rc=1
    fi
  done
  return "$rc"
}

galera_client() {
  galera_vars "$1"
  shift
  [[ -e $GN_CNF ]] || die "galera node $GN: never started here: scripts/services start-galera"
  mariadb --defaults-file="$GN_CNF" --user=root "$@"
}

# Its lines of .state/env (write_env), whether it runs or not.
galera_env() {
  local n urls=()
  for n in $(seq "$GALERA_SIZE"); do urls+=("$(galera_url "$n")"); done
  echo "# The 3-node MariaDB Galera cluster, started only by \"\$IDEMQ_SERVICES\" start-galera; root: galera-sql N ARGS"
  printf 'export IDEMQ_TEST_GALERA_URLS=%s\n' "$(IFS=, && echo "${urls[*]}")"
  printf 'export IDEMQ_GALERA_PORT_BASE=%q IDEMQ_GALERA_GCOMM_BASE=%q IDEMQ_GALERA_IST_BASE=%q IDEMQ_GALERA_SST_BASE=%q\n' \
    "$IDEMQ_GALERA_PORT_BASE" "$IDEMQ_GALERA_GCOMM_BASE" "$IDEMQ_GALERA_IST_BASE" "$IDEMQ_GALERA_SST_BASE"
}

# The interface (common.sh): not part of `start` nor of "all up" in `status` (its status is
# never false); `stop` stops it.
svc_galera_prepare() {
  local n
  for n in $(seq "$GALERA_SIZE"); do galera_pid "$n" >/dev/null || galera_prepare "$n"; done
}
svc_galera_stop() { galera_stop; }
svc_galera_status() { galera_status || true; }
