"""pserver.launch's command line: the launcher's own options, the
pserver_server flags for every shard, the script and its arguments (see
pserver/launch.py's docstring for what each means)."""

import os
import sys

from pserver import recipes
from pserver._launch_prep import UsageError, check_recipe_flags

_OWN_SERVER_FLAGS = ("listen", "port_file", "shard_index", "num_shards",
                     "num_workers")
# Option -> torchrun's environment fallback (its PET_ variables).
_NODE_OPTIONS = {
    "--nnodes": "PET_NNODES", "--node-rank": "PET_NODE_RANK",
    "--nproc-per-node": "PET_NPROC_PER_NODE",
    "--rdzv-endpoint": "PET_RDZV_ENDPOINT",
    "--master-addr": "PET_MASTER_ADDR", "--master-port": "PET_MASTER_PORT",
    "--node-addr": None, "--shards-per-node": None, "--join-timeout": None,
    "--heartbeat-timeout": None}


def _nodes(opts, given):
    """Several machines (--nnodes N > 1): this machine's workers
    (--nproc-per-node) and shards (--shards-per-node, default 1: beside its
    workers), and where the launchers meet, into opts["node"]; --workers
    and --shards then count this machine's. Raises UsageError."""
    for name, env in _NODE_OPTIONS.items():
        if name not in given and env and os.environ.get(env):
            given[name] = os.environ[env]
    if "--nproc-per-node" in given:
        opts["workers"] = _positive("--nproc-per-node",
                                    given["--nproc-per-node"])
    min_nodes, nnodes = _nnodes(given.get("--nnodes", "1"))
    if nnodes == 1:
        extra = [n for n in given if n not in ("--nnodes", "--nproc-per-node",
                                               "--node-rank")]
        if extra or given.get("--node-rank", "0") != "0":
            raise UsageError(f"{(extra or ['--node-rank'])[0]} is for several "
                             "machines; expected --nnodes N > 1 with it")
        return
    if "--node-rank" not in given:
        raise UsageError(f"--nnodes is {nnodes}; expected --node-rank I "
                         f"(0..{nnodes - 1}) on each machine")
    try:
        # auto: claimed from node 0's store at the start (None until then).
        rank = None if given["--node-rank"] == "auto" else \
            int(given["--node-rank"])
    except ValueError:
        rank = -1
    if rank is not None and not 0 <= rank < nnodes:
        raise UsageError(f"--node-rank is {given['--node-rank']!r}; expected "
                         f"an integer in 0..{nnodes - 1} (--nnodes {nnodes}),"
                         " or auto")
    endpoint = given.get("--rdzv-endpoint")
    if endpoint is None and "--master-addr" in given:
        endpoint = f"{given['--master-addr']}:{given.get('--master-port', '29500')}"
    host, sep, port = (endpoint or "").rpartition(":")
    if not sep or not host or not port.isdigit() or not 0 < int(port) < 65536:
        raise UsageError(
            f"--rdzv-endpoint is {endpoint!r}; expected HOST:PORT of node 0 "
            "(or --master-addr HOST --master-port PORT), the same on every "
            "machine")
    for name, instead in (("--shards", "--shards-per-node K"),
                          ("--workers", "--nproc-per-node G")):
        if name in opts["given"]:
            raise UsageError(f"{name} with --nnodes > 1: expected {instead} "
                             "(counts on each machine)")
    if min_nodes < nnodes and opts["push_per"] == "node":
        raise UsageError(f"--push-per node with --nnodes {min_nodes}:{nnodes}:"
                         " machines cannot join or leave a running job with "
                         "one push per machine yet; expected --push-per "
                         "worker, or a fixed --nnodes N")
    if opts["checkpoint_dir"]:
        raise UsageError("--checkpoint-dir with --nnodes > 1: not supported "
                         "on several machines yet; expected one machine, or "
                         "shards started by hand with their own "
                         "--checkpoint_dir")
    timeout = _seconds(given, "--join-timeout", "300")
    heartbeat = _seconds(given, "--heartbeat-timeout", "15")
    opts["shards"] = _positive("--shards-per-node",
                               given.get("--shards-per-node", "1"))
    opts["node"] = {"nnodes": nnodes, "min_nodes": min_nodes, "rank": rank,
                    "host": host,
                    "port": int(port), "addr": given.get("--node-addr"),
                    "join_timeout": timeout, "heartbeat_timeout": heartbeat}


