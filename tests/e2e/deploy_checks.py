#!/usr/bin/env python3
"""Schema-level checks of the deployment files (tests/e2e/deploy_config_test.sh).

  deploy_checks.py compose CONFIG.yml PROMETHEUS.yml   # `docker-compose config` output
  deploy_checks.py compose-colocated CONFIG.yml PROMETHEUS.yml   # of docker-compose.colocated.yml
  deploy_checks.py k8s DIR_OR_RENDERED.yaml
  deploy_checks.py k8s-colocated RENDERED.yaml          # `kubectl kustomize deploy/k8s-colocated`
  deploy_checks.py compose-machines CONFIG.yml          # of docker-compose.machines.yml
  deploy_checks.py k8s-machines RENDERED.yaml           # `kubectl kustomize deploy/k8s-machines`
  deploy_checks.py dashboard pserver.json SCRAPE...    # /metrics bodies of live daemons

Prints one line per problem and exits 1 if there is any.
"""
import json
import os
import re
import shlex
import sys

import yaml

problems = []


def check(cond, msg):
    if not cond:
        problems.append(msg)
    return cond


def seconds(text):
    """'30s', '1m30s', '10' -> seconds."""
    total, text = 0.0, str(text)
    if re.fullmatch(r"[0-9.]+", text):
        return float(text)
    for value, unit in re.findall(r"([0-9.]+)(ms|us|h|m|s)", text):
        total += float(value) * {"h": 3600, "m": 60, "s": 1, "ms": 1e-3, "us": 1e-6}[unit]
    return total


def env_of(service):
    env = service.get("environment") or {}
    if isinstance(env, list):
        env = dict(e.split("=", 1) for e in env)
    return env


def check_compose(config_path, prometheus_path):
    cfg = yaml.safe_load(open(config_path))
    services = cfg.get("services", {})
    shards = {n: s for n, s in services.items() if n.startswith("shard")}
    workers = {n: s for n, s in services.items() if n.startswith("worker")}
    check(len(shards) == 2, f"expected 2 shard services, found {sorted(shards)}")
    check(len(workers) == 4, f"expected 4 worker services, found {sorted(workers)}")
    for name in ("prometheus", "grafana"):
        check(name in services, f"no {name} service")
    for name, s in services.items():
        check(list(s.get("networks", {})) == ["pserver"], f"{name}: not on the one network 'pserver'")
    drain = None
    shard_ids, worker_ids = set(), set()
    for name, s in shards.items():
        env = env_of(s)
        drain = float(env.get("DRAIN_SECONDS", "10"))
        shard_ids.add(env.get("SHARD_INDEX"))
        hc = s.get("healthcheck", {})
        test = " ".join(hc.get("test", []))
        check("pserver_health_probe" in test, f"{name}: healthcheck does not run pserver_health_probe")
        check("ParameterServer" not in test,
              f"{name}: healthcheck asks pserver.v1.ParameterServer, which serves only after a "
              "worker registered (workers would wait forever)")
        check(seconds(s.get("stop_grace_period", "10s")) > drain,
              f"{name}: stop_grace_period {s.get('stop_grace_period')} is not longer than "
              f"DRAIN_SECONDS={drain}")
        check(s.get("restart") in ("on-failure", "always", "unless-stopped"),
              f"{name}: restart policy {s.get('restart')!r} does not bring a killed shard back")
        vols = s.get("volumes", [])
        named = [v for v in vols if v.get("type") == "volume" and v.get("source") in cfg.get("volumes", {})] \
            if vols and isinstance(vols[0], dict) else \
            [v for v in vols if v.split(":")[0] in cfg.get("volumes", {})]
        check(len(named) == 1, f"{name}: no named volume for checkpoints")
        mounts = [v.get("target") if isinstance(v, dict) else v.split(":")[1] for v in named]
        check(any(f"--checkpoint_dir={m}" in " ".join(s.get("entrypoint", [])) for m in mounts),
              f"{name}: --checkpoint_dir is not the named volume's mount point")
        check(s.get("build", {}).get("target") == "server", f"{name}: not built from target 'server'")
    check(shard_ids == {"0", "1"}, f"shard indexes are {sorted(map(str, shard_ids))}, expected 0 and 1")
    for name, s in workers.items():
        env = env_of(s)
        worker_ids.add(env.get("WORKER_ID"))
        deps = s.get("depends_on", {})
        for shard in shards:
            check(isinstance(deps, dict) and deps.get(shard, {}).get("condition") == "service_healthy",
                  f"{name}: does not wait for {shard} to be healthy")
        check(s.get("build", {}).get("target") == "worker", f"{name}: not built from target 'worker'")
        check("NUM_WORKERS" in env and "PUSH_CODEC" in env,
              f"{name}: settings (NUM_WORKERS, PUSH_CODEC) do not come from the env file")
    check(worker_ids == {"0", "1", "2", "3"}, f"worker ids are {sorted(map(str, worker_ids))}")
    # Every variable a daemon's shell command reads is set (by the env file or
    # the service): an unset one would reach the daemon as an empty flag.
    for name, s in list(shards.items()) + list(workers.items()):
        env = env_of(s)
        for var in re.findall(r"\$\$\{?([A-Z_][A-Z0-9_]*)", " ".join(s.get("entrypoint") or [])):
            check(var in env, f"{name}: its command reads ${var}, which neither .env nor the service sets")
    # One place for settings: every daemon gets the same values from the env file.
    for key in ("NUM_WORKERS", "PUSH_CODEC", "WARMUP_CODEC", "PULL_CODEC", "OPTIMIZER", "DRAIN_SECONDS"):
        values = {env_of(s).get(key) for s in list(shards.values()) + list(workers.values())}
        check(len(values) == 1 and None not in values, f"{key} differs between daemons: {values}")
    # Every daemon is a Prometheus target.
    prom = yaml.safe_load(open(prometheus_path))
    targets = {t for job in prom["scrape_configs"] for sc in job.get("static_configs", [])
               for t in sc["targets"]}
    for name in shards:
        check(f"{name}:9100" in targets, f"prometheus.yml does not scrape {name}:9100")
    for name in workers:
        check(f"{name}:9200" in targets, f"prometheus.yml does not scrape {name}:9200")


