# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): the one test PKI of the TLS servers.

# ----------------------------------------------------------------------------- RabbitMQ TLS
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
# the 3.10 broker and RabbitMQ 4.3 start in parallel, and a second maker would replace the
# first one's CA under its certificates.
tls_prepare() {
  command -v openssl >/dev/null 2>&1 || die "rabbitmq: openssl is not installed (scripts/setup installs it)"
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
  ) || die "rabbitmq: openssl could not make the test certificates (log: $LOG_DIR/tls.log)"
  chmod 644 "$TLS_DIR"/*.pem
  exec {lock}>&-
  log "rabbitmq: made a test CA and TLS certificates in $TLS_DIR ($(elapsed "$t0")s)"
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
# maria_tls_sign NAME SUBJECT EXTENSIONS: NAME.key and NAME.pem, signed by the test CA.
maria_tls_sign() {
  local name=$1 subject=$2 ext=$3
  openssl req -new -newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -keyout "$name.key" \
    -out "$name.csr" -subj "$subject"
  printf '%s\n' "$ext" >"$name.ext"
  openssl x509 -req -in "$name.csr" -CA ca.pem -CAkey ca.key -CAcreateserial -days 3650 \
    -extfile "$name.ext" -out "$name.pem"
  rm -f "$name.csr" "$name.ext"
}

# The test CA and certificates, once per state folder (.complete marks a finished set). EC keys
# take milliseconds. Readable by everyone: test material, read by the server (user mysql) and by
# the tests.
maria_tls_certs() {
  [[ -e $MARIA_TLS_CERTS/.complete ]] && return 0
  command -v openssl >/dev/null 2>&1 || die "mariadb-tls: openssl is not installed (scripts/setup installs it)"
  # The MySQL 9.7 servers use them too, and start in parallel with this one: one maker at a time
  # (a second one would remove the first one's files).
  local lock
  mkdir -p "$MARIA_TLS_DIR"
  exec {lock}>"$MARIA_TLS_DIR/certs.lock"
  flock "$lock"
  if [[ -e $MARIA_TLS_CERTS/.complete ]]; then
    exec {lock}>&-
    return 0
  fi
  rm -rf "$MARIA_TLS_CERTS"
  mkdir -p "$MARIA_TLS_CERTS"
  local ec=(-newkey ec -pkeyopt ec_paramgen_curve:prime256v1 -nodes -days 3650)
  if ! (
    set -e
    cd "$MARIA_TLS_CERTS"
    openssl req -x509 "${ec[@]}" -keyout ca.key -out ca.pem -subj "/CN=idemq test CA"
    openssl req -x509 "${ec[@]}" -keyout other-ca.key -out other-ca.pem -subj "/CN=idemq other CA"
    maria_tls_sign server "/CN=localhost" "subjectAltName=DNS:localhost,IP:127.0.0.1
basicConstraints=CA:FALSE
keyUsage=digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth"
    maria_tls_sign client "/CN=idemq client" "basicConstraints=CA:FALSE
keyUsage=digitalSignature
extendedKeyUsage=clientAuth"
    rm -f other-ca.key ca.srl
    chmod 644 ./*
  ) >"$MARIA_TLS_DIR/certs.log" 2>&1; then
    maria_tls_fail "openssl could not make the test certificates"
  fi
  touch "$MARIA_TLS_CERTS/.complete"
  exec {lock}>&-
  log "mariadb-tls: made a test CA and certificates in $MARIA_TLS_CERTS"
}
