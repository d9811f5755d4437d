#!/usr/bin/python3
"""Build the idemq container image with podman and run it against the local RabbitMQ and MariaDB.

  scripts/container-test                 setup -> services -> podman & co. -> Debian 12 base
                                         image (built once with debootstrap) -> image build ->
                                         checks -> workload
  scripts/container-test --rebuild-base  build the base image again (e.g. for Debian updates)
  scripts/container-test --no-cache      build the idemq image without podman's layer cache

Checks: the image is at most 30 MB (its size in the PASS line); from its exported file system
(it has no shell to look inside with): no compiler, no -dev package, no shell (and `podman run
--entrypoint /bin/sh` fails), the CA bundle, /etc/passwd and /etc/group naming 10001,
nsswitch.conf's "hosts: files dns", the default config; through the image's own dynamic loader
(ld.so --list) every shared library of idemq and of MariaDB Connector/C's client plugins
resolves, caching_sha2_password among them; the image config's numeric non-root USER,
entrypoint, command and stop signal, and its HEALTHCHECK, `idemq health` in exec form; `idemq
version` works. Then the HEALTHCHECK, run by `podman healthcheck run` in a container whose
`idemq run` waits for absent servers (it runs as uid 10001, read from /proc): healthy on a 200
from /healthz, unhealthy on a 404, on a server that never answers and on a closed port
(stand-in servers). Then a workload in a fresh vhost and a fresh database, the servers named
`rabbitmq` and `mysql` (--add-host, resolved through /etc/hosts): `idemq migrate`, `idemq check`
with the config the image ships, `idemq migrate` against MySQL 9.7 (caching_sha2_password;
skipped when it does not run), `idemq check` over amqps:// (the image's trust store loaded and
refusing the test CA; the test CA as ca_file verified), and `idemq run` in containers (network=host, read-only root file
system, config mounted read-only), N events plus N duplicate deliveries, exactly N applied, the
queues drained, the HEALTHCHECK passing against idemq's own /healthz (skipped if idemq has no
HTTP listener), and `podman stop` (SIGTERM) ending with exit code 0.
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
import json
import os
import posixpath
import re
import shutil
import socket
import subprocess
import sys
import tarfile
import time

sys.dont_write_bytecode = True  # no __pycache__ in the source tree
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from images import (CT_DIR, CONTAINER, LOG_DIR, PODMAN_LOG, PROBE, ROOT, RUN_ID, STATE_DIR,  # noqa: E402
                    Abort, ImageBuilder, die, elapsed, free_port, is_uid_non_root, log, port_open, run,
                    show_tail, tail_text, warn)


# Issue 23: the image holds idemq, its libraries and a few files, FROM scratch (it was 89 MB on
# Debian slim); 30 MB leaves room for library updates, not for a distribution.
MAX_IMAGE_MB = 30
# The dynamic loader at the path the binary's PT_INTERP names (x86-64): it lists what a shared
# object needs the way it will load it.
LOADER = "/lib64/ld-linux-x86-64.so.2"


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
        self.vhost = self.database = self.database97 = ""
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
        if self.database97:
            run([self.env["IDEMQ_SERVICES"], "mariadb", "-e", f"DROP DATABASE IF EXISTS `{self.database97}`"],
                env=dict(self.env, IDEMQ_TEST_DB="mysql"))
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
    def image_files(self):
        """The image's file system, read from `podman export` of a container that is created but
        never started (the image has no shell to look inside with): {path: TarInfo} and the
        contents of the few small files the checks read."""
        wanted = {"/etc/passwd", "/etc/group", "/etc/nsswitch.conf", "/var/lib/dpkg/status"}
        name = f"idemq-ct-files-{RUN_ID}"
        if self.pm_logged("create", "--name", name, "--network=none", "--no-healthcheck", self.image) != 0:
            show_tail(PODMAN_LOG, 5)
            die(f"cannot create a container of {self.image}")
        files, contents = {}, {}
        try:
            exp = subprocess.Popen(["podman", "--storage-driver=vfs", "--runtime=runc", "export", name],
                                   stdout=subprocess.PIPE, env=self.env)
            with tarfile.open(fileobj=exp.stdout, mode="r|") as tar:
                for m in tar:
                    path = "/" + re.sub(r"^(\./)+", "", m.name).strip("/")
                    if path == "/" or path == "/.":
                        continue
                    files[path] = m
                    if path in wanted and m.isfile():
                        contents[path] = tar.extractfile(m).read().decode(errors="replace")
            if exp.wait() != 0:
                die(f"podman export of {self.image} failed")
        finally:
            self.pm_logged("rm", "-f", name)
        return files, contents

    @staticmethod
    def resolve(files, path, depth=0):
        """PATH in the image's file system with its symlinks followed (the image's own, as its
        loader would); None when it does not exist there."""
        parts = [p for p in path.split("/") if p]
        cur = ""
        for i, part in enumerate(parts):
            nxt = f"{cur}/{part}"
            m = files.get(nxt)
            if m is None:
                return None
            if m.issym():
                if depth > 20:
                    return None
                base = m.linkname if m.linkname.startswith("/") else posixpath.join(cur or "/", m.linkname)
                rest = "/".join(parts[i + 1:])
                return ContainerTest.resolve(files, posixpath.normpath(f"{base}/{rest}" if rest else base),
                                             depth + 1)
            cur = nxt
        return cur or "/"

    def image_checks(self):
        # Containers started only to look inside the image run without its HEALTHCHECK (whose
        # timers podman would try to hand to systemd, which is not there) and without a network.
        one_off = ["--rm", "--no-healthcheck", "--network=none"]
        size = int(self.pm("image", "inspect", "--format", "{{.Size}}", self.image, check=True).stdout.strip())
        self.check(f"image size {size / 1e6:.1f} MB ({size} bytes) is at most {MAX_IMAGE_MB} MB",
                   size <= MAX_IMAGE_MB * 1000 * 1000)

        # The inside view, from the exported file system: nothing in it runs a shell.
        files, contents = self.image_files()
        bin_dirs = ["/usr/local/sbin", "/usr/local/bin", "/usr/sbin", "/usr/bin", "/sbin", "/bin"]

        def on_path(names):
            return " ".join(f"{d}/{n}" for d in bin_dirs for n in names if self.resolve(files, f"{d}/{n}"))

        compilers = on_path(["cc", "gcc", "c99", "clang", "tcc", "g++", "c++", "as", "ld"])
        self.check("runtime image has no compiler or assembler on PATH"
                   + (f" (found: {compilers})" if compilers else ""), compilers == "")
        status = contents.get("/var/lib/dpkg/status", "")
        packages = re.findall(r"^Package: (\S+)", status, re.M)
        dev = " ".join(p for p in packages
                       if re.search(r"-dev$|^(gcc|cpp|g\+\+|clang|make|cmake)(-[0-9.]+)?$|^binutils|^libbinutils", p))
        self.check("runtime image has no -dev or toolchain package"
                   + (f" (found: {dev})" if dev else f" ({len(packages)} packages installed)"), dev == "")
        shells = on_path(["sh", "bash", "dash", "ash", "busybox"])
        with open(PODMAN_LOG, "a") as plog:
            sh_rc = self.pm("run", *one_off, "--entrypoint", "/bin/sh", self.image, "-c", "true",
                            stderr=plog).returncode
        self.check(f"no shell in the image (podman run --entrypoint /bin/sh: exit {sh_rc}"
                   + (f"; found: {shells}" if shells else "") + ")", sh_rc != 0 and shells == "")
        cfg_user = self.pm("image", "inspect", "--format", "{{.Config.User}}", self.image, check=True).stdout.strip()
        self.check(f"image config sets a numeric non-root USER ({cfg_user})",
                   is_uid_non_root(cfg_user.split(":")[0]))

        # Every shared object idemq loads resolves inside the image, as the image's own dynamic
        # loader sees it (ld.so --list: the binary, then each Connector/C client plugin).
        plugins = sorted(p for p in files if re.search(r"/libmariadb3/plugin/[^/]+\.so$", p))
        missing = []
        for obj in ["/usr/local/bin/idemq", *plugins]:
            with open(PODMAN_LOG, "a") as plog:
                r = self.pm("run", *one_off, "--entrypoint", LOADER, self.image, "--list", obj, stderr=plog)
            if r.returncode != 0 or "not found" in r.stdout:
                missing.append(f"{obj}: exit {r.returncode} {' '.join(l.strip() for l in r.stdout.splitlines() if 'not found' in l)}")
        self.check(f"every shared library of idemq and of {len(plugins)} MariaDB client plugin(s) resolves"
                   + (f" (missing: {'; '.join(missing)})" if missing else ""), missing == [])
        sha2 = [p for p in plugins if p.endswith("/caching_sha2_password.so")]
        self.check(f"caching_sha2_password client plugin at libmariadb's path ({sha2[0] if sha2 else 'absent'})",
                   sha2 == ["/usr/lib/x86_64-linux-gnu/libmariadb3/plugin/caching_sha2_password.so"])

        # What else idemq reads at run time: the CA bundle (also as OpenSSL's default cert.pem),
        # the user and group 10001 by name, and "hosts: files dns" for names like `rabbitmq`.
        bundle = self.resolve(files, "/etc/ssl/certs/ca-certificates.crt")
        bundle_size = files[bundle].size if bundle else 0
        default_store = self.resolve(files, "/usr/lib/ssl/cert.pem")
        passwd_ok = re.search(r"^idemq:x:10001:10001:", contents.get("/etc/passwd", ""), re.M) is not None
        group_ok = re.search(r"^idemq:x:10001:", contents.get("/etc/group", ""), re.M) is not None
        hosts = re.search(r"^hosts:\s*(.*)$", contents.get("/etc/nsswitch.conf", ""), re.M)
        hosts = hosts.group(1).split() if hosts else []
        self.check(f"CA bundle ({bundle_size} bytes; /usr/lib/ssl/cert.pem -> {default_store}), /etc/passwd and "
                   f"/etc/group name idemq 10001, nsswitch hosts: {' '.join(hosts)}",
                   bundle_size > 100000 and default_store == bundle and passwd_ok and group_ok
                   and hosts[:2] == ["files", "dns"])
        self.check(f"default config /etc/idemq/idemq.yaml in the image",
                   self.resolve(files, "/etc/idemq/idemq.yaml") is not None)
        self.image_file_count = sum(1 for m in files.values() if not m.isdir())

        with open(PODMAN_LOG, "a") as plog:
            version = self.pm("run", *one_off, self.image, "version", stderr=plog).stdout.rstrip("\n")
        self.check(f"idemq version through the entrypoint ({version})",
                   re.search(r"^idemq [0-9]", version, re.M) is not None)
        hc = self.pm("image", "inspect", "--format", "{{json .Config.Healthcheck}}", self.image).stdout.strip()
        try:
            test = (json.loads(hc) or {}).get("Test") or []
        except ValueError:
            test = []
        self.check(f"image carries the HEALTHCHECK idemq health in exec form, no shell ({' '.join(test)})",
                   test == ["CMD", "/usr/local/bin/idemq", "health"])
        entry = self.pm("image", "inspect", "--format",
                        '{{join .Config.Entrypoint " "}} | {{join .Config.Cmd " "}} | {{.Config.StopSignal}}',
                        self.image, check=True).stdout.rstrip("\n")
        self.check(f"entrypoint idemq, command run, stop signal SIGTERM ({entry})",
                   re.search(r"^/usr/local/bin/idemq \| run \| (SIGTERM|15)$", entry, re.M) is not None)

    def health_log(self, container):
        """The output of the container's last health check (what `docker inspect` shows), one line."""
        r = self.pm("container", "inspect", "--format", "{{json .State.Health}}", container)
        try:
            log_entries = (json.loads(r.stdout) or {}).get("Log") or []
        except ValueError:
            return ""
        return " ".join((log_entries[-1].get("Output") or "").split()) if log_entries else ""

    def probe_checks(self):
        """The image's HEALTHCHECK (`idemq health`) against stand-in servers on one loopback port,
        whatever idemq itself serves: python's http.server answers 200 where a file named healthz
        exists and 404 elsewhere; a socket that accepts and never answers; then nothing listens
        at all. The container it runs in runs `idemq run` with both servers at the closed port 1
        (it waits for them, and opens no HTTP port): the image has no `sleep`."""
        port = free_port()
        for d, has in (("probe-200", True), ("probe-404", False)):
            os.makedirs(os.path.join(CT_DIR, d), exist_ok=True)
            path = os.path.join(CT_DIR, d, "healthz")
            if has:
                open(path, "w").close()
            elif os.path.exists(path):
                os.remove(path)
        probe_config = os.path.join(CT_DIR, "probe.yaml")
        with open(probe_config, "w") as f:
            f.write("""# Written by scripts/container-test: an idemq that waits for servers that are not there.
amqp: {url: "amqp://probe:probe@127.0.0.1:1/%2f"}
mysql: {url: "mysql://probe:probe@127.0.0.1:1/probe"}
consumers:
  - queue: ct.probe
    handler_name: probe
    handler:
      type: state_machine
      table: orders
      key_column: order_id
      key_field: order_id
      state_column: status
      event_field: event_type
      transitions:
        PAY_SUCCESS: {from: [PAYING], to: PAID}
""")
        os.chmod(probe_config, 0o644)  # read by uid 10001 in the container
        self.probe_started = True
        if self.pm_logged("run", "-d", "--name", PROBE, "--network=host", "--read-only",
                          "-v", f"{probe_config}:/etc/idemq/idemq.yaml:ro",
                          "-e", f"IDEMQ_HEALTH_PORT={port}", self.image) != 0:
            die(f"podman run failed (see {PODMAN_LOG})")

        # Who its process runs as, seen from the host (there is no `id` inside to ask).
        time.sleep(0.5)
        pid = self.pm("container", "inspect", "--format", "{{.State.Pid}}", PROBE).stdout.strip()
        uid = ""
        try:
            with open(f"/proc/{pid}/status") as f:
                uid = next((line.split()[1] for line in f if line.startswith("Uid:")), "")
        except (OSError, ValueError):
            pass
        self.check(f"runs as a non-root user (uid of idemq's process: {uid or 'unknown'})", is_uid_non_root(uid))

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
        self.check(f"HEALTHCHECK probe: healthy on a 200 from /healthz (stand-in server; exit {rc}: "
                   f"{self.health_log(PROBE)})", rc == 0)
        unserve()
        serve(os.path.join(CT_DIR, "probe-404"))
        rc = probe()
        self.check(f"HEALTHCHECK probe: unhealthy on a 404 (stand-in server; exit {rc}: {self.health_log(PROBE)})",
                   rc == 1)
        unserve()
        silent = socket.socket()
        # The stand-in server just closed connections on this port (TIME_WAIT).
        silent.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            silent.bind(("127.0.0.1", port))
            silent.listen(8)  # the kernel completes the handshake; nobody reads or answers
            t0 = time.time()
            rc = probe()
            self.check(f"HEALTHCHECK probe: unhealthy on a server that never answers (exit {rc} after "
                       f"{elapsed(t0)}s: {self.health_log(PROBE)})", rc == 1)
        finally:
            silent.close()
        rc = probe()
        self.check(f"HEALTHCHECK probe: unhealthy when nothing listens (exit {rc}: {self.health_log(PROBE)})",
                   rc == 1)
        self.pm_logged("rm", "-f", "-t", "0", PROBE)
        self.probe_started = False

    # ------------------------------------------------------------------------- workload
    def mysql97_check(self, ct_amqp_url, names):
        """MySQL 9.7 accounts use caching_sha2_password, a client plugin libmariadb dlopens from
        its plugin folder: `idemq migrate` in a container against a fresh database there proves
        the image carries it where libmariadb looks. Skipped when MySQL 9.7 does not run here."""
        port = self.env.get("IDEMQ_MYSQL97_PORT", "")
        if not port.isdigit() or not port_open(int(port)):
            self.skip("MySQL 9.7 (caching_sha2_password) is not running here (IDEMQ_MYSQL97_PORT)")
            return
        env97 = dict(self.env, IDEMQ_TEST_DB="mysql")
        db = f"idemq_ct97_{RUN_ID}"
        r = run([self.env["IDEMQ_SERVICES"], "mariadb", "-N", "-e",
                 f"CREATE DATABASE `{db}`; SELECT plugin FROM mysql.user WHERE user = 'idemq' LIMIT 1"], env=env97)
        if r.returncode != 0:
            self.skip(f"MySQL 9.7: cannot create a database ({tail_text(r.stderr, 1)})")
            return
        self.database97 = db
        plugin = (r.stdout.split() or ["?"])[-1]
        url = f"mysql://idemq:idemq@mysql:{port}/{db}"
        r = self.pm("run", "--rm", "--no-healthcheck", "--network=host", "--read-only", *names,
                    "-e", f"IDEMQ_AMQP_URL={ct_amqp_url}", "-e", f"IDEMQ_MYSQL_URL={url}", self.image, "migrate",
                    stderr=subprocess.STDOUT)
        self.check(f"idemq migrate in a container against MySQL 9.7 (account plugin {plugin}; exit {r.returncode})",
                   r.returncode == 0)
        if r.returncode != 0:
            print(tail_text(r.stdout, 20), file=sys.stderr)

    def tls_checks(self, config, mysql_url, names):
        """amqps:// through the image's OpenSSL: with no ca_file the system trust store, the CA
        bundle the image carries, is loaded and refuses the test CA's certificate (rather than
        missing); with the test CA mounted as ca_file the handshake is verified. Skipped without
        the TLS listener of scripts/services."""
        port, tls_dir = self.env.get("IDEMQ_AMQPS_PORT", ""), self.env.get("IDEMQ_TEST_TLS_DIR", "")
        ca = os.path.join(tls_dir, "ca.pem")
        if not port.isdigit() or not port_open(int(port)) or not os.path.isfile(ca):
            self.skip("amqps:// in a container: no RabbitMQ TLS listener here (IDEMQ_AMQPS_PORT, IDEMQ_TEST_TLS_DIR)")
            return
        url = f"amqps://guest:guest@127.0.0.1:{port}/{self.vhost}"
        base = ["run", "--rm", "--no-healthcheck", "--network=host", "--read-only", *names,
                "-e", f"IDEMQ_AMQP_URL={url}", "-e", f"IDEMQ_MYSQL_URL={mysql_url}"]
        r = self.pm(*base, "-v", f"{config}:/etc/idemq/idemq.yaml:ro", self.image, "check", stderr=subprocess.STDOUT)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("amqp ")), "")
        self.check(f"amqps:// with the image's trust store refuses the test CA (exit {r.returncode}): {line[:160]}",
                   r.returncode != 0 and "system trust store (/etc/ssl/certs/ca-certificates.crt)" in line
                   and "does not exist" not in line)
        tls_config = os.path.join(CT_DIR, "idemq-tls.yaml")
        with open(config) as f, open(tls_config, "w") as out:
            out.write(f.read().replace("  prefetch: 64\n", "  prefetch: 64\n  tls: {ca_file: /etc/idemq/ca.pem}\n", 1))
        os.chmod(tls_config, 0o644)
        r = self.pm(*base, "-v", f"{tls_config}:/etc/idemq/idemq.yaml:ro", "-v", f"{ca}:/etc/idemq/ca.pem:ro",
                    self.image, "check", stderr=subprocess.STDOUT)
        line = next((ln for ln in r.stdout.splitlines() if ln.startswith("amqp    tls")), "")
        self.check(f"amqps:// with the test CA as ca_file (exit {r.returncode}): {line}",
                   r.returncode == 0 and "verified" in line)
        if r.returncode != 0:
            print(tail_text(r.stdout, 20), file=sys.stderr)

    def workload(self):
        n = self.events
        self.vhost, self.database, queue = f"idemq-ct-{RUN_ID}", f"idemq_ct_{RUN_ID}", "ct.payments"
        amqp_url = f"amqp://guest:guest@127.0.0.1:{self.env['IDEMQ_AMQP_PORT']}/{self.vhost}"
        # In the containers the servers go by name, as in compose: `rabbitmq` and `mysql` resolve
        # through /etc/hosts (--add-host), which the image's nsswitch.conf puts before DNS.
        ct_amqp_url = f"amqp://guest:guest@rabbitmq:{self.env['IDEMQ_AMQP_PORT']}/{self.vhost}"
        mysql_url = f"mysql://idemq:idemq@mysql:{self.env['IDEMQ_MYSQL_PORT']}/{self.database}"
        names = ["--add-host", "rabbitmq:127.0.0.1", "--add-host", "mysql:127.0.0.1"]
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
        run_args = ["--network=host", "--read-only", *names, "-v", f"{config}:/etc/idemq/idemq.yaml:ro",
                    "-e", f"IDEMQ_AMQP_URL={ct_amqp_url}", "-e", f"IDEMQ_MYSQL_URL={mysql_url}",
                    "-e", f"IDEMQ_HEALTH_PORT={http_port}"]
        r = self.pm("run", "--rm", "--no-healthcheck", *run_args, self.image, "migrate", stderr=subprocess.STDOUT)
        self.check(f"idemq migrate in a container, MariaDB by host name mysql (exit {r.returncode})",
                   r.returncode == 0)
        if r.returncode != 0:
            print(tail_text(r.stdout, 20), file=sys.stderr)
        tables = self.sql(r"SHOW TABLES LIKE 'msg\_dedup'")
        self.check("msg_dedup exists after migrate", tables == "msg_dedup")

        # The config the image ships (examples/idemq.yaml), with the URLs from the environment.
        r = self.pm("run", "--rm", "--no-healthcheck", "--network=host", *names, "-e", f"IDEMQ_AMQP_URL={ct_amqp_url}",
                    "-e", f"IDEMQ_MYSQL_URL={mysql_url}", self.image, "check", stderr=subprocess.STDOUT)
        self.check(f"idemq check with the shipped /etc/idemq/idemq.yaml and URLs from env (exit {r.returncode})",
                   r.returncode == 0)
        if r.returncode != 0:
            print(tail_text(r.stdout, 20), file=sys.stderr)

        self.mysql97_check(ct_amqp_url, names)
        self.tls_checks(config, mysql_url, names)

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
            self.check(f"HEALTHCHECK (idemq health, GET /healthz on 127.0.0.1:{http_port}) passes: exit "
                       f"{r.returncode}" + (f", {hc}" if hc else "") + f": {self.health_log(CONTAINER)}",
                       r.returncode == 0)
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
