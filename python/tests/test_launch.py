"""python3 -m pserver.launch: starts real shards and worker processes, exits
with the script's status, and leaves no process behind (on success, on a
failing rank, on SIGTERM and SIGINT, when a shard dies,
even when the launcher is SIGKILLed); bad arguments exit 2 with one line;
--recipe configures both sides."""

import json
import os
import pathlib
import signal
import subprocess
import sys
import time

import pytest

import pserver
from conftest import server_binary

HERE = pathlib.Path(__file__).resolve().parent
WORKER = str(HERE / "launch_worker.py")
RECIPE_WORKER = str(HERE / "recipe_worker.py")
PACKAGE_ROOT = str(pathlib.Path(pserver.__file__).resolve().parents[1])


@pytest.fixture(autouse=True)
def kill_leftovers(tmp_path):
    """After a failed test, nothing the launcher started stays running."""
    yield
    pids_file = tmp_path / "run" / "pids"
    if pids_file.exists():
        for pid in started_pids(tmp_path / "run").values():
            if not alive(pid):
                continue
            try:
                os.killpg(pid, signal.SIGKILL)
            except (ProcessLookupError, PermissionError):
                pass


def launcher(run_dir, *args, **popen):
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(
        [PACKAGE_ROOT, os.environ.get("PYTHONPATH", "")]))
    return subprocess.Popen(
        [sys.executable, "-m", "pserver.launch", "--server-bin",
         server_binary(), "--run-dir", str(run_dir), *args],
        env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, **popen)


def started_pids(run_dir):
    lines = (run_dir / "pids").read_text().split()
    return dict(zip(lines[0::2], map(int, lines[1::2])))


def alive(pid):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def no_process_left(run_dir):
    pids = started_pids(run_dir)
    assert not [r for r, p in pids.items() if alive(p)], pids
    # Nothing else whose command line names the run folder (the shards'
    # --port_file does).
    p = subprocess.run(["pgrep", "-f", str(run_dir)], stdout=subprocess.PIPE)
    assert p.stdout.decode().strip() == "", p.stdout
    return pids


