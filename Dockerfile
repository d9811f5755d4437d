# idemq container image: a build stage with the compiler and the -dev packages, and a slim
# runtime stage with only the shared libraries the binary links, running as a non-root user.
#
#   docker build -t idemq .
#   podman build --format docker -t idemq .          # --format docker keeps the HEALTHCHECK
#                                                    # (the OCI image format has no HEALTHCHECK)
# Both stages start from BASE, a Debian 12 image. Without a registry, pass a locally built one:
#   --build-arg BASE=localhost/debian:bookworm-slim      (scripts/container-test builds it)
#
# Running it:
#   docker run -v $PWD/idemq.yaml:/etc/idemq/idemq.yaml:ro \
#     -e IDEMQ_AMQP_URL=amqp://user:pass@rabbitmq:5672/%2f \
#     -e IDEMQ_MYSQL_URL=mysql://user:pass@mysql:3306/idemq  idemq            # = idemq run
#   docker run ... idemq migrate          # create msg_dedup once, before the first run
#   docker run ... idemq check            # validate the config, connect to both, print the plan
# Configuration:
#   /etc/idemq/idemq.yaml   the config file (the image carries examples/idemq.yaml there; mount
#                           your own over it), or set IDEMQ_CONFIG to another path. An explicit
#                           "-c FILE" after the command wins over IDEMQ_CONFIG.
#   IDEMQ_AMQP_URL          overrides amqp.url  (amqp[s]://user:password@host:port/vhost)
#   IDEMQ_MYSQL_URL         overrides mysql.url (mysql://user:password@host:port/database)
#                           so that passwords stay out of the file (and out of the logs).
#   IDEMQ_HEALTH_PORT       port of the HEALTHCHECK's GET http://127.0.0.1:PORT/healthz
#                           (default 9464). http.listen must be reachable on 127.0.0.1 inside
#                           the container: 127.0.0.1:PORT, or 0.0.0.0:PORT to be scraped from
#                           outside (publish it with -p 9464:9464).
# Plugins (handler type plugin) are not in the image: build the .so against Debian 12 and mount
#   it where the config's `path` points, e.g. -v $PWD/ledger.so:/usr/local/lib/idemq/plugins/ledger.so:ro
# The root file system can be read-only (docker run --read-only): idemq writes nothing to it.
# Stopping: SIGTERM (docker stop) cancels the consumers, finishes in-flight work and exits 0
# within shutdown_timeout (default 25 s): give the runtime more than that before it kills
# (docker stop -t 30, compose stop_grace_period: 30s, Kubernetes terminationGracePeriodSeconds).

ARG BASE=debian:bookworm-slim

# ------------------------------------------------------------------------------------- build
FROM ${BASE} AS build
ARG DEBIAN_FRONTEND=noninteractive
# RelWithDebInfo is the configuration the test suites exercise (-O2); the binary is stripped.
ARG CMAKE_BUILD_TYPE=RelWithDebInfo
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      gcc libc6-dev make cmake pkg-config binutils \
      librabbitmq-dev default-libmysqlclient-dev libmsgpack-dev libuv1-dev libjansson-dev \
      libyaml-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
WORKDIR /src
# .dockerignore keeps build folders, .state and .git out of the context.
COPY . .
# /out holds exactly what the runtime stage adds, so that it is one COPY (one layer).
RUN cmake -S . -B /tmp/build -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE}" -DIDEMQ_TESTS=OFF \
 && cmake --build /tmp/build -j"$(nproc)" --target idemq \
 && install -D -m 0755 /tmp/build/idemq /out/usr/local/bin/idemq \
 && strip --strip-unneeded /out/usr/local/bin/idemq \
 && install -D -m 0644 examples/idemq.yaml /out/etc/idemq/idemq.yaml \
 && /out/usr/local/bin/idemq version

# ----------------------------------------------------------------------------------- runtime
FROM ${BASE} AS runtime
ARG DEBIAN_FRONTEND=noninteractive
# One package per shared library the binary links (ldd on the built binary, dpkg -S on each .so):
#   librabbitmq.so.4 librabbitmq4 · libmariadb.so.3 libmariadb3 (it also carries the
#   caching_sha2_password client plugin MySQL 8 accounts use by default) · libmsgpackc.so.2
#   libmsgpackc2 · libuv.so.1 libuv1 · libjansson.so.4 libjansson4 · libyaml-0.so.2 libyaml-0-2
#   · libssl.so.3 and libcrypto.so.3 libssl3 (broker/tls.c); zlib1g comes with them.
#   ca-certificates: the system trust store amqps:// verifies the broker with by default.
# No HTTP client is installed: the HEALTHCHECK below speaks HTTP through bash's /dev/tcp.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      librabbitmq4 libmariadb3 libmsgpackc2 libuv1 libjansson4 libyaml-0-2 libssl3 \
      ca-certificates \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/archives/*.deb /var/cache/apt/*.bin \
 && groupadd --system --gid 10001 idemq \
 && useradd --system --uid 10001 --gid 10001 --no-create-home --home-dir /nonexistent \
      --shell /usr/sbin/nologin idemq

# The image's settings come before the binary: with a layer-per-step builder (podman/buildah
# with vfs storage) they stay cached when only the sources change.
ENV IDEMQ_CONFIG=/etc/idemq/idemq.yaml
EXPOSE 9464
STOPSIGNAL SIGTERM
# GET /healthz (process alive) without curl: bash opens the TCP connection, sends an HTTP/1.0
# request, and only a "200" status line counts. Connection refused (HTTP endpoint off), a
# non-200 status or a silent server (read -t, and --timeout) all make the check fail.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["bash", "-c", "exec 3<>\"/dev/tcp/127.0.0.1/${IDEMQ_HEALTH_PORT:-9464}\" && printf 'GET /healthz HTTP/1.0\\r\\nHost: 127.0.0.1\\r\\n\\r\\n' >&3 && IFS=' ' read -r -t 4 proto status _ <&3 && [[ $proto == HTTP/1.* && $status == 200 ]]"]
ENTRYPOINT ["/usr/local/bin/idemq"]
CMD ["run"]
# Numeric, so that runtimes can verify "not root" (Kubernetes runAsNonRoot) without /etc/passwd.
USER 10001:10001

# /usr/local/bin/idemq and the default /etc/idemq/idemq.yaml (examples/idemq.yaml), root-owned.
COPY --from=build /out/ /
