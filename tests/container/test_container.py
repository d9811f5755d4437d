#!/usr/bin/python3
"""Build the idemq container image with podman and run it against the local RabbitMQ and MariaDB.

  scripts/container-test                 setup -> services -> podman & co. -> Debian 12 base
                                         image (built once with debootstrap) -> image build ->
                                         checks -> workload
  scripts/container-test --rebuild-base  build the base image again (e.g. for Debian updates)
  scripts/container-test --no-cache      build the idemq image without podman's layer cache

Checks: the runtime image has no compiler and no -dev package, runs as a non-root user, every
shared library resolves, `idemq version` works, the image carries the HEALTHCHECK, and its
probe says healthy on a 200 from /healthz and unhealthy on a 404 or a closed port (stand-in
HTTP servers); then a workload in a fresh vhost and a fresh database: `idemq migrate`,
`idemq check` with the config the image ships, and `idemq run` in containers (network=host,
read-only root file system, config mounted read-only), N events plus N duplicate deliveries,
exactly N applied, the queues drained, the HEALTHCHECK passing against idemq's own /healthz
(skipped if idemq has no HTTP listener), and `podman stop` (SIGTERM) ending with exit code 0.
One line per check (PASS, FAIL or SKIP); last line: "container test: N passed, N failed".
Exit status: 0 when nothing failed, 1 otherwise (an abort outside a check counts as a failure),
2 on bad usage.

There is no Docker engine or registry here (../shared/MACHINE-NOTES.md, Containers): podman
runs as root with vfs storage, chroot isolation for builds and runc with an empty
default_ulimits list for runs; the base image localhost/debian:bookworm-slim is a debootstrap
minbase of the Debian mirror apt already uses. Both are cached in podman's storage, so re-runs
only rebuild the layers whose inputs changed.

Environment: IDEMQ_CONTAINER_IMAGE (default localhost/idemq:test), IDEMQ_CONTAINER_BASE
(default localhost/debian:bookworm-slim; an image that exists is used as is),
IDEMQ_DEBIAN_MIRROR (default: the bookworm mirror in apt's sources), IDEMQ_CONTAINER_EVENTS
(events in the workload, default 100), IDEMQ_SERVICES_ENV (the env file of servers that
already run, e.g. another checkout's .state/env: no setup, no `scripts/services start`),
the ports of scripts/lib.sh, IDEMQ_STATE_DIR.

The checks are written in Python (Debian's /usr/bin/python3, standard library only); podman,
debootstrap, rabbitmqctl and mariadb (through scripts/services) and amqp-publish are run as
commands, as a shell script would.
"""

import concurrent.futures
import os
import re
import shutil
import subprocess
import sys
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from images import (CT_DIR, CONTAINER, LOG_DIR, PODMAN_LOG, PROBE, ROOT, RUN_ID, STATE_DIR,  # noqa: E402
                    Abort, ImageBuilder, die, elapsed, free_port, is_uid_non_root, log, port_open, run,
                    show_tail, tail_text, warn)


