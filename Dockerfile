# idemq container image: a build stage with the compiler and the -dev packages, and a runtime
# stage FROM scratch that holds only what idemq reads at run time (9.4 MB, was 89 MB on
# Debian slim): the stripped binary, the shared libraries it links (their full ldd closure, the
# dynamic loader and libc included), MariaDB Connector/C's client plugins (caching_sha2_password
# for MySQL 8/9 accounts, at the path libmariadb looks in), the CA bundle, a minimal
# /etc/passwd, /etc/group and /etc/nsswitch.conf, and the default config. No shell, no package
# manager, no HTTP client: the HEALTHCHECK is `idemq health`.
#
#   docker build -t idemq .
#   podman build --format docker -t idemq .          # --format docker keeps the HEALTHCHECK
#                                                    # (the OCI image format has no HEALTHCHECK)
# The build stage starts from BASE, a Debian 12 image (the runtime stage copies its libraries,
# so BASE decides their versions). Without a registry, pass a locally built one:
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
# Host names (amqp://…@rabbitmq, mysql://…@mysql) resolve through /etc/hosts, then DNS
#   (nsswitch.conf "hosts: files dns"; glibc 2.36 has both built in, no libnss_*.so needed).
# TLS: amqps:// and the database's verify modes use /etc/ssl/certs/ca-certificates.crt, also
#   reachable as OpenSSL's default /usr/lib/ssl/cert.pem. Logs and timestamps are UTC: no
#   zoneinfo.
# Plugins (handler type plugin) are not in the image: build the .so against Debian 12 and mount
#   it where the config's `path` points, e.g. -v $PWD/ledger.so:/usr/local/lib/idemq/plugins/ledger.so:ro.
#   It can link only libraries the image has (those of idemq; check with ldd).
# The root file system can be read-only (docker run --read-only): idemq writes nothing to it.
# Stopping: SIGTERM (docker stop) cancels the consumers, finishes in-flight work and exits 0
# within shutdown_timeout (default 25 s): give the runtime more than that before it kills
# (docker stop -t 30, compose stop_grace_period: 30s, Kubernetes terminationGracePeriodSeconds).
# Debugging without a shell: docker cp, or a debug container sharing its PID namespace
# (kubectl debug --target, docker run --pid container:NAME).

ARG BASE=debian:bookworm-slim