def check_compose_colocated(config_path, prometheus_path):
    """docker-compose.colocated.yml: node N holds a network namespace with
    shard N and worker N in it; every worker names all 4 shards."""
    cfg = yaml.safe_load(open(config_path))
    services = cfg.get("services", {})
    prom = yaml.safe_load(open(prometheus_path))
    targets = {t for job in prom["scrape_configs"] for sc in job.get("static_configs", [])
               for t in sc["targets"]}
    servers = ",".join(f"shard{i}:50051" for i in range(4))
    for i in range(4):
        node, shard, worker = (services.get(f"{r}{i}") for r in ("node", "shard", "worker"))
        if not check(node and shard and worker, f"no node{i}, shard{i} or worker{i} service"):
            continue
        aliases = (node.get("networks", {}).get("pserver") or {}).get("aliases", [])
        check({f"shard{i}", f"worker{i}"} <= set(aliases),
              f"node{i}: network aliases {aliases} lack shard{i} and worker{i}")
        check("build" in node, f"node{i}: no build section (a plain `up` would pull its image)")
        for name, s in ((f"shard{i}", shard), (f"worker{i}", worker)):
            check(s.get("network_mode") == f"service:node{i}",
                  f"{name}: network_mode is {s.get('network_mode')!r}, expected service:node{i}")
            check("networks" not in s, f"{name}: has networks besides network_mode")
            env = env_of(s)
            for var in re.findall(r"\$\$\{?([A-Z_][A-Z0-9_]*)", " ".join(s.get("entrypoint") or [])):
                check(var in env, f"{name}: its command reads ${var}, which neither .env nor the service sets")
        check(env_of(shard).get("SHARD_INDEX") == str(i), f"shard{i}: SHARD_INDEX is not {i}")
        check(env_of(worker).get("WORKER_ID") == str(i), f"worker{i}: WORKER_ID is not {i}")
        check("--num_shards=4" in " ".join(shard.get("entrypoint", [])), f"shard{i}: not --num_shards=4")
        check(f"--servers={servers} " in " ".join(worker.get("entrypoint", [])),
              f"worker{i}: --servers does not list {servers}")
        deps = worker.get("depends_on", {})
        for j in range(4):
            check(isinstance(deps, dict) and deps.get(f"shard{j}", {}).get("condition") == "service_healthy",
                  f"worker{i}: does not wait for shard{j} to be healthy")
        check(f"shard{i}:9100" in targets, f"{prometheus_path} does not scrape shard{i}:9100")
        check(f"worker{i}:9200" in targets, f"{prometheus_path} does not scrape worker{i}:9200")
    extra = sorted(n for n in services if re.fullmatch(r"(node|shard|worker)\d+", n) and int(re.sub(r"\D", "", n)) > 3)
    check(not extra, f"services beyond 4 nodes: {extra}")


ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
IMAGE_EXAMPLES = "/opt/pserver/examples/"  # the machine image's (deploy/Dockerfile)


