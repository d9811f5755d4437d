#!/usr/bin/python3
"""The Debian package, installed the way users install it, in a clean Debian 12 root.

    tests/package/test_package.py [--no-build]
    tests/package/test_package.py --prepare-root    only the cached Debian 12 root, if missing

Builds the packages (scripts/package), installs them with apt-get in a fresh Debian 12 root
(debootstrap, cached once under .state/package-root; every run works on a throw-away overlay of
it), and checks what a user gets: files, modes, conffiles, the idemq user, the systemd unit
(systemd-analyze verify, its hardening lines), then runs the unit's own ExecStart as the idemq
user against the test servers with NOTIFY_SOCKET pointing at this test: READY=1 once consuming,
50 messages (5 of them duplicates) applied exactly once, SIGTERM -> STOPPING=1 and exit 0. The
same package installed again keeps the edited conffiles and their mode. Then apt-get remove
(binary gone, conffiles kept) and purge (nothing left).

Needs root (debootstrap, chroot, mounts), the servers of scripts/services (source .state/env for
IDEMQ_TEST_AMQP_URL and IDEMQ_TEST_MYSQL_URL) and the host's amqp-publish, amqp-delete-queue and
mariadb clients. Prints one PASS/FAIL line per check and "package test: N passed, N failed";
exits 0 only when nothing failed. --no-build takes the .deb files already in build-deb/.
Environment: IDEMQ_STATE_DIR (default .state), IDEMQ_DEBIAN_MIRROR (default: apt's), IDEMQ_JOBS.
"""
import fcntl
import hashlib
import os
import re
import select
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.parse

ROOT = os.path.realpath(os.path.join(os.path.dirname(__file__), "..", ".."))
STATE = os.environ.get("IDEMQ_STATE_DIR") or os.path.join(ROOT, ".state")
BASE = os.path.join(STATE, "package-root")  # the cached Debian 12 root (read-only lower layer)
BASE_DONE = os.path.join(STATE, "package-root.done")
APT_ARCHIVES = os.path.join(STATE, "package-apt-archives")  # downloaded .debs, kept across runs
# What the cached root is built with; a marker with another recipe means build it again.
RECIPE = "debootstrap --variant=minbase --include=systemd bookworm; apt-get update; v1"
# One name per checkout: two trees testing at once on the shared servers do not meet, and a
# tree's leftovers (the two exchanges, which amqp-tools cannot delete) are reused run after run.
TREE = hashlib.sha1(ROOT.encode()).hexdigest()[:8]
QUEUE = f"idemq-pkgtest-{TREE}"
DATABASE = f"idemq_pkgtest_{TREE}"
MESSAGES, DUPLICATES = 50, 5
DEADLINE = 60
HARDENING = [
    "User=idemq", "Type=notify", "ExecStart=/usr/bin/idemq run -c /etc/idemq/idemq.yaml",
    "EnvironmentFile=-/etc/default/idemq", "ProtectSystem=strict", "ProtectHome=yes",
    "PrivateTmp=yes", "PrivateDevices=yes", "NoNewPrivileges=yes", "CapabilityBoundingSet=",
    "AmbientCapabilities=", "RestrictAddressFamilies=AF_INET AF_INET6 AF_UNIX",
    "ProtectKernelTunables=yes", "ProtectKernelModules=yes", "ProtectKernelLogs=yes",
    "ProtectControlGroups=yes", "RestrictNamespaces=yes", "LockPersonality=yes",
    "MemoryDenyWriteExecute=yes", "RestrictRealtime=yes", "SystemCallArchitectures=native",
    "SystemCallFilter=@system-service", "UMask=0077", "Restart=on-failure",
    "TimeoutStopSec=35s", "KillSignal=SIGTERM",
]

passed = failed = 0


def check(ok, what, detail=""):
    global passed, failed
    if ok:
        passed += 1
        print(f"PASS {what}", flush=True)
    else:
        failed += 1
        print(f"FAIL {what}{': ' + detail if detail else ''}", flush=True)
    return ok


