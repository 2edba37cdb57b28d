"""python3 -m pserver.launch on several machines (--nnodes): here two
launchers on this one machine, each a "machine" with its own run folder,
meeting at a TCPStore on loopback; real shards and real worker processes
(issue 48). Each launcher sets the ranks as torchrun does, starts one
shard beside its workers, and a failure on either stops both."""

import json
import os
import shlex
import signal
import socket
import subprocess
import sys
import time

import pytest

from test_launch import (HERE, PACKAGE_ROOT, WORKER, alive,
                         no_process_left, started_pids)
from conftest import server_binary

ENV_WORKER_FILE = str(HERE / "env_worker.py")

NAMES = ["RANK", "LOCAL_RANK", "GROUP_RANK", "WORLD_SIZE",
         "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", "PSERVER_SERVERS"]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def node(tmp_path, rank, port, *args, nnodes=2, env=None, run=None):
    """The launcher of machine `rank`; its run folder is run<rank> (or
    `run`)."""
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]), **(env or {}))
    return subprocess.Popen(
        [sys.executable, "-m", "pserver.launch", "--server-bin",
         server_binary(), "--run-dir", str(tmp_path / (run or f"run{rank}")),
         "--nnodes", str(nnodes), "--node-rank", str(rank),
         "--rdzv-endpoint", f"127.0.0.1:{port}", *args],
        env=e, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)


def kill_all(*procs):
    """Kills each process still running (None: not started) and reaps it."""
    for p in procs:
        if p is not None and p.poll() is None:
            p.kill()
            p.wait()


def texts(*procs, timeout=120):
    out = []
    try:
        for p in procs:
            out.append(p.communicate(timeout=timeout)[0].decode())
    finally:
        kill_all(*procs)
    return out


@pytest.fixture(autouse=True)
def kill_leftovers(tmp_path):
    yield
    for rank in range(3):
        run_dir = tmp_path / f"run{rank}"
        if (run_dir / "pids").exists():
            for pid in started_pids(run_dir).values():
                if alive(pid):
                    try:
                        os.killpg(pid, signal.SIGKILL)
                    except (ProcessLookupError, PermissionError):
                        pass