def check_launch_args(where, args):
    """The launcher's own parser (python/pserver/_launch_args.py) accepts a
    machine's command line; the image's examples are the repository's.
    Returns the parsed options, or None."""
    sys.path.insert(0, os.path.join(ROOT, "python"))
    from pserver._launch_args import parse_args
    from pserver._launch_prep import UsageError
    args = [a.replace(IMAGE_EXAMPLES, os.path.join(ROOT, "python", "examples") + "/")
            for a in args]
    try:
        return parse_args(args)
    except UsageError as e:
        check(False, f"{where}: pserver.launch refuses its command line: {e}")
        return None


def launcher_args(words, env):
    """The words after `-m pserver.launch` in a machine's command, with the
    container's variables ($$VAR in Compose, $(VAR) in Kubernetes) filled in;
    a variable nothing sets is a problem."""
    text = " ".join(words)
    m = re.search(r"-m pserver\.launch (.*)", text, re.S)
    if not check(m, f"the command does not run -m pserver.launch: {text!r}"):
        return []
    def fill(v):
        name = v.group(1) or v.group(2)
        check(name in env, f"the command reads {name}, which nothing sets")
        return env.get(name, "")
    out = re.sub(r"\$\$\{?([A-Z_][A-Z0-9_]*)\}?|\$\(([A-Z_][A-Z0-9_]*)\)", fill, m.group(1))
    return shlex.split(out)


def check_compose_machines(config_path):
    """docker-compose.machines.yml: machine0 (node 0, the store's host) and
    the service `machine`, scaled, whose replicas claim their node ranks;
    the launcher's parser accepts both command lines."""
    services = yaml.safe_load(open(config_path)).get("services", {})
    check(sorted(services) == ["machine", "machine0"],
          f"expected services machine0 and machine, found {sorted(services)}")
    for name, rank in (("machine0", "0"), ("machine", "auto")):
        s = services.get(name)
        if not check(s, f"no {name} service"):
            continue
        env = env_of(s)
        check(env.get("NODE_RANK") == rank, f"{name}: NODE_RANK is {env.get('NODE_RANK')!r}, expected {rank}")
        check(s.get("build", {}).get("target") == "machine", f"{name}: not built from target 'machine'")
        check(seconds(s.get("stop_grace_period", "10s")) > 120,
              f"{name}: stop_grace_period {s.get('stop_grace_period')} is not longer than the "
              "launcher's 120 s for a leave")
        opts = check_launch_args(name, launcher_args(s.get("entrypoint") or [], env))
        if opts and check(opts["node"] is not None, f"{name}: not a several-machine launch"):
            n = opts["node"]
            check((n["host"], n["port"]) == ("machine0", 29500),
                  f"{name}: the rendezvous endpoint is {n['host']}:{n['port']}, expected machine0:29500")
            check(n["rank"] == (0 if rank == "0" else None), f"{name}: node rank {n['rank']!r}")
    deps = services.get("machine", {}).get("depends_on", {})
    check("machine0" in deps, "machine: does not start after machine0")


