"""Where a worker finds its shards and its rank (torchrun-style variables),
and the Client options a launcher's recipe gives it."""

import json
import os

CLIENT_OPTIONS_ENV = "PSERVER_CLIENT_OPTIONS"
# One push per machine (python3 -m pserver.launch --push-per node).
NODE_GROUP_ENV = "PSERVER_NODE_GROUP"
# pserver.Client's keyword options that PSERVER_CLIENT_OPTIONS may set
# (python/native/module.cc); servers, worker_id, num_workers, local_steps
# and the Adam hyper-parameters (beta1, beta2, eps: its param groups') are
# DistributedOptimizer's own.
CLIENT_OPTIONS = (
    "push_codec", "warmup_codec", "block_size", "k_fraction", "bits",
    "ef_decay", "seed", "rpc_timeout", "pull_timeout", "retry_budget",
    "metrics_listen", "tls_ca", "tls_cert", "tls_key", "auth_token_file",
    "momentum_masking", "schedule", "run_length")
# DistributedOptimizer's own options that PSERVER_CLIENT_OPTIONS may set too
# (a recipe's; an argument the script passes wins).
OPTIMIZER_OPTIONS = ("outer_momentum",)
_JSON_TYPES = {list: "an array", str: "a string", bool: "a boolean",
               int: "a number", float: "a number", type(None): "null"}


def _int_env(name, env):
    text = env.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} is {text!r}; expected an integer") from None


def node_group(env):
    """The machine's group from PSERVER_NODE_GROUP (set by the launcher: a
    JSON object {"store": "127.0.0.1:PORT", "node": I, "nodes": N}) and
    LOCAL_RANK / LOCAL_WORLD_SIZE; None when unset. ValueError naming the
    variable for anything malformed."""
    text = env.get(NODE_GROUP_ENV, "")
    if not text.strip():
        return None
    expected = ('expected a JSON object {"store": "HOST:PORT", "node": I, '
                '"nodes": N}, as python3 -m pserver.launch --push-per node '
                'sets it')
    try:
        spec = json.loads(text)
        host, port = spec["store"].rsplit(":", 1)
        node, nodes = int(spec["node"]), int(spec["nodes"])
        local = int(env.get("LOCAL_RANK", ""))
        size = int(env.get("LOCAL_WORLD_SIZE", ""))
        port = int(port)
    except (ValueError, KeyError, TypeError, AttributeError):
        raise ValueError(f"{NODE_GROUP_ENV} is {text!r} (LOCAL_RANK "
                         f"{env.get('LOCAL_RANK')!r}, LOCAL_WORLD_SIZE "
                         f"{env.get('LOCAL_WORLD_SIZE')!r}); {expected}, with "
                         "LOCAL_RANK and LOCAL_WORLD_SIZE integers") from None
    if not (0 <= node < nodes and 0 <= local < size):
        raise ValueError(f"{NODE_GROUP_ENV} gives node {node} of {nodes} "
                         f"with LOCAL_RANK {local} of LOCAL_WORLD_SIZE "
                         f"{size}; expected "
                         "0 <= node < nodes and 0 <= LOCAL_RANK < "
                         "LOCAL_WORLD_SIZE")
    return {"host": host, "port": port, "node": node, "nodes": nodes,
            "local_rank": local, "local_size": size}


def init(servers=None, worker_id=None, num_workers=None, env=None):
    """Returns dict(servers=[...], worker_id=..., num_workers=...).

    Reads RANK (the worker id), WORLD_SIZE (the worker count) and
    PSERVER_SERVERS (comma-separated host:port, shard 0 first) from `env`
    (default os.environ); explicit arguments override them. `servers` may be
    a list or a comma-separated string. With one push per machine
    (PSERVER_NODE_GROUP, set by python3 -m pserver.launch --push-per node)
    "node_group" is added: the machine's group, for DistributedOptimizer,
    whose client is the machine (worker node_group["node"] of
    node_group["nodes"]); worker_id and num_workers stay the process's
    RANK and WORLD_SIZE (what a script shards its data by). Raises
    ValueError naming what is missing or malformed. Contacts no shard.
    """
    env = os.environ if env is None else env
    node = node_group(env)
    if servers is None:
        servers = env.get("PSERVER_SERVERS")
        if not servers:
            raise ValueError("no servers: pass servers=[...] or set "
                             "PSERVER_SERVERS=host:port[,host:port...]")
    if isinstance(servers, str):
        servers = [s.strip() for s in servers.split(",") if s.strip()]
    servers = list(servers)
    if not servers:
        raise ValueError("servers is empty; expected one host:port per shard")
    if worker_id is None:
        worker_id = _int_env("RANK", env)
        if worker_id is None:
            worker_id = 0
    if num_workers is None:
        num_workers = _int_env("WORLD_SIZE", env)
        if num_workers is None:
            num_workers = 1
    worker_id, num_workers = int(worker_id), int(num_workers)
    if num_workers < 1 or not 0 <= worker_id < num_workers:
        raise ValueError(f"worker_id (RANK) is {worker_id} with num_workers "
                         f"(WORLD_SIZE) {num_workers}; expected "
                         "0 <= worker_id < num_workers")
    out = {"servers": servers, "worker_id": worker_id,
           "num_workers": num_workers}
    if node is not None:
        out["node_group"] = node
    return out


def client_options(env=None):
    """The pserver.Client options in PSERVER_CLIENT_OPTIONS (a JSON object,
    e.g. {"push_codec": "topk", "k_fraction": 0.01}; what python3 -m
    pserver.launch --recipe sets) from `env` (default os.environ), as a dict;
    {} when unset or empty. Raises ValueError naming the variable (and the
    key) for text that is not JSON, JSON that is not an object, and a key
    that is not one of CLIENT_OPTIONS or OPTIMIZER_OPTIONS. The values'
    types are Client's (and DistributedOptimizer's) to check. Contacts no
    shard."""
    env = os.environ if env is None else env
    text = env.get(CLIENT_OPTIONS_ENV, "")
    if not text.strip():
        return {}
    expected = ('expected a JSON object of pserver.Client options, e.g. '
                '{"push_codec": "topk", "k_fraction": 0.01}')
    try:
        value = json.loads(text)
    except ValueError as e:
        raise ValueError(f"{CLIENT_OPTIONS_ENV} is not JSON ({e}); "
                         f"{expected}") from None
    if not isinstance(value, dict):
        raise ValueError(f"{CLIENT_OPTIONS_ENV} is "
                         f"{_JSON_TYPES.get(type(value), 'not an object')}; "
                         f"{expected}")
    for key in value:
        if key not in CLIENT_OPTIONS + OPTIMIZER_OPTIONS:
            raise ValueError(f"{CLIENT_OPTIONS_ENV} has the key {key!r}, "
                             "which is not a pserver.Client option nor "
                             "outer_momentum; expected keys among "
                             f"{', '.join(CLIENT_OPTIONS + OPTIMIZER_OPTIONS)}")
    return value