def note(text):
    print(f"==> {text}", file=sys.stderr, flush=True)


def run(args, check_rc=True, **kw):
    """Runs args; returns the CompletedProcess with text output (stderr merged)."""
    r = subprocess.run(args, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                       stdin=subprocess.DEVNULL, **kw)
    if check_rc and r.returncode != 0:
        shown = re.sub(r"//([^:/@]+):[^@/]*@", r"//\1:***@", " ".join(args))  # URL passwords
        raise RuntimeError(f"{shown} exited {r.returncode}:\n{r.stdout[-3000:]}")
    return r


def debian_mirror():
    """The mirror scripts/services' roots use (scripts/services.d/roots.sh, debian_mirror)."""
    r = run(["bash", "-c", 'source scripts/lib.sh && source scripts/services.d/roots.sh && '
             'debian_mirror'], cwd=ROOT)
    return r.stdout.strip().splitlines()[-1]


def ensure_base_root():
    """Debootstraps the cached root once (about a minute), one build at a time."""
    os.makedirs(STATE, exist_ok=True)
    with open(os.path.join(STATE, "package-root.lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if os.path.exists(BASE_DONE) and open(BASE_DONE).read().startswith(RECIPE + "\n"):
            return
        if os.path.exists(BASE):
            note(f"removing the stale or incomplete root {BASE}")
            run(["rm", "-rf", "--one-file-system", BASE])
        mirror = debian_mirror()
        log = os.path.join(STATE, "logs", "package-debootstrap.log")
        os.makedirs(os.path.dirname(log), exist_ok=True)
        note(f"building a Debian 12 root in {BASE} from {mirror} (once, about a minute; "
             f"log: {log})")
        t0 = time.monotonic()
        with open(log, "w") as out:
            subprocess.run(["debootstrap", "--variant=minbase", "--include=systemd", "bookworm",
                            BASE, mirror], stdout=out, stderr=subprocess.STDOUT, check=True,
                           stdin=subprocess.DEVNULL)
        # No maintainer script may start a service from the root on this machine.
        with open(os.path.join(BASE, "usr/sbin/policy-rc.d"), "w") as f:
            f.write("#!/bin/sh\nexit 101\n")
        os.chmod(os.path.join(BASE, "usr/sbin/policy-rc.d"), 0o755)
        shutil.copy("/etc/resolv.conf", os.path.join(BASE, "etc/resolv.conf"))
        # The package lists once, in the cached layer: each run's install then only downloads
        # what the archive folder does not hold yet.
        with open(log, "a") as out:
            subprocess.run(["unshare", "--mount", "--propagation", "private", "--", "sh", "-c",
                            f"mount -t proc proc {BASE}/proc && chroot {BASE} apt-get update"],
                           stdout=out, stderr=subprocess.STDOUT, check=True,
                           stdin=subprocess.DEVNULL)
        with open(BASE_DONE, "w") as f:
            f.write(f"{RECIPE}\nmirror {mirror}\n")
        note(f"root ready ({time.monotonic() - t0:.0f} s)")


def mount_overlay(work):
    """A throw-away root: the cached one under an overlay whose changes live in work (tmpfs).
    Called inside this process's private mount namespace, so everything goes away with it."""
    run(["mount", "-t", "tmpfs", "tmpfs", work])
    for d in ("upper", "work", "root"):
        os.mkdir(os.path.join(work, d))
    mnt = os.path.join(work, "root")
    run(["mount", "-t", "overlay", "overlay", "-o",
         f"lowerdir={BASE},upperdir={work}/upper,workdir={work}/work", mnt])
    run(["mount", "-t", "proc", "proc", f"{mnt}/proc"])
    run(["mount", "--bind", "/dev", f"{mnt}/dev"])
    run(["mount", "-t", "sysfs", "sysfs", f"{mnt}/sys"])
    os.makedirs(os.path.join(APT_ARCHIVES, "partial"), exist_ok=True)
    run(["mount", "--bind", APT_ARCHIVES, f"{mnt}/var/cache/apt/archives"])
    shutil.copy("/etc/resolv.conf", f"{mnt}/etc/resolv.conf")
    return mnt


def in_root(mnt, *args, check_rc=False, env=None):
    command = ["chroot", mnt]
    if env is not None:
        command += ["/usr/bin/env", "-i"] + [f"{k}={v}" for k, v in env.items()]
    return run(command + list(args), check_rc=check_rc)


def apt(mnt, *args):
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "DEBIAN_FRONTEND": "noninteractive",
           "LANG": "C.UTF-8"}
    r = in_root(mnt, "apt-get", "-y", "-q", "-o", "Dpkg::Use-Pty=0", *args, env=env)
    if r.returncode != 0 and args[0] == "install" and "404" in r.stdout:
        note("the cached package lists are stale: apt-get update, then again")
        in_root(mnt, "apt-get", "-q", "update", env=env)
        r = in_root(mnt, "apt-get", "-y", "-q", *args, env=env)
    return r


def stat_of(mnt, path):
    """(mode, owner, group) of path in the root, or None."""
    r = in_root(mnt, "stat", "-c", "%a %U %G", path)
    return tuple(r.stdout.split()) if r.returncode == 0 else None


# ------------------------------------------------------------------------- servers
def mysql_args():
    u = urllib.parse.urlsplit(os.environ["IDEMQ_TEST_MYSQL_URL"])
    return ["mariadb", "-h", u.hostname, "-P", str(u.port or 3306), "-u",
            urllib.parse.unquote(u.username), "--batch", "--skip-column-names"]


def sql(statement, database=None):
    # The password in the environment: not on a command line that ps and error messages show.
    password = urllib.parse.unquote(urllib.parse.urlsplit(os.environ["IDEMQ_TEST_MYSQL_URL"]).password or "")
    r = run(mysql_args() + ([database] if database else []) + ["-e", statement],
            env=dict(os.environ, MYSQL_PWD=password))
    return r.stdout.strip()


def database_url():
    u = urllib.parse.urlsplit(os.environ["IDEMQ_TEST_MYSQL_URL"])
    return urllib.parse.urlunsplit((u.scheme, u.netloc, "/" + DATABASE, u.query, ""))


def delete_topology():
    url = os.environ["IDEMQ_TEST_AMQP_URL"]
    names = [QUEUE, f"{QUEUE}.dlq"] + [f"{QUEUE}.retry.{n}" for n in range(1, 7)]
    for name in names:
        run(["amqp-delete-queue", f"--url={url}", "-q", name], check_rc=False)


def publish(bodies):
    url = os.environ["IDEMQ_TEST_AMQP_URL"]
    for body in bodies:
        run(["amqp-publish", f"--url={url}", "-r", QUEUE, "-C", "application/json", "-p", "-b",
             body])


# ------------------------------------------------------------------------- the steps
def build():
    t0 = time.monotonic()
    r = run([os.path.join(ROOT, "scripts", "package")], check_rc=False)
    seconds = time.monotonic() - t0
    check(r.returncode == 0, f"scripts/package builds the packages ({seconds:.0f} s)",
          r.stdout[-2000:])


def find_debs():
    d = os.path.join(ROOT, "build-deb")
    debs = sorted(f for f in os.listdir(d) if f.endswith(".deb")) if os.path.isdir(d) else []
    main = [f for f in debs if f.startswith("idemq_")]
    dev = [f for f in debs if f.startswith("idemq-dev_")]
    if not check(len(main) == 1 and len(dev) == 1, "one idemq and one idemq-dev .deb in build-deb",
                 " ".join(debs)):
        return None, None
    main, dev = os.path.join(d, main[0]), os.path.join(d, dev[0])
    note(f"{os.path.basename(main)}: {os.path.getsize(main)} bytes; "
         f"{os.path.basename(dev)}: {os.path.getsize(dev)} bytes")
    depends = run(["dpkg-deb", "-f", main, "Depends"]).stdout
    check("libmariadb3" in depends and "librabbitmq4" in depends and "adduser" in depends,
          "idemq depends on its libraries (dpkg-shlibdeps) and adduser", depends.strip())
    return main, dev


def install(mnt, main, dev):
    for deb in (main, dev):
        shutil.copy(deb, f"{mnt}/tmp/")
    t0 = time.monotonic()
    r = apt(mnt, "install", "--no-install-recommends", f"/tmp/{os.path.basename(main)}",
            f"/tmp/{os.path.basename(dev)}")
    return check(r.returncode == 0,
                 f"apt-get install ./idemq_*.deb ./idemq-dev_*.deb in a clean Debian 12 root "
                 f"({time.monotonic() - t0:.0f} s)", r.stdout[-3000:])


def check_files(mnt):
    expected = {
        "/usr/bin/idemq": ("755", "root", "root"),
        "/etc/idemq/idemq.yaml": ("640", "root", "idemq"),
        "/etc/default/idemq": ("600", "root", "root"),
        "/lib/systemd/system/idemq.service": ("644", "root", "root"),
        "/usr/share/doc/idemq/README.md": ("644", "root", "root"),
        "/usr/share/doc/idemq/copyright": ("644", "root", "root"),
        "/usr/lib/idemq/plugins": ("755", "root", "root"),
        "/usr/include/idemq/plugin.h": ("644", "root", "root"),
    }
    for path, want in expected.items():
        got = stat_of(mnt, path)
        check(got == want, f"{path} is {' '.join(want)}", f"found {got}")
    owner = in_root(mnt, "dpkg", "-S", "/usr/include/idemq/plugin.h").stdout
    check(owner.startswith("idemq-dev:"), "plugin.h comes from idemq-dev", owner.strip())
    conffiles = in_root(mnt, "dpkg-query", "-W", "-f=${Conffiles}", "idemq").stdout
    for path in ("/etc/idemq/idemq.yaml", "/etc/default/idemq"):
        check(re.search(rf"^ {re.escape(path)} [0-9a-f]{{32}}$", conffiles, re.M) is not None,
              f"{path} is a conffile", conffiles.strip())


def check_user(mnt):
    entry = in_root(mnt, "getent", "passwd", "idemq").stdout.strip().split(":")
    ok = len(entry) == 7
    check(ok and entry[6] == "/usr/sbin/nologin", "user idemq exists with shell /usr/sbin/nologin",
          ":".join(entry))
    check(ok and int(entry[2]) < 1000 and not os.path.exists(f"{mnt}{entry[5]}"),
          "idemq is a system user without a home directory", ":".join(entry))
    group = in_root(mnt, "getent", "group", "idemq").stdout.strip()
    check(ok and group.split(":")[2:3] == [entry[3]], "group idemq is its primary group", group)


def check_unit(mnt):
    r = in_root(mnt, "systemd-analyze", "verify", "idemq.service",
                env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "SYSTEMD_LOG_COLOR": "0"})
    check(r.returncode == 0 and r.stdout.strip() == "",
          "systemd-analyze verify idemq.service: clean", r.stdout.strip()[-2000:])
    # systemd's own score of the sandbox, 0 (locked down) to 10; the unit scores 1.2 today.
    r = in_root(mnt, "systemd-analyze", "security", "--offline=true", "--threshold=20",
                "--no-pager", "idemq.service", env={"PATH": "/usr/sbin:/usr/bin:/sbin:/bin"})
    m = re.search(r"Overall exposure level for idemq.service: ([0-9.]+)", r.stdout)
    check(r.returncode == 0 and m is not None,
          f"systemd-analyze security: exposure {m.group(1) if m else '?'} (at most 2.0)",
          r.stdout.strip()[-2000:])
    text = open(f"{mnt}/lib/systemd/system/idemq.service").read()
    lines = {line.strip() for line in text.splitlines()}
    missing = [h for h in HARDENING if h not in lines]
    check(not missing, f"the unit has the {len(HARDENING)} required settings",
          "missing: " + ", ".join(missing))
    m = re.search(r"^ExecStart=(.*)$", text, re.M)
    return m.group(1).split() if m else None


