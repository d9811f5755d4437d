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
#   IDEMQ_AMQP4_PORT          AMQP listener of RabbitMQ 4.0         (default 5674)
#   IDEMQ_RABBITMQ4_DIST_PORT its Erlang distribution port          (default AMQP4 port + 20000)
#   IDEMQ_RABBITMQ4_EPMD_PORT its own epmd, on 127.0.0.1            (default 4370)
#   IDEMQ_RABBITMQ4_NODE      its node name                         (default rabbit4@localhost)
#   IDEMQ_DEBIAN_MIRROR       mirror for its Debian 13 root and for the Debian sid root of
#                             MySQL 9.7 and RabbitMQ 4.3            (default: apt's, else
#                                                                    http://deb.debian.org/debian)
#   IDEMQ_SKIP_BROKER4=1      scripts/services start|restart|status and scripts/test leave it out
#   IDEMQ_AMQP43_PORT         AMQP listener of RabbitMQ 4.3 (sid root) (default 5676)
#   IDEMQ_AMQPS43_PORT        its TLS listener, 127.0.0.1           (default AMQP43 port + 1: 5677)
#   IDEMQ_RABBITMQ43_DIST_PORT  its Erlang distribution port        (default AMQP43 port + 20000)
#   IDEMQ_RABBITMQ43_EPMD_PORT  its own epmd, on 127.0.0.1          (default 4371)
#   IDEMQ_RABBITMQ43_NODE     its node name                         (default rabbit43@localhost)
#   IDEMQ_SKIP_BROKER43=1     scripts/services start|restart|status leave it out
#   IDEMQ_CLUSTER_PORT_BASE   AMQP listener of cluster node 1; nodes 2 and 3 take the next two
#                             (default 5681: 5681..5683; only `services start-cluster` starts it)
#   IDEMQ_CLUSTER_DIST_BASE   Erlang distribution port of node 1, then +1, +2 (default port
#                             base + 20000)
#   IDEMQ_CLUSTER_NODE_PREFIX cluster node names PREFIX1@localhost..PREFIX3@localhost (default c)
#   IDEMQ_CLUSTER43_PORT_BASE, IDEMQ_CLUSTER43_DIST_BASE, IDEMQ_CLUSTER43_NODE_PREFIX
#                             the same for the 3-node RabbitMQ 4.3 cluster (defaults 5691:
#                             5691..5693, port base + 20000, c43-: c43-1@localhost..; only
#                             `services start-cluster43` starts it)
#   IDEMQ_CLUSTER43_EPMD_PORT the epmd its three nodes share, on 127.0.0.1 (default 4372)
#   IDEMQ_GALERA_PORT_BASE    SQL port of Galera node 1, then +1, +2 (default 3331: 3331..3333;
#                             only `services start-galera` starts it)
#   IDEMQ_GALERA_GCOMM_BASE, IDEMQ_GALERA_IST_BASE, IDEMQ_GALERA_SST_BASE
#                             its group communication, IST and rsync SST ports, node 1 then
#                             +1, +2 (defaults 4571, 4581, 4591)
#   IDEMQ_GR_PORT_BASE        SQL port of Group Replication node 1 (MySQL 9.7, sid root), then
#                             +1, +2 (default 3341: 3341..3343; only `services start-gr`)
#   IDEMQ_GR_GCS_BASE         their group_replication_local_address ports (default 33461..33463)
#   IDEMQ_GR_ROUTER_RW_PORT, IDEMQ_GR_ROUTER_RO_PORT
#                             MySQL Router in front of them (defaults 6446 and 6447)
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
IDEMQ_AMQP43_PORT=${IDEMQ_AMQP43_PORT:-5676}
IDEMQ_AMQPS43_PORT=${IDEMQ_AMQPS43_PORT:-$((IDEMQ_AMQP43_PORT + 1))}
IDEMQ_RABBITMQ43_DIST_PORT=${IDEMQ_RABBITMQ43_DIST_PORT:-$((IDEMQ_AMQP43_PORT + 20000))}
IDEMQ_RABBITMQ43_EPMD_PORT=${IDEMQ_RABBITMQ43_EPMD_PORT:-4371}
IDEMQ_RABBITMQ43_NODE=${IDEMQ_RABBITMQ43_NODE:-rabbit43@localhost}
IDEMQ_CLUSTER43_PORT_BASE=${IDEMQ_CLUSTER43_PORT_BASE:-5691}
IDEMQ_CLUSTER43_DIST_BASE=${IDEMQ_CLUSTER43_DIST_BASE:-$((IDEMQ_CLUSTER43_PORT_BASE + 20000))}
IDEMQ_CLUSTER43_NODE_PREFIX=${IDEMQ_CLUSTER43_NODE_PREFIX:-c43-}
IDEMQ_CLUSTER43_EPMD_PORT=${IDEMQ_CLUSTER43_EPMD_PORT:-4372}
IDEMQ_GALERA_PORT_BASE=${IDEMQ_GALERA_PORT_BASE:-3331}
IDEMQ_GALERA_GCOMM_BASE=${IDEMQ_GALERA_GCOMM_BASE:-4571}
IDEMQ_GALERA_IST_BASE=${IDEMQ_GALERA_IST_BASE:-4581}
IDEMQ_GALERA_SST_BASE=${IDEMQ_GALERA_SST_BASE:-4591}
IDEMQ_GR_PORT_BASE=${IDEMQ_GR_PORT_BASE:-3341}
IDEMQ_GR_GCS_BASE=${IDEMQ_GR_GCS_BASE:-33461}
IDEMQ_GR_ROUTER_RW_PORT=${IDEMQ_GR_ROUTER_RW_PORT:-6446}
IDEMQ_GR_ROUTER_RO_PORT=${IDEMQ_GR_ROUTER_RO_PORT:-6447}
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

