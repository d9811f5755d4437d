# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): the two MySQL 9.7 servers, run
# from the Debian sid root.

# ----------------------------------------------------------------------------- MySQL 9.7
# Two MySQL 9.7 servers (sid's mysql-server-core) run with chroot from the sid root, as root:
# mysqld drops to the root's mysql user itself (--user). Each keeps everything in one folder of
# the root, /var/lib/idemq-NAME (host path $SID_ROOT/var/lib/idemq-NAME): my.cnf, data/ (the
# datadir, which --initialize-insecure wants empty: the pid file, socket and error log sit beside
# it), certs/ (copies of the test PKI's CA and server certificate, from the TLS MariaDB's,
# readable by mysql: the root cannot see $MARIA_TLS_CERTS). A server is recognised by its pid file, its root
# (/proc/PID/root) and its folder in its command line.
#   mysql97      127.0.0.1:$IDEMQ_MYSQL97_PORT, plaintext or TLS, as clients choose
#   mysql97-tls  127.0.0.1 and 127.0.0.2:$IDEMQ_MYSQL97_TLS_PORT, require_secure_transport=ON
# Binary logging (on by default in MySQL) is off, as in the MariaDB servers.
M97_NAMES=(mysql97 mysql97-tls)

# m97_vars NAME: the settings of server NAME (mysql97 or mysql97-tls) in M97_* variables.
m97_vars() {
  M97=$1
  case $1 in
    mysql97) M97_PORT=$IDEMQ_MYSQL97_PORT M97_BIND=127.0.0.1 M97_TLS_ONLY=0 M97_POOL=256M ;;
    mysql97-tls) M97_PORT=$IDEMQ_MYSQL97_TLS_PORT M97_BIND=127.0.0.1,127.0.0.2 M97_TLS_ONLY=1 M97_POOL=64M ;;
    *) die "unknown MySQL server $1" ;;
  esac
  M97_IN=/var/lib/idemq-$1  # inside the root
  M97_DIR=$SID_ROOT$M97_IN  # the same folder from the host
  M97_CNF=$M97_IN/my.cnf    # paths given to the root's programs are inside the root
  M97_SOCKET=$M97_DIR/sock  # the socket from the host (IDEMQ_TEST_MYSQL97*_SOCKET)
}

# m97_skipped: true (with the reason on stdout) when start/restart/status leave MySQL 9.7 out.
m97_skipped() {
  if [[ ${IDEMQ_SKIP_MYSQL97:-0} == 1 ]]; then
    echo "IDEMQ_SKIP_MYSQL97=1"
  elif ! is_root; then
    echo "needs root (chroot and mounts)"
  else
    return 1
  fi
}

m97_pid() {
  local pid
  [[ -r $M97_DIR/mysqld.pid ]] || return 1
  pid=$(tr -dc '0-9' <"$M97_DIR/mysqld.pid")
  [[ -n $pid && $(cat "/proc/$pid/comm" 2>/dev/null) == mysqld &&
    $(readlink "/proc/$pid/root" 2>/dev/null) == "$SID_ROOT" ]] || return 1
  tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$M97_IN/" || return 1
  printf '%s\n' "$pid"
}

# m97_admin ARGS... / m97_sql ARGS...: the root's mysqladmin / mysql as the server's root user,
# through its socket (root has no password, as --initialize-insecure makes it).
m97_admin() { sid_chroot /usr/bin/mysqladmin --defaults-file="$M97_CNF" --user=root "$@"; }
m97_sql() { sid_chroot /usr/bin/mysql --defaults-file="$M97_CNF" --user=root --batch --skip-column-names "$@"; }

m97_fail() {
  warn "$M97: $*"
  show_tail "$M97_DIR/startup.log" "$M97_DIR/error.log"
  exit 1
}

# m97_lock / m97_unlock: one start or stop of a server at a time (parallel test runs, a start
# in the background). The server must not inherit the lock's descriptor (see m97_start).
m97_lock() {
  exec {M97_LOCK}>"$STATE_DIR/$M97.lock"
  flock "$M97_LOCK"
}
m97_unlock() { exec {M97_LOCK}>&-; }

