# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): the one test PKI of the TLS
# servers.

# ----------------------------------------------------------------------------- the test PKI
# One test CA for every TLS server: made here (tls_prepare), used by the RabbitMQ TLS listeners
# from $TLS_DIR and by the MariaDB/MySQL TLS servers from copies (see "MariaDB/MySQL TLS" below).
#
# The TLS listeners of the 3.10 broker (127.0.0.1:$IDEMQ_AMQPS_PORT) and of RabbitMQ 4.3
# (127.0.0.1:$IDEMQ_AMQPS43_PORT, with copies of the same files in its root: it cannot see
# $TLS_DIR), and what tests/integration/test_tls_amqp.c needs around them. At each start, when
# a file is missing or a certificate expires within a day, openssl makes all of them anew in
# $TLS_DIR (EC P-256, milliseconds):
#   ca.pem ca.key                      the test CA, "idemq test CA": the only CA the broker trusts
#   server.pem server.key              the broker's certificate: CN=localhost, SAN DNS:localhost
#                                      and IP:127.0.0.1, by the test CA
#   client.pem client.key              a client certificate, CN=idemq-client, by the test CA
#   other.pem other.key                a server certificate for another name (rmq.internal), by
#                                      the test CA
#   other-ca.pem other-ca.key          a second CA that nothing trusts
#   untrusted-client.pem .key          a client certificate, CN=idemq-client, by the second CA
# The broker asks every client for a certificate (verify_peer) but also takes connections
# without one (fail_if_no_peer_cert = false: guest/guest works over TLS too), and offers
# EXTERNAL login (rabbitmq_auth_mechanism_ssl; the user is the certificate's CN): broker user
# idemq-client has no password and all permissions on /, on both brokers.
TLS_CLIENT_CN=idemq-client
TLS_FILES=(ca.pem ca.key server.pem server.key client.pem client.key other.pem other.key
  other-ca.pem other-ca.key untrusted-client.pem untrusted-client.key)

tls_files_ok() {
  local f
  for f in "${TLS_FILES[@]}"; do
    [[ -s $TLS_DIR/$f ]] || return 1
  done
  for f in ca server client other other-ca untrusted-client; do
    openssl x509 -checkend 86400 -noout -in "$TLS_DIR/$f.pem" >/dev/null 2>&1 || return 1
  done
}

# tls_ca NAME CN: a self-signed CA, NAME.pem and NAME.key.
tls_ca() {
  openssl req -x509 -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650 \
    -subj "/O=idemq tests/CN=$2" -keyout "$TLS_DIR/$1.key" -out "$TLS_DIR/$1.pem" \
    -addext basicConstraints=critical,CA:TRUE -addext keyUsage=critical,keyCertSign,cRLSign \
    2>>"$LOG_DIR/tls.log"
}

# tls_cert NAME CA CN EXTENSIONS: NAME.pem and NAME.key for CN, signed by the CA NAME CA.
tls_cert() {
  local name=$1 ca=$2 cn=$3 ext=$4
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes \
    -subj "/O=idemq tests/CN=$cn" -keyout "$TLS_DIR/$name.key" -out "$TLS_DIR/$name.csr" \
    2>>"$LOG_DIR/tls.log" || return 1
  printf '%s\n' "basicConstraints=critical,CA:FALSE" "$ext" >"$TLS_DIR/$name.ext"
  openssl x509 -req -in "$TLS_DIR/$name.csr" -CA "$TLS_DIR/$ca.pem" -CAkey "$TLS_DIR/$ca.key" \
    -set_serial "0x$(openssl rand -hex 8)" -days 825 -extfile "$TLS_DIR/$name.ext" \
    -out "$TLS_DIR/$name.pem" 2>>"$LOG_DIR/tls.log" || return 1
  rm -f "$TLS_DIR/$name.csr" "$TLS_DIR/$name.ext"
}