# missing_build_deps: one line for each thing that building idemq and its tests needs (a command,
# or a pkg-config module of CMakeLists.txt) and that this machine lacks, with the Debian package
# that has it (scripts/setup installs them all). Prints nothing when everything is there.
missing_build_deps() {
  local c m one ok alts
  for c in cmake:cmake make:make cc:gcc pkg-config:pkg-config; do
    command -v "${c%%:*}" >/dev/null 2>&1 || printf 'command %s (Debian package %s)\n' "${c%%:*}" "${c#*:}"
  done
  command -v pkg-config >/dev/null 2>&1 || return 0
  for m in librabbitmq:librabbitmq-dev mysqlclient:default-libmysqlclient-dev \
    'msgpack-c|msgpack:libmsgpack-dev' libuv:libuv1-dev jansson:libjansson-dev yaml-0.1:libyaml-dev \
    libssl:libssl-dev libcrypto:libssl-dev criterion:libcriterion-dev; do
    ok=0
    IFS='|' read -ra alts <<<"${m%%:*}"
    for one in "${alts[@]}"; do
      pkg-config --exists "$one" && ok=1
    done
    ((ok)) || printf 'pkg-config module %s (Debian package %s)\n' "${m%%:*}" "${m#*:}"
  done
  return 0
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
  GALERA_DIR=$SERVER_DIR/galera # the 3 Galera nodes of `services start-galera`
  MARIA_DIR=$SERVER_DIR/mariadb
  MARIA_SOCKET=$MARIA_DIR/sock
  MARIA_CNF=$MARIA_DIR/my.cnf
  # The RabbitMQ 4.0 root: chrooted processes do not need to reach it through its parents, so it
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
# Chroots. chroot_cmd ROOT USERSPEC ENV...: CHROOT_CMD=(the command prefix that runs CMD ARGS...
# inside ROOT, as USERSPEC (user:group; empty: root), with only the environment ENV...; stdin,
# stdout and the exit status pass through). Every process in a root runs in a private mount
# namespace (unshare --mount) where /proc /sys /dev /dev/pts are bound into the root: the host's
# mount table never shows those binds, and the kernel drops them when the last process of the
# namespace exits, so no bind can outlive the servers and an `rm -rf` of the state folder can
# never recurse into the host's /dev.
chroot_cmd() {
  local root=$1 spec=$2
  shift 2
  # shellcheck disable=SC2016 # expanded by the inner sh
  CHROOT_CMD=(unshare --mount --propagation private -- /bin/sh -eu -c '
    r=$1 u=$2
    shift 2
    for d in proc sys dev dev/pts; do mount --bind "/$d" "$r/$d"; done
    exec chroot ${u:+--userspec="$u"} "$r" "$@"' sh "$root" "$spec" /usr/bin/env -i "$@")
}

# ---------------------------------------------------------------------------------------------
# RabbitMQ 4.x in a root, run with chroot as that root's own rabbitmq user (scripts/services,
# "RabbitMQ 4.x"). rb_vars NAME: the settings of broker NAME in RB_* variables; the rb_*
# functions act on the broker it named last:
#   rabbitmq4    Debian 13's 4.0.5 in $R4_ROOT, a root of its own: the package's own folders
#   rabbitmq43   Debian sid's 4.3 in $SID_ROOT, which MySQL 9.7 shares: everything of the broker
#                in /var/lib/idemq-rabbit43; a TLS listener; every deprecated feature refused
#   cluster43-N  node N (1..3) of the 4.3 cluster, in /var/lib/idemq-cluster43/nN; its epmd is
#                shared by the three nodes
# Paths in RB_ETC RB_VAR RB_LOG are inside the root (the host sees them under $RB_ROOT). Every
# broker of a root has HOME /var/lib/rabbitmq, whose Erlang cookie the CLI shares. RB_SHARED=1:
# other servers run in the root (its processes are told apart by ERL_EPMD_PORT, nothing is
# unmounted there); RB_REFUSE=1: every deprecated feature refused; RB_CLUSTERED=1: a cluster
# node (the epmd is the cluster's; feature flags are the cluster code's); RB_BUILD: the function
# that makes the root; RB_SKIP: the variable that leaves the broker out of start.
RB_HOME=/var/lib/rabbitmq

rb_vars() {
  RB=$1 RB_LABEL=$1 RB_TLS_PORT="" RB_CLUSTERED=0 RB_REFUSE=1 RB_SHARED=1
  case $1 in
    rabbitmq4)
      RB_ROOT=$R4_ROOT RB_DONE=$R4_DONE RB_BUILD=r4_build_root RB_SKIP=IDEMQ_SKIP_BROKER4
      RB_NODE=$IDEMQ_RABBITMQ4_NODE RB_PORT=$IDEMQ_AMQP4_PORT RB_DIST=$IDEMQ_RABBITMQ4_DIST_PORT
      RB_EPMD=$IDEMQ_RABBITMQ4_EPMD_PORT RB_REFUSE=0 RB_SHARED=0
      RB_ETC=/etc/rabbitmq RB_VAR=/var/lib/rabbitmq RB_LOG=/var/log/rabbitmq
      RB_PORT_VARS="IDEMQ_AMQP4_PORT=... IDEMQ_RABBITMQ4_DIST_PORT=... IDEMQ_RABBITMQ4_EPMD_PORT=... IDEMQ_RABBITMQ4_NODE=other@localhost"
      ;;
    rabbitmq43)
      RB_ROOT=$SID_ROOT RB_DONE=$SID_DONE RB_BUILD=sid_ensure_root RB_SKIP=IDEMQ_SKIP_BROKER43
      RB_NODE=$IDEMQ_RABBITMQ43_NODE RB_PORT=$IDEMQ_AMQP43_PORT RB_DIST=$IDEMQ_RABBITMQ43_DIST_PORT
      RB_EPMD=$IDEMQ_RABBITMQ43_EPMD_PORT RB_TLS_PORT=$IDEMQ_AMQPS43_PORT
      RB_ETC=/var/lib/idemq-rabbit43 RB_VAR=/var/lib/idemq-rabbit43 RB_LOG=/var/lib/idemq-rabbit43/log
      RB_PORT_VARS="IDEMQ_AMQP43_PORT=... IDEMQ_AMQPS43_PORT=... IDEMQ_RABBITMQ43_DIST_PORT=... IDEMQ_RABBITMQ43_EPMD_PORT=... IDEMQ_RABBITMQ43_NODE=other@localhost"
      ;;
    cluster43-[1-9])
      local n=${1#cluster43-}
      RB_LABEL="cluster43 node $n" RB_CLUSTERED=1
      RB_ROOT=$SID_ROOT RB_DONE=$SID_DONE RB_BUILD=sid_ensure_root RB_SKIP=""
      RB_NODE=$IDEMQ_CLUSTER43_NODE_PREFIX$n@localhost RB_PORT=$((IDEMQ_CLUSTER43_PORT_BASE + n - 1))
      RB_DIST=$((IDEMQ_CLUSTER43_DIST_BASE + n - 1)) RB_EPMD=$IDEMQ_CLUSTER43_EPMD_PORT
      RB_ETC=/var/lib/idemq-cluster43/n$n RB_VAR=/var/lib/idemq-cluster43/n$n RB_LOG=/var/lib/idemq-cluster43/n$n/log
      RB_PORT_VARS="IDEMQ_CLUSTER43_PORT_BASE=... IDEMQ_CLUSTER43_DIST_BASE=... IDEMQ_CLUSTER43_EPMD_PORT=..."
      ;;
    *) die "unknown RabbitMQ broker $1" ;;
  esac
  RB_PID_FILE=$RB_VAR/idemq.pid
}