class ContainerTest(ImageBuilder):
    def __init__(self, rebuild_base, no_cache):
        self.rebuild_base = rebuild_base
        self.no_cache = ["--no-cache"] if no_cache else []
        self.image = os.environ.get("IDEMQ_CONTAINER_IMAGE") or "localhost/idemq:test"
        self.base_image = os.environ.get("IDEMQ_CONTAINER_BASE") or "localhost/debian:bookworm-slim"
        self.events = os.environ.get("IDEMQ_CONTAINER_EVENTS") or "100"
        self.passed = self.failed = self.skipped = 0
        self.phases = []
        self.phase_name, self.phase_t0 = "", 0.0
        self.t_all = time.time()
        self.vhost = self.database = ""
        self.container_started = self.probe_started = False
        self.probe_server = None
        self.rootfs_tmp = ""
        self.env = dict(os.environ)

    # ------------------------------------------------------------------------- bookkeeping
    def passes(self, what):
        self.passed += 1
        print(f"  PASS  {what}", file=sys.stderr, flush=True)

    def fails(self, what):
        self.failed += 1
        print(f"  FAIL  {what}", file=sys.stderr, flush=True)

    def skip(self, what):
        self.skipped += 1
        print(f"  SKIP  {what}", file=sys.stderr, flush=True)

    def check(self, what, ok):
        """Count the result of one check and keep going either way."""
        (self.passes if ok else self.fails)(what)
        return ok

    def phase(self, name):
        """Close the running phase (printing its time) and open the next."""
        if self.phase_name:
            t = elapsed(self.phase_t0)
            self.phases.append(f"{self.phase_name:<28} {t:>7}s")
            log(f"phase '{self.phase_name}' done in {t}s")
        self.phase_name, self.phase_t0 = name, time.time()
        if name:
            log(f"phase: {name}")

    # ------------------------------------------------------------------------- tools
    def pm(self, *args, **kw):
        """podman with vfs storage and runc (crun fails here on cgroups and setrlimit)."""
        return run(["podman", "--storage-driver=vfs", "--runtime=runc", *args], env=self.env, **kw)

    def pm_logged(self, *args):
        """podman with its messages appended to podman.log; the exit status."""
        with open(PODMAN_LOG, "a") as f:
            return self.pm(*args, stdout=f, stderr=subprocess.STDOUT).returncode

    def services(self, *args, **kw):
        return run([self.env["IDEMQ_SERVICES"], *args], env=self.env, **kw)

    def sql(self, query, database=None, check=True):
        """The last line of the mariadb client's answer (root through the socket)."""
        db = [database if database is not None else self.database]
        r = self.services("mariadb", *[d for d in db if d], "-e", query)
        if r.returncode != 0:
            if check:
                die(f"mariadb failed: {tail_text(r.stderr, 5)}")
            return None
        lines = r.stdout.splitlines()
        return lines[-1] if lines else ""

    def rmq(self, *args):
        return self.services("rabbitmqctl", *args)

    def queue_totals(self):
        """(messages, consumers) summed over every queue of the vhost; None when rabbitmqctl fails
        (rather than reporting empty queues)."""
        r = self.rmq("-q", "list_queues", "-p", self.vhost, "--no-table-headers", "name", "messages",
                     "consumers")
        if r.returncode != 0:
            return None
        m = c = 0
        for line in r.stdout.splitlines():
            f = line.split("\t")
            if len(f) >= 3:
                m, c = m + int(f[1] or 0), c + int(f[2] or 0)
        return m, c

    def running(self):
        r = self.pm("container", "inspect", "--format", "{{.State.Running}}", CONTAINER)
        return r.returncode == 0 and r.stdout.strip() == "true"

    # ------------------------------------------------------------------------- cleanup, summary
    def cleanup(self, aborted):
        if self.probe_server is not None:
            self.probe_server.kill()
            self.probe_server.wait()
        if self.probe_started:
            self.pm_logged("rm", "-f", "-t", "0", PROBE)
        if self.rootfs_tmp:
            shutil.rmtree(self.rootfs_tmp, ignore_errors=True)
        if self.container_started:
            self.save_container_log()
            self.pm_logged("rm", "-f", "-t", "0", CONTAINER)
        if self.vhost:
            self.rmq("-q", "delete_vhost", self.vhost)
        if self.database:
            self.sql(f"DROP DATABASE IF EXISTS `{self.database}`", database="", check=False)
        if self.phase_name:
            self.phase("")
        if self.phases:
            print("timings:")
            for p in self.phases:
                print(f"  {p}")
            print(f"  {'total':<28} {elapsed(self.t_all):>7}s")
        # An abort outside a check (a failed build, a server that did not start) counts as a failure.
        if aborted and self.failed == 0:
            self.failed = 1
        extra = f" ({self.skipped} skipped)" if self.skipped else ""
        print(f"container test: {self.passed} passed, {self.failed} failed{extra}", flush=True)
        return 1 if self.failed else 0

    def save_container_log(self):
        with open(os.path.join(LOG_DIR, "container-test-idemq.log"), "w") as f:
            self.pm("logs", CONTAINER, stdout=f, stderr=subprocess.STDOUT)

    def main(self):
        aborted = False
        try:
            self.run_all()
        except Abort as e:
            print(f"==> ERROR: {e}", file=sys.stderr, flush=True)
            aborted = True
        except KeyboardInterrupt:
            print("==> ERROR: interrupted", file=sys.stderr, flush=True)
            aborted = True
        except Exception as e:  # a bug here must not leave containers, vhosts or databases behind
            print(f"==> ERROR: {type(e).__name__}: {e}", file=sys.stderr, flush=True)
            aborted = True
        return self.cleanup(aborted)

    # ========================================================================= the run
    def run_all(self):
        if not re.fullmatch(r"[1-9][0-9]{0,4}", self.events):
            die("IDEMQ_CONTAINER_EVENTS must be a number from 1 to 99999")
        self.events = int(self.events)
        os.makedirs(CT_DIR, exist_ok=True)
        os.makedirs(LOG_DIR, exist_ok=True)
        open(PODMAN_LOG, "w").close()
        conf = os.path.join(CT_DIR, "containers.conf")
        # crun fails here on cgroups and setrlimit: runc, and no default ulimits (MACHINE-NOTES.md).
        with open(conf, "w") as f:
            f.write("# Written by scripts/container-test.\n[containers]\ndefault_ulimits = []\n")
        self.env["CONTAINERS_CONF"] = conf

        self.phase("setup + services")
        env_file = os.environ.get("IDEMQ_SERVICES_ENV")
        if env_file:
            log(f"IDEMQ_SERVICES_ENV: using the servers of {env_file} (no setup, no services start)")
        else:
            for cmd in (["scripts/setup"], ["scripts/services", "start"]):
                if subprocess.run([os.path.join(ROOT, cmd[0]), *cmd[1:]]).returncode != 0:
                    die(f"{' '.join(cmd)} failed")
            env_file = os.path.join(STATE_DIR, "env")
        self.load_env(env_file)

        self.phase("container tools")
        self.install_tools()
        self.phase("base image")
        if self.rebuild_base or self.pm("image", "exists", self.base_image).returncode != 0:
            if not self.base_image.startswith("localhost/"):
                die(f"{self.base_image} does not exist; only a localhost/ base image is built here (no registry)")
            self.build_base_image()
        else:
            log(f"{self.base_image} exists (--rebuild-base to build it again)")
        self.phase("image build")
        self.build_image()
        self.phase("image checks")
        self.image_checks()
        self.probe_checks()
        self.phase("workload")
        self.workload()

    def load_env(self, env_file):
        """Source the services' env file in bash and take its variables."""
        if not os.path.isfile(env_file):
            die(f"no env file {env_file}: are the services running (scripts/services start)?")
        r = run(["bash", "-c", 'set -a; source "$1" >/dev/null; env -0', "_", env_file], check=True)
        for item in r.stdout.split("\0"):
            if "=" in item:
                k, v = item.split("=", 1)
                self.env[k] = v
        for var in ("IDEMQ_SERVICES", "IDEMQ_AMQP_PORT", "IDEMQ_MYSQL_PORT"):
            if not self.env.get(var):
                die(f"{env_file} sets no {var}")

    # ------------------------------------------------------------------------- image checks
    def image_checks(self):
        # Containers started only to look inside the image run without its HEALTHCHECK (whose
        # timers podman would try to hand to systemd, which is not there) and without a network.
        one_off = ["--rm", "--no-healthcheck", "--network=none"]
        # One container for the inside view (each start copies the image with vfs storage): its
        # default user, compilers on PATH, toolchain and -dev packages, unresolved libraries.
        script = r'''
  echo "uid=$(id -u)"
  echo "compilers=$(command -v cc gcc c99 clang tcc g++ c++ as ld | tr "\n" " ")"
  echo "packages=$(dpkg-query -W -f "\${Package}\n" |
    grep -E -- "-dev\$|^(gcc|cpp|g\+\+|clang|make|cmake)(-[0-9.]+)?\$|^binutils|^libbinutils" |
    tr "\n" " ")"
  echo "missing=$(ldd /usr/local/bin/idemq | grep "not found" | tr "\n" " ")"
'''
        with open(PODMAN_LOG, "a") as plog:
            r = self.pm("run", *one_off, "--entrypoint", "bash", self.image, "-c", script, stderr=plog)
        if r.returncode != 0:
            show_tail(PODMAN_LOG, 5)
            die(f"cannot run a container of {self.image}")
        fields = {}
        for line in r.stdout.splitlines():
            k, _, v = line.partition("=")
            fields.setdefault(k, v.rstrip(" "))
        uid, compilers = fields.get("uid", ""), fields.get("compilers", "")
        dev, missing = fields.get("packages", ""), fields.get("missing", "")
        self.check("runtime image has no compiler or assembler on PATH"
                   + (f" (found: {compilers})" if compilers else ""), compilers == "")
        self.check("runtime image has no -dev or toolchain package" + (f" (found: {dev})" if dev else ""),
                   dev == "")
        self.check(f"runs as a non-root user (id -u: {uid})", is_uid_non_root(uid))
        cfg_user = self.pm("image", "inspect", "--format", "{{.Config.User}}", self.image, check=True).stdout.strip()
        self.check(f"image config sets a numeric non-root USER ({cfg_user})",
                   is_uid_non_root(cfg_user.split(":")[0]))
        self.check("every shared library of idemq resolves" + (f" (missing: {missing})" if missing else ""),
                   missing == "")
        with open(PODMAN_LOG, "a") as plog:
            version = self.pm("run", *one_off, self.image, "version", stderr=plog).stdout.rstrip("\n")
        self.check(f"idemq version through the entrypoint ({version})",
                   re.search(r"^idemq [0-9]", version, re.M) is not None)
        hc = self.pm("image", "inspect", "--format",
                     '{{if .Config.Healthcheck}}{{join .Config.Healthcheck.Test " "}}{{end}}', self.image)
        self.check("image carries a HEALTHCHECK on /healthz", "/healthz" in hc.stdout)
        entry = self.pm("image", "inspect", "--format",
                        '{{join .Config.Entrypoint " "}} | {{join .Config.Cmd " "}} | {{.Config.StopSignal}}',
                        self.image, check=True).stdout.rstrip("\n")
        self.check(f"entrypoint idemq, command run, stop signal SIGTERM ({entry})",
                   re.search(r"^/usr/local/bin/idemq \| run \| (SIGTERM|15)$", entry, re.M) is not None)

    def probe_checks(self):
        """The HEALTHCHECK's HTTP probe against stand-in servers on one loopback port, whatever
        idemq itself serves: python's http.server answers 200 where a file named healthz exists
        and 404 elsewhere; then nothing listens at all."""
        port = free_port()
        for d, has in (("probe-200", True), ("probe-404", False)):
            os.makedirs(os.path.join(CT_DIR, d), exist_ok=True)
            path = os.path.join(CT_DIR, d, "healthz")
            if has:
                open(path, "w").close()
            elif os.path.exists(path):
                os.remove(path)
        self.probe_started = True
        if self.pm_logged("run", "-d", "--name", PROBE, "--network=host", "-e", f"IDEMQ_HEALTH_PORT={port}",
                          "--entrypoint", "sleep", self.image, "300") != 0:
            die(f"podman run failed (see {PODMAN_LOG})")

        def serve(directory):
            with open(os.path.join(CT_DIR, "probe-server.log"), "a") as f:
                self.probe_server = subprocess.Popen(
                    [sys.executable, "-m", "http.server", "--bind", "127.0.0.1", "--directory",
                     directory, str(port)], stdout=f, stderr=subprocess.STDOUT)
            for _ in range(50):
                if port_open(port):
                    return
                time.sleep(0.1)
            warn(f"the stand-in HTTP server did not start on 127.0.0.1:{port}")

        def unserve():
            if self.probe_server is not None:
                self.probe_server.kill()
                self.probe_server.wait()
                self.probe_server = None

        def probe():  # 0 healthy, 1 unhealthy
            return self.pm_logged("healthcheck", "run", PROBE)

        serve(os.path.join(CT_DIR, "probe-200"))
        rc = probe()
        self.check(f"HEALTHCHECK probe: healthy on a 200 from /healthz (stand-in server; exit {rc})", rc == 0)
        unserve()
        serve(os.path.join(CT_DIR, "probe-404"))
        rc = probe()
        self.check(f"HEALTHCHECK probe: unhealthy on a 404 (stand-in server; exit {rc})", rc == 1)
        unserve()
        rc = probe()
        self.check(f"HEALTHCHECK probe: unhealthy when nothing listens (exit {rc})", rc == 1)
        self.pm_logged("rm", "-f", "-t", "0", PROBE)
        self.probe_started = False

    # ------------------------------------------------------------------------- workload
    def workload(self):
        n = self.events
        self.vhost, self.database, queue = f"idemq-ct-{RUN_ID}", f"idemq_ct_{RUN_ID}", "ct.payments"
        amqp_url = f"amqp://guest:guest@127.0.0.1:{self.env['IDEMQ_AMQP_PORT']}/{self.vhost}"
        mysql_url = f"mysql://idemq:idemq@127.0.0.1:{self.env['IDEMQ_MYSQL_PORT']}/{self.database}"
        for args in (["-q", "add_vhost", self.vhost],
                     ["-q", "set_permissions", "-p", self.vhost, "guest", ".*", ".*", ".*"]):
            r = self.rmq(*args)
            if r.returncode != 0:
                die(f"rabbitmqctl {args[1]} failed: {tail_text(r.stderr, 5)}")
        self.sql(f"CREATE DATABASE `{self.database}` CHARACTER SET utf8mb4", database="")
        values = ",".join(f"('ct-{i:05d}','PAYING')" for i in range(1, n + 1))
        self.sql("CREATE TABLE orders (order_id VARCHAR(64) NOT NULL PRIMARY KEY, status VARCHAR(32) NOT NULL,"
                 " amount BIGINT NULL) ENGINE=InnoDB;"
                 f" INSERT INTO orders (order_id, status) VALUES {values};")

        # A free loopback port for the HTTP endpoint: the container shares the host's network,
        # where another idemq may hold the default 9464.
        http_port = free_port()
        config = os.path.join(CT_DIR, "idemq.yaml")
        with open(config, "w") as f:
            f.write(f"""# Written by scripts/container-test; the URLs come from IDEMQ_AMQP_URL / IDEMQ_MYSQL_URL.
amqp:
  url: "amqp://placeholder:placeholder@127.0.0.1:1/%2f"
  prefetch: 64
mysql:
  url: "mysql://placeholder:placeholder@127.0.0.1:1/placeholder"
  workers: 4
log:
  level: info
http:
  listen: "127.0.0.1:{http_port}"
shutdown_timeout: 25s
consumers:
  - queue: {queue}
    handler_name: pay-callback
    retry: {{max_retries: 3, base: 500ms, jitter: 200ms, max_delay: 5s}}
    handler:
      type: state_machine
      table: orders
      key_column: order_id
      key_field: order_id
      state_column: status
      event_field: event_type
      on_illegal: dead_letter
      transitions:
        PAY_SUCCESS: {{from: [PAYING], to: PAID}}
      set: {{amount: amount}}
""")
        os.chmod(config, 0o644)  # read by uid 10001 in the container

        # --read-only: idemq needs no writable file system (podman still mounts tmpfs on /tmp and /run).
        run_args = ["--network=host", "--read-only", "-v", f"{config}:/etc/idemq/idemq.yaml:ro",
                    "-e", f"IDEMQ_AMQP_URL={amqp_url}", "-e", f"IDEMQ_MYSQL_URL={mysql_url}",
                    "-e", f"IDEMQ_HEALTH_PORT={http_port}"]
        r = self.pm("run", "--rm", "--no-healthcheck", *run_args, self.image, "migrate", stderr=subprocess.STDOUT)
        self.check(f"idemq migrate in a container (exit {r.returncode})", r.returncode == 0)
        if r.returncode != 0:
            print(tail_text(r.stdout, 20), file=sys.stderr)
        tables = self.sql(r"SHOW TABLES LIKE 'msg\_dedup'")
        self.check("msg_dedup exists after migrate", tables == "msg_dedup")

        # The config the image ships (examples/idemq.yaml), with the URLs from the environment.
        r = self.pm("run", "--rm", "--no-healthcheck", "--network=host", "-e", f"IDEMQ_AMQP_URL={amqp_url}",
                    "-e", f"IDEMQ_MYSQL_URL={mysql_url}", self.image, "check", stderr=subprocess.STDOUT)
        self.check(f"idemq check with the shipped /etc/idemq/idemq.yaml and URLs from env (exit {r.returncode})",
                   r.returncode == 0)
        if r.returncode != 0:
            print(tail_text(r.stdout, 20), file=sys.stderr)

        self.container_started = True
        # (podman 4.3 logs errors about systemd timers for the HEALTHCHECK here: harmless, no systemd)
        if self.pm_logged("run", "-d", "--name", CONTAINER, *run_args, self.image) != 0:
            show_tail(PODMAN_LOG, 5)
            die("podman run failed")

        # Ready when its consumer is registered on the work queue (independent of log wording).
        ready, deadline = False, time.time() + 60
        while time.time() < deadline and self.running():
            totals = self.queue_totals()
            if totals and totals[1] >= 1:
                ready = True
                break
            time.sleep(0.5)
        self.check("idemq run in a container (read-only root file system) is consuming", ready)
        if not ready:
            print(tail_text(self.pm("logs", CONTAINER, stderr=subprocess.STDOUT).stdout, 30), file=sys.stderr)
            die("idemq did not start consuming in the container")

        log(f"publishing {n} PAY_SUCCESS events and {n} duplicate deliveries to {self.vhost}/{queue}")
        t_pub = time.time()

        def event(message_id, i):  # one JSON payment callback
            order = f"ct-{i:05d}"
            return (f'{{"message_id":"{message_id}","biz_key":"order_id:{order}:PAY_SUCCESS",'
                    f'"order_id":"{order}","event_type":"PAY_SUCCESS","amount":{i * 100}}}')

        def publish_all(bodies):  # one amqp-publish per message, 4 at a time (each is a connection)
            def one(body):
                return run(["amqp-publish", f"--url={amqp_url}", "-r", queue, "-C", "application/json",
                            "-p", "-b", body])
            with concurrent.futures.ThreadPoolExecutor(4) as pool:
                bad = [r for r in pool.map(one, bodies) if r.returncode != 0]
            if bad:
                die(f"{len(bad)} amqp-publish call(s) failed: {tail_text(bad[0].stderr, 5)}")

        publish_all([event(f"m-{i}", i) for i in range(1, n + 1)])
        # The same business events delivered again (a producer's retry: new message id, same biz_key).
        publish_all([event(f"m-{i}-again", i) for i in range(1, n + 1)])
        log(f"published {2 * n} messages in {elapsed(t_pub)}s")

        # Settled: every queue of the vhost empty (acked) and N dedup rows. A server that does not
        # answer for a moment (the local servers are shared with other tests) only means "not yet".
        settled, deadline = False, time.time() + 180
        while time.time() < deadline and self.running():
            if self.sql("SELECT COUNT(*) FROM msg_dedup", check=False) == str(n):
                totals = self.queue_totals()
                if totals and totals[0] == 0:
                    settled = True
                    break
            time.sleep(0.5)
        log(f"workload settled in {elapsed(t_pub)}s after the first publish")
        self.check(f"all {2 * n} deliveries acked, queues empty", settled)

        if port_open(http_port):
            with open(PODMAN_LOG, "a") as plog:
                r = self.pm("healthcheck", "run", CONTAINER, stderr=plog)
            hc = r.stdout.strip()
            self.check(f"HEALTHCHECK (GET /healthz on 127.0.0.1:{http_port}) passes: exit {r.returncode}"
                       + (f", {hc}" if hc else ""), r.returncode == 0)
        else:
            self.skip(f"HEALTHCHECK: nothing listens on 127.0.0.1:{http_port} (this idemq has no HTTP endpoint yet)")

        t_stop = time.time()
        self.pm_logged("stop", "-t", "40", CONTAINER)
        stop_s = elapsed(t_stop)
        exit_code = self.pm("container", "inspect", "--format", "{{.State.ExitCode}}", CONTAINER).stdout.strip()
        self.check(f"podman stop (SIGTERM): exit code {exit_code} after {stop_s}s", exit_code == "0")

        rows = self.sql("SELECT COUNT(*) FROM msg_dedup")
        self.check(f"{n} dedup rows (got {rows})", rows == str(n))
        paid = self.sql("SELECT COUNT(*) FROM orders WHERE status = 'PAID'")
        self.check(f"{n} orders PAID (got {paid})", paid == str(n))
        amount_ok = self.sql("SELECT COUNT(*) FROM orders WHERE amount = CAST(SUBSTRING(order_id, 4) AS UNSIGNED) * 100")
        self.check(f"every order carries its event's amount (got {amount_ok})", amount_ok == str(n))
        self.save_container_log()
        idemq_log = open(os.path.join(LOG_DIR, "container-test-idemq.log"), errors="replace").read()
        summaries = re.findall(r'summary processed=[^"]*', idemq_log)
        if summaries:
            summary = summaries[-1]
            m = re.search(r"processed=([0-9]+) deduped=([0-9]+) state_noop=([0-9]+).*dead_lettered=([0-9]+)",
                          summary)
            processed, deduped, noop, dead = (int(x) for x in m.groups()) if m else (-1, -1, -1, -1)
            self.check(f"idemq's summary: {n} processed, {n} deduped or no-op, none dead-lettered ({summary})",
                       processed == n and deduped + noop == n and dead == 0)
        else:
            self.skip("idemq's exit summary line not found in its log")
        log(f"idemq's log: {os.path.relpath(LOG_DIR, ROOT)}/container-test-idemq.log; "
            f"image: {self.image} ({self.image_mb} MB)")


def usage(code):
    print(__doc__.split("\nThe checks are written")[0].strip("\n"), file=sys.stderr)
    sys.exit(code)


def main(argv):
    rebuild_base = no_cache = False
    for arg in argv:
        if arg == "--rebuild-base":
            rebuild_base = True
        elif arg == "--no-cache":
            no_cache = True
        elif arg in ("-h", "--help"):
            usage(2)
        else:
            warn(f"unknown argument: {arg}")
            usage(2)
    return ContainerTest(rebuild_base, no_cache).main()


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