# tls_prepare: the files, made anew when one is missing or about to expire. One maker at a time:
# the 3.10 broker, RabbitMQ 4.3 and the MariaDB/MySQL TLS servers start in parallel, and a
# second maker would replace the first one's CA under its certificates.
tls_prepare() {
  command -v openssl >/dev/null 2>&1 || die "test PKI: openssl is not installed (scripts/setup installs it)"
  mkdir -p "$TLS_DIR"
  tls_files_ok && return 0
  local t0 server_ext client_ext other_ext lock
  exec {lock}>"$STATE_DIR/tls.lock"
  flock "$lock"
  if tls_files_ok; then
    exec {lock}>&-
    return 0
  fi
  t0=$(now_s)
  server_ext=$'subjectAltName=DNS:localhost,IP:127.0.0.1\nextendedKeyUsage=serverAuth'
  other_ext=$'subjectAltName=DNS:rmq.internal\nextendedKeyUsage=serverAuth'
  client_ext='extendedKeyUsage=clientAuth'
  (
    umask 077
    tls_ca ca "idemq test CA" &&
      tls_cert server ca localhost "$server_ext" &&
      tls_cert client ca "$TLS_CLIENT_CN" "$client_ext" &&
      tls_cert other ca rmq.internal "$other_ext" &&
      tls_ca other-ca "idemq other CA" &&
      tls_cert untrusted-client other-ca "$TLS_CLIENT_CN" "$client_ext"
  ) || die "test PKI: openssl could not make the test certificates (log: $LOG_DIR/tls.log)"
  chmod 644 "$TLS_DIR"/*.pem
  exec {lock}>&-
  log "test PKI: made a test CA and TLS certificates in $TLS_DIR ($(elapsed "$t0")s)"
}

# tls_rabbit_conf PORT DIR: the rabbitmq.conf lines of a TLS listener on 127.0.0.1:PORT with
# DIR/ca.pem, DIR/server.pem and DIR/server.key (DIR as the broker sees it).
tls_rabbit_conf() {
  cat <<EOF
# TLS (scripts/services, "RabbitMQ TLS")
listeners.ssl.default = 127.0.0.1:$1
ssl_options.cacertfile = $2/ca.pem
ssl_options.certfile = $2/server.pem
ssl_options.keyfile = $2/server.key
ssl_options.verify = verify_peer
ssl_options.fail_if_no_peer_cert = false
auth_mechanisms.1 = PLAIN
auth_mechanisms.2 = AMQPLAIN
auth_mechanisms.3 = EXTERNAL
ssl_cert_login_from = common_name
EOF
}

# tls_enable_plugin FILE: add rabbitmq_auth_mechanism_ssl to the enabled-plugins file FILE (an
# Erlang list, "[]." or "[a,b]."), keeping whatever else it enables.
tls_enable_plugin() {
  local f=$1
  grep -q rabbitmq_auth_mechanism_ssl "$f" && return 0
  if grep -q '\[ *\]' "$f"; then
    sed -i 's/\[ *\]/[rabbitmq_auth_mechanism_ssl]/' "$f"
  else
    sed -i '0,/\[/s//[rabbitmq_auth_mechanism_ssl,/' "$f"
  fi
}

# tls_provision_user WHAT DONE CTL FAIL: the broker user of the client certificate, for
# EXTERNAL login: no password (PLAIN cannot log in as it), all permissions on /. Users live in
# the node's database: done once per database, which the file DONE (in it) marks. CTL and FAIL
# are the broker's rabbitmqctl and failure functions; WHAT prefixes the message.
tls_provision_user() {
  local what=$1 done_file=$2 ctl=$3 fail=$4
  [[ -e $done_file ]] && return 0
  if ! "$ctl" -q list_users | awk '{ print $1 }' | grep -qxF "$TLS_CLIENT_CN"; then
    "$ctl" -q add_user "$TLS_CLIENT_CN" "$(openssl rand -hex 16)" >/dev/null ||
      "$fail" "cannot add user $TLS_CLIENT_CN"
    "$ctl" -q clear_password "$TLS_CLIENT_CN" >/dev/null ||
      "$fail" "cannot clear the password of $TLS_CLIENT_CN"
  fi
  "$ctl" -q set_permissions -p / "$TLS_CLIENT_CN" '.*' '.*' '.*' >/dev/null ||
    "$fail" "cannot give $TLS_CLIENT_CN permissions on /"
  touch "$done_file"
  log "$what: user $TLS_CLIENT_CN (EXTERNAL login with $TLS_DIR/client.pem) has all permissions on /"
}

# ----------------------------------------------------------------------------- MariaDB/MySQL TLS
# The TLS MariaDB and both MySQL 9.7 servers use the same test CA and server certificate as the
# brokers: $MARIA_TLS_CERTS (IDEMQ_TEST_MYSQL_TLS_DIR, which tests/integration/test_tls_mysql.c
# reads) holds copies of $TLS_DIR's ca.pem, server.pem, server.key, client.pem, client.key
# (for REQUIRE X509 accounts) and other-ca.pem (a CA that signed nothing the servers trust),
# readable by everyone: test material, read by the servers (user mysql) and by the tests. The
# MySQL 9.7 servers copy them into their root at each start (m97_prepare).
MARIA_TLS_FILES=(ca.pem server.pem server.key client.pem client.key other-ca.pem)

# maria_tls_certs_ok: $MARIA_TLS_CERTS is a complete copy of $TLS_DIR's files.
maria_tls_certs_ok() {
  local f
  [[ -e $MARIA_TLS_CERTS/.complete ]] || return 1
  for f in "${MARIA_TLS_FILES[@]}"; do
    cmp -s "$TLS_DIR/$f" "$MARIA_TLS_CERTS/$f" || return 1
  done
}

# maria_tls_certs: the test PKI (tls_prepare), and its copies in $MARIA_TLS_CERTS made anew when
# they differ (a first start, new certificates in $TLS_DIR, or a set from an older
# scripts/services, whose CA was another), except while the TLS MariaDB runs: it reads them at
# start-up, so it, the MySQL servers started meanwhile and the tests keep the set it has until
# it is restarted. One maker at a time: the MySQL 9.7 servers start in parallel with it.
maria_tls_certs() {
  tls_prepare
  maria_tls_certs_ok && return 0
  local lock pid f
  mkdir -p "$MARIA_TLS_DIR"
  exec {lock}>"$MARIA_TLS_DIR/certs.lock"
  flock "$lock"
  if maria_tls_certs_ok; then
    exec {lock}>&-
    return 0
  fi
  if [[ -e $MARIA_TLS_CERTS/.complete ]] && pid=$(maria_tls_pid); then
    exec {lock}>&-
    log "mariadb-tls: running (pid $pid) with the certificates in $MARIA_TLS_CERTS, which differ from $TLS_DIR's; 'scripts/services restart-mariadb-tls' takes the new ones"
    return 0
  fi
  rm -rf "$MARIA_TLS_CERTS"
  mkdir -p "$MARIA_TLS_CERTS"
  for f in "${MARIA_TLS_FILES[@]}"; do
    install -m 644 "$TLS_DIR/$f" "$MARIA_TLS_CERTS/" ||
      maria_tls_fail "cannot copy $TLS_DIR/$f to $MARIA_TLS_CERTS"
  done
  touch "$MARIA_TLS_CERTS/.complete"
  exec {lock}>&-
  log "mariadb-tls: the test CA and certificates of $TLS_DIR copied to $MARIA_TLS_CERTS"
}
