"""Machines that join a running job and leave it (issue 48 item 3):
`pserver.launch --nnodes 1:2`, two launchers on this machine as two
"machines" on loopback, real shards and real worker processes. Node 0
starts the job and hosts its shard; node 1 joins while it trains, and
leaves when its launcher gets SIGTERM (a spot notice): its workers leave at
their next round and exit 0, the shard takes them out at once (not as
dropped), and node 0 trains on to the end."""

import json
import os
import re
import signal
import time

import pytest

from test_launch import HERE, no_process_left, started_pids
from test_launch_nodes import (free_port, kill_all, kill_leftovers,  # noqa: F401
                               node, texts)

WORKER = str(HERE / "elastic_worker.py")
TOTAL = 300  # rounds the job runs


def wait_for(what, check, timeout=90):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        value = check()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"{what}: not within {timeout} s")


def progress(out, rank):
    """The global step of rank's last completed step (0: none yet), from
    the lines elastic_worker.py appends."""
    try:
        lines = (out / f"times{rank}").read_text().splitlines()
        return int(lines[-1].split()[0]) if lines else 0
    except (FileNotFoundError, ValueError, IndexError):
        return 0


# 1-bit Adam frozen at round 10, before node 1 joins: the joiners pull the
# frozen variance and push in the compression stage's form.
@pytest.mark.parametrize("optimizer", [["--optimizer=sgd"],
                                       ["--optimizer=onebit_adam",
                                        "--freeze_step=10"]])
def test_a_machine_joins_a_running_job_and_leaves_on_sigterm(tmp_path,
                                                             optimizer):
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    args = ["--nproc-per-node", "2", "--shards-per-node", "1", *optimizer,
            "--lease_timeout_seconds=60",
            WORKER, str(out), str(TOTAL), "0.05"]
    core = node(tmp_path, 0, port, *args, nnodes="1:2")
    joiner = None
    try:
        joined_at = wait_for("node 0 trains alone",
                             lambda: progress(out, 0) >= 20 and progress(out, 0))
        joiner = node(tmp_path, 1, port, *args, nnodes="1:2")
        first = wait_for("node 1's workers start",
                         lambda: min(progress(out, 2), progress(out, 3)))
        wait_for("node 1's workers train",
                 lambda: min(progress(out, 2), progress(out, 3))
                 >= first + 20)
        told = time.monotonic()
        joiner.send_signal(signal.SIGTERM)
        joiner_text = texts(joiner, timeout=60)[0]
        took = time.monotonic() - told
        assert joiner.returncode == 0, joiner_text
        left_at = progress(out, 0)
        core_text = texts(core, timeout=120)[0]
    finally:
        kill_all(core, joiner)
    assert core.returncode == 0, core_text
    assert "leave the job at their next round" in joiner_text, joiner_text
    assert len(re.findall(r"pserver: worker [23] left the job at step \d+ "
                          r"\(SIGTERM\)", joiner_text
                          + (tmp_path / "run1" / "worker3.log").read_text())) \
        == 2, joiner_text
    # Leaving takes a round, not a lease timeout (60 s here).
    assert took < 20, took
    recs = {r: json.loads((out / f"rank{r}.json").read_text())
            for r in range(4)}
    for r in (2, 3):
        assert recs[r].get("left") and recs[r]["first_step"] >= joined_at
        assert recs[r]["steps"] >= 20, recs[r]
        assert recs[r]["last_step"] < TOTAL, recs[r]
    for r in (0, 1):
        assert recs[r]["last_step"] == TOTAL and not recs[r].get("left")
    # Node 0 trained on after node 1 left, and its workers agree.
    assert left_at < TOTAL
    assert recs[0]["checksum"] == recs[1]["checksum"]
    log = (tmp_path / "run0" / "shard0.log").read_text()
    for w in (2, 3):
        assert re.search(fr"worker {w} joins at step \d+", log), log
        assert re.search(fr"worker {w} left at step \d+", log), log
    assert "dropped" not in log, log
    no_process_left(tmp_path / "run0")
    no_process_left(tmp_path / "run1")


