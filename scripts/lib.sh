#!/usr/bin/env bash
# shellcheck disable=SC2034 # globals set here are used by the scripts that source this file
# Shared helpers for scripts/setup, scripts/services and scripts/test. Source it; don't run it.
#
# Everything here can be overridden from the environment:
#   IDEMQ_AMQP_PORT           AMQP listener on 127.0.0.1            (default 5672)
#   IDEMQ_AMQPS_PORT          its TLS listener, 127.0.0.1           (default AMQP port - 1: 5671)
#   IDEMQ_MYSQL_PORT          MariaDB listener on 127.0.0.1         (default 3306)
#   IDEMQ_MYSQL_TLS_PORT      the TLS-only MariaDB, 127.0.0.1 and 127.0.0.2 (default 3307)
#   IDEMQ_MYSQL97_PORT        MySQL 9.7 listener on 127.0.0.1       (default 3316)
#   IDEMQ_MYSQL97_TLS_PORT    the TLS-only MySQL 9.7, 127.0.0.1 and 127.0.0.2 (default 3317)
#   IDEMQ_SKIP_MYSQL97=1      scripts/services start|restart|status leave both MySQL 9.7 out
#   IDEMQ_RABBITMQ_DIST_PORT  Erlang distribution port, 127.0.0.1   (default AMQP port + 20000)
#   IDEMQ_RABBITMQ_NODE       RabbitMQ node name                    (default rabbit@localhost)
#   IDEMQ_AMQP4_PORT          AMQP listener of RabbitMQ 4.x         (default 5674)
#   IDEMQ_RABBITMQ4_DIST_PORT its Erlang distribution port          (default AMQP4 port + 20000)
#   IDEMQ_RABBITMQ4_EPMD_PORT its own epmd, on 127.0.0.1            (default 4370)
#   IDEMQ_RABBITMQ4_NODE      its node name                         (default rabbit4@localhost)
#   IDEMQ_DEBIAN_MIRROR       mirror for its Debian 13 root and for the Debian sid root of
#                             MySQL 9.7                             (default: apt's, else
#                                                                    http://deb.debian.org/debian)
#   IDEMQ_SKIP_BROKER4=1      scripts/services start|restart|status and scripts/test leave it out
#   IDEMQ_CLUSTER_PORT_BASE   AMQP listener of cluster node 1; nodes 2 and 3 take the next two
#                             (default 5681: 5681..5683; only `services start-cluster` starts it)
#   IDEMQ_CLUSTER_DIST_BASE   Erlang distribution port of node 1, then +1, +2 (default port
#                             base + 20000)
#   IDEMQ_CLUSTER_NODE_PREFIX cluster node names PREFIX1@localhost..PREFIX3@localhost (default c)
#   IDEMQ_START_TIMEOUT       seconds to wait for a server to be ready (default 120)
#   IDEMQ_STATE_DIR           state folder                          (default $ROOT/.state)
# A second, independent set of services on one machine needs distinct ports and node name.
set -euo pipefail # the scripts that source this file run this way too

if [[ -n ${IDEMQ_LIB_SOURCED:-} ]]; then
  return 0
fi
IDEMQ_LIB_SOURCED=1

ROOT=$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd -P)
STATE_DIR=${IDEMQ_STATE_DIR:-$ROOT/.state}
LOG_DIR=$STATE_DIR/logs
ENV_FILE=$STATE_DIR/env