# rb_chroot_cmd: RB_CMD=(the command prefix that runs CMD ARGS... in the broker's root as its
# rabbitmq user, with the broker's environment and nothing else). rb_chroot CMD ARGS...: run it.
rb_chroot_cmd() {
  chroot_cmd "$RB_ROOT" rabbitmq:rabbitmq \
    HOME="$RB_HOME" PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 LC_ALL=C.UTF-8 \
    ERL_EPMD_PORT="$RB_EPMD" ERL_EPMD_ADDRESS=127.0.0.1 ERL_CRASH_DUMP="$RB_LOG/erl_crash.dump" \
    RABBITMQ_NODENAME="$RB_NODE" RABBITMQ_NODE_IP_ADDRESS=127.0.0.1 \
    RABBITMQ_NODE_PORT="$RB_PORT" RABBITMQ_DIST_PORT="$RB_DIST" \
    RABBITMQ_CONFIG_FILE="$RB_ETC/rabbitmq.conf" RABBITMQ_ENABLED_PLUGINS_FILE="$RB_ETC/enabled_plugins" \
    RABBITMQ_MNESIA_BASE="$RB_VAR/mnesia" RABBITMQ_LOG_BASE="$RB_LOG" RABBITMQ_PID_FILE="$RB_PID_FILE" \
    RABBITMQ_SERVER_ADDITIONAL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}" \
    RABBITMQ_CTL_ERL_ARGS="-kernel inet_dist_use_interface {127,0,0,1}"
  RB_CMD=("${CHROOT_CMD[@]}")
}
rb_chroot() {
  rb_chroot_cmd
  "${RB_CMD[@]}" "$@"
}

