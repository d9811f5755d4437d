# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): MariaDB and the TLS-only
# MariaDB.

# ----------------------------------------------------------------------------- MariaDB
maria_pid() { pid_matches "$MARIA_DIR/mariadbd.pid" mariadbd "$MARIA_DIR"; }

maria_write_cnf() {
  local user_line="# runs as the invoking user"
  if is_root; then
    user_line="user = mysql"
  fi
  cat >"$MARIA_CNF" <<EOF
# Written by scripts/services; edits are overwritten at each start.
# Clients: mariadb --defaults-file=$MARIA_CNF --user=root
[client]
socket = $MARIA_SOCKET
port = $IDEMQ_MYSQL_PORT
default-character-set = utf8mb4

[mysqld]
$user_line
datadir = $MARIA_DIR/data
socket = $MARIA_SOCKET
port = $IDEMQ_MYSQL_PORT
bind-address = 127.0.0.1
pid-file = $MARIA_DIR/mariadbd.pid
log-error = $MARIA_DIR/error.log
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
max_connections = 500
max_connect_errors = 1000000
innodb_buffer_pool_size = 256M
# Production servers often run with this ON: a lock wait timeout then rolls back the whole
# transaction, which idemq must notice (tests/integration/test_transaction_guard.c).
innodb_rollback_on_timeout = ON
EOF
  chmod 644 "$MARIA_CNF"
}

maria_init() {
  # .initialized marks a completed first initialisation; anything else in data/ is a leftover
  # of an interrupted one and is thrown away.
  [[ -e $MARIA_DIR/.initialized ]] && return 0
  rm -rf "$MARIA_DIR/data"
  log "mariadb: initialising a new data folder in $MARIA_DIR/data"
  local args=(--defaults-file="$MARIA_CNF" --auth-root-authentication-method=normal --skip-test-db)
  is_root && args+=(--user=mysql)
  if ! mariadb-install-db "${args[@]}" >"$MARIA_DIR/install.log" 2>&1; then
    warn "mariadb: mariadb-install-db failed"
    show_tail "$MARIA_DIR/install.log"
    exit 1
  fi
}

maria_fail() {
  warn "mariadb: $*"
  show_tail "$MARIA_DIR/startup.log" "$MARIA_DIR/error.log"
  exit 1
}

# Accounts and database: idempotent, run at every start (cheap), so a broken grant heals.
maria_provision() {
  local first=0
  [[ -e $MARIA_DIR/.initialized ]] || first=1
  maria_sql --database=mysql <<'EOF' || maria_fail "could not create the idemq database and user"
-- Anonymous accounts would shadow 'idemq'@'%' for connections from localhost.
DELETE FROM mysql.global_priv WHERE User = '';
FLUSH PRIVILEGES;
CREATE DATABASE IF NOT EXISTS idemq CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'idemq'@'127.0.0.1' IDENTIFIED BY 'idemq';
CREATE USER IF NOT EXISTS 'idemq'@'localhost' IDENTIFIED BY 'idemq';
CREATE USER IF NOT EXISTS 'idemq'@'%' IDENTIFIED BY 'idemq';
GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'localhost' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'%' WITH GRANT OPTION;
EOF
  if ((first)); then
    touch "$MARIA_DIR/.initialized"
    log "mariadb: created database idemq and user idemq (password idemq)"
  fi
}

# maria_prepare: folder, my.cnf, data (initialised on first start), for a server that is not
# running (it removes the socket and pid file).
maria_prepare() {
  mkdir -p "$MARIA_DIR"
  if is_root; then
    chown mysql:mysql "$MARIA_DIR"
  fi
  rm -f "$MARIA_SOCKET" "$MARIA_DIR/mariadbd.pid"
  maria_write_cnf
  maria_init
}

# maria_answers: the server answers through its socket and on its port.
maria_answers() {
  maria_admin --connect-timeout=2 ping >/dev/null 2>&1 &&
    mariadb-admin --no-defaults --protocol=tcp --host=127.0.0.1 --port="$IDEMQ_MYSQL_PORT" \
      --user=root --connect-timeout=2 ping >/dev/null 2>&1
}

