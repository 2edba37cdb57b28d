"""Run a training script on a pserver cluster, like torchrun: on one
machine, or the same command on each of several (--nnodes). The usage text,
which --help prints, is python/pserver/_launch_usage.py."""

import ctypes
import json
import os
import pathlib
import re
import signal
import subprocess
import sys
import tempfile
import time

from pserver import _nodes
from pserver._launch_args import parse_args, shard_metrics
from pserver._launch_usage import USAGE
from pserver.env import NODE_GROUP_ENV
from pserver._launch_prep import (UsageError, apply_recipe, check_native,
                                  describe_restore,
                                  find_server, prepare_checkpoints,
                                  shard_folder, worker_env)

_TAIL_LINES = 20
try:
    _PRCTL = ctypes.CDLL(None).prctl
except (OSError, AttributeError):
    _PRCTL = None


def _say(text):
    print(f"launch: {text}", file=sys.stderr, flush=True)


def _tail(path):
    try:
        lines = pathlib.Path(path).read_text(errors="replace").splitlines()
    except OSError:
        return ""
    return "\n".join(lines[-_TAIL_LINES:])


def _exit_code(returncode):
    return 128 - returncode if returncode < 0 else returncode


class _Interrupted(Exception):
    def __init__(self, signum):
        super().__init__(signum)
        self.signum = signum