def configure(mnt):
    """What the user does after installing: URLs in /etc/default/idemq, the queue in the YAML file
    (our own, on the shared test broker), the HTTP port (any free one: others use 9464)."""
    with open(f"{mnt}/etc/default/idemq", "a") as f:
        f.write(f"IDEMQ_AMQP_URL={os.environ['IDEMQ_TEST_AMQP_URL']}\n"
                f"IDEMQ_MYSQL_URL={database_url()}\n")
    path = f"{mnt}/etc/idemq/idemq.yaml"
    text = open(path).read()
    text = text.replace("- queue: payments ", f"- queue: {QUEUE} ", 1)
    text = text.replace('listen: "127.0.0.1:9464"', 'listen: "127.0.0.1:0"', 1)
    with open(path, "w") as f:
        f.write(text)


def unit_environment(mnt):
    """The environment systemd would give ExecStart: EnvironmentFile's NAME=value lines."""
    env = {"PATH": "/usr/sbin:/usr/bin:/sbin:/bin", "LANG": "C.UTF-8"}
    for line in open(f"{mnt}/etc/default/idemq"):
        line = line.strip()
        if line and not line.startswith("#") and "=" in line:
            k, v = line.split("=", 1)
            env[k] = v
    return env


def as_idemq(command):
    return ["/usr/bin/setpriv", "--reuid=idemq", "--regid=idemq", "--init-groups",
            "--no-new-privs", "--"] + command