maria_start() {
  local pid t0
  if pid=$(maria_pid); then
    log "mariadb: already running (pid $pid)"
    return 0
  fi
  if port_open "$IDEMQ_MYSQL_PORT"; then
    die "mariadb: port 127.0.0.1:$IDEMQ_MYSQL_PORT is already taken by a process that is not this project's server${NL}$(port_owner "$IDEMQ_MYSQL_PORT")${NL}Stop it (a system server: 'systemctl stop mariadb'), or pick another port: IDEMQ_MYSQL_PORT=..."
  fi
  t0=$(now_s)
  maria_prepare
  log "mariadb: starting on 127.0.0.1:$IDEMQ_MYSQL_PORT (state in $MARIA_DIR)"
  (cd "$MARIA_DIR" && exec setsid mariadbd --defaults-file="$MARIA_CNF" \
    </dev/null >>"$MARIA_DIR/startup.log" 2>&1) &
  local launcher=$!
  disown "$launcher" 2>/dev/null || true
  await_ready "$launcher" maria_fail maria_answers
  maria_provision
  log "mariadb: ready on 127.0.0.1:$IDEMQ_MYSQL_PORT and $MARIA_SOCKET (pid $(maria_pid), $(elapsed "$t0")s)"
}

maria_stop() {
  local pid t0
  if ! pid=$(maria_pid); then
    log "mariadb: not running"
    return 0
  fi
  t0=$(now_s)
  log "mariadb: stopping (pid $pid)"
  shutdown_pid mariadb "$pid" mariadb-admin maria_admin
  log "mariadb: stopped ($(elapsed "$t0")s)"
}

maria_status() {
  local pid
  if pid=$(maria_pid); then
    if maria_admin --connect-timeout=2 ping >/dev/null 2>&1; then
      echo "mariadb: running, pid $pid, mysql://idemq:idemq@127.0.0.1:$IDEMQ_MYSQL_PORT/idemq, socket $MARIA_SOCKET"
      return 0
    fi
    echo "mariadb: process $pid is up but does not answer (starting or stopping?)"
    return 1
  fi
  if port_open "$IDEMQ_MYSQL_PORT"; then
    echo "mariadb: not running; 127.0.0.1:$IDEMQ_MYSQL_PORT is taken by another process $(port_owner "$IDEMQ_MYSQL_PORT")"
  else
    echo "mariadb: not running"
  fi
  return 1
}

# ----------------------------------------------------------------------------- MariaDB with TLS
# Its folder is not named mariadb-*: pid_matches recognises the main server by its folder
# appearing in the command line, and a prefix would match this one too.
maria_tls_paths() {
  MARIA_TLS_DIR=$SERVER_DIR/tls-mariadb
  MARIA_TLS_CERTS=$MARIA_TLS_DIR/certs
  MARIA_TLS_SOCKET=$MARIA_TLS_DIR/sock
  MARIA_TLS_CNF=$MARIA_TLS_DIR/my.cnf
}

maria_tls_pid() { pid_matches "$MARIA_TLS_DIR/mariadbd.pid" mariadbd "$MARIA_TLS_DIR"; }
maria_tls_admin() { mariadb-admin --defaults-file="$MARIA_TLS_CNF" --user=root "$@"; }
maria_tls_sql() { mariadb --defaults-file="$MARIA_TLS_CNF" --user=root --batch --skip-column-names "$@"; }

maria_tls_fail() {
  warn "mariadb-tls: $*"
  show_tail "$MARIA_TLS_DIR/startup.log" "$MARIA_TLS_DIR/error.log" "$LOG_DIR/tls.log"
  exit 1
}