def _nnodes(text):
    """--nnodes N, or torchrun's elastic MIN:MAX (MIN machines start the
    job and host its shards; up to MAX - MIN more may join it and leave
    it while it runs): (MIN, MAX). Raises UsageError."""
    low, colon, high = text.partition(":")
    try:
        lo, hi = int(low), int(high if colon else low)
    except ValueError:
        lo = hi = 0
    if not 1 <= lo <= hi:
        raise UsageError(f"--nnodes is {text!r}; expected N or MIN:MAX "
                         "(positive integers, MIN <= MAX)")
    return lo, hi


def _seconds(given, name, default):
    """given[name] (else default) as seconds > 0, or UsageError."""
    try:
        value = float(given.get(name, default))
    except ValueError:
        value = -1
    if not value > 0 or value == float("inf"):
        raise UsageError(f"{name} is {given[name]!r}; expected seconds > 0")
    return value


def shard_metrics(listen, i):
    """Shard i's --metrics_listen value for the launcher's HOST:PORT: PORT + i,
    port 0 stays 0 (any free port), empty stays off."""
    if not listen:
        return ""
    host, sep, port = listen.rpartition(":")
    if not sep or not port.isdigit() or int(port) > 65535:
        raise UsageError(f"--metrics-listen is '{listen}'; expected HOST:PORT")
    if int(port) == 0:
        return listen
    if int(port) + i > 65535:
        raise UsageError(f"--metrics-listen port {port} + shard {i} is past "
                         "65535")
    return f"{host}:{int(port) + i}"


def _positive(name, text):
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise UsageError(f"{name} is {text!r}; expected a positive integer")
    return value


def parse_args(argv):
    """Returns a dict of the launcher's settings; raises UsageError."""
    opts = {"shards": 2, "workers": 4, "server_bin": None, "run_dir": None,
            "python": sys.executable, "start_timeout": 30.0,
            "recipe": None, "server_flags": [], "script": None,
            "script_args": [], "checkpoint_dir": None, "node": None,
            "given": set(), "push_per": "worker"}
    own = {"--shards", "--workers", "--server-bin", "--run-dir", "--python",
           "--start-timeout", "--recipe", "--push-per"}
    given = {}  # the several-machine options, as torchrun spells them
    i = 0
    while i < len(argv):
        arg = argv[i]
        if arg in ("-h", "--help"):
            opts["help"] = True
            return opts
        if arg == "--":
            i += 1
            break
        if not arg.startswith("--"):
            if arg.startswith("-") and arg != "-":
                raise UsageError(f"unknown option {arg!r} (see --help)")
            break
        name, eq, value = arg.partition("=")
        if not eq:
            if i + 1 >= len(argv):
                raise UsageError(f"{name} needs a value")
            value = argv[i + 1]
            i += 1
        i += 1
        if name.replace("_", "-") in _NODE_OPTIONS:
            given[name.replace("_", "-")] = value
            continue
        if name in own:
            key = name[2:].replace("-", "_")
            if key in ("shards", "workers"):
                opts[key] = _positive(name, value)
                opts["given"].add(name)
            elif key == "start_timeout":
                try:
                    opts[key] = float(value)
                except ValueError:
                    raise UsageError(f"{name} is {value!r}; expected "
                                     "seconds") from None
            elif key == "push_per":
                if value not in ("worker", "node"):
                    raise UsageError(f"--push-per is {value!r}; expected "
                                     "worker (each worker pushes) or node "
                                     "(one push per machine)")
                opts[key] = value
            elif key == "recipe":
                try:
                    opts[key] = recipes.parse(value)
                except ValueError as e:
                    # "recipe 'x' is unknown; ..." -> "--recipe 'x' is ..."
                    raise UsageError(f"--{e}") from None
            else:
                opts[key] = value
            continue
        flag = name[2:].replace("-", "_")
        if not flag:
            raise UsageError(f"malformed option {arg!r}")
        if flag in _OWN_SERVER_FLAGS:
            raise UsageError(f"--{flag} is set by the launcher; use --shards"
                             "/--workers instead")
        if flag == "checkpoint_dir":  # one folder per shard under it
            opts["checkpoint_dir"] = value or None
            continue
        opts["server_flags"].append(f"--{flag}={value}")
    if i >= len(argv):
        raise UsageError("no script given; usage: python3 -m pserver.launch "
                         "[options] script.py [args]")
    _nodes(opts, given)
    for f in opts["server_flags"]:
        if f.startswith("--metrics_listen="):
            shard_metrics(f.split("=", 1)[1], opts["shards"] - 1)  # checks
    if opts["recipe"] is not None:
        check_recipe_flags(opts["recipe"], opts["server_flags"])
    opts["script"] = argv[i]
    opts["script_args"] = argv[i + 1:]
    if not os.path.isfile(opts["script"]):
        raise UsageError(f"script {opts['script']!r} is not a file")
    return opts