# m97_prepare: folder, certificates and my.cnf; rewritten at each start, so edits do not last.
m97_prepare() {
  maria_tls_paths
  maria_tls_certs
  mkdir -p "$M97_DIR/certs"
  install -m 644 "$MARIA_TLS_CERTS/ca.pem" "$MARIA_TLS_CERTS/server.pem" "$M97_DIR/certs/"
  install -m 600 "$MARIA_TLS_CERTS/server.key" "$M97_DIR/certs/"
  # The plain server offers no TLS at all, like the plain MariaDB: what a client does there
  # (caching_sha2_password's RSA key exchange; "mode required" against a server without TLS)
  # is tested on it. MySQL makes its own certificates unless tls_version is empty.
  local tls_lines="# No TLS: caching_sha2_password logins exchange the password with the server's RSA key
tls_version =
admin_tls_version ="
  ((M97_TLS_ONLY)) && tls_lines="ssl_ca = $M97_IN/certs/ca.pem
ssl_cert = $M97_IN/certs/server.pem
ssl_key = $M97_IN/certs/server.key
require_secure_transport = ON"
  cat >"$M97_DIR/my.cnf" <<EOF
# Written by scripts/services; edits are overwritten at each start. Paths are inside the root
# $SID_ROOT.
# Clients: scripts/services $M97 ARGS (the root's mysql as root, through the socket)
[client]
socket = $M97_IN/sock
port = $M97_PORT
default-character-set = utf8mb4

[mysqld]
user = mysql
datadir = $M97_IN/data
socket = $M97_IN/sock
port = $M97_PORT
bind-address = $M97_BIND
mysqlx = OFF
secure-file-priv =
pid-file = $M97_IN/mysqld.pid
log-error = $M97_IN/error.log
skip-log-bin
character-set-server = utf8mb4
max_connections = 500
max_connect_errors = 1000000
innodb_buffer_pool_size = $M97_POOL
# As on the main MariaDB: a lock wait timeout rolls back the whole transaction.
innodb_rollback_on_timeout = ON
$tls_lines
EOF
  chmod 644 "$M97_DIR/my.cnf"
  chroot "$SID_ROOT" chown mysql:mysql "$M97_IN" "$M97_IN/certs" "$M97_IN/certs/ca.pem" \
    "$M97_IN/certs/server.pem" "$M97_IN/certs/server.key"
  rm -f "$M97_DIR/sock" "$M97_DIR/sock.lock" "$M97_DIR/mysqld.pid"
}

# m97_init: a new datadir on first start (about 10 s). .initialized marks a completed first
# start (initialisation and accounts); anything else in data/ is a leftover of an interrupted
# one and is thrown away.
m97_init() {
  [[ -e $M97_DIR/.initialized ]] && return 0
  rm -rf "$M97_DIR/data"
  log "$M97: initialising a new data folder in $M97_DIR/data"
  if ! sid_chroot /usr/sbin/mysqld --defaults-file="$M97_CNF" --initialize-insecure --user=mysql \
    </dev/null >"$M97_DIR/install.log" 2>&1; then
    warn "$M97: mysqld --initialize-insecure failed"
    show_tail "$M97_DIR/install.log" "$M97_DIR/error.log"
    exit 1
  fi
}

# m97_provision: database and account, idempotent, at every start (cheap), so a broken grant or
# a changed password heals. (The test of a first plaintext login, which needs the server's RSA
# key, makes an account of its own: a new account's cache entry is cold for sure.)
m97_provision() {
  m97_sql --database=mysql <<'EOF' || m97_fail "could not create the idemq database and users"
CREATE DATABASE IF NOT EXISTS idemq CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'idemq'@'%' IDENTIFIED WITH caching_sha2_password BY 'idemq';
ALTER USER 'idemq'@'%' IDENTIFIED WITH caching_sha2_password BY 'idemq';
GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'%' WITH GRANT OPTION;
EOF
  if [[ ! -e $M97_DIR/.initialized ]]; then
    touch "$M97_DIR/.initialized"
    log "$M97: created database idemq and user idemq (password idemq)"
  fi
}

# m97_start NAME: start server NAME (building the root first if need be) and wait until it
# answers through its socket and on its port; a running one is left alone.
m97_start() {
  m97_vars "$1"
  is_root || die "$M97: needs root (chroot and mounts); IDEMQ_SKIP_MYSQL97=1 leaves it out"
  sid_ensure_root
  m97_lock
  m97_start_locked
  m97_unlock
}