maria_tls_write_cnf() {
  local user_line="# runs as the invoking user"
  if is_root; then
    user_line="user = mysql"
  fi
  cat >"$MARIA_TLS_CNF" <<EOF
# Written by scripts/services; edits are overwritten at each start.
# Clients: mariadb --defaults-file=$MARIA_TLS_CNF --user=root (the socket needs no TLS)
[client]
socket = $MARIA_TLS_SOCKET
port = $IDEMQ_MYSQL_TLS_PORT
default-character-set = utf8mb4

[mysqld]
$user_line
datadir = $MARIA_TLS_DIR/data
socket = $MARIA_TLS_SOCKET
port = $IDEMQ_MYSQL_TLS_PORT
bind-address = 127.0.0.1,127.0.0.2
pid-file = $MARIA_TLS_DIR/mariadbd.pid
log-error = $MARIA_TLS_DIR/error.log
character-set-server = utf8mb4
collation-server = utf8mb4_general_ci
max_connections = 200
max_connect_errors = 1000000
innodb_buffer_pool_size = 64M
ssl_ca = $MARIA_TLS_CERTS/ca.pem
ssl_cert = $MARIA_TLS_CERTS/server.pem
ssl_key = $MARIA_TLS_CERTS/server.key
require_secure_transport = ON
EOF
  chmod 644 "$MARIA_TLS_CNF"
}

# maria_tls_prepare: folder, certificates, my.cnf, data (initialised on first start), for a
# server that is not running (it removes the socket and pid file).
maria_tls_prepare() {
  maria_tls_paths
  mkdir -p "$MARIA_TLS_DIR"
  if is_root; then
    chown mysql:mysql "$MARIA_TLS_DIR"
  fi
  rm -f "$MARIA_TLS_SOCKET" "$MARIA_TLS_DIR/mariadbd.pid"
  maria_tls_certs
  maria_tls_write_cnf
  # .initialized marks a completed first initialisation, as for the main server.
  if [[ ! -e $MARIA_TLS_DIR/.initialized ]]; then
    rm -rf "$MARIA_TLS_DIR/data"
    log "mariadb-tls: initialising a new data folder in $MARIA_TLS_DIR/data"
    local args=(--defaults-file="$MARIA_TLS_CNF" --auth-root-authentication-method=normal --skip-test-db)
    is_root && args+=(--user=mysql)
    mariadb-install-db "${args[@]}" >"$MARIA_TLS_DIR/install.log" 2>&1 ||
      maria_tls_fail "mariadb-install-db failed (log: $MARIA_TLS_DIR/install.log)"
  fi
}

# maria_tls_answers: the server answers through its socket and, over TLS, on its port.
maria_tls_answers() {
  maria_tls_admin --connect-timeout=2 ping >/dev/null 2>&1 &&
    mariadb-admin --no-defaults --protocol=tcp --host=127.0.0.1 --port="$IDEMQ_MYSQL_TLS_PORT" \
      --ssl --ssl-ca="$MARIA_TLS_CERTS/ca.pem" --user=root --connect-timeout=2 ping >/dev/null 2>&1
}