def test_trains_through_the_launcher_and_exits_0(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    p = launcher(run_dir, "--shards", "2", "--workers", "3",
                 "--optimizer", "adam", "--pull-codec=fp32",
                 WORKER, str(out), "5")
    text = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 0, text
    assert "rank 0 done at step 5" in text, text       # rank 0 on the terminal
    assert "rank 1 done" not in text, text             # the others in logs
    assert "rank 1 done at step 5" in (run_dir / "worker1.log").read_text()
    for rank in range(3):
        seen = (out / f"rank{rank}.txt").read_text().split()
        assert seen == [str(rank), "3", str(rank), "2", "5"], seen
    shard_log = (run_dir / "shard0.log").read_text()
    assert "optimizer adam" in shard_log and "pull codec fp32" in shard_log
    pids = no_process_left(run_dir)
    assert sorted(pids) == ["shard0", "shard1", "worker0", "worker1",
                            "worker2"]


def test_a_scripts_own_process_group_works(tmp_path):
    """A DDP script keeps torch.distributed.init_process_group() (env://):
    the launcher sets MASTER_ADDR and MASTER_PORT as torchrun does, so
    gloo's all_reduce over the 3 ranks works unchanged."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    p = launcher(run_dir, "--shards", "1", "--workers", "3",
                 str(HERE / "pg_worker.py"), str(out))
    text = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 0, text + "".join(
        f.read_text() for f in run_dir.glob("worker*.log"))
    for rank in range(3):
        assert (out / f"rank{rank}.txt").read_text().split() == [
            str(rank), "3", "6"]
    no_process_left(run_dir)


def test_a_reused_run_folder_gets_the_new_shards_ports(tmp_path):
    """A second run in the same --run-dir waited on the first run's port
    files and sent its workers to dead ports (found by torch_fidelity.py)."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    run_dir.mkdir()
    for i in range(2):
        (run_dir / f"shard{i}.port").write_text("1\n")  # nothing listens
    p = launcher(run_dir, "--shards", "2", "--workers", "2",
                 "--optimizer", "adam", "--pull-codec=fp32",
                 "--start-timeout", "30", WORKER, str(out), "2")
    text = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 0, text
    assert "rank 0 done at step 2" in text, text
    ports = [(run_dir / f"shard{i}.port").read_text().strip() for i in (0, 1)]
    assert "1" not in ports, ports
    no_process_left(run_dir)


def test_each_shard_serves_metrics_on_its_own_port(tmp_path):
    """--metrics-listen HOST:0 gives every shard a free port of its own (one
    shared port made all but one shard fail); the launcher prints each URL,
    and each serves while the run goes on."""
    import re
    import urllib.request
    p, run_dir = start_hanging_run(tmp_path, "--metrics-listen",
                                   "127.0.0.1:0")
    try:
        urls, deadline = [], time.monotonic() + 60
        while len(urls) < 2 and time.monotonic() < deadline:
            line = p.stdout.readline().decode()
            urls += re.findall(r"shard \d metrics: (http://\S+)", line)
        assert len(urls) == 2 and urls[0] != urls[1], urls
        for i, url in enumerate(urls):
            text = urllib.request.urlopen(url, timeout=10).read().decode()
            assert f'shard="{i}"' in text, text[:500]
    finally:
        p.send_signal(signal.SIGTERM)
        p.communicate(timeout=60)
    no_process_left(run_dir)


def test_a_fixed_metrics_port_is_a_base_port():
    from pserver._launch_args import shard_metrics as _shard_metrics
    assert _shard_metrics("127.0.0.1:9100", 0) == "127.0.0.1:9100"
    assert _shard_metrics("127.0.0.1:9100", 3) == "127.0.0.1:9103"
    assert _shard_metrics("[::1]:9100", 1) == "[::1]:9101"
    assert _shard_metrics("0.0.0.0:0", 5) == "0.0.0.0:0"
    assert _shard_metrics("", 1) == ""


def test_a_failing_rank_stops_everything_and_fails(tmp_path):
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    # Rank 1 exits 3 after registering; rank 0 and 2 wait in the round it
    # never joins until the launcher stops them.
    p = launcher(run_dir, "--shards", "1", "--workers", "3", WORKER,
                 str(out), "1000000", "1")
    text = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 3, text
    assert "rank 1 exited with status 3" in text, text
    assert "rank 1 failing on purpose" in text, text  # its log's tail
    no_process_left(run_dir)


def start_hanging_run(tmp_path, *flags, shards=2, workers=2):
    """A launcher whose rank 1 hangs after registering; returns it once all
    its processes run. `flags` go to the launcher."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    p = launcher(run_dir, "--shards", str(shards), "--workers", str(workers),
                 *flags, WORKER, str(out), "1000000", "1", "hang")
    deadline = time.monotonic() + 60
    while not (run_dir / "pids").exists() or \
            len(started_pids(run_dir)) < shards + workers:
        assert p.poll() is None, p.communicate()[0].decode()
        assert time.monotonic() < deadline, "launcher did not start them"
        time.sleep(0.05)
    time.sleep(1)  # the workers are running (rank 1 hangs)
    return p, run_dir


def test_a_shard_dying_stops_everything_and_fails(tmp_path):
    p, run_dir = start_hanging_run(tmp_path)
    os.kill(started_pids(run_dir)["shard1"], signal.SIGKILL)
    text = p.communicate(timeout=60)[0].decode()
    assert p.returncode == 1, text
    assert "shard 1 exited with status -9 while workers ran" in text, text
    no_process_left(run_dir)


def test_sigkill_of_the_launcher_takes_its_processes_along(tmp_path):
    p, run_dir = start_hanging_run(tmp_path)
    p.kill()  # no handler runs: the children's parent-death signal does it
    p.communicate(timeout=30)
    pids = started_pids(run_dir)
    deadline = time.monotonic() + 30
    while any(alive(pid) for pid in pids.values()):
        assert time.monotonic() < deadline, pids
        time.sleep(0.05)
    no_process_left(run_dir)


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT])
def test_a_signal_tears_everything_down(tmp_path, sig):
    p, run_dir = start_hanging_run(tmp_path)
    p.send_signal(sig)  # SIGINT: what Ctrl-C sends
    text = p.communicate(timeout=60)[0].decode()
    assert p.returncode == 128 + sig, text
    assert f"{signal.Signals(sig).name}: stopping everything" in text, text
    no_process_left(run_dir)


@pytest.mark.parametrize("args,message", [
    (["--workers", "0", WORKER], "--workers is '0'; expected a positive"),
    (["--shards"], "--shards needs a value"),
    (["--workers", "2"], "no script given"),
    (["/nonexistent/train.py"], "script '/nonexistent/train.py' is not a"),
    (["--num_workers=3", WORKER], "--num_workers is set by the launcher"),
    (["-x", WORKER], "unknown option '-x'"),
    (["--metrics-listen", "nohost", WORKER],
     "--metrics-listen is 'nohost'; expected HOST:PORT"),
    (["--metrics-listen", "127.0.0.1:65535", WORKER],
     "--metrics-listen port 65535 + shard 1 is past 65535"),
    (["--recipe", "lm-foo", WORKER], "--recipe 'lm-foo' is unknown; "
     "expected one of lm-onebit, lm-topk, lm-local (NAME, or NAME:FREEZE "
     "for those with a freeze)"),
    (["--recipe", "lm-local:5", WORKER], "--recipe 'lm-local:5': lm-local "
     "has no freeze (its shards run SGD on the workers' local steps); "
     "expected lm-local"),
    (["--recipe", "lm-local", "--schedule", "mine.txtpb", WORKER],
     "--schedule=mine.txtpb with --recipe lm-local: the recipe sets the "
     "codecs, a schedule would change them"),
    (["--recipe=lm-topk:0", WORKER], "--recipe 'lm-topk:0': freeze is '0'; "
     "expected an integer >= 1"),
    (["--recipe", "lm-onebit:1e3", WORKER], "freeze is '1e3'; expected an "
     "integer >= 1"),
    (["--recipe", "lm-topk", "--schedule", "mine.txtpb", WORKER],
     "--schedule=mine.txtpb with --recipe lm-topk: the recipe writes its "
     "own schedule"),
    (["--freeze-step", "300", "--recipe", "lm-onebit", WORKER],
     "--freeze_step=300 with --recipe lm-onebit: the recipe's schedule "
     "switches codecs at its freeze; use --recipe lm-onebit:300 instead"),
])
def test_bad_arguments_exit_2_with_one_line(tmp_path, args, message):
    p = launcher(tmp_path / "run", *args)
    text = p.communicate(timeout=30)[0].decode()
    assert p.returncode == 2, text
    assert text.count("\n") == 1 and text.startswith("launch: error: "), text
    assert message in text, text
    assert not (tmp_path / "run" / "pids").exists()


def test_a_missing_server_binary_is_one_line(tmp_path):
    env = dict(os.environ, PYTHONPATH=PACKAGE_ROOT)
    p = subprocess.run([sys.executable, "-m", "pserver.launch",
                        "--server-bin", str(tmp_path / "none"), WORKER],
                       env=env, stdout=subprocess.PIPE,
                       stderr=subprocess.STDOUT, timeout=30)
    text = p.stdout.decode()
    assert p.returncode == 2 and text.count("\n") == 1, text
    assert "no pserver_server at" in text, text


@pytest.mark.parametrize("name,deployed,default_freeze", [
    ("lm-onebit", "q4_then_onebit.txtpb", 300),
    ("lm-topk", "q8_then_topk_pullq.txtpb", 200)])
def test_a_recipe_schedule_is_the_measured_one(name, deployed,
                                               default_freeze):
    """At the default freeze, each recipe's schedule is the deploy/schedules
    file that tests/bench/lm_fidelity.py measured (comments aside)."""
    from pserver import recipes

    def tokens(text):
        return " ".join(line.split("#")[0] for line in
                        text.splitlines()).split()

    repo = HERE.parents[1]
    recipe, freeze = recipes.parse(name)
    assert freeze == default_freeze
    got = tokens(recipe.schedule_text(freeze))
    assert got == tokens((repo / "deploy" / "schedules" /
                          deployed).read_text())
    assert "end_step: 7" in recipes.parse(f"{name}:7")[0].schedule_text(7)


def test_a_recipe_configures_the_shards_and_the_workers(tmp_path):
    """--recipe lm-topk:5 with an unchanged script: the shards run 1-bit
    Adam (a flag given after the recipe's wins), the workers get the
    recipe's client options, leave 8-bit quantize at round 5 for 1% TopK
    pushes, and fetch the frozen variance."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    p = launcher(run_dir, "--shards", "2", "--workers", "2",
                 "--recipe", "lm-topk:5", "--bias-correction=false",
                 RECIPE_WORKER, str(out), "12")
    text = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 0, text
    schedule = (run_dir / "recipe_lm-topk.txtpb").resolve()
    assert (f"launch: recipe lm-topk (freeze 5): --optimizer=onebit_adam "
            "--freeze_step=5 --bias_correction=true --onebit_momentum=worker "
            "--compression_beta1=0.5 --pull_codec=topk_quantize "
            "--pull_k_fraction=0.03 --pull_bits=4 --push_codec=topk "
            f"--schedule={schedule}\n") in text, text
    assert "begin_step: 5" in schedule.read_text()
    assert (f"optimizer onebit_adam (momentum on the workers), pull codec "
            f"topk_quantize, schedule {schedule} (2 phases)") in \
        (run_dir / "shard1.log").read_text()
    for rank in range(2):
        seen = json.loads((out / f"rank{rank}.json").read_text())
        assert json.loads(seen["env"]) == {
            "push_codec": "topk", "k_fraction": 0.01,
            "momentum_masking": True, "schedule": str(schedule)}
        assert seen["shard_config"]["optimizer"] == "onebit_adam"
        assert seen["shard_config"]["bias_correction"] is False  # the user's
        assert seen["global_step"] == 12 and seen["schedule_phase"] == 1
        stats = seen["stats"]
        assert stats["variance_payload_bytes"] > 0, stats  # frozen at 5
        # 5 rounds of 8-bit quantize (1/4 of fp32), then 7 of 1% TopK: about
        # 0.11 of fp32; 8-bit all along would be 0.25, fp32 or bf16 more.
        assert stats["push_payload_bytes"] < 0.16 * stats["push_fp32_bytes"], \
            stats
    no_process_left(run_dir)


def test_the_local_recipe_runs_local_steps_and_refuses_a_script_without(
        tmp_path):
    """--recipe lm-local: the shards run SGD at lr 0.6 and accept only
    local_steps 16; a script with local steps (and no outer_momentum
    argument) gets the recipe's outer momentum 0.85 and 2-bit pushes, a
    script without them is refused at Register by name."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    p = launcher(run_dir, "--shards", "2", "--workers", "2",
                 "--recipe", "lm-local", RECIPE_WORKER, str(out), "32", "16")
    text = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 0, text
    assert ("launch: recipe lm-local: --optimizer=sgd --momentum=0 "
            "--weight_decay=0 --lr=0.6 --pull_codec=quantize --pull_bits=2 "
            "--local_steps=16 --lease_timeout_seconds=600 "
            "--push_codec=quantize\n") in text, text
    assert not list(run_dir.glob("recipe_*.txtpb"))
    for rank in range(2):
        seen = json.loads((out / f"rank{rank}.json").read_text())
        assert json.loads(seen["env"]) == {
            "push_codec": "quantize", "bits": 2, "outer_momentum": 0.85}
        assert seen["shard_config"]["optimizer"] == "sgd"
        assert seen["outer_beta"] == pytest.approx(0.85)
        assert seen["global_step"] == 32
        stats = seen["stats"]
        assert stats["steps"] == 2, stats  # two rounds of 16 local steps
        # 2 bits and a scale per block: well under a tenth of fp32.
        assert stats["push_payload_bytes"] < 0.1 * stats["push_fp32_bytes"], \
            stats
    no_process_left(run_dir)

    refused_dir = tmp_path / "refused"
    p = launcher(refused_dir, "--shards", "1", "--workers", "1",
                 "--recipe", "lm-local", RECIPE_WORKER, str(out), "4")
    text = p.communicate(timeout=120)[0].decode()
    assert p.returncode != 0, text
    assert "local_steps is 1; expected 16 (this shard's --local_steps)" in \
        text, text
    no_process_left(refused_dir)


def test_the_local_recipe_takes_another_h_from_the_shards_flag(tmp_path):
    """Longer runs keep about as many rounds with more local steps a round
    (tests/bench/results/lm_long: H = 80 in 8000 steps): --local_steps=H
    after --recipe lm-local wins over the recipe's 16, and the shards then
    accept a script that runs H local steps."""
    run_dir, out = tmp_path / "run", tmp_path / "out"
    out.mkdir()
    p = launcher(run_dir, "--shards", "1", "--workers", "1",
                 "--recipe", "lm-local", "--local_steps=4", RECIPE_WORKER,
                 str(out), "8", "4")
    text = p.communicate(timeout=120)[0].decode()
    assert p.returncode == 0, text
    seen = json.loads((out / "rank0.json").read_text())
    assert seen["global_step"] == 8
    assert seen["stats"]["steps"] == 2, seen["stats"]  # two rounds of 4
    assert seen["outer_beta"] == pytest.approx(0.85)
    no_process_left(run_dir)