def check_k8s_machines(path):
    """deploy/k8s-machines rendered: an Indexed Job of machines whose
    completion index is the node rank, NNODES of them, pod 0 reachable at
    the rendezvous endpoint through the headless Service; the launcher's
    parser accepts the pods' command line."""
    docs = load_docs(path)
    jobs = [d for d in docs if d.get("kind") == "Job"]
    svcs = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Service"}
    cms = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d.get("kind") == "ConfigMap"}
    if not check(len(jobs) == 1, f"expected one Job (the machines), found {len(jobs)}"):
        return
    job = jobs[0]
    spec, pod = job["spec"], job["spec"]["template"]["spec"]
    c = pod["containers"][0]
    env = {}
    for ref in c.get("envFrom", []):
        name = ref.get("configMapRef", {}).get("name")
        check(name in cms, f"the machines read ConfigMap {name!r}, which is not there")
        env.update(cms.get(name, {}))
    rank_src = [e for e in c.get("env", []) if e["name"] == "NODE_RANK"]
    check(rank_src and rank_src[0].get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
          == "metadata.annotations['batch.kubernetes.io/job-completion-index']",
          "NODE_RANK is not the pod's completion index")
    env["NODE_RANK"] = "0"  # pod 0's command; the others differ only in it
    check(spec.get("completionMode") == "Indexed", "the machines' Job is not Indexed")
    nnodes = str(env.get("NNODES", ""))
    check(nnodes.isdigit() and spec.get("completions") == spec.get("parallelism") == int(nnodes),
          f"completions {spec.get('completions')} / parallelism {spec.get('parallelism')} "
          f"are not NNODES {nnodes!r}: every machine must run at once")
    check(spec.get("backoffLimit") == 0 and pod.get("restartPolicy") == "Never",
          "a failed machine is retried: the other launchers stopped the job already")
    check(pod.get("terminationGracePeriodSeconds", 30) > 120,
          "terminationGracePeriodSeconds is not longer than the launcher's 120 s for a leave")
    sub = pod.get("subdomain")
    svc = svcs.get(sub)
    if check(svc is not None, f"the pods' subdomain {sub!r} names no Service"):
        check(svc["spec"].get("clusterIP") == "None", "the machines' Service is not headless")
        check(svc["spec"].get("publishNotReadyAddresses") is True,
              "the machines' Service does not publish pods before they are ready (pod 0's store)")
        check(svc["spec"].get("selector", {}).items()
              <= job["spec"]["template"]["metadata"].get("labels", {}).items(),
              "the machines' Service does not select the machine pods")
    opts = check_launch_args("k8s machine", launcher_args(
        [*c.get("command", []), *c.get("args", [])], env))
    if opts and check(opts["node"] is not None, "k8s machine: not a several-machine launch"):
        n = opts["node"]
        want = (f"{job['metadata']['name']}-0.{sub}", 29500)
        check((n["host"], n["port"]) == want,
              f"the rendezvous endpoint is {n['host']}:{n['port']}, expected {want[0]}:{want[1]} "
              "(pod 0's name under the Service)")


def load_docs(path):
    files = [path] if os.path.isfile(path) else sorted(
        os.path.join(path, f) for f in os.listdir(path) if f.endswith((".yaml", ".yml")))
    docs = []
    for f in files:
        for d in yaml.safe_load_all(open(f)):
            if d:
                d["__file"] = f
                docs.append(d)
    return docs