def test_two_machines_get_torchruns_ranks_and_every_shard(tmp_path):
    """2 machines x 2 workers: ranks 0..3 as torchrun numbers them, one
    shard per machine (machine i's shard is shard i, started there), and
    every rank sees both shards; node 0 prints the others' command."""
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    script = [ENV_WORKER_FILE, str(out), *NAMES]
    procs = [node(tmp_path, r, port, "--nproc-per-node", "2", *script)
             for r in (1, 0)]  # the store's host need not come first
    t1, t0 = texts(*procs)
    assert procs[0].returncode == 0 and procs[1].returncode == 0, t0 + t1
    others = shlex.join([
        sys.executable, "-m", "pserver.launch", "--node-rank", "I",
        "--server-bin", server_binary(), "--run-dir", str(tmp_path / "run0"),
        "--nnodes", "2", "--rdzv-endpoint", f"127.0.0.1:{port}",
        "--nproc-per-node", "2", *script]).replace("--node-rank I",
                                                   "--node-rank <I>")
    assert (f"launch: node 0 of 2: the store is at 127.0.0.1:{port}; on "
            f"each other machine I (1..1) run: {others}\n" in t0), t0
    seen = [json.loads((out / f"rank{r}.json").read_text()) for r in range(4)]
    servers = seen[0]["PSERVER_SERVERS"].split(",")
    assert len(servers) == 2
    for r, env in enumerate(seen):
        assert env == {"RANK": str(r), "LOCAL_RANK": str(r % 2),
                       "GROUP_RANK": str(r // 2), "WORLD_SIZE": "4",
                       "LOCAL_WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1",
                       "MASTER_PORT": str(port),
                       "PSERVER_SERVERS": ",".join(servers)}, env
    for i in range(2):
        assert set(started_pids(tmp_path / f"run{i}")) == {
            f"shard{i}", f"worker{2 * i}", f"worker{2 * i + 1}"}
        no_process_left(tmp_path / f"run{i}")


def test_two_machines_train_one_model(tmp_path):
    """A real DistributedOptimizer job over both machines' shards: every
    rank ends at the same step, having trained with 4 workers."""
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    procs = [node(tmp_path, r, port, "--nproc-per-node", "2", WORKER,
                  str(out), "5") for r in (0, 1)]
    t0, t1 = texts(*procs)
    assert procs[0].returncode == 0 and procs[1].returncode == 0, t0 + t1
    for r in range(4):
        rank, world, local, shards, step = (
            out / f"rank{r}.txt").read_text().split()
        assert (rank, world, local, shards, step) == (
            str(r), "4", str(r % 2), "2", "5")


def test_a_scripts_own_process_group_joins_node_0s_store(tmp_path):
    """2 machines x 2 ranks keep init_process_group("gloo") (env://): they
    join the launchers' store as torchrun's workers join its agent's, and
    gloo's all_reduce over the 4 ranks works unchanged."""
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    procs = [node(tmp_path, r, port, "--nproc-per-node", "2",
                  str(HERE / "pg_worker.py"), str(out)) for r in (0, 1)]
    t0, t1 = texts(*procs)
    assert procs[0].returncode == 0 and procs[1].returncode == 0, t0 + t1
    for r in range(4):
        assert (out / f"rank{r}.txt").read_text().split() == [
            str(r), "4", "10"]


@pytest.mark.parametrize("how", ["rank", "sigint"])
def test_a_failure_on_one_machine_stops_both(tmp_path, how):
    """Machine 1's rank 3 exits 3 (or its launcher gets Ctrl-C): machine 1
    exits with that status, machine 0 exits 1 naming machine 1 and why,
    and nothing either started is left running."""
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    args = ["--nproc-per-node", "2", WORKER, str(out), "1000000", "3",
            "exit" if how == "rank" else "hang"]
    n0 = node(tmp_path, 0, port, *args)
    n1 = node(tmp_path, 1, port, *args)
    if how == "sigint":
        deadline = time.monotonic() + 60
        run1 = tmp_path / "run1"
        while not (run1 / "pids").exists() or len(started_pids(run1)) < 3:
            assert n1.poll() is None and time.monotonic() < deadline
            time.sleep(0.05)
        time.sleep(1)
        n1.send_signal(signal.SIGINT)
    t0, t1 = texts(n0, n1)
    if how == "rank":
        assert n1.returncode == 3, t1
        assert "rank 3 exited with status 3" in t1, t1
        assert ("node 1 stopped the job: rank 3 exited with status 3 on "
                "node 1" in t0), t0
    else:
        assert n1.returncode == 128 + signal.SIGINT, t1
        assert "node 1 stopped the job: SIGINT on node 1" in t0, t0
    assert n0.returncode == 1, t0
    for i in range(2):
        no_process_left(tmp_path / f"run{i}")


@pytest.mark.parametrize("dead", [1, 0])
def test_a_machine_that_dies_without_a_word_stops_the_other(tmp_path, dead):
    """SIGKILL to one machine's launcher and everything it started (a
    machine that dies): the other hears no heartbeat for 2 s (or, node 0
    gone, loses the store) and exits 1 naming it, within seconds, with
    nothing of its own left running."""
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    args = ["--heartbeat-timeout", "2", "--nproc-per-node", "2", WORKER,
            str(out), "1000000"]
    procs = [node(tmp_path, r, port, *args) for r in (0, 1)]
    run = tmp_path / f"run{dead}"
    deadline = time.monotonic() + 60
    while not (run / "pids").exists() or len(started_pids(run)) < 3:
        assert procs[dead].poll() is None and time.monotonic() < deadline
        time.sleep(0.05)
    time.sleep(1)
    victims = list(started_pids(run).values())
    procs[dead].kill()
    for pid in victims:
        try:
            os.killpg(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
    killed_at = time.monotonic()
    survivor = procs[1 - dead]
    (text,) = texts(survivor, timeout=60)
    took = time.monotonic() - killed_at
    procs[dead].wait()
    assert survivor.returncode == 1, text
    if dead == 1:
        assert ("node 1 stopped answering: its launcher has not been heard "
                "from for 2 s (--heartbeat-timeout" in text), text
    else:
        assert "node 0's store at 127.0.0.1:" in text, text
        assert "stopped answering (node 0 died or is unreachable)" in text
    assert took < 30, took  # seconds, not a retry budget of minutes
    no_process_left(tmp_path / f"run{1 - dead}")


CLOSE_SCRIPT = """
import sys, time
from pserver import _nodes
_nodes._POLL = 0  # the heartbeat is then nearly always inside a store call
node = _nodes.Node(1, 0, "127.0.0.1", int(sys.argv[1]), 10)
node.join()
time.sleep(0.5)
if sys.argv[2] == "close":
    node.close()
    assert not node._beating.is_alive()
"""


def test_a_launcher_stops_its_heartbeat_before_it_exits(tmp_path):
    """The heartbeat thread must be stopped before the interpreter exits: a
    daemon thread inside a TCPStore call at shutdown is torn down through
    C++ frames, and the process aborts ("terminate called without an active
    exception"), turning a job that succeeded into exit status -6. The
    launcher calls Node.close(); without it this script aborts."""
    e = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
    for _ in range(3):
        r = subprocess.run([sys.executable, "-c", CLOSE_SCRIPT,
                            str(free_port()), "close"], env=e,
                           capture_output=True, text=True, timeout=60)
        assert r.returncode == 0, r.stderr


def test_a_machine_that_never_joins_is_named(tmp_path):
    """Machine 0 alone: after --join-timeout it exits 1 naming machine 1,
    having started nothing."""
    p = node(tmp_path, 0, free_port(), "--join-timeout", "2",
             "--nproc-per-node", "1", WORKER, str(tmp_path), "1")
    (text,) = texts(p)
    assert p.returncode == 1, text
    assert ("launch: node 0: launchers missing after 2 s (--join-timeout): "
            "node 1 (2 nodes; the store at 127.0.0.1:" in text), text
    assert not (tmp_path / "run0" / "pids").exists()


def test_torchruns_environment_fallbacks(tmp_path):
    """PET_* variables stand for options not given, as in torchrun."""
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    script = [ENV_WORKER_FILE, str(out), "RANK", "WORLD_SIZE"]
    e = {"PET_NPROC_PER_NODE": "1"}
    procs = [subprocess.Popen(
        [sys.executable, "-m", "pserver.launch", "--server-bin",
         server_binary(), "--run-dir", str(tmp_path / f"run{r}"), *script],
        env=dict(os.environ, PYTHONPATH=PACKAGE_ROOT, PET_NNODES="2",
                 PET_NODE_RANK=str(r), PET_MASTER_ADDR="127.0.0.1",
                 PET_MASTER_PORT=str(port), **e),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT) for r in (0, 1)]
    t0, t1 = texts(*procs)
    assert procs[0].returncode == 0 and procs[1].returncode == 0, t0 + t1
    assert [json.loads((out / f"rank{r}.json").read_text()) for r in
            (0, 1)] == [{"RANK": "0", "WORLD_SIZE": "2"},
                        {"RANK": "1", "WORLD_SIZE": "2"}]


@pytest.mark.parametrize("args,message", [
    (["--nnodes", "2"], "--nnodes is 2; expected --node-rank I (0..1) on "
     "each machine"),
    (["--nnodes", "2", "--node-rank", "2", "--rdzv-endpoint", "h:1"],
     "--node-rank is '2'; expected an integer in 0..1 (--nnodes 2)"),
    (["--nnodes", "2", "--node-rank", "0"], "--rdzv-endpoint is None; "
     "expected HOST:PORT of node 0"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
      "--shards", "3"], "--shards with --nnodes > 1: expected "
     "--shards-per-node K"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
      "--workers", "3"], "--workers with --nnodes > 1: expected "
     "--nproc-per-node G"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
      "--checkpoint-dir", "d"], "--checkpoint-dir with --nnodes > 1: not "
     "supported on several machines yet"),
    (["--node-rank", "1"], "--node-rank is for several machines; expected "
     "--nnodes N > 1 with it"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
      "--join-timeout", "0"], "--join-timeout is '0'; expected seconds > 0"),
    (["--nnodes", "2", "--node-rank", "0", "--rdzv-endpoint", "h:1",
      "--heartbeat-timeout", "x"], "--heartbeat-timeout is 'x'; expected "
     "seconds > 0"),
])
def test_bad_machine_options_exit_2_with_one_line(tmp_path, args, message):
    p = subprocess.run(
        [sys.executable, "-m", "pserver.launch", "--server-bin",
         server_binary(), "--run-dir", str(tmp_path / "run"), *args,
         ENV_WORKER_FILE, str(tmp_path)],
        env=dict(os.environ, PYTHONPATH=PACKAGE_ROOT),
        stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=60)
    text = p.stdout.decode()
    assert p.returncode == 2 and text.count("\n") == 1, text
    assert text.startswith(f"launch: error: {message}"), text