def test_elastic_spellings_that_cannot_be_served_exit_2(tmp_path):
    for nnodes, want in (("2:1", "--nnodes is '2:1'; expected N or MIN:MAX"),
                         ("0:2", "--nnodes is '0:2'"),
                         ("a:b", "--nnodes is 'a:b'")):
        p = node(tmp_path, 0, free_port(), WORKER, "x", "1", "0",
                 nnodes=nnodes)
        text = texts(p)[0]
        assert p.returncode == 2 and want in text, text
        assert len(text.strip().splitlines()) == 1, text
    p = node(tmp_path, 0, free_port(), "--push-per", "node", WORKER, "x",
             "1", "0", nnodes="1:2")
    text = texts(p)[0]
    assert p.returncode == 2, text
    assert "--push-per node with --nnodes 1:2" in text, text


def test_node_rank_auto_claims_ranks_until_none_is_left(tmp_path):
    """--node-rank auto (a scaled Compose service): a machine joining an
    elastic job takes the next unclaimed rank from node 0's store; one more
    than the job has room for exits 1 with one line, and the job goes on."""
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    args = ["--nproc-per-node", "2", "--optimizer=sgd", WORKER, str(out),
            "200", "0.05"]
    core = node(tmp_path, 0, port, *args, nnodes="1:2")
    procs = [core]
    try:
        wait_for("node 0 trains", lambda: progress(out, 0) >= 5)
        auto = node(tmp_path, "auto", port, *args, nnodes="1:2", run="runa")
        procs.append(auto)
        wait_for("the auto node trains", lambda: progress(out, 2) >= 5)
        extra = node(tmp_path, "auto", port, *args, nnodes="1:2", run="runb")
        procs.append(extra)
        extra_text = texts(extra, timeout=60)[0]
        auto_text, core_text = texts(auto, core, timeout=120)
    finally:
        kill_all(*procs)
    assert extra.returncode == 1, extra_text
    errors = [ln for ln in extra_text.splitlines() if "error" in ln]
    assert errors == [
        "launch: error: --node-rank auto: ranks 1..1 are all claimed and "
        "none has left the job (this machine asked for claim 2); expected at "
        "most 1 --node-rank auto machines in the job at once (a rank is "
        "given out again once its machine leaves on SIGTERM)"], \
        extra_text
    assert auto.returncode == 0 and core.returncode == 0, auto_text + core_text
    assert "launch: --node-rank auto: this machine is node 1" in auto_text
    for r in range(4):
        assert json.loads((out / f"rank{r}.json").read_text())["last_step"] \
            == 200
    for run in ("run0", "runa"):
        no_process_left(tmp_path / run)