# m97_answers: the server answers through its socket and its port is open.
m97_answers() { m97_admin --connect-timeout=2 ping >/dev/null 2>&1 && port_open "$M97_PORT"; }

m97_start_locked() {
  local pid t0 where=${M97_BIND//,/ and }:$M97_PORT
  ((M97_TLS_ONLY)) && where+=", TLS only"
  if pid=$(m97_pid); then
    log "$M97: already running (pid $pid)"
    return 0
  fi
  sid_sweep "$M97" "$M97_IN/" # a server whose pid file is gone, a hung client
  local ip port_var=IDEMQ_MYSQL97_PORT
  ((M97_TLS_ONLY)) && port_var=IDEMQ_MYSQL97_TLS_PORT
  for ip in ${M97_BIND//,/ }; do
    # shellcheck disable=SC2016 # $1 and $2 are expanded by the inner bash
    if timeout 3 bash -c 'exec 3<>"/dev/tcp/$1/$2"' _ "$ip" "$M97_PORT" 2>/dev/null; then
      die "$M97: port $ip:$M97_PORT is already taken by a process that is not this project's server${NL}$(port_owner "$M97_PORT")${NL}Stop it, or pick another port: $port_var=..."
    fi
  done
  t0=$(now_s)
  m97_prepare
  ((${#M97_SOCKET} < 100)) ||
    warn "$M97: the socket's path from the host, $M97_SOCKET, is too long for a unix socket: host clients cannot use it (scripts/services $M97 can); a shorter IDEMQ_STATE_DIR fixes that"
  m97_init
  log "$M97: starting on $where (state in $M97_DIR)"
  sid_chroot_cmd
  # setsid, as for the other servers; the launcher becomes mysqld (exec all the way down). It
  # must not hold the lock: a later stop would wait for it forever.
  (exec {M97_LOCK}>&- && exec setsid "${SID_CMD[@]}" /usr/sbin/mysqld --defaults-file="$M97_CNF" \
    </dev/null >>"$M97_DIR/startup.log" 2>&1) &
  local launcher=$!
  disown "$launcher" 2>/dev/null || true
  await_ready "$launcher" m97_fail m97_answers
  m97_provision
  log "$M97: ready on ${M97_BIND//,/ and }:$M97_PORT and $M97_SOCKET (pid $(m97_pid), $(elapsed "$t0")s)"
}

# m97_stop NAME: a clean shutdown, then whatever is left of the server; idempotent.
m97_stop() {
  m97_vars "$1"
  if ! is_root || [[ ! -e $SID_DONE ]]; then
    log "$M97: not running"
    return 0
  fi
  m97_lock
  m97_stop_locked
  m97_unlock
}

m97_stop_locked() {
  local pid t0
  t0=$(now_s)
  if pid=$(m97_pid); then
    log "$M97: stopping (pid $pid)"
    shutdown_pid "$M97" "$pid" mysqladmin m97_admin
    sid_sweep "$M97" "$M97_IN/"
    rm -f "$M97_DIR/mysqld.pid"
    log "$M97: stopped ($(elapsed "$t0")s)"
  else
    sid_sweep "$M97" "$M97_IN/"
    log "$M97: not running"
  fi
}

m97_status() {
  m97_vars "$1"
  maria_tls_paths
  local pid why version
  if why=$(m97_skipped); then
    echo "$M97: left out ($why)"
    return 0
  fi
  if pid=$(m97_pid); then
    if m97_admin --connect-timeout=2 ping >/dev/null 2>&1; then
      version=$(sed -n 's/^mysql-server-core //p' "$SID_DONE")
      if ((M97_TLS_ONLY)); then
        echo "$M97: running, pid $pid, mysql://idemq:idemq@127.0.0.1:$M97_PORT/idemq (TLS only, also on 127.0.0.2, CA $MARIA_TLS_CERTS/ca.pem), socket $M97_SOCKET (MySQL $version)"
      else
        echo "$M97: running, pid $pid, mysql://idemq:idemq@127.0.0.1:$M97_PORT/idemq (TLS optional, CA $MARIA_TLS_CERTS/ca.pem), socket $M97_SOCKET (MySQL $version)"
      fi
      return 0
    fi
    echo "$M97: process $pid is up but does not answer (starting or stopping?)"
    return 1
  fi
  if port_open "$M97_PORT"; then
    echo "$M97: not running; 127.0.0.1:$M97_PORT is taken by another process $(port_owner "$M97_PORT")"
  else
    echo "$M97: not running"
  fi
  return 1
}

# m97_client NAME ARGS...: the root's mysql client as the server's root user, through the
# socket, ARGS and stdin passed through (scripts/services mysql97 | mysql97-tls).
m97_client() {
  m97_vars "$1"
  shift
  is_root || die "$M97: needs root (chroot)"
  [[ -e $M97_DIR/my.cnf ]] || die "$M97: never started here: scripts/services start-$M97"
  sid_chroot /usr/bin/mysql --defaults-file="$M97_CNF" --user=root "$@"
}

# m97_bg_start: start both servers in the background (the root may be built, and a datadir
# initialised, while the others start); m97_bg_wait: their outcome. Nothing when left out.
m97_bg_start() {
  local why name
  M97_JOBS=()
  if why=$(m97_skipped); then
    log "mysql97, mysql97-tls: left out ($why)"
    return 0
  fi
  maria_tls_paths
  maria_tls_certs # made once here rather than by the three servers that use them at once
  for name in "${M97_NAMES[@]}"; do
    m97_start "$name" &
    M97_JOBS+=($!)
  done
}
m97_bg_wait() {
  local job rc=0
  for job in "${M97_JOBS[@]}"; do
    wait "$job" || rc=1
  done
  ((rc == 0)) || die "mysql97: start failed (IDEMQ_SKIP_MYSQL97=1 leaves MySQL 9.7 out)"
}

# Its lines of .state/env (write_env), when it is not left out.
m97_env() {
  m97_skipped >/dev/null && return 0
  echo "# MySQL 9.7 (Debian sid root): root through \"\$IDEMQ_SERVICES\" mysql97 | mysql97-tls; IDEMQ_TEST_DB=mysql points the"
  echo "# mariadb commands at them. TLS: the CA is \$IDEMQ_TEST_MYSQL_TLS_DIR/ca.pem (optional on mysql97, required on mysql97-tls)"
  m97_vars mysql97
  printf 'export IDEMQ_TEST_MYSQL97_URL=%s\n' "mysql://idemq:idemq@127.0.0.1:$M97_PORT/idemq"
  printf 'export IDEMQ_TEST_MYSQL97_SOCKET=%q\n' "$M97_SOCKET"
  m97_vars mysql97-tls
  printf 'export IDEMQ_TEST_MYSQL97_TLS_URL=%s\n' "mysql://idemq:idemq@127.0.0.1:$M97_PORT/idemq"
  printf 'export IDEMQ_TEST_MYSQL97_TLS_SOCKET=%q\n' "$M97_SOCKET"
  printf 'export IDEMQ_MYSQL97_PORT=%q IDEMQ_MYSQL97_TLS_PORT=%q\n' "$IDEMQ_MYSQL97_PORT" "$IDEMQ_MYSQL97_TLS_PORT"
  printf 'export IDEMQ_SID_ROOT=%q\n' "$SID_ROOT"
}

# The interface (common.sh): mysql97 is both servers (mysql97 and mysql97-tls). prepare is for
# servers that are not running (their start calls it); start and wait are the background start
# of `start` and its outcome, nothing when MySQL 9.7 is left out.
svc_mysql97_prepare() {
  local name
  is_root || die "mysql97: needs root (chroot and mounts); IDEMQ_SKIP_MYSQL97=1 leaves it out"
  sid_ensure_root
  for name in "${M97_NAMES[@]}"; do
    m97_vars "$name"
    m97_prepare
  done
}
svc_mysql97_start() { m97_bg_start; }
svc_mysql97_wait() { m97_bg_wait; }
svc_mysql97_stop() {
  local name
  for name in "${M97_NAMES[@]}"; do m97_stop "$name"; done
}
svc_mysql97_status() {
  local name rc=0
  for name in "${M97_NAMES[@]}"; do m97_status "$name" || rc=1; done
  return "$rc"
}
svc_mysql97_skipped() { m97_skipped; }