# ------------------------------------------------------------------------------------- build
FROM ${BASE} AS build
ARG DEBIAN_FRONTEND=noninteractive
# RelWithDebInfo is the configuration the test suites exercise (-O2); the binary is stripped.
ARG CMAKE_BUILD_TYPE=RelWithDebInfo
# The runtime libraries come with the -dev packages; ca-certificates builds the CA bundle and
# brings openssl's openssl.cnf, which the runtime stage copies.
RUN apt-get update \
 && apt-get install -y --no-install-recommends \
      gcc libc6-dev make cmake pkg-config binutils ca-certificates \
      librabbitmq-dev default-libmysqlclient-dev libmsgpack-dev libuv1-dev libjansson-dev \
      libyaml-dev libssl-dev \
 && rm -rf /var/lib/apt/lists/* /var/cache/apt/*.bin
WORKDIR /src
# .dockerignore keeps build folders, .state and .git out of the context.
COPY . .
# /out becomes the runtime stage's whole file system, in one COPY (one layer).
RUN cmake -S . -B /tmp/build -DCMAKE_BUILD_TYPE="${CMAKE_BUILD_TYPE}" -DIDEMQ_TESTS=OFF \
 && cmake --build /tmp/build -j"$(nproc)" --target idemq \
 && install -D -m 0755 /tmp/build/idemq /out/usr/local/bin/idemq \
 && strip --strip-unneeded /out/usr/local/bin/idemq \
 && install -D -m 0644 examples/idemq.yaml /out/etc/idemq/idemq.yaml \
 && /out/usr/local/bin/idemq version
# The shared-library closure, computed here by ldd rather than listed by hand, so that it follows
# the libraries' own dependencies when Debian changes them: the binary's, and those of every
# client plugin libmariadb ships (it dlopens them from its compiled-in plugindir when a server
# asks for that authentication, e.g. caching_sha2_password, MySQL 8/9's default).
# Each library keeps the path ldd names (the loader's search path and PT_INTERP point there)
# and its symlink chain; Debian's merged /usr makes /lib and /lib64 symlinks, copied as such.
# A "not found", here or when idemq and the plugins are loaded inside /out alone (chroot, the
# runtime stage's view), stops the build instead of shipping an image that cannot start.
RUN set -eu; \
    plugins="$(mariadb_config --plugindir)"; \
    test -f "${plugins}/caching_sha2_password.so"; \
    mkdir -p "/out${plugins}"; \
    cp -a "${plugins}"/*.so "/out${plugins}/"; \
    for d in /lib /lib64; do if [ -L "$d" ]; then cp -a "$d" /out/; fi; done; \
    for f in /out/usr/local/bin/idemq "${plugins}"/*.so; do \
      ldd "$f" | tee -a /tmp/ldd.txt | awk '/not found/ { print "missing: " $0; exit 1 }'; \
    done; \
    for lib in $(awk '{ for (i = 1; i <= NF; i++) if ($i ~ /^\//) print $i }' /tmp/ldd.txt | sort -u); do \
      dir="$(readlink -f "$(dirname "$lib")")"; \
      mkdir -p "/out${dir}"; \
      cp -a "${dir}/$(basename "$lib")" "/out${dir}/"; \
      real="$(readlink -f "$lib")"; \
      mkdir -p "/out$(dirname "$real")"; \
      cp -a "$real" "/out$(dirname "$real")/"; \
    done; \
    install -D -m 0644 /etc/ssl/certs/ca-certificates.crt /out/etc/ssl/certs/ca-certificates.crt; \
    install -D -m 0644 "$(readlink -f /usr/lib/ssl/openssl.cnf)" /out/etc/ssl/openssl.cnf; \
    mkdir -p /out/usr/lib/ssl; \
    ln -s /etc/ssl/certs/ca-certificates.crt /out/usr/lib/ssl/cert.pem; \
    ln -s /etc/ssl/certs /out/usr/lib/ssl/certs; \
    ln -s /etc/ssl/openssl.cnf /out/usr/lib/ssl/openssl.cnf; \
    printf 'root:x:0:0:root:/root:/usr/sbin/nologin\nidemq:x:10001:10001:idemq:/nonexistent:/usr/sbin/nologin\n' \
      > /out/etc/passwd; \
    printf 'root:x:0:\nidemq:x:10001:\n' > /out/etc/group; \
    printf 'passwd: files\ngroup: files\nhosts: files dns\n' > /out/etc/nsswitch.conf; \
    chmod 0644 /out/etc/passwd /out/etc/group /out/etc/nsswitch.conf; \
    chroot /out /usr/local/bin/idemq version; \
    for f in "${plugins}"/*.so; do \
      chroot /out /lib64/ld-linux-x86-64.so.2 --list "$f" | awk '/not found/ { print "missing: " $0; exit 1 }'; \
    done; \
    du -sh /out; find /out ! -type d | sort

# ----------------------------------------------------------------------------------- runtime
# Nothing but /out: no shell, no package manager. The same settings as the Debian-based image
# had, and the same user (10001, named in /out/etc/passwd).
FROM scratch AS runtime
ENV IDEMQ_CONFIG=/etc/idemq/idemq.yaml
EXPOSE 9464
STOPSIGNAL SIGTERM
# GET /healthz (process alive) with idemq itself: exit 0 only on a 200 status line; connection
# refused (HTTP endpoint off), another status or a silent server (--timeout, 4 s by default,
# within the runtime's 5 s) make it fail, with one line saying which in the health log.
HEALTHCHECK --interval=15s --timeout=5s --start-period=30s --retries=3 \
  CMD ["/usr/local/bin/idemq", "health"]
ENTRYPOINT ["/usr/local/bin/idemq"]
CMD ["run"]
# Numeric, so that runtimes can verify "not root" (Kubernetes runAsNonRoot) without /etc/passwd.
USER 10001:10001

# idemq, its libraries, the CA bundle and /etc files, all root-owned and not writable by 10001.
COPY --from=build /out/ /
