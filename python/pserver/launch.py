"""Run a training script on a local pserver cluster, like torchrun.

    /usr/bin/python3 -m pserver.launch [--shards 2] [--workers 4]
        [launcher options] [pserver_server flags] script.py [script args]

Starts the shards (pserver_server on 127.0.0.1, a free port each, reported
through --port_file), waits until every one listens, then starts the workers:
`python3 script.py args` once per rank with RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE and PSERVER_SERVERS set (what pserver.init() reads),
GROUP_RANK, MASTER_ADDR and MASTER_PORT as torchrun sets them (a script's
own torch.distributed.init_process_group() works unchanged), and
PYTHONPATH extended so the script imports this package (checked first: the
script's interpreter must import pserver._native), and OMP_NUM_THREADS=1
with more than one worker if unset (as torchrun). Rank 0's output goes
to the terminal; every other process writes to a log in the run folder
(printed in part when it fails).

It stops everything it started when the workers finish, when a worker or a
shard fails (the other ranks are stopped), and on Ctrl-C or SIGTERM; it exits
with the script's status: 0 when every rank exited 0, else the first failing
rank's code (128 + signal when a signal ended it; 130/143 when the launcher
itself was interrupted/terminated); 2 for bad arguments, or when the checks
before anything starts fail (no extension, another job's checkpoints).

Launcher options:
  --shards N          shards to start (default 2)
  --workers N         worker processes (default 4)
  --server-bin PATH   pserver_server to run (default: $PSERVER_SERVER_BIN, the
                      build tree's build/server/pserver_server, then PATH)
  --run-dir DIR       logs and the pid list (default: a new /tmp/pserver-run-*)
  --python PATH       interpreter for the script (default: this one)
  --start-timeout S   seconds a shard gets to listen (default 30)
  --checkpoint-dir D  (or --checkpoint_dir) checkpoints of shard i in
                      D/shard-<i> (pserver_server --checkpoint_dir; write
                      one every N rounds with --checkpoint-every N, default
                      100, and at the stop); the same command again resumes
                      every shard from its newest. D/job.json holds the
                      shard and worker counts: other counts are refused, as
                      are a D another running job uses, one with
                      ckpt-*.pserver files in it and one with a shard-<j>
                      folder for j >= --shards
  --recipe NAME[:F]   a measured compression recipe for language models
                      (pserver/recipes.py): lm-onebit or lm-topk, with 1-bit
                      Adam's variance frozen at round F (default 300 for
                      lm-onebit, 200 for lm-topk; freeze at two to three
                      times the learning rate's warmup), or lm-local (local
                      steps: the script runs 16 steps of its own optimizer
                      between pushes, DistributedOptimizer local_steps=16
                      with an inner_optimizer; another H with your
                      --local_steps=H). Writes its schedule, if it
                      has one, to <run dir>/recipe_NAME.txtpb, puts its
                      shard flags before yours (a flag you give again wins:
                      the daemon takes the last one) and gives the workers
                      PSERVER_CLIENT_OPTIONS, a JSON object of pserver.Client
                      options that DistributedOptimizer uses for those the
                      script does not pass. Not with --schedule, nor
                      with --freeze_step for lm-onebit and lm-topk (use
                      NAME:F).
  --nnodes N          machines in the job (default 1); with N > 1 run the
                      same command on each machine with its own
                      --node-rank I (0..N-1; node 0 prints the command):
  --node-rank I       this machine's place; its workers are ranks
                      I*G..I*G+G-1 (RANK, LOCAL_RANK, GROUP_RANK,
                      LOCAL_WORLD_SIZE, WORLD_SIZE, MASTER_ADDR and
                      MASTER_PORT set as torchrun sets them)
  --nproc-per-node G  workers on this machine (the same on each; one
                      machine: the same as --workers)
  --rdzv-endpoint H:P node 0's address and a free port, the same on every
                      machine: node 0 hosts torch's TCPStore there, where
                      the launchers publish their shards and learn the
                      others' (also --master-addr H --master-port P; the
                      environment's PET_NNODES, PET_NODE_RANK,
                      PET_NPROC_PER_NODE, PET_RDZV_ENDPOINT, PET_MASTER_ADDR
                      and PET_MASTER_PORT when an option is not given)
  --shards-per-node K shards on each machine beside its workers (default 1;
                      shard indices I*K..I*K+K-1)
  --node-addr A       the address the other machines reach this one's
                      shards at (default: the one this machine reaches the
                      endpoint from)
  --join-timeout S    seconds to wait for every machine's launcher and
                      shards (default 300); then every launcher exits 1
                      naming the missing ones. A failure on any machine
                      (a rank exiting non-zero, a shard, Ctrl-C) stops the
                      job on all of them, each naming where it started.
  --heartbeat-timeout S  a machine whose launcher has not been heard from
                      for S seconds (default 15: it died, or lost the
                      network) stops the job on the others, named
                      Not with --shards, --workers or --checkpoint-dir.
  --push-per P        worker (default: each pushes) or node: a machine's
                      workers average inside it (gloo over loopback) and
                      local rank 0 pushes once for them (pserver/_node.py)
  --                  ends the options; the script comes next
Every other option before the script is a pserver_server flag given to every
shard, as --name=value or --name value (dashes become underscores:
--pull-codec onebit is --pull_codec=onebit); boolean flags need =true/false.
The launcher sets --listen, --port_file, --shard_index, --num_shards and
--num_workers itself, and --metrics_listen= (off) and --drain_seconds=0
unless given. --metrics-listen HOST:PORT gives shard i the port PORT + i
(PORT 0: any free port each); the launcher prints each shard's metrics URL.
"""

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
        nodes, rank = (1, 0) if node is None else (node["nnodes"],
                                                   node["rank"])
        self.node_rank = rank
        self.first_shard = rank * opts["shards"]
        self.first_rank = rank * opts["workers"]
        self.num_shards = nodes * opts["shards"]
        self.num_workers = nodes * opts["workers"]
        # What the shards count as workers: machines with one push each.
        self.pushers = (nodes if opts["push_per"] == "node"
                        else self.num_workers)
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
        n = self.opts["shards"]
        flags = list(self.opts["server_flags"])
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

    def stop(self, grace=10.0):
        """Stops the workers, then the shards: SIGTERM to each process group,
        SIGKILL after `grace` seconds."""
        for group in (self.workers, self.shards):
            procs = [p for p, _ in group]
            for p in procs:
                _signal_group(p, signal.SIGTERM)
            deadline = time.monotonic() + grace
            for p in procs:
                try:
                    p.wait(timeout=max(0.0, deadline - time.monotonic()))
                except subprocess.TimeoutExpired:
                    pass
            for p in procs:
                # The group too: a child the process left behind.
                _signal_group(p, signal.SIGKILL)
                p.wait()


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
            sys.stdout.write(__doc__)
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
            _say(f"{name}: stopping everything")
            if node is not None:
                node.fail(f"{name} on node {node.rank}")
            code = 128 + e.signum
    finally:
        # A second signal during teardown must not leave processes behind.
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        cluster.stop()
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
                       n["join_timeout"], n["heartbeat_timeout"])
    if node.rank == 0:
        _say(f"node 0 of {n['nnodes']}: the store is at {node.endpoint}; on "
             f"each other machine I (1..{n['nnodes'] - 1}) run: "
             f"{_nodes.command_for_others(argv)}")
    node.join()
    return node


if __name__ == "__main__":
    sys.exit(main())