class Cluster:
    """The processes of one run; each in its own session, so stopping one
    stops whatever it started. Not thread-safe: one launcher thread."""

    def __init__(self, opts, server_bin, run_dir):
        self.opts = opts
        self.server_bin = server_bin
        self.run_dir = pathlib.Path(run_dir)
        self.node = None  # the _nodes.Node once joined (several machines)
        self.shards = []   # (Popen, log path)
        self.workers = []  # (Popen, log path or None)
        # This machine's first shard and rank, and the job's totals.
        node = opts["node"]
        nodes, rank, core = (1, 0, 1) if node is None else (
            node["nnodes"], node["rank"], node["min_nodes"])
        self.node_rank = rank
        # Elastic: the first `core` nodes start the job and host the shards;
        # the others join it later (and may leave it), ranks beyond.
        self.elastic = core < nodes
        self.local_shards = opts["shards"] if rank < core else 0
        self.first_shard = rank * opts["shards"]
        self.first_rank = rank * opts["workers"]
        self.num_shards = core * opts["shards"]
        self.num_workers = nodes * opts["workers"]
        # What the shards count as workers: machines with one push each.
        self.pushers = (nodes if opts["push_per"] == "node"
                        else self.num_workers)
        self.initial = core * opts["workers"]
        self.node_store = None  # the machine's group's store (push per node)

    def _record(self, role, proc):
        with open(self.run_dir / "pids", "a") as f:
            f.write(f"{role} {proc.pid}\n")

    def _checkpoint_lock(self):
        lock = self.opts.get("checkpoint_lock")
        return () if lock is None else (lock,)

    def _checkpoint_flag(self, i):
        root = self.opts["checkpoint_dir"]
        return [f"--checkpoint_dir={shard_folder(root, i)}"] if root else []

    def start_shards(self):
        n = self.local_shards
        flags = list(self.opts["server_flags"])
        if self.elastic:
            flags.append(f"--initial_workers={self.initial}")
        metrics = [f for f in flags if f.startswith("--metrics_listen=")]
        flags = [f for f in flags if not f.startswith("--metrics_listen=")]
        # The last one given counts, as with the daemon's own flags.
        metrics = metrics[-1].split("=", 1)[1] if metrics else ""
        if not any(f.startswith("--drain_seconds=") for f in flags):
            flags.append("--drain_seconds=0")
        # Known once joined: the address the other machines reach this one at.
        host = ("127.0.0.1" if self.opts["node"] is None else
                self.opts["node"]["addr"])
        port_files = []
        for i in range(self.first_shard, self.first_shard + n):
            port_file = self.run_dir / f"shard{i}.port"
            log = self.run_dir / f"shard{i}.log"
            # A reused run folder holds the previous run's port files:
            # waiting on them would hand the workers dead ports.
            port_file.unlink(missing_ok=True)
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [self.server_bin, f"--shard_index={i}",
                     f"--num_shards={self.num_shards}",
                     f"--num_workers={self.pushers}",
                     f"--listen={host}:0", f"--port_file={port_file}",
                     f"--metrics_listen={shard_metrics(metrics, i)}",
                     *flags, *self._checkpoint_flag(i)],
                    stdin=subprocess.DEVNULL, stdout=out,
                    stderr=subprocess.STDOUT, start_new_session=True,
                    preexec_fn=_die_with_launcher,
                    # The folder's lock lasts until its last shard exits.
                    pass_fds=self._checkpoint_lock())
            self.shards.append((proc, log))
            self._record(f"shard{i}", proc)
            port_files.append(port_file)
        deadline = time.monotonic() + self.opts["start_timeout"]
        addrs = []
        for i, ((proc, log), port_file) in enumerate(
                zip(self.shards, port_files), self.first_shard):
            while not port_file.exists():
                if proc.poll() is not None:
                    raise RuntimeError(
                        f"shard {i} exited with status {proc.returncode} "
                        f"before listening; {log}:\n{_tail(log)}")
                if time.monotonic() > deadline:
                    raise RuntimeError(
                        f"shard {i} did not listen within "
                        f"{self.opts['start_timeout']:g} s; {log}:\n"
                        f"{_tail(log)}")
                time.sleep(0.02)
            addrs.append(f"{host}:{port_file.read_text().strip()}")
            if metrics:
                # The daemon logs its ports before it writes the port file.
                m = re.search(r"\(metrics port (\d+)\)", log.read_text())
                if m:
                    host = metrics.rsplit(":", 1)[0] or "127.0.0.1"
                    if host in ("0.0.0.0", "[::]"):
                        host = "127.0.0.1"
                    _say(f"shard {i} metrics: http://{host}:{m.group(1)}/metrics")
        if self.opts["checkpoint_dir"]:
            _say(describe_restore(self.opts["checkpoint_dir"],
                                  [log for _, log in self.shards]))
        return addrs

    def start_workers(self, addrs):
        n = self.opts["workers"]
        rdzv = _nodes.torchrun_env(self.node, self.opts["node"])
        if self.opts["push_per"] == "node":
            self.node_store = _nodes.local_store()
            rdzv[NODE_GROUP_ENV] = json.dumps({
                "store": f"127.0.0.1:{self.node_store.port}",
                "node": self.node_rank, "nodes": self.pushers})
        for local in range(n):
            rank = self.first_rank + local
            env = dict(self.opts["worker_env"], RANK=str(rank),
                       WORLD_SIZE=str(self.num_workers),
                       LOCAL_RANK=str(local), LOCAL_WORLD_SIZE=str(n),
                       PSERVER_SERVERS=",".join(addrs), **rdzv)
            if self.elastic and not self.local_shards:
                env["PSERVER_ELASTIC"] = "1"  # leave on SIGTERM (_leave.py)
            if self.opts.get("client_options") is not None:
                env["PSERVER_CLIENT_OPTIONS"] = json.dumps(
                    self.opts["client_options"])
            cmd = [self.opts["python"], self.opts["script"],
                   *self.opts["script_args"]]
            if local == 0:
                proc = subprocess.Popen(cmd, env=env, start_new_session=True,
                                        preexec_fn=_die_with_launcher)
                log = None
            else:
                log = self.run_dir / f"worker{rank}.log"
                with open(log, "wb") as out:
                    proc = subprocess.Popen(
                        cmd, env=env, stdin=subprocess.DEVNULL, stdout=out,
                        stderr=subprocess.STDOUT, start_new_session=True,
                        preexec_fn=_die_with_launcher)
            self.workers.append((proc, log))
            self._record(f"worker{rank}", proc)

    def shards_alive(self):
        """Raises RuntimeError when one of this machine's shards exited."""
        for i, (proc, log) in enumerate(self.shards, self.first_shard):
            if proc.poll() is not None:
                raise RuntimeError(f"shard {i} exited with status "
                                   f"{proc.returncode} while workers ran; "
                                   f"{log}:\n{_tail(log)}")

    def wait(self):
        """Until every worker (on every machine) is done or one process
        fails; returns the exit code for the launcher."""
        polls = 0
        while True:
            running = 0
            for rank, (proc, log) in enumerate(self.workers,
                                               self.first_rank):
                code = proc.poll()
                if code is None:
                    running += 1
                elif code != 0:
                    where = f"; {log}:\n{_tail(log)}" if log else ""
                    _say(f"rank {rank} exited with status {code}; stopping "
                         f"the others{where}")
                    if self.node is not None:
                        self.node.fail(f"rank {rank} exited with status "
                                       f"{code} on node {self.node.rank}")
                    return _exit_code(code)
            if running == 0:
                if self.node is not None:
                    self.node.finish(self.shards_alive)
                return 0
            self.shards_alive()
            polls += 1
            if self.node is not None and polls % 4 == 0:
                self.node.check_others()
            time.sleep(0.05)

    def leave(self, grace=120.0):
        """Elastic, a node without shards told to stop: SIGTERM to its
        workers, which leave the job at their next round and exit 0
        (python/pserver/_leave.py); True if all did within `grace` s."""
        procs = [p for p, _ in self.workers]
        for p in procs:
            try:  # the process only: its own children (data loaders) stay
                os.kill(p.pid, signal.SIGTERM)
            except ProcessLookupError:
                pass
        return all(c == 0 for c in _wait_all(procs, grace))

    def stop(self, grace=10.0):
        """Stops the workers, then the shards: SIGTERM to each process group,
        SIGKILL after `grace` seconds."""
        for group in (self.workers, self.shards):
            procs = [p for p, _ in group]
            for p in procs:
                _signal_group(p, signal.SIGTERM)
            _wait_all(procs, grace)
            for p in procs:
                # The group too: a child the process left behind.
                _signal_group(p, signal.SIGKILL)
                p.wait()