def run_service(mnt, exec_start, work):
    sql(f"DROP DATABASE IF EXISTS `{DATABASE}`")
    sql(f"CREATE DATABASE `{DATABASE}` CHARACTER SET utf8mb4")
    sql("CREATE TABLE orders (order_id VARCHAR(64) PRIMARY KEY, status VARCHAR(32) NOT NULL, "
        "amount BIGINT NULL) ENGINE=InnoDB", DATABASE)
    distinct = MESSAGES - DUPLICATES
    sql("INSERT INTO orders (order_id, status) VALUES " +
        ",".join(f"('pkg{i}', 'PAYING')" for i in range(distinct)), DATABASE)
    delete_topology()
    env = unit_environment(mnt)
    config = exec_start[exec_start.index("-c") + 1]
    r = in_root(mnt, *as_idemq(["/usr/bin/idemq", "migrate", "-c", config]), env=env)
    check(r.returncode == 0, "idemq migrate as the idemq user", r.stdout[-2000:])
    # check connects to both servers and looks at the tables: after migrate.
    r = in_root(mnt, *as_idemq(["/usr/bin/idemq", "check", "-c", config]), env=env)
    check(r.returncode == 0, "the shipped configuration passes idemq check (URLs from "
          "/etc/default/idemq)", r.stdout[:2000])

    # The service manager's end of Type=notify: a datagram socket the idemq user may write to.
    notify_path = "/run/idemq-pkgtest-notify"
    manager = socket.socket(socket.AF_UNIX, socket.SOCK_DGRAM)
    manager.bind(f"{mnt}{notify_path}")
    os.chmod(f"{mnt}{notify_path}", 0o666)
    env["NOTIFY_SOCKET"] = notify_path
    log_path = os.path.join(work, "idemq.log")  # tmpfs of this run
    log = open(log_path, "w")
    note(f"ExecStart as idemq: {' '.join(exec_start)}")
    proc = subprocess.Popen(["chroot", mnt, "/usr/bin/env", "-i"] +
                            [f"{k}={v}" for k, v in env.items()] + as_idemq(exec_start),
                            stdout=log, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL)

    def datagram(timeout):
        ready, _, _ = select.select([manager], [], [], timeout)
        return manager.recv(4096).decode() if ready else None

    def log_text():
        return open(log_path).read()

    try:
        first = datagram(DEADLINE)
        consuming = "started consuming" in log_text()
        check(first is not None and first.split("\n")[0] == "READY=1",
              "READY=1 on NOTIFY_SOCKET", repr(first))
        check(consuming, "READY=1 came after the \"started consuming\" log line")
        t0 = time.monotonic()
        bodies = [f'{{"biz_key":"order_id:pkg{i}:PAY_SUCCESS","order_id":"pkg{i}",'
                  f'"event_type":"PAY_SUCCESS","amount":{i}}}'
                  for i in list(range(distinct)) + list(range(DUPLICATES))]
        publish(bodies)
        settled = 0
        while time.monotonic() - t0 < DEADLINE:
            text = log_text()
            settled = text.count('"outcome":"processed"') + text.count('"outcome":"deduped"')
            if settled >= MESSAGES:
                break
            time.sleep(0.2)
        check(settled == MESSAGES, f"{MESSAGES} messages settled ({time.monotonic() - t0:.1f} s "
              "from the first publish)", f"{settled} settled")
        paid = sql("SELECT COUNT(*) FROM orders WHERE status = 'PAID'", DATABASE)
        dedup = sql("SELECT COUNT(*) FROM msg_dedup", DATABASE)
        check(paid == str(distinct) and dedup == str(distinct),
              f"applied exactly once: {distinct} orders PAID, {distinct} dedup rows",
              f"{paid} PAID, {dedup} dedup rows")
        proc.send_signal(signal.SIGTERM)
        stopping = datagram(DEADLINE)
        check(stopping is not None and stopping.split("\n")[0] == "STOPPING=1",
              "SIGTERM -> STOPPING=1 on NOTIFY_SOCKET", repr(stopping))
        try:
            rc = proc.wait(40)
        except subprocess.TimeoutExpired:
            rc = None
        check(rc == 0, "idemq run exits 0 after SIGTERM", f"exit status {rc}")
        m = re.search(r"summary processed=(\d+) deduped=(\d+)", log_text())
        check(m is not None and m.groups() == (str(distinct), str(DUPLICATES)),
              f"its summary: processed={distinct} deduped={DUPLICATES}",
              m.group(0) if m else "no summary line")
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        manager.close()
        log.close()
        if failed:
            note(f"idemq's log (last lines):\n{log_text()[-3000:]}")
        delete_topology()
        sql(f"DROP DATABASE IF EXISTS `{DATABASE}`")