def check_k8s(path):
    docs = load_docs(path)
    by_kind = {}
    for d in docs:
        for key in ("apiVersion", "kind"):
            check(key in d, f"{d['__file']}: a document has no {key}")
        if d.get("kind") != "Kustomization":
            check("name" in d.get("metadata", {}), f"{d['__file']}: {d.get('kind')} has no metadata.name")
        by_kind.setdefault(d.get("kind"), []).append(d)
    if os.path.isdir(path):
        kust = by_kind.get("Kustomization", [{}])[0]
        listed = set(kust.get("resources", []))
        present = {os.path.basename(d["__file"]) for d in docs if d.get("kind") != "Kustomization"}
        check(listed == present, f"kustomization resources {sorted(listed)} != files {sorted(present)}")
    cms = {d["metadata"]["name"]: d.get("data", {}) for d in by_kind.get("ConfigMap", [])}
    sts_list = by_kind.get("StatefulSet", [])
    jobs = by_kind.get("Job", [])
    svcs = {d["metadata"]["name"]: d for d in by_kind.get("Service", [])}
    if not (check(len(sts_list) == 1, "expected one StatefulSet (the shards)")
            and check(len(jobs) == 1, "expected one Job (the workers)")):
        return
    sts, job = sts_list[0], jobs[0]
    check(sts["apiVersion"] == "apps/v1", "StatefulSet apiVersion is not apps/v1")
    check(job["apiVersion"] == "batch/v1", "Job apiVersion is not batch/v1")
    spec = sts["spec"]
    svc = svcs.get(spec.get("serviceName"))
    if check(svc is not None, f"StatefulSet serviceName {spec.get('serviceName')!r} names no Service"):
        check(svc["spec"].get("clusterIP") == "None", "the shards' Service is not headless")
        check(svc["spec"].get("selector", {}).items() <= spec["template"]["metadata"]["labels"].items(),
              "the shards' Service does not select the shard pods")
    check(spec.get("selector", {}).get("matchLabels", {}).items()
          <= spec["template"]["metadata"].get("labels", {}).items(),
          "StatefulSet selector does not match its pod labels")
    vcts = spec.get("volumeClaimTemplates", [])
    check(len(vcts) == 1, "StatefulSet has no PersistentVolumeClaim template")
    shard_spec = spec["template"]["spec"]["containers"][0]
    mounts = [m["mountPath"] for m in shard_spec.get("volumeMounts", [])
              if vcts and m["name"] == vcts[0]["metadata"]["name"]]
    check(any(f"--checkpoint_dir={m}" in " ".join(shard_spec.get("args", [])) for m in mounts),
          "shard --checkpoint_dir is not the PersistentVolumeClaim's mount point")
    config = {}
    for pod_name, tmpl in (("shard", spec["template"]), ("worker", job["spec"]["template"])):
        ann = tmpl["metadata"].get("annotations", {})
        check(ann.get("prometheus.io/scrape") == "true", f"{pod_name} pods lack prometheus.io/scrape")
        ports = {p["containerPort"] for c in tmpl["spec"]["containers"] for p in c.get("ports", [])}
        check(int(ann.get("prometheus.io/port", 0)) in ports,
              f"{pod_name} pods: prometheus.io/port is not a container port")
        for c in tmpl["spec"]["containers"]:
            res = c.get("resources", {})
            for k in ("requests", "limits"):
                check({"cpu", "memory"} <= set(res.get(k, {})), f"{pod_name}/{c['name']}: no cpu+memory {k}")
            for ref in c.get("envFrom", []):
                name = ref.get("configMapRef", {}).get("name")
                check(name in cms, f"{pod_name}/{c['name']}: envFrom names unknown ConfigMap {name}")
                config.update(cms.get(name, {}))
    shard_c = spec["template"]["spec"]["containers"][0]
    for probe in ("readinessProbe", "livenessProbe"):
        p = shard_c.get(probe, {})
        grpc_ok = "grpc" in p and p["grpc"].get("service", "") == ""
        exec_ok = "pserver_health_probe" in " ".join(p.get("exec", {}).get("command", [])) and \
            "ParameterServer" not in " ".join(p.get("exec", {}).get("command", []))
        check(grpc_ok or exec_ok, f"shard {probe} does not ask the gRPC health service \"\"")
    drain = float(config.get("DRAIN_SECONDS", 10))
    check(spec["template"]["spec"].get("terminationGracePeriodSeconds", 30) > drain,
          "shard terminationGracePeriodSeconds is not longer than DRAIN_SECONDS")
    check(str(spec.get("replicas")) == str(config.get("NUM_SHARDS")),
          f"StatefulSet replicas {spec.get('replicas')} != NUM_SHARDS {config.get('NUM_SHARDS')}")
    servers = config.get("SERVERS", "").split(",")
    check(len(servers) == int(spec.get("replicas", 0)) and all(
        s.startswith(f"{sts['metadata']['name']}-{i}.{spec.get('serviceName')}") for i, s in enumerate(servers)),
        f"SERVERS {config.get('SERVERS')!r} does not list the StatefulSet's pods in order")
    js = job["spec"]
    check(js.get("completionMode") == "Indexed", "worker Job is not Indexed")
    check(str(js.get("completions")) == str(config.get("NUM_WORKERS")) == str(js.get("parallelism")),
          "Job completions / parallelism / NUM_WORKERS disagree")
    wc = js["template"]["spec"]["containers"][0]
    args = " ".join(wc.get("command", []) + wc.get("args", []))
    env = {e["name"]: e for e in wc.get("env", [])}
    idx_env = [n for n, e in env.items() if "job-completion-index" in json.dumps(e)]
    check(any(f"--worker_id=$({n})" in args for n in idx_env) or "--worker_id=$(JOB_COMPLETION_INDEX)" in args,
          "worker id is not the Job completion index")
    check(js["template"]["spec"].get("restartPolicy") in ("OnFailure", "Never"), "Job restartPolicy invalid")
    for c in (shard_c, wc):
        for ref in re.findall(r"\$\(([A-Z_]+)\)", " ".join(c.get("args", []))):
            check(ref in config or ref in env, f"{c['name']}: $({ref}) is neither in the ConfigMap nor env")
    # The shard's args are a shell script: its $VARs must be set too (HOSTNAME
    # is the pod's), or the shard gets an empty flag.
    shard_env = {e["name"] for e in shard_c.get("env", [])}
    for ref in re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", " ".join(shard_c.get("args", []))):
        check(ref in config or ref in shard_env or ref == "HOSTNAME",
              f"{shard_c['name']}: its command reads ${ref}, which is not in the ConfigMap")