def _wait_all(procs, grace):
    """Waits up to `grace` seconds in all for `procs` to exit; their exit
    codes (None: still running)."""
    deadline = time.monotonic() + grace
    codes = []
    for p in procs:
        try:
            codes.append(p.wait(timeout=max(0.0, deadline - time.monotonic())))
        except subprocess.TimeoutExpired:
            codes.append(None)
    return codes


def _die_with_launcher():
    """In the child before exec: SIGTERM when the launcher dies, even by
    SIGKILL (Linux's PR_SET_PDEATHSIG; nothing on other systems)."""
    if _PRCTL is not None:
        _PRCTL(1, signal.SIGTERM, 0, 0, 0)  # 1: PR_SET_PDEATHSIG


def _signal_group(proc, sig):
    try:
        os.killpg(proc.pid, sig)
    except (ProcessLookupError, PermissionError):
        pass


def main(argv=None):
    argv = sys.argv[1:] if argv is None else argv
    try:
        opts = parse_args(argv)
        if opts.get("help"):
            sys.stdout.write(USAGE)
            return 0
        server_bin = find_server(opts["server_bin"])
        opts["worker_env"], omp_notice = worker_env(opts["workers"])
        check_native(opts["python"], opts["worker_env"], opts["script"])
        run_dir = opts["run_dir"]
        if run_dir:
            os.makedirs(run_dir, exist_ok=True)
        else:
            run_dir = tempfile.mkdtemp(prefix="pserver-run-")
        if opts["recipe"] is not None:
            _say(apply_recipe(opts, run_dir))
        if opts["checkpoint_dir"]:
            opts["checkpoint_dir"], opts["checkpoint_lock"] = \
                prepare_checkpoints(opts["checkpoint_dir"], opts["shards"],
                                    opts["workers"])
        if omp_notice:
            _say(omp_notice)
    except (UsageError, OSError) as e:
        print(f"launch: error: {e}", file=sys.stderr)
        return 2

    def interrupted(signum, _frame):
        raise _Interrupted(signum)

    old = {s: signal.signal(s, interrupted)
           for s in (signal.SIGINT, signal.SIGTERM)}
    node = None
    n = opts["node"]
    if n is not None and n["rank"] is None:
        try:
            n["rank"], n["reclaimed"] = _nodes.claim_rank(
                n["host"], n["port"], n["nnodes"], n["join_timeout"])
        except RuntimeError as e:
            print(f"launch: error: {e}", file=sys.stderr)
            return 1
        except _Interrupted as e:
            return 128 + e.signum
        _say(f"--node-rank auto: this machine is node {n['rank']}"
             + (" (its machine left the job; taken again)"
                if n["reclaimed"] else ""))
    cluster = Cluster(opts, server_bin, run_dir)
    code = 1
    try:
        try:
            if opts["node"] is not None:
                node = cluster.node = _join(opts, argv)
            addrs = cluster.start_shards()
            if node is not None:
                addrs = node.shards(cluster.first_shard, addrs,
                                    cluster.num_shards, opts["shards"],
                                    cluster.shards_alive)
            first = cluster.first_rank
            last = first + opts["workers"] - 1
            _say(f"run folder {run_dir}; {cluster.num_shards} shards at "
                 f"{','.join(addrs)}; {cluster.num_workers} workers of "
                 f"{opts['script']}" + (
                     f", ranks {first}..{last} here" if node else "") +
                 f" (rank {first} below, the others in worker<rank>.log)")
            cluster.start_workers(addrs)
            code = cluster.wait()
        except _nodes.Elsewhere as e:
            _say(str(e))
            code = 1
        except RuntimeError as e:
            _say(str(e))
            if node is not None:
                node.fail(str(e))
            code = 1
        except _Interrupted as e:
            name = signal.Signals(e.signum).name
            if (e.signum == signal.SIGTERM and cluster.elastic and
                    not cluster.local_shards and node is not None):
                signal.signal(signal.SIGTERM, signal.SIG_IGN)
                _say(f"{name}: this machine's workers leave the job at "
                     "their next round; the others go on")
                code = 0 if cluster.leave() else 1
                node.depart()
                if code:
                    _say("a worker did not leave cleanly; the shards drop "
                         "it when its lease runs out")
            else:
                _say(f"{name}: stopping everything")
                if node is not None:
                    node.fail(f"{name} on node {node.rank}")
                code = 128 + e.signum
    finally:
        # A second signal during teardown must not leave processes behind.
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        cluster.stop()
        if node is not None:
            node.close()
        for s, handler in old.items():
            signal.signal(s, handler)
    if code == 0:
        _say(f"all {cluster.num_workers} workers exited 0; logs in {run_dir}")
    return code


def _join(opts, argv):
    """This machine's launcher joins the others (several machines)."""
    n = opts["node"]
    if n["addr"] is None:
        n["addr"] = _nodes.local_address(n["host"], n["port"])
    node = _nodes.Node(n["nnodes"], n["rank"], n["host"], n["port"],
                       n["join_timeout"], n["heartbeat_timeout"],
                       n["min_nodes"])
    if node.rank == 0:
        _say(f"node 0 of {n['nnodes']}: the store is at {node.endpoint}; on "
             f"each other machine I (1..{n['nnodes'] - 1}) run: "
             f"{_nodes.command_for_others(argv)}")
    node.join(claimed=n.get("reclaimed", False))
    return node


if __name__ == "__main__":
    sys.exit(main())