def reinstall(mnt, main):
    """An upgrade's path (postinst configure with the old version): the edits and the
    configuration's owner and mode survive it."""
    r = in_root(mnt, "dpkg", "-i", f"/tmp/{os.path.basename(main)}")
    check(r.returncode == 0, "dpkg -i of the same version again (the upgrade path)",
          r.stdout[-2000:])
    check(QUEUE in open(f"{mnt}/etc/idemq/idemq.yaml").read() and
          "IDEMQ_AMQP_URL=" in open(f"{mnt}/etc/default/idemq").read(),
          "the edited conffiles are kept")
    got = stat_of(mnt, "/etc/idemq/idemq.yaml")
    check(got == ("640", "root", "idemq"), "/etc/idemq/idemq.yaml is still 640 root idemq",
          f"found {got}")


def remove_and_purge(mnt):
    listed = [p for p in in_root(mnt, "dpkg", "-L", "idemq").stdout.splitlines() if p]
    r = apt(mnt, "remove", "idemq")
    check(r.returncode == 0 and not os.path.exists(f"{mnt}/usr/bin/idemq"),
          "apt-get remove idemq: /usr/bin/idemq is gone", r.stdout[-2000:])
    check(os.path.exists(f"{mnt}/etc/idemq/idemq.yaml") and
          os.path.exists(f"{mnt}/etc/default/idemq"),
          "after remove, the conffiles stay (with the user's edits)")
    check(in_root(mnt, "getent", "passwd", "idemq").returncode == 0,
          "after remove, the idemq user stays")
    r = apt(mnt, "purge", "idemq")
    check(r.returncode == 0, "apt-get purge idemq", r.stdout[-2000:])
    check(not os.path.exists(f"{mnt}/etc/idemq") and not os.path.exists(f"{mnt}/etc/default/idemq"),
          "after purge, /etc/idemq and /etc/default/idemq are gone")
    # Folders other packages share (/etc, /usr/bin, ...) stay; every file and idemq's own
    # folders must be gone.
    left = [p for p in listed if os.path.lexists(f"{mnt}{p}") and
            (not os.path.isdir(f"{mnt}{p}") or "idemq" in p)]
    check(not left, f"after purge, nothing of dpkg -L idemq's {len(listed)} paths is left",
          " ".join(left))
    overrides = in_root(mnt, "dpkg-statoverride", "--list").stdout
    check("idemq" not in overrides, "after purge, no statoverride is left", overrides.strip())
    status = in_root(mnt, "dpkg-query", "-W", "-f=${db:Status-Status}", "idemq").stdout
    check(status in ("", "not-installed"), "dpkg knows idemq no more", status)