def check_k8s_colocated(path):
    """The co-located overlay, rendered: no shard StatefulSet; every worker pod
    carries a shard sidecar and is named by a headless Service that SERVERS
    lists in order, one shard per worker."""
    docs = load_docs(path)
    kinds = [d.get("kind") for d in docs]
    check("StatefulSet" not in kinds, "the co-located layout still has a StatefulSet")
    cms = {d["metadata"]["name"]: d.get("data", {}) for d in docs if d.get("kind") == "ConfigMap"}
    config = cms.get("pserver-config", {})
    jobs = [d for d in docs if d.get("kind") == "Job"]
    if not check(len(jobs) == 1, "expected one Job (the workers with their shards)"):
        return
    js = jobs[0]["spec"]
    pod = js["template"]["spec"]
    n = int(config.get("NUM_WORKERS", 0))
    check(str(js.get("completions")) == str(js.get("parallelism")) == str(n) == config.get("NUM_SHARDS"),
          "Job completions / parallelism / NUM_WORKERS / NUM_SHARDS disagree")
    svcs = {d["metadata"]["name"]: d for d in docs if d.get("kind") == "Service"}
    svc = svcs.get(pod.get("subdomain"))
    if check(svc is not None, f"worker pods' subdomain {pod.get('subdomain')!r} names no Service"):
        check(svc["spec"].get("clusterIP") == "None", "the workers' Service is not headless")
        check(svc["spec"].get("selector", {}).items() <= js["template"]["metadata"]["labels"].items(),
              "the workers' Service does not select the worker pods")
    job_name = jobs[0]["metadata"]["name"]
    want = ",".join(f"{job_name}-{i}.{pod.get('subdomain')}:50051" for i in range(n))
    check(config.get("SERVERS") == want, f"SERVERS is {config.get('SERVERS')!r}, expected {want!r}")
    sidecars = [c for c in pod.get("initContainers", []) if c.get("restartPolicy") == "Always"]
    if not check(len(sidecars) == 1, "worker pods carry no shard sidecar (initContainer, restartPolicy Always)"):
        return
    shard = sidecars[0]
    args = " ".join(shard.get("command", []) + shard.get("args", []))
    check("pserver_server" in args and '--shard_index="${HOSTNAME##*-}"' in args,
          "the sidecar is not pserver_server with the pod's index as its shard index")
    check("grpc" in shard.get("startupProbe", {}), "the shard sidecar has no gRPC startup probe")
    check(pod.get("terminationGracePeriodSeconds", 30) > float(config.get("DRAIN_SECONDS", 10)),
          "worker pods' terminationGracePeriodSeconds is not longer than DRAIN_SECONDS")
    for ref in re.findall(r"\$\{?([A-Z_][A-Z0-9_]*)", args):
        check(ref in config or ref == "HOSTNAME", f"shard sidecar: its command reads ${ref}, not in the ConfigMap")
    vols = {v["name"] for v in pod.get("volumes", [])}
    for m in shard.get("volumeMounts", []):
        check(m["name"] in vols, f"shard sidecar mounts unknown volume {m['name']}")
    check(any(f"--checkpoint_dir={m['mountPath']}" in args for m in shard.get("volumeMounts", [])),
          "shard --checkpoint_dir is not a mounted volume")


