# shellcheck shell=bash
# Sourced by scripts/services (which sources scripts/lib.sh first): .state/env and what the commands on several services share.

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
    if [[ $STATE_DIR != "$ROOT/.state" ]]; then
      printf 'export IDEMQ_STATE_DIR=%q\n' "$STATE_DIR"
    fi
  } >"$ENV_FILE.tmp"
  mv "$ENV_FILE.tmp" "$ENV_FILE"
}

# cluster_cmd KIND: cluster_vars KIND for a command on that cluster (the 4.3 one needs root).
cluster_cmd() {
  cluster_vars "$1"
  [[ $1 != cluster43 ]] || is_root || die "cluster43: needs root (chroot and mounts)"
}

# stop_clusters: stop both clusters (the 4.3 one only where it can run).
stop_clusters() {
  cluster_vars cluster
  cluster_stop
  if is_root && [[ -e $SID_DONE ]]; then
    cluster_vars cluster43
    cluster_stop
  fi
}