def main():
    if os.geteuid() != 0:
        print("package test: needs root (debootstrap, chroot, mounts)", file=sys.stderr)
        return 2
    if sys.argv[1:] == ["--prepare-root"]:
        # scripts/test builds the root while the servers start; the test then finds it ready (or,
        # the lock held, waits for it).
        ensure_base_root()
        return 0
    for var in ("IDEMQ_TEST_AMQP_URL", "IDEMQ_TEST_MYSQL_URL"):
        if not os.environ.get(var):
            print(f"package test: {var} is not set (source .state/env after scripts/services "
                  "start)", file=sys.stderr)
            return 2
    if os.environ.get("IDEMQ_PACKAGE_TEST_NS") != "1":
        # Everything mounted from here on lives in a private mount namespace and goes away with
        # this process, however it ends.
        os.environ["IDEMQ_PACKAGE_TEST_NS"] = "1"
        os.execvp("unshare", ["unshare", "--mount", "--propagation", "private", "--",
                              sys.executable] + sys.argv)
    t0 = time.monotonic()
    if "--no-build" not in sys.argv[1:]:
        build()
    main_deb, dev_deb = find_debs()
    try:
        ensure_base_root()
    except (RuntimeError, subprocess.CalledProcessError) as e:
        check(False, "a Debian 12 root", str(e)[-2000:])
        main_deb = None
    if main_deb:
        os.makedirs(STATE, exist_ok=True)
        work = tempfile.mkdtemp(prefix="package-run.", dir=STATE)
        try:
            mnt = mount_overlay(work)
            if install(mnt, main_deb, dev_deb):
                check_files(mnt)
                check_user(mnt)
                exec_start = check_unit(mnt)
                if check(exec_start is not None, "the unit has an ExecStart line"):
                    configure(mnt)
                    run_service(mnt, exec_start, work)
                    reinstall(mnt, main_deb)
                remove_and_purge(mnt)
        except Exception as e:  # a step that could not run is a failed check, not a traceback
            check(False, "the test ran to its end", f"{type(e).__name__}: {e}")
        finally:
            # The mounts die with the namespace; the folder they sat on is removed now (tmpfs
            # first, so the overlay's upper layer is never walked on disk).
            run(["umount", "-R", work], check_rc=False)
            shutil.rmtree(work, ignore_errors=True)
    print(f"package test: {passed} passed, {failed} failed ({time.monotonic() - t0:.0f} s)")
    return 0 if failed == 0 and passed > 0 else 1


if __name__ == "__main__":
    sys.exit(main())