# rb_ctl ARGS...: the root's rabbitmqctl against the broker. rb_cli NAME ARGS...: the same for
# broker NAME, with a clear error when it cannot run (scripts/services rabbitmq4ctl ...).
rb_ctl() { rb_chroot /usr/lib/rabbitmq/bin/rabbitmqctl -n "$RB_NODE" "$@"; }
rb_cli() {
  rb_vars "$1"
  shift
  is_root || die "$RB_LABEL: needs root (chroot and mounts)"
  [[ -e $RB_DONE ]] || die "$RB_LABEL: no root in $RB_ROOT yet: scripts/services start-$RB"
  rb_ctl "$@"
}

# ---------------------------------------------------------------------------------------------
# The Debian sid root ($SID_ROOT, built by scripts/services on first use): MySQL 9.7 (the
# mysql97 servers), RabbitMQ 4.3 and the build tools for a libmysqlclient build of idemq.
# sid_chroot_cmd: SID_CMD=(the command prefix that runs CMD ARGS... inside the sid root, as
# root, with a clean environment; mysqld drops to the root's own mysql user itself).
# sid_chroot CMD ARGS...: run it.
sid_env() {
  SID_ENV=(HOME=/root PATH=/usr/sbin:/usr/bin:/sbin:/bin LANG=C.UTF-8 LC_ALL=C.UTF-8)
}
sid_chroot_cmd() {
  sid_env
  chroot_cmd "$SID_ROOT" "" "${SID_ENV[@]}"
  SID_CMD=("${CHROOT_CMD[@]}")
}
sid_chroot() {
  sid_chroot_cmd
  "${SID_CMD[@]}" "$@"
}
