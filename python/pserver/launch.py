"""Run a training script on a local pserver cluster, like torchrun.

    /usr/bin/python3 -m pserver.launch [--shards 2] [--workers 4]
        [launcher options] [pserver_server flags] script.py [script args]

Starts the shards (pserver_server on 127.0.0.1, a free port each, reported
through --port_file), waits until every one listens, then starts the workers:
`python3 script.py args` once per rank with RANK, WORLD_SIZE, LOCAL_RANK,
LOCAL_WORLD_SIZE and PSERVER_SERVERS set (what pserver.init() reads), and
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

from pserver import recipes
from pserver._launch_prep import (UsageError, apply_recipe, check_native,
                                  check_recipe_flags, describe_restore,
                                  find_server, prepare_checkpoints,
                                  shard_folder, worker_env)

_OWN_SERVER_FLAGS = ("listen", "port_file", "shard_index", "num_shards",
                     "num_workers")
_TAIL_LINES = 20
try:
    _PRCTL = ctypes.CDLL(None).prctl
except (OSError, AttributeError):
    _PRCTL = None


def _shard_metrics(listen, i):
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
            "script_args": [], "checkpoint_dir": None}
    own = {"--shards", "--workers", "--server-bin", "--run-dir", "--python",
           "--start-timeout", "--recipe"}
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
        if name in own:
            key = name[2:].replace("-", "_")
            if key in ("shards", "workers"):
                opts[key] = _positive(name, value)
            elif key == "start_timeout":
                try:
                    opts[key] = float(value)
                except ValueError:
                    raise UsageError(f"{name} is {value!r}; expected "
                                     "seconds") from None
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
    for f in opts["server_flags"]:
        if f.startswith("--metrics_listen="):
            _shard_metrics(f.split("=", 1)[1], opts["shards"] - 1)  # checks
    if opts["recipe"] is not None:
        check_recipe_flags(opts["recipe"], opts["server_flags"])
    opts["script"] = argv[i]
    opts["script_args"] = argv[i + 1:]
    if not os.path.isfile(opts["script"]):
        raise UsageError(f"script {opts['script']!r} is not a file")
    return opts


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
        self.shards = []   # (Popen, log path)
        self.workers = []  # (Popen, log path or None)

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
        port_files = []
        for i in range(n):
            port_file = self.run_dir / f"shard{i}.port"
            log = self.run_dir / f"shard{i}.log"
            # A reused run folder holds the previous run's port files:
            # waiting on them would hand the workers dead ports.
            port_file.unlink(missing_ok=True)
            with open(log, "wb") as out:
                proc = subprocess.Popen(
                    [self.server_bin, f"--shard_index={i}",
                     f"--num_shards={n}",
                     f"--num_workers={self.opts['workers']}",
                     "--listen=127.0.0.1:0", f"--port_file={port_file}",
                     f"--metrics_listen={_shard_metrics(metrics, i)}",
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
        for i, ((proc, log), port_file) in enumerate(zip(self.shards,
                                                         port_files)):
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
            addrs.append(f"127.0.0.1:{port_file.read_text().strip()}")
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
        for rank in range(n):
            env = dict(self.opts["worker_env"], RANK=str(rank),
                       WORLD_SIZE=str(n), LOCAL_RANK=str(rank),
                       LOCAL_WORLD_SIZE=str(n),
                       PSERVER_SERVERS=",".join(addrs))
            if self.opts.get("client_options") is not None:
                env["PSERVER_CLIENT_OPTIONS"] = json.dumps(
                    self.opts["client_options"])
            cmd = [self.opts["python"], self.opts["script"],
                   *self.opts["script_args"]]
            if rank == 0:
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

    def wait(self):
        """Until every worker is done or one process fails; returns the exit
        code for the launcher."""
        while True:
            running = 0
            for rank, (proc, log) in enumerate(self.workers):
                code = proc.poll()
                if code is None:
                    running += 1
                elif code != 0:
                    where = f"; {log}:\n{_tail(log)}" if log else ""
                    _say(f"rank {rank} exited with status {code}; stopping "
                         f"the others{where}")
                    return _exit_code(code)
            if running == 0:
                return 0
            for i, (proc, log) in enumerate(self.shards):
                if proc.poll() is not None:
                    _say(f"shard {i} exited with status {proc.returncode} "
                         f"while workers ran; {log}:\n{_tail(log)}")
                    return 1
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
    cluster = Cluster(opts, server_bin, run_dir)
    code = 1
    try:
        try:
            addrs = cluster.start_shards()
            _say(f"run folder {run_dir}; {opts['shards']} shards at "
                 f"{','.join(addrs)}; {opts['workers']} workers of "
                 f"{opts['script']} (rank 0 below, the others in "
                 "worker<rank>.log)")
            cluster.start_workers(addrs)
            code = cluster.wait()
        except RuntimeError as e:
            _say(str(e))
            code = 1
        except _Interrupted as e:
            _say(f"{signal.Signals(e.signum).name}: stopping everything")
            code = 128 + e.signum
    finally:
        # A second signal during teardown must not leave processes behind.
        for s in old:
            signal.signal(s, signal.SIG_IGN)
        cluster.stop()
        for s, handler in old.items():
            signal.signal(s, handler)
    if code == 0:
        _say(f"all {opts['workers']} workers exited 0; logs in {run_dir}")
    return code


if __name__ == "__main__":
    sys.exit(main())