def test_a_rank_whose_machine_left_is_claimed_again(tmp_path):
    """A spot machine leaves on SIGTERM and a new one arrives: its
    --node-rank auto takes the rank that left, its workers register again
    in the same slots and train to the end, and node 0 waits for them. A
    second launcher naming that rank while it is taken exits 1."""
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    args = ["--nproc-per-node", "1", "--optimizer=sgd",
            "--lease_timeout_seconds=60", WORKER, str(out), str(TOTAL),
            "0.05"]
    core = node(tmp_path, 0, port, *args, nnodes="1:2")
    procs = [core]
    try:
        wait_for("node 0 trains", lambda: progress(out, 0) >= 5)
        first = node(tmp_path, "auto", port, *args, nnodes="1:2", run="runa")
        procs.append(first)
        joined = wait_for("the first machine trains", lambda: progress(out, 1))
        wait_for("it trains on", lambda: progress(out, 1) >= joined + 10)
        first.send_signal(signal.SIGTERM)
        first_text = texts(first, timeout=60)[0]
        left_at = progress(out, 1)
        again = node(tmp_path, "auto", port, *args, nnodes="1:2", run="runb")
        procs.append(again)
        wait_for("the new machine trains", lambda: progress(out, 1)
                 >= left_at + 10)
        twice = node(tmp_path, 1, port, *args, nnodes="1:2", run="runc")
        procs.append(twice)
        twice_text = texts(twice, timeout=60)[0]
        again_text, core_text = texts(again, core, timeout=120)
    finally:
        kill_all(*procs)
    assert first.returncode == 0, first_text
    assert "launch: --node-rank auto: this machine is node 1" in first_text
    assert again.returncode == 0 and core.returncode == 0, \
        again_text + core_text
    assert ("launch: --node-rank auto: this machine is node 1 (its machine "
            "left the job; taken again)") in again_text, again_text
    assert ("launch: node 1 joins the job again (its machine left it "
            "before)") in again_text, again_text
    # Node 1 is present again: the rank that joined twice is refused.
    assert twice.returncode == 1, twice_text
    assert ("node 1: another launcher holds rank 1 in this job (it joined "
            "from ") in twice_text, twice_text
    rec = json.loads((out / "rank1.json").read_text())
    assert rec["first_step"] >= left_at and rec["last_step"] == TOTAL, rec
    assert not rec.get("left"), rec
    core_rec = json.loads((out / "rank0.json").read_text())
    assert core_rec["last_step"] == TOTAL
    assert core_rec["checksum"] == rec["checksum"]
    log = (tmp_path / "run0" / "shard0.log").read_text()
    assert re.search(r"worker 1 joins at step \d+.*worker 1 left at step "
                     r"\d+.*worker 1 rejoins at step \d+", log, re.S), log
    assert "dropped" not in log, log
    for run in ("run0", "runa", "runb"):
        no_process_left(tmp_path / run)


def test_a_joiner_that_vanishes_does_not_stop_the_job(tmp_path):
    """A machine that joined and then vanishes without a word (frozen, its
    processes killed: a spot machine taken at once) holds no shards: node 0
    notes its silence after --heartbeat-timeout and trains on, and the
    shard drops its worker when the lease runs out. The machine started
    again with the same --node-rank joins again and trains to the end."""
    port = free_port()
    out = tmp_path / "out"
    out.mkdir()
    args = ["--nproc-per-node", "1", "--optimizer=sgd",
            "--heartbeat-timeout", "2", "--lease_timeout_seconds=3", WORKER,
            str(out), "400", "0.05"]
    core = node(tmp_path, 0, port, *args, nnodes="1:2")
    joiner = node(tmp_path, 1, port, *args, nnodes="1:2")
    back = None
    shard_log = tmp_path / "run0" / "shard0.log"
    try:
        first = wait_for("node 1 trains", lambda: progress(out, 1))
        wait_for("node 1 trains on", lambda: progress(out, 1) >= first + 5)
        joiner.send_signal(signal.SIGSTOP)  # its heartbeat stops too
        for pid in started_pids(tmp_path / "run1").values():
            try:
                os.killpg(pid, signal.SIGKILL)
            except ProcessLookupError:
                pass
        joiner.kill()
        joiner.wait()
        wait_for("the shard drops worker 1",
                 lambda: re.search(r"worker 1 dropped at step \d+",
                                   shard_log.read_text()))
        dropped_at = progress(out, 0)
        back = node(tmp_path, 1, port, *args, nnodes="1:2", run="runb")
        back_text, core_text = texts(back, core, timeout=120)
    finally:
        kill_all(core, joiner, back)
    assert core.returncode == 0, core_text
    assert ("launch: node 1 stopped answering for 2 s (--heartbeat-timeout);"
            " it holds no shards: the others go on without it") in core_text
    assert "launch: node 1 answers again: it is in the job" in core_text
    assert back.returncode == 0, back_text
    assert ("launch: node 1 joins the job again (its machine stopped "
            "answering)") in back_text, back_text
    assert json.loads((out / "rank0.json").read_text())["last_step"] == 400
    rec = json.loads((out / "rank1.json").read_text())
    assert rec["first_step"] >= dropped_at and rec["last_step"] == 400, rec
    log = shard_log.read_text()
    assert re.search(r"worker 1 dropped at step \d+.*worker 1 rejoins at "
                     r"step \d+", log, re.S), log
    no_process_left(tmp_path / "run0")
    no_process_left(tmp_path / "runb")
