# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): the Debian roots (13 for
# RabbitMQ 4.0, sid for MySQL 9.7 and RabbitMQ 4.3) and the processes in them.

# ----------------------------------------------------------------------------- Debian roots
# root_procs DIR [NAME=VALUE]: the pids of every process whose root directory is DIR (a chroot of
# ours); with NAME=VALUE, only those whose environment has it.
root_procs() {
  local pattern pid # -lname takes a glob
  pattern=$(printf '%s' "$1" | sed 's/[][*?\\]/\\&/g')
  for pid in $(find /proc/[0-9]*/root -maxdepth 0 -lname "$pattern" 2>/dev/null | cut -d/ -f3); do
    if [[ -z ${2:-} ]] || tr '\0' '\n' 2>/dev/null <"/proc/$pid/environ" | grep -qxF -- "$2"; then
      printf '%s\n' "$pid"
    fi
  done
}

# sweep WHAT LISTER [ARGS...]: end the processes that `LISTER ARGS...` prints (SIGTERM, SIGKILL
# after 10 s): what a stopped server leaves in a root (the broker's epmd, which daemonises and
# outlives it; a hung client; anything a crash or a build left behind), so that nothing keeps
# its mount namespace alive. WHAT prefixes the messages.
sweep() {
  local what=$1 pids deadline=$((SECONDS + 10))
  shift
  mapfile -t pids < <("$@")
  ((${#pids[@]})) || return 0
  log "$what: ending leftover processes in its root: ${pids[*]}"
  kill -TERM "${pids[@]}" 2>/dev/null || true
  while mapfile -t pids < <("$@") && ((${#pids[@]})); do
    if ((SECONDS >= deadline)); then
      kill -KILL "${pids[@]}" 2>/dev/null || true
      sleep 0.5
      mapfile -t pids < <("$@")
      ((${#pids[@]} == 0)) || die "$what: processes ${pids[*]} do not go away"
      break
    fi
    sleep 0.1
  done
}

# unmount_under DIR WHAT: unmount anything the host's mount table has under DIR (nothing does
# when this script made it: its binds live in private namespaces; this covers binds made by
# hand), deepest first; a busy one is detached (umount -l), which is enough for a later rm -rf to
# stay out. WHAT prefixes the messages.
unmount_under() {
  local m mounts
  mapfile -t mounts < <(awk -v r="$1" '{ m = $2; gsub(/\\040/, " ", m)
    if (m == r || index(m, r "/") == 1) print m }' /proc/mounts | sort -r)
  for m in "${mounts[@]}"; do
    umount "$m" 2>/dev/null || umount -l "$m" || die "$2: cannot unmount $m"
    log "$2: unmounted $m"
  done
}

# debian_mirror: the Debian mirror apt uses (first non-security URI), or deb.debian.org.
debian_mirror() {
  local uri=${IDEMQ_DEBIAN_MIRROR:-}
  if [[ -z $uri && -r /etc/apt/sources.list.d/debian.sources ]]; then
    uri=$(awk 'tolower($1) == "uris:" { for (i = 2; i <= NF; i++) if ($i !~ /security/) { print $i; exit } }' \
      /etc/apt/sources.list.d/debian.sources)
  fi
  if [[ -z $uri && -r /etc/apt/sources.list ]]; then
    uri=$(awk '$1 == "deb" { for (i = 2; i <= NF; i++) if ($i ~ /^https?:\/\//) { if ($i !~ /security/) { print $i; exit } else break } }' \
      /etc/apt/sources.list)
  fi
  printf '%s\n' "${uri:-http://deb.debian.org/debian}"
}

# r4_build_root: debootstrap the root unless a completed build is there (about 75 s, once).
r4_build_root() {
  [[ -e $R4_DONE ]] && return 0
  local lock mirror t0 blog=$LOG_DIR/rabbitmq4-debootstrap.log
  command -v debootstrap >/dev/null 2>&1 || die "rabbitmq4: debootstrap is not installed (scripts/setup installs it)"
  # One build at a time per state folder: a second one would remove the first one's root.
  exec {lock}>"$STATE_DIR/rabbitmq4-root.lock"
  flock "$lock"
  if [[ -e $R4_DONE ]]; then
    exec {lock}>&-
    return 0
  fi
  if [[ -e $R4_ROOT ]]; then
    log "rabbitmq4: removing the incomplete root left by an interrupted build"
    r4_sweep
    unmount_under "$R4_ROOT" rabbitmq4
    rm -rf --one-file-system "$R4_ROOT"
  fi
  mirror=$(debian_mirror)
  t0=$(now_s)
  log "rabbitmq4: building a Debian 13 root with rabbitmq-server in $R4_ROOT from $mirror (once, about 75 s; log: $blog)"
  # In a private mount namespace too: the /proc and /sys debootstrap mounts into the target go
  # away with it, even when it is interrupted.
  if ! unshare --mount --propagation private -- \
    debootstrap --variant=minbase --include=rabbitmq-server trixie "$R4_ROOT" "$mirror" \
    </dev/null >"$blog" 2>&1; then
    r4_sweep
    warn "rabbitmq4: debootstrap failed (another mirror: IDEMQ_DEBIAN_MIRROR=...)"
    show_tail "$blog"
    exit 1
  fi
  r4_sweep # in case a maintainer script started something
  [[ -x $R4_ROOT/usr/lib/rabbitmq/bin/rabbitmq-server ]] || die "rabbitmq4: no rabbitmq-server in the new root (log: $blog)"
  chmod 755 "$R4_ROOT" # the broker's user must be able to enter it
  local version
  version=$(dpkg-query --admindir="$R4_ROOT/var/lib/dpkg" -W -f='${Version}' rabbitmq-server 2>/dev/null || true)
  printf 'debootstrap --variant=minbase --include=rabbitmq-server trixie %s\nrabbitmq-server %s\n' \
    "$mirror" "$version" >"$R4_DONE"
  exec {lock}>&-
  log "rabbitmq4: root ready, rabbitmq-server $version ($(elapsed "$t0")s)"
}

# ----------------------------------------------------------------------------- Debian sid root
# A minimal Debian sid root in $SID_ROOT (see sid_chroot in lib.sh) for MySQL 9.7 (below),
# RabbitMQ 4.3 and a libmysqlclient build of idemq, so the package list serves all three. Built
# once per state folder on first use and reused; $SID_DONE marks a completed build (a root made
# by hand with the same recipe is taken as it is once it has that marker), so an interrupted
# build is redone. mysql-router (the Group Replication cluster's, gr.sh) came later: gr.sh
# installs it into a root built without it (sid_ensure_packages). sid's Release file can be past
# its Valid-Until date: apt is told not to mind.
SID_PACKAGES=(rabbitmq-server mysql-server-core mysql-client-core mysql-router libmysqlclient-dev
  build-essential cmake pkg-config libuv1-dev librabbitmq-dev libmsgpack-c-dev libjansson-dev
  libyaml-dev libcriterion-dev libssl-dev)

# sid_procs [TEXT]: the pids of the processes running in the sid root; with TEXT, only those
# whose command line contains it (one server's folder: the root is shared by several servers).
sid_procs() {
  local pid
  for pid in $(root_procs "$SID_ROOT"); do
    if [[ -z ${1:-} ]] || tr '\0' ' ' 2>/dev/null <"/proc/$pid/cmdline" | grep -qF -- "$1"; then
      printf '%s\n' "$pid"
    fi
  done
}

# sid_sweep WHAT [TEXT]: end those processes (sweep), so that nothing of a stopped server (a hung
# client, a server whose pid file is gone) or of a build is left behind; WHAT prefixes the
# messages.
sid_sweep() { sweep "$1" sid_procs "${2:-}"; }

# sid_build_root: debootstrap the root and install $SID_PACKAGES in it (about 70 s, once).
# Called with the root's lock held (sid_ensure_root).
sid_build_root() {
  local mirror t0 version_mysql version_rabbit blog=$LOG_DIR/sid-debootstrap.log
  command -v debootstrap >/dev/null 2>&1 || die "sid root: debootstrap is not installed (scripts/setup installs it)"
  if [[ -e $SID_ROOT ]]; then
    log "sid root: removing the incomplete root left by an interrupted build"
    sid_sweep "sid root"
    unmount_under "$SID_ROOT" "sid root"
    rm -rf --one-file-system "$SID_ROOT"
  fi
  mirror=$(debian_mirror)
  t0=$(now_s)
  log "sid root: building a Debian sid root with MySQL 9.7 and RabbitMQ 4.3 in $SID_ROOT from $mirror (once, about 70 s; log: $blog)"
  # In a private mount namespace, as for the 4.0 root: debootstrap's mounts go away with it.
  if ! unshare --mount --propagation private -- \
    debootstrap --variant=minbase sid "$SID_ROOT" "$mirror" </dev/null >"$blog" 2>&1; then
    sid_sweep "sid root"
    warn "sid root: debootstrap failed (another mirror: IDEMQ_DEBIAN_MIRROR=...)"
    show_tail "$blog"
    exit 1
  fi
  # No maintainer script may start a service in the root.
  printf '#!/bin/sh\nexit 101\n' >"$SID_ROOT/usr/sbin/policy-rc.d"
  chmod 755 "$SID_ROOT/usr/sbin/policy-rc.d" "$SID_ROOT"
  # shellcheck disable=SC2016 # expanded by the sh in the root
  if ! sid_chroot /bin/sh -c 'apt-get -o Acquire::Check-Valid-Until=false update &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"' \
    sh "${SID_PACKAGES[@]}" </dev/null >>"$blog" 2>&1; then
    sid_sweep "sid root"
    warn "sid root: installing ${SID_PACKAGES[*]} failed (another mirror: IDEMQ_DEBIAN_MIRROR=...)"
    show_tail "$blog"
    exit 1
  fi
  sid_sweep "sid root" # in case a maintainer script started something all the same
  [[ -x $SID_ROOT/usr/sbin/mysqld ]] || die "sid root: no mysqld in the new root (log: $blog)"
  version_mysql=$(dpkg-query --admindir="$SID_ROOT/var/lib/dpkg" -W -f='${Version}' mysql-server-core 2>/dev/null || true)
  version_rabbit=$(dpkg-query --admindir="$SID_ROOT/var/lib/dpkg" -W -f='${Version}' rabbitmq-server 2>/dev/null || true)
  printf 'debootstrap --variant=minbase sid %s\nmysql-server-core %s\nrabbitmq-server %s\n' \
    "$mirror" "$version_mysql" "$version_rabbit" >"$SID_DONE"
  log "sid root: ready, mysql-server-core $version_mysql, rabbitmq-server $version_rabbit ($(elapsed "$t0")s)"
}

# sid_ensure_packages PKG...: install those of PKG... that a root built before they joined
# $SID_PACKAGES lacks (a cached root is never rebuilt for a new package).
sid_ensure_packages() {
  local pkg missing=() lock blog=$LOG_DIR/sid-packages.log
  for pkg in "$@"; do
    [[ $(dpkg-query --admindir="$SID_ROOT/var/lib/dpkg" -W -f='${db:Status-Status}' "$pkg" 2>/dev/null) == installed ]] ||
      missing+=("$pkg")
  done
  ((${#missing[@]})) || return 0
  exec {lock}>"$STATE_DIR/sid-root.lock"
  flock "$lock"
  log "sid root: installing ${missing[*]} into the existing root (log: $blog)"
  # shellcheck disable=SC2016 # expanded by the sh in the root
  if ! sid_chroot /bin/sh -c 'apt-get -o Acquire::Check-Valid-Until=false update &&
    DEBIAN_FRONTEND=noninteractive apt-get install -y --no-install-recommends "$@"' \
    sh "${missing[@]}" </dev/null >>"$blog" 2>&1; then
    sid_sweep "sid root"
    warn "sid root: installing ${missing[*]} failed (another mirror: IDEMQ_DEBIAN_MIRROR=...)"
    show_tail "$blog"
    exit 1
  fi
  exec {lock}>&-
}

# sid_ensure_root: the root, built if need be, with what the MySQL servers need that no package
# makes: a mysql user (mysql-server-core creates none) and an /etc/hosts (debootstrap writes
# none, and mysqld resolves its clients' addresses: without it 127.0.0.1 would go to DNS). One
# caller at a time per state folder: the two MySQL servers start in parallel.
sid_ensure_root() {
  is_root || die "sid root: needs root (debootstrap, chroot and mounts)"
  if [[ -e $SID_DONE && -s $SID_ROOT/etc/hosts ]] && grep -q '^mysql:' "$SID_ROOT/etc/passwd"; then
    return 0
  fi
  local lock
  exec {lock}>"$STATE_DIR/sid-root.lock"
  flock "$lock"
  [[ -e $SID_DONE ]] || sid_build_root
  if ! grep -q '^mysql:' "$SID_ROOT/etc/passwd"; then
    chroot "$SID_ROOT" /bin/sh -c 'getent group mysql >/dev/null || groupadd -r mysql; useradd -r -g mysql mysql' ||
      die "sid root: cannot create the mysql user in $SID_ROOT"
    log "sid root: created the mysql user"
  fi
  if [[ ! -s $SID_ROOT/etc/hosts ]]; then
    printf '127.0.0.1\tlocalhost\n::1\tlocalhost ip6-localhost ip6-loopback\n' >"$SID_ROOT/etc/hosts"
  fi
  exec {lock}>&-
}