IDEMQ_AMQP_PORT=${IDEMQ_AMQP_PORT:-5672}
IDEMQ_AMQPS_PORT=${IDEMQ_AMQPS_PORT:-$((IDEMQ_AMQP_PORT - 1))}
IDEMQ_MYSQL_PORT=${IDEMQ_MYSQL_PORT:-3306}
IDEMQ_MYSQL_TLS_PORT=${IDEMQ_MYSQL_TLS_PORT:-3307}
IDEMQ_MYSQL97_PORT=${IDEMQ_MYSQL97_PORT:-3316}
IDEMQ_MYSQL97_TLS_PORT=${IDEMQ_MYSQL97_TLS_PORT:-3317}
IDEMQ_RABBITMQ_DIST_PORT=${IDEMQ_RABBITMQ_DIST_PORT:-$((IDEMQ_AMQP_PORT + 20000))}
IDEMQ_RABBITMQ_NODE=${IDEMQ_RABBITMQ_NODE:-rabbit@localhost}
IDEMQ_AMQP4_PORT=${IDEMQ_AMQP4_PORT:-5674}
IDEMQ_RABBITMQ4_DIST_PORT=${IDEMQ_RABBITMQ4_DIST_PORT:-$((IDEMQ_AMQP4_PORT + 20000))}
IDEMQ_RABBITMQ4_EPMD_PORT=${IDEMQ_RABBITMQ4_EPMD_PORT:-4370}
IDEMQ_RABBITMQ4_NODE=${IDEMQ_RABBITMQ4_NODE:-rabbit4@localhost}
IDEMQ_CLUSTER_PORT_BASE=${IDEMQ_CLUSTER_PORT_BASE:-5681}
IDEMQ_CLUSTER_DIST_BASE=${IDEMQ_CLUSTER_DIST_BASE:-$((IDEMQ_CLUSTER_PORT_BASE + 20000))}
IDEMQ_CLUSTER_NODE_PREFIX=${IDEMQ_CLUSTER_NODE_PREFIX:-c}
IDEMQ_START_TIMEOUT=${IDEMQ_START_TIMEOUT:-120}
# epmd (Erlang's port mapper, 4369) is started by the first Erlang node: keep it on loopback.
export ERL_EPMD_ADDRESS=127.0.0.1

# ---------------------------------------------------------------------------------------------
# Messages: one clear line each, on stderr so that command substitutions stay clean.
log() { printf '==> %s\n' "$*" >&2; }
warn() { printf '==> WARNING: %s\n' "$*" >&2; }
die() {
  printf '==> ERROR: %s\n' "$*" >&2
  exit 1
}

is_root() { [[ $(id -u) -eq 0 ]]; }

# Run "$@" as root: directly when we are root, through sudo otherwise.
as_root() {
  if is_root; then
    "$@"
  elif command -v sudo >/dev/null 2>&1; then
    sudo "$@"
  else
    die "need root for: $* (run as root or install sudo)"
  fi
}

# Run "$@" as USER when we are root (servers drop to their service users, as packaged);
# as ourselves otherwise (a non-root developer runs the servers under their own account).
as_user() {
  local user=$1
  shift
  if is_root; then
    runuser -u "$user" -- "$@"
  else
    "$@"
  fi
}

# now_s: seconds since the epoch, with fractions, for timings.
now_s() { date +%s.%N; }
# elapsed START: seconds since START, one decimal.
elapsed() { awk -v a="$1" -v b="$(now_s)" 'BEGIN { printf "%.1f", b - a }'; }

# port_open PORT: true if something accepts TCP connections on 127.0.0.1:PORT.
port_open() {
  # shellcheck disable=SC2016 # $1 is expanded by the inner bash
  timeout 3 bash -c 'exec 3<>"/dev/tcp/127.0.0.1/$1"' _ "$1" 2>/dev/null
}

# port_owner PORT: best-effort description of who listens on PORT (needs ss from iproute2).
port_owner() {
  if command -v ss >/dev/null 2>&1; then
    ss -Hltnp "sport = :$1" 2>/dev/null |
      sed -n 's/.*users:(("\([^"]*\)",pid=\([0-9]*\).*/(listening: \1, pid \2)/p' | head -n 1
  fi
}