maria_tls_start() {
  maria_tls_paths
  local pid t0
  if pid=$(maria_tls_pid); then
    log "mariadb-tls: already running (pid $pid)"
    return 0
  fi
  if port_open "$IDEMQ_MYSQL_TLS_PORT"; then
    die "mariadb-tls: port 127.0.0.1:$IDEMQ_MYSQL_TLS_PORT is already taken by a process that is not this project's TLS server${NL}$(port_owner "$IDEMQ_MYSQL_TLS_PORT")${NL}Stop it, or pick another port: IDEMQ_MYSQL_TLS_PORT=..."
  fi
  t0=$(now_s)
  maria_tls_prepare
  log "mariadb-tls: starting on 127.0.0.1 and 127.0.0.2:$IDEMQ_MYSQL_TLS_PORT, TLS only (state in $MARIA_TLS_DIR)"
  (cd "$MARIA_TLS_DIR" && exec setsid mariadbd --defaults-file="$MARIA_TLS_CNF" \
    </dev/null >>"$MARIA_TLS_DIR/startup.log" 2>&1) &
  local launcher=$!
  disown "$launcher" 2>/dev/null || true
  await_ready "$launcher" maria_tls_fail maria_tls_answers
  # The same accounts as the main server (maria_provision), idempotent, every start.
  maria_tls_sql --database=mysql <<'EOF' || maria_tls_fail "could not create the idemq database and user"
DELETE FROM mysql.global_priv WHERE User = '';
FLUSH PRIVILEGES;
CREATE DATABASE IF NOT EXISTS idemq CHARACTER SET utf8mb4;
CREATE USER IF NOT EXISTS 'idemq'@'127.0.0.1' IDENTIFIED BY 'idemq';
CREATE USER IF NOT EXISTS 'idemq'@'localhost' IDENTIFIED BY 'idemq';
CREATE USER IF NOT EXISTS 'idemq'@'%' IDENTIFIED BY 'idemq';
GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'127.0.0.1' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'localhost' WITH GRANT OPTION;
GRANT ALL PRIVILEGES ON *.* TO 'idemq'@'%' WITH GRANT OPTION;
EOF
  touch "$MARIA_TLS_DIR/.initialized"
  log "mariadb-tls: ready on 127.0.0.1:$IDEMQ_MYSQL_TLS_PORT (pid $(maria_tls_pid), $(elapsed "$t0")s)"
}

maria_tls_stop() {
  maria_tls_paths
  local pid t0
  if ! pid=$(maria_tls_pid); then
    log "mariadb-tls: not running"
    return 0
  fi
  t0=$(now_s)
  log "mariadb-tls: stopping (pid $pid)"
  shutdown_pid mariadb-tls "$pid" mariadb-admin maria_tls_admin
  log "mariadb-tls: stopped ($(elapsed "$t0")s)"
}

maria_tls_status() {
  maria_tls_paths
  local pid
  if pid=$(maria_tls_pid); then
    if maria_tls_admin --connect-timeout=2 ping >/dev/null 2>&1; then
      echo "mariadb-tls: running, pid $pid, mysql://idemq:idemq@127.0.0.1:$IDEMQ_MYSQL_TLS_PORT/idemq (TLS only, CA $MARIA_TLS_CERTS/ca.pem)"
      return 0
    fi
    echo "mariadb-tls: process $pid is up but does not answer (starting or stopping?)"
    return 1
  fi
  if port_open "$IDEMQ_MYSQL_TLS_PORT"; then
    echo "mariadb-tls: not running; 127.0.0.1:$IDEMQ_MYSQL_TLS_PORT is taken by another process $(port_owner "$IDEMQ_MYSQL_TLS_PORT")"
  else
    echo "mariadb-tls: not running"
  fi
  return 1
}

# Its lines of .state/env (write_env).
maria_tls_env() {
  maria_tls_paths
  echo "# The TLS-only MariaDB: root through \"\$IDEMQ_SERVICES\" mariadb-tls (its socket needs no TLS)"
  printf 'export IDEMQ_TEST_MYSQL_TLS_URL=%s\n' "mysql://idemq:idemq@127.0.0.1:$IDEMQ_MYSQL_TLS_PORT/idemq"
  printf 'export IDEMQ_TEST_MYSQL_TLS_DIR=%q\n' "$MARIA_TLS_CERTS"
  printf 'export IDEMQ_TEST_MYSQL_TLS_SOCKET=%q\n' "$MARIA_TLS_SOCKET"
  printf 'export IDEMQ_MYSQL_TLS_PORT=%q\n' "$IDEMQ_MYSQL_TLS_PORT"
}

# The interface (common.sh) of mariadb and mariadb-tls: start waits until the server answers
# (a second or two), so there is no wait step.
svc_mariadb_prepare() { maria_prepare; }
svc_mariadb_start() { maria_start; }
svc_mariadb_stop() { maria_stop; }
svc_mariadb_status() { maria_status; }
svc_mariadb_tls_prepare() { maria_tls_prepare; }
svc_mariadb_tls_start() { maria_tls_start; }
svc_mariadb_tls_stop() { maria_tls_stop; }
svc_mariadb_tls_status() { maria_tls_status; }
