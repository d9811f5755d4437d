"""Helpers of tests/container/test_container.py: messages, commands, ports, and the podman
images it needs (the tools, the Debian 12 base image, the idemq image build)."""
import glob
import os
import random
import re
import shlex
import shutil
import socket
import subprocess
import sys
import tempfile
import time

ROOT = os.path.realpath(os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", ".."))
STATE_DIR = os.environ.get("IDEMQ_STATE_DIR") or os.path.join(ROOT, ".state")
LOG_DIR = os.path.join(STATE_DIR, "logs")
CT_DIR = os.path.join(STATE_DIR, "container-test")
PODMAN_LOG = os.path.join(CT_DIR, "podman.log")  # podman's own messages, for failure reports
RUN_ID = f"{int(time.time())}{os.getpid()}"
CONTAINER = f"idemq-ct-{RUN_ID}"
PROBE = f"idemq-ct-probe-{RUN_ID}"
TOOLS = ["podman", "buildah", "runc", "debootstrap"]


class Abort(Exception):
    """A step outside a check failed: stop, clean up, count it as a failure."""


def log(msg):
    print(f"==> {msg}", file=sys.stderr, flush=True)


def warn(msg):
    log(f"WARNING: {msg}")


def die(msg):
    raise Abort(msg)


def elapsed(t0):
    return f"{time.time() - t0:.1f}"


def show_tail(path, lines=40):
    if os.path.exists(path) and os.path.getsize(path) > 0:
        with open(path, errors="replace") as f:
            tail = f.read().splitlines()[-lines:]
        print(f"---- last lines of {path} ----", file=sys.stderr)
        print("\n".join(tail), file=sys.stderr, flush=True)


def tail_text(text, lines):
    return "\n".join(text.splitlines()[-lines:])


def port_open(port):
    """Something accepts TCP connections on 127.0.0.1:PORT."""
    try:
        with socket.create_connection(("127.0.0.1", port), timeout=3):
            return True
    except OSError:
        return False


def free_port():
    """A random loopback port nothing listens on (random: other tests on this machine pick ports
    too, and a fixed first choice collides more often)."""
    while True:
        port = 20000 + random.randrange(30000)
        if not port_open(port):
            return port


def is_uid_non_root(uid):
    return re.fullmatch(r"[0-9]+", uid or "") is not None and uid != "0"


def run(argv, check=False, **kw):
    """Run a command, capturing stdout as text (stderr as given, default: captured)."""
    kw.setdefault("stdout", subprocess.PIPE)
    kw.setdefault("stderr", subprocess.PIPE)
    r = subprocess.run(argv, text=True, errors="replace", **kw)
    if check and r.returncode != 0:
        die(f"{shlex.join(argv)} failed (exit {r.returncode}): {tail_text(r.stderr or '', 5)}")
    return r


class ImageBuilder:
    """The image steps of ContainerTest (it provides pm, pm_logged, base_image, image,
    no_cache, rootfs_tmp)."""

    def install_tools(self):
        missing = []
        for pkg in TOOLS:
            r = run(["dpkg-query", "-W", "-f=${db:Status-Status}", pkg])
            if r.stdout.strip() != "installed":
                missing.append(pkg)
        sudo = [] if os.geteuid() == 0 else ["sudo"]
        if missing:
            log(f"installing {' '.join(missing)}")
            apt = [*sudo, "env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "-q", "-o",
                   "DPkg::Lock::Timeout=300"]
            for args in (["update"], ["install", "-y", *missing]):
                if subprocess.run([*apt, *args]).returncode != 0:
                    die(f"apt-get {args[0]} failed")
        else:
            log("podman, buildah, runc and debootstrap are installed")
        if os.geteuid() != 0:
            die("podman with vfs storage and chroot isolation is set up for root here; run as root")
        print(self.pm("version", "--format", "podman {{.Client.Version}}", check=True).stdout.strip(),
              file=sys.stderr)

    # ------------------------------------------------------------------------- base image
    @staticmethod
    def debian_uri(suite):
        """The URI apt uses for SUITE, from sources.list and sources.list.d (both the one-line
        format and deb822 .sources); empty if none."""
        for path in ["/etc/apt/sources.list", *sorted(glob.glob("/etc/apt/sources.list.d/*.list"))]:
            try:
                lines = open(path).read().splitlines()
            except OSError:
                continue
            for line in lines:
                f = line.split()
                if not f or f[0] != "deb":
                    continue
                i = 1
                if f[1].startswith("["):  # options: [ ... ]
                    while i < len(f) and not f[i].endswith("]"):
                        i += 1
                    i += 1
                if i + 1 < len(f) and f[i + 1] == suite:
                    return f[i]
        for path in sorted(glob.glob("/etc/apt/sources.list.d/*.sources")):
            try:
                text = open(path).read()
            except OSError:
                continue
            for stanza in re.split(r"\n\s*\n", text):
                fields = {}
                for line in stanza.splitlines():
                    m = re.match(r"^([A-Za-z-]+):(.*)$", line)
                    if m and not line.lstrip().startswith("#"):
                        fields[m.group(1).lower()] = m.group(2).strip()
                if fields.get("enabled", "yes").lower() == "no":
                    continue
                if "deb" not in fields.get("types", "").split():
                    continue
                if suite in fields.get("suites", "").split():
                    return (fields.get("uris", "").split() or [""])[0]
        return ""

    def build_base_image(self):
        mirror = os.environ.get("IDEMQ_DEBIAN_MIRROR") or self.debian_uri("bookworm")
        if not re.match(r"^https?://", mirror):
            die(f"no http(s) Debian bookworm mirror found in /etc/apt/sources.list(.d) (got '{mirror}'); set IDEMQ_DEBIAN_MIRROR")
        security = self.debian_uri("bookworm-security")
        rootfs = tempfile.mkdtemp(prefix="idemq-rootfs.", dir=os.environ.get("TMPDIR") or "/var/tmp")
        self.rootfs_tmp = rootfs  # removed by cleanup if we stop half-way
        os.chmod(rootfs, 0o755)  # it becomes the image's /: mkdtemp made it 0700
        boot_log = os.path.join(LOG_DIR, "container-debootstrap.log")
        log(f"debootstrap --variant=minbase bookworm from {mirror} (log: {boot_log})")
        t0 = time.time()
        with open(boot_log, "w") as f:
            r = subprocess.run(["debootstrap", "--variant=minbase", "bookworm", rootfs, mirror],
                               stdout=f, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            show_tail(boot_log)
            die("debootstrap failed")
        log(f"debootstrap done ({elapsed(t0)}s)")

        # Make it like the official slim image: apt sources (with updates and security when apt
        # here has them), no documentation, manual pages or translations, no caches or machine identity.
        sources = [f"deb {mirror} bookworm main"]
        if self.debian_uri("bookworm-updates"):
            sources.append(f"deb {mirror} bookworm-updates main")
        if security:
            sources.append(f"deb {security} bookworm-security main")
        with open(f"{rootfs}/etc/apt/sources.list", "w") as f:
            f.write("\n".join(sources) + "\n")
        with open(f"{rootfs}/etc/dpkg/dpkg.cfg.d/slim", "w") as f:
            f.write("# Written by idemq scripts/container-test, as in Debian's -slim images.\n"
                    "path-exclude /usr/share/doc/*\npath-include /usr/share/doc/*/copyright\n"
                    + "".join(f"path-exclude /usr/share/{d}/*\n"
                              for d in ("man", "groff", "info", "locale", "lintian", "linda")))
        clean = ("rm -f /var/cache/apt/archives/*.deb /var/cache/apt/archives/partial/*.deb "
                 "/var/cache/apt/*.bin || true")
        with open(f"{rootfs}/etc/apt/apt.conf.d/docker-clean", "w") as f:
            f.write("// Written by idemq scripts/container-test, as in Debian's container images: no package files\n"
                    "// or package caches left in image layers, no translations.\n"
                    f'DPkg::Post-Invoke {{ "{clean}"; }};\nAPT::Update::Post-Invoke {{ "{clean}"; }};\n'
                    'Dir::Cache::pkgcache "";\nDir::Cache::srcpkgcache "";\nAcquire::Languages "none";\n')
        run(["find", f"{rootfs}/usr/share/doc", "-mindepth", "1", "!", "-type", "d", "!", "-name",
             "copyright", "-delete"], check=True)
        run(["find", f"{rootfs}/usr/share/doc", "-mindepth", "1", "-type", "d", "-empty", "-delete"],
            check=True)
        doomed = [p for d in ("man", "info", "locale", "groff", "lintian", "linda")
                  for p in glob.glob(f"{rootfs}/usr/share/{d}/*")]
        doomed += glob.glob(f"{rootfs}/var/cache/apt/archives/*.deb") + glob.glob(f"{rootfs}/var/cache/apt/*.bin")
        doomed += glob.glob(f"{rootfs}/var/lib/apt/lists/*") + [f"{rootfs}/var/log/bootstrap.log",
                                                               f"{rootfs}/etc/hostname", f"{rootfs}/etc/resolv.conf"]
        for p in doomed:
            if os.path.isdir(p) and not os.path.islink(p):
                shutil.rmtree(p)
            elif os.path.lexists(p):
                os.remove(p)
        open(f"{rootfs}/etc/machine-id", "w").close()

        log(f"importing the root file system as {self.base_image}")
        tar = subprocess.Popen(["tar", "--numeric-owner", "-C", rootfs, "-cf", "-", "."], stdout=subprocess.PIPE)
        imp = self.pm("import", "--quiet", "--change", 'CMD ["bash"]', "--change",
                      "ENV PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin",
                      "-", self.base_image, stdin=tar.stdout)
        tar.stdout.close()
        if tar.wait() != 0 or imp.returncode != 0:
            die(f"importing the base image failed: {tail_text(imp.stderr, 5)}")
        shutil.rmtree(rootfs)
        self.rootfs_tmp = ""

    # ------------------------------------------------------------------------- image build
    def build_image(self):
        build_log = os.path.join(LOG_DIR, "container-build.log")
        # The build stage is tagged too: it keeps its layers (the -dev packages) as the cache of
        # the next build, and every image this script replaces can then be removed (with vfs
        # storage each layer is a full copy: a few hundred MB per stale build stage).
        build_stage_image = f"{self.image}-build"
        previous = self.pm("image", "inspect", "--format", "{{.Id}}", self.image, build_stage_image).stdout.split()
        # --format docker: the OCI image format has no HEALTHCHECK and podman would drop it.
        build_args = ["--isolation=chroot", "--network=host", "--format", "docker", "--build-arg",
                      f"BASE={self.base_image}", "-f", os.path.join(ROOT, "Dockerfile")]
        log(f"podman build -t {self.image} (log: {os.path.relpath(build_log, ROOT)})")
        t0 = time.time()
        with open(build_log, "w") as f:
            r = self.pm("build", *build_args, *self.no_cache, "-t", self.image, ROOT,
                        stdout=f, stderr=subprocess.STDOUT)
        if r.returncode != 0:
            show_tail(build_log, 60)
            die("image build failed")
        t_build = elapsed(t0)
        text = open(build_log, errors="replace").read()
        # The build stage's image: the last "--> ID" of the stage that starts "FROM ... AS build".
        stage_id, inside = "", False
        for line in text.splitlines():
            if re.match(r"^\[[0-9]+/[0-9]+\] STEP 1/[0-9]+: FROM .* [Aa][Ss] build$", line):
                inside = True
            elif inside and re.match(r"^\[[0-9]+/[0-9]+\] STEP 1/", line):
                break
            elif inside and re.fullmatch(r"--> [0-9a-f]+", line):
                stage_id = line.split()[1]
        if not stage_id or self.pm_logged("tag", stage_id, build_stage_image) != 0:
            warn(f"could not tag the build stage as {build_stage_image}: the next build may install its packages again")
        t0 = time.time()
        for image_id in previous:
            self.remove_replaced(image_id)
        size = self.pm("image", "inspect", "--format", "{{.Size}}", self.image, check=True).stdout.strip()
        self.image_mb = f"{int(size) / 1e6:.1f}"
        cached = text.count("Using cache")  # grep -c counted lines; podman prints one per line
        log(f"built {self.image}: {self.image_mb} MB in {t_build}s ({cached} cached step(s)); "
            f"replaced images removed in {elapsed(t0)}s")

    def remove_replaced(self, image_id):
        """Remove IMAGE_ID and then its parents, one by one, as long as the image has no tag and
        no other image builds on it (podman rmi leaves untagged parents behind). Images of other
        builds are not touched: they are tagged or have children."""
        while image_id:
            if self.pm("image", "inspect", "--format", "{{len .RepoTags}}", image_id).stdout.strip() != "0":
                return
            all_ids = self.pm("images", "-aq", "--no-trunc").stdout.split()
            parents = self.pm("image", "inspect", "--format", "{{.Parent}}", *all_ids).stdout.split() if all_ids else []
            if image_id in parents:
                return
            parent = self.pm("image", "inspect", "--format", "{{.Parent}}", image_id).stdout.strip()
            if self.pm_logged("rmi", image_id) != 0:
                return
            image_id = parent