# pid_matches PIDFILE COMM DIR: print the pid and succeed if PIDFILE names a live process whose
# command name is COMM and whose working folder or command line contains DIR (our own state
# folder), so that a stale pid file whose number was reused is not mistaken for our server.
pid_matches() {
  local pidfile=$1 comm=$2 dir=$3 pid
  [[ -r $pidfile ]] || return 1
  pid=$(tr -dc '0-9' <"$pidfile")
  [[ -n $pid ]] || return 1
  [[ $(cat "/proc/$pid/comm" 2>/dev/null) == "$comm" ]] || return 1
  if [[ $(readlink "/proc/$pid/cwd" 2>/dev/null) != "$dir"* ]]; then
    tr '\0' ' ' <"/proc/$pid/cmdline" 2>/dev/null | grep -qF -- "$dir" || return 1
  fi
  printf '%s\n' "$pid"
}

# wait_gone PID SECONDS: wait until PID has exited; false on timeout.
wait_gone() {
  local pid=$1 deadline=$((SECONDS + $2))
  while kill -0 "$pid" 2>/dev/null; do
    [[ $(awk '{print $3}' "/proc/$pid/stat" 2>/dev/null) == Z ]] && return 0
    ((SECONDS < deadline)) || return 1
    sleep 0.1
  done
}

# show_tail FILE...: print the last lines of each existing file, for failure reports.
show_tail() {
  local f
  for f in "$@"; do
    [[ -s $f ]] || continue
    printf -- '---- last lines of %s ----\n' "$f" >&2
    tail -n "${TAIL_LINES:-40}" "$f" >&2
  done
}

