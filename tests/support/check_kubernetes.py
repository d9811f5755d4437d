#!/usr/bin/python3
"""Checks examples/kubernetes/ without a cluster (kubeconform is not packaged in Debian 12).

    check_kubernetes.py DIR CONFIG_OUT

Parses every document of every file, checks the fields a cluster would need and the ones idemq
depends on, and that the files agree with each other and with the image (Dockerfile's USER, the
ConfigMap's http.listen port, the Secret's keys). Writes the ConfigMap's idemq.yaml to CONFIG_OUT
so the caller can validate it with the real `idemq topology --dry-run`. Prints every problem
found and exits 1 when there is one. Run by tests/integration/test_observability.c.
"""
import os
import re
import sys

try:
    import yaml
except ImportError:
    sys.exit("check_kubernetes.py: python3-yaml is missing (scripts/setup installs it)")

problems = []


def problem(where, text):
    problems.append(f"{where}: {text}")


def get(doc, path, default=None):
    """doc['a']['b'][0]... for a dotted path with [n] indices; default when missing."""
    node = doc
    for part in re.findall(r"[^.\[\]]+|\[\d+\]", path):
        if part.startswith("["):
            index = int(part[1:-1])
            if not isinstance(node, list) or index >= len(node):
                return default
            node = node[index]
        else:
            if not isinstance(node, dict) or part not in node:
                return default
            node = node[part]
    return node


def require(doc, where, path, expected=None):
    value = get(doc, path)
    if value is None:
        problem(where, f"{path} is missing")
    elif expected is not None and value != expected:
        problem(where, f"{path} is {value!r}, expected {expected!r}")
    return value


UNITS = {"": 1, "k": 1000, "M": 1000**2, "G": 1000**3, "Ki": 1024, "Mi": 1024**2, "Gi": 1024**3}


def quantity_bytes(text):
    m = re.fullmatch(r"(\d+)(Ki|Mi|Gi|k|M|G|)", str(text))
    return int(m.group(1)) * UNITS[m.group(2)] if m else None


def idemq_size(text):
    m = re.fullmatch(r"(\d+)\s*(B|KB|MB|GB|KiB|MiB|GiB|)", str(text))
    if not m:
        return None
    mult = {"": 1, "B": 1, "KB": 1000, "MB": 1000**2, "GB": 1000**3, "KiB": 1024,
            "MiB": 1024**2, "GiB": 1024**3}[m.group(2)]
    return int(m.group(1)) * mult


def idemq_seconds(text):
    m = re.fullmatch(r"(\d+)(ms|s|m|h|d|)", str(text))
    if not m:
        return None
    return int(m.group(1)) * {"ms": 0.001, "s": 1, "": 1, "m": 60, "h": 3600, "d": 86400}[m.group(2)]


def load(directory):
    docs = []  # (file, index, doc)
    for name in sorted(os.listdir(directory)):
        if not name.endswith((".yaml", ".yml")):
            continue
        path = os.path.join(directory, name)
        try:
            with open(path, encoding="utf-8") as f:
                parsed = list(yaml.safe_load_all(f))
        except yaml.YAMLError as e:
            problem(name, f"does not parse: {e}")
            continue
        parsed = [d for d in parsed if d is not None]
        if not parsed:
            problem(name, "holds no document")
        for i, doc in enumerate(parsed):
            if not isinstance(doc, dict):
                problem(f"{name}#{i}", "is not a mapping")
                continue
            docs.append((name, i, doc))
    return docs


def check_security(where, pod_spec, uid):
    require(pod_spec, where, "securityContext.runAsNonRoot", True)
    require(pod_spec, where, "securityContext.runAsUser", uid)
    require(pod_spec, where, "securityContext.seccompProfile.type", "RuntimeDefault")
    if pod_spec.get("automountServiceAccountToken") is not False:
        problem(where, "automountServiceAccountToken should be false (idemq needs no API access)")
    for c in pod_spec.get("containers", []):
        cw = f"{where} container {c.get('name')}"
        require(c, cw, "securityContext.runAsNonRoot", True)
        require(c, cw, "securityContext.readOnlyRootFilesystem", True)
        require(c, cw, "securityContext.allowPrivilegeEscalation", False)
        if "ALL" not in (get(c, "securityContext.capabilities.drop") or []):
            problem(cw, "securityContext.capabilities.drop must hold ALL")
        if get(c, "resources.requests.memory") is None or get(c, "resources.limits.memory") is None:
            problem(cw, "resources.requests.memory and resources.limits.memory are required")
        if get(c, "resources.requests.cpu") is None:
            problem(cw, "resources.requests.cpu is required")
        mounts = {m.get("name") for m in c.get("volumeMounts", [])}
        volumes = {v.get("name") for v in pod_spec.get("volumes", [])}
        for m in sorted(mounts - volumes):
            problem(cw, f"mounts volume {m!r}, which the pod does not define")


