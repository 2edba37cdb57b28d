"""Where a worker finds its shards and its rank: torchrun-style variables."""

import os


def _int_env(name, env):
    text = env.get(name)
    if text is None or text == "":
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{name} is {text!r}; expected an integer") from None


def init(servers=None, worker_id=None, num_workers=None, env=None):
    """Returns dict(servers=[...], worker_id=..., num_workers=...).

    Reads RANK (the worker id), WORLD_SIZE (the worker count) and
    PSERVER_SERVERS (comma-separated host:port, shard 0 first) from `env`
    (default os.environ); explicit arguments override them. `servers` may be
    a list or a comma-separated string. Raises ValueError naming what is
    missing or malformed. Contacts no shard.
    """
    env = os.environ if env is None else env
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
    return {"servers": servers, "worker_id": worker_id,
            "num_workers": num_workers}