# ---------------------------------------------------------------------------------------------
# Where the servers keep their data.
#
# The servers run as the packaged users 'rabbitmq' and 'mysql' when we are root, and those users
# must be able to reach their folders: a project cloned under /root (mode 700) is not reachable
# by them. Changing permissions of the user's parent folders would be intrusive, so in that case
# (and when the MariaDB socket path would be too long for a unix socket, 107 bytes) the server
# data goes to /var/tmp/idemq-<hash of the state path>, and $STATE_DIR/servers points there.
# Everything else (logs, env file) stays in $STATE_DIR.
resolve_server_dir() {
  local dir=$STATE_DIR reason=""
  mkdir -p "$STATE_DIR" "$LOG_DIR"
  if is_root; then
    local u
    for u in rabbitmq mysql; do
      if id -u "$u" >/dev/null 2>&1 && ! runuser -u "$u" -- test -x "$STATE_DIR" 2>/dev/null; then
        reason="user '$u' cannot reach $STATE_DIR"
        break
      fi
    done
  fi
  if [[ -z $reason && ${#STATE_DIR} -gt 80 ]]; then
    reason="$STATE_DIR is too long for a unix socket path"
  fi
  if [[ -n $reason ]]; then
    dir=/var/tmp/idemq-$(printf '%s' "$STATE_DIR" | sha256sum | cut -c1-12)
    mkdir -p "$dir"
    chmod 755 "$dir"
    if [[ $(readlink "$STATE_DIR/servers" 2>/dev/null) != "$dir" ]]; then
      ln -sfn "$dir" "$STATE_DIR/servers"
      log "$reason: server data goes to $dir (linked as .state/servers)"
    fi
  fi
  SERVER_DIR=$dir
  RABBIT_DIR=$SERVER_DIR/rabbitmq
  CLUSTER_DIR=$SERVER_DIR/rabbitmq-cluster # the 3-node cluster of `services start-cluster`
  MARIA_DIR=$SERVER_DIR/mariadb
  MARIA_SOCKET=$MARIA_DIR/sock
  MARIA_CNF=$MARIA_DIR/my.cnf
  # The RabbitMQ 4.x root: chrooted processes do not need to reach it through its parents, so it
  # stays in $STATE_DIR (physical path: the broker is recognised by its /proc/PID/root).
  R4_ROOT=$(cd "$STATE_DIR" && pwd -P)/rabbitmq4-root
  R4_DONE=$R4_ROOT/.idemq-root-complete
  # The Debian sid root (MySQL 9.7, RabbitMQ 4.3, libmysqlclient): the same reasoning.
  SID_ROOT=$(cd "$STATE_DIR" && pwd -P)/sid-root
  SID_DONE=$SID_ROOT/.idemq-root-complete
}

# ---------------------------------------------------------------------------------------------
# RabbitMQ environment: everything under $RABBIT_DIR, nothing from /etc/rabbitmq, listeners and
# Erlang distribution on loopback only.
RABBIT_BIN=/usr/lib/rabbitmq/bin
RABBIT_HOME=/var/lib/rabbitmq # the rabbitmq user's HOME: its .erlang.cookie is shared by server and CLI

rabbit_env() {
  export RABBITMQ_NODENAME=$IDEMQ_RABBITMQ_NODE
  export RABBITMQ_CONF_ENV_FILE=$RABBIT_DIR/rabbitmq-env.conf
  export RABBITMQ_CONFIG_FILE=$RABBIT_DIR/rabbitmq.conf
  export RABBITMQ_ADVANCED_CONFIG_FILE=$RABBIT_DIR/advanced.config
  export RABBITMQ_MNESIA_BASE=$RABBIT_DIR/mnesia
  export RABBITMQ_LOG_BASE=$RABBIT_DIR/log
  export RABBITMQ_ENABLED_PLUGINS_FILE=$RABBIT_DIR/enabled_plugins
  export RABBITMQ_FEATURE_FLAGS_FILE=$RABBIT_DIR/feature_flags
  export RABBITMQ_PID_FILE=$RABBIT_DIR/rabbitmq.pid
  export RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
  export RABBITMQ_NODE_PORT=$IDEMQ_AMQP_PORT
  export RABBITMQ_DIST_PORT=$IDEMQ_RABBITMQ_DIST_PORT
  export RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  export ERL_CRASH_DUMP=$RABBIT_DIR/log/erl_crash.dump
  if is_root; then
    RABBIT_RUN_HOME=$RABBIT_HOME
  else
    RABBIT_RUN_HOME=$RABBIT_DIR/home
  fi
}

# as_rabbit CMD...: run as the user the broker runs as, with the HOME holding its Erlang cookie.
# (Debian's /usr/sbin/rabbitmqctl does the same for root via su, so a plain
# `rabbitmqctl -n rabbit@localhost ...` run by root also reaches this broker.)
as_rabbit() {
  rabbit_env
  (cd / && as_user rabbitmq env HOME="$RABBIT_RUN_HOME" "$@")
}

# rmqctl ARGS...: rabbitmqctl against our node.
rmqctl() { as_rabbit "$RABBIT_BIN/rabbitmqctl" -n "$IDEMQ_RABBITMQ_NODE" "$@"; }

# ---------------------------------------------------------------------------------------------
# MariaDB client helpers: connect as the server's root account through its unix socket.
maria_admin() { mariadb-admin --defaults-file="$MARIA_CNF" --user=root "$@"; }
maria_sql() { mariadb --defaults-file="$MARIA_CNF" --user=root --batch --skip-column-names "$@"; }

# ---------------------------------------------------------------------------------------------
# RabbitMQ 4.x: Debian 13's rabbitmq-server in a minimal Debian 13 root ($R4_ROOT, built by
# scripts/services), run with chroot as that root's own rabbitmq user. Every process in it runs
# in a private mount namespace (unshare --mount) where /proc /sys /dev /dev/pts are bound into
# the root: the host's mount table never shows those binds, and the kernel drops them when the
# last process of the namespace exits, so no bind can outlive the broker and an `rm -rf` of the
# state folder can never recurse into the host's /dev.
R4_VAR=/var/lib/rabbitmq # inside the root: HOME (Erlang cookie), mnesia, pid file
R4_LOG=/var/log/rabbitmq # inside the root
R4_PID_FILE=$R4_VAR/idemq.pid

r4_env() {
  R4_ENV=(
    HOME="$R4_VAR" PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 LC_ALL=C.UTF-8
    ERL_EPMD_PORT="$IDEMQ_RABBITMQ4_EPMD_PORT" ERL_EPMD_ADDRESS=127.0.0.1
    ERL_CRASH_DUMP="$R4_LOG/erl_crash.dump"
    RABBITMQ_NODENAME="$IDEMQ_RABBITMQ4_NODE"
    RABBITMQ_NODE_IP_ADDRESS=127.0.0.1
    RABBITMQ_NODE_PORT="$IDEMQ_AMQP4_PORT"
    RABBITMQ_DIST_PORT="$IDEMQ_RABBITMQ4_DIST_PORT"
    RABBITMQ_CONFIG_FILE=/etc/rabbitmq/rabbitmq.conf
    RABBITMQ_ENABLED_PLUGINS_FILE=/etc/rabbitmq/enabled_plugins
    RABBITMQ_MNESIA_BASE="$R4_VAR/mnesia"
    RABBITMQ_LOG_BASE="$R4_LOG"
    RABBITMQ_PID_FILE="$R4_PID_FILE"
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
    RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  )
}

# r4_chroot_cmd: R4_CMD=(the command prefix that runs CMD ARGS... inside the root, as its
# rabbitmq user, with a clean environment). r4_chroot CMD ARGS...: run it.
r4_chroot_cmd() {
  r4_env
  # shellcheck disable=SC2016 # expanded by the inner sh
  R4_CMD=(unshare --mount --propagation private -- /bin/sh -eu -c '
    r=$1
    shift
    for d in proc sys dev dev/pts; do mount --bind "/$d" "$r/$d"; done
    exec chroot --userspec=rabbitmq:rabbitmq "$r" "$@"' sh "$R4_ROOT"
    /usr/bin/env -i "${R4_ENV[@]}")
}
r4_chroot() {
  r4_chroot_cmd
  "${R4_CMD[@]}" "$@"
}

# r4ctl ARGS...: rabbitmqctl against the 4.x node.
r4ctl() {
  is_root || die "rabbitmq4: needs root (chroot and mounts)"
  [[ -e $R4_DONE ]] || die "rabbitmq4: no root in $R4_ROOT yet: scripts/services start-rabbitmq4"
  r4_chroot /usr/lib/rabbitmq/bin/rabbitmqctl -n "$IDEMQ_RABBITMQ4_NODE" "$@"
}

# ---------------------------------------------------------------------------------------------
# The Debian sid root ($SID_ROOT, built by scripts/services on first use): MySQL 9.7 (the
# mysql97 servers), RabbitMQ 4.3 and the build tools for a libmysqlclient build of idemq. Its
# processes run as root in the root (mysqld drops to the root's own mysql user itself), each in
# a private mount namespace with /proc /sys /dev /dev/pts bound into the root, as for RabbitMQ
# 4.x above: no bind shows in the host's mount table or outlives the processes.
sid_env() {
  SID_ENV=(HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 LC_ALL=C.UTF-8)
}

# sid_chroot_cmd: SID_CMD=(the command prefix that runs CMD ARGS... inside the sid root, as
# root, with a clean environment; stdin, stdout and the exit status pass through).
# sid_chroot CMD ARGS...: run it.
sid_chroot_cmd() {
  sid_env
  # shellcheck disable=SC2016 # expanded by the inner sh
  SID_CMD=(unshare --mount --propagation private -- /bin/sh -eu -c '
    r=$1
    shift
    for d in proc sys dev dev/pts; do mount --bind "/$d" "$r/$d"; done
    exec chroot "$r" "$@"' sh "$SID_ROOT"
    /usr/bin/env -i "${SID_ENV[@]}")
}
sid_chroot() {
  sid_chroot_cmd
  "${SID_CMD[@]}" "$@"
}