def main():
    if len(sys.argv) != 3:
        sys.exit(__doc__)
    directory, config_out = sys.argv[1], sys.argv[2]
    docs = load(directory)
    by_kind = {}
    for name, i, doc in docs:
        where = f"{name}#{i}"
        if name == "prometheus-scrape.yml":
            continue  # a Prometheus config, checked below
        for key in ("apiVersion", "kind"):
            if key not in doc:
                problem(where, f"{key} is missing")
        kind = doc.get("kind")
        if kind != "Kustomization":
            require(doc, where, "metadata.name")
            if kind != "Namespace":
                require(doc, where, "metadata.namespace", "idemq")
        by_kind.setdefault(kind, []).append((where, doc))

    def one(kind):
        found = by_kind.get(kind, [])
        if len(found) != 1:
            problem(directory, f"expected one {kind}, found {len(found)}")
            return "", {}
        return found[0]

    # The image's user (Dockerfile: USER uid:gid) is what runAsUser must say.
    dockerfile = os.path.join(directory, "..", "..", "Dockerfile")
    uid = None
    with open(dockerfile, encoding="utf-8") as f:
        for line in f:
            m = re.match(r"USER\s+(\d+)", line)
            if m:
                uid = int(m.group(1))
    if uid is None or uid == 0:
        problem("Dockerfile", "no numeric non-root USER")

    cm_where, cm = one("ConfigMap")
    secret_where, secret = one("Secret")
    dep_where, dep = one("Deployment")
    pdb_where, pdb = one("PodDisruptionBudget")
    svc_where, svc = one("Service")
    job_where, job = one("Job")
    kus_where, kus = one("Kustomization")

    # --- the ConfigMap: a valid idemq.yaml (the caller runs idemq on it) that serves HTTP on
    # the pod's interfaces.
    config_text = (cm.get("data") or {}).get("idemq.yaml")
    config = {}
    if not isinstance(config_text, str):
        problem(cm_where, "data.idemq.yaml is missing")
    else:
        config = yaml.safe_load(config_text) or {}
        with open(config_out, "w", encoding="utf-8") as f:
            f.write(config_text)
    listen = str(get(config, "http.listen", ""))
    if not listen.startswith("0.0.0.0:"):
        problem(cm_where, f"http.listen is {listen!r}: probes and scrapes come from outside the "
                          "pod, listen on 0.0.0.0:PORT")
    port = int(listen.rsplit(":", 1)[1]) if ":" in listen else None
    for url_key in ("amqp.url", "mysql.url"):
        url = str(get(config, url_key, ""))
        if re.match(r"^[a-z]+://[^/@]*:[^/@]*@", url):
            problem(cm_where, f"{url_key} holds a password: keep it in the Secret")

    # --- the Deployment
    pod = get(dep, "spec.template.spec") or {}
    selector = get(dep, "spec.selector.matchLabels") or {}
    labels = get(dep, "spec.template.metadata.labels") or {}
    if not selector or any(labels.get(k) != v for k, v in selector.items()):
        problem(dep_where, "spec.selector.matchLabels must match the pod template's labels")
    replicas = require(dep, dep_where, "spec.replicas")
    check_security(dep_where, pod, uid)
    containers = pod.get("containers", [])
    if len(containers) != 1:
        problem(dep_where, f"expected one container, found {len(containers)}")
    c = containers[0] if containers else {}
    ports = {p.get("name"): p.get("containerPort") for p in c.get("ports", [])}
    if ports.get("metrics") != port:
        problem(dep_where, f"container port 'metrics' is {ports.get('metrics')}, http.listen "
                           f"says {port}")
    for probe, path in (("livenessProbe", "/healthz"), ("readinessProbe", "/readyz"),
                        ("startupProbe", "/healthz")):
        require(c, dep_where, f"{probe}.httpGet.path", path)
        probe_port = get(c, f"{probe}.httpGet.port")
        if probe_port not in ("metrics", port):
            problem(dep_where, f"{probe} probes port {probe_port!r}, not the metrics port")
    if c.get("args", ["run"])[:1] != ["run"]:
        problem(dep_where, "the container must run `idemq run`")
    env = {e.get("name"): e.get("value") for e in c.get("env", [])}
    mounts = {m.get("name"): m for m in c.get("volumeMounts", [])}
    volumes = {v.get("name"): v for v in pod.get("volumes", [])}
    config_mount = next((m for n, m in mounts.items()
                         if get(volumes.get(n, {}), "configMap.name") == get(cm, "metadata.name")),
                        None)
    if not config_mount:
        problem(dep_where, "no volume mounts the ConfigMap")
    elif env.get("IDEMQ_CONFIG") != config_mount["mountPath"].rstrip("/") + "/idemq.yaml":
        problem(dep_where, f"IDEMQ_CONFIG is {env.get('IDEMQ_CONFIG')!r}, the ConfigMap is at "
                           f"{config_mount['mountPath']}/idemq.yaml")
    secret_mount = next((m for n, m in mounts.items()
                         if get(volumes.get(n, {}), "secret.secretName")
                         == get(secret, "metadata.name")), None)
    keys = set((secret.get("stringData") or {}).keys()) | set((secret.get("data") or {}).keys())
    for var in ("IDEMQ_AMQP_PASSWORD_FILE", "IDEMQ_MYSQL_PASSWORD_FILE"):
        value = env.get(var)
        if not value or not secret_mount:
            problem(dep_where, f"{var} must name a file of the mounted Secret")
            continue
        directory_part, key = os.path.split(value)
        if directory_part != secret_mount["mountPath"].rstrip("/") or key not in keys:
            problem(dep_where, f"{var}={value}: the Secret mounted at "
                               f"{secret_mount['mountPath']} has keys {sorted(keys)}")
    secret_volume = next((v for v in volumes.values()
                          if get(v, "secret.secretName") == get(secret, "metadata.name")), {})
    mode = get(secret_volume, "secret.defaultMode", 0o644)
    if mode & 0o004:
        problem(dep_where, f"the Secret's files are world-readable (defaultMode {mode:o})")
    if not mode & 0o040 or get(pod, "securityContext.fsGroup") is None:
        problem(dep_where, "the Secret's files must be group-readable with an fsGroup: the "
                           "non-root user cannot read root-owned 0400 files")
    grace = pod.get("terminationGracePeriodSeconds", 30)
    shutdown = idemq_seconds(get(config, "shutdown_timeout", "25s"))
    if shutdown is not None and grace <= shutdown:
        problem(dep_where, f"terminationGracePeriodSeconds {grace} must exceed shutdown_timeout "
                           f"({shutdown:g} s)")
    limit = quantity_bytes(get(c, "resources.limits.memory", ""))
    bodies = int(get(config, "amqp.prefetch", 64)) * (idemq_size(get(config, "amqp.max_body",
                                                                     "1MiB")) or 0)
    if limit is not None and limit < bodies + 32 * 1024**2:
        problem(dep_where, f"memory limit {limit} B is below prefetch x max_body ({bodies} B) "
                           "+ 32 MiB")

    # --- the PodDisruptionBudget and the Service select the Deployment's pods
    for where, doc in ((pdb_where, pdb), (svc_where, svc)):
        sel = get(doc, "spec.selector.matchLabels") if doc is pdb else get(doc, "spec.selector")
        if not sel or any(labels.get(k) != v for k, v in sel.items()):
            problem(where, "its selector does not select the Deployment's pods")
    max_unavailable = get(pdb, "spec.maxUnavailable")
    min_available = get(pdb, "spec.minAvailable")
    if (max_unavailable is None) == (min_available is None):
        problem(pdb_where, "set exactly one of maxUnavailable and minAvailable")
    elif isinstance(replicas, int) and (
            (min_available is not None and min_available >= replicas)
            or (max_unavailable is not None and max_unavailable < 1)):
        problem(pdb_where, "it would block every eviction (drains could never finish)")
    if get(svc, "spec.ports[0].targetPort") not in ("metrics", port):
        problem(svc_where, "targetPort is not the metrics port")
    if get(svc, "spec.publishNotReadyAddresses") is not True:
        problem(svc_where, "publishNotReadyAddresses must be true: a paused idemq is not ready "
                           "and still has to be scraped")

    # --- the migrate Job
    job_pod = get(job, "spec.template.spec") or {}
    check_security(job_where, job_pod, uid)
    if get(job_pod, "containers[0].args") != ["migrate"]:
        problem(job_where, "the container must run `idemq migrate`")
    require(job, job_where, "spec.template.spec.restartPolicy")

    # --- kustomization lists every manifest
    listed = set(kus.get("resources", []))
    manifests = {n for n, _, d in docs if d.get("kind") != "Kustomization"
                 and n != "prometheus-scrape.yml"}
    for n in sorted(manifests - listed):
        problem(kus_where, f"does not list {n}")
    for n in sorted(listed - manifests):
        problem(kus_where, f"lists {n}, which is not a manifest here")

    # --- the Prometheus scrape job finds these pods on their metrics port
    scrape = next((d for n, _, d in docs if n == "prometheus-scrape.yml"), None)
    if scrape is None:
        problem(directory, "prometheus-scrape.yml is missing")
    else:
        jobs = [j for j in scrape.get("scrape_configs", []) if j.get("job_name") == "idemq"]
        if len(jobs) != 1:
            problem("prometheus-scrape.yml", "needs one job named idemq (the alert rules use it)")
        else:
            keeps = {tuple(r.get("source_labels", [])): r.get("regex")
                     for r in jobs[0].get("relabel_configs", []) if r.get("action") == "keep"}
            label_key = "__meta_kubernetes_pod_label_app_kubernetes_io_name"
            if keeps.get((label_key,)) != labels.get("app.kubernetes.io/name"):
                problem("prometheus-scrape.yml", "does not keep the pods' app.kubernetes.io/name")
            if keeps.get(("__meta_kubernetes_pod_container_port_name",)) != "metrics":
                problem("prometheus-scrape.yml", "does not keep the port named metrics")

    for p in problems:
        print(p)
    if problems:
        sys.exit(1)
    print(f"check_kubernetes.py: {len(docs)} documents ok")


if __name__ == "__main__":
    main()