PROMQL_WORDS = {
    "sum", "avg", "min", "max", "count", "by", "without", "rate", "irate", "increase", "or", "and",
    "unless", "on", "ignoring", "group_left", "group_right", "histogram_quantile", "vector", "time",
    "topk", "bottomk", "abs", "clamp_min", "clamp_max", "delta", "deriv", "offset", "bool"}
PROMETHEUS_BUILTIN = {"up", "scrape_duration_seconds", "scrape_samples_scraped"}


def metric_names_in(expr):
    expr = re.sub(r'"[^"]*"', '""', expr)
    expr = re.sub(r"\{[^}]*\}", "", expr)            # label matchers
    expr = re.sub(r"\b(by|without|on|ignoring)\s*\([^)]*\)", "", expr)  # grouping labels
    expr = re.sub(r"\[[^\]]*\]", "", expr)            # ranges
    tokens = re.findall(r"(?<![0-9.])\b[a-zA-Z_:][a-zA-Z0-9_:]*\b", expr)
    return {t for t in tokens if t not in PROMQL_WORDS}


def check_dashboard(dash_path, scrapes):
    try:
        dash = json.load(open(dash_path))
    except ValueError as e:
        check(False, f"{dash_path}: not valid JSON: {e}")
        return
    exposed = set()
    for path in scrapes:
        for line in open(path):
            if line.startswith("# TYPE "):
                exposed.add(line.split()[2])
            elif line and not line.startswith("#"):
                exposed.add(re.split(r"[{ ]", line, 1)[0])
    panels = dash.get("panels", [])
    check(len(panels) >= 10, f"only {len(panels)} panels")
    uids = {t.get("datasource", {}).get("uid") for p in panels for t in p.get("targets", [])}
    check(uids <= {"pserver-prometheus"}, f"queries use data sources {uids}")
    names = set()
    for p in panels:
        for t in p.get("targets", []):
            found = metric_names_in(t.get("expr", ""))
            check(found, f"panel {p.get('title')!r}: a query names no metric")
            names |= found
    for n in sorted(names):
        check(n in exposed or n in PROMETHEUS_BUILTIN,
              f"dashboard queries {n}, which no live daemon exposes")
    titles = " ".join(p.get("title", "").lower() for p in panels)
    for want in ("steps per second", "round time", "up (push)", "down (pull)", "compression ratio",
                 "loss", "accuracy", "workers live", "optimizer stage", "error-feedback",
                 "rejected", "checkpoint", "learning rate"):
        check(want in titles, f"no panel about {want!r}")
    print(f"dashboard: {len(panels)} panels, {len(names)} metric names, all exposed: "
          + ", ".join(sorted(names)))


def main():
    if len(sys.argv) < 3:
        sys.exit(__doc__)
    what = sys.argv[1]
    if what == "compose":
        check_compose(sys.argv[2], sys.argv[3])
    elif what == "compose-colocated":
        check_compose_colocated(sys.argv[2], sys.argv[3])
    elif what == "k8s":
        check_k8s(sys.argv[2])
    elif what == "k8s-colocated":
        check_k8s_colocated(sys.argv[2])
    elif what == "compose-machines":
        check_compose_machines(sys.argv[2])
    elif what == "k8s-machines":
        check_k8s_machines(sys.argv[2])
    elif what == "dashboard":
        check_dashboard(sys.argv[2], sys.argv[3:])
    else:
        sys.exit(__doc__)
    for p in problems:
        print(f"{what}: {p}")
    sys.exit(1 if problems else 0)


if __name__ == "__main__":
    main()
